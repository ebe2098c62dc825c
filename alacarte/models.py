"""GP models: the feature-space GP (Woodbury) and exact RBF/ARD baselines.

Both share one fit/predict API: :func:`alacarte.fit` standardises inputs and
targets and stores the transformation in the model's buffers, so
:meth:`predict` takes and returns original units.  ``model(x)`` and
``likelihood(model(x))`` behave as in any GPyTorch ``ExactGP`` and work in the
model's internal (standardised) units.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import operator
from typing import NamedTuple

import gpytorch

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.models import ExactGP
from linear_operator.operators import LowRankRootLinearOperator
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from ._validation import (
    as_tensor,
    check_inputs,
    check_positive_int,
    check_scales_finite,
    check_seed,
    check_targets,
    robust_std,
)
from .kernels.base import FeatureKernel
from .mll import homoskedastic_noise
from .streaming import as_chunked_data, streamed_statistics
from .woodbury import NotPositiveDefiniteError, WoodburyPosterior, sufficient_statistics

__all__ = ["Prediction", "FeatureGP", "ExactRBFGP", "FunctionSamples"]

# Rows per prediction chunk are chosen so that one chunk's features take about this much.
_CHUNK_BYTES = 32 * 2**20


class Prediction(NamedTuple):
    """Predictive moments in the targets' original units, each of shape ``(*batch, m)`` for m test points.

    ``variance`` (latent f*) and ``observed_variance`` (y* = f* + noise) are
    ``None`` when only the mean was asked for.
    """

    mean: Tensor
    variance: Tensor | None
    observed_variance: Tensor | None


class FunctionSamples:
    """k posterior draws f(x) = μ + φ(x)ᵀw of a :class:`FeatureGP`, callable anywhere.

    Calling it on inputs (m, d) in original units returns a (k, m) tensor in the
    targets' original units, in O(D) per point and draw, in chunks of rows as
    :meth:`~FeatureGP.predict` (memory: the k×m draws and one chunk's features).
    The draws stay the functions drawn: later changes to the model (a refit) do
    not change them.
    """

    def __init__(self, model: "FeatureGP", weights: Tensor):
        # The weights mean something only with the features, mean and units they were drawn for: keep a
        # copy of the model as it is now (sharing, not copying, its training data and posterior), so that
        # a later refit or setter does not turn the draws into φ_new(x)ᵀw.
        shared = [*(model.train_inputs or ()), model.train_targets, model._posterior,
                  getattr(model, "_posterior_parameters", None)]
        self._model = copy.deepcopy(model, {id(t): t for t in shared if t is not None})
        self.weights = weights  # (*batch, k, D), internal units

    def __len__(self) -> int:
        return self.weights.shape[-2]

    @torch.no_grad()
    def __call__(self, x) -> Tensor:
        model = self._model
        inner = model.internal_query_inputs(x)
        weights = self.weights.transpose(-1, -2).to(inner.dtype)
        # A chunk of rows at a time, as predict: the features of all m rows at once are m×D (655 MB at
        # m = 160 000, D = 512).
        f, rows = None, model._chunk_rows()
        for start in range(0, inner.shape[0], rows):
            part = inner[start : start + rows]
            values = model.mean_module(part).unsqueeze(-1) + model.covar_module.features(part) @ weights
            f = _into_rows(f, values.transpose(-1, -2), start, inner.shape[0])
            del values
        f = f * model.target_scale + model.target_offset
        model.refuse_overflowed_rows(f)
        return f


def _into_rows(out: Tensor | None, part: Tensor, start: int, total: int) -> Tensor:
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


class _StandardizedGP(ExactGP):
    """ExactGP plus affine input/target standardisation kept in buffers."""

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
        a feature kernel, a squared distance): cos(inf) is NaN, which was returned as a prediction.
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

    def _chunk_rows(self) -> int:
        raise NotImplementedError

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, x, *, mean_only: bool = False, chunk_size: int | None = None) -> Prediction:
        """Predictive mean and variances at ``x`` (original units), in chunks of rows.

        Memory is bounded by the chunk size whatever the number of test points.

        Args:
            x: test inputs (m, d), tensor or array.
            mean_only: skip the variances (cheaper).
            chunk_size: rows per chunk; default: about 32 MiB of a chunk's features (FeatureGP)
                or of its covariance with the training rows (ExactRBFGP).

        Returns:
            The :class:`~alacarte.models.Prediction` (mean, variance, observed_variance).

        Raises:
            ValueError: if the model has no training data (nor, for a FeatureGP, a cached
                posterior), ``x`` has NaN/inf or another number of columns, or a row lies so far
                outside the training data that its prediction overflows.
        """
        if not self._has_data():
            raise ValueError(
                "the model has no training data: call alacarte.fit(model, x, y) (or, for a FeatureGP, "
                "model.cache_posterior(x, y)) first"
            )
        inner = self.internal_query_inputs(x)
        if chunk_size is not None:
            check_positive_int(chunk_size, "chunk_size")
        was_training = self.training
        self.eval()
        try:
            with self.inference_settings():
                rows = chunk_size or self._chunk_rows()
                mean, variance = None, None
                for start in range(0, inner.shape[0], rows):
                    chunk = self._predict_internal(inner[start : start + rows], mean_only)
                    # Written into the outputs and dropped, not kept for a torch.cat: every chunk's small
                    # results, kept while the next chunks' large features came and went, fragmented glibc's
                    # heap, and the peak memory grew with m after all (+670 MB at m = 160 000 with 512
                    # features; +84 MB so).
                    mean = _into_rows(mean, chunk[0], start, inner.shape[0])
                    variance = None if mean_only else _into_rows(variance, chunk[1], start, inner.shape[0])
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


class FeatureGP(_StandardizedGP):
    r"""GP regression with an explicit-feature kernel, trained and queried through Woodbury.

    ``f(x) = μ + φ(x)ᵀw``, ``w ~ N(0, I_D)``, ``y = f(x) + ε``.  Use
    :class:`~alacarte.WoodburyMarginalLogLikelihood` (same value as GPyTorch's
    ``ExactMarginalLogLikelihood``, O(nD² + D³)) for training; in eval mode
    ``model(x)`` returns the posterior with a rank-D root covariance
    ``σ² Φ* A⁻¹ Φ*ᵀ``, and :meth:`predict` streams mean and variances in
    O(D²) per point.  No n×n (or n×n*) matrix is formed unless n < D
    (then the training loss uses the smaller n×n factor).

    Args:
        train_x, train_y: training data (or ``None``; :func:`alacarte.fit` sets it).
        kernel: an alacarte :class:`~alacarte.FeatureKernel`.
        likelihood: a ``GaussianLikelihood`` (default: a new one).

    Example:
        >>> import torch
        >>> from alacarte import FeatureGP, FSARDKernel, fit
        >>> generator = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 3, generator=generator) * 4 - 2
        >>> f = torch.sin(2 * x[:, 0])                # only the first input matters
        >>> y = f + 0.1 * torch.randn(200, generator=generator)
        >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
        >>> history = fit(model, x, y, max_iter=30, restarts=0)
        >>> pred = model.predict(x)                   # mean, variance, observed_variance
        >>> pred.variance.shape, bool((pred.mean - f).square().mean().sqrt() < 0.1)
        (torch.Size([200]), True)
        >>> model.covar_module.relevance.argmax().item()
        0
    """

    def __init__(self, train_x, train_y, kernel: FeatureKernel, likelihood: GaussianLikelihood | None = None):
        if not isinstance(kernel, FeatureKernel):
            raise ValueError(f"FeatureGP needs an alacarte FeatureKernel, got {type(kernel).__name__}")
        if kernel.active_dims is not None:
            raise ValueError(
                "FeatureGP takes inputs of exactly the kernel's num_dims columns, so it does not take a kernel with "
                "active_dims: select the columns in the data instead (x[:, dims], num_dims=len(dims))"
            )
        super().__init__(train_x, train_y, likelihood, kernel.num_dims)  # (checks the likelihood)
        self.covar_module = kernel
        self._posterior: WoodburyPosterior | None = None
        self._posterior_parameters: list[Tensor] | None = None  # what _posterior was computed from

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def _clear_cache(self) -> None:
        # GPyTorch calls this on train() and load_state_dict(): either may change the
        # parameters the cached posterior was computed from.
        super()._clear_cache()
        self._posterior = None

    def _apply(self, fn):
        posterior, self._posterior = self._posterior, None
        module = super()._apply(fn)
        if posterior is not None and self.train_inputs is None:
            # Streamed (cache_posterior): no rows to recompute it from, so it moves with the model.
            self._keep_posterior(WoodburyPosterior.from_factor(fn(posterior.cholesky), fn(posterior.weights),
                                                              fn(posterior.noise)))
        return module

    def set_train_data(self, inputs: Tensor | tuple[Tensor, ...] | None = None, targets: Tensor | None = None,
                       strict: bool = True) -> None:
        """As :meth:`gpytorch.models.ExactGP.set_train_data`; also drops the cached posterior."""
        self._posterior = None
        return super().set_train_data(inputs, targets, strict)

    def _has_data(self) -> bool:
        return self.train_inputs is not None or self._posterior is not None

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, **kwargs) -> "FeatureGP":
        """A copy of the model, in eval mode, conditioned also on ``(inputs, targets)``
        (internal units, as ``model(x)``); targets ``(f, m)`` give ``f`` fantasies at once.

        GPyTorch's version updates the prediction cache of its own eval path, which a
        FeatureGP does not use (it raised "Call the model on some data first!" whatever
        was called); here the weight posterior is recomputed from the n + m rows.

        Args:
            inputs: fantasy inputs ``(..., m, d)``, in the internal (standardised) units.
            targets: fantasy targets ``(..., m)``, internal units; leading dimensions
                broadcast with the training targets'.

        Returns:
            The conditioned copy; this model is left as it is.

        Raises:
            ValueError: for other shapes, NaN/inf, any keyword argument, or a model whose posterior
                was streamed by :meth:`cache_posterior` (it holds no rows to add to).
        """
        if kwargs:
            raise ValueError(f"FeatureGP.get_fantasy_model takes no {sorted(kwargs)}: the likelihood is "
                             "homoskedastic")
        if self.train_inputs is None:
            raise ValueError("the model holds no training rows to add fantasies to (its posterior was streamed "
                             "by cache_posterior)")
        (x,), y = self.train_inputs, self.train_targets
        inputs = torch.as_tensor(inputs, dtype=x.dtype, device=x.device)
        targets = torch.as_tensor(targets, dtype=y.dtype, device=y.device)
        if inputs.dim() < 2 or inputs.shape[-1] != self.num_dims or targets.dim() < 1 \
                or targets.shape[-1] != inputs.shape[-2]:
            raise ValueError(f"inputs must have shape (..., m, {self.num_dims}) and targets (..., m), got "
                             f"{tuple(inputs.shape)} and {tuple(targets.shape)}")
        if not (bool(torch.isfinite(inputs).all()) and bool(torch.isfinite(targets).all())):
            raise ValueError("the fantasy inputs or targets contain non-finite values (NaN or inf)")
        input_batch = torch.broadcast_shapes(x.shape[:-2], inputs.shape[:-2])
        target_batch = torch.broadcast_shapes(y.shape[:-1], targets.shape[:-1])
        full_x = torch.cat([x.expand(*input_batch, *x.shape[-2:]), inputs.expand(*input_batch, *inputs.shape[-2:])], -2)
        full_y = torch.cat([y.expand(*target_batch, y.shape[-1]), targets.expand(*target_batch, targets.shape[-1])], -1)
        # Shared, not copied: the data and posterior that the fantasy's set_train_data replaces.
        fantasy = copy.deepcopy(self, {id(t): t for t in (x, y, self._posterior) if t is not None})
        fantasy.set_train_data(full_x, full_y, strict=False)
        fantasy.eval()
        return fantasy

    def posterior(self) -> WoodburyPosterior:
        """The weight posterior for the current training data and parameters (cached in eval mode;
        recomputed when a parameter or buffer changed since, e.g. ``model.likelihood.noise = v``)."""
        # (getattr: a model pickled before the snapshot existed has no such attribute)
        if self._posterior is not None and not self._unchanged_since(getattr(self, "_posterior_parameters", None)):
            self._posterior = None
        if self._posterior is None or self.training:
            if self.train_inputs is None:
                raise ValueError(
                    "the model holds no training data: call alacarte.fit(model, x, y) or model.cache_posterior(x, y) "
                    "(a posterior streamed by either is dropped by model.train() and by changing the model's "
                    "parameters)"
                )
            # A cache that kept the graph of the call that built it would fail every later backward()
            # (gradients w.r.t. test inputs); detached as GPyTorch detaches an ExactGP's test caches.
            detach = not self.training and gpytorch.settings.detach_test_caches.on()
            with torch.no_grad() if detach else contextlib.nullcontext():
                (x,) = self.train_inputs
                r = self.train_targets - self.mean_module(x)
                # Without a graph to keep, the statistics are summed over predict's chunks of rows: the features
                # of all n rows at once were n×D (+625 MB for 160 000 rows and 512 features, also in a process
                # that only loads a model and predicts).
                n = x.shape[-2]
                rows = self._chunk_rows() if detach else max(n, 1)
                # (No rows at all still give the prior's statistics, as the one product did.)
                stats = functools.reduce(operator.add, (
                    sufficient_statistics(self.covar_module.features(x[..., s : s + rows, :]), r[..., s : s + rows])
                    for s in range(0, n, rows) or [0]))
                posterior = WoodburyPosterior(stats, homoskedastic_noise(self.likelihood))
            if self.training:
                return posterior
            self._keep_posterior(posterior)
        return self._posterior

    def _keep_posterior(self, posterior: WoodburyPosterior) -> None:
        """Cache ``posterior`` as computed from the model's current parameters and buffers."""
        self._posterior, self._posterior_parameters = posterior, self._parameter_snapshot()

    @torch.no_grad()
    def cache_posterior(self, x, y=None, *, chunk_size: int | None = None, memory_budget: int | None = None,
                        statistics_dtype: torch.dtype | None = None) -> WoodburyPosterior:
        """Condition on data streamed in chunks and keep the posterior for prediction.

        The data (original units; arrays, memory-mapped arrays or a re-iterable
        of (x, y) chunks, as for :func:`alacarte.fit`) is read once to sum
        ΦᵀΦ, Φᵀr, rᵀr and n (:func:`alacarte.streaming.streamed_statistics`);
        the training features are never held.  The model is put in eval mode
        and drops any training tensors it held, so :meth:`predict` and
        :meth:`sample_functions` use this posterior until the next training.

        Args:
            x, y: the data, as for :class:`~alacarte.streaming.ChunkedData`: ``x`` (n, d) and
                ``y`` (n,), or ``x`` a re-iterable of ``(x_c, y_c)`` chunks and ``y=None``.
            chunk_size: rows per chunk (default: from ``memory_budget``).
            memory_budget: bytes one evaluation may use for features (default 256 MiB); give at
                most one of ``chunk_size`` and ``memory_budget``.
            statistics_dtype: dtype in which ΦᵀΦ, Φᵀr and rᵀr are summed (default: the model's).

        Returns:
            The posterior now cached (also :meth:`posterior`).

        Raises:
            ValueError: for data that ``ChunkedData`` refuses (NaN/inf, wrong shapes, no rows,
                both ``chunk_size`` and ``memory_budget``, …).

        Example:
            >>> import numpy as np
            >>> from alacarte import FeatureGP, FSARDKernel, fit
            >>> rng = np.random.default_rng(0)
            >>> x = rng.uniform(-2, 2, (200, 3)); y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(200)
            >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
            >>> history = fit(model, x[:100], y[:100], max_iter=30, restarts=0)   # hyperparameters from a subset
            >>> np.save("x.npy", x); np.save("y.npy", y)
            >>> _ = model.cache_posterior(np.load("x.npy", mmap_mode="r"), np.load("y.npy", mmap_mode="r"),
            ...                           chunk_size=64)   # all 200 rows, 64 at a time
            >>> model.predict(x[:5]).mean.shape
            torch.Size([5])
        """
        data = as_chunked_data(x, y, chunk_size=chunk_size, memory_budget=memory_budget,
                               statistics_dtype=statistics_dtype)
        self.eval()
        stats = streamed_statistics(self, data)
        self.train_inputs, self.train_targets = None, None
        self._keep_posterior(WoodburyPosterior(stats, homoskedastic_noise(self.likelihood)))
        return self._posterior

    def __call__(self, *args, **kwargs):
        if self.training or len(args) != 1 or gpytorch.settings.prior_mode.on():
            return super().__call__(*args, **kwargs)
        x = check_inputs(as_tensor(args[0], "x", self._model_dtype(), self.input_offset.device), "x", self.num_dims)
        posterior, phi, mean = self._posterior_mean(x)
        return MultivariateNormal(mean, LowRankRootLinearOperator(posterior.whiten(phi)))

    def _posterior_mean(self, x: Tensor) -> tuple[WoodburyPosterior, Tensor, Tensor]:
        """The posterior, the test features φ* and the predictive mean μ + φ*ᵀA⁻¹Φᵀr."""
        posterior = self.posterior()
        phi = self.covar_module.features(x)
        return posterior, phi, self.mean_module(x) + posterior.mean(phi)

    @torch.no_grad()
    def sample_functions(self, num_samples: int, seed: int | None = None) -> FunctionSamples:
        """Draw posterior functions f(x) = μ + φ(x)ᵀw, w ~ N(A⁻¹Φᵀr, σ²A⁻¹).

        Exact for the feature model (what Thompson sampling and pathwise methods
        need, and what exact GPs cannot give cheaply): each draw is a weight
        vector, evaluable at any inputs in O(D) per point.

        Args:
            num_samples: number of draws k.
            seed: seed of the draws (``None``: torch's global generator).

        Returns:
            The draws, a callable :class:`~alacarte.models.FunctionSamples`.

        Example:
            >>> import torch
            >>> from alacarte import FeatureGP, FSARDKernel, fit
            >>> generator = torch.Generator().manual_seed(0)
            >>> x = torch.rand(200, 3, generator=generator) * 4 - 2
            >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(200, generator=generator)
            >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
            >>> history = fit(model, x, y, max_iter=30, restarts=0)
            >>> draws = model.sample_functions(16, seed=0)
            >>> draws(x[:5]).shape      # (draws, points), in the units of y
            torch.Size([16, 5])
            >>> torch.equal(draws(x[:5]), model.sample_functions(16, seed=0)(x[:5]))
            True
        """
        check_positive_int(num_samples, "num_samples")
        if not self._has_data():
            raise ValueError(
                "the model has no training data: call alacarte.fit(model, x, y) (or, for a FeatureGP, "
                "model.cache_posterior(x, y)) first"
            )
        was_training = self.training
        self.eval()
        posterior = self.posterior()
        self.train(was_training)
        # Drawn on the CPU and moved, so a seed gives the same functions on every device.
        seed = check_seed(seed)
        generator = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        dim = posterior.weights.shape[-1]
        z = torch.randn(dim, num_samples, generator=generator, dtype=posterior.weights.dtype).to(posterior.weights.device)
        # σ L⁻ᵀ z has covariance σ² (L Lᵀ)⁻¹ = σ² A⁻¹.
        spread = torch.linalg.solve_triangular(posterior.cholesky.transpose(-1, -2), z, upper=True)
        weights = posterior.weights.unsqueeze(-1) + posterior.noise.sqrt()[..., None, None] * spread
        return FunctionSamples(self, weights.transpose(-1, -2).contiguous())

    def _chunk_rows(self) -> int:
        itemsize = torch.finfo(self._model_dtype()).bits // 8
        return max(1, _CHUNK_BYTES // (3 * self.covar_module.num_features * itemsize))

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        posterior, phi, mean = self._posterior_mean(x)
        return mean, None if mean_only else posterior.latent_variance(phi)


class _RBFKernel(RBFKernel):
    """GPyTorch's RBF kernel, whose predictions do not couple the test rows through round-off.

    GPyTorch expands ‖a − b‖² = ‖a‖² + ‖b‖² − 2aᵀb about the mean of x1, which for a prediction is
    the test chunk: one test row far outside the data moved that mean and every other row's distances
    drowned in cancellation (a row at 1e8 beside [0.5, 0.5, 0.5] moved its mean from 0.409 to −0.483,
    at 1e10 to 9.11; their posterior covariance from 0.00108 to −0.0141). A cross-covariance is
    centred on the training inputs (x2 there) instead: k(x1, x2) = k(x2, x1)ᵀ. The covariance of
    equal inputs is taken from exact differences in eval mode (test–test blocks, O(m²) anyway); in
    training it stays GPyTorch's own, bit for bit.
    """

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        # (last_dim_is_batch, deprecated by GPyTorch, wants a block per input dimension: GPyTorch's own.)
        if diag or params.get("last_dim_is_batch", False) or (self.training and torch.equal(x1, x2)):
            return super().forward(x1, x2, diag=diag, **params)
        if torch.equal(x1, x2):
            return self._exact_self_covariance(x1)
        m = x1.shape[-2]
        if x2.shape[-2] > m and torch.equal(x2[..., -m:, :], x1):
            # GPyTorch up to 1.15.1 asks for the test × (train, test) block of the joint covariance, not
            # the two blocks 1.15.2 asks for: centring on all of x2 would take in the test rows again.
            train = x2[..., :-m, :]
            cross = super().forward(train, x1, **params).transpose(-2, -1)
            return torch.cat([cross, self._exact_self_covariance(x1)], dim=-1)
        return super().forward(x2, x1, **params).transpose(-2, -1)

    def _exact_self_covariance(self, x: Tensor) -> Tensor:
        x = x.div(self.lengthscale)
        return torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").square().div(-2).exp()


class ExactRBFGP(_StandardizedGP):
    r"""Exact GP with GPyTorch's RBF (isotropic) or ARD kernel: the reference baseline.

    ``k(x, x') = σ_f² exp(−½‖(x − x')/ℓ‖²)``; O(n³) — for n up to a few thousand.

    Args:
        train_x, train_y: training data (or ``None``; :func:`alacarte.fit` sets it).
        num_dims: input dimension ``d``.
        ard: one lengthscale per input (``True``) or one for all (``False``).
        likelihood: a ``GaussianLikelihood`` (default: a new one).

    Example:
        >>> import torch
        >>> from alacarte import ExactRBFGP, fit
        >>> generator = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 3, generator=generator) * 4 - 2
        >>> f = torch.sin(2 * x[:, 0])                # only the first input matters
        >>> y = f + 0.1 * torch.randn(200, generator=generator)
        >>> model = ExactRBFGP(None, None, num_dims=3, ard=True)
        >>> history = fit(model, x, y, max_iter=30, restarts=0)
        >>> bool((model.predict(x).mean - f).square().mean().sqrt() < 0.1)
        True
        >>> lengthscale = model.covar_module.base_kernel.lengthscale.squeeze(0)
        >>> bool((lengthscale[1:] > 10 * lengthscale[0]).all())
        True
    """

    def __init__(self, train_x, train_y, *, num_dims: int, ard: bool = False,
                 likelihood: GaussianLikelihood | None = None):
        super().__init__(train_x, train_y, likelihood, num_dims)
        self.covar_module = ScaleKernel(_RBFKernel(ard_num_dims=num_dims if ard else None))
        self._strategy_parameters: list[Tensor] | None = None  # what prediction_strategy was computed from

    def __call__(self, *args, **kwargs):
        # GPyTorch keeps an ExactGP's prediction cache (K⁻¹y, a root of K⁻¹) until .train(): a model
        # queried, then given a new noise or lengthscale in eval mode, predicted with the old mean.
        if self.training:
            return super().__call__(*args, **kwargs)
        if self.prediction_strategy is not None and not self._unchanged_since(getattr(self, "_strategy_parameters",
                                                                                       None)):
            self._clear_cache()
        cached = self.prediction_strategy is not None
        output = super().__call__(*args, **kwargs)
        if not cached and self.prediction_strategy is not None:
            self._strategy_parameters = self._parameter_snapshot()
        return output

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def _apply(self, fn):
        # GPyTorch's ExactGP converts its training data here but keeps its prediction cache (K⁻¹y and
        # a root of K⁻¹ in the old dtype and device): a model that predicted in float32 failed to
        # predict after .double() ("expected m1 and m2 to have the same dtype").
        self._clear_cache()
        return super()._apply(fn)

    def inference_settings(self) -> contextlib.AbstractContextManager:
        # Exact baselines stay exact: Cholesky rather than CG/Lanczos at every size.
        stack = contextlib.ExitStack()
        stack.enter_context(gpytorch.settings.max_cholesky_size(10**6))
        stack.enter_context(gpytorch.settings.fast_computations(False, False, False))
        return stack

    def _chunk_rows(self) -> int:
        # GPyTorch evaluates a chunk's test–test covariance (rows × rows) beside its rows × n cross-covariance,
        # even for the mean alone: rows·(n + rows) numbers within the budget (32 MiB / 8n rows alone made the
        # test block of n = 200 training rows 20 971 × 20 971, 3.5 GB).
        n = self.train_inputs[0].shape[0]
        numbers = _CHUNK_BYTES // 8
        return max(1, (math.isqrt(n * n + 4 * numbers) - n) // 2)

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        try:
            with gpytorch.settings.debug(False):  # else GPyTorch warns when x equals the training inputs
                dist = self(x)
            return dist.mean, None if mean_only else dist.variance
        except (NotPSDError, NanError) as err:  # as a FeatureGP's A that cannot be factorised: a ValueError
            raise NotPositiveDefiniteError(
                f"K + σ²I of the training inputs cannot be factorised at this model's hyperparameters ({err})"
            ) from None
