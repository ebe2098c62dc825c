"""Freed large blocks kept in the process heap while a fit runs (glibc only).

glibc serves an allocation above its mmap threshold (128 KiB, adapting up to
32 MiB) with a fresh ``mmap`` and unmaps it on free, so every likelihood
evaluation of a large fit faults in its n×D feature matrices' pages anew: at
n = 36 000, D = 1 024 that is 0.9 GB of page faults and a seventh of the
evaluation (experiments/results/likelihood.md).  With the mmap and trim
thresholds raised, the next evaluation reuses the same pages.  Elsewhere
(another C library or platform) :func:`reuse_freed_memory` does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
import threading
from collections.abc import Iterator

__all__ = ["reuse_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Both thresholds while a fit runs: above any n×D block a fit allocates per evaluation.
RAISED_THRESHOLD = 1 << 30
#: What they return to: glibc's documented initial values (its adaptive mmap threshold stays off).
DEFAULT_THRESHOLD = 128 * 1024

_lock = threading.Lock()
_depth = 0


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _set_thresholds(libc: ctypes.CDLL, value: int) -> None:
    libc.mallopt(_M_MMAP_THRESHOLD, value)
    libc.mallopt(_M_TRIM_THRESHOLD, value)


@contextlib.contextmanager
def reuse_freed_memory() -> Iterator[None]:
    """Within, freed blocks of up to :data:`RAISED_THRESHOLD` bytes stay in the heap for reuse.

    Nested and concurrent uses share one raise: the thresholds return to
    :data:`DEFAULT_THRESHOLD` and free heap pages go back to the system
    (``malloc_trim``) when the last one exits.
    """
    global _depth
    libc = _glibc()
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _set_thresholds(libc, RAISED_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set_thresholds(libc, DEFAULT_THRESHOLD)
                libc.malloc_trim(0)
