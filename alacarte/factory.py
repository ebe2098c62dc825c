"""One place that turns a kernel name (or a kernel object) into a model.

Used by :class:`~alacarte.AlaCarteRegressor`, the command line and the
benchmarks, so that ``"gm"`` means the same model everywhere.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from .kernels import (
    FastfoodRBFKernel,
    FeatureKernel,
    FSARDKernel,
    FSGBARDKernel,
    PiecewiseLinearRadialKernel,
    RandomFourierKernel,
    SpectralMixtureFastfoodKernel,
    SSGPRKernel,
)
from ._validation import check_positive_int, check_seed
from .models import ExactRBFGP, FeatureGP

__all__ = ["KERNEL_NAMES", "SIMPLEX_KERNEL_NAMES", "FEATURE_KERNEL_CLASSES", "EXACT_GP_ROWS", "AUTO_DRAWS",
           "AUTO_COMPONENTS", "AUTO_COMPONENT_ROWS", "DEFAULT_SAMPLES", "exact_gp_cost", "widenable", "make_model",
           "resolve_draws", "draws_for_features", "check_draws", "component_candidates", "check_simplex_name",
           "default_dtype", "floating_state"]

#: Rows beyond which an exact GP's n×n matrices and O(n³) steps, not the data, set the cost of a fit
#: (the command line says so before it starts one).
EXACT_GP_ROWS = 5_000


def exact_gp_cost(rows: int) -> str:
    """What an exact GP on ``rows`` rows costs, in a sentence a user reads before it starts."""
    gigabytes = 8 * rows**2 / 1e9
    return (f"an exact GP on {rows} rows holds {rows}×{rows} matrices ({gigabytes:.1f} GB each in float64) and "
            f"costs O(n³) per iteration; a feature kernel (e.g. fsard, gm) costs O(nD²)")

# The named feature kernels: name → (class, its keyword arguments for d inputs and num_components).
# The one list of them: model files may name these classes (alacarte._records) and no others.
_FEATURE_KERNELS: dict[str, tuple[type[FeatureKernel], Callable[[int, int], dict]]] = {
    "gm": (SpectralMixtureFastfoodKernel, lambda d, q: {"num_components": q}),
    "pwl": (PiecewiseLinearRadialKernel, lambda d, q: {"num_components": q, "ard_num_dims": d}),
    "fsard": (FSARDKernel, lambda d, q: {"ard_num_dims": d}),
    "fsgbard": (FSGBARDKernel, lambda d, q: {"ard_num_dims": d}),
    "fastfood-ard": (FastfoodRBFKernel, lambda d, q: {"ard_num_dims": d}),
    "fastfood-rbf": (FastfoodRBFKernel, lambda d, q: {}),
    "ssgpr": (SSGPRKernel, lambda d, q: {}),
    "rks": (RandomFourierKernel, lambda d, q: {"ard_num_dims": d}),
}
#: Kernel names understood by :func:`make_model`, the estimator and the command line.
KERNEL_NAMES = (*_FEATURE_KERNELS, "exact-ard", "exact-rbf")
#: The named kernels with one lengthscale per input, which ``simplex=True`` puts on the simplex (variable selection).
SIMPLEX_KERNEL_NAMES = tuple(name for name, (_, options) in _FEATURE_KERNELS.items() if "ard_num_dims" in options(1, 1))
#: The feature kernel classes the names build, each once.
FEATURE_KERNEL_CLASSES = tuple(dict.fromkeys(cls for cls, _ in _FEATURE_KERNELS.values()))
#: Frequencies M of a named feature kernel unless said otherwise (D = 1 024, the D the calibration was measured at).
DEFAULT_SAMPLES = 512


def widenable(kernel) -> bool:
    """Whether a kernel — a name or a :class:`~alacarte.FeatureKernel` — learns no value per frequency, so
    that :meth:`~alacarte.FeatureKernel.widened` can give it more features with the same hyperparameters."""
    if isinstance(kernel, FeatureKernel):
        return not kernel.per_frequency_parameters
    return kernel in _FEATURE_KERNELS and not _FEATURE_KERNELS[kernel][0].per_frequency_parameters


#: The fits ``num_draws="auto"`` averages for a feature GP with at most twice as many training rows as features.
AUTO_DRAWS = 5
#: The components ``num_components="auto"`` chooses between for ``"gm"`` and ``"pwl"``, the last when it does
#: not choose.  The components share the D features, and where n is large one wide component can beat
#: four narrow ones, or lose to them (docs/calibration.md).
AUTO_COMPONENTS = (1, 4)
#: The held-out rows from which ``num_components="auto"`` fits every :data:`AUTO_COMPONENTS` and keeps the
#: lower held-out score.  A mean NLPD over h rows has a standard error of about 1/√h nats: below a few
#: hundred rows it is the size of the differences between the fits, and the choice was right on 15 of 27
#: small-data splits, at 745 rows and more on every split measured.
AUTO_COMPONENT_ROWS = 400
_MIXTURE_KERNELS = ("gm", "pwl")


def resolve_draws(num_draws, model, n: int) -> int:
    """The fits the estimator averages: ``num_draws`` itself, or for ``"auto"`` :data:`AUTO_DRAWS` for a
    feature GP fitted to at most 2·D rows and 1 otherwise.

    With n ≲ D rows the D weights are pinned between the rows and one draw's finite map leaves an error
    there that no single fit's variance shows; averaging draws shrinks it (docs/calibration.md). With
    n ≫ D one draw's posterior is close to the kernel's, and an exact GP has no feature draw.

    Raises:
        ValueError: for anything but a positive int or ``"auto"``.
    """
    return draws_for_features(num_draws, getattr(model.covar_module, "num_features", None), n)


def draws_for_features(num_draws, num_features: int | None, n: int) -> int:
    """:func:`resolve_draws` for a model of ``num_features`` features (``None`` or 0: an exact GP),
    without building one.

    Raises:
        ValueError: for anything but a positive int or ``"auto"``.
    """
    if check_draws(num_draws) == "auto":
        return AUTO_DRAWS if num_features and n <= 2 * num_features else 1
    return num_draws


def check_draws(num_draws, name: str = "num_draws") -> int | str:
    """``num_draws`` as a positive int or ``"auto"``, else a ``ValueError`` naming ``name``."""
    if isinstance(num_draws, str):
        if num_draws == "auto":
            return num_draws
        raise ValueError(f"{name} must be a positive integer or 'auto', got {num_draws!r}")
    return check_positive_int(num_draws, name)


def component_candidates(num_components, kernel, num_samples: int, held_out_rows: int = 0,
                         name: str = "num_components") -> tuple[int, ...]:
    """The numbers of components the estimator fits ``kernel`` with: ``(num_components,)``; for ``"auto"``
    and a named mixture kernel the :data:`AUTO_COMPONENTS` that divide ``num_samples`` where its fit holds
    out at least :data:`AUTO_COMPONENT_ROWS` rows, else the last of those alone.

    Raises:
        ValueError: for anything but a positive int or ``"auto"``.
    """
    if not isinstance(num_components, str):
        return (check_positive_int(num_components, name),)
    if num_components != "auto":
        raise ValueError(f"{name} must be a positive integer or 'auto', got {num_components!r}")
    if kernel not in _MIXTURE_KERNELS:
        return AUTO_COMPONENTS[-1:]
    num_samples = check_positive_int(num_samples, "num_samples")
    fitting = tuple(q for q in AUTO_COMPONENTS if num_samples % q == 0)
    return fitting if held_out_rows >= AUTO_COMPONENT_ROWS else fitting[-1:]


def floating_state(module: torch.nn.Module) -> Tensor:
    """The first floating-point tensor of ``module``'s state: its dtype and device are the module's."""
    return next(t for t in module.state_dict().values() if t.is_floating_point())


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily set torch's default dtype, so that kernels draw their state in it.

    Args:
        dtype: the default dtype inside the ``with`` block; the previous one is restored on exit.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _feature_kernel(name: str, d: int, num_samples: int, num_components: int, seed: int,
                    simplex: bool = False) -> FeatureKernel:
    if name not in _FEATURE_KERNELS:
        raise ValueError(f"unknown kernel {name!r}; choose one of {', '.join(KERNEL_NAMES)} or pass a FeatureKernel")
    cls, options = _FEATURE_KERNELS[name]
    return cls(d, num_samples, seed=seed, **options(d, num_components), **({"simplex": True} if simplex else {}))


def check_simplex_name(kernel, simplex: bool, what: str = "simplex=True") -> None:
    """Refuse ``simplex`` for anything but a name in :data:`SIMPLEX_KERNEL_NAMES` (``what`` names the setting)."""
    if simplex and kernel not in SIMPLEX_KERNEL_NAMES:
        raise ValueError(f"{what} needs an ARD kernel to put on the simplex: one of "
                         f"{', '.join(SIMPLEX_KERNEL_NAMES)}, or a FeatureKernel built with simplex=True; got {kernel!r}")


def make_model(
    kernel: str | FeatureKernel,
    num_dims: int,
    *,
    num_samples: int = DEFAULT_SAMPLES,
    num_components: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    simplex: bool = False,
) -> FeatureGP | ExactRBFGP:
    """A fresh, untrained model for ``num_dims`` inputs.

    ========================  ==============================================================
    name                      model
    ========================  ==============================================================
    ``"gm"``                  :class:`~alacarte.SpectralMixtureFastfoodKernel`, Q = ``num_components``
    ``"pwl"``                 :class:`~alacarte.PiecewiseLinearRadialKernel`, ARD, C = ``num_components``
    ``"fsard"``               :class:`~alacarte.FSARDKernel`, ARD
    ``"fsgbard"``             :class:`~alacarte.FSGBARDKernel`, ARD
    ``"fastfood-ard"``        :class:`~alacarte.FastfoodRBFKernel`, ARD
    ``"fastfood-rbf"``        :class:`~alacarte.FastfoodRBFKernel`, one lengthscale
    ``"ssgpr"``               :class:`~alacarte.SSGPRKernel`
    ``"rks"``                 :class:`~alacarte.RandomFourierKernel` (dense), ARD
    ``"exact-ard"``           :class:`~alacarte.ExactRBFGP`, ARD (O(n³))
    ``"exact-rbf"``           :class:`~alacarte.ExactRBFGP`, one lengthscale (O(n³))
    ========================  ==============================================================

    Feature models get ``num_samples`` frequencies (D = 2·``num_samples``
    features) drawn from ``seed``.  A kernel object is used as it is (not
    copied) and must have ``num_dims`` input dimensions; the model takes its dtype
    and device.

    Args:
        kernel: a name above or an alacarte :class:`~alacarte.FeatureKernel`.
        num_dims: input dimension d.
        num_samples: frequencies M of a named feature kernel.
        num_components: mixture components of ``"gm"`` and ``"pwl"`` (must divide ``num_samples``).
        seed: seed of a named kernel's random state.
        dtype: floating dtype of a named model's parameters and state.
        simplex: the named kernel's inverse lengthscales on the scaled simplex (variable selection;
            one of :data:`SIMPLEX_KERNEL_NAMES`; docs/variable_selection.md).

    Returns:
        A :class:`~alacarte.FeatureGP`, or for ``"exact-*"`` an :class:`~alacarte.ExactRBFGP`,
        without training data (:func:`alacarte.fit` sets it).

    Raises:
        ValueError: for an unknown name, a kernel object of another input dimension,
            ``num_components`` that does not divide ``num_samples``, ``simplex`` for a kernel
            object or a name without ARD lengthscales, or another bad setting.

    Example:
        >>> from alacarte.factory import make_model
        >>> model = make_model("gm", num_dims=6, num_samples=128, seed=0)
        >>> type(model.covar_module).__name__
        'SpectralMixtureFastfoodKernel'
    """
    num_dims = check_positive_int(num_dims, "num_dims")
    seed = check_seed(seed)  # here, not only in the feature kernels: an exact model draws nothing to check it
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    check_simplex_name(kernel, simplex)
    if isinstance(kernel, FeatureKernel):
        if kernel.num_dims != num_dims:
            raise ValueError(f"the kernel was built for {kernel.num_dims} input dimensions, the data have {num_dims}")
        # The likelihood and mean take the kernel's dtype and device, not the defaults.
        reference = floating_state(kernel)
        with default_dtype(reference.dtype):
            return FeatureGP(None, None, kernel).to(reference.device)
    if not isinstance(kernel, str):
        raise ValueError(f"kernel must be a name ({', '.join(KERNEL_NAMES)}) or a FeatureKernel, got {kernel!r}")
    num_samples = check_positive_int(num_samples, "num_samples")
    num_components = check_positive_int(num_components, "num_components")
    with default_dtype(dtype):
        if kernel in ("exact-ard", "exact-rbf"):
            return ExactRBFGP(None, None, num_dims=num_dims, ard=kernel == "exact-ard")
        return FeatureGP(None, None, _feature_kernel(kernel, num_dims, num_samples, num_components, seed, simplex))
