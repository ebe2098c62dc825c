"""The selection tests' shared problem — y = sin(2x₀) + cos(2x₁) + N(0, 0.1²) on standard-normal inputs,
of which only the first two are used — and an exhaustive reference for the simplex projection."""
import copy

import numpy as np
import torch

import alacarte as ac


def two_sines_mean(x: np.ndarray) -> np.ndarray:
    """The noise-free target."""
    return np.sin(2 * x[:, 0]) + np.cos(2 * x[:, 1])


def two_sines(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``d`` inputs and their noisy targets, drawn from ``rng`` (inputs first)."""
    x = rng.standard_normal((n, d))
    return x, two_sines_mean(x) + 0.1 * rng.standard_normal(n)


def exhaustive_projection(v: np.ndarray, size: float) -> np.ndarray:
    """argmin ‖w − v‖ over {w ≥ 0, Σw = size}, by trying every support set S (exact KKT solve).

    On a support S the minimiser of ‖w − v‖² subject to Σ_S w = size is w_S = v_S − τ with
    τ = (Σ_S v − size)/|S|; the answer is the S whose w_S ≥ 0 and whose left-out v_j ≤ τ (the
    KKT conditions, which hold for one w only).  Comparing distances instead cannot tell apart
    supports whose distances differ below round-off (v = (1, −1, 1e-9): 1 + 5e-19 against 1 + 1e-18)."""
    d = v.size
    slack = 1e-14 * max(1.0, size, float(np.abs(v).max()))  # round-off in τ; supports within it agree to it
    for mask in range(1, 2**d):
        support = np.array([(mask >> j) & 1 for j in range(d)], dtype=bool)
        tau = (v[support].sum() - size) / support.sum()
        if (v[support] - tau >= -slack).all() and (v[~support] <= tau + slack).all():
            return np.where(support, np.maximum(v - tau, 0.0), 0.0)
    raise AssertionError("no support satisfies the KKT conditions")


def built_with(model, seed: int):
    """A copy of ``model`` (a 5-input FSARD simplex GP with D = 32) whose kernel's random buffers are those a
    kernel built with ``seed`` draws: an independent reference for a fresh feature draw."""
    other = copy.deepcopy(model)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # drawn in float64, as the buffers it replaces are
    try:
        fresh = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, seed=seed)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name in ("perm", "sign", "gauss"):
            getattr(other.covar_module, name).copy_(getattr(fresh, name))
    return other
