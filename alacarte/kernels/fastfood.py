"""Fastfood kernels: fixed RBF/ARD, FSARD and FSGBARD (docs/mathematics.md §2–3)."""
from __future__ import annotations

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.priors import Prior
from torch import Tensor

from ..features.fastfood import draw_fastfood_state, fastfood_project
from ._params import ConstrainedParameter, register_constrained_parameter
from ..features.fastfood import choose_strategy
from .base import FeatureKernel, MixtureFeatureKernel, resolve_seed

__all__ = ["FastfoodRBFKernel", "FSARDKernel", "FSGBARDKernel", "FastfoodMixtureKernel", "register_fastfood_state",
           "draw_fastfood_buffers"]

STRATEGIES = ("auto", "dense", "fwht")


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def register_fastfood_state(
    module: torch.nn.Module,
    num_dims: int,
    num_samples: int,
    batch_shape: torch.Size | tuple[int, ...],
    seed: int,
    learn_blocks: bool = False,
) -> Tensor:
    """Draw Fastfood state from ``seed`` and register it on ``module``: ``perm``
    (buffer), ``sign`` and ``gauss`` (buffers, or parameters if ``learn_blocks``).

    Args:
        module: the module (a kernel) to register the state on.
        num_dims, num_samples, batch_shape, seed: as for
            :func:`~alacarte.features.fastfood.draw_fastfood_state`.
        learn_blocks: register ``sign`` and ``gauss`` as parameters (FSGBARD) rather than buffers.

    Returns:
        The χ_p radii, shape ``(*batch_shape, num_samples)``, for the caller to register as a
        buffer or a parameter.  They, ``sign`` and ``gauss`` are in torch's default dtype
        (see :func:`alacarte.factory.default_dtype`).
    """
    state = draw_fastfood_state(num_dims, num_samples, batch_shape, seed)
    dtype = torch.get_default_dtype()
    module.register_buffer("perm", torch.as_tensor(state.perm))
    for name, array in (("sign", state.sign), ("gauss", state.gauss)):
        tensor = torch.as_tensor(array, dtype=dtype)
        if learn_blocks:
            module.register_parameter(name, torch.nn.Parameter(tensor))
        else:
            module.register_buffer(name, tensor)
    return torch.as_tensor(state.radius, dtype=dtype)


def draw_fastfood_buffers(module: torch.nn.Module, num_samples: int, batch_shape: torch.Size, seed: int
                          ) -> dict[str, Tensor]:
    """The Fastfood buffers of ``module`` (``perm`` and, where not learned, ``sign``, ``gauss``,
    ``radius``) as :func:`register_fastfood_state` draws them from ``seed``, in their dtypes."""
    buffers = dict(module.named_buffers(recurse=False))
    if "gauss" not in buffers:
        raise ValueError(f"{type(module).__name__} learns its Fastfood blocks: they have no draw to re-draw")
    state = draw_fastfood_state(module.num_dims, num_samples, batch_shape, seed)
    arrays = {"perm": state.perm, "sign": state.sign, "gauss": state.gauss, "radius": state.radius}
    return {name: torch.as_tensor(a).to(buffers[name]) for name, a in arrays.items() if name in buffers}


class FastfoodRBFKernel(FeatureKernel):
    r"""RBF / ARD kernel approximated by a fixed Fastfood expansion.

    .. math::
        k(x, x') = \sigma_f^2 \exp\!\big(-\tfrac12 \|(x - x') / \ell\|^2\big)
        \approx \varphi(x)^\top\varphi(x'),\qquad
        \Omega = V\,\mathrm{diag}(1/\ell),\quad V_k = S_k H G_k \Pi_k H B_k

    with ``K = ceil(M/p)`` blocks of size ``p = 2^ceil(log2 d)``, signs
    :math:`B_k`, permutations :math:`\Pi_k`, Gaussian diagonals :math:`G_k` and
    radii :math:`s_i \sim \chi_p` (so every row of ``V`` is distributed like
    :math:`N(0, I)`), all drawn once from ``seed`` and stored as buffers.
    Learnable: ``lengthscale`` (one, or ``d`` with ``ard_num_dims=d``) and
    ``outputscale``.

    Args:
        num_dims: input dimension ``d``.
        num_samples: number of frequencies ``M`` (``D = 2M`` features).
        seed: seed of the random state; ``None`` draws one from torch's RNG.
        strategy: ``"fwht"`` (two transforms per block), ``"dense"`` (materialise
            the M×d frequency matrix, one GEMM) or ``"auto"`` (chosen by ``d``:
            :func:`~alacarte.features.fastfood.choose_strategy`); all give the same features to round-off.
        radius_prior, radius_constraint: for the learned radii of :class:`FSARDKernel` and
            :class:`FSGBARDKernel` (default constraint: positive); this kernel's radii are fixed,
            and it refuses them.
        **kwargs: as for :class:`~alacarte.FeatureKernel` (``ard_num_dims``, ``batch_shape``,
            ``outputscale_prior``, ``simplex`` …).

    Example:
        >>> import torch
        >>> from alacarte import FastfoodRBFKernel
        >>> kernel = FastfoodRBFKernel(num_dims=8, num_samples=1024, ard_num_dims=8, seed=0)
        >>> x = torch.randn(100, 8)
        >>> kernel(x).to_dense().shape
        torch.Size([100, 100])
    """

    has_lengthscale = True
    rbf_limit = True
    _learn_radius = False
    _learn_blocks = False

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        seed: int | None = None,
        strategy: str = "auto",
        radius_prior: Prior | None = None,
        radius_constraint: Interval | None = None,
        **kwargs,
    ):
        super().__init__(num_dims, num_samples, **kwargs)
        self.strategy = check_strategy(strategy)
        self.seed = resolve_seed(seed)
        radius = register_fastfood_state(self, num_dims, num_samples, self.batch_shape, self.seed, self._learn_blocks)
        if self._learn_radius:
            register_constrained_parameter(self, "radius", radius, radius_constraint or Positive(), radius_prior)
        else:
            if radius_prior is not None or radius_constraint is not None:
                raise ValueError(f"{type(self).__name__} has fixed radii; use FSARDKernel to learn them")
            self.register_buffer("radius", radius)

    def _draw_buffers(self, seed: int) -> dict[str, Tensor]:
        return draw_fastfood_buffers(self, self.num_samples, self.batch_shape, seed)

    def projection(self, x: Tensor) -> Tensor:
        return fastfood_project(self.scale_inputs(x), self.sign, self.perm, self.gauss, self.radius, self.strategy)


class FSARDKernel(FastfoodRBFKernel):
    r"""Fastfood ARD kernel with a learned radial spectrum (FSARD).

    As :class:`FastfoodRBFKernel`, but the ``M`` radii :math:`s_i` (initialised
    :math:`\chi_p`) are learnable positive parameters: the frequency directions
    stay random, their lengths — the radial spectral density — are learned.

    Example:
        >>> from alacarte import FSARDKernel
        >>> kernel = FSARDKernel(num_dims=8, num_samples=512, ard_num_dims=8, seed=0)
        >>> kernel.radius.shape
        torch.Size([512])
    """

    rbf_limit = False  # learned radii: the features' kernel is no longer the RBF
    _learn_radius = True
    per_frequency_parameters = ("radius",)
    radius = ConstrainedParameter()


class FSGBARDKernel(FSARDKernel):
    r"""FSARD plus learnable Fastfood diagonals ``G`` and ``B`` (FSGBARD).

    ``gauss`` (initialised :math:`N(0,1)`) and ``sign`` (initialised ±1, then
    real-valued) become parameters; ``S`` keeps normalising each row by
    :math:`\sqrt p\,\|g_k\|`, so at initialisation the kernel equals FSARD.
    :func:`alacarte.fit`'s restarts hold ``gauss`` and ``sign`` at their draw
    (:attr:`nested_parameters`): they choose among FSARD fits, and the final
    optimisation learns the blocks from the chosen one.

    Example:
        >>> from alacarte import FSGBARDKernel
        >>> kernel = FSGBARDKernel(num_dims=8, num_samples=512, ard_num_dims=8, seed=0)
        >>> sorted(n for n, _ in kernel.named_parameters())[:3]
        ['gauss', 'raw_lengthscale', 'raw_outputscale']
    """

    _learn_blocks = True
    per_frequency_parameters = ("radius", "gauss", "sign")
    # Restarts that also move the blocks settle where the lengthscales miss the inputs' structure
    # (parkinsons: 4 of 10 splits; docs/calibration.md).
    nested_parameters = ("gauss", "sign")


class FastfoodMixtureKernel(MixtureFeatureKernel):
    """A spectral mixture whose components each own a Fastfood block stack.

    Component state (``sign``, ``perm``, ``gauss`` and, with
    ``uses_chi_radius``, the χ_p ``radius``) has batch shape
    ``(*batch_shape, C)`` and ``M/C`` rows per component.

    Args:
        num_dims: input dimension ``d``.
        num_samples: total number of frequencies ``M`` (a multiple of ``num_components``).
        num_components: the number of components ``C``.
        seed: seed of the Fastfood state; ``None`` draws one from torch's RNG.
        strategy: ``"auto"``, ``"dense"`` or ``"fwht"`` (see :class:`~alacarte.FastfoodRBFKernel`).
        **kwargs: as for :class:`~alacarte.kernels.base.MixtureFeatureKernel`.
    """

    uses_chi_radius = True

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        num_components: int = 4,
        seed: int | None = None,
        strategy: str = "auto",
        **kwargs,
    ):
        super().__init__(num_dims, num_samples, num_components=num_components, **kwargs)
        self.strategy = check_strategy(strategy)
        self.seed = resolve_seed(seed)
        radius = register_fastfood_state(
            self, num_dims, self.samples_per_component, self.component_shape, self.seed
        )
        if self.uses_chi_radius:
            self.register_buffer("radius", radius)

    def _draw_buffers(self, seed: int) -> dict[str, Tensor]:
        return draw_fastfood_buffers(self, self.samples_per_component, self.component_shape, seed)

    def execution_strategy(self) -> str:
        """``"dense"`` or ``"fwht"``: the configured one, or ``choose_strategy``'s for this input size."""
        return choose_strategy(self.num_dims) if self.strategy == "auto" else self.strategy
