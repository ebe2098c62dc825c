"""The training entry point: maximise the marginal likelihood with L-BFGS or Adam."""
from __future__ import annotations

import copy
import functools
import math
import numbers
import os
import time
import warnings
from dataclasses import dataclass, field

import gpytorch
import numpy as np
import torch
from linear_operator.utils.errors import NanError, NotPSDError
from tqdm.auto import tqdm

from ._checkpoint import FitCheckpoint, checkpoint_path, data_fingerprint, model_fingerprint
from ._progress import STAGES, FitShape, check_progress
from ._simplex_step import SimplexStep
from ._validation import (
    check_bool,
    check_learnable_targets,
    check_nonnegative_int,
    check_positive_int,
    check_real,
    check_seed,
)
from .holdout import PATIENCE, HeldOut, resolve_fraction, split_rows
from .init import check_initializable, initialize, set_noise
from .mll import WoodburyMarginalLogLikelihood
from .models import ExactRBFGP, FeatureGP
from .streaming import ChunkedData, as_chunked_data, is_streamed_input, streamed_negative_mll
from .woodbury import NotPositiveDefiniteError, collect_jitter, refuse_nonpositive_noise

__all__ = ["FitHistory", "fit", "marginal_log_likelihood"]


@dataclass
class FitHistory:
    """What :func:`~alacarte.fit` did.

    Attributes:
        loss: the negative log marginal likelihood per data point (standardised units, log
            priors included) at the start of every iteration of the final optimisation (and of the noise
            refit, when it was kept); ``iterations`` is its length.
        seconds: wall-clock seconds of the whole fit (a resumed fit counts its earlier runs too).
        converged: whether the optimisation that ends ``loss`` stopped on ``tolerance`` before
            ``max_iter``.
        optimizer: ``"lbfgs"`` or ``"adam"``.
        restart_losses: the score each restart reached (``inf`` where it failed): the held-out
            loss where rows are held out (``held_out_rows > 0``), else the training loss.
        chosen_restart: the restart training continued from (the lowest score; ``None`` without restarts).
        noise_refit_loss: the score of the refit from a larger noise that :func:`~alacarte.fit`
            runs when the final optimisation ends with σ² at its lower bound — kept when it is
            lower than the score there — and ``None`` when it did not end there (or the noise
            is frozen).
        held_out_rows: the training rows held out of the likelihood to score the iterates
            (:mod:`alacarte.holdout`); 0 when none were.
        validation_loss: the held-out rows' score (:class:`~alacarte.holdout.HeldOut`) at every
            iterate of the final optimisation (and of the noise refit, when kept) in order, its
            starting point first (empty when no rows were held out).
        best_iteration: the index into ``validation_loss`` of the iterate the model was left at
            (``None`` when no rows were held out).
        held_out_noise: the noise variance σ² (standardised units) then chosen by the held-out
            rows' score (:meth:`alacarte.holdout.HeldOut.calibrate`); ``None`` when no rows were
            held out or the noise or signal variance is not trained.
        held_out_scale: the factor s* by which that calibration multiplied σ_f² and σ² (``None`` likewise).
    """

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    converged: bool = False
    optimizer: str = "lbfgs"
    restart_losses: list[float] = field(default_factory=list)
    chosen_restart: int | None = None
    noise_refit_loss: float | None = None
    held_out_rows: int = 0
    validation_loss: list[float] = field(default_factory=list)
    best_iteration: int | None = None
    held_out_noise: float | None = None
    held_out_scale: float | None = None

    @property
    def iterations(self) -> int:
        """The number of iterations recorded in ``loss``."""
        return len(self.loss)


def marginal_log_likelihood(model: FeatureGP | ExactRBFGP) -> gpytorch.mlls.ExactMarginalLogLikelihood:
    """The right marginal likelihood for ``model``: Woodbury for feature GPs, exact otherwise."""
    if isinstance(model, FeatureGP):
        return WoodburyMarginalLogLikelihood(model.likelihood, model)
    return gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


def _negative_mll(model, x, y, backward: bool):
    """(the loss per point, the Woodbury likelihood's detached statistics of the rows or ``None``);
    with ``backward`` the parameters' ``.grad`` are set.  ``x`` is the internal training inputs,
    or a :class:`ChunkedData` (then ``y`` is ``None``)."""
    if isinstance(x, ChunkedData):
        return streamed_negative_mll(model, x, backward=backward), None
    mll = marginal_log_likelihood(model)
    loss = -mll(model(x), y)
    if backward:
        loss.backward()
    return loss, getattr(mll, "last_statistics", None)


# Function evaluations one L-BFGS iteration may spend, line search included.
_LBFGS_MAX_EVAL = 25
# What an over-long line-search probe raises: the Cholesky of K + σ²I (GPyTorch) or of A (Woodbury) fails.
_BROKEN_FACTORISATION = (NotPSDError, NanError, NotPositiveDefiniteError)


def _make_optimizer(params, optimizer: str, lr: float | None) -> torch.optim.Optimizer:
    """L-BFGS taking one iteration per ``step()`` (strong-Wolfe line search), or Adam.

    ``max_eval`` must be given: torch defaults it to ``max_iter·5//4``, which is 1
    for one iteration, and the line search gets the budget left after the first
    evaluation — none — so it can never backtrack: it keeps an overshooting trial
    step's point only if it happens to be lower, and otherwise stays put, the
    iteration after it stays put again, and the fit stalls short of a minimum.
    """
    if optimizer == "lbfgs":
        return torch.optim.LBFGS(params, lr=lr or 1.0, max_iter=1, max_eval=_LBFGS_MAX_EVAL, history_size=20,
                                 line_search_fn="strong_wolfe")
    return torch.optim.Adam(params, lr=lr or 0.05)


class _Optimization:
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
        self.opt = _make_optimizer(params, optimizer, lr) if params else None  # (None: π alone is trained)
        self.params = params
        # L-BFGS's step() first evaluates the loss where the step starts, which the previous step's line
        # search evaluated already: the evaluations of the latest step, by the bytes of every parameter
        # (π too, which the simplex step moves between steps), give that one back instead of computing it
        # again — the same loss and gradients, so the same path, at one evaluation per iteration.
        self.evaluations: dict[bytes, tuple] = {}
        # (the point, the kept rows' statistics) of the latest evaluation only: they are D×D.
        self.latest_statistics: tuple[bytes | None, object] = (None, None)
        self.statistics = None  # of the latest _loss
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
        loss, self.statistics = _negative_mll(self.model, self.x, self.y, backward=backward)
        return loss

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
        model, opt, simplex = self.model, self.opt, self.simplex
        model.train()
        # σ² ≤ 0 where the optimisation starts is the model's own setting (restarts=0, or a frozen noise under
        # a constraint that allows it), not an over-long probe, which is taken as a failed step: refuse it by
        # name rather than stop after 0 iterations with a warning and return the model as it was.
        refuse_nonpositive_noise(model.likelihood.noise, where=" where fit starts")
        # Likewise a NaN parameter there (not an infinite raw value: σ² set at its bound has raw −∞).
        nan = [name for name, p in model.named_parameters() if bool(torch.isnan(p).any())]
        if nan:
            raise ValueError(f"the model's parameters {nan} are NaN where fit starts; set them to numbers")

        def closure():
            key = self._parameter_key() if self.lbfgs else None
            if key is not None and key in self.evaluations:
                loss, grads = self.evaluations[key]
                for p, grad in zip(self.params, grads):
                    p.grad = None if grad is None else grad.clone()
                return loss
            opt.zero_grad()
            loss = self._loss(backward=True)
            if key is not None:
                self.evaluations[key] = (loss.detach(), [None if p.grad is None else p.grad.detach().clone()
                                                         for p in self.params])
                self.latest_statistics = (key, self.statistics)
            return loss

        with model.inference_settings():
            if self.held_out is not None and not self.validation:
                self._score()  # where the optimisation starts
            while self.iteration < self.max_iter:
                if before_iteration is not None:
                    before_iteration()
                self.iteration += 1
                if self.lbfgs:  # of the evaluations kept, only the one where this step starts can be asked for
                    key = self._parameter_key()
                    self.evaluations = {key: self.evaluations[key]} if key in self.evaluations else {}
                try:
                    loss = float(opt.step(closure).detach()) if opt is not None else float(self._loss(False))
                    if simplex:
                        simplex.step(lambda: self._loss(backward=False))
                except _BROKEN_FACTORISATION:
                    loss = math.nan
                if math.isfinite(loss) and any(bool(torch.isnan(p).any()) for p in model.parameters()):
                    # a finite loss with a NaN gradient stepped to NaN (Adam at a large lr); an infinite raw
                    # value is legitimate (σ² set exactly at its bound has raw −∞)
                    loss = math.nan
                if not math.isfinite(loss):
                    if not self.failed:
                        # An extreme line-search probe broke the factorisation: once, retry from the start
                        # of this step without the optimiser's memory (L-BFGS's curvature pairs proposed
                        # the step that broke it).
                        model.load_state_dict(self.good_state)
                        self.failed = True
                        if opt is not None:
                            opt.state.clear()
                        continue
                    # Two failures in a row end the fit, at the newest point known to be finite.
                    model.load_state_dict(self.verified_state)
                    warnings.warn(
                        f"training stopped after {len(self.losses)} iterations: the loss became non-finite or the "
                        "covariance lost positive definiteness; the last good parameters are kept",
                        RuntimeWarning,
                        stacklevel=5,  # run, _run_stage, _Training.run, fit, the caller
                    )
                    return self._finish(False)
                self.failed = False
                self.verified_state, self.good_state = self.good_state, copy.deepcopy(model.state_dict())
                previous = self.losses[-1] if self.losses else None
                self.losses.append(loss)
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{loss:.5g}")
                if self.held_out is not None and self._score():
                    return self._finish(False)
                # π still moving (towards exact zeros, often at no visible change of the loss) is not convergence.
                pi_settled = not (simplex and simplex.moved)
                if previous is not None and pi_settled and abs(previous - loss) <= self.tolerance * max(1.0, abs(loss)):
                    self.calm += 1
                    if self.calm >= 3:
                        return self._finish(True)
                    if self.lbfgs and loss == previous and opt is not None:
                        # A failed line search leaves L-BFGS stuck on a stale curvature
                        # model; restart it from the current point.
                        opt.state.clear()
                else:
                    self.calm = 0
        return self._finish(False)


@torch.no_grad()
def _current_loss(model, x, y) -> float:
    model.train()
    with model.inference_settings():
        return float(_negative_mll(model, x, y, backward=False)[0])


# Seconds between checkpoint writes: a killed fit loses at most this much work (and the
# first iteration of every stage is saved whatever the time).
_CHECKPOINT_INTERVAL = 10.0
_STAGES = STAGES


class _Training:
    """:func:`fit`'s stages — restarts, the final optimisation, the refit from a larger
    noise — and what they decide, saved to a checkpoint (when given) at the start of
    iterations and resumed from it: a resumed fit ends bit for bit where the
    uninterrupted fit would have."""

    def __init__(self, model, x, y, initial_data, data, *, optimizer, max_iter, restarts, restart_iter, lr,
                 tolerance, seed, standardize, bar, jitters, checkpoint: FitCheckpoint | None,
                 held_out: HeldOut | None, all_targets: torch.Tensor | None):
        self.model, self.x, self.y, self.initial_data, self.data = model, x, y, initial_data, data
        self.held_out, self.all_targets = held_out, all_targets
        self.validation, self.best_iteration = [], None  # of the latest optimisation
        self.optimizer, self.max_iter, self.lr, self.tolerance = optimizer, max_iter, lr, tolerance
        self.restarts, self.restart_iter, self.standardize = restarts, restart_iter, standardize
        self.bar, self.jitters, self.checkpoint = bar, jitters, checkpoint
        self.history = FitHistory(optimizer=optimizer, held_out_rows=0 if held_out is None else held_out.rows)
        self.rng = np.random.default_rng(seed)
        self.initial = copy.deepcopy(model.state_dict()) if restarts else None
        self.best_state = None
        self.at_bound = None  # (loss, state) where the final optimisation ended, before the noise refit
        self.stage = ("restart", 0)
        self.current: _Optimization | None = None
        self.started, self.earlier_seconds, self.last_save = time.perf_counter(), 0.0, -math.inf
        self.resume = checkpoint.load() if checkpoint is not None else None
        if self.resume is not None:
            try:
                check_progress(self.resume, self._shape())
            except ValueError as err:
                raise ValueError(f"checkpoint {checkpoint.path} cannot be resumed ({err}); pass another path, "
                                 "or delete it to fit from the start") from None
            self._restore(self.resume)

    # -- checkpoints ----------------------------------------------------------------------------
    def _shape(self) -> FitShape:
        """What this fit's checkpoint can hold (the optimiser as :class:`_Optimization` builds it)."""
        simplex = SimplexStep(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad and not simplex.owns(p)]
        groups = _make_optimizer(params, self.optimizer, self.lr).state_dict()["param_groups"] if params else None
        return FitShape(state=self.model.state_dict(), parameters=params, param_groups=groups,
                        optimizer=self.optimizer, simplex=list(simplex.parameters), restarts=self.restarts,
                        restart_iter=self.restart_iter or 0, max_iter=self.max_iter, held_out=self.held_out is not None)

    def seconds(self) -> float:
        return self.earlier_seconds + time.perf_counter() - self.started

    def _snapshot(self) -> dict:
        h = self.history
        return {
            "stage": list(self.stage), "run": None if self.current is None else self.current.state_dict(),
            "model": self.model.state_dict() if self.current is None else None,
            "rng": self.rng.bit_generator.state,
            "best_state": self.best_state, "at_bound": self.at_bound,
            "history": {"loss": h.loss, "converged": h.converged, "restart_losses": h.restart_losses,
                        "chosen_restart": h.chosen_restart, "noise_refit_loss": h.noise_refit_loss,
                        "validation_loss": h.validation_loss, "best_iteration": h.best_iteration,
                        "held_out_noise": h.held_out_noise, "held_out_scale": h.held_out_scale},
            "jitters": list(self.jitters), "bar": [self.bar.n, self.bar.total],
            "seconds": self.history.seconds if self.stage == ("done", 0) else self.seconds(),
        }

    def _restore(self, saved: dict) -> None:
        """Everything but the interrupted run (restored when its stage comes)."""
        self.rng.bit_generator.state = saved["rng"]
        self.best_state, self.at_bound = saved["best_state"], saved["at_bound"]
        for name, value in saved["history"].items():
            setattr(self.history, name, value)
        self.jitters.extend(saved["jitters"])
        self.bar.total = saved["bar"][1]
        self.bar.update(saved["bar"][0])
        self.earlier_seconds = saved["seconds"]
        if saved["model"] is not None:
            self.model.load_state_dict(saved["model"])

    @functools.cached_property
    def target_moments(self) -> tuple[float, float] | None:
        """Mean and variance of all the targets where the optimisation sees only some of them
        (``None`` where it sees all), read once.

        Streamed, restarts see only the first rows, whose targets need not be typical (sorted by y,
        their mean was −0.57 in standardised units), and the noise refit sees none; in memory rows may
        be held out.  Restarts and the refit then start from all the targets' moments — 0 and 1 once
        standardised (the standardisation took them from all rows), else those of all the rows
        (streamed: summed over every process of a distributed fit; each calls this at the same stage)."""
        if self.data is None and self.all_targets is None:
            return None
        if self.standardize:
            return 0.0, 1.0
        if self.data is None:
            return float(self.all_targets.mean()), float(self.all_targets.var())
        target_mean, target_std = self.data.moments(self.model)[2:]
        return float(target_mean), float(target_std) ** 2

    def _save(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.checkpoint is not None and (force or now - self.last_save >= _CHECKPOINT_INTERVAL):
            self.checkpoint.save(self._snapshot())
            self.last_save = now

    # -- stages ----------------------------------------------------------------------------------
    def _skipped(self, stage: tuple[str, int]) -> bool:
        """Whether the checkpoint is past ``stage`` (a resumed fit does not run it again)."""
        if self.resume is None:
            return False
        saved = (_STAGES.index(self.resume["stage"][0]), self.resume["stage"][1])
        return saved > (_STAGES.index(stage[0]), stage[1])

    def _resuming(self, stage: tuple[str, int]) -> bool:
        return self.resume is not None and tuple(self.resume["stage"]) == stage

    def _run_stage(self, stage: tuple[str, int], max_iter: int, begin) -> tuple[list[float], bool]:
        """One optimisation: begun here by ``begin()``, or continued from the checkpoint."""
        self.stage = stage
        resumed = self._resuming(stage)
        if not resumed:
            begin()
        self.current = _Optimization(self.model, self.x, self.y, self.optimizer, max_iter, self.lr,
                                     self.tolerance, self.bar, self.held_out)
        if resumed:
            self.current.load_state_dict(self.resume["run"])
            self.resume = None
        self.last_save = -math.inf  # save every stage's first iteration
        try:
            losses, converged = self.current.run(self._save)
            self.validation = self.current.validation
            self.best_iteration = None if self.current.best is None else self.current.best[0]
            return losses, converged
        finally:
            self.current = None

    def _score(self) -> float:
        """What decides between optimisations at the model's current state: the held-out loss where
        rows are held out, else the training loss (``inf`` where it cannot be computed)."""
        if self.held_out is not None and self.best_iteration is not None:
            # The latest optimisation left the model at its best-scored iterate: that score, not computed again.
            return self.validation[self.best_iteration]
        try:
            value = self.held_out.loss() if self.held_out is not None else _current_loss(self.model, self.x, self.y)
        except _BROKEN_FACTORISATION:
            value = math.inf
        return value if math.isfinite(value) else math.inf

    def run(self) -> FitHistory:
        model, history = self.model, self.history
        for restart in range(self.restarts):
            if self._skipped(("restart", restart)):
                continue

            def begin(restart=restart):
                model.load_state_dict(self.initial)
                initialize(model, *self.initial_data, self.rng, restart, self.standardize,
                           self.target_moments)
                if self.data is not None:  # every process continues from rank 0's initial values
                    self.data.broadcast_state_(model)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a restart that fails is just not chosen
                self._run_stage(("restart", restart), self.restart_iter, begin)
            loss = self._score()
            history.restart_losses.append(loss)
            if self.best_state is None or loss < min(history.restart_losses[:-1]):
                self.best_state, history.chosen_restart = copy.deepcopy(model.state_dict()), restart
        if not self._skipped(("final", 0)):
            history.loss, history.converged = self._run_stage(
                ("final", 0), self.max_iter, lambda: self.restarts and model.load_state_dict(self.best_state))
            if self.held_out is not None:
                history.validation_loss, history.best_iteration = self.validation, self.best_iteration
        if self._resuming(("refit", 0)) or (
            not self._skipped(("refit", 0))
            and _noise_at_lower_bound(model) is not None
            and model.likelihood.noise_covar.raw_noise.requires_grad
        ):
            self._refit_from_larger_noise()
        if self._resuming(("done", 0)):  # finished before: its result, as it was
            history.seconds = self.earlier_seconds
        else:
            calibrated = None if self.held_out is None else self.held_out.calibrate()
            if calibrated is not None:
                history.held_out_noise, history.held_out_scale = calibrated
            history.seconds = self.seconds()
            self.stage = ("done", 0)
            self._save(force=True)
        self.resume = None
        return history

    def _refit_from_larger_noise(self) -> None:
        """Optimise again from σ² = 0.1 × the target variance; keep the refit if its loss is lower (see :func:`fit`).

        Streamed targets (``y`` None) and held-out rows take :attr:`target_moments` (every process of a
        distributed fit must start the refit from the same σ²): taking 1 unstandardised started the
        refit elsewhere than the in-memory fit did."""
        model, x, y, history = self.model, self.x, self.y, self.history

        def target_variance() -> float:
            if self.target_moments is not None:
                return self.target_moments[1]
            return float(y.var()) if y.numel() > 1 else 1.0

        def begin():
            self.at_bound = (self._score(), copy.deepcopy(model.state_dict()))
            set_noise(model, 0.1 * target_variance())
            self.bar.total += self.max_iter

        losses, converged = self._run_stage(("refit", 0), self.max_iter, begin)
        history.noise_refit_loss = self._score()
        if history.noise_refit_loss < self.at_bound[0]:
            if self.held_out is not None:
                history.best_iteration = len(history.validation_loss) + self.best_iteration
                history.validation_loss = history.validation_loss + self.validation
            history.loss += losses
            history.converged = converged
        else:
            model.load_state_dict(self.at_bound[1])


def fit(
    model: FeatureGP | ExactRBFGP,
    x,
    y=None,
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
    chunk_size: int | None = None,
    memory_budget: int | None = None,
    statistics_dtype: torch.dtype | None = None,
    checkpoint: str | os.PathLike | None = None,
    validation_fraction: float | str = "auto",
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

    **Held-out rows** (by default 20% for a feature GP with rows in memory;
    :func:`~alacarte.holdout.resolve_fraction`).  That share of the rows (at most
    5 000; none below 10 rows) is held out: the marginal likelihood is maximised on
    the others, every iterate is scored by the held-out rows' negative log
    predictive density at its best overall variance scale, each optimisation
    (restart, final, refit) ends at its best-scored iterate and stops after 20
    iterations without a better one, the restarts and the refit are chosen by that
    score, and then σ² and the scale of σ_f² and σ² are set to minimise it.  The
    posterior is conditioned on all rows.  Learned spectra otherwise over-fit the
    likelihood — they tune the finite feature map until it interpolates the
    training targets — and a finite map's posterior variance between the training
    rows is too small; both make the predictive intervals far too narrow
    (:mod:`alacarte.holdout`; docs/calibration.md).  ``validation_fraction=0``
    fits on all rows by marginal likelihood alone, as the À la carte paper did.

    A final optimisation that ends with the noise variance σ² at its lower
    bound is run once more, for ``max_iter`` iterations, from σ² = 0.1 × the
    (standardised) target variance and the other hyperparameters where they
    ended; the lower loss is kept.  Near the bound the constraint's softplus
    flattens the gradient, so the optimiser can stall there although the
    likelihood is better inside (exact ARD on SE1, n = 2000: 1.223 per point
    at the bound, 1.196 with σ² = 0.139).  A noise that is not trained
    (``requires_grad`` off) is left alone.

    **Streamed training** (:class:`~alacarte.FeatureGP` only).  Given a
    memory-mapped array (``np.load(path, mmap_mode="r")``), a re-iterable of
    ``(x, y)`` chunks (a ``DataLoader``; ``y=None``), a
    :class:`~alacarte.streaming.ChunkedData`, or any of ``chunk_size``,
    ``memory_budget``, ``statistics_dtype``, the likelihood and its exact
    gradient are streamed over chunks of rows (:mod:`alacarte.streaming`):
    memory O(chunk·D + D²) whatever n, and neither the rows nor their features
    are held.  Column means and standard deviations are streamed too; restarts
    take their lengthscales from pair distances among the first 10 000 rows and
    the mean, noise and signal variance from all the targets' streamed moments;
    the posterior for prediction is streamed at the end.  For several processes see :mod:`alacarte.distributed`.

    **Resuming a killed fit.**  With ``checkpoint=path`` the fit's progress —
    the model, the optimiser's memory, the restarts' random generator and the stage
    (which restart, the final optimisation, the noise refit) — is written to
    ``path`` at the first iteration of every stage and then every 10 seconds,
    atomically (a kill mid-write leaves the previous checkpoint).  Calling
    ``fit`` again with the same model as built, data, settings and path resumes
    from it and ends bit for bit where the uninterrupted fit would have (run
    with the same torch and thread settings: round-off depends on them); once
    the fit has finished the file holds its result, and the call returns it at
    once.  A checkpoint of another fit (other settings, data, or a model with
    other parameters or random features) is refused with a ``ValueError``:
    delete it to fit from the start.  Chunks must come in the same order to
    resume (a shuffling ``DataLoader`` cannot: its sums round otherwise).  In a distributed fit rank 0 reads and
    writes the file.

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP`.
        x, y: training data, (n, d) and (n,), tensors or (memory-mapped) arrays;
            or ``x`` a re-iterable of ``(x, y)`` chunks and ``y=None``.
        optimizer: ``"lbfgs"`` (strong-Wolfe line search; the default) or ``"adam"``.
        max_iter: iterations of the final optimisation.
        restarts: number of random initialisations to try (0: none).
        restart_iter: iterations per restart.
        lr: step size (default 1.0 for L-BFGS, 0.05 for Adam).
        tolerance: stop when the loss changes by at most ``tolerance × max(1, |loss|)``
            for three iterations in a row (relative to the loss, absolute where ``|loss| < 1``:
            the loss per point is often near 0).
        standardize: standardise inputs and targets (recommended).
        seed: seeds the restarts, for bit-for-bit reproducible fits (torch's global generator is
            neither used nor reset: a reset made every kernel built with ``seed=None`` after a fit
            draw the same random features).
        progress: show a progress bar.
        chunk_size: rows per chunk of the streamed likelihood.
        memory_budget: bytes one streamed evaluation may take (default 256 MiB;
            sets the chunk size; give this or ``chunk_size``).
        statistics_dtype: accumulate ΦᵀΦ, Φᵀr, rᵀr and the loss in this dtype,
            e.g. ``torch.float64`` for a float32 model: float32 features with
            float64 accuracy of the likelihood.
        checkpoint: a file that keeps the fit's progress, so that a killed fit
            resumes (see above); ``None``: none.
        validation_fraction: the share of the rows held out to score iterates and choose σ² (see
            above), in [0, 1); 0: none; ``"auto"``: 0.2 for a feature GP with rows in memory, else 0.

    Returns:
        The :class:`~alacarte.training.FitHistory`; the model is left in eval mode.

    Raises:
        ValueError: bad data (non-finite, wrong shape, fewer than 2 rows, a
            constant target, magnitudes that overflow) or a bad setting.

    Example:
        >>> import torch
        >>> from alacarte import FeatureGP, FSARDKernel, fit
        >>> generator = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 3, generator=generator) * 4 - 2
        >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(200, generator=generator)
        >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
        >>> history = fit(model, x, y, max_iter=30, restarts=2, restart_iter=5)
        >>> len(history.restart_losses), history.loss[-1] < history.loss[0]
        (2, True)
        >>> model.training                           # left in eval mode, ready to predict
        False
    """
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    max_iter = check_positive_int(max_iter, "max_iter")
    restarts = check_nonnegative_int(restarts, "restarts")
    if restarts:
        restart_iter = check_positive_int(restart_iter, "restart_iter")
    if lr is not None:
        lr = check_real(lr, "lr", 0)
    if not (isinstance(tolerance, numbers.Real) and tolerance >= 0):
        raise ValueError(f"tolerance must be a non-negative number, got {tolerance!r}")
    seed = check_seed(seed)
    standardize = check_bool(standardize, "standardize")  # a truthy "no" or "False" would standardise
    if checkpoint is not None:  # before any pass over the data: a bad path must not cost one
        checkpoint = checkpoint_path(checkpoint)
    given_model = model_fingerprint(model) if checkpoint is not None else None
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("every parameter of the model is frozen (requires_grad=False): there is nothing to fit; "
                         "unfreeze one, or use the model as it is (model.eval())")
    # The mean's batch_shape, not its .constant: a ZeroMean or LinearMean of the user's has none (fit trains them
    # with restarts=0).  GPyTorch's LinearMean keeps no batch_shape either, and passes as unbatched.
    batched = [name for name, part in (("kernel", model.covar_module.batch_shape),
                                       ("mean", getattr(model.mean_module, "batch_shape", torch.Size())),
                                       ("noise", model.likelihood.noise.shape[:-1])) if len(part)]
    if batched:
        # One loss per member: its restarts, convergence and history are per model, and the backward of a
        # batch of losses failed ('grad can be implicitly created only for scalar outputs').
        raise ValueError(f"fit trains one model at a time; this one has a batch_shape in its {', '.join(batched)}: "
                         "fit each member, or train the batch with a GPyTorch loop on the summed loss")
    if restarts:
        check_initializable(model)
    streamed = is_streamed_input(x, y, chunk_size, memory_budget, statistics_dtype)
    validation_fraction = resolve_fraction(validation_fraction, model, streamed)  # before any pass over the data
    if streamed:
        if not isinstance(model, FeatureGP):
            raise ValueError(
                f"{type(model).__name__} needs all rows in memory (its likelihood is O(n²) and does not "
                "decompose into sums over rows): streamed input, chunk_size, memory_budget and "
                "statistics_dtype are for FeatureGP"
            )
        if SimplexStep(model):
            raise ValueError(
                "simplex-ARD kernels train by projected gradient on the in-memory likelihood; streamed input "
                "(chunk_size, memory_budget, memory-mapped or chunked data) is not supported for them yet"
            )
        data = as_chunked_data(x, y, chunk_size=chunk_size, memory_budget=memory_budget,
                               statistics_dtype=statistics_dtype)
    elif y is None:
        raise ValueError("y is required when x is an array; pass y=None only with an iterable of (x, y) chunks")
    else:
        # Data, not variables: an x or y that requires grad put the standardisation into every loss's
        # graph, and the second backward failed (with restarts the first: its buffers were overwritten).
        x, y = (t.detach() for t in model.check_data(x, y))
        check_learnable_targets(x.shape[0], float(y.min()), float(y.max()))
        raw_x, raw_y = x, y
    if standardize and streamed:
        model.set_standardization(*data.moments(model))
    elif standardize:
        x, y = model.standardize(x, y)
    else:
        for name in ("input_offset", "target_offset"):
            getattr(model, name).zero_()
        for name in ("input_scale", "target_scale"):
            getattr(model, name).fill_(1.0)
    held_out, rows = None, None
    if streamed:
        model.train_inputs, model.train_targets = None, None
        initial_data = data.sample(model) if restarts else None
        x, y = data, None
        fit_rows = (x, y)
    else:
        rows = split_rows(x.shape[0], validation_fraction, seed)
        if rows is not None:
            held_out = HeldOut(model, x[rows[1]], y[rows[1]])
        initial_data = fit_rows = (x, y) if rows is None else (x[rows[0]], y[rows[0]])
        model.set_train_data(*fit_rows, strict=False)

    store = None
    if checkpoint is not None:
        key = {
            "optimizer": optimizer, "max_iter": max_iter, "restarts": restarts,
            "restart_iter": restart_iter if restarts else None, "lr": lr, "tolerance": float(tolerance),
            "standardize": standardize, "seed": seed, "model": given_model,
            "validation_fraction": validation_fraction,
            "chunk_rows": data.rows(model) if streamed else None,
            "statistics_dtype": str(data.statistics_dtype) if streamed else None,
            "data": data_fingerprint(data.chunks(model) if streamed else [(raw_x, raw_y)]),
        }
        store = FitCheckpoint(checkpoint, key, data if streamed else None)
    total = max_iter + restarts * restart_iter
    with tqdm(total=total, disable=not progress, desc="fit", leave=False) as bar, collect_jitter() as jitters:
        history = _Training(
            model, *fit_rows, initial_data, data if streamed else None,
            optimizer=optimizer, max_iter=max_iter, restarts=restarts, restart_iter=restart_iter, lr=lr,
            tolerance=tolerance, seed=seed, standardize=standardize, bar=bar, jitters=jitters, checkpoint=store,
            held_out=held_out, all_targets=None if rows is None else y,
        ).run()
    if rows is not None:  # the posterior of all rows
        model.set_train_data(x, y, strict=False)
    if jitters:  # one warning per fit, not one per iteration
        warnings.warn(
            f"ΦᵀΦ + σ²I (ΦΦᵀ + σ²I when n < D) was not numerically positive definite in {len(jitters)} "
            f"factorisations during training; jitter up to {max(jitters):.1e}×its mean diagonal was "
            "added to its diagonal. "
            "Consider a larger noise lower bound or float64.",
            RuntimeWarning,
            stacklevel=2,
        )
    if isinstance(model, FeatureGP):
        _warn_if_float32_loss_is_off(model, x, y)
    model.eval()
    _warn_if_noise_at_lower_bound(model, None if streamed else x, None if streamed else y, standardize)
    if streamed:
        model.cache_posterior(data)
    return history


# Float32 and float64 losses of the fits we measured agreed to ≤ 1.2e-3 per point (GM, FSARD, PWL
# on UCI energy, yacht, concrete, SE1); a float32 PWL fit on energy that followed round-off was 0.81 off
# (experiments/results/float32_check.md).
_FLOAT32_LOSS_TOLERANCE = 0.01


def _warn_if_float32_loss_is_off(model: FeatureGP, x: torch.Tensor | ChunkedData, y: torch.Tensor | None) -> None:
    """Warn when a model fitted in less than float64 has, at its fitted hyperparameters, a loss
    that float64 arithmetic puts more than :data:`_FLOAT32_LOSS_TOLERANCE` per point away.

    Then ΦᵀΦ + σ²I was too ill-conditioned for the dtype (small σ², jitter added), and the
    optimiser may have followed round-off to a point that is no optimum at all (energy, PWL:
    test RMSE 2.26 in float32, 0.43 in float64).  Costs one float64 evaluation (streamed: two
    passes, the second with float64 statistics of the same features)."""
    streamed = isinstance(x, ChunkedData)
    dtype = (x.statistics_dtype or model.input_offset.dtype) if streamed else x.dtype
    if dtype == torch.float64:
        return
    loss, wide_loss = _own_and_float64_losses(model, x, y)
    if not abs(loss - wide_loss) <= _FLOAT32_LOSS_TOLERANCE:
        remedy = ("model.double(), or keep float32 features with statistics_dtype=torch.float64" if streamed
                  else "model.double()")
        name = str(dtype).removeprefix("torch.")
        warnings.warn(
            f"the {name} loss at the fitted hyperparameters is {loss:.4f} per point, but {wide_loss:.4f} in "
            f"float64 arithmetic: ΦᵀΦ + σ²I is too ill-conditioned for {name} at "
            f"σ² = {float(model.likelihood.noise.detach().min()):.2g}, and the optimiser may have followed its "
            f"round-off away from any optimum. Fit in float64: {remedy}.",
            RuntimeWarning,
            stacklevel=3,
        )


def _own_and_float64_losses(model: FeatureGP, x: torch.Tensor | ChunkedData, y: torch.Tensor | None
                            ) -> tuple[float, float]:
    """The loss per point at the model's hyperparameters in its own arithmetic and in float64 (what
    :func:`_warn_if_float32_loss_is_off` compares); streamed, the second from float64 statistics of
    the same features.  A diagnosis, not one of the fit's evaluations (the checkpoint counts those)."""
    if isinstance(x, ChunkedData):
        wide_data = copy.copy(x)
        wide_data.statistics_dtype = torch.float64

        def losses() -> tuple[float, float]:
            return (float(streamed_negative_mll(model, x, backward=False)),
                    float(streamed_negative_mll(model, wide_data, backward=False)))
    else:
        wide = copy.deepcopy(model).double()
        wide.set_train_data(x.double(), y.double(), strict=False)

        def loss_of(gp, inputs, targets) -> float:
            gp.train()
            with torch.no_grad(), gp.inference_settings():
                return float(-marginal_log_likelihood(gp)(gp(inputs), targets))

        def losses() -> tuple[float, float]:
            return loss_of(model, x, y), loss_of(wide, x.double(), y.double())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fit has said what jitter its factorisations needed
        return losses()


def noise_at_bound(noise: float, bound: float) -> bool:
    """Whether σ² = ``noise`` has ended at its lower ``bound``: within twice it (where :func:`fit` refits and warns)."""
    return bound > 0 and noise <= 2 * bound


def _noise_at_lower_bound(model) -> tuple[float, float] | None:
    """(σ², its lower bound) when σ² is at the bound (:func:`noise_at_bound`), else ``None``."""
    bound = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound)
    noise = float(model.likelihood.noise.detach().min())
    return (noise, bound) if noise_at_bound(noise, bound) else None


def _warn_if_noise_at_lower_bound(model, x: torch.Tensor | None, y: torch.Tensor | None,
                                  standardized: bool) -> None:
    """Warn when σ² ended at its constraint's lower bound.

    There the fit interpolates the training targets.  On real data that is
    rarely the best model even when it has the best marginal likelihood:
    repeated rows are the usual cause (the likelihood takes copies for
    independent observations that agree, so σ² → 0 pays); docs/benchmarks.md
    shows it on UCI wine.  Targets that truly have no noise are the other
    case: there the bound (GPyTorch's default 1e-4 in standardised units) is
    what stops the fit, as on UCI parkinsons.  When σ² is trained, :func:`fit`
    has already refitted from a larger noise (the optimiser can stall at the
    bound) when this warns.
    """
    at_bound = _noise_at_lower_bound(model)
    if at_bound is None:
        return
    noise, bound = at_bound
    units = "in standardised units" if standardized else "in the targets' units"
    variance = None if y is None or y.numel() < 2 else float(y.var())
    if not standardized and variance is not None and bound >= variance:
        # Not interpolation but its opposite: every target is taken for noise.
        warnings.warn(
            f"the noise variance's lower bound ({bound:.1e} {units}, standardize=False) is not below the targets' "
            f"variance ({variance:.3g}): the model takes the targets for noise and predicts about their mean. "
            "Fit with standardize=True, or lower the bound: GaussianLikelihood(noise_constraint=GreaterThan(...)).",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    trained = model.likelihood.noise_covar.raw_noise.requires_grad  # else set there by the user, and not refitted
    repeated = ""
    if x is not None and x.dim() == 2:
        copies = x.shape[0] - torch.unique(x, dim=0).shape[0]
        if copies:
            repeated = f" The training inputs repeat {copies} rows; repeated rows are the usual cause."
    warnings.warn(
        f"the noise variance {'ended' if trained else 'is fixed (not trained)'} at its lower bound ({noise:.3g} ≤ "
        f"2×{bound:.1e} {units}): the model interpolates its training targets, which generalises "
        f"worse unless they are noise-free.{repeated} "
        + ("A refit from a larger noise did not leave the bound with a better likelihood. " if trained else "")
        + "Drop repeated rows, or raise the bound; for targets without noise, lower it (docs/benchmarks.md, "
        "Parkinsons): GaussianLikelihood(noise_constraint=GreaterThan(...)).",
        RuntimeWarning,
        stacklevel=3,
    )
