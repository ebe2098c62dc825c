"""Dense random-feature baselines: random kitchen sinks (RKS) and SSGPR."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .base import FeatureKernel, resolve_seed

__all__ = ["RandomFourierKernel", "SSGPRKernel"]


def _standard_normal(shape, seed: int, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(np.random.default_rng(seed).standard_normal(tuple(shape)), dtype=dtype)


class RandomFourierKernel(FeatureKernel):
    r"""RBF / ARD kernel from dense random kitchen sinks (Rahimi & Recht 2007).

    .. math::
        \omega_i = \varepsilon_i / \ell,\quad \varepsilon_i \sim N(0, I_d),\qquad
        \varphi(x) = \frac{\sigma_f}{\sqrt M}[\cos(\Omega x), \sin(\Omega x)]

    The M×d matrix ``ε`` is drawn once from ``seed`` (buffer ``weights``); the
    projection costs O(n M d).  The reference Fastfood is compared against.

    Args:
        num_dims: input dimension ``d``.
        num_samples: number of frequencies ``M`` (``D = 2M`` features).
        seed: seed of ``ε``; ``None`` draws one from torch's RNG.
        **kwargs: as for :class:`~alacarte.FeatureKernel` (``ard_num_dims``, ``batch_shape``,
            ``outputscale_prior``, ``simplex`` …).

    Example:
        >>> import torch
        >>> from alacarte import RandomFourierKernel
        >>> kernel = RandomFourierKernel(num_dims=3, num_samples=256, seed=0)
        >>> kernel.features(torch.randn(10, 3)).shape
        torch.Size([10, 512])
    """

    has_lengthscale = True
    rbf_limit = True

    def __init__(self, num_dims: int, num_samples: int, *, seed: int | None = None, **kwargs):
        super().__init__(num_dims, num_samples, **kwargs)
        self.seed = resolve_seed(seed)
        shape = (*self.batch_shape, num_samples, num_dims)
        self.register_buffer("weights", _standard_normal(shape, self.seed, self.raw_outputscale.dtype))

    def _draw_buffers(self, seed: int) -> dict[str, Tensor]:
        shape = (*self.batch_shape, self.num_samples, self.num_dims)
        return {"weights": _standard_normal(shape, seed, self.weights.dtype).to(self.weights)}

    def projection(self, x: Tensor) -> Tensor:
        return self.scale_inputs(x) @ self.weights.transpose(-1, -2)


class SSGPRKernel(FeatureKernel):
    r"""Sparse spectrum GP kernel (Lázaro-Gredilla et al. 2010): every frequency is learned.

    .. math::
        \varphi(x) = \frac{\sigma_f}{\sqrt M}[\cos(\Omega x), \sin(\Omega x)],
        \qquad \Omega \in \mathbb{R}^{M\times d}\ \text{free}

    ``frequencies`` (M×d, a parameter) start at :math:`\varepsilon / \ell_0`
    with :math:`\varepsilon \sim N(0, I)`, i.e. at an RBF/ARD kernel of
    lengthscale ``lengthscale`` (a float or d values).  There is no separate
    lengthscale parameter: it would be redundant with the frequencies.

    Args:
        num_dims: input dimension ``d``.
        num_samples: number of frequencies ``M`` (``D = 2M`` features).
        lengthscale: the initial ``ℓ_0``, a float or ``d`` values.
        seed: seed of the initial ``ε``; ``None`` draws one from torch's RNG.
        **kwargs: as for :class:`~alacarte.FeatureKernel` (``batch_shape``, ``outputscale_prior``
            …); there is no lengthscale, so no ``simplex`` either.

    Example:
        >>> from alacarte import SSGPRKernel
        >>> kernel = SSGPRKernel(num_dims=3, num_samples=64, lengthscale=0.5, seed=0)
        >>> kernel.frequencies.shape
        torch.Size([64, 3])
    """

    has_lengthscale = False
    per_frequency_parameters = ("frequencies",)

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        lengthscale: float | Tensor = 1.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(num_dims, num_samples, **kwargs)
        self.seed = resolve_seed(seed)
        dtype = self.raw_outputscale.dtype
        lengthscale = torch.as_tensor(lengthscale, dtype=dtype)
        # Finite as well as positive: ∞ makes every frequency 0 (a constant kernel), and a lengthscale whose
        # inverse overflows the dtype (1e-40 in float32) makes them ±∞ (NaN features).
        if (not bool((torch.isfinite(lengthscale) & (lengthscale > 0)).all())
                or not bool(torch.isfinite(1.0 / lengthscale).all()) or lengthscale.numel() not in (1, num_dims)):
            raise ValueError(f"lengthscale must be positive and finite (its inverse too), one value or {num_dims}; "
                             f"got {lengthscale}")
        eps = _standard_normal((*self.batch_shape, num_samples, num_dims), self.seed, dtype)
        self.register_parameter("frequencies", torch.nn.Parameter(eps / lengthscale.reshape(-1)))

    def projection(self, x: Tensor) -> Tensor:
        return x @ self.frequencies.transpose(-1, -2)

    @property
    def relevance(self) -> Tensor:
        """Root-mean-square frequency per input, normalised to sum to one; shape ``(*batch, d)``."""
        return self._normalise(self.frequencies.detach().pow(2).mean(-2).sqrt())
