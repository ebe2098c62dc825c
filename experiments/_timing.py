"""Median-of-repeats timing shared by the benchmarks and their reference measurements.

No torch import: ``_sklearn_extra_fastfood.py`` runs it in an interpreter without torch.
"""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int) -> float:
    """Median of ``repeats`` timed calls after one warm-up; a warm-up slower than
    1 s counts as the first sample (the big GEMMs need no warming)."""
    return median_times([fn], repeats)[0]


def median_times(fns, repeats: int) -> list[float]:
    """Like :func:`median_time` for several functions, timed round-robin so that
    they all see the same machine load (the 2 cores may be shared)."""
    samples = [[] for _ in fns]
    for fn, ts in zip(fns, samples):
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        if first > 1.0:
            ts.append(first)
    for _ in range(repeats):
        for fn, ts in zip(fns, samples):
            if len(ts) < repeats:
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in samples]
