"""GP models: the feature-space GP (Woodbury) and exact RBF/ARD baselines.

Both share one fit/predict API: :func:`alacarte.fit` standardises inputs and
targets and stores the transformation in the model's buffers, so
:meth:`predict` takes and returns original units.  ``model(x)`` and
``likelihood(model(x))`` behave as in any GPyTorch ``ExactGP`` and work in the
model's internal (standardised) units.  The exact baselines are in
:mod:`alacarte.exact`.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import operator

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import GaussianLikelihood
from linear_operator.operators import LowRankRootLinearOperator
from torch import Tensor

from ._chunks import rows_within
from ._standardized import Prediction, StandardizedGP, into_rows
from ._validation import as_tensor, check_inputs, check_positive_int, check_seed
from .exact import ExactRBFGP
from .kernels.base import FeatureKernel
from .mll import homoskedastic_noise
from .streaming import as_chunked_data, streamed_statistics
from .woodbury import SufficientStatistics, WoodburyPosterior, sufficient_statistics

__all__ = ["Prediction", "FeatureGP", "ExactRBFGP", "FunctionSamples"]


class FunctionSamples:
    """k posterior draws f(x) = μ + φ(x)ᵀw of a :class:`FeatureGP`, callable anywhere.

    Calling it on inputs (m, d) in original units returns a (k, m) tensor in the
    targets' original units, in O(D) per point and draw, in chunks of rows as
    :meth:`~FeatureGP.predict` (memory: the k×m draws and one chunk's features).
    The draws stay the functions drawn: later changes to the model (a refit) do
    not change them.  Where the band's scale bounds the variance (``band_scale``
    above 1: :meth:`~alacarte.models.StandardizedGP.band_factor`), each point's
    deviation from the posterior mean is multiplied by its factor, which costs
    O(D²) per point, so the draws have the covariance :meth:`FeatureGP.predict` and
    ``model(x)`` give.
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
        f, rows = None, model.chunk_rows()
        for start in range(0, inner.shape[0], rows):
            part = inner[start : start + rows]
            phi = model.covar_module.features(part)
            values = phi @ weights
            if float(model.band_scale) > 1:
                posterior = model._posterior  # the one the weights were drawn from
                centre = posterior.mean(phi).unsqueeze(-1)
                values = centre + (values - centre) * model._deviation_root(posterior, phi)[1].unsqueeze(-1)
            values = model.mean_module(part).unsqueeze(-1) + values
            f = into_rows(f, values.transpose(-1, -2), start, inner.shape[0])
            del values, phi
        f = f * model.target_scale + model.target_offset
        model.refuse_overflowed_rows(f)
        return f




class FeatureGP(StandardizedGP):
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
        FeatureGP does not use (it raises "Call the model on some data first!" whatever
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
        # (getattr: a model pickled without the snapshot attribute has none)
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
                # Without a graph to keep, the statistics are summed over predict's chunks of rows: the features
                # of all n rows at once are n×D (625 MB for 160 000 rows and 512 features, also in a process
                # that only loads a model and predicts).
                stats = self._statistics(self.chunk_rows() if detach else None)
                posterior = WoodburyPosterior(stats, homoskedastic_noise(self.likelihood))
            if self.training:
                return posterior
            self._keep_posterior(posterior)
        return self._posterior

    def _keep_posterior(self, posterior: WoodburyPosterior) -> None:
        """Cache ``posterior`` as computed from the model's current parameters and buffers."""
        self._posterior, self._posterior_parameters = posterior, self._parameter_snapshot()

    def _statistics(self, rows: int | None) -> SufficientStatistics:
        """The training rows' ΦᵀΦ, Φᵀr, rᵀr and n, summed over chunks of ``rows`` rows (``None``: at once)."""
        (x,) = self.train_inputs
        r = self.train_targets - self.mean_module(x)
        n = x.shape[-2]
        rows = max(n, 1) if rows is None else rows
        # (No rows at all still give the prior's statistics, as one product over them would.)
        return functools.reduce(operator.add, (
            sufficient_statistics(self.covar_module.features(x[..., s : s + rows, :]), r[..., s : s + rows])
            for s in range(0, n, rows) or [0]))

    @torch.no_grad()
    def prior_variance_ratio(self) -> float:
        r"""How much more widely a function drawn from the fitted prior would vary over the training inputs
        than the training targets vary beyond their noise: about 1 where the prior matches the data.

        .. math::
            \frac{\frac1n\sum_i k(x_i, x_i) - \frac1{n^2}\sum_{ij} k(x_i, x_j)}
                 {\frac1n\sum_i (y_i - \bar y)^2 - \sigma^2 (n - 1)/n},

        the expected spread of a prior draw over the inputs (k = φᵀφ/s: from the features' sum and squared
        norms, a chunk of rows at a time, at the prior the likelihood fitted, before the band's scale s) over
        what the targets' spread leaves for the function.  Far above 1, the likelihood has inflated σ_f² to fit
        the targets with large weights on too few features, and far from the training inputs, where the
        predictive variance returns to the prior's, the intervals are about √ratio times too wide
        (docs/calibration.md, "Far from the training inputs").  ``inf`` where the targets vary no more than
        the noise.

        Raises:
            ValueError: if the model holds no training rows (a posterior streamed by
                :meth:`cache_posterior`) or holds a batch of them.
        """
        if self.train_inputs is None or self.train_inputs[0].dim() != 2:
            raise ValueError("prior_variance_ratio needs the model's training rows, unbatched (n, d)")
        (x,), y = self.train_inputs, self.train_targets
        n, rows = x.shape[0], self.chunk_rows()
        total, squares = 0.0, 0.0
        for s in range(0, n, rows):
            phi = self.covar_module.features(x[s:s + rows]).double()
            total, squares = total + phi.sum(0), squares + float((phi**2).sum())
        scale = float(self.band_scale)
        prior = (squares / n - float((total / n).square().sum())) / scale
        noise = float(homoskedastic_noise(self.likelihood)) / scale
        data = float(y.double().var(unbiased=False)) - noise * (n - 1) / n
        return prior / data if data > 0 else float("inf")

    @torch.no_grad()
    def training_statistics(self) -> SufficientStatistics:
        """The training rows' :class:`~alacarte.woodbury.SufficientStatistics` at the current parameters,
        summed over chunks within the memory budget."""
        return self._statistics(self.chunk_rows())

    def condition_on(self, statistics: SufficientStatistics) -> None:
        """Predict from the posterior of ``statistics`` — the training rows', at the current parameters,
        e.g. :meth:`training_statistics` — until a parameter changes or the model trains again, instead of
        a pass over the rows.  Puts the model in eval mode."""
        self.eval()
        self._keep_posterior(WoodburyPosterior(statistics, homoskedastic_noise(self.likelihood)))

    @torch.no_grad()
    def cache_posterior(self, x, y=None, *, chunk_size: int | None = None, memory_budget: int | None = None,
                        statistics_dtype: torch.dtype | None = None) -> WoodburyPosterior:
        """Condition on data streamed in chunks and keep the posterior for prediction.

        The data (original units; arrays, memory-mapped arrays or a re-iterable
        of (x, y) chunks, as for :func:`alacarte.fit`) is read once to sum
        ΦᵀΦ, Φᵀr, rᵀr and n (:func:`alacarte.streaming.streamed_statistics`);
        the training features are never held.  The model is put in eval mode
        and drops any training tensors it held, so :meth:`predict` and
        :meth:`sample_functions` use this posterior until the next training, in chunks
        within the same ``memory_budget``.

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
        if data.chunk_size is None:
            self.memory_budget = data.memory_budget
        self._keep_posterior(WoodburyPosterior(stats, homoskedastic_noise(self.likelihood)))
        return self._posterior

    def __call__(self, *args, **kwargs):
        if self.training or len(args) != 1 or gpytorch.settings.prior_mode.on():
            return super().__call__(*args, **kwargs)
        x = check_inputs(as_tensor(args[0], "x", self._model_dtype(), self.input_offset.device), "x", self.num_dims)
        posterior, phi, mean = self._posterior_mean(x)
        return MultivariateNormal(mean, LowRankRootLinearOperator(self._deviation_root(posterior, phi)[0]))

    def _deviation_root(self, posterior: WoodburyPosterior, phi: Tensor) -> tuple[Tensor, Tensor | None]:
        """A root R of the latent posterior covariance at the rows of φ* (RRᵀ, each row's variance bounded by
        :meth:`band_factor`) and the factor each row was multiplied by (``None``: 1)."""
        root = posterior.whiten(phi)
        if float(self.band_scale) <= 1:
            return root, None
        factor = self.band_factor(root.pow(2).sum(-1), phi.pow(2).sum(-1), posterior.mean(phi))
        return root * factor.unsqueeze(-1), factor

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

    def _rows_within(self, memory_budget: int) -> int:
        # A row's features, the Fastfood projection they come from and their whitened copy for the variance.
        itemsize = torch.finfo(self._model_dtype()).bits // 8
        return rows_within(memory_budget, 3 * self.covar_module.num_features * itemsize)

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        posterior, phi, mean = self._posterior_mean(x)
        return mean, None if mean_only else self._deviation_root(posterior, phi)[0].pow(2).sum(-1)
