r"""Exact variable selection for a fitted simplex-ARD GP by the marginal likelihood's evidence.

The continuous fit alone does not give exact zeros for every irrelevant input.  With the
simplex size c learnable (or, for :class:`~alacarte.FSARDKernel`, the radii free) the
simplex constraint does not bind: its multiplier is 0 and an irrelevant input's π_j
sits where its own gradient vanishes, which a finite feature map and a finite sample make
a small positive weight for about half of them.  With c fixed above what the likelihood
wants, the multiplier is positive and the surplus *has* to go onto irrelevant inputs.

So each input in use is asked what it is worth: the rise of the total negative log
marginal likelihood, in nats, when its weight is set to 0 (the others' γ kept, nothing
refitted — an upper bound on the cost after a refit).  Twice the gain of an irrelevant
input is about χ²₁, so P(cost > t) ≤ e^{-t}: inputs costing less than
:math:`t = \log(d/\alpha)` are dropped (held at 0 by :meth:`~alacarte.kernels.base.FeatureKernel.drop_inputs_`),
which keeps about α irrelevant inputs in expectation; the GP is refitted and asked again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..models import FeatureGP

__all__ = ["select_inputs", "InputSelection"]


@dataclass
class InputSelection:
    """What :func:`select_inputs` did.

    Attributes:
        selected: indices of the inputs with non-zero weight at the end.
        costs: per input, the nats of total marginal likelihood its weight was worth when last asked
            (0 for inputs out of use then).
        threshold: the cost below which an input was dropped, ``log(d/level)``.
        rounds: refits done.
    """

    selected: torch.Tensor
    costs: torch.Tensor
    threshold: float
    rounds: int


def _simplex_kernel(model: "FeatureGP") -> torch.nn.Module:
    kernels = [m for m in model.modules() if getattr(m, "simplex", False) and hasattr(m, "drop_inputs_")]
    if len(kernels) != 1 or len(kernels[0].batch_shape):
        raise ValueError(f"select_inputs needs a model with exactly one simplex kernel (simplex=True) without "
                         f"batch_shape, found {len(kernels)}")
    return kernels[0]


@torch.no_grad()
def input_costs(model: "FeatureGP", kernel: torch.nn.Module) -> torch.Tensor:
    """Per input, the rise of the total negative log marginal likelihood (nats, on the model's
    training data) when its weight alone is set to 0; 0 for inputs out of use."""
    from ..training import negative_mll

    x, y = model.train_inputs[0], model.train_targets
    pi, size = kernel.simplex_weights.detach().clone(), kernel.simplex_size.detach().clone()
    learn = kernel.raw_simplex_size.requires_grad
    costs = torch.zeros(kernel.num_dims, dtype=torch.float64)
    model.train()
    with model.inference_settings():
        base = float(negative_mll(model, x, y, backward=False))
        try:
            for j in torch.nonzero(pi.reshape(-1) > 0).reshape(-1).tolist():
                trial = pi.clone()
                trial[..., j] = 0
                kept = float(trial.sum())
                if kept <= 0:
                    costs[j] = math.inf
                    continue
                kernel.simplex_weights.copy_(trial / kept)
                if learn:  # the others keep their γ
                    kernel.simplex_size = size * kept
                costs[j] = (float(negative_mll(model, x, y, backward=False)) - base) * len(y)
        finally:
            kernel.simplex_weights.copy_(pi)
            if learn:
                kernel.simplex_size = size
    return costs


def select_inputs(model: "FeatureGP", x, y, *, level: float = 0.05, refit_iter: int = 30, max_rounds: int = 5,
                  seed: int | None = 0) -> InputSelection:
    r"""Drop the inputs of a fitted simplex-ARD GP that the marginal likelihood does not need.

    Call after :func:`alacarte.fit` on the same ``x``, ``y``.  Each round drops every input whose
    weight is worth less than ``log(d/level)`` nats of total marginal likelihood (never the
    last one), holds them at exactly 0 and refits the rest with :func:`alacarte.fit`
    (``restarts=0``, ``refit_iter`` iterations), until no input is dropped.

    Args:
        model: a fitted :class:`~alacarte.FeatureGP` with one simplex kernel.
        x, y: the training data the model was fitted on.
        level: about the expected number of irrelevant inputs kept (χ²₁ tail); in (0, d).
        refit_iter: L-BFGS iterations of each refit.
        max_rounds: the most drop-and-refit rounds.
        seed: passed to the refits.

    Returns:
        An :class:`InputSelection`; the model is left refitted with the dropped inputs at 0.

    Raises:
        ValueError: for a model without exactly one simplex kernel, an unfitted model, or
            ``level``, ``refit_iter``, ``max_rounds`` out of range.
    """
    from ..training import fit

    kernel = _simplex_kernel(model)
    d = kernel.num_dims
    if not 0 < level < d:
        raise ValueError(f"level must lie in (0, {d}), got {level!r}")
    if int(refit_iter) < 1 or int(max_rounds) < 0:
        raise ValueError(f"refit_iter must be ≥ 1 and max_rounds ≥ 0, got {refit_iter!r}, {max_rounds!r}")
    if model.train_inputs is None:
        raise ValueError("select_inputs needs a fitted model: call alacarte.fit(model, x, y) first")
    threshold = math.log(d / level)
    rounds = 0
    while True:
        costs = input_costs(model, kernel)
        active = kernel.simplex_weights.detach().reshape(-1).cpu() > 0
        weak = active & (costs < threshold)
        if bool(weak.any()) and bool(weak.eq(active).all()):  # never the last input
            weak[int(torch.argmax(torch.where(active, costs, torch.full_like(costs, -math.inf))))] = False
        if not bool(weak.any()) or rounds >= max_rounds:
            break
        kernel.drop_inputs_(torch.nonzero(weak).reshape(-1))
        fit(model, x, y, max_iter=refit_iter, restarts=0, progress=False, seed=seed)
        rounds += 1
    return InputSelection(kernel.selected().cpu(), costs, threshold, rounds)
