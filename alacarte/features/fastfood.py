"""The Fastfood projection (Le, Sarlós & Smola 2013), docs/mathematics.md §2.

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

from ..ops.autograd import differentiable_backward
from ..ops.fwht import apply_plan, chunk_rows, fwht, holding_workspaces, plan_for, workspace

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
    """Random Fastfood state for ``K`` blocks of size ``p`` (numpy, float64).

    Attributes:
        sign: ``(*batch, K, p)``, entries ±1 (B).
        perm: ``(*batch, K, p)``, a permutation of ``range(p)`` per block (Π), integers.
        gauss: ``(*batch, K, p)``, N(0, 1) draws (G).
        radius: ``(*batch, M)``, χ_p draws (the row lengths s).
    """

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

    Args:
        num_dims: input dimension d (the blocks have size p = :func:`padded_dim` (d)).
        num_samples: number of frequencies M; K = ceil(M / p) blocks.
        batch_shape: leading batch dimensions of every array.
        seed: seed of numpy's generator.

    Returns:
        The :class:`FastfoodState`.
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
    """Diagonal of ``S`` for all blocks: ``s_i / (sqrt(p) ‖g_k‖)``, shape ``(*batch, M)``.

    Every row of ``H G_k Π_k H B_k`` has norm ``sqrt(p) ‖g_k‖`` (for ±1 signs), so
    row i of ``V`` then has length ``s_i``.

    Args:
        gauss: the blocks' Gaussians G, ``(*batch, K, p)``.
        radius: the row lengths s, ``(*batch, M)`` with M ≤ K·p.
    """
    p = gauss.shape[-1]
    num_samples = radius.shape[-1]
    norms = gauss.norm(dim=-1, keepdim=True) * math.sqrt(p)  # (*batch, K, 1)
    per_row = norms.expand(*gauss.shape).reshape(*gauss.shape[:-2], -1)[..., :num_samples]
    return radius / per_row


def _block_transform(u: Tensor, sign: Tensor, perm: Tensor, gauss: Tensor) -> Tensor:
    """``H G Π H B`` applied to ``u`` of shape (..., K, p) (blocks already broadcast).

    The plain autograd composition of the definition (a reference for tests, and what
    second derivatives differentiate; the projection itself runs the fused
    :class:`_FastfoodFWHT`).
    """
    u = fwht(u * sign)
    u = torch.gather(u, -1, perm.expand(*u.shape))
    return fwht(u * gauss)


def _composed_project(x: Tensor, sign: Tensor, gauss: Tensor, scale: Tensor, perm: Tensor) -> Tensor:
    """What :class:`_FastfoodFWHT` computes, as plain autograd ops (an n×K·p intermediate): the graph a
    second derivative differentiates."""
    p = sign.shape[-1]
    u = torch.nn.functional.pad(x, (0, p - x.shape[-1])).unsqueeze(-2)  # (..., n, 1, p)
    u = _block_transform(u, sign.unsqueeze(-3), perm.unsqueeze(-3), gauss.unsqueeze(-3))  # (..., n, K, p)
    return u.flatten(-2)[..., : scale.shape[-1]] * scale.unsqueeze(-2)


# --------------------------------------------------------------------------- fused FWHT path
def _global_index(perm: Tensor) -> Tensor:
    """Per-block permutations (K, p) as one index into the flattened K·p columns."""
    k, p = perm.shape
    offs = torch.arange(k, device=perm.device, dtype=perm.dtype).unsqueeze(-1) * p
    return (perm + offs).reshape(-1)


def _first_half(xc: Tensor, sign: Tensor, gidx: Tensor, plan: tuple, out: Tensor, ws1: Tensor, ws2: Tensor) -> Tensor:
    """``Π H B pad(x)`` for a row chunk xc (c, d) into ``out`` (c, K·p); ws1/ws2 scratch."""
    c, d = xc.shape
    k, p = sign.shape
    t = ws1.view(c, k, p)
    if d < p:
        t[..., d:].zero_()
        torch.mul(xc.unsqueeze(1), sign[:, :d], out=t[..., :d])
    else:
        torch.mul(xc.unsqueeze(1), sign, out=t)
    u = ws2.view(c * k, p)
    apply_plan(plan, t.view(c * k, p), u, out.view(c * k, p))
    torch.index_select(u.view(c, k * p), 1, gidx, out=out.view(c, k * p))
    return out.view(c, k, p)


def _flat_state(t: Tensor, batch: torch.Size, tail: tuple[int, ...]) -> Tensor:
    # The batch size is spelt out: with -1, a tail holding no elements (n = 0 rows) is ambiguous to reshape.
    return t.expand(*batch, *tail).reshape(batch.numel(), *tail)


class _FastfoodFWHT(torch.autograd.Function):
    """``pad(x) @ (S H G Π H B)ᵀ`` for all blocks, fused and chunked over rows.

    Forward per row chunk (all intermediates in cached scratch, sized to stay in
    cache): ``t = pad(x) ⊙ B`` (one write, the K-fold copy), ``H`` (``apply_plan``),
    gather by ``Π`` (``index_select``), ``⊙ G`` in place, ``H``, and ``⊙ S`` written
    straight into the output.  Backward recomputes what it needs chunk by chunk
    (no n×K·p tensor is kept) and uses ``Hᵀ = H``, ``Π⁻¹``.
    """

    @staticmethod
    @holding_workspaces
    def forward(ctx, x: Tensor, sign: Tensor, gauss: Tensor, scale: Tensor, perm: Tensor) -> Tensor:  # noqa: D102
        k, p = sign.shape[-2:]
        n, d = x.shape[-2:]
        m = scale.shape[-1]
        batch = torch.broadcast_shapes(x.shape[:-2], sign.shape[:-2], gauss.shape[:-2], scale.shape[:-1], perm.shape[:-2])
        ctx.save_for_backward(x, sign, gauss, scale, perm)
        ctx.batch = batch
        xb = _flat_state(x, batch, (n, d))
        sb, gb = _flat_state(sign, batch, (k, p)), _flat_state(gauss, batch, (k, p))
        pb, scb = _flat_state(perm, batch, (k, p)), _flat_state(scale, batch, (m,))
        out = x.new_empty(xb.shape[0], n, m)
        plan = plan_for(p, x.dtype)
        step = chunk_rows(k * p, x.element_size(), x.device)
        size = min(step, n) * k * p
        ws = [workspace(f"ff{i}", size, x.dtype, x.device) for i in range(3)]
        for b in range(xb.shape[0]):
            gidx = _global_index(pb[b])
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                c = r1 - r0
                e = c * k * p
                q = _first_half(xb[b, r0:r1], sb[b], gidx, plan, ws[0][:e], ws[1][:e], ws[2][:e])
                q.mul_(gb[b])
                v = ws[1][:e].view(c * k, p)
                apply_plan(plan, q.view(c * k, p), v, ws[2][:e].view(c * k, p))
                torch.mul(v.view(c, k * p)[:, :m], scb[b], out=out[b, r0:r1])
        return out.view(*batch, n, m)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        if torch.is_grad_enabled():  # create_graph=True: the fused backward builds no graph
            return differentiable_backward(_composed_project, ctx.saved_tensors, ctx.needs_input_grad, (grad,))
        return _FastfoodFWHT._fused_backward(ctx, grad)

    @staticmethod
    @holding_workspaces
    def _fused_backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, sign, gauss, scale, perm = ctx.saved_tensors
        batch = ctx.batch
        need_x, need_sign, need_gauss, need_scale = ctx.needs_input_grad[:4]
        k, p = sign.shape[-2:]
        n, d = x.shape[-2:]
        m = scale.shape[-1]
        xb = _flat_state(x, batch, (n, d))
        sb, gb = _flat_state(sign, batch, (k, p)), _flat_state(gauss, batch, (k, p))
        pb, scb = _flat_state(perm, batch, (k, p)), _flat_state(scale, batch, (m,))
        gr = _flat_state(grad, batch, (n, m))
        nb = xb.shape[0]
        gx = x.new_empty(nb, n, d) if need_x else None
        gsign = x.new_zeros(nb, k, p) if need_sign else None
        ggauss = x.new_zeros(nb, k, p) if need_gauss else None
        gscale = x.new_zeros(nb, m) if need_scale else None
        plan = plan_for(p, x.dtype)
        step = chunk_rows(k * p, x.element_size(), x.device)
        size = min(step, n) * k * p
        ws = [workspace(f"ff{i}", size, x.dtype, x.device) for i in range(4)]
        for b in range(nb):
            gidx = _global_index(pb[b])
            ginv = torch.argsort(gidx)
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                c = r1 - r0
                e = c * k * p
                w0, w1, w2, w3 = (w[:e].view(c, k * p) for w in ws)
                gc = gr[b, r0:r1]
                # a = H (pad(g ⊙ s)) per block
                if m < k * p:
                    w0[:, m:].zero_()
                torch.mul(gc, scb[b], out=w0[:, :m])
                apply_plan(plan, w0.view(c * k, p), w1.view(c * k, p), w2.view(c * k, p))
                a = w1.view(c, k, p)
                if need_gauss or need_scale:
                    q = _first_half(xb[b, r0:r1], sb[b], gidx, plan, w0, w2, w3)
                    if need_gauss:
                        ggauss[b] += (a * q).sum(0)
                    if need_scale:
                        torch.mul(q, gb[b], out=w2.view(c, k, p))
                        apply_plan(plan, w2.view(c * k, p), w3.view(c * k, p), w0.view(c * k, p))
                        gscale[b] += (gc * w3[:, :m]).sum(0)
                if not (need_x or need_sign):
                    continue
                torch.mul(a, gb[b], out=w2.view(c, k, p))
                torch.index_select(w2, 1, ginv, out=w0)
                apply_plan(plan, w0.view(c * k, p), w3.view(c * k, p), w2.view(c * k, p))
                gt = w3.view(c, k, p)[..., :d]
                if need_sign:
                    gsign[b, :, :d] += (gt * xb[b, r0:r1].unsqueeze(1)).sum(0)
                if need_x:
                    gx[b, r0:r1] = torch.einsum("ckd,kd->cd", gt, sb[b, :, :d])

        def back(g: Tensor | None, shape: torch.Size, tail: tuple[int, ...]) -> Tensor | None:
            if g is None:
                return None
            return g.view(*batch, *tail).sum_to_size(shape)

        return (
            back(gx, x.shape, (n, d)),
            back(gsign, sign.shape, (k, p)),
            back(ggauss, gauss.shape, (k, p)),
            back(gscale, scale.shape, (m,)),
            None,
        )


def _project_fwht(x: Tensor, sign: Tensor, perm: Tensor, gauss: Tensor, radius: Tensor) -> Tensor:
    dtype = x.dtype
    scale = row_scale(gauss, radius).to(dtype)
    return _FastfoodFWHT.apply(x, sign.to(dtype), gauss.to(dtype), scale, perm)


def fastfood_matrix(sign: Tensor, perm: Tensor, gauss: Tensor, radius: Tensor, num_dims: int) -> Tensor:
    """The effective frequency matrix ``V`` (first ``d`` columns), shape ``(*batch, M, d)``.

    Differentiable in ``sign``, ``gauss`` and ``radius``.  Computed as the
    projection of the ``d×d`` identity, O(d M log p).

    Args:
        sign, perm, gauss: block state ``(*batch, K, p)``.
        radius: row lengths ``s``, ``(*batch, M)``.
        num_dims: the input dimension d ≤ p.
    """
    return _fastfood_matrix_t(sign, perm, gauss, radius, num_dims).transpose(-1, -2)


def _fastfood_matrix_t(sign: Tensor, perm: Tensor, gauss: Tensor, radius: Tensor, num_dims: int) -> Tensor:
    """``Vᵀ``, ``(*batch, d, M)``, contiguous."""
    eye = torch.eye(num_dims, dtype=sign.dtype, device=sign.device)
    return _project_fwht(eye, sign, perm, gauss, radius)


def choose_strategy(num_dims: int) -> str:
    """The faster of the two equivalent execution paths for inputs of dimension d.

    Rule: ``"dense"`` (materialise V, one GEMM) for ``d ≤ DENSE_MAX_DIM`` (512),
    ``"fwht"`` above.  Both paths scale linearly in M.  One threshold for both dtypes
    is a compromise: in the measured cut-over sweep (``experiments/results/features.md``,
    n = 9000, M = 4096, 2-core AVX-512 CPU) dense is the faster up to d = 256 in both,
    but in float32 the FWHT path was already 1.2× faster at d = 385 and 512, and in
    float64 dense was still the faster at d = 768 (0.71×).
    """
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
        sign, perm, gauss: block state ``(*batch, K, p)``.
        radius: row lengths ``s``, ``(*batch, M)``.
        strategy: ``"fwht"``, ``"dense"`` or ``"auto"`` (:func:`choose_strategy`).

    Returns:
        projections of shape (..., n, M).

    Raises:
        ValueError: if d exceeds the block size p, or for an unknown ``strategy``.
    """
    num_dims = x.shape[-1]
    p = sign.shape[-1]
    if num_dims > p:
        raise ValueError(f"inputs have {num_dims} dimensions but the Fastfood blocks have size {p}")
    if strategy == "auto":
        strategy = choose_strategy(num_dims)
    if strategy == "dense":
        return x @ _fastfood_matrix_t(sign, perm, gauss, radius, num_dims).to(x.dtype)
    if strategy != "fwht":
        raise ValueError(f"unknown strategy {strategy!r}; use 'auto', 'dense' or 'fwht'")
    return _project_fwht(x, sign, perm, gauss, radius)
