"""The schema of a fit checkpoint's progress, checked against the fit that resumes it.

A checkpoint whose key matches the fit is still a file: its progress is checked
field by field — stage, the model's and the optimiser's state against the
shapes of the live model and optimiser, the histories against the stage — before
any of it is restored, so that a damaged or crafted progress is a ``ValueError``
naming the field rather than a failure in the middle of the resumed fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._records import (
    check_bool,
    check_dict,
    check_float,
    check_history,
    check_int,
    check_list,
    check_matching_state,
    check_state,
    check_tensor,
    fail,
)

STAGES = ("restart", "final", "refit", "done")
_PROGRESS = ("stage", "run", "model", "rng", "best_state", "at_bound", "history", "jitters", "bar", "seconds")
_RUN = ("iteration", "model", "optimizer", "simplex", "losses", "calm", "failed", "good_state", "verified_state",
        "validation", "best")
_LBFGS = ("func_evals", "n_iter", "d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad", "prev_loss",
          "al")


@dataclass
class FitShape:
    """What a checkpoint of this fit can hold: the live model's state, the optimiser's
    parameters and settings, the simplex weights, and the fit's stages."""

    state: dict[str, torch.Tensor]
    parameters: list[torch.Tensor]
    param_groups: list[dict] | None  # None: no optimiser (π alone is trained)
    optimizer: str
    simplex: list[torch.Tensor]
    restarts: int
    restart_iter: int
    max_iter: int
    held_out: bool


def same(a: Any, b: Any) -> bool:
    """Equal plain values of the same types (a tensor in a file never compares equal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a is None or (isinstance(a, (bool, int, float, str)) and a == b)


def _state(value: Any, shape: FitShape, field: str) -> None:
    check_matching_state(check_state(value, field), shape.state, field)


def _scalar(value: Any, field: str) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        check_tensor(value, field, ())


def _lbfgs_state(state: Any, shape: FitShape, field: str) -> None:
    size = sum(p.numel() for p in shape.parameters)
    history = shape.param_groups[0]["history_size"]
    check_dict(state, field, optional=_LBFGS)
    for key, value in state.items():
        where = f"{field}.{key}"
        if key in ("func_evals", "n_iter"):
            check_int(value, where)
        elif key in ("d", "prev_flat_grad"):
            check_tensor(value, where, (size,))
        elif key in ("t", "H_diag", "prev_loss"):
            _scalar(value, where)
        elif key in ("old_dirs", "old_stps"):
            check_list(value, where, lambda v, f: check_tensor(v, f, (size,)), max_length=history)
        elif key == "ro":
            check_list(value, where, _scalar, max_length=history)
        else:
            check_list(value, where, lambda v, f: v is None or _scalar(v, f), max_length=history)
            if len(value) != history:
                fail(where, f"expected {history} entries, got {len(value)}")
    if state.get("n_iter", 0) and not all(key in state for key in _LBFGS[2:-1]):
        fail(field, f"an L-BFGS state past its first iteration needs {', '.join(_LBFGS[2:-1])}")
    lengths = {len(state[key]) for key in ("old_dirs", "old_stps", "ro") if key in state}
    if len(lengths) > 1:
        fail(field, "old_dirs, old_stps and ro differ in length")


def _adam_state(state: Any, shape: FitShape, field: str) -> None:
    for key, value in state.items():
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < len(shape.parameters):
            fail(field, f"unexpected entry {key!r:.80}")
        where = f"{field}[{key}]"
        check_dict(value, where, ("step", "exp_avg", "exp_avg_sq"))
        step = check_tensor(value["step"], f"{where}.step", ())
        if not (math.isfinite(float(step)) and float(step) >= 0):
            fail(f"{where}.step", f"expected a count, got {float(step)}")
        for name in ("exp_avg", "exp_avg_sq"):
            check_tensor(value[name], f"{where}.{name}", tuple(shape.parameters[key].shape))


def _optimizer(value: Any, shape: FitShape, field: str) -> None:
    if shape.param_groups is None:
        if value is not None:
            fail(field, "this fit trains no parameter with an optimiser (π alone)")
        return
    check_dict(value, field, ("state", "param_groups"))
    if not same(value["param_groups"], shape.param_groups):
        fail(f"{field}.param_groups", "differ from this fit's optimiser settings")
    if not isinstance(value["state"], dict):
        fail(f"{field}.state", f"expected a dict, got {type(value['state']).__name__}")
    if shape.optimizer == "lbfgs":
        if any(key != 0 for key in value["state"]):
            fail(f"{field}.state", "L-BFGS keeps its state under its first parameter (0) alone")
        _lbfgs_state(value["state"].get(0, {}), shape, f"{field}.state[0]")
    else:
        _adam_state(value["state"], shape, f"{field}.state")


def _simplex(value: Any, shape: FitShape, field: str) -> None:
    check_dict(value, field, ("step_size", "momentum", "extrapolation", "previous", "moved"))
    for name in ("step_size", "momentum", "extrapolation"):
        check_float(value[name], f"{field}.{name}", finite=True)
    if not value["step_size"] > 0:
        fail(f"{field}.step_size", f"expected a positive step, got {value['step_size']!r}")
    check_bool(value["moved"], f"{field}.moved")
    previous = value["previous"]
    if previous is not None:
        check_list(previous, f"{field}.previous", lambda v, f: None, max_length=len(shape.simplex))
        if len(previous) != len(shape.simplex):
            fail(f"{field}.previous", f"expected {len(shape.simplex)} tensors, got {len(previous)}")
        for i, (saved, live) in enumerate(zip(previous, shape.simplex)):
            check_tensor(saved, f"{field}.previous[{i}]", tuple(live.shape))


def _run(run: Any, shape: FitShape, max_iter: int, field: str) -> None:
    check_dict(run, field, _RUN)
    iteration = check_int(run["iteration"], f"{field}.iteration", 0, max_iter)
    for name in ("model", "good_state", "verified_state"):
        _state(run[name], shape, f"{field}.{name}")
    _optimizer(run["optimizer"], shape, f"{field}.optimizer")
    _simplex(run["simplex"], shape, f"{field}.simplex")
    check_list(run["losses"], f"{field}.losses", check_float, max_length=iteration)
    check_int(run["calm"], f"{field}.calm")
    check_bool(run["failed"], f"{field}.failed")
    validation = check_list(run["validation"], f"{field}.validation", check_float,
                            max_length=iteration + 1 if shape.held_out else 0)
    best = run["best"]
    if (best is None) != (not validation):
        fail(f"{field}.best", "must be given exactly when held-out scores are")
    if best is not None:
        if not (isinstance(best, (list, tuple)) and len(best) == 2):
            fail(f"{field}.best", "expected (index, state)")
        check_int(best[0], f"{field}.best[0]", 0, len(validation) - 1)
        _state(best[1], shape, f"{field}.best[1]")


def _history(progress: dict, stage: str, index: int, shape: FitShape) -> None:
    history = check_history(progress["history"], "progress.history")
    done = index if stage == "restart" else shape.restarts
    losses = history.get("restart_losses", [])
    if len(losses) != done:
        fail("progress.history.restart_losses", f"expected {done} scores at stage {stage} {index}, got {len(losses)}")
    chosen = history.get("chosen_restart")
    if (chosen is None) != (done == 0) or (chosen is not None and chosen >= done):
        fail("progress.history.chosen_restart", f"expected a restart below {done}, got {chosen!r}")
    if (progress["best_state"] is None) != (done == 0):
        fail("progress.best_state", "must be given exactly when a restart has been scored")
    if progress["best_state"] is not None:
        _state(progress["best_state"], shape, "progress.best_state")
    at_bound = progress["at_bound"]
    if at_bound is None and stage == "refit":
        fail("progress.at_bound", "the noise refit needs the score and state it started from")
    if at_bound is not None:
        if not (isinstance(at_bound, (list, tuple)) and len(at_bound) == 2):
            fail("progress.at_bound", "expected (score, state)")
        check_float(at_bound[0], "progress.at_bound[0]")
        _state(at_bound[1], shape, "progress.at_bound[1]")


def check_progress(progress: Any, shape: FitShape) -> dict[str, Any]:
    """``progress`` when every field fits the fit ``shape`` describes; else a ValueError naming it."""
    check_dict(progress, "progress", _PROGRESS)
    stage = progress["stage"]
    if not (isinstance(stage, (list, tuple)) and len(stage) == 2 and isinstance(stage[0], str)
            and stage[0] in STAGES):
        fail("progress.stage", f"expected [one of {', '.join(STAGES)}, index], got {stage!r:.80}")
    name, index = stage[0], check_int(stage[1], "progress.stage[1]", 0,
                                      max(shape.restarts - 1, 0) if stage[0] == "restart" else 0)
    if name == "restart" and not shape.restarts:
        fail("progress.stage", "this fit has no restarts")
    if name == "done":
        if progress["run"] is not None:
            fail("progress.run", "a finished fit has no optimisation under way")
        _state(progress["model"], shape, "progress.model")
    else:
        if progress["model"] is not None:
            fail("progress.model", "an optimisation under way keeps the model in progress.run")
        _run(progress["run"], shape, shape.restart_iter if name == "restart" else shape.max_iter, "progress.run")
    try:
        np.random.PCG64().state = progress["rng"]
    except (TypeError, ValueError, KeyError, OverflowError) as err:
        fail("progress.rng", f"not a PCG64 generator state ({type(err).__name__}: {err})")
    _history(progress, name, index, shape)
    check_list(progress["jitters"], "progress.jitters", check_float)
    bar = check_list(progress["bar"], "progress.bar", lambda v, f: check_int(v, f, 0, 2**62), max_length=2)
    if len(bar) != 2:
        fail("progress.bar", f"expected [done, total], got {bar!r:.80}")
    seconds = check_float(progress["seconds"], "progress.seconds", finite=True)
    if seconds < 0:
        fail("progress.seconds", f"expected a duration, got {seconds}")
    return progress
