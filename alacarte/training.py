"""The training entry point: maximise the marginal likelihood with L-BFGS or Adam."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import gpytorch
import torch
from tqdm.auto import tqdm

from ._validation import check_positive_int
from .mll import WoodburyMarginalLogLikelihood
from .models import FeatureGP

__all__ = ["FitHistory", "fit", "marginal_log_likelihood"]

@dataclass
class FitHistory:
    """What :func:`fit` did: the loss (negative log marginal likelihood per data
    point, standardised units, log priors included) at the start of every
    iteration."""

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    converged: bool = False
    optimizer: str = "lbfgs"

    @property
    def iterations(self) -> int:
        return len(self.loss)


def marginal_log_likelihood(model):
    """The right marginal likelihood for ``model``: Woodbury for feature GPs, exact otherwise."""
    if isinstance(model, FeatureGP):
        return WoodburyMarginalLogLikelihood(model.likelihood, model)
    return gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


def fit(
    model: FeatureGP | ExactRBFGP,
    x,
    y,
    *,
    optimizer: str = "lbfgs",
    max_iter: int = 100,
    lr: float | None = None,
    tolerance: float = 1e-7,
    standardize: bool = True,
    seed: int | None = 0,
    progress: bool = True,
) -> FitHistory:
    """Fit a GP's hyperparameters by maximising its marginal likelihood.

    Inputs are standardised per column and targets to mean 0 / std 1 (stored in
    the model, so :meth:`~alacarte.FeatureGP.predict` answers in original units).

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP`.
        x, y: training data, (n, d) and (n,), tensors or arrays.
        optimizer: ``"lbfgs"`` (strong-Wolfe line search; the default) or ``"adam"``.
        max_iter: optimiser iterations.
        lr: step size (default 1.0 for L-BFGS, 0.05 for Adam).
        tolerance: stop when the loss changes by less than this (relative) for
            three iterations in a row.
        standardize: standardise inputs and targets (recommended).
        seed: seeds torch's generator before training, for reproducible runs.
        progress: show a progress bar.

    Returns:
        The :class:`FitHistory`; the model is left in eval mode.

    Example:
        >>> model = FeatureGP(None, None, FSARDKernel(num_dims=8, num_samples=512, ard_num_dims=8))
        >>> history = fit(model, x, y, max_iter=50)
        >>> history.loss[-1] < history.loss[0]
        True
    """
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    check_positive_int(max_iter, "max_iter")
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    x, y = model.check_data(x, y)
    if seed is not None:
        torch.manual_seed(seed)
    if standardize:
        x, y = model.standardize(x, y)
    else:
        for name in ("input_offset", "target_offset"):
            getattr(model, name).zero_()
        for name in ("input_scale", "target_scale"):
            getattr(model, name).fill_(1.0)
    model.set_train_data(x, y, strict=False)
    model.train()
    mll = marginal_log_likelihood(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(
            params, lr=lr or 1.0, max_iter=1, history_size=20, line_search_fn="strong_wolfe"
        )
    else:
        opt = torch.optim.Adam(params, lr=lr or 0.05)

    def closure():
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        return loss

    history = FitHistory(optimizer=optimizer)
    start = time.perf_counter()
    calm = 0
    with model.inference_settings(), tqdm(total=max_iter, disable=not progress, desc="fit", leave=False) as bar:
        for _ in range(max_iter):
            loss = float(opt.step(closure).detach())
            if not math.isfinite(loss):
                raise ValueError(
                    f"the loss became {loss} during training; try optimizer='adam' with a smaller lr, "
                    "float64, or standardize=True"
                )
            previous = history.loss[-1] if history.loss else None
            history.loss.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.5g}")
            if previous is not None and abs(previous - loss) <= tolerance * max(1.0, abs(loss)):
                calm += 1
                if calm >= 3:
                    history.converged = True
                    break
                if optimizer == "lbfgs" and loss == previous:
                    # A failed line search leaves L-BFGS stuck on a stale curvature
                    # model; restart it from the current point.
                    opt.state.clear()
            else:
                calm = 0
    history.seconds = time.perf_counter() - start
    model.eval()
    return history
