"""Float32 features with float64 statistics: the big products in float32, the sums in float64 (docs/mathematics.md §4).

A chunk's ΦᵀΦ is formed by float32 products over blocks of :data:`BLOCK_ROWS`
rows, and the blocks' D×D results are added in float64; Φᵀr and rᵀr (O(nD),
cheap) are formed in float64.  The backward's n×D×D product runs in float32
on a D×D adjoint rounded to float32 (:func:`mixed_adjoint`).  The Cholesky
factor, the loss and the adjoints Ā, b̄, c̄ stay in the statistics' dtype.
:data:`BLOCK_ROWS`, :data:`MIN_NOISE` and :func:`float32_products` are the policy, here alone.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from .woodbury import SufficientStatistics, statistics_adjoint, sufficient_statistics, symmetrized_

__all__ = ["BLOCK_ROWS", "MIN_NOISE", "PANEL_COLUMNS", "float32_products", "chunk_statistics", "chunk_adjoint",
           "mixed_statistics", "mixed_adjoint"]

#: Rows per float32 product whose D×D result is added in float64: float32 sums over fewer rows round
#: less, but each block adds a D×D float64 sum and smaller GEMMs (experiments/results/mixed_precision.md).
BLOCK_ROWS = 256
#: Rows of ΦᵀΦ per GEMM when a block's ΦᵀΦ is formed (see :func:`_add_upper_gram_`).
PANEL_COLUMNS = 128


#: Below this noise variance σ² (in the model's standardised units) float64 statistics of float32
#: features are formed from widened features: the float32 sums' error, amplified by σ⁻², would
#: then exceed ~1e-5 of the loss and can leave ΦᵀΦ + σ²I indefinite (σ² = 1e-6: no Cholesky factor).
MIN_NOISE = 1e-3


def float32_products(features_dtype: torch.dtype, statistics_dtype: torch.dtype, noise: float) -> bool:
    """Whether features and statistics of these dtypes, at noise variance ``noise``, take the
    float32-products path."""
    return features_dtype == torch.float32 and statistics_dtype == torch.float64 and noise >= MIN_NOISE


def chunk_statistics(phi: Tensor, r: Tensor, dtype: torch.dtype, noise: float) -> SufficientStatistics:
    """A chunk's statistics in ``dtype``: float32 products summed in float64 where
    :func:`float32_products` says so (:func:`mixed_statistics`), else in ``dtype`` throughout."""
    if float32_products(phi.dtype, dtype, noise):
        return mixed_statistics(phi, r, dtype)
    return sufficient_statistics(phi.detach().to(dtype), r.detach().to(dtype))


def chunk_adjoint(features_dtype: torch.dtype, noise: float, grad_gram: Tensor | None, grad_phi_r: Tensor | None,
                  grad_r_r: Tensor | None) -> Callable[[Tensor, Tensor], tuple[Tensor | None, Tensor | None]]:
    """The function of a chunk's (Φ, r) giving its (∂L/∂Φ, ∂L/∂r) from adjoints in the statistics'
    dtype: its n×D×D product in float32 where :func:`float32_products` says so (:func:`mixed_adjoint`),
    else all in the statistics' dtype (:func:`~alacarte.woodbury.statistics_adjoint`)."""
    dtype = next((a.dtype for a in (grad_gram, grad_phi_r, grad_r_r) if a is not None), features_dtype)
    if float32_products(features_dtype, dtype, noise):
        return mixed_adjoint(grad_gram, grad_phi_r, grad_r_r)
    return lambda phi, r: statistics_adjoint(phi.detach().to(dtype), r.detach().to(dtype),
                                             grad_gram, grad_phi_r, grad_r_r)


def mixed_statistics(phi: Tensor, r: Tensor, dtype: torch.dtype = torch.float64,
                     block_rows: int | None = None) -> SufficientStatistics:
    """ΦᵀΦ, Φᵀr, rᵀr and n of float32 rows Φ (n, D), r (n,), summed in ``dtype`` over blocks of
    ``block_rows`` rows (default :data:`BLOCK_ROWS`), each block's ΦᵀΦ in float32.  No autograd."""
    block_rows = block_rows or BLOCK_ROWS
    phi, r = phi.detach(), r.detach()
    n, num_features = phi.shape
    upper = torch.zeros(num_features, num_features, dtype=dtype, device=phi.device)
    phi_r = torch.zeros(num_features, dtype=dtype, device=phi.device)
    product = torch.empty(min(PANEL_COLUMNS, num_features) * num_features, dtype=phi.dtype, device=phi.device)
    for rows, wide in _widened_blocks(phi, block_rows, dtype):
        _add_upper_gram_(upper, phi[rows], product)
        # Exact float64 products: a float32 Φᵀr moved the loss ~5× more than a float32 ΦᵀΦ.
        phi_r += r[rows].to(dtype) @ wide
    return SufficientStatistics(symmetrized_(upper), phi_r, r.to(dtype).square().sum(), n)


def _widened_blocks(phi: Tensor, block_rows: int, dtype: torch.dtype) -> Iterator[tuple[slice, Tensor]]:
    """(rows, Φ[rows] in ``dtype``) for consecutive blocks of rows, widened into one reused buffer
    (a fresh allocation per block costs page faults as long as the copy)."""
    buffer = torch.empty(min(block_rows, phi.shape[0]), phi.shape[1], dtype=dtype, device=phi.device)
    for start in range(0, phi.shape[0], block_rows):
        rows = slice(start, min(start + block_rows, phi.shape[0]))
        wide = buffer[: rows.stop - start]
        wide.copy_(phi[rows])
        yield rows, wide


def _add_upper_gram_(upper: Tensor, block: Tensor, product: Tensor) -> None:
    """Add the block's ΦᵀΦ to ``upper`` on and above its diagonal blocks, a panel of
    :data:`PANEL_COLUMNS` rows at a time: torch GEMMs that skip most of the lower triangle
    (8 panels of D = 1024: 56% of the flops), where scipy's float32 syrk ran at half their speed.
    Each panel's product goes to ``product`` (a reused float32 buffer of at least
    PANEL_COLUMNS·D elements); on the CPU numpy adds it in float64, in half the time of torch's
    mixed-dtype ``add_``, which widens the whole panel into a fresh temporary first."""
    num_features = block.shape[-1]
    for first in range(0, num_features, PANEL_COLUMNS):
        last = min(first + PANEL_COLUMNS, num_features)
        panel = product[: (last - first) * (num_features - first)].view(last - first, num_features - first)
        torch.mm(block[:, first:last].transpose(0, 1), block[:, first:], out=panel)
        target = upper[first:last, first:]
        if target.device.type == "cpu":
            np.add(target.numpy(), panel.numpy(), out=target.numpy())
        else:
            target.add_(panel)


def mixed_adjoint(grad_gram: Tensor | None, grad_phi_r: Tensor | None, grad_r_r: Tensor | None
                  ) -> Callable[[Tensor, Tensor], tuple[Tensor | None, Tensor | None]]:
    """:func:`~alacarte.woodbury.statistics_adjoint` for float32 rows (Φ, r) and float64 adjoints,
    as a function of the rows: the n×D×D product in float32, the rest in float64, the results
    rounded to float32.

    With e = r + Φb̄/(2c̄) and S = Ā + Āᵀ − b̄b̄ᵀ/(2c̄), the same adjoint reads

        ∂L/∂Φ = ΦS + e b̄ᵀ,      ∂L/∂r = 2c̄ e.

    For the likelihood e = r − Φw is the fit's residual and S = A⁻¹ times the loss's scale:
    ΦS no longer cancels against r b̄ᵀ (σ⁻²Φwwᵀ against σ⁻²rwᵀ), so float32 rounding of ΦS
    is not amplified by ‖r‖/‖e‖ (on energy, 10× less gradient error), and e, an O(nD)
    product, is formed in float64.  S is formed once, for all chunks.
    """
    if grad_gram is None or grad_phi_r is None or grad_r_r is None or not bool(grad_r_r != 0):
        narrow = [None if a is None else a.to(torch.float32) for a in (grad_gram, grad_phi_r, grad_r_r)]
        return lambda phi, r: statistics_adjoint(phi.detach(), r.detach(), *narrow)
    dtype = grad_gram.dtype
    scale = 1 / (2 * grad_r_r)
    # Formed once for all chunks: a D×D sum with its transpose per chunk cost 9 ms each (strided reads).
    sym = (grad_gram + grad_gram.transpose(-1, -2) - scale * torch.outer(grad_phi_r, grad_phi_r)).to(torch.float32)
    narrow_phi_r = grad_phi_r.to(torch.float32)

    def adjoint(phi: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        phi = phi.detach()
        grad_phi = phi @ sym
        residual = r.detach().to(dtype)
        for rows, wide in _widened_blocks(phi, BLOCK_ROWS, dtype):
            residual[rows] += scale * (wide @ grad_phi_r)
        grad_phi.addr_(residual.to(phi.dtype), narrow_phi_r)
        return grad_phi, (2 * grad_r_r * residual).to(phi.dtype)

    return adjoint
