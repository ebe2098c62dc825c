"""Piecewise-linear radial (PWL) kernel on Fastfood directions (docs/mathematics.md §3)."""
from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.priors import Prior
from torch import Tensor

from ..features.fastfood import fastfood_matrix, fastfood_project, padded_dim
from ._params import ConstrainedParameter, register_constrained_parameter
from .fastfood import FastfoodMixtureKernel

__all__ = ["PiecewiseLinearRadialKernel", "standard_hat_quantiles", "hat_quantiles"]


def standard_hat_quantiles(num: int, dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> Tensor:
    """Quantiles z_i = F⁻¹((i − ½)/num) of the hat density on [−1, 1] with mode 0.

    The hat's CDF is piecewise quadratic, so F⁻¹(u) = √(2u) − 1 for u ≤ ½ and
    1 − √(2(1 − u)) above.
    """
    u = (torch.arange(num, dtype=dtype, device=device) + 0.5) / num
    return torch.where(u <= 0.5, torch.sqrt(2 * u) - 1, 1 - torch.sqrt(2 * (1 - u)))


def hat_quantiles(mode: Tensor, half_width: Tensor, num: int) -> Tensor:
    """Equidistant quantiles of hats with ``mode`` a and ``half_width`` b: a + b·z_i.

    Shapes (...,) → (..., num); differentiable (linear) in a and b.
    """
    z = standard_hat_quantiles(num, mode.dtype, mode.device)
    return mode.unsqueeze(-1) + half_width.unsqueeze(-1) * z


class PiecewiseLinearRadialKernel(FastfoodMixtureKernel):
    r"""Radial kernel whose radial spectral density is a mixture of hat functions (PWL).

    .. math::
        k(\tau) = \sum_{c=1}^{C} \pi_c\, \mathbb{E}_{r\sim \mathrm{hat}_c}
        \big[\Omega_p(r \|\tau/\ell\|)\big],\qquad
        \Omega_p(t) = \Gamma(p/2)\,(2/t)^{p/2-1} J_{p/2-1}(t)

    Hat ``c`` has mode :math:`a_c > 0`, half-width :math:`b_c \in (0, a_c)`
    (parametrised as ``a_c·β_c`` with ``β_c ∈ (0, 1)``) and weight :math:`\pi_c > 0`.
    Its ``M_c = M / C`` frequencies are :math:`\omega = r\,u` with ``u`` the unit
    row directions of a Fastfood block (near-uniform on the sphere of the padded
    dimension ``p``) and radii at the equidistant quantiles
    :math:`r_i = F_c^{-1}((i-\tfrac12)/M_c)` — deterministic, and differentiable
    in :math:`a_c, b_c`.  ARD lengthscales ``ℓ`` scale the input.  ``k(x, x) = Σ π_c``;
    there is no separate ``outputscale``.

    Args:
        num_dims: input dimension ``d``.
        num_samples: total number of frequencies ``M`` (a multiple of ``num_components``).
        num_components: number of hats ``C``.
        seed: seed of the Fastfood directions.
        strategy: ``"auto"``, ``"dense"`` or ``"fwht"`` (see :class:`FastfoodRBFKernel`).
        modes_prior, modes_constraint: for the modes :math:`a_c` (default constraint: positive).
        weights_prior, weights_constraint: for the weights :math:`\pi_c`.
        **kwargs: as for :class:`~alacarte.FeatureKernel` (``ard_num_dims``, ``batch_shape``,
            ``simplex`` …); there is no outputscale: the weights carry σ_f².

    Initial state: modes spread over ``[0.5, 1.5]·sqrt(p)`` (an RBF kernel's χ_p
    radii concentrate near ``sqrt(p)``), ``β = 0.5``, ``π_c = 1/C``.

    Example:
        >>> from alacarte import PiecewiseLinearRadialKernel
        >>> kernel = PiecewiseLinearRadialKernel(num_dims=4, num_samples=512, num_components=4,
        ...                                      ard_num_dims=4, seed=0)
        >>> kernel.radii().shape
        torch.Size([4, 128])
    """

    has_lengthscale = True
    modes = ConstrainedParameter()
    width_ratios = ConstrainedParameter()

    uses_chi_radius = False  # radii come from the hats

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        num_components: int = 4,
        modes_prior: Prior | None = None,
        modes_constraint: Interval | None = None,
        **kwargs,
    ):
        super().__init__(num_dims, num_samples, num_components=num_components, **kwargs)
        batch = self.component_shape
        spread = torch.linspace(0.5, 1.5, num_components) if num_components > 1 else torch.ones(1)
        modes = (math.sqrt(padded_dim(num_dims)) * spread).expand(batch)
        register_constrained_parameter(self, "modes", modes, modes_constraint or Positive(), modes_prior)
        register_constrained_parameter(self, "width_ratios", torch.full(batch, 0.5), Interval(0.0, 1.0))

    @property
    def half_widths(self) -> Tensor:
        """b_c = a_c·β_c ∈ (0, a_c)."""
        return self.modes * self.width_ratios

    def radii(self) -> Tensor:
        """Quantile radii of every hat, shape ``(*batch, C, M_c)``."""
        return hat_quantiles(self.modes, self.half_widths, self.samples_per_component)

    def projection(self, x: Tensor) -> Tensor:
        x = self.scale_inputs(x)
        radii = self.radii()
        if self.execution_strategy() == "dense":
            omega = fastfood_matrix(self.sign, self.perm, self.gauss, radii, self.num_dims)  # (*b, C, Mc, d)
            return x @ omega.reshape(*self.batch_shape, self.num_samples, self.num_dims).transpose(-1, -2)
        proj = fastfood_project(x.unsqueeze(-3), self.sign, self.perm, self.gauss, radii, "fwht")  # (..., C, n, Mc)
        return self.join_components(proj)
