"""Synthetic regression problems from the SRFF paper (MATH.md §8).

Each generator returns ``(x, y, relevant)``: inputs (n, d), targets (n,) and
the 0-based indices of the inputs the target depends on.  Draws are
deterministic under ``seed`` (numpy's PCG64).
"""
from __future__ import annotations

import numpy as np

from .._validation import check_positive_int

__all__ = ["make_se1", "make_se2", "make_se3"]


def make_se1(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """SE1, d = 18: y = sin((x₁ + x₃)²)·sin(x₇x₈x₉) + N(0, 0.1²), x ~ N(0, I)."""
    check_positive_int(n, "n")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 18))
    y = np.sin((x[:, 0] + x[:, 2]) ** 2) * np.sin(x[:, 6] * x[:, 7] * x[:, 8]) + 0.1 * rng.standard_normal(n)
    return x, y, (0, 2, 6, 7, 8)


def make_se2(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """SE2, d = 100: y = log((x₁₁ + … + x₁₅)²) + N(0, 0.1²), x ~ N(0, I)."""
    check_positive_int(n, "n")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 100))
    y = np.log(x[:, 10:15].sum(1) ** 2) + 0.1 * rng.standard_normal(n)
    return x, y, tuple(range(10, 15))


def make_se3(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """SE3, d = 1000: latent z₁..z₂₀₀ ~ N(0, 1), five noisy copies of each
    (x = z + N(0, 0.1²)), y = 10(z₁² + z₂²)·exp(−2(z₁² + z₂²)) + N(0, 0.01²)."""
    check_positive_int(n, "n")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 200))
    x = np.repeat(z, 5, axis=1) + 0.1 * rng.standard_normal((n, 1000))
    r2 = z[:, 0] ** 2 + z[:, 1] ** 2
    y = 10 * r2 * np.exp(-2 * r2) + 0.01 * rng.standard_normal(n)
    return x, y, tuple(range(10))
