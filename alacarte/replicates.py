r"""Repeated training inputs: a term per distinct input, for predictions where the data repeat.

Many data sets measure the same input more than once (replicated experiments, repeated
evaluations in Bayesian optimisation, copied records).  There the rows of one input can share more
than the smooth function: in

    y = f(x) + h(x) + ε,    h(x) ~ N(0, s) independently per distinct input,  ε ~ N(0, σ²),

a new observation at a training input x_g is predicted from that input's own targets as well as
from f.  A model fitted with one noise variance ν per row stands for s + σ² wherever an input is
new; the repeats say how ν splits.  :meth:`Replicates.choose_share` splits it by the
leave-one-out predictive likelihood of the rows at repeated inputs — each predicted from the
other rows at its input and the fitted model's posterior from every other input — as the
held-out band chooses ν itself (:mod:`alacarte.holdout`).  σ² = ν (s = 0, a share of 1) is the fitted
model's own prediction, so where the repeats show no term of their own nothing changes.

At a test input equal to training input g (m_g rows, mean ȳ_g) the prediction combines, exactly
for that input (docs/mathematics.md, "Repeated inputs"):

* the fitted model's posterior of f(x_g) from every *other* row — its posterior N(μ, v) at x_g with
  the group's own rows divided out, precision 1/v − m_g/ν — widened by s, and
* the group's mean ȳ_g, an observation of f(x_g) + h_g with variance σ²/m_g;

a new y at x_g adds σ².  Elsewhere nothing changes.  This is the Gaussian model with replicates of
Binois, Gramacy & Ludkovski (2018, *Practical heteroscedastic Gaussian process modeling for large
simulation experiments*), homoskedastic, applied to a fitted model.

Example:
    >>> import torch
    >>> from alacarte.replicates import Replicates
    >>> x = torch.tensor([[0.0], [0.0], [1.0], [2.0]], dtype=torch.float64)
    >>> y = torch.tensor([1.0, 1.2, 0.0, 3.0], dtype=torch.float64)
    >>> reps = Replicates.of(x, y)
    >>> reps.counts.tolist(), reps.means.tolist()
    ([2, 1, 1], [1.1, 0.0, 3.0])
    >>> reps.match(torch.tensor([[1.0], [0.5]], dtype=torch.float64)).tolist()
    [1, -1]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

from ._standardized import Prediction

__all__ = ["FLOOR", "Replicates"]

#: σ²'s lower bound relative to the targets' variance: GPyTorch's noise floor on standardised targets,
#: where exact GPs fitted to copied rows put their noise.
FLOOR = 1e-4
# The search's precision in log σ².
_LOG_TOLERANCE = 1e-3


def _as_array(a) -> np.ndarray:
    return np.asarray(a.detach().cpu() if isinstance(a, Tensor) else a, dtype=np.float64)


def _row_keys(x: np.ndarray) -> list[bytes]:
    # + 0.0 turns −0.0 into 0.0: equal inputs get equal bytes.
    return [row.tobytes() for row in np.ascontiguousarray(x + 0.0, dtype=np.float64)]


@dataclass(frozen=True)
class Replicates:
    """The distinct training inputs, each with its number of rows and mean target.

    Attributes:
        inputs: the distinct training inputs (G, d), in the order they first appear.
        means: each one's mean target ȳ_g (G,).
        counts: each one's number of rows m_g (G,), int64.
    """

    inputs: Tensor
    means: Tensor
    counts: Tensor
    # Each input's bytes to its index, built once: every prediction matches its rows against it.
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_index", {key: g for g, key in enumerate(_row_keys(self.inputs.numpy()))})

    @property
    def repeated(self) -> Tensor:
        """The indices of the inputs with at least two rows: where :meth:`choose_share` needs predictions."""
        return torch.nonzero(self.counts >= 2).squeeze(1)

    @classmethod
    def of(cls, x, y) -> "Replicates | None":
        """The distinct inputs of training rows (x, y), or ``None`` when no input repeats.

        Raises:
            ValueError: if ``x`` is not (n, d) with one finite target per row.
        """
        x, y = _as_array(x), _as_array(y)
        if x.ndim != 2 or y.shape != (x.shape[0],) or not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise ValueError(f"need finite x (n, d) and y (n,), got shapes {x.shape} and {y.shape}")
        first, index = {}, np.empty(len(y), dtype=np.int64)
        for row, key in enumerate(_row_keys(x)):
            index[row] = first.setdefault(key, len(first))
        counts = np.bincount(index)
        if counts.max() < 2:
            return None
        starts = np.unique(index, return_index=True)[1]
        means = np.bincount(index, weights=y) / counts
        return cls(torch.from_numpy(x[starts]), torch.from_numpy(means), torch.from_numpy(counts))

    def match(self, x) -> Tensor:
        """For each row of ``x`` (m, d), the index of the training input it equals, or −1."""
        return torch.tensor([self._index.get(key, -1) for key in _row_keys(_as_array(x))], dtype=torch.int64)

    def _others(self, groups: Tensor, pred: Prediction) -> tuple[Tensor, Tensor, Tensor]:
        """At the inputs ``groups``: the precision and the precision × mean of the fitted posterior of
        f(x_g) from every other input (the group's m_g rows divided out), and ν."""
        mu, v = pred.mean, pred.variance.clamp_min(torch.finfo(pred.mean.dtype).tiny)
        noise = (pred.observed_variance - pred.variance).clamp_min(torch.finfo(pred.mean.dtype).tiny)
        site = self.counts[groups].to(mu) / noise
        # Clamped at 0: the other rows say nothing (v₋ = ∞) where round-off makes it negative.
        return (1 / v - site).clamp_min(0), mu / v - site * self.means[groups].to(mu), noise

    @staticmethod
    def _posterior(others, weighted, s, m, ybar, variance) -> tuple[Tensor, Tensor]:
        """Mean and variance of u = f(x_g) + h_g: prior N(μ₋, v₋ + s), ȳ observed with variance σ²/m."""
        prior = others / (1 + s * others)  # 1 / (v₋ + s), finite as v₋ → ∞
        prior_mean = weighted / (1 + s * others)  # μ₋ / (v₋ + s)
        precision = prior + m / variance
        return (prior_mean + m * ybar / variance) / precision, 1 / precision

    def choose_share(self, x, y, pred: Prediction) -> float:
        """σ²/ν for a fitted model of noise ν: the share of ν, in [:data:`FLOOR`·var(y)/ν, 1], under which the
        rows at repeated inputs are best predicted, each from the other rows at its input (the
        leave-one-out predictive likelihood; docs/mathematics.md, "Repeated inputs").  1 (s = 0) leaves
        the model as it is.

        Args:
            x, y: the training rows the groups were made of.
            pred: the fitted model's prediction at ``inputs[repeated]`` (with its variances).
        """
        y = torch.as_tensor(_as_array(y))
        floor = FLOOR * float(y.var())
        groups = self.match(x)
        rows = self.counts[groups] >= 2
        groups, y = groups[rows], y[rows]
        slot = torch.full_like(self.counts, -1)  # each repeated input's row of ``pred``
        slot[self.repeated] = torch.arange(len(self.repeated))
        others, weighted, noise = self._others(groups, Prediction(*(t[slot[groups]] for t in pred)))
        m = (self.counts[groups] - 1).to(y)
        ybar = (self.means[groups] * (m + 1) - y) / m  # the other rows' mean

        def loss(log_share: float) -> float:
            variance = math.exp(log_share) * noise
            mean, var = self._posterior(others, weighted, noise - variance, m, ybar, variance)
            total = var + variance
            return float((torch.log(2 * math.pi * total) + (y - mean) ** 2 / total).sum() / 2)

        low = math.log(floor / float(noise[0]))
        if low >= 0:
            return 1.0
        found = minimize_scalar(loss, bounds=(low, 0.0), method="bounded", options={"xatol": _LOG_TOLERANCE})
        # The end 1 is the fitted model's own prediction: kept unless the search beats it.
        return math.exp(found.x) if found.fun < loss(0.0) else 1.0

    def predictive(self, x, pred: Prediction, share: float) -> Prediction:
        """A fitted model's prediction ``pred`` at ``x`` (m, d), with the rows at a training input
        predicted by the model with replicates and σ² = ``share``·ν (:meth:`choose_share`).

        ``pred`` needs its variances (the model's ``predict(x)`` without ``mean_only``); its noise ν
        is ``observed_variance − variance``.  At a training input the latent ``variance`` is that of
        f(x_g) + h_g, the mean response there.
        """
        if pred.variance is None or pred.observed_variance is None:
            raise ValueError("the prediction needs its variances (predict without mean_only)")
        group = self.match(x)
        at = group >= 0
        if share >= 1 or not bool(at.any()):
            return pred
        g = group[at]
        others, weighted, noise = self._others(g, Prediction(*(t[..., at] for t in pred)))
        variance = share * noise
        u_mean, u_var = self._posterior(others, weighted, noise - variance, self.counts[g].to(noise),
                                        self.means[g].to(noise), variance)
        mean, latent, observed = pred.mean.clone(), pred.variance.clone(), pred.observed_variance.clone()
        mean[..., at], latent[..., at], observed[..., at] = u_mean, u_var, u_var + variance
        return Prediction(mean, latent, observed)
