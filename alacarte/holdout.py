"""Rows held out of the marginal likelihood, to stop a fit before it over-fits.

Type-II maximum likelihood with learned spectra can memorise the training
targets: with M learned radii (FSARD), 3M Fastfood diagonals (FSGBARD) or a
mixture's means and scales tuned against one fixed draw of random features, the
optimiser finds hyperparameters under which the *finite* feature map
interpolates the data — the noise variance collapses, the training loss keeps
falling, and the predictive variance at new points is far too small
(docs/calibration.md).  The training rows cannot show it: even the exact
leave-one-out predictive of the fitted model, which removes a row from the
posterior but not from the hyperparameters, keeps improving along that path.

So :func:`alacarte.fit` holds out a random part of the training rows, fits the
hyperparameters by marginal likelihood on the rest, scores every iterate by the
negative log predictive density of the held-out rows, and keeps the best
iterate (early stopping); the restarts are chosen by the same score.

Then the noise variance σ² alone is chosen by the same score (:meth:`HeldOut.tune_noise`).
A finite feature map is a misspecified model of the kernel it approximates: with D
features and n ≳ D rows the training rows pin down the weights and the posterior
variance between them is far too small, while the likelihood of the training rows
cannot see it (they are fitted).  The held-out rows see it, and σ² — which in
y = φ(x)ᵀw + ε stands for everything the features do not explain — absorbs it.
Under misspecification, choosing a variance parameter by cross-validated predictive
likelihood rather than marginal likelihood is the robust choice (Bachoc 2013,
*Cross validation and maximum likelihood estimations of hyper-parameters of Gaussian
processes with model misspecification*).  The posterior is then conditioned on all rows.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from .init import set_noise
from .woodbury import NotPositiveDefiniteError

__all__ = ["RECOMMENDED_FRACTION", "MAX_ROWS", "PATIENCE", "HeldOut", "check_fraction", "split_rows"]

#: The share of training rows recommended for a feature GP's fit to hold out (docs/calibration.md).
RECOMMENDED_FRACTION = 0.2
#: At most this many rows are held out: beyond it the score is precise enough, and rows are better spent on the fit.
MAX_ROWS = 5000
#: Iterations without a better held-out score after which an optimisation stops.
PATIENCE = 20
# Fewer training rows than this leave nothing to hold out.
_MIN_ROWS = 10
# The noise search's range in standardised units (the targets' variance is 1), and its precision in log σ².
_NOISE_RANGE = (1e-6, 10.0)
_LOG_NOISE_TOLERANCE = 1e-3


def check_fraction(fraction) -> float:
    """``fraction`` as a float in [0, 1), or a ``ValueError``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating, np.integer)):
        raise ValueError(f"validation_fraction must be a number in [0, 1), got {fraction!r}")
    fraction = float(fraction)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {fraction!r}")
    return fraction


def split_rows(n: int, fraction: float, seed: int | None) -> tuple[Tensor, Tensor] | None:
    """Indices (kept, held out) of a seeded random split of ``n`` rows, or ``None`` when nothing is held out.

    ``round(fraction·n)`` rows, at most :data:`MAX_ROWS`, are held out; none when that is 0, or
    when fewer than 10 rows are given (the score of one or two rows would pick iterates at random).
    """
    held = min(int(round(fraction * n)), MAX_ROWS)
    if held < 1 or n < _MIN_ROWS:
        return None
    # A generator of its own: the restarts' draws stay those of a fit without held-out rows.
    order = torch.as_tensor(np.random.default_rng(None if seed is None else [seed, 0x401d]).permutation(n))
    return order[held:].sort().values, order[:held].sort().values


class HeldOut:
    """The negative log predictive density per held-out row, in the model's internal (standardised)
    units, under the posterior of the model's current training rows and parameters.

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP` in train mode whose
            training data are the kept rows.
        x, y: the held-out rows, standardised as the model's training rows are.
    """

    def __init__(self, model, x: Tensor, y: Tensor):
        self.model, self.x, self.y = model, x, y

    @property
    def rows(self) -> int:
        return self.y.shape[-1]

    @torch.no_grad()
    def loss(self) -> float:
        """The score (``inf`` where the posterior cannot be factorised); the model is left in train mode."""
        model = self.model
        model.eval()
        try:
            predictive = model.likelihood(model(self.x))
            mean, variance = predictive.mean, predictive.variance
            nlpd = 0.5 * (torch.log(2 * math.pi * variance) + (self.y - mean) ** 2 / variance)
            value = float(nlpd.mean())
        except (NotPSDError, NanError, NotPositiveDefiniteError):
            value = math.inf
        finally:
            model.train()
        return value if math.isfinite(value) else math.inf

    @torch.no_grad()
    def tune_noise(self) -> float | None:
        """Set σ² to the value in its constraint (and in [1e-6, 10] standardised) with the lowest
        held-out score, a bounded search on log σ²; keep the current σ² unless that is lower.

        Returns:
            The σ² set, or ``None`` when the noise is not trained (``requires_grad`` off) and is left alone.
        """
        noise_covar = self.model.likelihood.noise_covar
        if not noise_covar.raw_noise.requires_grad:
            return None
        constraint = noise_covar.raw_noise_constraint
        low = max(_NOISE_RANGE[0], 2 * float(constraint.lower_bound))
        high = min(_NOISE_RANGE[1], float(constraint.upper_bound))
        current = float(self.model.likelihood.noise.min())
        best = (self.loss(), current)
        if low < high:
            def score(log_noise: float) -> float:
                set_noise(self.model, math.exp(log_noise))
                return self.loss()

            found = minimize_scalar(score, bounds=(math.log(low), math.log(high)), method="bounded",
                                    options={"xatol": _LOG_NOISE_TOLERANCE})
            if found.fun < best[0]:
                best = (found.fun, math.exp(found.x))
        set_noise(self.model, best[1])
        return best[1]
