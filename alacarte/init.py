"""Data-driven initialisation of GP hyperparameters (À la carte paper, §5.1).

All statistics are taken on the model's internal (standardised) data, so the
target has mean 0 and variance 1:

* lengthscales from a quantile of the distances between random pairs of
  training points — per dimension for ARD, times sqrt(d) as in the paper.  The
  two do not agree: on isotropic Gaussian data the ARD median is 0.67× the
  isotropic one for large d (0.70 at d = 10, 0.81 at d = 2), since the median
  of ``|N(0, 2)|`` is 0.95 while a full distance grows like sqrt(2d);
* signal variance the target's variance (1 once standardised), noise variance
  0.01 of it (noise std a tenth of the target's);
* GM: per component, scales 1/ℓ from its own random quantile and means close
  to 0; PWL: ARD lengthscales as above, hat modes at the same evenly spread
  knots around the χ_p peak sqrt(p) in every restart, half-widths half the mode.

Each call draws what it needs from ``rng``; restart 0 uses the median quantile.
Parameters the user froze (``requires_grad=False``) keep their values.
"""
from __future__ import annotations

import math

import gpytorch
import numpy as np
import torch
from torch import Tensor

from .kernels import (
    FastfoodRBFKernel,
    FeatureKernel,
    PiecewiseLinearRadialKernel,
    RandomFourierKernel,
    SpectralMixtureFastfoodKernel,
    SSGPRKernel,
)
from .kernels.piecewise_linear import initial_modes

__all__ = ["initialize", "pair_distances", "scale_signal", "set_noise", "signal_variance_parameter"]

_NUM_PAIRS = 2000
# The feature kernels _initialize has rules for.
_INITIALIZABLE = (FastfoodRBFKernel, RandomFourierKernel, SSGPRKernel, SpectralMixtureFastfoodKernel,
                  PiecewiseLinearRadialKernel)
_QUANTILE_RANGE = (0.1, 0.9)


def pair_distances(x: Tensor, rng: np.random.Generator, num_pairs: int = _NUM_PAIRS) -> Tensor:
    """``|x_i − x_k|`` per dimension for random pairs i ≠ k, shape (num_pairs, d).

    Args:
        x: the rows (n, d).
        rng: the generator the pairs are drawn from (with replacement).
        num_pairs: the number of pairs.

    Returns:
        The distances; a single row of ones when n < 2 (no pair exists).
    """
    n = x.shape[0]
    if n < 2:
        return torch.ones(1, x.shape[1], dtype=x.dtype, device=x.device)
    i = rng.integers(0, n, num_pairs)
    k = (i + rng.integers(1, n, num_pairs)) % n
    return (x[torch.as_tensor(i)] - x[torch.as_tensor(k)]).abs()


def _quantile(values: Tensor, q: float) -> Tensor:
    """Per-column quantile of the non-zero distances.

    Zeros are pairs that agree on a discrete column (a binary flag, a count that
    is mostly 0); counting them would put the median at 0 and the lengthscale at
    nothing.  A column with no non-zero distance (constant) gets 1, the scale of
    standardised data.
    """
    nonzero = torch.where(values > 0, values, torch.full_like(values, math.nan))
    quantile = torch.nanquantile(nonzero, q, dim=0)
    return torch.where(torch.isnan(quantile), torch.ones_like(quantile), quantile)


def _lengthscales(diffs: Tensor, q: float, ard: bool) -> Tensor:
    """Isotropic: a quantile of full distances.  ARD: per-dimension quantiles × sqrt(d)."""
    if ard:
        return _quantile(diffs, q) * math.sqrt(diffs.shape[1])
    return _quantile(diffs.norm(dim=1, keepdim=True), q)


def _on(draws: np.ndarray, like: Tensor) -> Tensor:
    """numpy draws as a tensor of ``like``'s dtype and device (the model's: CPU or GPU)."""
    return torch.as_tensor(draws, dtype=like.dtype, device=like.device)


def _draw_quantile(rng: np.random.Generator, restart: int) -> float:
    return 0.5 if restart == 0 else float(rng.uniform(*_QUANTILE_RANGE))


def _set(module, name: str, value) -> Tensor:
    """Set ``module.<name>`` to ``value`` moved inside the parameter's constraint, and return what was set.

    A constraint the user chose (``lengthscale_constraint=Interval(0.05, 1)``) may exclude the
    data-driven value (a lengthscale of 1.66), and the setter refused it: ``fit`` failed at its
    first restart.  Values are kept 1% of a finite interval inside it, or at least twice a positive
    lower bound (near it the softplus flattens the gradient); the default constraints (positive,
    (0, 1)) leave every data-driven value as it is.  Every hyperparameter set here is positive, so
    an upper bound alone (``LessThan(b)``) bounds the interval (0, b)."""
    raw = getattr(module, f"raw_{name}")
    value = torch.as_tensor(value, dtype=raw.dtype, device=raw.device)
    constraint = getattr(module, f"raw_{name}_constraint")
    lower, upper = constraint.lower_bound.to(value), constraint.upper_bound.to(value)
    if bool(torch.isfinite(upper).all()):
        # 1% of (0, b) under an upper bound alone, but no lift off 0, which bounds nothing there
        # (LessThan(10) took a noise of 0.01 and lengthscales of ~0.02 all to 0.1)
        margin = 0.01 * (upper - lower.clamp(min=0))
        value = torch.minimum(torch.maximum(value, lower + margin), upper - margin)
    else:
        # a mixture weight whose softplus underflowed to exactly 0 would otherwise be refused on rescaling
        floor = torch.where(lower == 0, torch.finfo(value.dtype).tiny, 2 * lower)
        value = torch.maximum(value, floor)
    setattr(module, name, value)
    return value


def check_initializable(model) -> None:
    """Refuse a model whose kernel :func:`initialize` has no rules for; :func:`alacarte.fit` asks before
    it reads any data (a streamed fit read all of it, three times, before the refusal).

    Raises:
        ValueError: for a :class:`~alacarte.FeatureKernel` of the user's own, which has none of the
            parameters set here.
    """
    kernel = model.covar_module
    if isinstance(kernel, FeatureKernel) and not isinstance(kernel, _INITIALIZABLE):
        raise ValueError(f"no data-driven initialisation for {type(kernel).__name__}; use restarts=0")


@torch.no_grad()
def set_noise(model, variance: float) -> None:
    """Set σ², raised to twice its constraint's lower bound if below it (GPyTorch refuses
    values under the bound; unstandardised targets of tiny scale give such values), or moved
    inside an upper bound the user set (below 0.1, the noise refit's start raised a RuntimeError
    after the whole fit had run).

    Args:
        model: a model whose ``likelihood`` is a ``GaussianLikelihood``.
        variance: the noise variance σ² to set, in the model's internal units.
    """
    _set(model.likelihood.noise_covar, "noise", variance)


def signal_variance_parameter(model) -> tuple[Tensor, object, str] | None:
    """(raw parameter, module, name) of what carries the signal variance σ_f²: an outputscale, or
    a mixture's weights (whose sum is σ_f²); ``None`` for a kernel with neither."""
    kernel = model.covar_module
    name = "outputscale"  # (a FeatureKernel's may be switched off: has_outputscale)
    if (isinstance(kernel, FeatureKernel) and not kernel.has_outputscale
            or not isinstance(getattr(kernel, "raw_outputscale", None), torch.nn.Parameter)):
        name = "weights"
    raw = getattr(kernel, f"raw_{name}", None)
    return (raw, kernel, name) if isinstance(raw, torch.nn.Parameter) else None


@torch.no_grad()
def scale_signal(model, factor: float) -> None:
    """Multiply the signal variance σ_f² by ``factor`` (kept inside its constraint)."""
    found = signal_variance_parameter(model)
    if found is not None:
        _, module, name = found
        _set(module, name, getattr(module, name) * factor)


@torch.no_grad()
def initialize(model, x: Tensor, y: Tensor, rng: np.random.Generator, restart: int = 0,
               standardized: bool = False, target_moments: tuple[float, float] | None = None) -> None:
    """Set ``model``'s trainable hyperparameters from its training data (see the module's rules).

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP`.
        x, y: training rows (n, d) and targets (n,) in the model's internal units.
        rng: the generator of every random choice (pairs, quantiles, GM means, PWL modes).
        restart: the restart's index; restart 0 takes the median distance, later ones a random
            quantile in [0.1, 0.9].
        standardized: the targets were standardised, so the signal variance starts at 1
            (exactly, not its round-off estimate).
        target_moments: the mean and variance of all the targets where ``(x, y)`` are only some
            of the rows (streamed data: the first ones, which need not be typical); default ``y``'s own.

    Raises:
        ValueError: if the targets' variance is 0 or overflows, or the kernel has no
            data-driven initialisation (a user-defined :class:`~alacarte.FeatureKernel`).
    """
    frozen = [(p, p.detach().clone()) for p in model.parameters() if not p.requires_grad]
    _initialize(model, x, y, rng, restart, standardized, target_moments)
    for parameter, value in frozen:
        parameter.copy_(value)


def _initialize(model, x: Tensor, y: Tensor, rng: np.random.Generator, restart: int, standardized: bool,
                target_moments: tuple[float, float] | None) -> None:
    check_initializable(model)
    diffs = pair_distances(x, rng)
    if target_moments is None:
        target_moments = float(y.mean()), float(y.var()) if y.numel() > 1 else 1.0
    mean, variance = target_moments
    if not 0 < variance < math.inf:  # unstandardised y of scale 1e160 (or 1e-170): var y over- (under-)flows
        raise ValueError(f"the targets' variance is {variance:g} in the model's dtype: no signal or noise variance "
                         "can start from it; fit with standardize=True (the default), or rescale y")
    signal = 1.0 if standardized else variance
    set_noise(model, 0.01 * variance)
    if isinstance(model.mean_module, gpytorch.means.ConstantMean):  # (a ZeroMean, LinearMean… of the user's stays)
        model.mean_module.constant.fill_(mean)
    kernel = model.covar_module
    if not isinstance(kernel, FeatureKernel):  # exact GP: ScaleKernel(RBFKernel)
        base = kernel.base_kernel
        ard = base.ard_num_dims is not None and base.ard_num_dims > 1
        _set(base, "lengthscale", _lengthscales(diffs, _draw_quantile(rng, restart), ard))
        _set(kernel, "outputscale", signal)
        return
    if kernel.has_outputscale:
        _set(kernel, "outputscale", signal)
    # simplex kernels too: per-input scales give π a different start at each restart
    ard = kernel.simplex or (kernel.has_lengthscale and kernel.raw_lengthscale.shape[-1] > 1)
    if isinstance(kernel, SpectralMixtureFastfoodKernel):
        q_count, d = kernel.num_components, kernel.num_dims
        scales = torch.stack([1.0 / _lengthscales(diffs, _draw_quantile(rng, restart + c), True).reshape(d)
                              for c in range(q_count)])
        scales = _set(kernel, "scales", scales)
        kernel.means.copy_(_on(rng.normal(0.0, 0.1, size=(q_count, d)), scales) * scales)
        _set(kernel, "weights", signal / q_count)
        return
    lengthscale = _lengthscales(diffs, _draw_quantile(rng, restart), ard)
    if isinstance(kernel, SSGPRKernel):
        eps = _on(rng.standard_normal(tuple(kernel.frequencies.shape)), lengthscale)
        kernel.frequencies.copy_(eps / lengthscale.reshape(-1))
        return
    if kernel.simplex:  # γ = c·π: no lengthscale constraint
        kernel.lengthscale = lengthscale
    else:
        _set(kernel, "lengthscale", lengthscale)
    if isinstance(kernel, PiecewiseLinearRadialKernel):
        c = kernel.num_components
        # the constructor's knots, not random ones: restarts drawn with random knots end where two hats
        # carry no weight and relevant inputs are missed (pumadyn32nm; docs/calibration.md)
        _set(kernel, "modes", initial_modes(kernel.num_dims, c))
        _set(kernel, "width_ratios", 0.5)
        _set(kernel, "weights", signal / c)
