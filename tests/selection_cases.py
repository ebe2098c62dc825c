"""The selection tests' shared problem: y = sin(2x₀) + cos(2x₁) + N(0, 0.1²) on standard-normal inputs,
of which only the first two are used."""
import numpy as np


def two_sines_mean(x: np.ndarray) -> np.ndarray:
    """The noise-free target."""
    return np.sin(2 * x[:, 0]) + np.cos(2 * x[:, 1])


def two_sines(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``d`` inputs and their noisy targets, drawn from ``rng`` (inputs first)."""
    x = rng.standard_normal((n, d))
    return x, two_sines_mean(x) + 0.1 * rng.standard_normal(n)
