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

__all__ = ["PiecewiseLinearRadialKernel", "standard_hat_quantiles", "hat_quantiles", "initial_modes"]


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


def initial_modes(num_dims: int, num_components: int) -> Tensor:
    """Knots √p·(0.5 … 1.5), evenly spaced, p the padded dimension: an RBF kernel's χ_p radii
    concentrate near √p."""
    spread = torch.linspace(0.5, 1.5, num_components) if num_components > 1 else torch.ones(1)
    return math.sqrt(padded_dim(num_dims)) * spread


def _geometric_mean(values: Tensor) -> Tensor:
    return values.log().mean(-1, keepdim=True).exp()


class _ScalePinnedModes(ConstrainedParameter):
    """The hats' modes with their geometric mean held at the kernel's ``mode_scale`` buffer.

    The kernel depends on the modes and the lengthscales only through r/ℓ, so their common scale is
    not identified; left free, a fit can drift along it into small modes and lengthscales, where the
    softplus flattens every gradient.  Pinning the modes' geometric mean removes that direction and
    keeps the kernel family: ℓ carries the scale.  Setting the modes sets the pin to their mean.
    """

    def __get__(self, module, owner=None):
        if module is None:
            return self
        free = super().__get__(module, owner)
        return free * (module.mode_scale / _geometric_mean(free))

    def __set__(self, module, value) -> None:
        super().__set__(module, value)
        free = super().__get__(module)
        module.mode_scale.copy_(_geometric_mean(free.detach()))


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
    there is no separate ``outputscale``.  The modes' geometric mean stays where it was set (the
    constructor or ``fit``'s initialisation): a common scale of the modes and of ``ℓ`` is not
    identified by the data, and ``ℓ`` carries it.

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

    Initial state: modes at :func:`initial_modes`, evenly spread over ``[0.5, 1.5]·sqrt(p)``,
    ``β = 0.5``, ``π_c = 1/C``; ``fit``'s restarts start every restart there.

    Example:
        >>> from alacarte import PiecewiseLinearRadialKernel
        >>> kernel = PiecewiseLinearRadialKernel(num_dims=4, num_samples=512, num_components=4,
        ...                                      ard_num_dims=4, seed=0)
        >>> kernel.radii().shape
        torch.Size([4, 128])
    """

    has_lengthscale = True
    modes = _ScalePinnedModes()
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
        modes = initial_modes(num_dims, num_components).expand(batch)
        register_constrained_parameter(self, "modes", modes, modes_constraint or Positive(), modes_prior)
        self.register_buffer("mode_scale", _geometric_mean(modes))
        register_constrained_parameter(self, "width_ratios", torch.full(batch, 0.5), Interval(0.0, 1.0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a state saved without the pin: its modes as they were are the pin at their geometric mean
        key = prefix + "mode_scale"
        if key not in state_dict and prefix + "raw_modes" in state_dict:
            modes = self.raw_modes_constraint.transform(state_dict[prefix + "raw_modes"])
            state_dict[key] = _geometric_mean(modes)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
