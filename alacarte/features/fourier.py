"""Symmetric (cos, sin) random Fourier features, docs/mathematics.md §1.

``φ(x) = scale ⊙ [cos(P), sin(P)]`` for projections ``P = x Ωᵀ`` of shape
(..., n, M), with ``scale = σ_f / sqrt(M)`` (or one weight per frequency).  One
fused autograd function writes both halves straight into the output and keeps
only that output for the backward pass, which needs nothing else:

    ∂/∂P = g_sin ⊙ φ_cos − g_cos ⊙ φ_sin,      ∂/∂scale = Σ g ⊙ φ / scale.

So the map costs one n×D buffer and no extra passes.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["fourier_features"]


def _both_halves(scale: Tensor) -> Tensor:
    """A per-frequency weight (…, M) applies to the cos and the sin feature."""
    return scale if scale.dim() == 0 or scale.shape[-1] == 1 else torch.cat([scale, scale], -1)


class _FourierFeatures(torch.autograd.Function):
    @staticmethod
    def forward(ctx, proj: Tensor, scale: Tensor) -> Tensor:  # noqa: D102
        m = proj.shape[-1]
        out = proj.new_empty(*proj.shape[:-1], 2 * m)
        torch.cos(proj, out=out[..., :m])
        torch.sin(proj, out=out[..., m:])
        out.mul_(_both_halves(scale))
        ctx.save_for_backward(out, scale)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        out, scale = ctx.saved_tensors
        m = out.shape[-1] // 2
        grad_proj = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_proj = torch.mul(grad[..., m:], out[..., :m]).addcmul_(grad[..., :m], out[..., m:], value=-1)
        if ctx.needs_input_grad[1]:
            if scale.numel() == 1:  # one σ_f: a dot product, no n×D temporary
                grad_scale = torch.vdot(grad.reshape(-1), out.reshape(-1)).reshape(scale.shape) / scale
            else:
                prod = grad * out
                if scale.shape[-1] != 1:
                    prod = prod[..., :m] + prod[..., m:]
                grad_scale = prod.sum_to_size(scale.shape) / scale
        return grad_proj, grad_scale


def fourier_features(proj: Tensor, scale: Tensor) -> Tensor:
    """``scale ⊙ [cos(proj), sin(proj)]``.

    Args:
        proj: projections ``ωᵢᵀx`` of shape (..., n, M).
        scale: positive, broadcastable to (..., n, 1) (one weight for all
            features, e.g. ``σ_f/sqrt(M)``) or to (..., 1, M) (a weight per
            frequency, applied to both its cos and its sin feature).

    Returns:
        features of shape (..., n, 2M).
    """
    proj = proj.expand(torch.broadcast_shapes(proj.shape, scale.shape))
    return _FourierFeatures.apply(proj, scale)
