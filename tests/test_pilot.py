"""alacarte.fit_pilot: hyperparameters from a pilot (a row subsample, fewer features), the model
conditioned on every row, against a dense GP and against the exact posterior of a known GP prior."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte.bench import predictive_scores
from alacarte.factory import make_model

LENGTHSCALE, NOISE = torch.tensor([0.7, 1.4], dtype=torch.float64), 0.1


def rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * torch.cdist(a / LENGTHSCALE, b / LENGTHSCALE) ** 2)


def prior_draw(n_train: int, n_test: int, seed: int = 0):
    """Train and test rows of f ~ GP(0, RBF/ARD) plus N(0, NOISE²) noise, and the exact posterior
    predictive (mean, variance of a new y) at the test rows under the true kernel and noise."""
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.uniform(-3, 3, size=(n_train + n_test, 2)))
    gram = rbf(x, x) + 1e-8 * torch.eye(len(x), dtype=x.dtype)
    f = torch.linalg.cholesky(gram) @ torch.as_tensor(rng.standard_normal(len(x)))
    y = f + NOISE * torch.as_tensor(rng.standard_normal(len(x)))
    xt, yt, x, y = x[n_train:], y[n_train:], x[:n_train], y[:n_train]
    factor = torch.linalg.cholesky(rbf(x, x) + NOISE**2 * torch.eye(n_train, dtype=x.dtype))
    cross = torch.cholesky_solve(rbf(x, xt), factor)
    mean = cross.T @ y
    variance = 1 + NOISE**2 - (rbf(x, xt) * cross).sum(0)
    return (x, y), (xt, yt), (mean, variance)


def pilot_fit(model, x, y, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ac.fit_pilot(model, x, y, progress=False, **options)


@pytest.mark.parametrize("kernel", ["gm", "fastfood-ard"])
def test_a_pilot_fit_is_calibrated_against_the_true_posterior(kernel):
    """Hyperparameters from 600 of 2 000 rows and D = 64, the model at D = 1 024 on every row: on fresh
    rows of a known GP prior its 95% intervals cover 92–98% and its NLPD is within 0.05 of the exact
    posterior's under the true kernel (measured: 0.015 and 0.010 above it)."""
    (x, y), (xt, yt), (true_mean, true_variance) = prior_draw(2000, 1000)
    model = make_model(kernel, 2, num_samples=512)
    pilot_fit(model, x, y, rows=600, num_samples=32, max_iter=60, restarts=2)
    prediction = model.predict(xt)
    ours = predictive_scores(prediction.mean, prediction.observed_variance, yt)
    truth = predictive_scores(true_mean, true_variance, yt)
    assert 0.92 <= ours["coverage95"] <= 0.98, ours
    assert ours["nlpd"] - truth["nlpd"] < 0.05, (ours, truth)
    assert model.covar_module.num_features == 1024 and model.train_targets.shape == (2000,)


def test_the_model_predicts_as_the_dense_gp_of_its_features_on_every_row():
    """The pilot saw 100 rows; the model's prediction is the dense GP with k(x, x′) = φ(x)ᵀφ(x′) of its
    own D = 256 features conditioned on all 300, in the targets' units."""
    (x, y), (xt, _), _ = prior_draw(300, 20, seed=1)
    model = make_model("gm", 2, num_samples=128)
    pilot_fit(model, x, y, rows=100, num_samples=16, max_iter=20, restarts=1)
    offset, scale = float(model.target_offset), float(model.target_scale)
    with torch.no_grad():
        xs, xq = model.internal_inputs(x), model.internal_inputs(xt)
        phi, phi_q = model.covar_module.features(xs), model.covar_module.features(xq)
        noise, mu = float(model.likelihood.noise), float(model.mean_module.constant)
    gram = phi @ phi.T + noise * torch.eye(300, dtype=phi.dtype)
    cross = phi @ phi_q.T
    dense_mean = mu + cross.T @ torch.linalg.solve(gram, (y - offset) / scale - mu)
    dense_variance = (phi_q**2).sum(1) - (cross * torch.linalg.solve(gram, cross)).sum(0) + noise
    prediction = model.predict(xt)
    assert torch.allclose(prediction.mean, offset + scale * dense_mean, rtol=1e-8, atol=1e-8 * scale)
    assert torch.allclose(prediction.observed_variance, scale**2 * dense_variance, rtol=1e-7)


def test_more_features_on_every_row_beat_the_pilot_alone():
    """The point of a pilot: the same hyperparameters predict better with every row and more features
    than the pilot fit does on its own rows and features."""
    (x, y), (xt, yt), _ = prior_draw(2000, 500, seed=2)
    model = make_model("gm", 2, num_samples=256)
    pilot_fit(model, x, y, rows=300, num_samples=16, max_iter=40, restarts=1)
    alone = make_model("gm", 2, num_samples=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ac.fit(alone, x[:300], y[:300], max_iter=40, restarts=1, progress=False)
    rmse = [float((m.predict(xt).mean - yt).pow(2).mean().sqrt()) for m in (model, alone)]
    assert rmse[0] < 0.7 * rmse[1], rmse


def test_bad_models_data_and_settings_are_value_errors():
    (x, y), _, _ = prior_draw(50, 1)
    with pytest.raises(ValueError, match="per frequency"):
        pilot_fit(make_model("fsard", 2, num_samples=16), x, y)
    with pytest.raises(ValueError, match="FeatureGP"):
        pilot_fit(make_model("exact-ard", 2), x, y)
    with pytest.raises(ValueError, match="in memory"):
        pilot_fit(make_model("gm", 2, num_samples=16), x, y, chunk_size=10)
    with pytest.raises(ValueError, match="standardize"):
        pilot_fit(make_model("gm", 2, num_samples=16), x, y, standardize=False)
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="rows"):
            pilot_fit(make_model("gm", 2, num_samples=16), x, y, rows=bad)
    with pytest.raises(ValueError, match="num_samples"):
        pilot_fit(make_model("gm", 2, num_samples=16), x, y, num_samples=6)  # not a multiple of 4 components
    assert math.isfinite(float(pilot_fit(make_model("gm", 2, num_samples=16), x, y, rows=500, max_iter=3,
                                         restarts=0).loss[-1]))  # more rows asked than given: all of them


def test_validation_fraction_0_keeps_the_pilots_band_and_holds_nothing_out():
    """The paper's protocol: no rows held out of the pilot, and the model keeps the pilot's σ² and σ_f²."""
    (x, y), _, _ = prior_draw(400, 1, seed=3)
    history = pilot_fit(make_model("gm", 2, num_samples=64), x, y, rows=100, num_samples=16, max_iter=5,
                        restarts=0, validation_fraction=0)
    assert history.held_out_rows == 0 and history.held_out_scale is None
    held = pilot_fit(make_model("gm", 2, num_samples=64), x, y, rows=100, num_samples=16, max_iter=5, restarts=0)
    assert held.held_out_rows == 80 and held.held_out_scale > 0
