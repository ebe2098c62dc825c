"""The Fastfood projection (Le, Sarlós & Smola 2013), MATH.md §2.

``K = ceil(M / p)`` stacked p×p blocks ``V_k = S_k H G_k Π_k H B_k`` act on the
zero-padded input.  The functions here are stateless: the kernels own the state
(signs ``B``, permutations ``Π``, Gaussians ``G``, radii ``s``) as buffers or
parameters with leading ``*batch_shape`` dimensions, so GPyTorch's batch slicing
and ``state_dict`` see it directly.

Two execution strategies compute the same projection ``x @ Vᵀ`` to round-off:

* ``"fwht"``: two fast Walsh–Hadamard transforms per block, O(n M log p);
* ``"dense"``: materialise the effective M×d matrix ``V`` from the state
  (differentiably, O(M p log p)) and use one GEMM, O(n M d).

GEMMs run near peak while the transform is memory-bound, so the dense path wins
for small ``d``; :func:`choose_strategy` encodes the measured cut-over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..ops.fwht import fwht

__all__ = [
    "FastfoodState",
    "draw_fastfood_state",
    "padded_dim",
    "row_scale",
    "fastfood_project",
    "fastfood_matrix",
    "choose_strategy",
]

# Input dimension from which the FWHT path beats materialise-and-GEMM
# (experiments/bench_features.py measures it).
DENSE_MAX_DIM = 512


def padded_dim(num_dims: int) -> int:
    """p = 2^ceil(log2 d): the Hadamard size for inputs of dimension d."""
    return 1 << max(0, math.ceil(math.log2(num_dims)))


@dataclass
class FastfoodState:
    """Random Fastfood state for ``K`` blocks of size ``p`` (numpy, float64)."""

    sign: np.ndarray  # (*batch, K, p), entries ±1 (B)
    perm: np.ndarray  # (*batch, K, p), a permutation of range(p) per block (Π)
    gauss: np.ndarray  # (*batch, K, p), N(0, 1) (G)
    radius: np.ndarray  # (*batch, M), χ_p draws (s)


def draw_fastfood_state(
    num_dims: int, num_samples: int, batch_shape: torch.Size | tuple[int, ...], seed: int
) -> FastfoodState:
    """Draw the Fastfood state deterministically from ``seed``.

    The same ``(num_dims, num_samples, batch_shape, seed)`` gives bit-identical
    state on every machine and process (numpy's PCG64 stream).
    """
    p = padded_dim(num_dims)
    blocks = -(-num_samples // p)
    rng = np.random.default_rng(seed)
    shape = (*batch_shape, blocks, p)
    sign = rng.integers(0, 2, size=shape).astype(np.float64) * 2.0 - 1.0
    perm = np.argsort(rng.random(shape), axis=-1)
    gauss = rng.standard_normal(shape)
    radius = np.sqrt(rng.chisquare(p, size=(*batch_shape, num_samples)))
    return FastfoodState(sign=sign, perm=perm, gauss=gauss, radius=radius)


def row_scale(gauss: Tensor, radius: Tensor) -> Tensor:
    """Diagonal of ``S`` for all blocks: ``s_i / (sqrt(p) ‖g_k‖)``, shape (*batch, M).

    Every row of ``H G_k Π_k H B_k`` has norm ``sqrt(p) ‖g_k‖`` (for ±1 signs), so
    row i of ``V`` then has length ``s_i``.
    """
    p = gauss.shape[-1]
    num_samples = radius.shape[-1]
    norms = gauss.norm(dim=-1, keepdim=True) * math.sqrt(p)  # (*batch, K, 1)
    per_row = norms.expand(*gauss.shape).reshape(*gauss.shape[:-2], -1)[..., :num_samples]
    return radius / per_row


def _block_transform(u: Tensor, sign: Tensor, perm: Tensor, gauss: Tensor) -> Tensor:
    """``H G Π H B`` applied to ``u`` of shape (..., K, p) (blocks already broadcast)."""
    u = fwht(u * sign)
    u = torch.gather(u, -1, perm.expand(*u.shape))
    return fwht(u * gauss)


def fastfood_matrix(sign: Tensor, perm: Tensor, gauss: Tensor, radius: Tensor, num_dims: int) -> Tensor:
    """The effective frequency matrix ``V`` (first ``d`` columns), shape (*batch, M, d).

    Differentiable in ``sign``, ``gauss`` and ``radius``.
    """
    p = sign.shape[-1]
    eye = torch.eye(p, dtype=sign.dtype, device=sign.device)[:num_dims]  # (d, p)
    # rows of the identity through every block: (*batch, d, K, p)
    u = _block_transform(
        eye.unsqueeze(-2), sign.unsqueeze(-3), perm.unsqueeze(-3), gauss.unsqueeze(-3)
    )
    vt = u.reshape(*u.shape[:-2], -1)[..., : radius.shape[-1]]  # (*batch, d, M)
    return (vt * row_scale(gauss, radius).unsqueeze(-2)).transpose(-1, -2)


def choose_strategy(num_dims: int) -> str:
    """The faster of the two equivalent execution paths for inputs of dimension d."""
    return "dense" if num_dims <= DENSE_MAX_DIM else "fwht"


def fastfood_project(
    x: Tensor,
    sign: Tensor,
    perm: Tensor,
    gauss: Tensor,
    radius: Tensor,
    strategy: str = "auto",
) -> Tensor:
    """``x @ Vᵀ`` for the Fastfood matrix V defined by the state.

    Args:
        x: inputs (..., n, d), already divided by the lengthscales.
        sign, perm, gauss: block state (*batch, K, p).
        radius: row lengths ``s`` (*batch, M).
        strategy: ``"fwht"``, ``"dense"`` or ``"auto"`` (:func:`choose_strategy`).

    Returns:
        projections of shape (..., n, M).
    """
    num_dims = x.shape[-1]
    p = sign.shape[-1]
    if num_dims > p:
        raise ValueError(f"inputs have {num_dims} dimensions but the Fastfood blocks have size {p}")
    if strategy == "auto":
        strategy = choose_strategy(num_dims)
    if strategy == "dense":
        return x @ fastfood_matrix(sign, perm, gauss, radius, num_dims).transpose(-1, -2)
    if strategy != "fwht":
        raise ValueError(f"unknown strategy {strategy!r}; use 'auto', 'dense' or 'fwht'")
    u = torch.nn.functional.pad(x, (0, p - num_dims)).unsqueeze(-2)  # (..., n, 1, p)
    u = _block_transform(u, sign.unsqueeze(-3), perm.unsqueeze(-3), gauss.unsqueeze(-3))
    u = u.reshape(*u.shape[:-2], -1)[..., : radius.shape[-1]]
    return u * row_scale(gauss, radius).unsqueeze(-2)
