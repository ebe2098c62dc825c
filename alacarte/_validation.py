"""Input checks shared by the models and the training entry point.

Every check raises ``ValueError`` naming the argument and what is wrong with it.
"""
from __future__ import annotations

import numbers

import numpy as np
import torch
from torch import Tensor


def column_standardization(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and scales for standardising ``X`` (n, d) as (X − mean)/scale.

    A constant column (max = min) gets scale 1 and is only centred: its computed
    standard deviation can be round-off rather than 0 (a column of 0.1s gives
    ~4e-17), and dividing by that would turn the round-off into an O(1) input."""
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[np.ptp(X, axis=0) == 0] = 1.0
    return mean, scale


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def as_tensor(value, name: str, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Tensor:
    """Convert array-likes to a floating tensor of ``dtype``; refuse non-numeric data.

    Without ``dtype``, floating tensors keep theirs and everything else takes
    torch's default dtype."""
    if isinstance(value, Tensor):
        tensor = value
    else:
        array = np.asarray(value)
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise ValueError(f"{name} must be numeric, got an array of dtype {array.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(array))
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
