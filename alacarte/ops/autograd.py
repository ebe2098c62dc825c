"""Second derivatives through custom autograd Functions with closed-form backwards."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["differentiable_backward"]


def differentiable_backward(
    composition: Callable[..., Tensor | tuple[Tensor, ...]],
    inputs: Sequence[Tensor],
    needs_input_grad: Sequence[bool],
    grad_outputs: Sequence[Tensor | None],
) -> tuple[Tensor | None, ...]:
    """What a custom Function's backward returns when it is itself differentiated.

    A closed-form backward builds no graph, and ``once_differentiable`` does not stop
    autograd from taking its result as a constant in the inputs when the incoming
    gradient does not require grad (a Hessian-vector product): second derivatives come
    out silently wrong.  So under ``create_graph=True`` (``torch.is_grad_enabled()`` in
    the backward) the Function returns instead the gradients, with a graph, of
    ``composition(*inputs)``: its forward written as plain autograd operations.

    Args:
        composition: the forward as differentiable operations on ``inputs``.
        inputs: the Function's tensor inputs, as saved for backward.
        needs_input_grad: ``ctx.needs_input_grad`` for those inputs.
        grad_outputs: the gradients the backward received, one per output (``None`` for none).
    Returns:
        One gradient per input, ``None`` where not needed (or not reached).
    """
    outputs = composition(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    pairs = [(out, grad) for out, grad in zip(outputs, grad_outputs) if grad is not None]
    wanted = [t for t, need in zip(inputs, needs_input_grad) if need]
    grads = iter(torch.autograd.grad([out for out, _ in pairs], wanted, [grad for _, grad in pairs],
                                     create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in needs_input_grad)
