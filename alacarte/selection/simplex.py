r"""Euclidean projection onto the (scaled) probability simplex (Duchi et al. 2008).

.. math::
    P_{c\Delta}(v) = \arg\min_{w \ge 0,\ \sum_j w_j = c} \|w - v\|_2
                   = \max(v - \theta, 0),\qquad
    \theta = \frac{1}{\rho}\Big(\sum_{j\le\rho} u_j - c\Big),\quad
    \rho = \max\Big\{j : u_j - \tfrac{1}{j}\big(\textstyle\sum_{k\le j} u_k - c\big) > 0\Big\}

with ``u`` the entries of ``v`` sorted in decreasing order.  Exact (up to
round-off) and O(d log d); it sets whole coordinates to exactly zero, which is
what makes a simplex-constrained ARD kernel *select* variables.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["project_to_simplex", "SimplexStep"]


def project_to_simplex(v: Tensor, size: float | Tensor = 1.0) -> Tensor:
    r"""Project every row of ``v`` (..., d) onto the simplex ``{w ≥ 0, Σ w = size}``.

    Batched over leading dimensions; ``size`` is a positive float or a tensor
    broadcastable to ``v.shape[:-1]``.  The result has ``v``'s dtype and device
    and sums to ``size`` to round-off (float64: ~1e-15 relative).

    Example:
        >>> project_to_simplex(torch.tensor([0.5, 0.9, -1.0]))
        tensor([0.3000, 0.7000, 0.0000])
    """
    if not isinstance(v, Tensor) or not v.is_floating_point():
        raise ValueError(f"v must be a floating-point tensor, got {type(v).__name__}")
    if v.dim() == 0 or v.shape[-1] == 0:
        raise ValueError(f"v must have a non-empty last dimension, got shape {tuple(v.shape)}")
    if not bool(torch.isfinite(v).all()):
        raise ValueError("v contains non-finite values (NaN/inf)")
    size = torch.as_tensor(size, dtype=v.dtype, device=v.device)
    if not bool(torch.isfinite(size).all()) or not bool((size > 0).all()):
        raise ValueError(f"size must be positive and finite, got {size}")
    size = size.expand(v.shape[:-1]).unsqueeze(-1)
    u = torch.sort(v, dim=-1, descending=True).values
    excess = torch.cumsum(u, dim=-1) - size  # Σ_{k≤j} u_k − c
    j = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    # The condition holds exactly for j = 1..ρ; taking the largest such j (rather
    # than counting) keeps ρ right even if round-off flips a comparison near ρ.
    active = u * j > excess
    rho = torch.where(active, j, torch.zeros_like(j)).amax(dim=-1, keepdim=True).clamp_min(1)
    theta = excess.gather(-1, rho.long() - 1) / rho
    return (v - theta).clamp_min(0)


class SimplexStep:
    r"""Projected-gradient steps with backtracking on the simplex weights π of a model's kernels.

    :func:`alacarte.fit` optimises everything else with L-BFGS or Adam and, after
    every optimiser step, takes one step of this on π (block-coordinate descent).
    Projection does not mix with L-BFGS — its curvature pairs assume the step it
    proposed is the step taken — so π is kept out of the quasi-Newton method and
    moved by the projected gradient method instead, which is the sound method
    for a smooth objective on a convex set: with step ``t``

    .. math::
        \pi^+ = P_\Delta(\pi - t\nabla_\pi f),\qquad
        \text{accepted when } f(\pi^+) \le f(\pi) + \nabla_\pi f^\top(\pi^+ - \pi)
        + \tfrac{1}{2t}\|\pi^+ - \pi\|^2

    (the backtracking rule of Beck & Teboulle 2009; ``t`` halves until it holds,
    and doubles after an accepted step so that it tracks the local curvature).
    Every accepted step decreases ``f``; a step that finds no decrease leaves π
    unchanged.
    """

    max_backtracks = 40

    def __init__(self, model: torch.nn.Module, step_size: float = 1.0):
        self.modules = [m for m in model.modules() if getattr(m, "simplex", False) and hasattr(m, "project_")]
        self.parameters = [m.simplex_weights for m in self.modules]
        self.step_size = step_size

    def __bool__(self) -> bool:
        return bool(self.modules)

    def owns(self, parameter: Tensor) -> bool:
        return any(parameter is p for p in self.parameters)

    def project_(self) -> None:
        for module in self.modules:
            module.project_()

    def step(self, objective, steps: int = 3) -> float:
        """``steps`` projected-gradient steps on π (each accepted or none); returns the objective.

        π moves more slowly than the smooth parameters (its step is limited by the
        curvature along the simplex), so each call takes a few steps."""
        value = math.nan
        for _ in range(steps):
            value, moved = self._single_step(objective)
            if not moved:
                break
        return value

    def _single_step(self, objective) -> tuple[float, bool]:
        self.project_()
        for p in self.parameters:
            p.grad = None  # the optimiser's closure accumulates these; π uses its own gradient
        with torch.enable_grad():
            value = objective()
            grads = torch.autograd.grad(value, self.parameters, allow_unused=True)
        value = float(value.detach())
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.parameters, grads)]
        old = [p.detach().clone() for p in self.parameters]
        t = self.step_size
        for _ in range(self.max_backtracks):
            with torch.no_grad():
                new = [project_to_simplex(p - t * g) for p, g in zip(old, grads)]
                moved = [n - p for n, p in zip(new, old)]
                gap = sum(float((m * m).sum()) for m in moved)
                if gap == 0.0:
                    return value, False  # a fixed point of the projected gradient map: stationary on Δ
                linear = sum(float((g * m).sum()) for g, m in zip(grads, moved))
                for p, n in zip(self.parameters, new):
                    p.copy_(n)
                try:
                    trial = float(objective())
                except (RuntimeError, ValueError):  # a factorisation failed: too long a step
                    trial = math.nan
            if math.isfinite(trial) and trial <= value + linear + gap / (2 * t):
                self.step_size = 2 * t
                return trial, True
            t /= 2
        with torch.no_grad():
            for p, o in zip(self.parameters, old):
                p.copy_(o)
        self.step_size = t
        return value, False
