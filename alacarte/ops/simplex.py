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
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["project_to_simplex", "masked_projection", "MonotoneFISTA"]


def project_to_simplex(v: Tensor, size: float | Tensor = 1.0) -> Tensor:
    r"""Project every row of ``v`` (..., d) onto the simplex ``{w ≥ 0, Σ w = size}``.

    Batched over leading dimensions; ``size`` is a positive float or a tensor
    broadcastable to ``v.shape[:-1]``.  The result has ``v``'s dtype and device
    and sums to ``size`` to round-off (float64: ~1e-15 relative).

    Raises:
        ValueError: if ``v`` is not a floating-point tensor with a non-empty last dimension and
            finite entries, or ``size`` is not positive and finite or does not broadcast.

    Example:
        >>> import torch
        >>> from alacarte.ops.simplex import project_to_simplex
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
    try:
        size = size.expand(v.shape[:-1]).unsqueeze(-1)
    except RuntimeError:
        raise ValueError(f"size must be a number or broadcast to v's leading shape {tuple(v.shape[:-1])}, "
                         f"got shape {tuple(size.shape)}") from None
    # The projection commutes with adding a constant to v. A row whose largest entry lies outside
    # [0, size] is shifted to put it at the nearer end, so that the partial sums below stay of the
    # size of the answer (unshifted, v = [1e17, 0] gives [0, 0], not [1, 0]); other rows are left as they are.
    top = v.amax(dim=-1, keepdim=True)
    v = v - (top - torch.minimum(top.clamp_min(0), size))
    u = torch.sort(v, dim=-1, descending=True).values
    excess = torch.cumsum(u, dim=-1) - size  # Σ_{k≤j} u_k − c
    j = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    # The condition holds exactly for j = 1..ρ; taking the largest such j (rather
    # than counting) keeps ρ right even if round-off flips a comparison near ρ.
    active = u * j > excess
    rho = torch.where(active, j, torch.zeros_like(j)).amax(dim=-1, keepdim=True).clamp_min(1)
    theta = excess.gather(-1, rho.long() - 1) / rho
    return (v - theta).clamp_min(0)


def masked_projection(v: Tensor, mask: Tensor, size: float | Tensor) -> Tensor:
    """The projection onto {w ≥ 0, Σ w = size, w_j = 0 where ``mask`` is False} (mask over the last dim)."""
    out = torch.zeros_like(v)
    out[..., mask] = project_to_simplex(v[..., mask], size)
    return out


class MonotoneFISTA:
    r"""Accelerated projected gradient on a scaled simplex, made monotone by restarts.

    FISTA (Beck & Teboulle 2009) whose momentum restarts whenever a step would
    increase the objective (the function-value restart of O'Donoghue & Candès
    2015), with a backtracking step size that also grows.  The one implementation
    behind both simplex optimisers: SRFF's γ-step (:class:`~alacarte.SRFFRegressor`)
    and the π-step of simplex-ARD kernels (:class:`~alacarte.selection.SimplexStep`).  The iterate is a
    list of tensors, each kept on ``{w ≥ 0, Σ w = size}`` by :func:`~alacarte.ops.simplex.project_to_simplex`.
    From the extrapolated point
    :math:`w = x_k + \tfrac{t_k - 1}{t_{k+1}}(x_k - x_{k-1})`

    .. math::
        u = P_{c\Delta}(w - s\nabla f(w)),\qquad
        \text{accepted when } f(u) \le f(w) + \nabla f(w)^\top(u - w) + \tfrac{1}{2s}\|u - w\|^2

    ``s`` halves until that bound holds and then doubles for the next step (so it
    follows the local curvature both ways).  The iterate moves to ``u`` only if
    ``f(u) ≤ f(x_k)`` — no step ever increases ``f`` — otherwise it stays and the
    momentum restarts (t = 1: the next step is a plain projected-gradient step,
    which cannot increase ``f``).  Acceleration matters on the simplex: weights of
    irrelevant inputs have almost no gradient and reach their exact zeros only
    through the projection's shift, which momentum makes many times faster.

    ``value(x)`` returns f(x) (NaN where it cannot be evaluated) and
    ``value_and_grad(x)`` returns (f(x), ∇f(x)), with ``None`` for the gradient where
    either is not finite; a NaN anywhere restarts the momentum instead of raising.

    Args:
        size: the simplex size c of every iterate tensor (``Σ w = c``).
        step_size: the initial step s.
        masks: per iterate tensor, ``None`` or a boolean mask over its last dimension of the
            entries allowed to be non-zero (the others are held at exactly 0); ``None``: no masks.
    """

    max_backtracks = 40

    def __init__(self, size: float = 1.0, step_size: float = 1.0, masks: list[Tensor | None] | None = None):
        self.size = size
        self.step_size = step_size
        # Per iterate tensor, None or a boolean mask over its last dimension: the entries allowed to be
        # non-zero (the others are held at exactly 0 and the simplex is that of the masked entries).
        self.masks = masks
        self.restart()

    def project(self, values: list[Tensor]) -> list[Tensor]:
        """Each tensor projected onto its simplex (of the entries its mask allows)."""
        masks = self.masks or [None] * len(values)
        return [project_to_simplex(v, self.size) if m is None else masked_projection(v, m, self.size)
                for v, m in zip(values, masks)]

    def restart(self) -> None:
        self.momentum = 1.0  # t_k
        self.extrapolation = 0.0  # (t_{k-1} − 1)/t_k, set when a step is accepted
        self._previous: list[Tensor] | None = None  # x_{k-1}

    def step(
        self,
        current: list[Tensor],
        value: Callable[[list[Tensor]], float],
        value_and_grad: Callable[[list[Tensor]], tuple[float, list[Tensor] | None]],
        current_value: float | None = None,
    ) -> tuple[list[Tensor], float, bool]:
        """One monotone step from ``current`` (with f(current) if the caller knows it).

        Args:
            current: the iterate x_k, each tensor on its simplex.
            value: x ↦ f(x), NaN where it cannot be evaluated.
            value_and_grad: x ↦ (f(x), ∇f(x)), the gradient ``None`` where either is not finite.
            current_value: f(x_k), if known (saves an evaluation).

        Returns:
            (the new iterate, its objective, whether it moved); an iterate that did not
            decrease f is not taken (``current`` is returned).
        """
        point = current
        if self._previous is not None:
            if current_value is None:
                current_value = value(current)
            point = [c + self.extrapolation * (c - q) for c, q in zip(current, self._previous)]
        f, grads = value_and_grad(point)
        if grads is None and point is not current:  # the extrapolated point is unusable: restart from x_k
            point = current
            f, grads = value_and_grad(current)
        if grads is None:
            self.restart()
            return current, math.nan if current_value is None else current_value, False
        if point is current:
            current_value = f
        s = self.step_size
        trial, trial_value = point, math.nan
        for _ in range(self.max_backtracks):
            with torch.no_grad():
                trial = self.project([w - s * g for w, g in zip(point, grads)])
                moved = [u - w for u, w in zip(trial, point)]
                gap = sum(float((m * m).sum()) for m in moved)
                linear = sum(float((g * m).sum()) for g, m in zip(grads, moved))
            if gap == 0.0:  # a fixed point of the projected gradient map: u = w
                trial_value = f
                break
            trial_value = value(trial)
            if math.isfinite(trial_value) and trial_value <= f + linear + gap / (2 * s):
                self.step_size = 2 * s
                break
            s /= 2
        else:
            self.step_size = s
        if math.isfinite(trial_value) and trial_value <= current_value:
            next_momentum = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * self.momentum**2))
            self.extrapolation = (self.momentum - 1.0) / next_momentum
            self.momentum = next_momentum
            self._previous = current
            return trial, trial_value, any(not torch.equal(u, c) for u, c in zip(trial, current))
        self.restart()  # no decrease: stay
        return current, current_value, False
