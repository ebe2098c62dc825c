"""A short fit of a GP's hyperparameters to the mean marginal likelihood over fresh draws of its
kernel's random features: the point at which :func:`~alacarte.selection.select_inputs` asks what
each input is worth on fresh draws."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from ..training import negative_mll
from ..training._optimization import Optimization

if TYPE_CHECKING:
    from ..models import FeatureGP

__all__ = ["fit_over_draws"]


class _OverDraws(Optimization):
    """An :class:`~alacarte.training._optimization.Optimization` of the mean loss over the feature draws
    ``seeds`` of ``kernel`` (π by its projected-gradient step, the rest by L-BFGS, as :func:`~alacarte.fit`)."""

    def __init__(self, model: "FeatureGP", kernel: torch.nn.Module, seeds: Sequence[int], max_iter: int,
                 tolerance: float):
        (x,), y = model.train_inputs, model.train_targets
        super().__init__(model, x, y, "lbfgs", max_iter, None, tolerance, tqdm(disable=True))
        self.kernel, self.seeds = kernel, list(seeds)

    def _loss(self, backward: bool):
        # Each draw's graph is used inside its block: leaving it puts the fitted draw's buffers back in
        # place, under any graph that saved them.  Where a caller differentiates the value itself (the
        # π step), it gets the mean's value with the mean's gradient in π attached to π linearly.
        graph = torch.is_grad_enabled() and not backward
        simplex = list(self.simplex.parameters)
        value, slopes = 0.0, [torch.zeros_like(p) for p in simplex]
        for seed in self.seeds:
            with self.kernel.redrawn(seed):
                loss = negative_mll(self.model, self.x, self.y, backward=False, mll=self.mll) / len(self.seeds)
                if backward:
                    loss.backward()
                elif graph:
                    for slope, grad in zip(slopes, torch.autograd.grad(loss, simplex, allow_unused=True)):
                        if grad is not None:
                            slope += grad
            value = value + loss.detach()
        if not graph:
            return value
        return value + sum(((p - p.detach()) * slope).sum() for p, slope in zip(simplex, slopes))


def fit_over_draws(model: "FeatureGP", kernel: torch.nn.Module, seeds: Sequence[int], max_iter: int,
                   tolerance: float = 1e-7) -> list[float]:
    """Move the model's hyperparameters (π, c, σ_f², σ², …) towards the minimum of the mean negative log
    marginal likelihood over the draws ``seeds`` of ``kernel``'s random features
    (:meth:`~alacarte.kernels.base.FeatureKernel.redrawn`), on the model's training data, with at most
    ``max_iter`` iterations of :func:`~alacarte.fit`'s optimiser; the model keeps its own draw.  Returns
    the mean loss per point at the start of each iteration.

    A point fitted on one finite draw can favour what that draw's features happen to represent (one of two
    symmetric inputs weighted twice the other); the mean over fresh draws prices the kernel instead."""
    losses, _ = _OverDraws(model, kernel, seeds, max_iter, tolerance).run()
    return losses
