"""Gaussian spectral mixture (GM) kernel on Fastfood features (docs/mathematics.md §3)."""
from __future__ import annotations

import numpy as np
import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.priors import Prior
from torch import Tensor

from ..features.fastfood import fastfood_matrix, fastfood_project
from ._params import ConstrainedParameter, register_constrained_parameter
from .fastfood import FastfoodMixtureKernel

__all__ = ["SpectralMixtureFastfoodKernel", "spectral_mixture_kernel"]


def spectral_mixture_kernel(x1: Tensor, x2: Tensor, weights: Tensor, means: Tensor, scales: Tensor) -> Tensor:
    r"""The closed-form GM kernel :math:`\sum_q w_q e^{-\frac12\sum_j \sigma_{qj}^2\tau_j^2}\cos(\mu_q^\top\tau)`.

    Dense, O(n m Q d): for tests and small problems.  ``weights`` (Q,),
    ``means`` and ``scales`` (Q, d), angular frequencies; ``x1`` (n, d) and ``x2`` (m, d)
    give the (n, m) matrix.
    """
    tau = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (n, m, d)
    tau = tau.unsqueeze(-2)  # (n, m, 1, d)
    envelope = torch.exp(-0.5 * (scales * tau).pow(2).sum(-1))
    return (weights * envelope * torch.cos((means * tau).sum(-1))).sum(-1)


class SpectralMixtureFastfoodKernel(FastfoodMixtureKernel):
    r"""Gaussian spectral mixture kernel (Wilson & Adams 2013) on Fastfood features.

    .. math::
        k(\tau) = \sum_{q=1}^{Q} w_q \exp\!\Big(-\tfrac12 \sum_j \sigma_{qj}^2 \tau_j^2\Big)
        \cos(\mu_q^\top \tau)

    — one full-dimensional Gaussian per component, in angular frequency.
    Component ``q`` has ``M_q = M / Q`` frequencies
    :math:`\omega = \mu_q + \sigma_q \odot \varepsilon` with :math:`\varepsilon`
    the rows of a fixed unit-scale RBF Fastfood block, so
    :math:`\omega^\top x = \varepsilon^\top(\sigma_q \odot x) + \mu_q^\top x`: one
    Fastfood pass on the scaled input plus an O(d) shift.  The features of
    component ``q`` carry weight :math:`\sqrt{w_q / M_q}`, so ``k(x, x) = Σ w_q``
    and the kernel has no separate ``outputscale``.

    Learnable: ``weights`` (Q, positive), ``means`` (Q×d), ``scales`` (Q×d, positive).

    GPyTorch's ``SpectralMixtureKernel`` multiplies 1-D mixtures over dimensions,
    in cycles; it coincides with this kernel for d = 1 (with ``mixture_means = μ/2π``,
    ``mixture_scales = σ/2π``), and for a single component with μ = 0 (its weight
    ``w^(1/d)``); a sum of Q > 1 components is not a product over dimensions.

    Args:
        num_dims: input dimension ``d``.
        num_samples: total number of frequencies ``M`` (a multiple of ``num_components``).
        num_components: ``Q``.
        seed: seed of the Fastfood state and of the initial means.
        strategy: ``"auto"``, ``"dense"`` or ``"fwht"`` (see :class:`FastfoodRBFKernel`).
        weights_prior, weights_constraint, scales_prior, scales_constraint: for w and σ.
        **kwargs: as for :class:`~alacarte.FeatureKernel` (``batch_shape`` …); there is no
            lengthscale (so no ``simplex``) and no outputscale: the weights carry σ_f².

    Initial state: ``w_q = 1/Q``, ``σ_q = 1``, ``μ_q ~ N(0, 0.1²)`` (small, so
    that components can separate; see :mod:`alacarte.init` for data-driven values).

    Example:
        >>> import torch
        >>> from alacarte import SpectralMixtureFastfoodKernel
        >>> kernel = SpectralMixtureFastfoodKernel(num_dims=4, num_samples=512, num_components=4, seed=0)
        >>> kernel.features(torch.randn(10, 4)).shape
        torch.Size([10, 1024])
    """

    has_lengthscale = False
    scales = ConstrainedParameter()

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        num_components: int = 4,
        scales_prior: Prior | None = None,
        scales_constraint: Interval | None = None,
        **kwargs,
    ):
        super().__init__(num_dims, num_samples, num_components=num_components, **kwargs)
        batch = self.component_shape
        means = np.random.default_rng([self.seed, 1]).normal(0.0, 0.1, size=(*batch, num_dims))
        self.register_parameter("means", torch.nn.Parameter(torch.as_tensor(means, dtype=torch.get_default_dtype())))
        register_constrained_parameter(
            self, "scales", torch.ones(*batch, num_dims), scales_constraint or Positive(), scales_prior
        )

    def frequencies(self) -> Tensor:
        """All M frequency vectors ω (component-major), shape ``(*batch, M, d)``."""
        eps = fastfood_matrix(self.sign, self.perm, self.gauss, self.radius, self.num_dims)  # (*b, Q, Mq, d)
        omega = eps * self.scales.unsqueeze(-2) + self.means.unsqueeze(-2)
        return omega.reshape(*self.batch_shape, self.num_samples, self.num_dims)

    def projection(self, x: Tensor) -> Tensor:
        if self.execution_strategy() == "dense":
            return x @ self.frequencies().transpose(-1, -2)
        scaled = x.unsqueeze(-3) * self.scales.unsqueeze(-2)  # (..., Q, n, d)
        proj = fastfood_project(scaled, self.sign, self.perm, self.gauss, self.radius, "fwht")  # (..., Q, n, Mq)
        proj = proj + (x.unsqueeze(-3) @ self.means.unsqueeze(-1))  # the O(d) shift μ_qᵀx
        return self.join_components(proj)

    @property
    def relevance(self) -> Tensor:
        """Σ_q w_q σ_qj per input j, normalised to sum to one; shape ``(*batch, d)``."""
        return self._normalise((self.weights.unsqueeze(-1) * self.scales).sum(-2).detach())

    def expected_kernel(self, x1: Tensor, x2: Tensor) -> Tensor:
        """The closed form this expansion estimates (dense; non-batched kernels)."""
        if len(self.batch_shape):
            raise ValueError("expected_kernel supports kernels without batch_shape")
        return spectral_mixture_kernel(x1, x2, self.weights, self.means, self.scales)
