"""The stages of :func:`~alacarte.fit` — restarts, the final optimisation, the refit from a larger
noise, the result — and the checkpoint that lets a killed fit resume between iterations."""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
import warnings

import numpy as np
import torch

from .._checkpoint import FitCheckpoint
from .._progress import STAGES, FitShape, check_progress
from ..holdout import HeldOut, scores_iterates
from ..init import initialize, set_noise
from .._simplex_step import SimplexStep
from ._diagnostics import noise_at_lower_bound
from ._history import FitHistory
from ._optimization import BROKEN_FACTORISATION, Optimization, current_loss, make_optimizer

__all__ = ["CHECKPOINT_INTERVAL", "Training"]

# Seconds between checkpoint writes: a killed fit loses at most this much work (and the
# first iteration of every stage is saved whatever the time).
CHECKPOINT_INTERVAL = 10.0


@contextlib.contextmanager
def holding_nested_parameters(model):
    """Within the block, the kernel's :attr:`~alacarte.FeatureKernel.nested_parameters` are out of the
    optimisation (``requires_grad`` off), where anything else is left to optimise."""
    kernel = model.covar_module
    held = [p for p in (getattr(kernel, name) for name in getattr(kernel, "nested_parameters", ()))
            if p.requires_grad]
    ids = {id(p) for p in held}
    if not any(p.requires_grad and id(p) not in ids for p in model.parameters()):
        held = []
    for parameter in held:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in held:
            parameter.requires_grad_(True)


def _saved_stage_name(progress) -> str | None:
    """The stage a checkpoint's progress names, where it names one (check_progress says what else is wrong)."""
    stage = progress.get("stage") if isinstance(progress, dict) else None
    return stage[0] if isinstance(stage, (list, tuple)) and stage else None


class Training:
    """:func:`~alacarte.fit`'s stages — restarts, the final optimisation, the refit from a larger
    noise — and what they decide, saved to a checkpoint (when given) at the start of
    iterations and resumed from it: a resumed fit ends bit for bit where the
    uninterrupted fit would have."""

    def __init__(self, model, x, y, initial_data, data, *, optimizer, max_iter, restarts, restart_iter, lr,
                 tolerance, seed, standardize, bar, jitters, checkpoint: FitCheckpoint | None,
                 held_out: HeldOut | None, all_rows: tuple[torch.Tensor, torch.Tensor] | None):
        self.model, self.x, self.y, self.initial_data, self.data = model, x, y, initial_data, data
        # The held-out rows set the band at the end (calibration); where they choose iterates too, held_out.
        self.calibration, self.all_rows = held_out, all_rows
        self.held_out = held_out if held_out is not None and scores_iterates(model) else None
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
        self.current: Optimization | None = None
        self.started, self.earlier_seconds, self.last_save = time.perf_counter(), 0.0, -math.inf
        self.resume = checkpoint.load() if checkpoint is not None else None
        if self.resume is not None:
            try:
                check_progress(self.resume, self._shape(_saved_stage_name(self.resume)))
            except ValueError as err:
                raise ValueError(f"checkpoint {checkpoint.path} cannot be resumed ({err}); pass another path, "
                                 "or delete it to fit from the start") from None
            self._restore(self.resume)

    # -- checkpoints ----------------------------------------------------------------------------
    def _shape(self, stage_name: str | None) -> FitShape:
        """What this fit's checkpoint can hold in the stage ``stage_name`` (the optimiser as
        :class:`Optimization` builds it there: a restart's holds the nested parameters out)."""
        simplex = SimplexStep(self.model)
        with holding_nested_parameters(self.model) if stage_name == "restart" else contextlib.nullcontext():
            params = [p for p in self.model.parameters() if p.requires_grad and not simplex.owns(p)]
        groups = make_optimizer(params, self.optimizer, self.lr).state_dict()["param_groups"] if params else None
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
                        "held_out_noise": h.held_out_noise, "held_out_scale": h.held_out_scale,
                        "final_loss": h.final_loss},
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
        if self.data is None and self.all_rows is None:
            return None
        if self.standardize:
            return 0.0, 1.0
        if self.data is None:
            targets = self.all_rows[1]
            return float(targets.mean()), float(targets.var())
        target_mean, target_std = self.data.moments(self.model)[2:]
        return float(target_mean), float(target_std) ** 2

    def _save(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.checkpoint is not None and (force or now - self.last_save >= CHECKPOINT_INTERVAL):
            self.checkpoint.save(self._snapshot())
            self.last_save = now

    # -- stages ----------------------------------------------------------------------------------
    def _skipped(self, stage: tuple[str, int]) -> bool:
        """Whether the checkpoint is past ``stage`` (a resumed fit does not run it again)."""
        if self.resume is None:
            return False
        saved = (STAGES.index(self.resume["stage"][0]), self.resume["stage"][1])
        return saved > (STAGES.index(stage[0]), stage[1])

    def _resuming(self, stage: tuple[str, int]) -> bool:
        return self.resume is not None and tuple(self.resume["stage"]) == stage

    def _run_stage(self, stage: tuple[str, int], max_iter: int, begin) -> tuple[list[float], bool]:
        """One optimisation: begun here by ``begin()``, or continued from the checkpoint."""
        self.stage = stage
        resumed = self._resuming(stage)
        if not resumed:
            begin()
        self.current = Optimization(self.model, self.x, self.y, self.optimizer, max_iter, self.lr,
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
            value = self.held_out.loss() if self.held_out is not None else current_loss(self.model, self.x, self.y)
        except BROKEN_FACTORISATION:
            value = math.inf
        return value if math.isfinite(value) else math.inf

    def run(self) -> FitHistory:
        """Run the stages the checkpoint (if any) is not past; the model is left at the fit's result."""
        for restart in range(self.restarts):
            if not self._skipped(("restart", restart)):
                self._restart(restart)
        if not self._skipped(("final", 0)):
            self._final()
        if self._resuming(("refit", 0)) or (
            not self._skipped(("refit", 0))
            and noise_at_lower_bound(self.model) is not None
            and self.model.likelihood.noise_covar.raw_noise.requires_grad
        ):
            self._refit_from_larger_noise()
        self._result()
        self.resume = None
        return self.history

    def _restart(self, restart: int) -> None:
        """Optimise from the ``restart``-th initialisation; keep its state where it scores best so far."""
        model, history = self.model, self.history

        def begin():
            model.load_state_dict(self.initial)
            initialize(model, *self.initial_data, self.rng, restart, self.standardize, self.target_moments)
            if self.data is not None:  # every process continues from rank 0's initial values
                self.data.broadcast_state_(model)

        with warnings.catch_warnings(), holding_nested_parameters(model):
            warnings.simplefilter("ignore", RuntimeWarning)  # a restart that fails is just not chosen
            self._run_stage(("restart", restart), self.restart_iter, begin)
        loss = self._score()
        history.restart_losses.append(loss)
        if self.best_state is None or loss < min(history.restart_losses[:-1]):
            self.best_state, history.chosen_restart = copy.deepcopy(model.state_dict()), restart

    def _final(self) -> None:
        """The final optimisation, from the chosen restart's state (or the model's, without restarts)."""
        history = self.history
        history.loss, history.converged = self._run_stage(
            ("final", 0), self.max_iter, lambda: self.restarts and self.model.load_state_dict(self.best_state))
        if self.held_out is not None:
            history.validation_loss, history.best_iteration = self.validation, self.best_iteration

    def _result(self) -> None:
        """Calibrate σ² and σ_f² on the held-out rows, condition on all rows and record the final loss,
        saved as the fit's result; or, where the checkpoint holds that result, take it as it was."""
        history = self.history
        if self._resuming(("done", 0)):
            history.seconds = self.earlier_seconds
            self._condition_on_all_rows()
            return
        calibrated = None if self.calibration is None else self.calibration.calibrate()
        if calibrated is not None:
            history.held_out_noise, history.held_out_scale = calibrated
        self._condition_on_all_rows()
        history.final_loss = current_loss(self.model, *(self.all_rows or (self.x, self.y)))
        history.seconds = self.seconds()
        self.stage = ("done", 0)
        self._save(force=True)

    def _condition_on_all_rows(self) -> None:
        """Give the posterior the held-out rows too (where some were held out)."""
        if self.all_rows is not None:
            self.model.set_train_data(*self.all_rows, strict=False)

    def _refit_from_larger_noise(self) -> None:
        """Optimise again from σ² = 0.1 × the target variance; keep the refit if its loss is lower (see :func:`~alacarte.fit`).

        Streamed targets (``y`` None) and held-out rows take :attr:`target_moments` (every process of a
        distributed fit must start the refit from the same σ²): taking 1 unstandardised started the
        refit elsewhere than the in-memory fit did."""
        model, y, history = self.model, self.y, self.history

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
