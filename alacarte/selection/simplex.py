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
    r"""Monotone accelerated projected-gradient steps (MFISTA) on the simplex weights π of a model.

    :func:`alacarte.fit` optimises everything else with L-BFGS or Adam and, after
    every optimiser step, takes a few steps of this on π (block-coordinate descent).
    Projection does not mix with L-BFGS — its curvature pairs assume the step it
    proposed is the step taken — so π is kept out of the quasi-Newton method and
    moved by the projected gradient method, the sound method for a smooth
    objective on a convex set.  From the extrapolated point
    :math:`w = \pi_k + \tfrac{t_k}{t_{k+1}}(u_k - \pi_k) + \tfrac{t_k - 1}{t_{k+1}}(\pi_k - \pi_{k-1})`

    .. math::
        u = P_\Delta(w - s\nabla f(w)),\qquad
        \text{accepted when } f(u) \le f(w) + \nabla f(w)^\top(u - w) + \tfrac{1}{2s}\|u - w\|^2

    (Beck & Teboulle 2009: ``s`` halves until the bound holds and doubles after
    an accepted step), and π moves to ``u`` only if ``f(u) ≤ f(π)`` — so no step
    ever increases ``f`` — otherwise it stays and the momentum restarts.
    Acceleration matters here: the weights of irrelevant inputs have almost no
    gradient (the kernel is even in γ_j) and reach their exact zeros only through
    the projection's shift, which momentum makes many times faster.
    """

    max_backtracks = 40

    def __init__(self, model: torch.nn.Module, step_size: float = 1.0):
        # A frozen π (requires_grad=False) is left as it is, like any frozen parameter.
        self.modules = [m for m in model.modules() if getattr(m, "simplex", False) and hasattr(m, "project_")
                        and m.simplex_weights.requires_grad]
        self.parameters = [m.simplex_weights for m in self.modules]
        self.step_size = step_size
        self._momentum = 1.0  # t_k
        self._extrapolation = (0.0, 0.0)  # (t_{k-1}/t_k, (t_{k-1} − 1)/t_k), set when a step is accepted
        self._previous: list[Tensor] | None = None  # π_{k-1}
        self._trial: list[Tensor] | None = None  # u_k
        self.moved = False  # whether the last call of step() changed π

    def __bool__(self) -> bool:
        return bool(self.modules)

    def owns(self, parameter: Tensor) -> bool:
        return any(parameter is p for p in self.parameters)

    def project_(self) -> None:
        for module in self.modules:
            module.project_()

    def step(self, objective, steps: int = 3) -> float:
        """``steps`` monotone steps on π; returns the objective at the final π.

        π moves more slowly than the smooth parameters (its step is limited by the
        curvature along the simplex), so each call takes a few steps."""
        value, self.moved = math.nan, False
        for _ in range(steps):
            value, moved = self._single_step(objective)
            self.moved |= moved
            if not moved:
                break
        return value

    def _set(self, values: list[Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.parameters, values):
                p.copy_(v)

    def _evaluate(self, objective) -> float:
        try:
            with torch.no_grad():
                value = float(objective())
        except (RuntimeError, ValueError):  # a factorisation failed: too long a step
            return math.nan
        return value if math.isfinite(value) else math.nan

    def _value_and_gradient(self, objective) -> tuple[float, list[Tensor] | None]:
        """f and ∇_π f at the current π; ``(nan, None)`` where either is not finite or the
        factorisation fails."""
        try:
            with torch.enable_grad():
                value = objective()
                grads = torch.autograd.grad(value, self.parameters, allow_unused=True)
        except (RuntimeError, ValueError):
            return math.nan, None
        value = float(value.detach())
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.parameters, grads)]
        if not math.isfinite(value) or not all(bool(torch.isfinite(g).all()) for g in grads):
            return math.nan, None
        return value, grads

    def _restart(self) -> None:
        self._momentum, self._previous, self._trial = 1.0, None, None

    def _single_step(self, objective) -> tuple[float, bool]:
        self.project_()
        for p in self.parameters:
            p.grad = None  # the optimiser's closure accumulates these; π uses its own gradient
        current = [p.detach().clone() for p in self.parameters]
        current_value = math.nan
        point = current
        if self._previous is not None:
            current_value = self._evaluate(objective)
            a, b = self._extrapolation
            point = [c + a * (u - c) + b * (c - q) for c, u, q in zip(current, self._trial, self._previous)]
        self._set(point)
        value, grads = self._value_and_gradient(objective)
        if grads is None and point is not current:  # the extrapolated point is unusable: restart from π
            point = current
            self._set(current)
            value, grads = self._value_and_gradient(objective)
        if grads is None:
            self._set(current)
            self._restart()
            return current_value, False
        if point is current:
            current_value = value
        s = self.step_size
        trial, trial_value = None, math.nan
        for _ in range(self.max_backtracks):
            with torch.no_grad():
                trial = [project_to_simplex(w - s * g) for w, g in zip(point, grads)]
                moved = [u - w for u, w in zip(trial, point)]
                gap = sum(float((m * m).sum()) for m in moved)
                linear = sum(float((g * m).sum()) for g, m in zip(grads, moved))
            if gap == 0.0:
                break  # a fixed point of the projected gradient map
            self._set(trial)
            trial_value = self._evaluate(objective)
            if math.isfinite(trial_value) and trial_value <= value + linear + gap / (2 * s):
                self.step_size = 2 * s
                break
            s /= 2
        else:
            self.step_size = s
        accepted = math.isfinite(trial_value) and trial_value <= current_value
        self._previous, self._trial = current, trial
        if accepted:
            self._set(trial)
            # Beck & Teboulle: the next extrapolation uses t_k/t_{k+1} and (t_k − 1)/t_{k+1}.
            next_momentum = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * self._momentum**2))
            self._extrapolation = (self._momentum / next_momentum, (self._momentum - 1.0) / next_momentum)
            self._momentum = next_momentum
            return trial_value, any(not torch.equal(u, c) for u, c in zip(trial, current))
        self._set(current)  # no decrease: stay, and restart the momentum
        self._restart()
        return current_value, False
