"""Fast Walsh–Hadamard transform along the last dimension.

``fwht(x)`` returns ``x @ H_p`` for the unnormalised Sylvester-ordered Hadamard
matrix ``H_p`` (entries ±1, ``H_p @ H_p = p I``), for any batch shape, in
O(p log p) per row.  ``H_p`` is symmetric, so the backward pass is the same
transform applied to the output gradient.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["fwht", "hadamard_matrix"]


def _check_power_of_two(p: int) -> None:
    if p < 1 or p & (p - 1):
        raise ValueError(f"fwht needs a last dimension that is a power of two, got {p}")


@functools.lru_cache(maxsize=64)
def _hadamard_cached(p: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < p:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_matrix(p: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> Tensor:
    """The dense p×p Sylvester Hadamard matrix (for small blocks and tests only)."""
    _check_power_of_two(p)
    return _hadamard_cached(p, dtype, torch.device(device)).clone()


def _fwht_forward(x: Tensor) -> Tensor:
    p = x.shape[-1]
    batch = x.shape[:-1]
    y = x.reshape(-1, p).clone()
    h = 1
    while h < p:
        y = y.view(-1, p // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(*batch, p)


class _FWHT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: D102
        return _fwht_forward(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: D102
        return _FWHT.apply(grad)


def fwht(x: Tensor) -> Tensor:
    """Unnormalised fast Walsh–Hadamard transform along the last dimension.

    Args:
        x: tensor of shape ``(..., p)`` with ``p`` a power of two.

    Returns:
        ``x @ H_p`` with the same shape and dtype as ``x``.

    Example:
        >>> y = fwht(torch.eye(4))   # rows of H_4
        >>> torch.equal(fwht(y), 4 * torch.eye(4))
        True
    """
    _check_power_of_two(x.shape[-1])
    return _FWHT.apply(x)
