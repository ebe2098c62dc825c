"""The band's scale widens the posterior between the training rows but never past the prior's expected squared
error of the mean:
every path (predict, model(x), sample_functions, a saved model) against the dense posterior bounded by
hand, and a fit's held-out rows setting the scale."""
import gpytorch
import numpy as np
import pytest
import torch

import alacarte
import alacarte.io
from alacarte import ExactRBFGP, fit
from alacarte.io import load_model, save_model
from alacarte.factory import make_model
from alacarte.init import scale_signal

from model_cases import feature_model, toy_data

SCALE = 40.0


def _scaled(model, x, y, scale):
    """``model`` given rows (x, y) in its own units, σ_f² and σ² multiplied by ``scale`` as the held-out
    calibration does, and its band's scale set to it."""
    model.set_train_data(x, y, strict=False)
    with torch.no_grad():
        model.likelihood.noise = 0.01 * scale
        scale_signal(model, scale)
        model.band_scale.fill_(scale)
    return model.eval()


def _dense_posterior(model, x, y, x_test):
    """Mean and covariance of f* from the dense kernel matrices at the model's parameters."""
    with torch.no_grad(), gpytorch.settings.lazily_evaluate_kernels(False):
        k = model.covar_module(x).to_dense()
        k_star = model.covar_module(x_test, x).to_dense()
        k_test = model.covar_module(x_test).to_dense()
        mean = model.mean_module(x_test)
    system = k + model.likelihood.noise.detach() * torch.eye(len(x), dtype=k.dtype)
    solved = torch.linalg.solve(system, torch.cat([(y - model.mean_module(x)).unsqueeze(-1).detach(), k_star.T], 1))
    return mean + k_star @ solved[:, 0], k_test - k_star @ solved[:, 1:], k_test.diagonal()


def _bounded(covariance, prior, scale, offset):
    """The covariance with each variance at most the prior's expected squared error of the mean."""
    factor = ((prior / scale + offset**2) / covariance.diagonal()).clamp_max(1).sqrt()
    return factor[:, None] * covariance * factor[None, :], factor


def _near_and_far(x):
    return torch.cat([x[:20] + 0.05, x[:20] + 12.0])  # beside training rows, and well away from all of them


@pytest.mark.parametrize("build", [lambda: feature_model(m=32), lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()],
                         ids=["feature_gp", "exact_gp"])
def test_each_variance_is_the_scaled_posteriors_bounded_by_the_likelihoods_prior(build):
    x, y = toy_data(n=120)
    x, y = (x - 5) / 2, (y - 100) / 7
    model = _scaled(build(), x, y, SCALE)
    x_test = _near_and_far(x)
    mean, covariance, prior = _dense_posterior(model, x, y, x_test)
    expected, factor = _bounded(covariance, prior, SCALE, mean - model.mean_module(x_test).detach())
    assert bool((factor[:20] == 1).all()) and int((factor[20:] < 0.5).sum()) >= 10  # both regimes occur
    prediction = model.predict(x_test)
    torch.testing.assert_close(prediction.mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(prediction.variance, expected.diagonal(), rtol=1e-6, atol=1e-10)
    offset = mean - model.mean_module(x_test).detach()
    assert bool((prediction.variance[20:] <= (prior[20:] / SCALE + offset[20:] ** 2) * (1 + 1e-9)).all())
    with torch.no_grad():
        joint = model(x_test)
    torch.testing.assert_close(joint.covariance_matrix, expected, rtol=1e-6, atol=1e-9)
    model.band_scale.fill_(1.0)  # no bound: the plain posterior
    torch.testing.assert_close(model.predict(x_test).variance, covariance.diagonal(), rtol=1e-6, atol=1e-10)


def test_function_draws_have_the_bounded_covariance():
    x, y = toy_data(n=120)
    x, y = (x - 5) / 2, (y - 100) / 7
    model = _scaled(feature_model(m=32), x, y, SCALE)
    x_test = _near_and_far(x)
    mean, covariance, prior = _dense_posterior(model, x, y, x_test)
    expected, _ = _bounded(covariance, prior, SCALE, mean - model.mean_module(x_test).detach())
    draws = model.sample_functions(4000, seed=0)(x_test)
    torch.testing.assert_close(draws.mean(0), mean, rtol=0, atol=float(4 * expected.diagonal().max().sqrt() / 60))
    torch.testing.assert_close(draws.var(0), expected.diagonal(), rtol=0.1, atol=0)
    # The pair of a near and a far point keeps the posterior's correlation.
    empirical = torch.corrcoef(draws[:, [0, 20]].T)[0, 1]
    dense = expected[0, 20] / (expected[0, 0] * expected[20, 20]).sqrt()
    assert abs(float(empirical - dense)) < 0.1


def _offset(model, mean):
    """The predictive mean's distance from the prior mean μ, in the targets' units."""
    prior_mean = float(model.mean_module.constant) * float(model.target_scale) + float(model.target_offset)
    return mean - prior_mean


def _assert_bounded_far(model, inputs, prior):
    """Far from the rows: the scaled posterior's variance (the band unbounded) cut to the prior's expected
    squared error of the mean (where the mean strays far from μ the cut may not bind: it binds somewhere)."""
    far = model.predict(inputs)
    bound = prior + _offset(model, far.mean) ** 2
    scale = float(model.band_scale)
    model.band_scale.fill_(1.0)
    unbounded = model.predict(inputs).variance
    model.band_scale.fill_(scale)
    torch.testing.assert_close(far.variance, torch.minimum(unbounded, bound), rtol=1e-6, atol=0)
    assert bool((unbounded > bound).any())


def test_a_fit_sets_the_band_scale_and_bounds_the_far_variance_by_the_likelihoods_prior():
    """Noise-free targets: the held-out rows scale σ_f² and σ² up; far from the rows the variance is then the
    likelihood's σ_f² plus the mean's squared distance from the prior mean, not s times σ_f², and a fit without held-out rows leaves the band unscaled."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (200, 2))
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1])
    model = make_model("fsard", 2, num_samples=32, seed=0)
    history = fit(model, x, y, max_iter=40, restarts=0, progress=False)
    scale = history.held_out_scale
    assert scale > 2 and float(model.band_scale) == pytest.approx(scale, rel=1e-9)
    signal = float(model.covar_module.outputscale) * float(model.target_scale) ** 2
    _assert_bounded_far(model, x[:10] + 40.0, signal / scale)
    fit(model, x, y, max_iter=5, restarts=0, progress=False, validation_fraction=0)
    assert float(model.band_scale) == 1.0


def test_a_pilot_fit_carries_the_pilots_band_into_the_full_model(monkeypatch):
    """The pilot's σ_f² arrives scaled by the pilot's band and is rescaled on the full rows: the band's scale is
    the product, and far from the rows the variance is the pilot likelihood's σ_f² (plus the mean's offset squared)."""
    pilots = []

    def recorded(*args, **kwargs):
        history = fit(*args, **kwargs)
        pilots.append(history.held_out_scale)  # (fit_pilot then writes the full rows' band into it)
        return history

    monkeypatch.setattr(alacarte.training._pilot, "fit", recorded)
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (400, 2))
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1])
    model = make_model("fastfood-ard", 2, num_samples=32, seed=0)
    history = alacarte.fit_pilot(model, x, y, rows=200, max_iter=30, restarts=0, progress=False)
    scale = pilots[0] * history.held_out_scale
    assert float(model.band_scale) == pytest.approx(scale, rel=1e-9) and scale > 1
    signal = float(model.covar_module.outputscale) * float(model.target_scale) ** 2
    _assert_bounded_far(model, x[:10] + 40.0, signal / scale)


def test_the_band_scale_is_saved_and_a_state_without_it_is_an_unscaled_band(tmp_path, monkeypatch):
    x, y = toy_data(n=120)
    x, y = (x - 5) / 2, (y - 100) / 7
    model = _scaled(feature_model(m=32), x, y, SCALE)
    x_test = _near_and_far(x)
    loaded = load_model(save_model(model, tmp_path / "m.alacarte"))
    assert float(loaded.band_scale) == SCALE
    assert torch.equal(loaded.predict(x_test).variance, model.predict(x_test).variance)

    state = model.state_dict()
    del state["band_scale"]
    bare = feature_model(m=32)
    bare.load_state_dict(state)
    assert float(bare.band_scale) == 1.0

    record = alacarte.io._model_record

    def without_band(m):
        saved = record(m)
        del saved["state_dict"]["band_scale"]
        return saved

    monkeypatch.setattr(alacarte.io, "_model_record", without_band)
    unscaled = load_model(save_model(model, tmp_path / "old.alacarte"))
    model.band_scale.fill_(1.0)
    assert float(unscaled.band_scale) == 1.0
    assert torch.equal(unscaled.predict(x_test).variance, model.predict(x_test).variance)


def test_the_prior_variance_ratio_is_of_the_likelihoods_prior():
    x, y = toy_data(n=120)
    x, y = (x - 5) / 2, (y - 100) / 7
    plain = feature_model(m=32)
    plain.set_train_data(x, y, strict=False)
    with torch.no_grad():
        plain.likelihood.noise = 0.01
    ratio = plain.prior_variance_ratio()
    assert _scaled(feature_model(m=32), x, y, SCALE).prior_variance_ratio() == pytest.approx(ratio, rel=1e-9)
