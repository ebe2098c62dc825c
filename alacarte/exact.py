"""The exact GP baseline: :class:`ExactRBFGP`, an RBF or ARD kernel with the O(n³) likelihood."""
from __future__ import annotations

import contextlib

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from ._chunks import rows_within
from ._standardized import StandardizedGP
from .kernels._params import log_positive
from .woodbury import NotPositiveDefiniteError

__all__ = ["ExactRBFGP"]


class _RBFKernel(RBFKernel):
    """GPyTorch's RBF kernel, whose predictions do not couple the test rows through round-off.

    GPyTorch expands ‖a − b‖² = ‖a‖² + ‖b‖² − 2aᵀb about the mean of x1, which for a prediction is
    the test chunk: one test row far outside the data moves that mean and every other row's distances
    drown in cancellation (a row at 1e8 beside [0.5, 0.5, 0.5] moves its mean from 0.409 to −0.483,
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



class ExactRBFGP(StandardizedGP):
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
        >>> x = torch.rand(200, 3, generator=generator, dtype=torch.float64) * 4 - 2
        >>> f = torch.sin(2 * x[:, 0])                # only the first input matters
        >>> y = f + 0.1 * torch.randn(200, generator=generator, dtype=torch.float64)
        >>> model = ExactRBFGP(None, None, num_dims=3, ard=True).double()   # as make_model builds it
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
        # The lengthscales on the log scale, as every feature kernel's (alacarte.kernels._params.log_positive).
        self.covar_module = ScaleKernel(_RBFKernel(ard_num_dims=num_dims if ard else None,
                                                   lengthscale_constraint=log_positive()))
        self._strategy_parameters: list[Tensor] | None = None  # what prediction_strategy was computed from

    def __call__(self, *args, **kwargs):
        # GPyTorch keeps an ExactGP's prediction cache (K⁻¹y, a root of K⁻¹) until .train(): a model
        # queried, then given a new noise or lengthscale in eval mode, would predict with the old mean.
        if self.training:
            return super().__call__(*args, **kwargs)
        if self.prediction_strategy is not None and not self._unchanged_since(getattr(self, "_strategy_parameters",
                                                                                       None)):
            self._clear_cache()
        cached = self.prediction_strategy is not None
        output = super().__call__(*args, **kwargs)
        if not cached and self.prediction_strategy is not None:
            self._strategy_parameters = self._parameter_snapshot()
        if len(args) != 1 or gpytorch.settings.prior_mode.on() or float(self.band_scale) <= 1:
            return output  # (before output.variance: a mean-only prediction computes no variance)
        factor = self.band_factor(output.variance, self.covar_module(args[0], diag=True),
                                  output.mean - self.mean_module(args[0]))
        if factor is None:
            return output
        bound = DiagLinearOperator(factor)
        return MultivariateNormal(output.mean, bound @ output.lazy_covariance_matrix @ bound)

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def _apply(self, fn):
        # GPyTorch's ExactGP converts its training data here but keeps its prediction cache (K⁻¹y and
        # a root of K⁻¹ in the previous dtype and device): a model that predicted in float32 could not
        # predict after .double() ("expected m1 and m2 to have the same dtype").
        self._clear_cache()
        return super()._apply(fn)

    def inference_settings(self) -> contextlib.AbstractContextManager:
        # Exact baselines stay exact: Cholesky rather than CG/Lanczos at every size.
        stack = contextlib.ExitStack()
        stack.enter_context(gpytorch.settings.max_cholesky_size(10**6))
        stack.enter_context(gpytorch.settings.fast_computations(False, False, False))
        return stack

    def _rows_within(self, memory_budget: int) -> int:
        # GPyTorch evaluates a chunk's test–test covariance (rows × rows) beside its rows × n cross-covariance,
        # even for the mean alone: rows·(n + rows) numbers within the budget (a bound on the cross-covariance
        # alone lets a chunk's test block of 20 000 rows take 3.2 GB).
        itemsize = torch.finfo(self._model_dtype()).bits // 8
        n = self.train_inputs[0].shape[0]
        return rows_within(memory_budget, n * itemsize, square_bytes=itemsize)

    def _predict_internal(self, x: Tensor, mean_only: bool) -> tuple[Tensor, Tensor | None]:
        try:
            with gpytorch.settings.debug(False):  # else GPyTorch warns when x equals the training inputs
                dist = self(x)
            return dist.mean, None if mean_only else dist.variance
        except (NotPSDError, NanError) as err:  # as a FeatureGP's A that cannot be factorised: a ValueError
            raise NotPositiveDefiniteError(
                f"K + σ²I of the training inputs cannot be factorised at this model's hyperparameters ({err})"
            ) from None
