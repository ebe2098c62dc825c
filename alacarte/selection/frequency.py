"""How often a simplex-ARD GP's :func:`~alacarte.selection.select_inputs` keeps each input over feature draws."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..training import fit
from .evidence import select_inputs, simplex_kernel

if TYPE_CHECKING:
    from ..models import FeatureGP

__all__ = ["selection_frequency", "SelectionFrequency"]


@dataclass
class SelectionFrequency:
    """What :func:`selection_frequency` found over its feature draws.

    Attributes:
        frequency: per input, the share of draws that kept it (d,).
        selections: per draw, the indices of the inputs it kept.
        seeds: the draws' seeds, in the order of ``selections``.
    """

    frequency: torch.Tensor
    selections: list[torch.Tensor]
    seeds: list[int]

    @classmethod
    def of(cls, selections: list[torch.Tensor], seeds: list[int], num_dims: int) -> "SelectionFrequency":
        """The frequencies of ``selections`` (one per seed) over ``num_dims`` inputs."""
        counts = torch.zeros(num_dims, dtype=torch.float64)
        for chosen in selections:
            counts[chosen] += 1
        return cls(counts / len(selections), selections, seeds)

    def stable(self, at_least: float = 0.8) -> torch.Tensor:
        """The inputs kept by at least the share ``at_least`` of the draws (default 4 of 5)."""
        return torch.nonzero(self.frequency >= at_least - 1e-12).reshape(-1)


def selection_frequency(build: Callable[[int], "FeatureGP"], x, y, *, seeds: Iterable[int] = range(5),
                        level: float = 0.05, **fit_options) -> SelectionFrequency:
    """Fit and :func:`select_inputs` once per seed, each with its own feature draw; how often each input is kept.

    Which inputs a finite feature map keeps can depend on its random draw; an input kept on every
    draw is one the data ask for, an input kept on some is one to distrust.

    Args:
        build: ``build(seed)`` returns an unfitted :class:`~alacarte.FeatureGP` with one simplex
            kernel whose random features are drawn from ``seed``.
        x, y: the training data.
        seeds: one draw per seed (at least one).
        level: as for :func:`select_inputs`.
        **fit_options: passed to :func:`alacarte.fit` (whose ``seed`` is each draw's).

    Returns:
        A :class:`SelectionFrequency`.

    Example:
        >>> import numpy as np
        >>> import alacarte as ac
        >>> from alacarte.selection import selection_frequency
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((200, 4))
        >>> y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(200)
        >>> build = lambda seed: ac.FeatureGP(None, None, ac.FSARDKernel(4, 16, ard_num_dims=4, simplex=True,
        ...                                                             seed=seed)).double()
        >>> found = selection_frequency(build, x, y, seeds=[0, 1], max_iter=10, restarts=0, progress=False)
        >>> found.frequency.shape
        torch.Size([4])
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if "seed" in fit_options:
        raise ValueError("each draw's fit takes the draw's seed: give seeds=[...], not seed")
    fit_options.setdefault("progress", False)
    selections = []
    for seed in seeds:
        model = build(seed)
        fit(model, x, y, seed=seed, **fit_options)
        fraction = fit_options.get("validation_fraction", "auto")
        selections.append(select_inputs(model, x, y, level=level, seed=seed, validation_fraction=fraction).selected)
    return SelectionFrequency.of(selections, seeds, simplex_kernel(model).num_dims)
