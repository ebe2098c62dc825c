"""Round-robin timing shared by the benchmarks and their reference measurements.

No torch import: ``_sklearn_extra_fastfood.py`` runs it in an interpreter without torch.
"""
from __future__ import annotations

import os
import statistics
import time


def median_time(fn, repeats: int) -> float:
    """Median of ``repeats`` timed calls after one warm-up; a warm-up slower than
    1 s counts as the first sample (the big GEMMs need no warming)."""
    return median_times([fn], repeats)[0]


def median_times(fns, repeats: int) -> list[float]:
    """Like :func:`median_time` for several functions, timed round-robin so that
    they all see the same machine load (the 2 cores may be shared)."""
    return [statistics.median(ts) for ts in sample_times(fns, repeats)]


def sample_times(fns, repeats: int) -> list[list[float]]:
    """The ``repeats`` timings of each function (round-robin, warm-up as in :func:`median_time`)."""
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
    return samples


def spread(samples: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """``min–max`` of the samples (times ``scale``), the spread a table reports beside the median."""
    return f"{min(samples) * scale:.{digits}f}–{max(samples) * scale:.{digits}f}"


def load_average() -> str:
    """The 1-minute load average, to record before and after the timings (it counts this process)."""
    return f"{os.getloadavg()[0]:.2f}"
