"""The π-step of :func:`alacarte.fit`: projected-gradient steps on the simplex weights of a model's kernels."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._validation import varying_columns
from .ops.simplex import MonotoneFISTA, masked_projection

__all__ = ["SimplexStep"]


class SimplexStep:
    r"""Monotone accelerated projected-gradient steps on the simplex weights π of a model
    (:class:`~alacarte.ops.simplex.MonotoneFISTA`).

    :func:`alacarte.fit` optimises everything else with L-BFGS or Adam and, after
    every optimiser step, takes a few steps of this on π (block-coordinate descent).
    Projection does not mix with L-BFGS — its curvature pairs assume the step it
    proposed is the step taken — so π is kept out of the quasi-Newton method and
    moved by the projected gradient method, the sound method for a smooth
    objective on a convex set.  The momentum carries over between calls; the
    objective changes between them (the other parameters move), so f(π) is
    re-evaluated at the start of each call.

    Args:
        model: the model whose simplex kernels' π are stepped (those with ``simplex=True`` and
            π not frozen); false (``bool``) when it has none.
        step_size: the initial step.
        inputs: the training inputs (n, d): π of an input constant on them is held at 0.
    """

    def __init__(self, model: torch.nn.Module, step_size: float = 1.0, inputs: Tensor | None = None):
        # A frozen π (requires_grad=False) is left as it is, like any frozen parameter.
        self.modules = [m for m in model.modules() if getattr(m, "simplex", False) and hasattr(m, "project_")
                        and m.simplex_weights.requires_grad]
        self.parameters = [m.simplex_weights for m in self.modules]
        # An input that is constant on the training ``inputs`` (n, d) has γ_j·x_j the same at every point,
        # so π_j gets no gradient: left free, the projection's shift fills it with the mass the other
        # inputs give up, a slack that lowers their total below c and reports the constant input as
        # relevant (π = 0.43 of 7 inputs). Its π_j is held at 0; π lies on the simplex of the others.
        # Inputs a kernel's drop_inputs_ took out are held at 0 too.
        self.masks = [self._allowed(m, self._varying(inputs, p)) for m, p in zip(self.modules, self.parameters)]
        self.fista = MonotoneFISTA(size=1.0, step_size=step_size, masks=self.masks)
        self.moved = False  # whether the last call of step() changed π

    def __bool__(self) -> bool:
        return bool(self.modules)

    def state_dict(self) -> dict:
        """What the next :meth:`step` depends on besides π itself (a resumed fit continues bit for bit)."""
        fista = self.fista
        return {"step_size": fista.step_size, "momentum": fista.momentum, "extrapolation": fista.extrapolation,
                "previous": fista._previous, "moved": self.moved}

    def load_state_dict(self, state: dict) -> None:
        fista = self.fista
        fista.step_size, fista.momentum, fista.extrapolation = state["step_size"], state["momentum"], state["extrapolation"]
        # (a checkpoint is read onto the CPU; π may live on a GPU)
        previous = state["previous"]
        fista._previous = None if previous is None else [q.to(p) for q, p in zip(previous, self.parameters)]
        self.moved = state["moved"]

    def owns(self, parameter: Tensor) -> bool:
        return any(parameter is p for p in self.parameters)

    @staticmethod
    def _varying(inputs: Tensor | None, weights: Tensor) -> Tensor | None:
        """The inputs that vary over the rows, as a mask for ``weights``; None: all of them (or none)."""
        d = weights.shape[-1]
        if inputs is None or inputs.dim() < 1 or inputs.shape[-1] != d or inputs.numel() == 0:
            return None
        varying = varying_columns(inputs).to(weights.device)
        return None if bool(varying.all()) or not bool(varying.any()) else varying

    @staticmethod
    def _allowed(module: torch.nn.Module, varying: Tensor | None) -> Tensor | None:
        """``varying`` and the kernel's :attr:`simplex_mask` together; None: every input."""
        held = getattr(module, "simplex_mask", None)
        if held is None or bool(held.all()):
            return varying
        held = held.reshape(-1, held.shape[-1]).all(0).to(module.simplex_weights.device)
        both = held if varying is None else varying & held
        return both if bool(both.any()) else held

    def project_(self) -> None:
        for module, mask in zip(self.modules, self.masks):
            if mask is None:
                module.project_()
            else:
                with torch.no_grad():
                    module.simplex_weights.copy_(masked_projection(module.simplex_weights, mask, 1.0))

    def step(self, objective: Callable[[], Tensor], steps: int = 3) -> float:
        """``steps`` monotone steps on π; returns the objective at the final π.

        π moves more slowly than the smooth parameters (its step is limited by the
        curvature along the simplex), so each call takes a few steps.

        Args:
            objective: evaluates the loss at the model's current parameters (π set in place).
            steps: the most steps to take; a step that does not move π ends the call.
        """
        self.project_()
        for p in self.parameters:
            p.grad = None  # the optimiser's closure accumulates these; π uses its own gradient

        def value(values: list[Tensor]) -> float:
            self._set(values)
            try:
                with torch.no_grad():
                    result = float(objective())
            except (RuntimeError, ValueError):  # a factorisation failed: too long a step
                return math.nan
            return result if math.isfinite(result) else math.nan

        def value_and_grad(values: list[Tensor]) -> tuple[float, list[Tensor] | None]:
            self._set(values)
            try:
                with torch.enable_grad():
                    result = objective()
                    grads = torch.autograd.grad(result, self.parameters, allow_unused=True)
            except (RuntimeError, ValueError):
                return math.nan, None
            result = float(result.detach())
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.parameters, grads)]
            if not math.isfinite(result) or not all(bool(torch.isfinite(g).all()) for g in grads):
                return math.nan, None
            return result, grads

        current = [p.detach().clone() for p in self.parameters]
        result, self.moved = math.nan, False
        for k in range(steps):
            # f(π) is known after the first step: the objective is fixed within a call.
            current, result, moved = self.fista.step(current, value, value_and_grad, result if k else None)
            self.moved |= moved
            if not moved:
                break
        self._set(current)
        return result

    def _set(self, values: list[Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.parameters, values):
                p.copy_(v)
