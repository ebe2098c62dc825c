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
negative log predictive density of the held-out rows at the best overall scale of
the predictive variance (:class:`HeldOut`), and keeps the best iterate (early
stopping); the restarts are chosen by the same score.

Then the noise variance σ² and that overall scale are chosen by the same score, with each
held-out row predicted from all the other rows, kept and held out: the posterior the model
will predict with (:meth:`HeldOut.calibrate`); from :data:`TAIL_ROWS` held-out rows, every row votes on
the scale, the kept rows' residuals corrected by the held-out rows' (:meth:`HeldOut.every_row_scale`).
A finite feature map is a misspecified model of the kernel it approximates: with D
features and n ≳ D rows the training rows pin down the weights and the posterior
variance between them is far too small, while the likelihood of the training rows
cannot see it (they are fitted).  The held-out rows see it, and σ² — which in
y = φ(x)ᵀw + ε stands for everything the features do not explain — absorbs it, and the
overall scale of σ_f² and σ² sets the width of the predictive band.
Under misspecification, choosing a variance parameter by cross-validated predictive
likelihood rather than marginal likelihood is the robust choice (Bachoc 2013,
*Cross validation and maximum likelihood estimations of hyper-parameters of Gaussian
processes with model misspecification*).  The posterior is then conditioned on all rows.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize, minimize_scalar
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from .init import scale_signal, set_noise, signal_variance_parameter
from .mll import homoskedastic_noise
from .woodbury import NotPositiveDefiniteError, SufficientStatistics, WoodburyPosterior, sufficient_statistics

__all__ = ["RECOMMENDED_FRACTION", "MAX_ROWS", "PATIENCE", "SCALE_PRIOR_ROWS", "TAIL_ROWS", "HeldOut",
           "check_fraction", "held_out_count", "maximize_band_likelihood", "resolve_fraction", "scores_iterates",
           "split_rows"]

#: The share of training rows a feature GP's fit holds out by default (docs/calibration.md).
RECOMMENDED_FRACTION = 0.2
#: At most this many rows are held out: beyond it the score is precise enough, and rows are better spent on the fit.
MAX_ROWS = 5000
#: Iterations without a better held-out score after which an optimisation stops.
PATIENCE = 20
# Fewer training rows than this leave nothing to hold out.
_MIN_ROWS = 10
#: The weight, in held-out rows, of the variance scale's prior centre s = 1 (see :class:`HeldOut`).
SCALE_PRIOR_ROWS = 20
#: From this many held-out rows, every row votes on the band's scale (:meth:`HeldOut.every_row_scale`): their
#: median then pins the kept rows' correction to about a tenth.
TAIL_ROWS = 400
# The noise search's range in standardised units (the targets' variance is 1), and its precision in log σ².
_NOISE_RANGE = (1e-6, 10.0)
_LOG_NOISE_TOLERANCE = 1e-3
# A search that ends within this (in log σ²) of its lower end has ended on it.
_AT_BOUND = 0.01


def check_fraction(fraction) -> float | str:
    """``fraction`` as a float in [0, 1), or ``"auto"``, else a ``ValueError``."""
    if fraction == "auto" and isinstance(fraction, str):
        return fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating, np.integer)):
        raise ValueError(f"validation_fraction must be a number in [0, 1) or 'auto', got {fraction!r}")
    fraction = float(fraction)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {fraction!r}")
    return fraction


def resolve_fraction(fraction, model, streamed: bool) -> float:
    """The share of rows a fit of ``model`` holds out: ``fraction`` itself, or for ``"auto"`` (the
    default of :func:`~alacarte.fit`, the estimator and the command line)
    :data:`RECOMMENDED_FRACTION` for a feature GP with its rows in memory (simplex-ARD kernels
    included: :func:`scores_iterates` says what their rows do), and 0 — the marginal likelihood of
    all rows — for an exact GP (no finite feature map to over-fit; it is the reference the
    feature GPs are measured against) and for streamed rows.

    Raises:
        ValueError: for a fraction outside [0, 1), or a positive one with streamed rows.
    """
    fraction = check_fraction(fraction)
    if fraction == "auto":
        feature_gp = hasattr(model.covar_module, "features")
        return RECOMMENDED_FRACTION if feature_gp and not streamed else 0.0
    if fraction and streamed:
        raise ValueError("validation_fraction is for rows in memory; streamed data are fitted on all rows "
                         "(validation_fraction=0)")
    return fraction


def scores_iterates(model) -> bool:
    """Whether a fit's held-out rows choose its iterates (early stopping, restarts, the noise refit)
    as well as set σ² and the band's scale at the end (:meth:`HeldOut.calibrate`).  Not for a
    simplex-ARD kernel: its exact zeros are where the likelihood's path ends, and stopping early
    keeps weight on irrelevant inputs, so the likelihood of the kept rows runs its course and
    the held-out rows only set the band."""
    return not getattr(model.covar_module, "simplex", False)


def held_out_count(n: int, fraction: float) -> int:
    """How many of ``n`` rows :func:`split_rows` holds out at ``fraction``: ``round(fraction·n)``, at most
    :data:`MAX_ROWS`, and none when fewer than 10 rows are given (the score of one or two rows would pick
    iterates at random)."""
    return 0 if n < _MIN_ROWS else min(int(round(fraction * n)), MAX_ROWS)


def split_rows(n: int, fraction: float, seed: int | None) -> tuple[Tensor, Tensor] | None:
    """Indices (kept, held out) of a seeded random split of ``n`` rows (:func:`held_out_count` of them held
    out), or ``None`` when nothing is held out."""
    held = held_out_count(n, fraction)
    if held < 1:
        return None
    # A generator of its own: the restarts' draws stay those of a fit without held-out rows.
    order = torch.as_tensor(np.random.default_rng(None if seed is None else [seed, 0x401d]).permutation(n))
    return order[held:].sort().values, order[:held].sort().values


class HeldOut:
    """The negative log predictive density per held-out row, in the model's internal (standardised)
    units, under the posterior of the model's current training rows and parameters, at the best
    overall scale of the predictive variance.

    Multiplying the signal variance σ_f² and the noise variance σ² by one factor s leaves the
    posterior mean as it is and multiplies every predictive variance by s, so that scale has a
    closed-form estimate from the held-out residuals r and predictive variances v,
    s* = (Σ r²/v + ν) / (h + ν): the best scale of the h held-out rows, pulled towards the
    model's own (s = 1) with the weight of ν = :data:`SCALE_PRIOR_ROWS` rows (the mode of an
    inverse-gamma prior), so that a handful of held-out rows cannot shrink the band at will.
    Scoring at s* judges an iterate by its mean and the *shape* of its variance, which the
    fit's σ² need not have settled yet; :meth:`calibrate` then sets s* and σ².

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

    def _predictive(self, statistics: SufficientStatistics | None) -> tuple[Tensor, Tensor]:
        """The held-out rows' predictive mean and variance (noise included).  Given the kept rows'
        ``statistics`` at the current parameters, from them: a D×D factorisation instead of
        another pass over the kept rows."""
        model = self.model
        if statistics is None:
            predictive = model.likelihood(model(self.x))
            return predictive.mean, predictive.variance
        posterior = self._posterior(statistics)
        phi = model.covar_module.features(self.x)
        return model.mean_module(self.x) + posterior.mean(phi), posterior.latent_variance(phi) + posterior.noise

    @torch.no_grad()
    def score_and_scale(self, statistics: SufficientStatistics | None = None) -> tuple[float, float]:
        """(the score, s*); ``(inf, 1)`` where the posterior cannot be factorised.  The model is
        left in train mode.

        Args:
            statistics: the kept rows' :class:`~alacarte.woodbury.SufficientStatistics` at the
                model's current parameters (e.g. the likelihood's
                :attr:`~alacarte.WoodburyMarginalLogLikelihood.last_statistics`), or ``None`` to
                compute the posterior from the rows."""
        return self._scored(lambda: self._predictive(statistics))

    def _scored(self, predictive) -> tuple[float, float]:
        """(the score, s*) of the held-out rows' ``predictive()`` (mean, variance); ``(inf, 1)``
        where it cannot be computed."""
        model = self.model
        model.eval()
        try:
            mean, variance = predictive()
            ratio = float(((self.y - mean) ** 2 / variance).mean())
            rows = self.rows
            scale = (rows * ratio + SCALE_PRIOR_ROWS) / (rows + SCALE_PRIOR_ROWS)
            value = 0.5 * (math.log(2 * math.pi * scale) + float(torch.log(variance).mean()) + ratio / scale)
        except (NotPSDError, NanError, NotPositiveDefiniteError):
            value, scale = math.inf, 1.0
        finally:
            model.train()
        if not (math.isfinite(value) and 0 < scale < math.inf):
            return math.inf, 1.0
        return value, scale

    def loss(self, statistics: SufficientStatistics | None = None) -> float:
        """The score at the scale s* (``inf`` where it cannot be computed); ``statistics`` as
        for :meth:`score_and_scale`."""
        return self.score_and_scale(statistics)[0]

    def _leave_one_out(self, statistics: SufficientStatistics, phi: Tensor) -> tuple[Tensor, Tensor]:
        """Each held-out row's predictive mean and variance under the posterior of *all other* rows,
        kept and held out (``statistics``: all rows', ``phi``: the held-out rows' features).

        With A = ΦᵀΦ + σ²I over all rows and the leverage h = φᵀA⁻¹φ < 1 of a held-out row, removing
        that row from the posterior divides its residual by 1 − h and makes its predictive variance
        σ²/(1 − h) (the rank-one downdate of A)."""
        return self._left_out(self._posterior(statistics), phi, self.x, self.y)

    def _posterior(self, statistics: SufficientStatistics) -> WoodburyPosterior:
        return WoodburyPosterior(statistics, homoskedastic_noise(self.model.likelihood))

    def _left_out(self, posterior: WoodburyPosterior, phi: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_leave_one_out` of the rows ``x, y`` (features ``phi``), each among the rows of ``posterior``."""
        mean = self.model.mean_module(x) + posterior.mean(phi)
        keep = (1 - posterior.latent_variance(phi) / posterior.noise).clamp_min(torch.finfo(phi.dtype).eps)
        return y - (y - mean) / keep, posterior.noise / keep

    @torch.no_grad()
    def every_row_scale(self, statistics: SufficientStatistics, phi: Tensor) -> float | None:
        """The band's scale s* counted on every row, each predicted from all the others (``statistics``:
        all rows', ``phi``: the held-out rows' features), where the held-out rows are at least
        :data:`TAIL_ROWS`; else ``None``.

        The kept rows' standardised squared residuals z² = (y − m₋ᵢ)²/v₋ᵢ come from a fit that has seen
        them, so they run smaller than the held-out rows' by a factor c, which the ratio of the two
        medians measures (a median: untouched by a few far-off rows).  Then
        s* = (Σ_H z² + c Σ_T z² + ν)/(n + ν): the held-out rows say how wide the band's body should be,
        and every row votes on its tails, with five times the rows of the held-out part alone."""
        if self.rows < TAIL_ROWS:
            return None
        self.model.eval()
        try:
            posterior = self._posterior(statistics)  # one factorisation for every chunk
            held = self._standardized_squares(self._left_out(posterior, phi, self.x, self.y), self.y)
            kept = torch.cat([self._standardized_squares(self._left_out(
                posterior, self.model.covar_module.features(x), x, y), y) for x, y in self._kept_chunks()])
        finally:
            self.model.train()
        factor = float(held.median() / kept.median())
        scale = (float(held.sum()) + factor * float(kept.sum()) + SCALE_PRIOR_ROWS) / (
            held.numel() + kept.numel() + SCALE_PRIOR_ROWS)
        return scale if math.isfinite(scale) and scale > 0 else None

    def _kept_chunks(self):
        """The kept rows (the model's training rows), in chunks within the model's memory budget."""
        (x,), y = self.model.train_inputs, self.model.train_targets
        rows = self.model.chunk_rows()
        return ((x[i:i + rows], y[i:i + rows]) for i in range(0, y.shape[-1], rows))

    @staticmethod
    def _standardized_squares(predictive: tuple[Tensor, Tensor], y: Tensor) -> Tensor:
        mean, variance = predictive
        return (y - mean) ** 2 / variance

    @torch.no_grad()
    def _all_rows(self, statistics: SufficientStatistics | None = None) -> tuple[SufficientStatistics, Tensor] | None:
        """All rows' statistics (``statistics`` where given) and the held-out rows' features at the current
        parameters (``None`` for a model without explicit features, an exact GP)."""
        features = getattr(self.model.covar_module, "features", None)
        if features is None:
            return None
        phi = features(self.x)
        if statistics is None:
            held = sufficient_statistics(phi, self.y - self.model.mean_module(self.x))
            statistics = training_statistics(self.model) + held
        return statistics, phi

    @torch.no_grad()
    def calibration_predictive(self) -> tuple[Tensor, Tensor]:
        """The held-out rows' predictive (mean, variance, noise included) that :meth:`calibrate`
        scores: for a feature GP, each row predicted from all other rows; for an exact GP, from the
        kept rows."""
        rows = self._all_rows()
        return self._predictive(None) if rows is None else self._leave_one_out(*rows)

    def calibration_score(self):
        """What :meth:`calibrate` minimises: ``() -> (score, s*)`` at the model's current σ².

        A feature GP's held-out rows are scored leave-one-out under the posterior of all the other
        rows: the final model conditions on all rows, so its σ² and scale are chosen for a posterior
        of n − 1 rows, not for the kept rows' alone.  The rows' statistics do not depend on σ²: one
        pass serves every σ² the search tries."""
        return self._measure(self._all_rows())

    def _measure(self, rows: tuple[SufficientStatistics, Tensor] | None):
        """:meth:`calibration_score` given :meth:`_all_rows`."""
        if rows is None:
            return self.score_and_scale
        return lambda: self._scored(lambda: self._leave_one_out(*rows))

    @torch.no_grad()
    def calibrate(self) -> tuple[float, float] | None:
        """Choose σ² (in its constraint and in [1e-6, 10] standardised) by a bounded search on
        log σ² for the lowest score of the held-out rows, each predicted from all other rows
        (:meth:`calibration_score`), then multiply σ² and σ_f² by that σ²'s s* — for a feature GP
        with at least :data:`TAIL_ROWS` held-out rows, s* counted on every row
        (:meth:`every_row_scale`) — and the model's ``band_scale`` with them, which bounds every
        variance by the prior the likelihood fitted (:meth:`~alacarte.models.StandardizedGP.band_factor`).

        The constraint's lower bound guards the marginal likelihood, which σ² → 0 can reward on
        rows it has seen; the held-out rows have not been seen.  Where the search ends on the
        bound, it goes on below it, down to 1e-6, and where the rows choose less than the bound
        allows, the bound (a buffer, saved with the model) is lowered to 5e-7; elsewhere it is
        left as it was.

        Returns:
            (σ², s*) as set, or ``None`` when the noise or the signal variance is not trained
            (``requires_grad`` off) and the model is left alone.
        """
        if not self._band_trained():
            return None
        noise_covar = self.model.likelihood.noise_covar
        floor = noise_covar.raw_noise_constraint.lower_bound.clone()
        low = max(_NOISE_RANGE[0], 2 * float(floor.max()))
        high = min(_NOISE_RANGE[1], float(noise_covar.raw_noise_constraint.upper_bound))
        rows = self._all_rows()
        measure = self._measure(rows)
        best = self._search(measure, low, high, (measure()[0], float(self.model.likelihood.noise.min())))
        below = low > _NOISE_RANGE[0] and math.log(best[1] / low) < _AT_BOUND
        if below:  # the search ended on the likelihood's floor: the held-out rows may want less
            _set_noise_bound(self.model, floor.clamp_max(_NOISE_RANGE[0] / 2), best[1])
            best = self._search(measure, _NOISE_RANGE[0], low, best)
        set_noise(self.model, best[1])
        tails = None if rows is None else self.every_row_scale(*rows)
        return self._scaled(measure()[1] if tails is None else tails, best[1], floor, below)

    @torch.no_grad()
    def rescale(self, statistics: SufficientStatistics | None = None) -> tuple[float, float] | None:
        """Multiply σ_f² and σ² by the held-out rows' s* at the model's σ², each row of a feature GP
        predicted from all other rows (:meth:`calibration_score`): :meth:`calibrate` without its search on
        σ², so one factorisation instead of one per σ² tried.  ``statistics``: every row's, kept and held
        out, at the current parameters, where the caller has them.  Returns and refuses as :meth:`calibrate`."""
        if not self._band_trained():
            return None
        floor = self.model.likelihood.noise_covar.raw_noise_constraint.lower_bound.clone()
        rows = self._all_rows(statistics)
        scale = (self.score_and_scale() if rows is None else self._scored(lambda: self._leave_one_out(*rows)))[1]
        return self._scaled(scale, float(self.model.likelihood.noise.min()), floor, True)

    def _band_trained(self) -> bool:
        """Whether the noise and the signal variance are trained (``requires_grad``): else the band is the user's."""
        signal = signal_variance_parameter(self.model)
        return bool(self.model.likelihood.noise_covar.raw_noise.requires_grad and signal is not None
                    and signal[0].requires_grad)

    def _scaled(self, scale: float, noise: float, floor: Tensor, relax: bool) -> tuple[float, float]:
        """Set σ² to ``noise``·``scale`` and multiply σ_f² by ``scale`` (and the model's ``band_scale`` by the
        factor σ_f² took within its constraint); with ``relax``, below the constraint's ``floor`` if the value
        asks it (down to 5e-7)."""
        value = noise * scale
        relaxed = floor.clamp_max(_NOISE_RANGE[0] / 2)
        _set_noise_bound(self.model, relaxed if relax and value < 2 * float(floor.max()) else floor, value)
        _, module, name = signal_variance_parameter(self.model)
        before = getattr(module, name).detach().clone()
        scale_signal(self.model, scale)
        self.model.band_scale.mul_((getattr(module, name).detach() / before).mean())
        return float(self.model.likelihood.noise.min()), scale

    def _search(self, measure, low: float, high: float, best: tuple[float, float]) -> tuple[float, float]:
        """(score, σ²): ``best`` or the bounded search's minimum of ``measure`` on log σ² in [low, high], the lower."""
        if low < high:
            def score(log_noise: float) -> float:
                set_noise(self.model, math.exp(log_noise))
                return measure()[0]

            found = minimize_scalar(score, bounds=(math.log(low), math.log(high)), method="bounded",
                                    options={"xatol": _LOG_NOISE_TOLERANCE})
            if found.fun < best[0]:
                best = (found.fun, math.exp(found.x))
        return best


def _set_noise_bound(model, bound: Tensor, noise: float) -> None:
    """Set σ²'s constraint's lower bound (a buffer: saved with the model) to ``bound``, then σ² to ``noise``."""
    model.likelihood.noise_covar.raw_noise_constraint.lower_bound.copy_(bound)
    set_noise(model, noise)


def training_statistics(model) -> SufficientStatistics | None:
    """The statistics of the model's training rows at the current parameters, summed over chunks
    within its memory budget (``None`` for a model without explicit features, an exact GP)."""
    if getattr(model.covar_module, "features", None) is None:
        return None
    return model.training_statistics()


@torch.no_grad()
def maximize_band_likelihood(model) -> tuple[float, float] | None:
    """Set σ² and an overall factor t of σ_f² where the marginal likelihood of the model's training
    rows is highest, every other parameter kept: undoes :meth:`HeldOut.calibrate` where the
    marginal likelihood must be read at its own optimum (the evidence of
    :func:`~alacarte.selection.select_inputs`).

    With ΦᵀΦ = U diag(λ) Uᵀ and b = UᵀΦᵀr of the rows at the current parameters, the negative log
    likelihood of σ² and t is, up to a constant,
    ½[(n − D) log σ² + Σᵢ log(tλᵢ + σ²) + (rᵀr − Σᵢ t bᵢ²/(tλᵢ + σ²))/σ²]: one eigendecomposition,
    then O(D) per trial.

    Returns:
        (σ², t) as set, or ``None`` (the model left alone) for a model without explicit features
        or with σ² or σ_f² not trained.
    """
    noise_covar = model.likelihood.noise_covar
    signal = signal_variance_parameter(model)
    statistics = training_statistics(model)
    if statistics is None or not noise_covar.raw_noise.requires_grad or signal is None or not signal[0].requires_grad:
        return None
    eigenvalues, vectors = torch.linalg.eigh(statistics.gram.double())
    eigenvalues = eigenvalues.clamp_min(0).cpu().numpy()
    projections = (vectors.T @ statistics.phi_r.double()).cpu().numpy() ** 2
    r_r, n, d = float(statistics.r_r), statistics.n, statistics.num_features

    def loss_and_gradient(log_values: np.ndarray) -> tuple[float, np.ndarray]:
        factor, noise = np.exp(log_values)
        spectrum = factor * eigenvalues
        total = spectrum + noise
        explained = factor * projections / total
        residual = r_r - float(np.sum(explained))
        loss = 0.5 * ((n - d) * log_values[1] + float(np.sum(np.log(total))) + residual / noise)
        fitted = float(np.sum(explained / total))
        gradient = 0.5 * np.array([float(np.sum(spectrum / total)) - fitted,
                                   (n - d) + float(np.sum(noise / total)) + fitted - residual / noise])
        return loss, gradient

    constraint = noise_covar.raw_noise_constraint
    low = math.log(max(1e-12, 2 * float(constraint.lower_bound)))
    high = math.log(float(constraint.upper_bound)) if math.isfinite(float(constraint.upper_bound)) else None
    start = np.array([0.0, math.log(float(model.likelihood.noise.min()))])
    found = minimize(loss_and_gradient, start, jac=True, method="L-BFGS-B", bounds=[(-20.0, 20.0), (low, high)],
                     options={"ftol": 1e-14, "gtol": 1e-9})
    factor, noise = (float(v) for v in np.exp(found.x))
    set_noise(model, noise)
    scale_signal(model, factor)
    model.band_scale.fill_(1.0)  # σ_f² is the likelihood's again
    return float(model.likelihood.noise.min()), factor
