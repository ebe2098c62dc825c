"""Fast Walsh–Hadamard transform along the last dimension.

``fwht(x)`` returns ``x @ H_p`` for the unnormalised Sylvester-ordered Hadamard
matrix ``H_p`` (entries ±1, ``H_p @ H_p = p I``), for any batch shape, in
O(p log p) per row.  ``H_p`` is symmetric, so the backward pass is the same
transform applied to the output gradient.

How it is fast (plain torch ops, CPU or CUDA)
---------------------------------------------
A one-op-per-stage butterfly is memory-bound: each of its ``log2 p`` stages
streams the whole array through memory.  Instead the transform uses the
Kronecker factorisation ``H_p = H_{f_1} ⊗ … ⊗ H_{f_k} ⊗ H_w`` (factors act on
disjoint bit groups of the column index and commute):

* ``H_w`` (``w`` = 16 or 32) on the lowest bits is one small GEMM: rows viewed
  as ``(·, w)`` times the ``w×w`` Hadamard block;
* a factor ``H_f`` on a bit group with ``T`` trailing columns is a batched GEMM
  ``H_f @ X`` on the view ``(·, f, T)`` — efficient once ``T`` is large;
* the bits left in between are radix-2 stages written with ``out=``.

Intermediate results ping-pong between the output rows and one cached
workspace, over row chunks of about :data:`CHUNK_BYTES`, so that every pass
after the first stays in the CPU cache.  Small ``p`` is one GEMM with the
block-diagonal ``I ⊗ H_p`` (16 columns wide) or with ``H_p`` itself.
:func:`plan_for` is the dispatch rule (measured by ``experiments/bench_fwht.py``).
"""
from __future__ import annotations

import functools
import os
import threading

import torch
from torch import Tensor

__all__ = ["fwht", "hadamard_matrix", "plan_for"]

#: Row chunks hold about this many bytes, so that the passes stay in L2.
CHUNK_BYTES = 1 << 20

#: Schemes :func:`fwht_scheme` can run (the dispatcher picks one per ``p``).
SCHEMES = ("dense", "blockdiag", "radix2", "gemm_radix2", "kron")


def _check_power_of_two(p: int) -> None:
    if p < 1 or p & (p - 1):
        raise ValueError(
            f"fwht needs a last dimension that is a power of two (1, 2, 4, …), got {p}; "
            "zero-pad the input to the next power of two first"
        )


@functools.lru_cache(maxsize=128)
@torch.inference_mode(False)  # cached for later calls: never an inference tensor
def _hadamard_cached(p: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < p:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@functools.lru_cache(maxsize=128)
@torch.inference_mode(False)
def _blockdiag_cached(p: int, width: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``I_{width/p} ⊗ H_p`` (width × width)."""
    eye = torch.eye(width // p, dtype=dtype, device=device)
    return torch.kron(eye, _hadamard_cached(p, dtype, device)).contiguous()


def hadamard_matrix(p: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> Tensor:
    """The dense p×p Sylvester Hadamard matrix (for small blocks and tests only).

    Raises:
        ValueError: if ``p`` is not a power of two.
    """
    _check_power_of_two(p)
    return _hadamard_cached(p, dtype, torch.device(device)).clone()


# --------------------------------------------------------------------------- workspaces
_WORKSPACES: dict[tuple, Tensor] = {}

# The buffers are shared by every thread: unlocked, two threads transforming at once would write into
# each other's scratch (wrong numbers, silently).  A lock rather than per-thread buffers: on a GPU a workspace holds
# the whole input, and autograd's device threads would duplicate it.
_WORKSPACE_LOCK = threading.RLock()


def _new_lock_after_fork() -> None:
    # A child forked (e.g. a DataLoader worker) while another thread of its parent held the lock
    # would inherit it held, by a thread it does not have: its first transform would wait forever.
    global _WORKSPACE_LOCK
    _WORKSPACE_LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def holding_workspaces(fn):
    """Run ``fn`` holding the workspace lock: every function that takes a :func:`workspace` needs it."""

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with _WORKSPACE_LOCK:
            return fn(*args, **kwargs)

    return locked


def workspace(slot: str, numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A cached flat scratch buffer of at least ``numel`` elements (grown on demand).

    Scratch only: never return it (or a view of it) to a caller, and use it only inside a
    function decorated with :func:`holding_workspaces`.
    """
    key = (slot, dtype, device)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        # Never an inference tensor: one made under torch.inference_mode() could not be written outside it.
        with torch.inference_mode(False):
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
        _WORKSPACES[key] = buf
    return buf[:numel]


def chunk_rows(row_numel: int, element_size: int, device: torch.device) -> int:
    """Rows per chunk so that a chunk holds about :data:`CHUNK_BYTES` (all rows on GPUs)."""
    if device.type != "cpu":
        return 1 << 62
    return max(1, CHUNK_BYTES // (row_numel * element_size))


# --------------------------------------------------------------------------- plans
def plan_for(p: int, dtype: torch.dtype = torch.float32, scheme: str = "auto") -> tuple:
    """The sequence of passes that applies ``H_p`` (the dispatch rule).

    Steps: ``("mm", w)`` — GEMM with the w×w block on the lowest bits (``w = p``
    is the dense transform, ``w > p`` the block-diagonal ``I ⊗ H_p``);
    ``("bmm", f, T)`` — ``H_f`` on the view ``(·, f, T)``; ``("r2", h)`` — a
    radix-2 stage pairing columns ``h`` apart.

    Rule ("auto", measured on a 2-core AVX-512 CPU, see
    ``experiments/results/fwht.md``): ``p = 1`` is a copy; ``p ≤ 64`` is one GEMM
    (16 columns wide for ``p < 16``); larger ``p`` is ``H_16`` as a GEMM,
    then ``H_16`` / ``H_8`` batched GEMMs on the top bit groups while at least 128
    trailing columns remain, then radix-2 stages for the bits in between.

    Args:
        p: the transform size, a power of two.
        dtype: the data's dtype; the rule does not depend on it (the same plan for every dtype).
        scheme: ``"auto"`` (the rule above) or one of :data:`SCHEMES`.

    Returns:
        The steps, a tuple of the tuples above (empty for ``p = 1``).

    Raises:
        ValueError: if ``p`` is not a power of two, or for an unknown ``scheme``.
    """
    _check_power_of_two(p)
    if scheme == "auto":
        scheme = "blockdiag" if p <= 64 else "kron"
    bits = p.bit_length() - 1
    if p == 1:
        return ()
    if scheme == "dense":
        return (("mm", p),)
    if scheme == "blockdiag":
        return (("mm", max(p, 16)),)
    if scheme == "radix2":
        return tuple(("r2", 1 << b) for b in range(bits))
    low = min(bits, 4)
    steps = [("mm", 1 << low)]
    if scheme == "gemm_radix2":
        return tuple(steps + [("r2", 1 << b) for b in range(low, bits)])
    if scheme != "kron":
        raise ValueError(f"unknown fwht scheme {scheme!r}; choose from {SCHEMES} or 'auto'")
    top = bits
    bmms = []
    while top > low:
        k = min(4, top - low)
        if (1 << (top - k)) < 128:
            break
        bmms.append(("bmm", 1 << k, 1 << (top - k)))
        top -= k
    stages = [("r2", 1 << b) for b in range(low, top)]
    return tuple(steps + stages + bmms[::-1])


def _run_step(step: tuple, src: Tensor, dst: Tensor) -> None:
    """One pass ``src → dst`` (both contiguous with the same shape (c, p))."""
    kind = step[0]
    if kind == "mm":
        w = step[1]
        p = src.shape[-1]
        if w > p and src.numel() % w:  # block-diagonal needs whole w-wide rows
            w = p
        mat = _hadamard_cached(w, src.dtype, src.device) if w <= p else _blockdiag_cached(p, w, src.dtype, src.device)
        torch.mm(src.view(-1, w), mat, out=dst.view(-1, w))
    elif kind == "bmm":
        f, t = step[1], step[2]
        torch.matmul(_hadamard_cached(f, src.dtype, src.device), src.view(-1, f, t), out=dst.view(-1, f, t))
    else:
        h = step[1]
        s = src.view(-1, 2, h)
        d = dst.view(-1, 2, h)
        torch.add(s[:, 0], s[:, 1], out=d[:, 0])
        torch.sub(s[:, 0], s[:, 1], out=d[:, 1])


def apply_plan(plan: tuple, src: Tensor, dst: Tensor, tmp: Tensor) -> None:
    """Write ``src @ H_p`` into ``dst`` (all three contiguous, same shape, distinct).

    ``src`` is only read; ``tmp`` is scratch.  The passes ping-pong between ``dst``
    and ``tmp`` so that the last one lands in ``dst``.
    """
    if not plan:
        dst.copy_(src)
        return
    n = len(plan)
    cur = src
    for i, step in enumerate(plan):
        nxt = dst if (n - 1 - i) % 2 == 0 else tmp
        _run_step(step, cur, nxt)
        cur = nxt


@holding_workspaces
def _fwht_forward(x: Tensor, scheme: str = "auto") -> Tensor:
    p = x.shape[-1]
    plan = plan_for(p, x.dtype, scheme)
    src = x.reshape(-1, p)
    if not src.is_contiguous():
        src = src.contiguous()
    rows = src.shape[0]
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    if rows == 0:
        return out.view(x.shape)
    if len(plan) == 1:  # a single GEMM / copy: no chunking or scratch needed
        apply_plan(plan, src, out, out)
        return out.view(x.shape)
    step = chunk_rows(p, x.element_size(), x.device)
    tmp = workspace("fwht", min(step, rows) * p, x.dtype, x.device)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        apply_plan(plan, src[r0:r1], out[r0:r1], tmp[: (r1 - r0) * p].view(r1 - r0, p))
    return out.view(x.shape)


class _FWHT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scheme: str) -> Tensor:  # noqa: D102
        ctx.scheme = scheme
        return _fwht_forward(x, scheme)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        return _FWHT.apply(grad, ctx.scheme), None


def fwht_scheme(x: Tensor, scheme: str) -> Tensor:
    """:func:`fwht` with a named scheme from :data:`SCHEMES` (tests and benchmarks)."""
    _check_power_of_two(x.shape[-1])
    return _FWHT.apply(x, scheme)


def fwht(x: Tensor) -> Tensor:
    """Unnormalised fast Walsh–Hadamard transform along the last dimension.

    Args:
        x: tensor of shape ``(..., p)`` with ``p`` a power of two.

    Returns:
        ``x @ H_p`` with the same shape and dtype as ``x`` (a new tensor).

    Raises:
        ValueError: if ``p`` is not a power of two.

    Example:
        >>> import torch
        >>> from alacarte.ops.fwht import fwht
        >>> y = fwht(torch.eye(4))   # rows of H_4
        >>> torch.equal(fwht(y), 4 * torch.eye(4))
        True
    """
    _check_power_of_two(x.shape[-1])
    return _FWHT.apply(x, "auto")

