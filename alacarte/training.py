"""The training entry point: maximise the marginal likelihood with L-BFGS or Adam."""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field

import gpytorch
import numpy as np
import torch
from linear_operator.utils.errors import NotPSDError
from tqdm.auto import tqdm

from ._validation import check_positive_int
from .init import initialize
from .mll import WoodburyMarginalLogLikelihood
from .models import ExactRBFGP, FeatureGP
from .selection.simplex import SimplexStep
from .woodbury import NotPositiveDefiniteError

__all__ = ["FitHistory", "fit", "marginal_log_likelihood"]


@dataclass
class FitHistory:
    """What :func:`fit` did.

    ``loss`` is the negative log marginal likelihood per data point
    (standardised units, log priors included) at the start of every iteration
    of the final optimisation; ``restart_losses`` the loss each restart reached,
    and ``chosen_restart`` the one training continued from.
    """

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    converged: bool = False
    optimizer: str = "lbfgs"
    restart_losses: list[float] = field(default_factory=list)
    chosen_restart: int | None = None

    @property
    def iterations(self) -> int:
        return len(self.loss)


def marginal_log_likelihood(model):
    """The right marginal likelihood for ``model``: Woodbury for feature GPs, exact otherwise."""
    if isinstance(model, FeatureGP):
        return WoodburyMarginalLogLikelihood(model.likelihood, model)
    return gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


def _optimize(model, x, y, optimizer: str, max_iter: int, lr, tolerance: float, bar) -> tuple[list[float], bool]:
    """Run the optimiser from the model's current state; returns (losses, converged)."""
    model.train()
    mll = marginal_log_likelihood(model)
    # Simplex weights π get projected-gradient steps of their own (SimplexStep says why).
    simplex = SimplexStep(model)
    params = [p for p in model.parameters() if p.requires_grad and not simplex.owns(p)]
    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=lr or 1.0, max_iter=1, history_size=20, line_search_fn="strong_wolfe")
    else:
        opt = torch.optim.Adam(params, lr=lr or 0.05)

    def closure():
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        return loss

    losses: list[float] = []
    calm = 0
    good_state = copy.deepcopy(model.state_dict())
    with model.inference_settings():
        for _ in range(max_iter):
            try:
                loss = float(opt.step(closure).detach())
                if simplex:
                    simplex.step(lambda: -mll(model(x), y))
            except (NotPSDError, NotPositiveDefiniteError):
                loss = math.nan
            if not math.isfinite(loss):
                # An extreme line-search probe broke the factorisation: keep the last good point.
                model.load_state_dict(good_state)
                warnings.warn(
                    f"training stopped after {len(losses)} iterations: the loss became non-finite or the "
                    "covariance lost positive definiteness; the last good parameters are kept",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return losses, False
            good_state = copy.deepcopy(model.state_dict())
            previous = losses[-1] if losses else None
            losses.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.5g}")
            if previous is not None and abs(previous - loss) <= tolerance * max(1.0, abs(loss)):
                calm += 1
                if calm >= 3:
                    return losses, True
                if optimizer == "lbfgs" and loss == previous:
                    # A failed line search leaves L-BFGS stuck on a stale curvature
                    # model; restart it from the current point.
                    opt.state.clear()
            else:
                calm = 0
    return losses, False


@torch.no_grad()
def _current_loss(model, x, y) -> float:
    model.train()
    with model.inference_settings():
        return float(-marginal_log_likelihood(model)(model(x), y))


def fit(
    model: FeatureGP | ExactRBFGP,
    x,
    y,
    *,
    optimizer: str = "lbfgs",
    max_iter: int = 100,
    restarts: int = 5,
    restart_iter: int = 15,
    lr: float | None = None,
    tolerance: float = 1e-7,
    standardize: bool = True,
    seed: int | None = 0,
    progress: bool = True,
) -> FitHistory:
    """Fit a GP's hyperparameters by maximising its marginal likelihood.

    Inputs are standardised per column and targets to mean 0 / std 1 (stored in
    the model, so :meth:`~alacarte.FeatureGP.predict` answers in original units).
    With ``restarts = k ≥ 1``, k data-driven initialisations (:mod:`alacarte.init`;
    the first at the median pair distance, the others at random quantiles drawn
    from ``seed``) are each optimised for ``restart_iter`` iterations from the
    model's state at the call; the best marginal likelihood is kept and
    optimised for ``max_iter`` more.  ``restarts=0`` trains from the model's
    current hyperparameters as they are.

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP`.
        x, y: training data, (n, d) and (n,), tensors or arrays.
        optimizer: ``"lbfgs"`` (strong-Wolfe line search; the default) or ``"adam"``.
        max_iter: iterations of the final optimisation.
        restarts: number of random initialisations to try (0: none).
        restart_iter: iterations per restart.
        lr: step size (default 1.0 for L-BFGS, 0.05 for Adam).
        tolerance: stop when the loss changes by less than this (relative) for
            three iterations in a row.
        standardize: standardise inputs and targets (recommended).
        seed: seeds the restarts and torch's generator, for bit-for-bit reproducible fits.
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
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"restarts must be a non-negative integer, got {restarts!r}")
    if restarts:
        check_positive_int(restart_iter, "restart_iter")
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

    history = FitHistory(optimizer=optimizer)
    start = time.perf_counter()
    total = max_iter + restarts * restart_iter
    with tqdm(total=total, disable=not progress, desc="fit", leave=False) as bar:
        if restarts:
            rng = np.random.default_rng(seed)
            initial = copy.deepcopy(model.state_dict())
            best_state = None
            for restart in range(restarts):
                model.load_state_dict(initial)
                initialize(model, x, y, rng, restart)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a restart that fails is just not chosen
                    _optimize(model, x, y, optimizer, restart_iter, lr, tolerance, bar)
                try:
                    loss = _current_loss(model, x, y)
                except (NotPSDError, NotPositiveDefiniteError):
                    loss = math.inf
                loss = loss if math.isfinite(loss) else math.inf
                history.restart_losses.append(loss)
                if best_state is None or loss < min(history.restart_losses[:-1]):
                    best_state, history.chosen_restart = copy.deepcopy(model.state_dict()), restart
            model.load_state_dict(best_state)
        history.loss, history.converged = _optimize(model, x, y, optimizer, max_iter, lr, tolerance, bar)
    history.seconds = time.perf_counter() - start
    model.eval()
    return history
