"""The base class of every explicit-feature kernel."""
from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from gpytorch.priors import Prior
from linear_operator.operators import LowRankRootLinearOperator, MatmulLinearOperator
from torch import Tensor

from .._validation import check_positive_int, check_seed
from ..features.fourier import fourier_features
from ..ops.simplex import project_to_simplex
from ._params import ConstrainedParameter, checked_value, log_positive, register_constrained_parameter, shaped_like

__all__ = ["FeatureKernel", "MixtureFeatureKernel"]


# What GPyTorch's Kernel.__init__ reads from its keywords; it takes any others (**kwargs) and drops them.
_KERNEL_OPTIONS = frozenset(inspect.signature(Kernel.__init__).parameters) - {"self", "kwargs"}


def resolve_seed(seed: int | None) -> int:
    """A given seed, or one drawn from torch's global generator (so that
    ``torch.manual_seed`` governs kernels created without one)."""
    if seed is None:
        return int(torch.randint(0, 2**62, (1,)).item())
    return check_seed(seed)


def _safe_sqrt(variance: Tensor) -> Tensor:
    """√variance with a finite gradient where the variance underflowed to 0 (a softplus of a very
    negative raw value): there √ has an infinite slope, and ∞ · 0 would make the raw gradient NaN."""
    return variance.clamp_min(torch.finfo(variance.dtype).tiny).sqrt()


def _feature_weight(variance: Tensor, count: int) -> Tensor:
    """√(variance / count), the weight of each of ``count`` features sharing ``variance``, computed in at
    least float32: in float16 variance/count is subnormal for ordinary settings (0.1/4096 = 2.4e-5 < 6.1e-5,
    the smallest normal), where the clamp would replace it (k(x, x) would come out 0.25 for σ_f² = 0.1).
    Float32 and float64 weights are √(variance/count) in their own dtype."""
    wide = torch.promote_types(variance.dtype, torch.float32)
    return _safe_sqrt(variance.to(wide) / count).to(variance.dtype)


class FeatureKernel(Kernel):
    r"""A stationary kernel given by an explicit random Fourier feature map.

    .. math::
        k(x, x') \approx \varphi(x)^\top \varphi(x'),\qquad
        \varphi(x) = \frac{\sigma_f}{\sqrt{M}}\,[\cos(\Omega x), \sin(\Omega x)]
        \in \mathbb{R}^{2M}

    The signal variance :math:`\sigma_f^2` (``outputscale``) lives **inside** the
    features, so ``k(x, x) = σ_f²`` exactly and the Woodbury likelihood needs
    nothing but :math:`\Phi`.  Do not wrap these kernels in a ``ScaleKernel``.

    Subclasses implement :meth:`projection` (the n×M matrix :math:`X\Omega^\top`),
    applying lengthscales through :meth:`~alacarte.FeatureKernel.scale_inputs`, and may override
    :meth:`feature_scale` and :meth:`prior_variance`.

    **Simplex ARD** (``simplex=True``, kernels with lengthscales; SRFF,
    Gregorová et al. 2018): the inverse lengthscales are
    :math:`\gamma = c\,\pi` with :math:`\pi` on the probability simplex
    (``simplex_weights``, exact zeros allowed: the input is multiplied by
    :math:`\gamma`, so a zero switches the variable off) and :math:`c > 0` the
    simplex size (``simplex_size``; learnable, or fixed with
    ``learn_simplex_size=False``).  :meth:`project_` puts :math:`\pi` back on the
    simplex; :func:`alacarte.fit` takes projected-gradient steps on it.
    ``kernel.lengthscale`` reads :math:`1/\gamma` (∞ for dropped inputs) and
    setting it sets :math:`c = \sum_j 1/\ell_j` (if learnable) and
    :math:`\pi \propto 1/\ell`.  :attr:`relevance` and :meth:`selected` report
    the variables in use.

    ``forward(x1, x2)`` returns a ``LowRankRootLinearOperator`` of the features
    when ``x1`` equals ``x2`` (the same tensor, or equal values to which no gradient
    flows: a distinct copy that requires grad gets its own gradient), a
    ``MatmulLinearOperator`` of the two feature matrices otherwise, and ``k(x, x)``
    without computing features for ``diag=True`` on equal inputs.

    Args:
        num_dims: input dimension ``d`` (the random state depends on it).
        num_samples: number of frequencies ``M``; there are ``D = 2M`` features.
        outputscale_prior, outputscale_constraint: for :math:`\sigma_f^2`.
        simplex: constrain the ARD inverse lengthscales to ``c·π``, π on the simplex
            (needs ``ard_num_dims=num_dims``).
        simplex_size: initial (or fixed) ``c``; default ``num_dims`` (unit lengthscales).
        learn_simplex_size: learn ``c`` (default) or keep it fixed.
        **kwargs: passed to :class:`gpytorch.kernels.Kernel` (``ard_num_dims``,
            ``batch_shape``, ``lengthscale_prior`` …; ``active_dims`` in GPyTorch's
            models — :class:`~alacarte.FeatureGP` refuses it, select the columns instead).

    Example:
        >>> import torch
        >>> from alacarte import FSARDKernel
        >>> kernel = FSARDKernel(num_dims=2, num_samples=64, seed=0)   # a FeatureKernel
        >>> kernel.outputscale = 2.0
        >>> x = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
        >>> phi = kernel.features(x)                  # (n, 2M)
        >>> phi.shape, torch.allclose(kernel(x).to_dense(), phi @ phi.T)
        (torch.Size([5, 128]), True)
        >>> torch.allclose((phi**2).sum(-1), torch.full((5,), 2.0))   # k(x, x) = σ_f² exactly
        True
    """

    outputscale = ConstrainedParameter()
    simplex_size = ConstrainedParameter()
    # Kernels whose spectrum carries its own mass (mixture weights) set this False.
    has_outputscale = True
    #: Whether the features' expectation over draws is the RBF/ARD kernel σ_f² exp(−½‖γ ⊙ (x − x′)‖²)
    #: (fixed random state, Gaussian frequencies): the kernel :func:`~alacarte.selection.select_inputs`
    #: can then ask in closed form.
    rbf_limit = False
    #: Learned parameters with one entry per frequency: the kernel cannot change its number of them.
    per_frequency_parameters: tuple[str, ...] = ()
    #: Learned parameters by which the kernel extends a nested one with the same draw (FSGBARD's blocks
    #: over FSARD): :func:`alacarte.fit`'s restarts hold them at their values, the final optimisation frees them.
    nested_parameters: tuple[str, ...] = ()
    # φ(x)ᵀφ(x') = Σ_i w_i cos(ω_iᵀ(x − x')) for every draw.  GPyTorch's default is has_lengthscale, which
    # called GM, SSGPR and simplex kernels non-stationary (GridKernel, for one, refuses those).
    is_stationary = True

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        outputscale_prior: Prior | None = None,
        outputscale_constraint: Interval | None = None,
        simplex: bool = False,
        simplex_size: float | None = None,
        learn_simplex_size: bool = True,
        **kwargs,
    ):
        # Stored as Python ints: a numpy integer (what a grid search passes) would not survive save_model.
        num_dims = check_positive_int(num_dims, "num_dims")
        num_samples = check_positive_int(num_samples, "num_samples (M, the number of frequencies)")
        unknown = sorted(set(kwargs) - _KERNEL_OPTIONS)
        if unknown:  # a misspelt prior would leave the fit unregularised without a word
            raise ValueError(f"{type(self).__name__} got unexpected keyword arguments {unknown}")
        ard_num_dims = kwargs.get("ard_num_dims")
        if ard_num_dims is not None:  # a Python int too: a fit checkpoint's fingerprint hashes it as it is stored
            ard_num_dims = kwargs["ard_num_dims"] = check_positive_int(ard_num_dims, "ard_num_dims")
            # GPyTorch reads ard_num_dims as the input width: its Kernel.__call__ refuses (RuntimeError, debug
            # mode, on by default) inputs of any other width, so ard_num_dims=1 for d > 1 fails at every call.
            if ard_num_dims != num_dims:
                raise ValueError(f"ard_num_dims must be num_dims={num_dims} (a lengthscale per input) or None "
                                 f"(one shared lengthscale), got {ard_num_dims}")
        if not type(self).has_lengthscale:  # GPyTorch's Kernel would drop them without a word
            for key in ("lengthscale_prior", "lengthscale_constraint"):
                if kwargs.get(key) is not None:
                    raise ValueError(f"{type(self).__name__} has no lengthscale: {key} would be ignored")
        self.simplex = bool(simplex)
        if self.simplex:
            self._check_simplex_options(num_dims, ard_num_dims, simplex_size, kwargs)
            self.has_lengthscale = False  # γ = c·π replaces GPyTorch's raw_lengthscale
        elif simplex_size is not None or not learn_simplex_size:
            raise ValueError("simplex_size and learn_simplex_size apply only with simplex=True")
        if type(self).has_lengthscale and not self.simplex and kwargs.get("lengthscale_constraint") is None:
            kwargs["lengthscale_constraint"] = log_positive()
        super().__init__(**kwargs)
        # GPyTorch's __call__ hands forward only the active columns: any other count fails at every call,
        # with an error about the selected width (2) where the caller passed, say, 6 columns.
        if self.active_dims is not None and self.active_dims.numel() != num_dims:
            raise ValueError(f"active_dims selects {self.active_dims.numel()} inputs "
                             f"({self.active_dims.tolist()}), but num_dims={num_dims}")
        self.num_dims = num_dims
        self.num_samples = num_samples
        if self.simplex:
            batch = self.batch_shape
            self.register_parameter(
                "simplex_weights", torch.nn.Parameter(torch.full((*batch, 1, num_dims), 1.0 / num_dims))
            )
            size = float(num_dims if simplex_size is None else simplex_size)
            register_constrained_parameter(self, "simplex_size", torch.full((*batch, 1, 1), size), Positive())
            self.raw_simplex_size.requires_grad_(bool(learn_simplex_size))
            # Inputs allowed a non-zero π: the projected-gradient step holds the others at exactly 0
            # (:meth:`drop_inputs_`). Not saved: the zeros of π are, and they are what a prediction uses.
            self.register_buffer("simplex_mask", torch.ones(*batch, 1, num_dims, dtype=torch.bool), persistent=False)
        if self.has_outputscale:
            register_constrained_parameter(
                self,
                "outputscale",
                torch.ones(self.batch_shape),
                outputscale_constraint or Positive(),
                outputscale_prior,
            )
        elif outputscale_prior is not None or outputscale_constraint is not None:
            raise ValueError(f"{type(self).__name__} has no outputscale: its mixture weights carry the signal variance")

    def _check_simplex_options(self, num_dims: int, ard_num_dims, simplex_size, kwargs) -> None:
        if not type(self).has_lengthscale:
            raise ValueError(f"simplex=True needs ARD lengthscales, which {type(self).__name__} does not have")
        if ard_num_dims != num_dims:
            raise ValueError(f"simplex=True needs ard_num_dims=num_dims={num_dims}, got {ard_num_dims}")
        for key in ("lengthscale_prior", "lengthscale_constraint"):
            if kwargs.get(key) is not None:
                raise ValueError(f"{key} does not apply with simplex=True (γ = c·π replaces the lengthscales)")
        if simplex_size is not None and not (float(simplex_size) > 0 and math.isfinite(float(simplex_size))):
            raise ValueError(f"simplex_size must be positive and finite, got {simplex_size!r}")

    @property
    def num_features(self) -> int:
        """D = 2M, the length of φ(x)."""
        return 2 * self.num_samples

    def extra_repr(self) -> str:
        return f"num_dims={self.num_dims}, num_samples={self.num_samples}"

    def __getitem__(self, index) -> FeatureKernel:
        # GPyTorch's Kernel.__getitem__ applies the index to every parameter and buffer as it stands, so an index
        # longer than batch_shape reaches their trailing dimensions: the mixture kernels' component dimension
        # (GM of batch_shape (2,) indexed [:, 1] would take component 1 of each batch).  GPyTorch's
        # LazyEvaluatedKernelTensor indexes the kernel with its output's batch index, longer where the inputs
        # have more batch dimensions, and on an IndexError expands the kernel to that batch shape first.
        index = index if isinstance(index, tuple) else (index,)
        if len(self.batch_shape) and len(index) > len(self.batch_shape):
            raise IndexError(f"{len(index)} indices for a kernel of batch_shape {tuple(self.batch_shape)}")
        return self._keeping_active_dims(super().__getitem__, index)

    def expand_batch(self, *sizes) -> FeatureKernel:
        return self._keeping_active_dims(super().expand_batch, *sizes)

    def _keeping_active_dims(self, method, *args) -> FeatureKernel:
        # GPyTorch's __getitem__ and expand_batch index or expand every buffer, and active_dims is one: [1] of a
        # kernel with active_dims [4, 0, 2] would keep column 0 alone (expand_batch would make it a matrix).
        active_dims = self.active_dims
        self.active_dims = None
        try:
            kernel = method(*args)
        finally:
            self.active_dims = active_dims
        kernel.active_dims = active_dims
        return kernel

    # -- the random draw -----------------------------------------------------------------
    def _draw_buffers(self, seed: int) -> dict[str, Tensor]:
        """The random buffers (not learned parameters) that a draw from ``seed`` gives."""
        raise ValueError(f"{type(self).__name__} has no random draw apart from its learned parameters")

    @property
    def redrawable(self) -> bool:
        """Whether :meth:`redrawn` can draw fresh random features: not where the random state is learned."""
        try:
            self._draw_buffers(0)
        except ValueError:
            return False
        return True

    @contextmanager
    def redrawn(self, seed: int) -> Iterator["FeatureKernel"]:
        """Within the block, the kernel's random buffers (its directions and fixed radii) as a
        kernel built with ``seed`` draws them; every learned parameter is kept, and the buffers
        are put back after the block.

        A hyperparameter fitted on one finite draw can fit that draw's chance features; on a
        fresh draw only what the kernel itself gains remains
        (:func:`alacarte.selection.select_inputs`'s ``draws``).

        Raises:
            ValueError: for a kernel whose random state is learned (FSGBARD's blocks, SSGPR's
                frequencies) or a seed outside [0, 2⁶⁴).

        Example:
            >>> import torch
            >>> from alacarte import FSARDKernel
            >>> kernel, x = FSARDKernel(3, 64, seed=0), torch.randn(5, 3)
            >>> with kernel.redrawn(1):
            ...     phi = kernel.features(x)    # the directions of seed 1, kernel's radii
        """
        saved = self._buffers_drawn(seed)
        try:
            yield self
        finally:
            with torch.no_grad():
                for name, value in saved.items():
                    getattr(self, name).copy_(value)

    def widened(self, num_samples: int, seed: int | None = None) -> "FeatureKernel":
        """A copy with ``num_samples`` frequencies (D = 2·``num_samples``) drawn from ``seed`` (default:
        the kernel's), every learned parameter kept: the same kernel, approximated by more (or fewer)
        features; an exact copy at its own ``num_samples`` and seed (:func:`alacarte.fit_pilot`).

        Raises:
            ValueError: for a kernel that learns a value per frequency (FSARD, FSGBARD, SSGPR), ``num_samples``
                not a positive integer (a multiple of ``num_components`` for a mixture), or a bad seed.

        Example:
            >>> from alacarte import SpectralMixtureFastfoodKernel
            >>> kernel = SpectralMixtureFastfoodKernel(num_dims=3, num_samples=64, seed=0)
            >>> kernel.widened(1024).num_features, kernel.num_features
            (2048, 128)
        """
        if self.per_frequency_parameters:
            names = ", ".join(self.per_frequency_parameters)
            raise ValueError(f"{type(self).__name__} learns a value per frequency ({names}): another number "
                             "of frequencies would not be the same kernel")
        num_samples = check_positive_int(num_samples, "num_samples (M, the number of frequencies)")
        components = getattr(self, "num_components", 1)
        if num_samples % components:
            raise ValueError(f"num_samples={num_samples} must be a multiple of num_components={components}")
        seed = self.seed if seed is None else check_seed(seed)
        kernel = copy.deepcopy(self)
        kernel.num_samples, kernel.seed = num_samples, seed
        for name, value in kernel._draw_buffers(seed).items():
            setattr(kernel, name, value)  # a buffer of the new size, not copied into the old one
        return kernel

    def redraw_(self, seed: int) -> "FeatureKernel":
        """Replace the kernel's random buffers (its directions and fixed radii) by those a kernel
        built with ``seed`` draws, for good, and record ``seed`` as its seed; every learned
        parameter is kept.  Returns the kernel.

        Raises:
            ValueError: as :meth:`redrawn`.
        """
        self._buffers_drawn(seed)
        self.seed = seed
        return self

    def _buffers_drawn(self, seed: int) -> dict[str, Tensor]:
        """Copy the draw of ``seed`` into the random buffers; returns their values before."""
        if seed is None:
            raise ValueError("a re-draw needs an integer seed")
        fresh = self._draw_buffers(check_seed(seed))
        before = {name: getattr(self, name).clone() for name in fresh}
        with torch.no_grad():
            for name, value in fresh.items():
                getattr(self, name).copy_(value)
        return before

    # -- lengthscales, plain or on the simplex ------------------------------------------
    @property
    def lengthscale(self) -> Tensor | None:
        if self.simplex:
            return 1.0 / self.inverse_lengthscale()
        return super().lengthscale

    @lengthscale.setter
    def lengthscale(self, value) -> None:
        if not self.simplex and not self.has_lengthscale:  # else an AttributeError on raw_lengthscale_constraint
            raise ValueError(f"{type(self).__name__} has no lengthscale")
        if not self.simplex:
            self._set_lengthscale(checked_value("lengthscale", value, self.raw_lengthscale_constraint,
                                                self.raw_lengthscale))
            return
        ref = self.simplex_weights
        gamma = 1.0 / torch.as_tensor(value, dtype=ref.dtype, device=ref.device)
        if gamma.dim() >= 2 and gamma.shape[-2] != 1:  # per-batch lengthscales (*batch, d)
            gamma = gamma.unsqueeze(-2)
        gamma = shaped_like("lengthscale", gamma, ref)
        if not bool(torch.isfinite(gamma).all()) or not bool((gamma >= 0).all()) or not bool((gamma.sum(-1) > 0).all()):
            raise ValueError("lengthscales must be positive (∞ allowed for dropped inputs, not all of them)")
        self._set_simplex_gamma(gamma)

    @torch.no_grad()
    def _set_simplex_gamma(self, gamma: Tensor) -> None:
        """π = γ/Σγ and, where c is learnable, c = Σγ (with c fixed only γ's direction is kept).
        ``gamma``: ``(*batch, 1, d)``, non-negative, not all 0 (unchecked)."""
        total = gamma.sum(-1, keepdim=True)
        self.simplex_weights.copy_(gamma / total)
        if self.raw_simplex_size.requires_grad:
            self.simplex_size = total.reshape(self.simplex_size.shape)

    def inverse_lengthscale(self) -> Tensor:
        """γ = 1/ℓ, shape ``(*batch, 1, d)`` (or ``(*batch, 1, 1)`` isotropic); c·π for simplex kernels."""
        if self.simplex:
            return self.simplex_size * self.simplex_weights
        return 1.0 / self.lengthscale

    def scale_inputs(self, x: Tensor) -> Tensor:
        """The lengthscale-scaled input γ ⊙ x (= x / ℓ) every projection starts from.

        Simplex kernels multiply by γ so that γ_j = 0 removes input j exactly."""
        if self.simplex:
            return x * self.inverse_lengthscale()
        return x / self.lengthscale

    @torch.no_grad()
    def project_(self) -> None:
        """Put π back on the probability simplex (exact Euclidean projection); no-op without ``simplex``."""
        if self.simplex:
            self.simplex_weights.copy_(project_to_simplex(self.simplex_weights))

    @torch.no_grad()
    def drop_inputs_(self, inputs: Sequence[int] | Tensor) -> None:
        """Set π of ``inputs`` (indices) to exactly 0 and hold it there in later fits (:attr:`simplex_mask`).

        The other inputs keep their inverse lengthscales γ where the simplex size c is learnable
        (π renormalised, c shrunk by the dropped share); with c fixed, π is renormalised on c.

        Raises:
            ValueError: without ``simplex=True`` or batch shape, for an index outside ``[0, num_dims)``,
                or when no input would be left.
        """
        if not self.simplex or len(self.batch_shape):
            raise ValueError("drop_inputs_ needs a simplex kernel (simplex=True) without batch_shape")
        index = torch.as_tensor(inputs, dtype=torch.long).reshape(-1)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.num_dims):
            raise ValueError(f"inputs must lie in [0, {self.num_dims}), got {index.tolist()}")
        mask = self.simplex_mask.clone()
        mask[..., index] = False
        pi = self.simplex_weights.detach().clone()
        pi[~mask.to(pi.device)] = 0
        kept = float(pi.sum())
        if not bool(mask.any()) or kept <= 0:
            raise ValueError("drop_inputs_ would leave no input with a non-zero weight")
        self.simplex_mask.copy_(mask)
        self.simplex_weights.copy_(pi / kept)
        if self.raw_simplex_size.requires_grad:
            self.simplex_size = self.simplex_size * kept

    @property
    def relevance(self) -> Tensor:
        """Relative importance of each input, shape ``(*batch, d)``, non-negative, summing to one.

        π for simplex kernels (exact zeros: inputs not used); normalised inverse
        lengthscales otherwise (uniform for isotropic kernels)."""
        if self.simplex:
            return self.simplex_weights.detach().squeeze(-2).clone()
        if not self.has_lengthscale:
            raise ValueError(f"no relevance is defined for {type(self).__name__}")
        return self._normalise(self.inverse_lengthscale().detach().squeeze(-2))

    def _normalise(self, raw: Tensor) -> Tensor:
        raw = raw.expand(*raw.shape[:-1], self.num_dims)
        return raw / raw.sum(-1, keepdim=True)

    def selected(self, threshold: float | None = None) -> Tensor:
        """Indices of the inputs whose :attr:`relevance` exceeds ``threshold``; by default ε of the
        kernel's dtype, which leaves out exact zeros and weights that are round-off (a float32 fit's
        projections leave ~6e-9 on inputs a float64 fit sets to exactly 0); 0: every input in use.

        Example:
            >>> import torch
            >>> from alacarte import FSARDKernel
            >>> kernel = FSARDKernel(3, 64, ard_num_dims=3, simplex=True)
            >>> kernel.simplex_weights.data = torch.tensor([[0.7, 0.0, 0.3]])
            >>> kernel.selected()
            tensor([0, 2])
        """
        if len(self.batch_shape):
            raise ValueError("selected() supports kernels without batch_shape")
        relevance = self.relevance
        if threshold is None:
            threshold = torch.finfo(relevance.dtype).eps
        return torch.nonzero(relevance > threshold).squeeze(-1)

    def projection(self, x: Tensor) -> Tensor:
        """ωᵢᵀx for all frequencies: (..., n, d) → (..., n, M)."""
        raise NotImplementedError

    def feature_scale(self) -> Tensor:
        """Weight of each cos/sin pair, broadcastable to ``(*batch, 1, M)``."""
        return _feature_weight(self.outputscale, self.num_samples).view(*self.batch_shape, 1, 1)

    def prior_variance(self) -> Tensor:
        """k(x, x) = ‖φ(x)‖², identical for every x; shape ``(*batch,)``."""
        return self.outputscale

    def features(self, x: Tensor) -> Tensor:
        """The feature matrix Φ, (..., n, d) → (..., n, 2M); of the ``active_dims`` columns of x where the
        kernel has them, as ``kernel(x)`` is (GPyTorch selects them before :meth:`forward`).

        Raises:
            ValueError: if ``x`` has another number of columns (too few for ``active_dims``) or
                dtype than the kernel, or a batch shape that does not broadcast with the kernel's.
        """
        if self.active_dims is not None:
            # (index_select said only 'INDICES element is out of DATA bounds')
            if x.shape[-1] <= int(self.active_dims.max()):
                raise ValueError(f"{type(self).__name__} reads columns {self.active_dims.tolist()} (active_dims), "
                                 f"but x has {x.shape[-1]}")
            x = x.index_select(-1, self.active_dims)
        return self._features(x)

    def _features(self, x: Tensor) -> Tensor:
        scale = self.feature_scale()
        self._check_inputs(x, scale.dtype)
        return fourier_features(self.projection(x), scale)

    def _check_inputs(self, x: Tensor, dtype: torch.dtype) -> torch.Size:
        """A ValueError for inputs of the wrong width, dtype or batch shape; else the broadcast batch shape."""
        if x.shape[-1] != self.num_dims:
            raise ValueError(f"{type(self).__name__} was built for {self.num_dims} input dimensions, got {x.shape[-1]}")
        if x.dtype != dtype:
            raise ValueError(f"the inputs are {x.dtype} and the kernel {dtype}: convert one "
                             "(e.g. kernel.double() or x.to(torch.float32))")
        return self._batch_with(x)

    def _batch_with(self, x: Tensor) -> torch.Size:
        """The batch shape of inputs ``x`` broadcast with the kernel's; a ValueError where they do not."""
        try:
            return torch.broadcast_shapes(x.shape[:-2], self.batch_shape)
        except RuntimeError:
            raise ValueError(f"inputs of batch shape {tuple(x.shape[:-2])} do not broadcast with the kernel's "
                             f"batch_shape {tuple(self.batch_shape)}") from None

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False,
                **params) -> Tensor | LowRankRootLinearOperator | MatmulLinearOperator:
        if last_dim_is_batch:
            # Users meet this through GPyTorch's wrappers, which pass the flag themselves: say which.
            raise ValueError(f"{type(self).__name__} does not support last_dim_is_batch (deprecated in GPyTorch; "
                             "a kernel per input column), so GPyTorch's GridKernel, GridInterpolationKernel, "
                             "AdditiveStructureKernel and ProductStructureKernel, which ask for it, cannot wrap it: "
                             "its features map all inputs together")
        # Equal values count as the same input only when no gradient flows to them: the shortcut
        # would give x2 no gradient and x1 the symmetric one (doubled for a constant x2).
        tracked = torch.is_grad_enabled() and (x1.requires_grad or x2.requires_grad)
        same = x1 is x2 or (not tracked and x1.shape == x2.shape and torch.equal(x1, x2))
        if diag and same:
            # The same checks as features(): this shortcut never builds features to refuse a wrong width or dtype.
            variance = self.prior_variance()
            batch = self._check_inputs(x1, variance.dtype)
            return variance.view(*self.batch_shape, 1).expand(*batch, x1.shape[-2])
        z1 = self._features(x1)  # the active columns already
        z2 = z1 if same else self._features(x2)
        if diag:
            return (z1 * z2).sum(-1)
        if same:
            return LowRankRootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.transpose(-1, -2))


class MixtureFeatureKernel(FeatureKernel):
    r"""A feature kernel whose spectrum is a mixture of ``C`` components.

    Component ``c`` owns ``M_c = M / C`` frequencies and a weight
    :math:`w_c > 0`; its features carry :math:`\sqrt{w_c / M_c}`, so
    ``k(x, x) = Σ w_c`` and there is no separate ``outputscale``.  Random state
    of the components lives in buffers with batch shape ``(*batch_shape, C)``.

    Args:
        num_dims: input dimension ``d``.
        num_samples: total number of frequencies ``M``, a multiple of ``num_components``.
        num_components: the number of components ``C``.
        weights_prior, weights_constraint: for the weights :math:`w_c` (default constraint:
            positive; initial value ``1/C`` each).
        **kwargs: as for :class:`~alacarte.FeatureKernel`, except ``outputscale_prior`` and
            ``outputscale_constraint`` (there is no outputscale).
    """

    has_outputscale = False
    weights = ConstrainedParameter()

    def __init__(
        self,
        num_dims: int,
        num_samples: int,
        *,
        num_components: int,
        weights_prior: Prior | None = None,
        weights_constraint: Interval | None = None,
        **kwargs,
    ):
        num_components = check_positive_int(num_components, "num_components")
        num_samples = check_positive_int(num_samples, "num_samples (M, the number of frequencies)")
        if num_samples % num_components:
            raise ValueError(
                f"num_samples={num_samples} must be a multiple of num_components={num_components} "
                "(every component has M/C frequencies)"
            )
        super().__init__(num_dims, num_samples, **kwargs)
        self.num_components = num_components
        register_constrained_parameter(
            self,
            "weights",
            torch.full(self.component_shape, 1.0 / num_components),
            weights_constraint or Positive(),
            weights_prior,
        )

    @property
    def component_shape(self) -> torch.Size:
        return torch.Size([*self.batch_shape, self.num_components])

    @property
    def samples_per_component(self) -> int:
        return self.num_samples // self.num_components

    def join_components(self, proj: Tensor) -> Tensor:
        """(..., C, n, M_c) per-component projections → (..., n, M), component-major."""
        return proj.movedim(-3, -2).reshape(*proj.shape[:-3], proj.shape[-2], self.num_samples)

    def feature_scale(self) -> Tensor:
        per_frequency = _feature_weight(self.weights, self.samples_per_component)
        per_frequency = per_frequency.unsqueeze(-1).expand(*per_frequency.shape, self.samples_per_component)
        return per_frequency.reshape(*self.batch_shape, 1, self.num_samples)

    def prior_variance(self) -> Tensor:
        return self.weights.sum(-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_components={self.num_components}"
