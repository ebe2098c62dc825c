"""The base of alacarte's GP models: an ``ExactGP`` that standardises its inputs and targets and
predicts in chunks of rows, in the targets' original units."""
from __future__ import annotations

import contextlib
import itertools
from typing import NamedTuple

import torch
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.models import ExactGP
from torch import Tensor

from ._chunks import DEFAULT_MEMORY_BUDGET, check_memory_options
from ._validation import (
    as_tensor,
    check_inputs,
    check_positive_int,
    check_scales_finite,
    check_targets,
    robust_std,
)
from .mll import homoskedastic_noise

__all__ = ["Prediction", "StandardizedGP", "into_rows", "shifted_mean"]


class Prediction(NamedTuple):
    """Predictive moments in the targets' original units, each of shape ``(*batch, m)`` for m test points.

    ``variance`` (latent f*) and ``observed_variance`` (y* = f* + noise) are
    ``None`` when only the mean was asked for.
    """

    mean: Tensor
    variance: Tensor | None
    observed_variance: Tensor | None


def into_rows(out: Tensor | None, part: Tensor, start: int, total: int) -> Tensor:
    """Write ``part`` (..., rows) into ``out[..., start:start + rows]``, making ``out`` (..., total) if ``None``."""
    if out is None:
        out = part.new_empty(*part.shape[:-1], total)
    out[..., start : start + part.shape[-1]] = part
    return out


def shifted_mean(t: Tensor) -> Tensor:
    """Column means (dim 0) summed as deviations from the column's midrange: a constant column's mean is its
    value exactly (sixty rows of 1e50 summed plainly give 9.999999999999999e49, and the "constant" column
    then standardises to ±1e34), and a nearly constant one's is accurate to its spread's round-off."""
    middle = t.amax(0) / 2 + t.amin(0) / 2  # (halved first: the sum of two values near ±1.7e308 overflows)
    return middle + (t - middle).mean(0)



def _band_scale_default(state_dict, prefix, *args) -> None:
    # A state without the band's scale (it is optional in a saved model) is a model whose band is unscaled.
    if prefix + "target_scale" in state_dict:
        state_dict.setdefault(prefix + "band_scale", torch.ones_like(state_dict[prefix + "target_scale"]))


class StandardizedGP(ExactGP):
    """ExactGP plus affine input/target standardisation kept in buffers.

    ``memory_budget`` (bytes, or ``None`` for :data:`~alacarte.streaming.DEFAULT_MEMORY_BUDGET`)
    bounds each chunk of :meth:`predict` and of posterior draws; :func:`alacarte.fit` and
    ``cache_posterior`` set it to the budget they were given.

    ``band_scale`` (a buffer, 1 unless a fit's held-out rows set the band) is the factor s by which
    :meth:`alacarte.holdout.HeldOut.calibrate` multiplied σ_f² and σ².  It widens the posterior
    between the training rows, where a finite feature map's is too sure, but no latent variance past
    the prior's expected squared error of the predictive mean, k(x, x)/s + (m(x) − μ)², with the prior
    the likelihood fitted; a joint covariance keeps its correlations (:meth:`band_factor`)."""

    def __init__(self, train_x, train_y, likelihood: GaussianLikelihood | None, num_dims: int):
        num_dims = check_positive_int(num_dims, "num_dims")
        likelihood = likelihood if likelihood is not None else GaussianLikelihood()
        if type(likelihood) is not GaussianLikelihood:
            raise ValueError(
                "alacarte models need a homoskedastic gpytorch.likelihoods.GaussianLikelihood (one noise "
                f"variance σ², trained or fixed), got {type(likelihood).__name__}"
            )
        if train_x is not None:
            train_x = check_inputs(as_tensor(train_x, "train_x"), "train_x", num_dims)
            train_y = check_targets(as_tensor(train_y, "train_y", train_x.dtype), train_x.shape[0], "train_y")
        super().__init__(train_x, train_y, likelihood)
        self.num_dims = num_dims
        self.mean_module = ConstantMean()
        self.register_buffer("input_offset", torch.zeros(num_dims))
        self.register_buffer("input_scale", torch.ones(num_dims))
        self.register_buffer("target_offset", torch.zeros(()))
        self.register_buffer("target_scale", torch.ones(()))
        self.register_buffer("band_scale", torch.ones(()))
        self._register_load_state_dict_pre_hook(_band_scale_default)
        self.memory_budget: int | None = None

    # -- units --------------------------------------------------------------------------
    def standardize(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Set the transformation from data (mean 0, std 1 per column) and apply it.

        A constant column (max = min) is only centred: its computed std can be
        round-off (0.1s give ~1e-17), and dividing by it would make an O(1) input."""
        x_offset, y_offset = shifted_mean(x), shifted_mean(y)
        # (of the deviations, which are exact: torch's std of the values themselves centres them on a plain sum)
        x_scale = robust_std(x - x_offset, 0) if x.shape[0] > 1 else torch.ones_like(x[0])
        y_scale = robust_std(y - y_offset) if y.shape[0] > 1 else torch.ones_like(y[0])
        x_scale = x_scale.masked_fill(x.amax(0) == x.amin(0), 0.0)  # 0 → scale 1 below
        y_scale = y_scale.masked_fill(y.amax() == y.amin(), 0.0)
        self.set_standardization(x_offset, x_scale, y_offset, y_scale)
        return self.internal_inputs(x), (y - self.target_offset) / self.target_scale

    @torch.no_grad()
    def set_standardization(self, input_offset: Tensor, input_scale: Tensor, target_offset: Tensor,
                            target_scale: Tensor) -> None:
        """Set the affine transformation x ↦ (x − offset)/scale (constant columns keep scale 1)."""
        check_scales_finite(input_offset, input_scale, "x")
        check_scales_finite(target_offset, target_scale, "y")
        self.input_offset.copy_(input_offset)
        self.input_scale.copy_(torch.where(input_scale > 0, input_scale, torch.ones_like(input_scale)))
        self.target_offset.copy_(target_offset)
        self.target_scale.copy_(target_scale if target_scale > 0 else torch.ones_like(target_scale))

    def internal_inputs(self, x: Tensor) -> Tensor:
        return (x - self.input_offset) / self.input_scale

    def internal_query_inputs(self, x) -> Tensor:
        """Test inputs (original units, validated) in the internal units, where they must stay finite."""
        x, _ = self.check_data(x)
        inner = self.internal_inputs(x)
        overflowed = ~torch.isfinite(inner).all(-1)
        if bool(overflowed.any()):
            rows = overflowed.nonzero().flatten()[:5].tolist()
            raise ValueError(f"x rows {rows} (first 5 shown) overflow to inf once standardised with the training "
                             "data's scales: they lie too far outside the training data")
        return inner

    @staticmethod
    def refuse_overflowed_rows(values: Tensor) -> None:
        """A ValueError naming the test rows (the last axis of ``values``) whose prediction is NaN.

        Inputs that stay finite once standardised can still overflow the kernel's arithmetic (ω·x of
        a feature kernel, a squared distance): cos(inf) is NaN, which is no prediction to return.
        (inf is let through: a variance in units of 1e200² is beyond float64, not wrong.)"""
        bad = torch.isnan(values).reshape(-1, values.shape[-1]).any(0)
        if bool(bad.any()):
            rows = bad.nonzero().flatten()[:5].tolist()
            raise ValueError(f"x rows {rows} (first 5 shown) give NaN predictions: they lie too far outside the "
                             "training data for the kernel's arithmetic (ω·x or a squared distance overflows)")

    def _model_dtype(self) -> torch.dtype:
        return self.input_offset.dtype

    def check_data(self, x, y=None) -> tuple[Tensor, Tensor | None]:
        """Validate and convert user data (original units) to the model's dtype/device."""
        dtype, device = self._model_dtype(), self.input_offset.device
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"alacarte models compute in float32 or float64, this one is {dtype}: call model.float() "
                             "or model.double()")
        x = check_inputs(as_tensor(x, "x", dtype, device), "x", self.num_dims)
        if y is not None:
            y = check_targets(as_tensor(y, "y", dtype, device), x.shape[0], "y")
        return x, y

    def inference_settings(self) -> contextlib.AbstractContextManager:
        """GPyTorch settings under which the model is trained and queried."""
        return contextlib.nullcontext()

    # -- prediction ---------------------------------------------------------------------
    def _parameter_snapshot(self) -> list[Tensor]:
        """Copies of the parameters and buffers a prediction cache is computed from."""
        return [t.detach().clone() for t in itertools.chain(self.parameters(), self.buffers())]

    def _unchanged_since(self, snapshot: list[Tensor] | None) -> bool:
        """Whether every parameter and buffer still holds the values in ``snapshot``.

        Values, not version counters: ``model.likelihood.noise = v`` writes through ``.data``."""
        if snapshot is None:
            return False
        current = list(itertools.chain(self.parameters(), self.buffers()))
        return len(current) == len(snapshot) and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a.detach(), b)
            for a, b in zip(current, snapshot)
        )

    def _has_data(self) -> bool:
        return self.train_inputs is not None

    def band_factor(self, latent_variance: Tensor, prior_variance: Tensor, mean_offset: Tensor) -> Tensor | None:
        """The factor c = √min(1, b/v) by which each point's latent deviation is multiplied, so that its
        variance v is at most b = k(x, x)/s + (m(x) − μ)², the expected squared error of the predictive mean m
        under the prior the likelihood fitted (mean μ, variance k(x, x)/s; ``prior_variance``: k(x, x) at the
        model's scaled σ_f², ``mean_offset``: m(x) − μ).  A GP posterior's variance never exceeds it; the
        band's scale s may, where the rows are far.  ``None`` where s is at most 1, so nothing is bounded."""
        scale = float(self.band_scale)
        if scale <= 1.0:
            return None
        bound = prior_variance / scale + mean_offset.square()
        return (bound / latent_variance.clamp_min(torch.finfo(latent_variance.dtype).tiny)).clamp_max(1.0).sqrt()

    def chunk_rows(self, memory_budget: int | None = None) -> int:
        """Rows per chunk of :meth:`predict` and of posterior draws within ``memory_budget`` bytes.

        Args:
            memory_budget: bytes one chunk may take (default: the model's ``memory_budget``, which
                :func:`alacarte.fit` sets to the budget it was given, else
                :data:`~alacarte.streaming.DEFAULT_MEMORY_BUDGET`).

        Raises:
            ValueError: if ``memory_budget`` is not a positive integer or too small for one row.
        """
        if memory_budget is None:
            # (getattr: a model pickled without the attribute predicts at the default)
            memory_budget = getattr(self, "memory_budget", None)
        return self._rows_within(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget)

    def _rows_within(self, memory_budget: int) -> int:
        """Rows of a prediction chunk whose intermediates take at most ``memory_budget`` bytes."""
        raise NotImplementedError

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, x, *, mean_only: bool = False, chunk_size: int | None = None,
                memory_budget: int | None = None) -> Prediction:
        """Predictive mean and variances at ``x`` (original units), in chunks of rows.

        Memory is bounded by the chunk size whatever the number of test points: each chunk
        takes at most ``memory_budget`` bytes (:meth:`chunk_rows`), as each evaluation of a
        streamed fit does.

        Args:
            x: test inputs (m, d), tensor or array.
            mean_only: skip the variances (cheaper).
            chunk_size: rows per chunk (default: from ``memory_budget``).
            memory_budget: bytes one chunk may take — a FeatureGP's features and their
                intermediates, an ExactRBFGP's covariances with the training rows and among the
                chunk's rows (default: the model's ``memory_budget``, the one its fit was given,
                else 256 MiB).  Give at most one of ``chunk_size`` and ``memory_budget``.

        Returns:
            The :class:`~alacarte.models.Prediction` (mean, variance, observed_variance).

        Raises:
            ValueError: if the model has no training data (nor, for a FeatureGP, a cached
                posterior), ``x`` has NaN/inf or another number of columns, a row lies so far
                outside the training data that its prediction overflows, or ``chunk_size`` or
                ``memory_budget`` is bad (not a positive integer, both given, a budget too small
                for one row).
        """
        if not self._has_data():
            raise ValueError(
                "the model has no training data: call alacarte.fit(model, x, y) (or, for a FeatureGP, "
                "model.cache_posterior(x, y)) first"
            )
        inner = self.internal_query_inputs(x)
        chunk_size, memory_budget = check_memory_options(chunk_size, memory_budget)
        rows = chunk_size or self.chunk_rows(memory_budget)
        was_training = self.training
        self.eval()
        try:
            with self.inference_settings():
                mean, variance = None, None
                for start in range(0, inner.shape[0], rows):
                    chunk = self._predict_internal(inner[start : start + rows], mean_only)
                    # Written into the outputs and dropped, not kept for a torch.cat: small results held
                    # while the next chunks' large features come and go fragment glibc's heap, and the peak
                    # memory grows with m (+670 MB at m = 160 000 with 512 features, against +84 MB).
                    mean = into_rows(mean, chunk[0], start, inner.shape[0])
                    variance = None if mean_only else into_rows(variance, chunk[1], start, inner.shape[0])
                    del chunk
        finally:
            self.train(was_training)
        # Test points are the last axis; a batched kernel's leading axes are its batch.
        mean = mean * self.target_scale + self.target_offset
        self.refuse_overflowed_rows(mean)
        if mean_only:
            return Prediction(mean, None, None)
        scale2 = self.target_scale**2
        variance = variance * scale2
        self.refuse_overflowed_rows(variance)
        noise = homoskedastic_noise(self.likelihood) * scale2
        return Prediction(mean, variance, variance + noise.unsqueeze(-1))
