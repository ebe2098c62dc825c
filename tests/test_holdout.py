"""Held-out rows: the split, the score against a dense GP, early stopping, the noise chosen by the
held-out rows, and the over-fitting they stop on real data."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte.factory import make_model
from alacarte.holdout import (
    MAX_ROWS,
    RECOMMENDED_FRACTION,
    SCALE_PRIOR_ROWS,
    HeldOut,
    check_fraction,
    maximize_band_likelihood,
    resolve_fraction,
    scores_iterates,
    split_rows,
)
from alacarte.training import negative_mll

SHARED = Path(__file__).resolve().parents[2] / "shared" / "uci"


def data(n=120, d=3, seed=0, noise=0.1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, d))
    return torch.as_tensor(x), torch.as_tensor(np.sin(2 * x[:, 0]) + x[:, 1] + noise * rng.standard_normal(n))


def test_the_split_is_seeded_disjoint_and_complete():
    kept, held = split_rows(100, 0.2, seed=3)
    assert len(held) == 20 and len(kept) == 80
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(100))
    again = split_rows(100, 0.2, seed=3)
    assert torch.equal(again[0], kept) and torch.equal(again[1], held)
    assert not torch.equal(split_rows(100, 0.2, seed=4)[1], held)
    assert len(split_rows(10**6, 0.5, seed=0)[1]) == MAX_ROWS


@pytest.mark.parametrize("n, fraction", [(9, 0.5), (100, 0.0), (100, 0.004)])
def test_nothing_is_held_out_of_few_rows_or_at_fraction_0(n, fraction):
    assert split_rows(n, fraction, seed=0) is None


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, math.nan, "0.2", True, None])
def test_a_fraction_outside_0_1_is_a_value_error(bad):
    with pytest.raises(ValueError, match="validation_fraction must be"):
        check_fraction(bad)
    x, y = data()
    with pytest.raises(ValueError, match="validation_fraction must be"):
        ac.fit(make_model("fsard", 3, num_samples=16), x, y, validation_fraction=bad, progress=False)


def test_auto_holds_out_rows_for_feature_gps_in_memory_only():
    feature, exact = make_model("fsard", 3, num_samples=16), make_model("exact-ard", 3)
    simplex = ac.FeatureGP(None, None, ac.FSARDKernel(3, 16, ard_num_dims=3, simplex=True, seed=0))
    assert resolve_fraction("auto", feature, streamed=False) == RECOMMENDED_FRACTION
    assert resolve_fraction("auto", feature, streamed=True) == 0.0
    assert resolve_fraction("auto", exact, streamed=False) == 0.0
    assert resolve_fraction("auto", simplex, streamed=False) == RECOMMENDED_FRACTION
    assert scores_iterates(feature) and scores_iterates(exact) and not scores_iterates(simplex)
    assert resolve_fraction(0.3, exact, streamed=False) == 0.3
    with pytest.raises(ValueError, match="streamed data are fitted on all rows"):
        resolve_fraction(0.2, feature, streamed=True)
    x, y = data()
    assert ac.fit(feature, x, y, max_iter=2, restarts=0, progress=False).held_out_rows == 24  # the default
    assert ac.fit(exact, x, y, max_iter=2, restarts=0, progress=False).held_out_rows == 0


@pytest.mark.parametrize("from_statistics", [False, True])
def test_the_score_is_the_dense_gp_predictive_density_of_the_held_out_rows(from_statistics):
    """The exact GP with kernel ΦΦᵀ, conditioned on the kept rows, scores the held-out ones, with its
    predictive variances times s = (Σ r²/v + ν)/(|H| + ν), the MAP scale under ν rows' prior at 1 —
    from the rows, or from the statistics the likelihood computed of them."""
    x, y = data()
    model = make_model("fsard", 3, num_samples=32)
    model.set_train_data(x[:90], y[:90], strict=False)
    model.likelihood.noise = 0.05
    model.mean_module.constant.data.fill_(0.3)
    statistics = None
    if from_statistics:
        mll = ac.WoodburyMarginalLogLikelihood(model.likelihood, model)
        mll(model(x[:90]), y[:90])
        statistics = mll.last_statistics
        assert statistics.n == 90 and statistics.gram.grad_fn is None
    score, scale = HeldOut(model, x[90:], y[90:]).score_and_scale(statistics)
    with torch.no_grad():
        phi, phi_star = model.covar_module.features(x[:90]), model.covar_module.features(x[90:])
        k = phi @ phi.T + 0.05 * torch.eye(90, dtype=torch.float64)
        cross = phi_star @ phi.T
        mean = 0.3 + cross @ torch.linalg.solve(k, y[:90] - 0.3)
        var = (phi_star**2).sum(-1) - (cross * torch.linalg.solve(k, cross.T).T).sum(-1) + 0.05
    ratios = ((y[90:] - mean) ** 2 / var).tolist()
    expected = (sum(ratios) + SCALE_PRIOR_ROWS) / (len(ratios) + SCALE_PRIOR_ROWS)
    assert scale == pytest.approx(expected, rel=1e-7) and abs(expected - 1) > 0.05  # the scale matters here
    dense = float((0.5 * (torch.log(2 * math.pi * expected * var) + (y[90:] - mean) ** 2 / (expected * var))).mean())
    assert score == pytest.approx(dense, rel=1e-7)
    assert model.training  # left as it was


def test_a_fit_with_held_out_rows_keeps_its_best_iterate_and_conditions_on_every_row():
    x, y = data()
    model = make_model("gm", 3, num_samples=32, num_components=2)
    history = ac.fit(model, x, y, max_iter=30, restarts=2, restart_iter=3, validation_fraction=0.25, progress=False)
    assert history.held_out_rows == 30
    assert history.best_iteration == int(np.argmin(history.validation_loss))
    assert len(history.validation_loss) == history.iterations + 1 or history.noise_refit_loss is not None
    assert model.train_inputs[0].shape[0] == 120  # the posterior is of all rows
    # The same hyperparameters conditioned on all rows by hand predict the same.
    again = make_model("gm", 3, num_samples=32, num_components=2)
    again.load_state_dict(model.state_dict())
    again.set_train_data(*model.standardize(x, y), strict=False)
    again.eval()
    assert torch.allclose(again.predict(x).mean, model.predict(x).mean, rtol=1e-12, atol=1e-12)


def simplex_model(d=3, num_samples=32):
    return ac.FeatureGP(None, None, ac.FSARDKernel(d, num_samples, ard_num_dims=d, simplex=True, seed=0)).double()


def test_a_simplex_fit_runs_the_kept_rows_likelihood_to_its_end_and_holds_rows_out_for_the_band():
    """A simplex-ARD kernel's held-out rows choose no iterate (its zeros are where the likelihood's path
    ends): unstandardised and without restarts, its path is loss for loss that of the marginal likelihood
    of the kept rows alone, π ends identical, and only σ² and σ_f² differ: set on the held-out rows."""
    x, y = data(n=300, d=5, noise=0.2)
    kept, _ = split_rows(300, RECOMMENDED_FRACTION, 0)
    options = dict(max_iter=60, restarts=0, standardize=False, progress=False, seed=0)
    alone, held = simplex_model(5), simplex_model(5)
    reference = ac.fit(alone, x[kept], y[kept], validation_fraction=0, **options)
    history = ac.fit(held, x, y, **options)
    assert history.held_out_rows == 60 and history.validation_loss == [] and history.best_iteration is None
    assert history.loss == reference.loss
    pi = held.covar_module.simplex_weights
    assert torch.equal(pi, alone.covar_module.simplex_weights) and bool((pi == 0).any())
    assert float(held.likelihood.noise) == pytest.approx(history.held_out_noise, rel=1e-12)
    assert float(held.likelihood.noise) != pytest.approx(float(alone.likelihood.noise), rel=1e-3)
    assert held.train_inputs[0].shape[0] == 300  # the posterior is of all rows


def test_the_band_likelihoods_maximum_is_the_marginal_likelihoods_in_sigma_and_signal():
    """After :func:`maximize_band_likelihood` the gradient of the model's own Woodbury loss in σ² and σ_f²
    vanishes (autograd, not the closed form), and it undoes the held-out calibration of a converged fit:
    σ² and σ_f² return to where the marginal likelihood of the kept rows alone put them."""
    x, y = data(n=200, noise=0.2)
    kept, _ = split_rows(200, RECOMMENDED_FRACTION, 0)
    options = dict(max_iter=1000, restarts=0, standardize=False, progress=False, seed=0, tolerance=1e-12)
    alone, held = simplex_model(num_samples=16), simplex_model(num_samples=16)
    ac.fit(alone, x[kept], y[kept], validation_fraction=0, **options)
    ac.fit(held, x, y, **options)
    held.set_train_data(x[kept], y[kept], strict=False)
    noise, factor = maximize_band_likelihood(held)
    assert noise == pytest.approx(float(alone.likelihood.noise), rel=2e-3)
    signal = float(held.covar_module.outputscale)
    assert signal == pytest.approx(float(alone.covar_module.outputscale), rel=2e-3) and factor != pytest.approx(1, rel=1e-2)
    held.train()
    raw = [held.likelihood.noise_covar.raw_noise, held.covar_module.raw_outputscale]
    with held.inference_settings():
        gradients = torch.autograd.grad(negative_mll(held, x[kept], y[kept], backward=False), raw)
    assert max(float(g.abs().max()) for g in gradients) < 1e-7
    # A model without a trained noise is left alone.
    held.likelihood.noise_covar.raw_noise.requires_grad_(False)
    assert maximize_band_likelihood(held) is None and float(held.covar_module.outputscale) == signal


def test_a_fit_scores_its_iterates_from_the_likelihoods_statistics(monkeypatch):
    """Most held-out scores of an L-BFGS fit reuse the statistics the line search computed at the
    iterate (no second pass over the kept rows), and each equals the score computed from the rows."""
    x, y = data(n=400)
    reused, recomputed = [], []
    original = HeldOut.score_and_scale

    def checked(self, statistics=None):
        result = original(self, statistics)
        if statistics is None:
            recomputed.append(result)
        else:
            reused.append(result)
            assert result == pytest.approx(original(self, None), rel=1e-9)
        return result

    monkeypatch.setattr(HeldOut, "score_and_scale", checked)
    ac.fit(make_model("fsard", 3, num_samples=32), x, y, max_iter=30, restarts=2, restart_iter=5,
           validation_fraction=0.25, progress=False)
    assert len(reused) >= 4 * len(recomputed) > 0


def dense_leave_one_out(model, xs, ys, noise, i):
    """Row i's predictive mean and variance under the dense GP k(x, x') = φ(x)ᵀφ(x') + σ² conditioned on
    every other row."""
    phi, mu, n = model.covar_module.features(xs).detach(), model.mean_module(xs).detach(), len(ys)
    others = torch.arange(n) != i
    gram = phi[others] @ phi[others].T + noise * torch.eye(n - 1, dtype=phi.dtype)
    cross = phi[others] @ phi[i]
    mean = mu[i] + cross @ torch.linalg.solve(gram, ys[others] - mu[others])
    return mean, phi[i] @ phi[i] - cross @ torch.linalg.solve(gram, cross) + noise


def test_the_leave_one_out_predictive_is_that_of_the_posterior_without_the_row():
    """Each held-out row's calibration predictive equals the dense GP's prediction of that row
    conditioned on every other row, kept and held out (k(x, x') = φ(x)ᵀφ(x'), the model's σ²)."""
    x, y = data(n=60)
    model = make_model("fsard", 3, num_samples=16)
    model.likelihood.noise = 0.03
    xs, ys = model.standardize(x, y)
    kept, held = split_rows(60, 0.25, seed=1)
    model.set_train_data(xs[kept], ys[kept], strict=False)
    scorer = HeldOut(model, xs[held], ys[held])
    mean, variance = scorer.calibration_predictive()
    noise = float(model.likelihood.noise.detach())
    for row, i in enumerate(held.tolist()):
        dense_mean, dense_variance = dense_leave_one_out(model, xs, ys, noise, i)
        assert float(mean[row]) == pytest.approx(float(dense_mean), rel=1e-9, abs=1e-10)
        assert float(variance[row]) == pytest.approx(float(dense_variance), rel=1e-9)


def test_the_kept_rows_features_are_formed_a_chunk_at_a_time_within_the_memory_budget():
    """The calibration sums the kept rows' statistics over chunks of the model's memory budget (never
    all kept rows' features at once) and still predicts each held-out row as the dense GP of every
    other row does."""
    x, y = data(n=60)
    model = make_model("fsard", 3, num_samples=16)
    model.likelihood.noise = 0.03
    model.memory_budget = 8000  # 10 rows a chunk
    xs, ys = model.standardize(x, y)
    kept, held = split_rows(60, 0.25, seed=1)
    model.set_train_data(xs[kept], ys[kept], strict=False)
    scorer = HeldOut(model, xs[held], ys[held])
    features, rows = model.covar_module.features, []
    model.covar_module.features = lambda z: rows.append(z.shape[-2]) or features(z)
    mean, variance = scorer.calibration_predictive()
    del model.covar_module.features
    assert sorted(rows) == sorted([len(held)] + [10] * 4 + [5])  # the held-out rows, then 45 kept rows
    noise = float(model.likelihood.noise.detach())
    for row, i in enumerate(held.tolist()):
        dense_mean, dense_variance = dense_leave_one_out(model, xs, ys, noise, i)
        assert float(mean[row]) == pytest.approx(float(dense_mean), rel=1e-9, abs=1e-10)
        assert float(variance[row]) == pytest.approx(float(dense_variance), rel=1e-9)


def test_rescale_multiplies_noise_and_signal_by_the_leave_one_out_scale():
    """s* = (h·mean(r²/v) + ν)/(h + ν) of the held-out rows' leave-one-out residuals r and variances v
    (the dense GP's, test above); σ² and σ_f² are both multiplied by it, so their ratio stays."""
    x, y = data(n=80, noise=0.3)
    model = make_model("fastfood-ard", 3, num_samples=16)
    model.likelihood.noise, model.covar_module.outputscale = 0.02, 1.7
    xs, ys = model.standardize(x, y)
    kept, held = split_rows(80, 0.25, seed=2)
    model.set_train_data(xs[kept], ys[kept], strict=False)
    scorer = HeldOut(model, xs[held], ys[held])
    mean, variance = scorer.calibration_predictive()
    rows = len(held)
    expected = (float(((ys[held] - mean) ** 2 / variance).sum()) + SCALE_PRIOR_ROWS) / (rows + SCALE_PRIOR_ROWS)
    noise, scale = scorer.rescale()
    assert scale == pytest.approx(expected, rel=1e-9)
    assert noise == pytest.approx(0.02 * expected, rel=1e-6)
    assert float(model.covar_module.outputscale.detach()) == pytest.approx(1.7 * expected, rel=1e-6)
    model.likelihood.raw_noise.requires_grad_(False)  # a frozen noise: the band is the user's
    assert scorer.rescale() is None


def test_from_tail_rows_held_out_every_row_votes_on_the_scale(monkeypatch):
    """With at least TAIL_ROWS held-out rows, calibrate's s* is (Σ_H z² + c Σ_T z² + ν)/(n + ν), z² each
    row's leave-one-out residual over variance under the dense GP of every other row at the chosen σ²,
    c the held-out rows' median z² over the kept rows'."""
    x, y = data(n=70, noise=0.3)
    y[::9] += 3.0  # a few far-off rows: the tails every row counts
    model = make_model("fastfood-ard", 3, num_samples=16)
    model.likelihood.noise, model.covar_module.outputscale = 0.05, 1.3
    xs, ys = model.standardize(x, y)
    kept, held = split_rows(70, 0.3, seed=5)
    monkeypatch.setattr("alacarte.holdout.TAIL_ROWS", len(held))
    model.set_train_data(xs[kept], ys[kept], strict=False)
    noise, scale = HeldOut(model, xs[held], ys[held]).calibrate()
    searched = noise / scale
    model.likelihood.noise, model.covar_module.outputscale = searched, model.covar_module.outputscale / scale
    left_out = [dense_leave_one_out(model, xs, ys, searched, i) for i in range(70)]
    squares = torch.stack([(ys[i] - mean) ** 2 / variance for i, (mean, variance) in enumerate(left_out)])
    factor = float(squares[held].median() / squares[kept].median())
    expected = (float(squares[held].sum()) + factor * float(squares[kept].sum()) + SCALE_PRIOR_ROWS) / (
        70 + SCALE_PRIOR_ROWS)
    assert scale == pytest.approx(expected, rel=1e-6)
    held_alone = (float(squares[held].sum()) + SCALE_PRIOR_ROWS) / (len(held) + SCALE_PRIOR_ROWS)
    assert abs(scale / held_alone - 1) > 0.05  # the rule moved the band


def test_the_noise_and_scale_are_the_calibration_scores_minimum():
    x, y = data(n=200, noise=0.3)
    model = make_model("fsard", 3, num_samples=64)
    history = ac.fit(model, x, y, max_iter=20, restarts=1, restart_iter=3, validation_fraction=0.2, progress=False)
    kept, held = split_rows(200, 0.2, seed=0)
    xs, ys = model.standardize(x, y)
    model.set_train_data(xs[kept], ys[kept], strict=False)
    model.train()
    scorer = HeldOut(model, xs[held], ys[held])
    chosen = history.held_out_noise
    assert chosen == pytest.approx(float(model.likelihood.noise), rel=1e-12)
    # Before the scale was applied, the chosen σ² had that scale as its estimate, and the lowest score.
    scale = history.held_out_scale
    model.likelihood.noise = chosen / scale
    model.covar_module.outputscale = model.covar_module.outputscale / scale
    measure = scorer.calibration_score()
    best, before = measure()
    assert before == pytest.approx(scale, rel=1e-6)  # (round-off of the constraints' softplus)
    chosen = chosen / scale
    for factor in (0.9, 1.1, 0.5, 2.0):
        model.likelihood.noise = chosen * factor
        assert measure()[0] >= best - 1e-12, factor
    # The kept rows' posterior alone is a different score: the held-out rows are predicted from fewer rows.
    model.likelihood.noise = chosen
    assert scorer.score_and_scale()[0] > best


def test_noise_free_targets_get_a_band_below_the_likelihoods_noise_floor(tmp_path):
    """On targets without noise the predictive band is what the features miss.  The likelihood's σ²
    is bounded below (GPyTorch's 1e-4, standardised), which here would make the band 14 times the
    error; the held-out rows choose σ² below the bound, the bound is lowered with it, and the band
    comes within twice the error on fresh points (1.8 times: σ² ends at the search's 1e-6).  The
    lowered bound is saved with the model."""
    from alacarte.io import load_model, save_model

    rng = np.random.default_rng(0)
    x, xt = rng.uniform(-2, 2, size=(300, 3)), rng.uniform(-2, 2, size=(2000, 3))
    f = lambda z: np.sin(2 * z[:, 0]) + z[:, 1]  # noqa: E731
    model = make_model("fsard", 3, num_samples=64, seed=0)
    history = ac.fit(model, x, f(x), max_iter=50, progress=False, seed=0)
    bound = model.likelihood.noise_covar.raw_noise_constraint.lower_bound
    assert history.held_out_noise < 2e-4 and float(bound) < 1e-6
    pred = model.predict(torch.as_tensor(xt))
    error = pred.mean.numpy() - f(xt)
    rmse, std = float(np.sqrt(np.mean(error**2))), pred.observed_variance.sqrt().numpy()
    assert math.sqrt(2e-4) * f(x).std() > 10 * rmse  # the bound's band would be ten times too wide
    assert 0.6 < std.mean() / rmse < 2.0 and np.mean(np.abs(error) < 1.96 * std) >= 0.92
    again = load_model(save_model(model, tmp_path / "m.alacarte"))
    assert torch.equal(again.likelihood.noise_covar.raw_noise_constraint.lower_bound, bound)
    assert torch.equal(again.predict(torch.as_tensor(xt)).observed_variance, pred.observed_variance)


def test_noisy_targets_keep_the_likelihoods_noise_floor():
    x, y = data(n=200, noise=0.3)
    model = make_model("fsard", 3, num_samples=64)
    ac.fit(model, x, y, max_iter=20, restarts=1, restart_iter=3, progress=False)
    assert float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound) == pytest.approx(1e-4)
    assert float(model.likelihood.noise) > 2e-4


def test_streamed_data_refuse_held_out_rows():
    x, y = data()
    with pytest.raises(ValueError, match="validation_fraction is for rows in memory"):
        ac.fit(make_model("fsard", 3, num_samples=16), x, y, chunk_size=50, validation_fraction=0.2)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")
def test_held_out_rows_stop_fsgbard_memorising_breastcancer():
    """By marginal likelihood alone FSGBARD (D = 1024) interpolates the 175 training rows of UCI
    breastcancer (σ² at its floor, train RMSE 0.02) and its test NLPD is 539 nats against exact
    ARD's 4.66 (docs/calibration.md).  With held-out rows it is within 0.3 nats of exact ARD, whose
    NLPD is measured here too, and its 95% intervals cover at least 85% of the 19 test targets."""
    torch.manual_seed(0)
    split = ac.load_uci("breastcancer", 0, SHARED)

    def test_scores(method, fraction):
        model = make_model(method, split.x_train.shape[1], num_samples=512, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ac.fit(model, split.x_train, split.y_train, seed=0, progress=False, validation_fraction=fraction)
        pred = model.predict(split.x_test)
        y = torch.as_tensor(split.y_test)
        z = (y - pred.mean) / pred.observed_variance.sqrt()
        return float((0.5 * (z**2 + torch.log(2 * math.pi * pred.observed_variance))).mean()), float(
            (z.abs() <= 1.96).double().mean())

    exact, _ = test_scores("exact-ard", 0.0)
    ours, covered = test_scores("fsgbard", 0.2)
    assert ours <= exact + 0.3 and covered >= 0.85, (ours, exact, covered)
