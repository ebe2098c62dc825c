"""L-BFGS spends one likelihood evaluation per iteration: each step's starting point, which the previous
step's line search evaluated, is not evaluated again — and the fit is the one it was, bit for bit."""
from __future__ import annotations

import itertools

import pytest
import torch

import alacarte as ac
from alacarte.training import _optimization as optimization
from alacarte.datasets import make_se1
from alacarte.factory import make_model


def counted_fit(monkeypatch, name, cache=True, **settings):
    calls = itertools.count()
    loss = optimization.Optimization._loss
    monkeypatch.setattr(optimization.Optimization, "_loss", lambda self, backward: (next(calls), loss(self, backward))[1])
    if not cache:  # every point a new one: the evaluations of earlier steps are never found
        fresh = itertools.count()
        monkeypatch.setattr(optimization.Optimization, "_parameter_key", lambda self: str(next(fresh)).encode())
    x, y, _ = make_se1(2000, seed=0)
    model = make_model(name, 18, num_samples=128, seed=0)
    history = ac.fit(model, x, y, progress=False, validation_fraction=0, **settings)
    return history, next(calls), model


@pytest.mark.parametrize("name", ["fsard", "gm"])
def test_an_lbfgs_fit_spends_about_one_evaluation_per_iteration(monkeypatch, name):
    history, evaluations, _ = counted_fit(monkeypatch, name, max_iter=40, restarts=0, tolerance=0.0)
    assert history.iterations == 40 and evaluations <= 1.15 * history.iterations


def test_the_fit_is_the_one_every_point_evaluated_afresh_gives(monkeypatch):
    settings = dict(max_iter=25, restarts=2, restart_iter=4)
    cached, cached_evaluations, model = counted_fit(monkeypatch, "fsard", **settings)
    monkeypatch.undo()
    fresh, fresh_evaluations, reference = counted_fit(monkeypatch, "fsard", cache=False, **settings)
    assert cached.loss == fresh.loss and cached.restart_losses == fresh.restart_losses
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    assert cached_evaluations < 0.6 * fresh_evaluations
