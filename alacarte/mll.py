"""Marginal likelihood of feature-kernel GPs through the Woodbury identity."""
from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.models import ExactGP
from linear_operator.operators import LowRankRootLinearOperator
from torch import Tensor

from .woodbury import (
    SufficientStatistics,
    negative_log_marginal_likelihood,
    negative_log_marginal_likelihood_of_rows,
    sufficient_statistics,
)

__all__ = ["WoodburyMarginalLogLikelihood", "homoskedastic_noise"]


def homoskedastic_noise(likelihood: GaussianLikelihood) -> Tensor:
    """σ² of a plain ``GaussianLikelihood``, shape ``(*batch,)``.

    Raises:
        ValueError: for any other likelihood (a subclass, ``FixedNoiseGaussianLikelihood`` …):
            the Woodbury path needs one noise variance for every row.
    """
    if type(likelihood) is not GaussianLikelihood:
        raise ValueError(
            f"the Woodbury path needs a homoskedastic gpytorch.likelihoods.GaussianLikelihood, "
            f"got {type(likelihood).__name__}"
        )
    return likelihood.noise.squeeze(-1)


def feature_root(function_dist: MultivariateNormal) -> Tensor:
    """Φ of a prior whose covariance is a feature kernel's ``LowRankRootLinearOperator``."""
    covar = function_dist.lazy_covariance_matrix
    if hasattr(covar, "evaluate_kernel"):
        covar = covar.evaluate_kernel()
    if not isinstance(covar, LowRankRootLinearOperator):
        raise ValueError(
            "WoodburyMarginalLogLikelihood needs the prior of a model whose kernel is an alacarte "
            f"FeatureKernel (a LowRankRootLinearOperator covariance), got {type(covar).__name__}"
        )
    return covar.root.to_dense()


class WoodburyMarginalLogLikelihood(ExactMarginalLogLikelihood):
    r"""Exact marginal log likelihood of a GP with an explicit-feature kernel.

    The same value as :class:`gpytorch.mlls.ExactMarginalLogLikelihood`
    (log p(y) plus log priors, divided by n) computed in O(nD² + D³) from one
    Cholesky factor of A = ΦᵀΦ + σ²I (docs/mathematics.md §4); no CG.  When n < D the
    identity is read the other way round, through K = ΦΦᵀ + σ²I: then the n×n
    factor is the smaller one, O(n²D + n³) instead of O(nD² + D³).  For n ≥ D
    no n×n matrix is formed.

    Args:
        likelihood: the model's homoskedastic ``GaussianLikelihood`` (other likelihoods are refused).
        model: a :class:`~alacarte.FeatureGP` (a model whose prior covariance is a feature
            kernel's low-rank root ΦΦᵀ).

    Attributes:
        last_statistics: the statistics ΦᵀΦ, Φᵀr, rᵀr, n of the latest call, detached
            (``None`` after a call that took the n×n path): the weight posterior at the same
            parameters needs only them and σ², so a caller that scores it reuses them.

    Example:
        >>> import torch
        >>> from gpytorch.mlls import ExactMarginalLogLikelihood
        >>> from alacarte import FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood
        >>> x = torch.rand(100, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0])
        >>> model = FeatureGP(x, y, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0)).double()
        >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
        >>> loss = -mll(model(x), y)
        >>> loss.backward()                          # gradients for any torch optimiser
        >>> model.covar_module.raw_lengthscale.grad.shape
        torch.Size([1, 3])
        >>> exact = ExactMarginalLogLikelihood(model.likelihood, model)   # the n×n way, O(n³)
        >>> torch.allclose(-loss, exact(model(x), y))
        True
    """

    def __init__(self, likelihood: GaussianLikelihood, model: ExactGP):
        homoskedastic_noise(likelihood)
        super().__init__(likelihood, model)
        self.last_statistics: SufficientStatistics | None = None

    def forward(self, function_dist: MultivariateNormal, target: Tensor, *params, **kwargs) -> Tensor:
        phi = feature_root(function_dist)
        num_data, num_features = phi.shape[-2:]
        try:  # (else a RuntimeError from deep inside the statistics)
            torch.broadcast_shapes(target.shape[:-1], phi.shape[:-2])
            matches = target.dim() > 0 and target.shape[-1] == num_data
        except RuntimeError:
            matches = False
        if not matches:
            raise ValueError(f"target must have shape (*batch, n) with n = {num_data} rows of the prior and a batch "
                             f"that broadcasts with the prior's {tuple(phi.shape[:-2])}, got {tuple(target.shape)}")
        if not bool(torch.isfinite(target).all()):
            raise ValueError("target contains non-finite values (NaN or inf)")
        residual = target - function_dist.mean
        if num_data < num_features:
            self.last_statistics = None
            loss = negative_log_marginal_likelihood_of_rows(phi, residual, homoskedastic_noise(self.likelihood))
            return self._add_other_terms(-loss, params).div_(num_data)
        stats = sufficient_statistics(phi, residual)
        self.last_statistics = stats.detach()
        return self.from_statistics(stats, *params)

    def from_statistics(self, stats: SufficientStatistics, *params) -> Tensor:
        """The same value from sufficient statistics ΦᵀΦ, Φᵀr, rᵀr, n (summed over chunks
        or processes, see :mod:`alacarte.streaming`).

        Args:
            stats: the statistics of the training rows' features and residuals r = y − μ(x).
            *params: passed on to the likelihood's and the priors' terms, as for ``forward``.

        Returns:
            (log p(y) + log priors) / n, of the statistics' batch shape.

        Raises:
            NotPositiveDefiniteError: if σ² ≤ 0 or A cannot be factorised even with jitter.
        """
        res = -negative_log_marginal_likelihood(stats, homoskedastic_noise(self.likelihood))
        res = self._add_other_terms(res, params)
        return res.div_(stats.n)
