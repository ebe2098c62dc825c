"""Woodbury marginal likelihood and posterior of a feature-space GP (docs/mathematics.md §4).

Model: y = μ + Φw + ε, w ~ N(0, I_D), ε ~ N(0, σ²I), r = y − μ.  Everything
depends on the data only through the sufficient statistics ΦᵀΦ, Φᵀr, rᵀr and n,
and on one Cholesky factor of the D×D matrix A = ΦᵀΦ + σ²I:

    −log p(y) = ½σ⁻²(rᵀr − ‖α‖²) + Σ log L_ii + ½(n − D) log σ² + ½ n log 2π,
    α = L⁻¹Φᵀr,  L = chol(A).

Cost O(nD² + D³); no n×n matrix is formed (except when n < D, where
:func:`negative_log_marginal_likelihood_of_rows` reads the identity the other
way round because the n×n matrix is then the smaller one).  Statistics are sums
over rows, so they can be accumulated over chunks or processes.
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from scipy.linalg import blas as scipy_blas
from threadpoolctl import ThreadpoolController
from torch import Tensor

from .ops.autograd import differentiable_backward

__all__ = [
    "NotPositiveDefiniteError",
    "SufficientStatistics",
    "sufficient_statistics",
    "statistics_adjoint",
    "negative_log_marginal_likelihood",
    "negative_log_marginal_likelihood_of_rows",
    "cholesky_with_jitter",
    "collect_jitter",
    "WoodburyPosterior",
]


_SYRK = {torch.float64: scipy_blas.dsyrk, torch.float32: scipy_blas.ssyrk}


@functools.cache
def _scipy_blas() -> ThreadpoolController:
    """scipy's BLAS libraries, so that their calls run on torch's thread count, not their own default."""
    return ThreadpoolController().select(user_api="blas")


def _gram(phi: Tensor, of_rows: bool = False) -> Tensor:
    """ΦᵀΦ (D×D), or ΦΦᵀ (n×n) with ``of_rows``.

    On the CPU by BLAS ``syrk`` (half a GEMM's flops; torch exposes none), on
    as many threads as torch would use, except where autograd is to record it
    (second derivatives).
    """
    syrk = _SYRK.get(phi.dtype) if phi.device.type == "cpu" and phi.dim() == 2 else None
    if syrk is None or (torch.is_grad_enabled() and phi.requires_grad):
        return phi @ phi.transpose(-1, -2) if of_rows else phi.transpose(-1, -2) @ phi
    # A C-ordered n×D array is the Fortran-ordered D×n matrix Φᵀ: no copy; trans=1 gives ΦΦᵀ.
    with _scipy_blas().limit(limits=torch.get_num_threads()):
        upper = torch.from_numpy(syrk(1.0, phi.detach().contiguous().numpy().T, trans=int(of_rows)))
    return symmetrized_(upper)


#: Rows per diagonal tile of :func:`symmetrized_` (a 128×128 float64 tile fits in a core's L2 cache).
_TILE = 128


def symmetrized_(upper: Tensor) -> Tensor:
    """The symmetric matrix whose upper triangle is ``upper``'s (a 2-D square matrix), written over ``upper``.

    Tile by tile, so that every transposed read stays in cache: ``triu() + triu(1).T`` at once took
    6.6× as long at D = 1024 (a tenth of a float32 streamed evaluation, once per chunk)."""
    size = upper.shape[0]
    for first in range(0, size, _TILE):
        last = min(first + _TILE, size)
        block = upper[first:last, first:last]
        block.copy_(block.triu() + block.triu(1).transpose(0, 1))
        upper[last:, first:last].copy_(upper[first:last, last:].transpose(0, 1))
    return upper


class _GramAndProjection(torch.autograd.Function):
    """(ΦᵀΦ, Φᵀr) with the one-product backward ∂/∂Φ = Φ(Ḡ + Ḡᵀ) + r b̄ᵀ.

    Autograd's generic matmul rule would spend two n×D×D products on the
    backward of ΦᵀΦ and materialise r b̄ᵀ separately; here the symmetric form
    needs one product, the rank-one term is added in place, and on the CPU
    the forward runs as a rank-k update (syrk, half a GEMM).
    """

    @staticmethod
    def forward(ctx, phi: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:  # noqa: D102
        ctx.save_for_backward(phi, r)
        phi_r = (r.unsqueeze(-2) @ phi).squeeze(-2)
        return _gram(phi), phi_r

    @staticmethod
    def backward(ctx, grad_gram: Tensor | None, grad_phi_r: Tensor | None):  # noqa: D102
        phi, r = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the closed form below builds no graph
            return differentiable_backward(_gram_and_projection_composed, (phi, r), ctx.needs_input_grad,
                                           (grad_gram, grad_phi_r))
        return statistics_adjoint(phi, r, grad_gram, grad_phi_r, None, need_grad_r=ctx.needs_input_grad[1])


def _gram_and_projection_composed(phi: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    return _gram(phi), (r.unsqueeze(-2) @ phi).squeeze(-2)


def statistics_adjoint(
    phi: Tensor,
    r: Tensor,
    grad_gram: Tensor | None,
    grad_phi_r: Tensor | None,
    grad_r_r: Tensor | None,
    need_grad_r: bool = True,
) -> tuple[Tensor | None, Tensor | None]:
    """Back-propagate adjoints of (ΦᵀΦ, Φᵀr, rᵀr) to the rows that produced them (docs/mathematics.md §4):

        ∂L/∂Φ = Φ(Ā + Āᵀ) + r b̄ᵀ,      ∂L/∂r = 2c̄ r + Φ b̄,

    with Ā = ``grad_gram``, b̄ = ``grad_phi_r``, c̄ = ``grad_r_r`` (any may be
    ``None``).  A sum over rows, so it applies to any chunk of rows on its own:
    the streamed likelihood calls it once per chunk.  The product with the
    symmetric Ā + Āᵀ is a plain GEMM: OpenBLAS's ``symm`` took 1.3× as long as
    torch's GEMM at n = 36 000, D = 1 024 on one thread.

    Args:
        phi: the rows' features Φ (..., n, D).
        r: their residuals r (..., n).
        grad_gram, grad_phi_r, grad_r_r: Ā (..., D, D), b̄ (..., D) and c̄ (...), or ``None`` for a zero adjoint.
        need_grad_r: also compute ∂L/∂r (``False`` skips it and returns ``None`` in its place).

    Returns:
        (∂L/∂Φ, ∂L/∂r), shaped as ``phi`` and ``r``; ``None`` where every adjoint it depends on is.
    """
    grad_phi = grad_r = None
    if grad_gram is not None:
        grad_phi = phi @ (grad_gram + grad_gram.transpose(-1, -2))
    if grad_phi_r is not None:
        if grad_phi is None:
            grad_phi = r.unsqueeze(-1) * grad_phi_r.unsqueeze(-2)
        elif phi.dim() == 2:
            grad_phi.addr_(r, grad_phi_r)  # in place: no n×D temporary
        else:
            grad_phi = grad_phi + r.unsqueeze(-1) * grad_phi_r.unsqueeze(-2)
        if need_grad_r:
            grad_r = (phi @ grad_phi_r.unsqueeze(-1)).squeeze(-1)
    if grad_r_r is not None and need_grad_r:
        term = 2 * grad_r_r.unsqueeze(-1) * r
        grad_r = term if grad_r is None else grad_r + term
    return grad_phi, grad_r


@dataclass
class SufficientStatistics:
    """ΦᵀΦ (..., D, D), Φᵀr (..., D), rᵀr (...), and the number of rows n."""

    gram: Tensor
    phi_r: Tensor
    r_r: Tensor
    n: int

    def __add__(self, other: "SufficientStatistics") -> "SufficientStatistics":
        return SufficientStatistics(
            self.gram + other.gram, self.phi_r + other.phi_r, self.r_r + other.r_r, self.n + other.n
        )

    @property
    def num_features(self) -> int:
        return self.gram.shape[-1]

    def detach(self) -> "SufficientStatistics":
        """The same statistics without their autograd graph (the tensors are shared, not copied)."""
        return SufficientStatistics(self.gram.detach(), self.phi_r.detach(), self.r_r.detach(), self.n)


def sufficient_statistics(phi: Tensor, r: Tensor) -> SufficientStatistics:
    """Statistics of features Φ (..., n, D) and residuals r (..., n).

    Differentiable in Φ and r (with the closed-form adjoint of :func:`statistics_adjoint`);
    leading batch dimensions broadcast.

    Raises:
        ValueError: if ``phi`` is not (..., n, D) with one residual per row.
    """
    _check_rows(phi, r)
    batch = torch.broadcast_shapes(phi.shape[:-2], r.shape[:-1])
    if phi.shape[:-2] != batch:
        phi = phi.expand(*batch, *phi.shape[-2:])
    if r.shape[:-1] != batch:
        r = r.expand(*batch, r.shape[-1])
    gram_, phi_r = _GramAndProjection.apply(phi, r)
    return SufficientStatistics(gram=gram_, phi_r=phi_r, r_r=(r * r).sum(-1), n=phi.shape[-2])


def _check_rows(phi: Tensor, r: Tensor) -> None:
    """Φ (..., n, D) and r (..., n): else torch fails inside a product, naming only its own operands."""
    if phi.dim() < 2 or r.dim() < 1 or r.shape[-1] != phi.shape[-2]:
        raise ValueError(f"features Φ must have shape (..., n, D) and residuals r (..., n), one per row of Φ; got "
                         f"{tuple(phi.shape)} and {tuple(r.shape)}")


class NotPositiveDefiniteError(ValueError):
    """A = ΦᵀΦ + σ²I (or K = ΦΦᵀ + σ²I) could not be factorised even with jitter, or σ² ≤ 0."""


# While a list is set here, cholesky_with_jitter records the relative jitter it adds
# instead of warning, so that a training loop can warn once rather than per iteration.
_jitter_record: ContextVar[list[float] | None] = ContextVar("alacarte_jitter_record", default=None)


@contextlib.contextmanager
def collect_jitter() -> Iterator[list[float]]:
    """Within the block, :func:`cholesky_with_jitter` appends each jitter it adds
    (relative to mean(diag A)) to the yielded list instead of warning."""
    record: list[float] = []
    token = _jitter_record.set(record)
    try:
        yield record
    finally:
        _jitter_record.reset(token)


def cholesky_with_jitter(a: Tensor, max_tries: int = 6) -> Tensor:
    """Cholesky factor of a symmetric positive-definite matrix.

    If the factorisation fails (A is numerically singular, e.g. duplicated
    inputs with a tiny noise in float32), jitter ``c·mean(diag A)`` is added,
    with c growing tenfold from the dtype's epsilon, and a warning says how much
    (inside :func:`collect_jitter` the amount is recorded instead).

    Args:
        a: symmetric positive-definite matrices (..., D, D).
        max_tries: jitters tried (10ε, 100ε, …) after the plain factorisation fails.

    Returns:
        The lower-triangular factor L, A (+ jitter) = L Lᵀ.

    Raises:
        NotPositiveDefiniteError: if every jitter fails too (non-finite entries, or a noise far
            too small for the dtype).
    """
    factor, info = torch.linalg.cholesky_ex(a)
    if not bool((info != 0).any()):
        return factor
    scale = a.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True).detach()
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    jitter = torch.finfo(a.dtype).eps * 10
    for _ in range(max_tries):
        factor, info = torch.linalg.cholesky_ex(a + (jitter * scale).unsqueeze(-1) * eye)
        if not bool((info != 0).any()):
            record = _jitter_record.get()
            if record is not None:
                record.append(jitter)
            else:
                warnings.warn(
                    f"ΦᵀΦ + σ²I (ΦΦᵀ + σ²I when n < D) was not numerically positive definite; added jitter "
                    f"{jitter:.1e}×its mean diagonal (≈{float(jitter * scale.max()):.3g}) to its diagonal. "
                    "Consider a larger noise lower bound or float64.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return factor
        jitter *= 10
    raise NotPositiveDefiniteError(
        "ΦᵀΦ + σ²I (ΦΦᵀ + σ²I when n < D) is not positive definite even with jitter: the features or the "
        "noise contain non-finite values, or the noise is far too small for this dtype"
    )


def refuse_nonpositive_noise(noise: Tensor, error: type[ValueError] = ValueError, where: str = "") -> None:
    """Raise ``error`` if any σ² in ``noise`` is ≤ 0 (``where``: what the message adds after the value)."""
    if bool((noise <= 0).any()):
        raise error(f"the noise variance σ² must be positive, got {noise.detach().min().item():g}{where} (a "
                    "likelihood whose noise constraint allows 0 can reach it: give it a positive lower bound)")


def _shifted(gram: Tensor, noise: Tensor) -> Tensor:
    """A = ΦᵀΦ + σ²I (or ΦΦᵀ + σ²I), for a noise variance σ² > 0.

    σ² ≤ 0 is refused: the forms here (σ²A⁻¹, log σ²) are not their σ² → 0 limits, so σ² = 0
    would give latent variances of exactly 0 where ΦᵀΦ is singular (D > n) and a NaN loss, and
    a negative σ² a finite loss wherever ΦΦᵀ + σ²I stays positive definite."""
    # The error training takes for a failed step (as for a NaN σ²): a line-search probe can underflow a
    # softplus noise with no lower bound to exactly 0, and that must not end the fit.
    refuse_nonpositive_noise(noise, NotPositiveDefiniteError)
    return gram + noise[..., None, None] * torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)


def negative_log_marginal_likelihood(stats: SufficientStatistics, noise: Tensor) -> Tensor:
    """−log p(y) (summed over the n points) from the sufficient statistics.

    Args:
        stats: ΦᵀΦ, Φᵀr, rᵀr, n.
        noise: σ², shape broadcastable to the batch shape of the statistics.

    Returns:
        −log p(y), of the statistics' batch shape; differentiable in the statistics and σ².

    Raises:
        NotPositiveDefiniteError: if σ² ≤ 0, or A = ΦᵀΦ + σ²I cannot be factorised even with jitter.

    Example:
        >>> import torch
        >>> from alacarte.woodbury import negative_log_marginal_likelihood, sufficient_statistics
        >>> from torch.distributions import MultivariateNormal
        >>> generator = torch.Generator().manual_seed(0)
        >>> phi = torch.randn(50, 8, generator=generator, dtype=torch.float64)   # n = 50 rows, D = 8
        >>> r = torch.randn(50, generator=generator, dtype=torch.float64)
        >>> noise = torch.tensor(0.1, dtype=torch.float64)
        >>> loss = negative_log_marginal_likelihood(sufficient_statistics(phi, r), noise)
        >>> K = phi @ phi.T + noise * torch.eye(50, dtype=torch.float64)   # the n×n way
        >>> torch.allclose(loss, -MultivariateNormal(torch.zeros_like(r), K).log_prob(r))
        True
    """
    noise = torch.as_tensor(noise, dtype=stats.gram.dtype, device=stats.gram.device)
    return _NegativeLogMarginalLikelihood.apply(stats.gram, stats.phi_r, stats.r_r, noise, stats.n)


def negative_log_marginal_likelihood_of_rows(phi: Tensor, r: Tensor, noise: Tensor) -> Tensor:
    """The same −log p(y) from the rows themselves, through K = ΦΦᵀ + σ²I (n×n):

        −log p(y) = ½ rᵀK⁻¹r + ½ log|K| + ½ n log 2π.

    For n < D this costs O(n²D + n³) time and n² memory instead of O(nD² + D³)
    and D² (a 93-point dataset with D = 1024: a 93×93 factor, not 1024×1024).
    It is the statistics path transposed, with the same closed-form adjoint,
    so the two cost the same at n = D.

    Args:
        phi: features (..., n, D).
        r: residuals y − μ, (..., n).
        noise: σ², broadcastable to the batch shape.

    Returns:
        −log p(y), of the batch shape; differentiable in Φ, r and σ².

    Raises:
        ValueError: if ``phi`` is not (..., n, D) with one residual per row.
        NotPositiveDefiniteError: if σ² ≤ 0, or K cannot be factorised even with jitter.
    """
    _check_rows(phi, r)
    noise = torch.as_tensor(noise, dtype=phi.dtype, device=phi.device)
    batch = torch.broadcast_shapes(phi.shape[:-2], r.shape[:-1], noise.shape)
    phi = phi.expand(*batch, *phi.shape[-2:])
    r = r.expand(*batch, r.shape[-1])
    return _RowsNegativeLogMarginalLikelihood.apply(phi, r, noise)


class _RowsNegativeLogMarginalLikelihood(torch.autograd.Function):
    r"""−log p(y) from (Φ, r, σ²) through K = ΦΦᵀ + σ²I, with its closed-form adjoint.

    With α = K⁻¹r and ℓ = −log p(y), ∂ℓ/∂K = ½(K⁻¹ − ααᵀ), hence

    .. math::
        \frac{∂ℓ}{∂Φ} = (K^{-1} − αα^ᵀ)Φ,\quad \frac{∂ℓ}{∂r} = α,\quad
        \frac{∂ℓ}{∂σ²} = ½(\operatorname{tr}K^{-1} − ‖α‖²):

    one ``cholesky_inverse`` and one symmetric n×n by n×D product, like the
    D×D path's adjoint with the roles of n and D exchanged.  Under
    ``create_graph=True`` (second derivatives) the backward differentiates the
    forward's own operations instead.
    """

    @staticmethod
    def forward(ctx, phi: Tensor, r: Tensor, noise: Tensor) -> Tensor:  # noqa: D102
        value, factor, alpha = _rows_terms(phi, r, noise)
        ctx.save_for_backward(phi, r, noise, factor, alpha)
        ctx.noise_shape = noise.shape
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        phi, r, noise, factor, alpha = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the closed form below builds no graph
            return differentiable_backward(lambda *inputs: _rows_terms(*inputs)[0], (phi, r, noise),
                                           ctx.needs_input_grad, (grad,))
        grads = [None, None, None]
        inverse = torch.cholesky_inverse(factor) if ctx.needs_input_grad[0] or ctx.needs_input_grad[2] else None
        if ctx.needs_input_grad[0]:
            sym = grad[..., None, None] * (inverse - alpha.unsqueeze(-1) * alpha.unsqueeze(-2))
            grads[0] = sym @ phi
        if ctx.needs_input_grad[1]:
            grads[1] = grad.unsqueeze(-1) * alpha
        if ctx.needs_input_grad[2]:
            trace = inverse.diagonal(dim1=-2, dim2=-1).sum(-1)
            grads[2] = _sum_to_shape(0.5 * grad * (trace - alpha.pow(2).sum(-1)), ctx.noise_shape)
        return tuple(grads)


def _rows_terms(phi: Tensor, r: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """−log p(y) through K = ΦΦᵀ + σ²I, with chol(K) and α = K⁻¹r."""
    n = phi.shape[-2]
    factor = cholesky_with_jitter(_shifted(_gram(phi, of_rows=True), noise))
    whitened = torch.linalg.solve_triangular(factor, r.unsqueeze(-1), upper=False)
    alpha = torch.linalg.solve_triangular(factor.transpose(-1, -2), whitened, upper=True).squeeze(-1)
    quad = whitened.squeeze(-1).pow(2).sum(-1)
    value = 0.5 * quad + factor.diagonal(dim1=-2, dim2=-1).log().sum(-1) + 0.5 * n * math.log(2 * math.pi)
    return value, factor, alpha


def _sum_to_shape(grad: Tensor, shape: torch.Size) -> Tensor:
    """Undo broadcasting: sum ``grad`` down to ``shape``."""
    extra = grad.dim() - len(shape)
    if extra > 0:
        grad = grad.sum(tuple(range(extra)))
    dims = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    return grad.sum(dims, keepdim=True) if dims else grad


class _NegativeLogMarginalLikelihood(torch.autograd.Function):
    r"""−log p(y) from (ΦᵀΦ, Φᵀr, rᵀr, σ²) with its closed-form adjoint.

    With A = ΦᵀΦ + σ²I, w = A⁻¹Φᵀr and ℓ = −log p(y):

    .. math::
        \frac{∂ℓ}{∂(ΦᵀΦ)} = ½(A^{-1} + σ^{-2} w wᵀ),\quad
        \frac{∂ℓ}{∂(Φᵀr)} = −σ^{-2} w,\quad
        \frac{∂ℓ}{∂(rᵀr)} = ½σ^{-2},\quad
        \frac{∂ℓ}{∂σ²} = ½\big(\operatorname{tr}A^{-1} + σ^{-2}‖w‖² − σ^{-4}(rᵀr − (Φᵀr)ᵀw) + (n − D)σ^{-2}\big).

    Autograd through the Cholesky factorisation and the triangular solve costs
    several D³ products in the backward pass; this costs one ``cholesky_inverse``
    (for small n, the D³ terms dominate a training step, so this halves it).
    Under ``create_graph=True`` (second derivatives) the backward differentiates
    the forward's own operations instead.
    """

    @staticmethod
    def forward(ctx, gram: Tensor, phi_r: Tensor, r_r: Tensor, noise: Tensor, n: int) -> Tensor:  # noqa: D102
        value, factor, weights, residual = _statistics_terms(gram, phi_r, r_r, noise, n)
        ctx.save_for_backward(gram, phi_r, r_r, noise, factor, weights, residual)
        ctx.n = n
        ctx.shapes = (gram.shape, phi_r.shape, r_r.shape, noise.shape)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        gram, phi_r, r_r, noise, factor, weights, residual = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the closed form below builds no graph
            grads = differentiable_backward(lambda *inputs: _statistics_terms(*inputs, ctx.n)[0],
                                            (gram, phi_r, r_r, noise), ctx.needs_input_grad[:4], (grad,))
            return (*grads, None)
        gram_shape, phi_r_shape, r_r_shape, noise_shape = ctx.shapes
        num_features = factor.shape[-1]
        half = 0.5 * grad
        grads = [None, None, None, None]
        inverse = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[3]:
            inverse = torch.cholesky_inverse(factor)
        if ctx.needs_input_grad[0]:
            outer = (weights / noise.unsqueeze(-1)).unsqueeze(-1) * weights.unsqueeze(-2)
            grads[0] = _sum_to_shape(half[..., None, None] * (inverse + outer), gram_shape)
        if ctx.needs_input_grad[1]:
            grads[1] = _sum_to_shape(-(grad / noise).unsqueeze(-1) * weights, phi_r_shape)
        if ctx.needs_input_grad[2]:
            grads[2] = _sum_to_shape(half / noise, r_r_shape)
        if ctx.needs_input_grad[3]:
            trace = inverse.diagonal(dim1=-2, dim2=-1).sum(-1)
            d_noise = trace + ((weights * weights).sum(-1) - residual / noise + ctx.n - num_features) / noise
            grads[3] = _sum_to_shape(half * d_noise, noise_shape)
        return (*grads, None)


def _statistics_terms(gram: Tensor, phi_r: Tensor, r_r: Tensor, noise: Tensor, n: int
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """−log p(y) from the statistics, with chol(A), w = A⁻¹Φᵀr and rᵀr − (Φᵀr)ᵀw."""
    num_features = gram.shape[-1]
    factor = cholesky_with_jitter(_shifted(gram, noise))
    alpha = torch.linalg.solve_triangular(factor, phi_r.unsqueeze(-1), upper=False)
    weights = torch.linalg.solve_triangular(factor.transpose(-1, -2), alpha, upper=True).squeeze(-1)
    alpha = alpha.squeeze(-1)
    residual = r_r - (alpha * alpha).sum(-1)  # rᵀr − (Φᵀr)ᵀA⁻¹Φᵀr ≥ 0
    logdet = 2 * factor.diagonal(dim1=-2, dim2=-1).log().sum(-1) + (n - num_features) * noise.log()
    return 0.5 * (residual / noise + logdet + n * math.log(2 * math.pi)), factor, weights, residual


class WoodburyPosterior:
    """The Gaussian posterior over the feature weights, w | y ~ N(A⁻¹Φᵀr, σ²A⁻¹).

    Holds L = chol(A) and the mean weights; predictions cost O(D²) per point:

        mean = μ + φ*ᵀA⁻¹Φᵀr,   var f* = σ²‖L⁻¹φ*‖²,   var y* = var f* + σ².

    Args:
        stats: the training rows' ΦᵀΦ, Φᵀr, rᵀr and n (:func:`sufficient_statistics`).
        noise: σ² > 0, broadcastable to the statistics' batch shape.

    Raises:
        NotPositiveDefiniteError: if σ² ≤ 0, or A cannot be factorised even with jitter.
    """

    def __init__(self, stats: SufficientStatistics, noise: Tensor):
        self.noise = torch.as_tensor(noise, dtype=stats.gram.dtype, device=stats.gram.device)
        self.cholesky = cholesky_with_jitter(_shifted(stats.gram, self.noise))
        self.weights = torch.cholesky_solve(stats.phi_r.unsqueeze(-1), self.cholesky).squeeze(-1)

    @classmethod
    def from_factor(cls, cholesky: Tensor, weights: Tensor, noise: Tensor) -> "WoodburyPosterior":
        """The posterior from a stored factor L, mean weights and σ² (as saved models keep it)."""
        posterior = cls.__new__(cls)
        posterior.cholesky, posterior.weights, posterior.noise = cholesky, weights, noise
        return posterior

    def whiten(self, phi_star: Tensor) -> Tensor:
        """σ L⁻¹φ* for every row: (..., m, D) → (..., m, D); ‖row‖² is var f*.

        Computed in the posterior's dtype (e.g. float64 statistics of a float32
        model) and returned in the dtype of ``phi_star``."""
        solved = torch.linalg.solve_triangular(
            self.cholesky, phi_star.to(self.cholesky.dtype).transpose(-1, -2), upper=False
        )
        return (solved.transpose(-1, -2) * self.noise.sqrt()[..., None, None]).to(phi_star.dtype)

    def mean(self, phi_star: Tensor) -> Tensor:
        """φ*ᵀA⁻¹Φᵀr (without the prior mean μ): (..., m, D) → (..., m)."""
        return (phi_star.to(self.weights.dtype) @ self.weights.unsqueeze(-1)).squeeze(-1).to(phi_star.dtype)

    def latent_variance(self, phi_star: Tensor) -> Tensor:
        """var f* = σ²‖L⁻¹φ*‖²: (..., m, D) → (..., m)."""
        return self.whiten(phi_star).pow(2).sum(-1)
