"""Input checks shared by the models and the training entry point.

Every check raises ``ValueError`` naming the argument and what is wrong with it.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import torch
from torch import Tensor


def unfitted_on_failure(fit):
    """Decorate an estimator's ``fit`` so that one which raises leaves the estimator unfitted.

    Its fitted attributes (names ending in ``_``) are removed, so ``predict`` raises
    ``NotFittedError``: half the old fit and half the new data's settings (say the new
    standardisation with the old coefficients) would predict wrong numbers without an error."""

    @functools.wraps(fit)
    def fit_or_forget(self, *args, **kwargs):
        try:
            return fit(self, *args, **kwargs)
        except BaseException:
            for name in [name for name in vars(self) if name.endswith("_") and not name.startswith("__")]:
                delattr(self, name)
            raise

    return fit_or_forget


def varying_columns(x: np.ndarray | Tensor) -> np.ndarray | Tensor:
    """Which columns of the rows ``x`` (..., n, d) are not constant (max > min over all rows): a boolean
    mask of length d, of ``x``'s kind.  A constant column is zeros once centred, so nothing in a fit
    moves its weight, lengthscale or relevance: the estimators give it none."""
    if isinstance(x, Tensor):
        flat = x.detach().reshape(-1, x.shape[-1])
        return flat.amax(0) > flat.amin(0)
    return np.ptp(x.reshape(-1, x.shape[-1]), axis=0) > 0


def column_standardization(X: np.ndarray, name: str = "X") -> tuple[np.ndarray, np.ndarray]:
    """Column means and scales for standardising ``X`` (n, d) as (X − mean)/scale.

    A constant column (max = min) gets scale 1 and is only centred, to zeros: its computed
    standard deviation can be round-off rather than 0 (a column of 0.1s gives
    ~4e-17), and dividing by that would turn the round-off into an O(1) input.
    Scales are ``X.std(axis=0)``, or :func:`robust_std`'s where that over- or underflows."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # handled below
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        peak = np.abs(X - mean).max(axis=0)
        constant = np.ptp(X, axis=0) == 0
    if not bool(_exact_to_round_off(scale, peak, np.finfo(X.dtype)).all()):
        scale = robust_std(torch.from_numpy(np.ascontiguousarray(X)), 0, correction=0).numpy()
    scale[constant] = 1.0
    mean[constant] = X[0, constant]  # centred to exact zeros (a mean of 60 copies of 0.1 is not 0.1)
    check_scales_finite(mean, scale, name)
    return mean, scale


def robust_std(t: Tensor, dim: int | None = None, correction: int = 1) -> Tensor:
    """``t.std(dim, correction=...)``, also where squaring the deviations would overflow
    (``|x| > 1e154``) or underflow (``|x| < 1e-154``): there it is computed on the deviations
    divided by their largest magnitude.  Elsewhere it is ``t.std`` bit for bit, so that
    ordinary fits are exactly what they were."""
    dims = tuple(range(t.dim())) if dim is None else (dim,)
    plain = t.std(dims, correction=correction)
    centred = t - t.mean(dims, keepdim=True)
    peak = centred.abs().amax(dims, keepdim=True)
    safe = _exact_to_round_off(plain, peak.squeeze(dims), torch.finfo(t.dtype))
    if bool(safe.all()):
        return plain
    unit = torch.where(peak > 0, peak, torch.ones_like(peak))
    scaled = (centred / unit).std(dims, correction=correction) * unit.squeeze(dims)
    return torch.where(safe, plain, scaled)


def _exact_to_round_off(std, peak, info):
    """Where a standard deviation summed from plain squares is accurate: no square overflows
    and the result is far from the subnormal range."""
    return (std > info.tiny ** 0.5) & (peak < info.max ** 0.5)


def check_scales_finite(mean, scale, name: str) -> None:
    if not all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in (mean, scale)):
        raise ValueError(f"{name} is too large in magnitude to standardise (its mean or spread overflows); "
                         "rescale it")


def check_learnable_targets(n: int, y_min: float, y_max: float, name: str = "y") -> None:
    """A GP needs two or more training rows and targets that vary.

    With one row, or a constant target, the marginal likelihood grows without
    bound as the signal and noise variances go to 0: there is no fit to find,
    only a model that claims certainty."""
    if n < 2:
        raise ValueError(f"a GP needs at least 2 training rows to learn hyperparameters, got n_samples = {n}")
    if y_min == y_max:
        raise ValueError(f"{name} is constant (every value is {y_min:g}): there is nothing for a GP to learn; "
                         "predict the constant instead")


def _is_integer(value) -> bool:
    """Python and numpy integers (what a grid search passes), not bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(value, name: str) -> int:
    if not _is_integer(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_nonnegative_int(value, name: str) -> int:
    if not _is_integer(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def check_seed(value, name: str = "seed") -> int | None:
    """``None`` or an integer in [0, 2⁶⁴): what both numpy's and torch's generators accept."""
    if value is None:
        return None
    if not _is_integer(value) or not 0 <= value < 2**64:
        raise ValueError(f"{name} must be None or an integer in [0, 2**64), got {value!r}")
    return int(value)


def check_real(value, name: str, low: float = -math.inf, high: float = math.inf, *, include_low: bool = False,
               include_high: bool = False, allow_none: bool = False) -> float | None:
    """A finite real number (not a bool) between ``low`` and ``high`` (each end open unless included),
    or ``None`` where allowed."""
    if value is None and allow_none:
        return None
    if not (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
            and (low <= value if include_low else low < value) and (value <= high if include_high else value < high)):
        interval = f"{'[' if include_low else '('}{low:g}, {high:g}{']' if include_high else ')'}"
        raise ValueError(f"{name} must be a finite number in {interval}{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return float(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _numeric_array(value, name: str) -> np.ndarray:
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise ValueError(f"{name} must be numeric, got an array of dtype {array.dtype}")
    return array


def float64_targets(y, name: str = "y") -> np.ndarray:
    """Regression targets as float64 (what the estimators compute in), refusing strings."""
    return _numeric_array(y, name).astype(np.float64, copy=False)


def as_tensor(value, name: str, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Tensor:
    """Convert array-likes to a floating tensor of ``dtype``; refuse non-numeric data.

    Without ``dtype``, floating tensors keep theirs and everything else takes
    torch's default dtype."""
    if isinstance(value, Tensor):
        tensor = value
    else:
        array = _numeric_array(value, name)
        if not array.dtype.isnative:  # e.g. a big-endian .npy file, memory-mapped: torch takes native order only
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array)  # torch takes no negative strides
        if not array.flags.writeable:  # a read-only memmap: torch wants memory it may write
            array = array.copy()
        tensor = torch.from_numpy(array)
    if tensor.is_complex():
        raise ValueError(f"{name} must be real, got a complex tensor")
    if dtype is None:
        dtype = tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()
    return tensor.to(dtype=dtype, device=device)


def check_inputs(x: Tensor, name: str = "x", num_dims: int | None = None) -> Tensor:
    """Inputs of shape (n, d) (a 1-D tensor is n points of one dimension)."""
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (n, d), got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 rows)")
    if num_dims is not None and x.shape[1] != num_dims:
        raise ValueError(f"{name} has {x.shape[1]} columns but the model expects {num_dims} input dimensions")
    _check_finite(x, name)
    return x


def check_targets(y: Tensor, n: int, name: str = "y") -> Tensor:
    """Targets of shape (n,) (an (n, 1) column is accepted)."""
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.squeeze(-1)
    if y.dim() != 1:
        raise ValueError(f"{name} must have shape (n,), got {tuple(y.shape)}")
    if y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} values but x has {n} rows")
    _check_finite(y, name)
    return y


def _check_finite(t: Tensor, name: str) -> None:
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = (~finite).sum().item()
        kinds = []
        if torch.isnan(t).any():
            kinds.append("NaN")
        if torch.isinf(t).any():
            kinds.append("inf")
        raise ValueError(f"{name} contains {bad} non-finite value(s) ({'/'.join(kinds)})")
