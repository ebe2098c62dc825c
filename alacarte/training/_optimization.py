"""One optimisation of the marginal likelihood — a restart's, the final one or the noise refit —
that can be saved between iterations and resumed bit for bit."""
from __future__ import annotations

import copy
import math
import warnings

import gpytorch
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from ..holdout import PATIENCE, HeldOut
from ..mll import WoodburyMarginalLogLikelihood
from ..models import ExactRBFGP, FeatureGP
from .._simplex_step import SimplexStep
from ..streaming import ChunkedData, streamed_negative_mll
from ..woodbury import NotPositiveDefiniteError, refuse_nonpositive_noise

__all__ = [
    "BROKEN_FACTORISATION",
    "LBFGS_MAX_EVAL",
    "Optimization",
    "current_loss",
    "make_optimizer",
    "marginal_log_likelihood",
    "negative_mll",
]


def marginal_log_likelihood(model: FeatureGP | ExactRBFGP) -> gpytorch.mlls.ExactMarginalLogLikelihood:
    """The right marginal likelihood for ``model``: Woodbury for feature GPs, exact otherwise."""
    if isinstance(model, FeatureGP):
        return WoodburyMarginalLogLikelihood(model.likelihood, model)
    return gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


def negative_mll(model, x, y, backward: bool, mll=None):
    """The loss per point that :func:`~alacarte.fit` minimises; with ``backward`` the parameters'
    ``.grad`` are set.  ``x`` is the internal training inputs, or a
    :class:`~alacarte.streaming.ChunkedData` (then ``y`` is ``None``).  ``mll``: the marginal
    likelihood to evaluate in memory (default :func:`marginal_log_likelihood` of the model), for a
    caller that reads its :attr:`~alacarte.WoodburyMarginalLogLikelihood.last_statistics` after."""
    if isinstance(x, ChunkedData):
        return streamed_negative_mll(model, x, backward=backward)
    loss = -(mll or marginal_log_likelihood(model))(model(x), y)
    if backward:
        loss.backward()
    return loss


# Function evaluations one L-BFGS iteration may spend, line search included.
LBFGS_MAX_EVAL = 25
# What an over-long line-search probe raises: the Cholesky of K + σ²I (GPyTorch) or of A (Woodbury) fails.
BROKEN_FACTORISATION = (NotPSDError, NanError, NotPositiveDefiniteError)


def make_optimizer(params, optimizer: str, lr: float | None) -> torch.optim.Optimizer:
    """L-BFGS taking one iteration per ``step()`` (strong-Wolfe line search), or Adam.

    ``max_eval`` must be given: torch defaults it to ``max_iter·5//4``, which is 1
    for one iteration, and the line search gets the budget left after the first
    evaluation — none — so it can never backtrack: it keeps an overshooting trial
    step's point only if it happens to be lower, and otherwise stays put, the
    iteration after it stays put again, and the fit stalls short of a minimum.
    """
    if optimizer == "lbfgs":
        return torch.optim.LBFGS(params, lr=lr or 1.0, max_iter=1, max_eval=LBFGS_MAX_EVAL, history_size=20,
                                 line_search_fn="strong_wolfe")
    return torch.optim.Adam(params, lr=lr or 0.05)


class Optimization:
    """One run of the optimiser from the model's current state — a restart's, the final one or
    the noise refit — that can be saved between iterations and resumed bit for bit:
    :meth:`state_dict` holds everything the next iteration depends on."""

    def __init__(self, model, x, y, optimizer: str, max_iter: int, lr, tolerance: float, bar,
                 held_out: HeldOut | None = None):
        self.model, self.x, self.y, self.held_out = model, x, y, held_out
        self.lbfgs, self.max_iter, self.tolerance, self.bar = optimizer == "lbfgs", max_iter, tolerance, bar
        # Simplex weights π get projected-gradient steps of their own (SimplexStep says why).
        self.simplex = SimplexStep(model, inputs=x)
        params = [p for p in model.parameters() if p.requires_grad and not self.simplex.owns(p)]
        self.opt = make_optimizer(params, optimizer, lr) if params else None  # (None: π alone is trained)
        self.params = params
        # L-BFGS's step() first evaluates the loss where the step starts, which the previous step's line
        # search evaluated already: the evaluations of the latest step, by the bytes of every parameter
        # (π too, which the simplex step moves between steps), give that one back instead of computing it
        # again — the same loss and gradients, so the same path, at one evaluation per iteration.
        self.evaluations: dict[bytes, tuple] = {}
        self.mll = marginal_log_likelihood(model)
        # (the point, the kept rows' statistics) of the latest evaluation only: they are D×D.
        self.latest_statistics: tuple[bytes | None, object] = (None, None)
        self.iteration = 0
        self.losses: list[float] = []
        self.calm = 0
        self.failed = False
        # The start of the current step, and the start of the step before it: the newest point
        # whose loss is known finite (a step returns the loss where it started).
        self.good_state = copy.deepcopy(model.state_dict())
        self.verified_state = self.good_state
        # The held-out loss of every iterate, and (its index, the model's state) at the lowest.
        self.validation: list[float] = []
        self.best: tuple[int, dict] | None = None

    def state_dict(self) -> dict:
        return {
            "iteration": self.iteration, "model": self.model.state_dict(),
            "optimizer": None if self.opt is None else self.opt.state_dict(), "simplex": self.simplex.state_dict(),
            "losses": self.losses, "calm": self.calm, "failed": self.failed,
            "good_state": self.good_state, "verified_state": self.verified_state,
            "validation": self.validation, "best": self.best,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        if self.opt is not None:
            self.opt.load_state_dict(state["optimizer"])
        self.simplex.load_state_dict(state["simplex"])
        self.iteration, self.losses, self.calm, self.failed = (
            state["iteration"], list(state["losses"]), state["calm"], state["failed"])
        self.good_state, self.verified_state = state["good_state"], state["verified_state"]
        self.validation, self.best = list(state["validation"]), state["best"]

    def _loss(self, backward: bool):
        return negative_mll(self.model, self.x, self.y, backward=backward, mll=self.mll)

    def _parameter_key(self) -> bytes:
        """Every parameter's bytes: the point a loss was evaluated at."""
        return b"".join(p.detach().reshape(-1).cpu().view(torch.uint8).numpy().tobytes()
                        for p in self.model.parameters())

    def _score(self) -> bool:
        """Score the current iterate on the held-out rows; whether to stop (no better one for
        :data:`~alacarte.holdout.PATIENCE` iterations)."""
        # The line search usually ends with an evaluation at the iterate: its statistics give the
        # held-out posterior without another pass over the kept rows.
        key, statistics = self.latest_statistics
        current = key is not None and key == self._parameter_key()
        self.validation.append(self.held_out.loss(statistics if current else None))
        if self.best is None or self.validation[-1] < self.validation[self.best[0]]:
            self.best = (len(self.validation) - 1, copy.deepcopy(self.model.state_dict()))
        return len(self.validation) - 1 - self.best[0] >= PATIENCE

    def _finish(self, converged: bool) -> tuple[list[float], bool]:
        """Leave the model at the best-scored iterate (where rows are held out)."""
        if self.best is not None:
            self.model.load_state_dict(self.best[1])
        return self.losses, converged

    def run(self, before_iteration=None) -> tuple[list[float], bool]:
        """Iterate until convergence or ``max_iter``; returns (losses, converged).
        ``before_iteration()`` is called at the start of every iteration (to save a checkpoint)."""
        self.model.train()
        self._check_start()
        with self.model.inference_settings():
            if self.held_out is not None and not self.validation:
                self._score()  # where the optimisation starts
            while self.iteration < self.max_iter:
                if before_iteration is not None:
                    before_iteration()
                self.iteration += 1
                converged = self._iterate()
                if converged is not None:
                    return self._finish(converged)
        return self._finish(False)

    def _check_start(self) -> None:
        """Refuse a start no step can leave by name, rather than stop after 0 iterations with a
        warning and return the model as it was."""
        model = self.model
        # σ² ≤ 0 here is the model's own setting (restarts=0, or a frozen noise under a constraint that
        # allows it), not an over-long probe, which is taken as a failed step.
        refuse_nonpositive_noise(model.likelihood.noise, where=" where fit starts")
        # Likewise a NaN parameter (not an infinite raw value: σ² set at its bound has raw −∞).
        nan = [name for name, p in model.named_parameters() if bool(torch.isnan(p).any())]
        if nan:
            raise ValueError(f"the model's parameters {nan} are NaN where fit starts; set them to numbers")

    def _closure(self):
        """The loss and gradients at the parameters, from :attr:`evaluations` where L-BFGS asks again."""
        key = self._parameter_key() if self.lbfgs else None
        if key is not None and key in self.evaluations:
            loss, grads = self.evaluations[key]
            for p, grad in zip(self.params, grads):
                p.grad = None if grad is None else grad.clone()
            return loss
        self.opt.zero_grad()
        loss = self._loss(backward=True)
        if key is not None:
            self.evaluations[key] = (loss.detach(), [None if p.grad is None else p.grad.detach().clone()
                                                     for p in self.params])
            self.latest_statistics = (key, getattr(self.mll, "last_statistics", None))
        return loss

    def _step(self) -> float:
        """One step of the optimiser and of π; the loss where it started, NaN where it broke."""
        if self.lbfgs:  # of the evaluations kept, only the one where this step starts can be asked for
            key = self._parameter_key()
            self.evaluations = {key: self.evaluations[key]} if key in self.evaluations else {}
        try:
            loss = float(self.opt.step(self._closure).detach()) if self.opt is not None else float(self._loss(False))
            if self.simplex:
                self.simplex.step(lambda: self._loss(backward=False))
        except BROKEN_FACTORISATION:
            loss = math.nan
        if math.isfinite(loss) and any(bool(torch.isnan(p).any()) for p in self.model.parameters()):
            # a finite loss with a NaN gradient stepped to NaN (Adam at a large lr); an infinite raw
            # value is legitimate (σ² set exactly at its bound has raw −∞)
            loss = math.nan
        return loss

    def _iterate(self) -> bool | None:
        """One iteration: ``None`` to go on, else whether the optimisation converged."""
        loss = self._step()
        if not math.isfinite(loss):
            return self._recover()
        self.failed = False
        self.verified_state, self.good_state = self.good_state, copy.deepcopy(self.model.state_dict())
        previous = self.losses[-1] if self.losses else None
        self.losses.append(loss)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.5g}")
        if self.held_out is not None and self._score():
            return False
        return self._settled(previous, loss)

    def _recover(self) -> bool | None:
        """After a step that broke: go on from where it started, or stop (``False``) at the second in a row."""
        model = self.model
        if not self.failed:
            # An extreme line-search probe broke the factorisation: once, retry from the start of this
            # step without the optimiser's memory (L-BFGS's curvature pairs proposed the step that broke it).
            model.load_state_dict(self.good_state)
            self.failed = True
            if self.opt is not None:
                self.opt.state.clear()
            return None
        # Two failures in a row end the fit, at the newest point known to be finite.
        model.load_state_dict(self.verified_state)
        warnings.warn(
            f"training stopped after {len(self.losses)} iterations: the loss became non-finite or the "
            "covariance lost positive definiteness; the last good parameters are kept",
            RuntimeWarning,
            stacklevel=8,  # _recover, _iterate, run, _run_stage, Training._final, Training.run, fit, the caller
        )
        return False

    def _settled(self, previous: float | None, loss: float) -> bool | None:
        """``True`` at the third iteration in a row that changed the loss by at most the tolerance, else ``None``."""
        # π still moving (towards exact zeros, often at no visible change of the loss) is not convergence.
        pi_settled = not (self.simplex and self.simplex.moved)
        if previous is not None and pi_settled and abs(previous - loss) <= self.tolerance * max(1.0, abs(loss)):
            self.calm += 1
            if self.calm >= 3:
                return True
            if self.lbfgs and loss == previous and self.opt is not None:
                # A failed line search leaves L-BFGS stuck on a stale curvature
                # model; restart it from the current point.
                self.opt.state.clear()
        else:
            self.calm = 0
        return None


@torch.no_grad()
def current_loss(model, x, y) -> float:
    """The loss per point at the model's current hyperparameters, without gradients."""
    model.train()
    with model.inference_settings():
        return float(negative_mll(model, x, y, backward=False))
