"""AlaCarteRegressor: model selection, and its numbers against dense computations
(scikit-learn's estimator checks: tests/test_estimator_checks.py)."""
import pickle
import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.gaussian_process.kernels import RBF
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import alacarte as ac
from alacarte import AlaCarteRegressor, FSARDKernel, FSGBARDKernel
from alacarte.regressor import choose_components, kernel_relevance
from alacarte.training import (AUTO_PILOT_ABOVE, AUTO_PILOT_SAMPLES, PILOT_ROWS, PILOT_SAMPLES, FitHistory, resolve_pilot,
                               resolve_samples)
from alacarte.factory import DEFAULT_SAMPLES, KERNEL_NAMES, make_model
from selection_cases import two_sines

# Small enough to fit in a fraction of a second, large enough to fit well.
# One draw: these tests read a single fit (num_draws="auto" would average five on data this small).
SMALL = dict(num_samples=16, num_components=2, max_iter=10, restarts=1, restart_iter=3, num_draws=1)


def data(n=80, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.05 * rng.normal(size=n)
    return x, y


def test_pipeline_and_grid_search_over_kernels():
    x, y = data(n=90)
    x = x * np.array([1.0, 100.0, 0.01]) + 5  # badly scaled: the pipeline's scaler is exercised
    grid = GridSearchCV(
        Pipeline([("scale", StandardScaler()), ("gp", AlaCarteRegressor(**SMALL))]),
        {"gp__kernel": ["gm", "exact-rbf", ac.FSARDKernel(3, 16, ard_num_dims=3, seed=3)]},
        cv=3,
    )
    grid.fit(x, y)
    scores = grid.cv_results_["mean_test_score"]
    assert len(scores) == 3 and np.all(np.isfinite(scores)) and scores.max() > 0.9
    assert grid.best_score_ == scores.max()
    assert grid.score(x, y) > 0.9
    assert grid.predict(x[:7]).shape == (7,)


def test_grid_search_over_integer_settings_passes_numpy_integers():
    x, y = data(n=40)
    grid = GridSearchCV(AlaCarteRegressor(**{**SMALL, "max_iter": 3}), {"restarts": np.arange(1, 3)}, cv=2)
    assert grid.fit(x, y).best_params_["restarts"] in (1, 2)


@pytest.mark.parametrize("kernel", ["fsard", "exact-rbf"])
# Four held-out rows of twenty can put σ² at its floor; the errors, not that fit, are under test.
@pytest.mark.filterwarnings("ignore:the noise variance ended at its lower bound")
def test_bad_targets_and_sample_counts_are_clear_errors(kernel):
    x, y = data(n=20)
    with pytest.raises(ValueError, match="y must be numeric"):
        AlaCarteRegressor(kernel, **SMALL).fit(x, y.astype(str))
    with pytest.raises(ValueError, match="y is constant"):
        AlaCarteRegressor(kernel, **SMALL).fit(x, np.full(20, 3.0))
    fitted = AlaCarteRegressor(kernel, **SMALL).fit(x, y)
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        fitted.sample_y(x, n_samples=0)
    with pytest.raises(ValueError, match="random_state"):  # the same for feature and exact models
        fitted.sample_y(x, random_state=-1)
    small = AlaCarteRegressor(kernel, **SMALL).fit(x / 100, y)  # scales ≪ 1: 1.7e308 standardises to inf
    with pytest.raises(ValueError, match="x rows \\[0\\] .* overflow to inf"):
        small.predict(np.vstack([np.full((1, x.shape[1]), 1.7e308), x[:2] / 100]), return_cov=True)


def test_unknown_kernel_name_is_a_clear_error():
    x, y = data(n=20)
    with pytest.raises(ValueError, match="kernel must be one of gm, pwl"):
        AlaCarteRegressor("matern", **SMALL).fit(x, y)


def test_a_kernel_object_is_copied_not_trained():
    x, y = data(n=40)
    kernel = ac.FSARDKernel(3, 16, ard_num_dims=3, seed=1)
    before = {k: v.clone() for k, v in kernel.state_dict().items()}
    reg = AlaCarteRegressor(kernel, **SMALL).fit(x, y)
    assert all(torch.equal(before[k], v) for k, v in kernel.state_dict().items())
    assert reg.model_.covar_module is not kernel
    assert reg.model_.covar_module.lengthscale.dtype == torch.float64


@pytest.mark.parametrize("name", ["gm", "fsard", "exact-rbf"])
def test_log_marginal_likelihood_matches_a_dense_gaussian(name):
    """log N(y; c + sμ, s²(K + σ²I)) with K formed densely: from the features, or sklearn's RBF."""
    x, y = data(n=50)
    reg = AlaCarteRegressor(name, **SMALL).fit(x, y)
    model = reg.model_
    scale, offset = float(model.target_scale), float(model.target_offset)
    x_std = model.internal_inputs(torch.as_tensor(x)).detach()
    with torch.no_grad():
        if name.startswith("exact"):
            base = model.covar_module
            k = float(base.outputscale) * RBF(float(base.base_kernel.lengthscale)).__call__(x_std.numpy())
        else:
            phi = model.covar_module.features(x_std).numpy()
            k = phi @ phi.T
    noise = float(model.likelihood.noise.detach())
    mean = offset + scale * float(model.mean_module.constant.detach())
    expected = stats.multivariate_normal(np.full(len(y), mean), scale**2 * (k + noise * np.eye(len(y)))).logpdf(y)
    assert reg.log_marginal_likelihood_ == pytest.approx(expected, rel=1e-9, abs=1e-7)


@pytest.mark.parametrize("name", ["gm", "exact-ard"])
def test_predictive_covariance_matches_a_dense_posterior(name):
    x, y = data(n=60)
    x_test = data(n=7, seed=5)[0]
    reg = AlaCarteRegressor(name, **SMALL).fit(x, y)
    model = reg.model_
    mean, cov_f = reg.predict(x_test, return_cov=True, include_noise=False)
    _, cov_y = reg.predict(x_test, return_cov=True)
    _, std_y = reg.predict(x_test, return_std=True)
    _, std_f = reg.predict(x_test, return_std=True, include_noise=False)
    assert np.array_equal(reg.predict(x_test), mean) or np.allclose(reg.predict(x_test), mean, rtol=1e-12)
    scale2 = float(model.target_scale) ** 2
    noise = float(model.likelihood.noise.detach()) * scale2
    assert np.allclose(cov_y, cov_f + noise * np.eye(7), rtol=1e-12, atol=1e-14)
    assert np.allclose(std_f**2, np.diag(cov_f), rtol=1e-8) and np.allclose(std_y**2, np.diag(cov_y), rtol=1e-8)
    # Dense reference: K** − K*x (Kxx + σ²I)⁻¹ Kx*, all n×n, in standardised units.
    xs, xt = (model.internal_inputs(torch.as_tensor(a)).detach() for a in (x, x_test))
    with torch.no_grad():
        kernel = model.covar_module
        k_xx, k_tx, k_tt = (kernel(a, b).to_dense().numpy() for a, b in ((xs, xs), (xt, xs), (xt, xt)))
    a = k_xx + float(model.likelihood.noise.detach()) * np.eye(len(y))
    dense = k_tt - k_tx @ np.linalg.solve(a, k_tx.T)
    assert np.allclose(cov_f, scale2 * dense, rtol=1e-7, atol=1e-9)
    r = (y - float(model.target_offset)) / float(model.target_scale) - float(model.mean_module.constant.detach())
    dense_mean = float(model.mean_module.constant.detach()) + k_tx @ np.linalg.solve(a, r)
    assert np.allclose(mean, dense_mean * float(model.target_scale) + float(model.target_offset), rtol=1e-8)
    with pytest.raises(RuntimeError, match="At most one"):
        reg.predict(x_test, return_std=True, return_cov=True)


@pytest.mark.parametrize("name", ["fsard", "exact-rbf"])
def test_sample_y_draws_the_latent_posterior(name):
    x, y = data(n=40)
    x_test = data(n=4, seed=7)[0]
    reg = AlaCarteRegressor(name, **SMALL).fit(x, y)
    draws = reg.sample_y(x_test, n_samples=4000, random_state=1)
    assert draws.shape == (4, 4000)
    assert np.array_equal(draws, reg.sample_y(x_test, n_samples=4000, random_state=1))
    assert not np.array_equal(draws, reg.sample_y(x_test, n_samples=4000, random_state=2))
    mean, cov = reg.predict(x_test, return_cov=True, include_noise=False)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * sd / np.sqrt(4000))
    assert np.allclose(np.cov(draws), cov, atol=0.1 * sd.max() ** 2)


@pytest.mark.parametrize("name", ["fsard", "exact-ard"])
def test_auto_draws_average_five_fits_on_at_most_twice_as_many_rows_as_features(name):
    """num_draws="auto" (the default): 5 fits for a feature GP on n ≤ 2D rows, one on more rows and for
    an exact GP; the five are the fits num_draws=5 makes."""
    settings = {k: v for k, v in SMALL.items() if k != "num_draws"}  # D = 32 features
    x, y = data(n=65)
    assert len(AlaCarteRegressor(name, **settings).fit(x, y).models_) == 1
    x, y = data(n=64)
    auto = AlaCarteRegressor(name, **settings).fit(x, y)
    assert len(auto.models_) == (5 if name == "fsard" else 1)
    if name == "fsard":
        five = AlaCarteRegressor(name, **{**settings, "num_draws": 5}).fit(x, y)
        assert np.array_equal(auto.predict(x[:5], return_std=True), five.predict(x[:5], return_std=True))


@pytest.mark.parametrize("value", ["five", "Auto", 0, 2.5, True])
def test_num_draws_other_than_a_positive_int_or_auto_is_a_clear_error(value):
    x, y = data(n=20)
    with pytest.raises(ValueError, match="num_draws must be a positive integer"):
        AlaCarteRegressor("fsard", **{**SMALL, "num_draws": value}).fit(x, y)


@pytest.mark.parametrize("name", ["fsard", "exact-rbf"])
def test_several_draws_predict_their_equal_mixture(name):
    """num_draws = 3: the first draw is the one-draw fit; the mean and variance are the equal
    mixture's, computed here from each draw's own posterior; the covariance's diagonal is that
    variance; sample_y's draws have the mixture's mean and covariance; relevances are averaged."""
    x, y = data(n=60)
    x_test = torch.as_tensor(data(n=5, seed=5)[0])
    one = AlaCarteRegressor(name, **SMALL).fit(x, y)
    reg = AlaCarteRegressor(name, **{**SMALL, "num_draws": 3}).fit(x, y)
    assert len(reg.models_) == 3 and reg.model_ is reg.models_[0]
    preds = [model.predict(x_test) for model in reg.models_]
    means = np.stack([p.mean.detach().numpy() for p in preds])
    variances = np.stack([p.observed_variance.detach().numpy() for p in preds])
    assert np.array_equal(means[0], one.predict(x_test.numpy())) and not np.allclose(means[0], means[1])
    mean, std = reg.predict(x_test.numpy(), return_std=True)
    assert np.allclose(mean, means.mean(0), rtol=1e-12)
    assert np.allclose(std**2, variances.mean(0) + means.var(0), rtol=1e-10)
    _, cov_y = reg.predict(x_test.numpy(), return_cov=True)
    assert np.allclose(np.diag(cov_y), std**2, rtol=1e-7)
    mean_f, cov_f = reg.predict(x_test.numpy(), return_cov=True, include_noise=False)
    draws = reg.sample_y(x_test.numpy(), n_samples=6000, random_state=1)
    sd = np.sqrt(np.diag(cov_f))
    assert np.all(np.abs(draws.mean(1) - mean_f) < 5 * sd / np.sqrt(6000))
    assert np.allclose(np.cov(draws), cov_f, atol=0.1 * sd.max() ** 2)
    by_draw = reg.relevance_draws_
    assert by_draw.shape == (3, 3) and np.allclose(by_draw.sum(1), 1)
    assert all(np.array_equal(by_draw[k], kernel_relevance(m)) for k, m in enumerate(reg.models_))
    assert np.allclose(reg.relevance_, by_draw.mean(0))
    with pytest.raises(ValueError, match="num_draws"):
        AlaCarteRegressor(name, **{**SMALL, "num_draws": 0}).fit(x, y)


@pytest.mark.parametrize("name", ["fsard", "pwl"])
def test_select_with_a_name_is_select_with_that_kernel_built_on_the_simplex(name):
    """select=True with a named ARD kernel: the estimator fitted with the same kernel built with
    simplex=True (make_model's, float64), prediction for prediction; its selection holds each
    draw's exact zeros."""
    x, y = data(n=60)
    settings = {**SMALL, "num_draws": 1, "random_state": 3}
    named = AlaCarteRegressor(name, select=True, **settings).fit(x, y)
    kernel = make_model(name, 3, num_samples=16, num_components=2, seed=3, simplex=True).covar_module
    given = AlaCarteRegressor(kernel, select=True, **settings).fit(x, y)
    assert np.array_equal(named.predict(x, return_std=True), given.predict(x, return_std=True))
    assert np.array_equal(named.selected_, given.selected_) and np.array_equal(
        named.selected_, np.flatnonzero(named.model_.covar_module.relevance.numpy()))


@pytest.mark.parametrize("kernel_class", [FSARDKernel, FSGBARDKernel])
def test_draws_of_a_kernel_object_draw_their_own_features(kernel_class):
    """A kernel object: the first draw fits it as it is; draw k fits the features of the same kernel
    built with its seed (random_state + 1000·k), as a named kernel's draws do; a kernel whose random
    state is learned (FSGBARD) starts every draw from the object's."""
    x, y = data(n=40)
    given = kernel_class(3, 16, ard_num_dims=3, seed=7)
    reg = AlaCarteRegressor(given, **{**SMALL, "num_draws": 3, "random_state": 2}).fit(x, y)
    drawn = {"perm", "sign", "gauss"} & set(dict(given.named_buffers()))
    for k, model in enumerate(reg.models_):
        source = given if k == 0 or not given.redrawable else kernel_class(3, 16, ard_num_dims=3, seed=2 + 1000 * k)
        buffers = dict(model.covar_module.named_buffers())
        assert all(torch.equal(buffers[name], getattr(source, name).to(buffers[name].dtype)) for name in {"perm"} | drawn)
        assert model.covar_module.seed == source.seed
    assert given.seed == 7 and not any(p.dtype == torch.float64 for p in given.parameters())  # left alone


@pytest.mark.parametrize("name", ["gm", "pwl"])
def test_auto_components_keep_the_fit_whose_held_out_rows_score_lower(name):
    """num_components="auto" with 400 rows held out (2 000 rows): each draw fitted with 1 and with 4
    components; the scores are the mean over the draws of each fit's best held-out score, recomputed here
    from alacarte.fit on the same models and seeds, and the estimator is, prediction for prediction, the
    one fitted with the lower-scoring number."""
    x, y = data(n=2000)
    settings = {**SMALL, "num_draws": 2, "num_components": "auto"}
    reg = AlaCarteRegressor(name, **settings).fit(x, y)
    assert set(reg.component_scores_) == {1, 4}
    for q in (1, 4):
        best = []
        for seed in (0, 1000):
            model = make_model(name, 3, num_samples=16, num_components=q, seed=seed)
            history = ac.fit(model, torch.as_tensor(x), torch.as_tensor(y), max_iter=10, restarts=1,
                             restart_iter=3, seed=seed, progress=False)
            best.append(min(history.validation_loss))
        assert reg.component_scores_[q] == pytest.approx(np.mean(best), rel=1e-12)
    chosen = min(reg.component_scores_, key=reg.component_scores_.get)
    assert reg.num_components_ == chosen
    assert [m.covar_module.num_components for m in reg.models_] == [chosen, chosen]
    plain = AlaCarteRegressor(name, **{**settings, "num_components": chosen}).fit(x, y)
    assert np.array_equal(reg.predict(x[:7], return_std=True), plain.predict(x[:7], return_std=True))
    assert plain.num_components_ == chosen and plain.component_scores_ == {}


def test_choose_components_keeps_the_lowest_mean_held_out_score():
    """The mean over draws of each fit's best held-out score decides; a tie keeps the first number, a single
    number is kept unscored, and a fit without held-out scores is refused."""
    scored = lambda *best: [FitHistory(validation_loss=[b + 0.5, b, b + 0.1]) for b in best]
    chosen, scores = choose_components({4: scored(0.2, 0.4), 1: scored(0.1, 0.6)})
    assert chosen == 4 and scores == {4: pytest.approx(0.3), 1: pytest.approx(0.35)}
    assert choose_components({1: scored(0.25), 4: scored(0.25)})[0] == 1
    assert choose_components({4: [FitHistory()]}) == (4, {})
    with pytest.raises(ValueError, match="held-out score"):
        choose_components({1: scored(0.1), 4: [FitHistory()]})


@pytest.mark.parametrize("n, fraction", [(1995, "auto"), (2000, 0.19), (5000, 0)])
def test_auto_components_below_400_held_out_rows_are_the_fit_with_four(n, fraction):
    x, y = data(n=n)
    settings = {**SMALL, "validation_fraction": fraction}
    auto = AlaCarteRegressor("gm", **{**settings, "num_components": "auto"}).fit(x, y)
    four = AlaCarteRegressor("gm", **{**settings, "num_components": 4}).fit(x, y)
    assert auto.num_components_ == 4 and auto.component_scores_ == {}
    assert np.array_equal(auto.predict(x[:7], return_std=True), four.predict(x[:7], return_std=True))


@pytest.mark.parametrize("value, message", [
    ("two", "num_components must be a positive integer or 'auto'"),
    (0, "num_components must be a positive integer"),
])
def test_num_components_other_than_a_count_or_auto_is_a_clear_error(value, message):
    x, y = data(n=40)
    with pytest.raises(ValueError, match=message):
        AlaCarteRegressor("gm", **{**SMALL, "num_components": value}).fit(x, y)


def test_relevance_is_the_kernels_or_inverse_lengthscales():
    x, y = data(n=50)
    reg = AlaCarteRegressor("fsard", **SMALL).fit(x, y)
    inverse = 1 / reg.model_.covar_module.lengthscale.detach().numpy().ravel()
    assert np.allclose(reg.relevance_, inverse / inverse.sum())
    assert reg.relevance_[2] < reg.relevance_[0]  # x₂ does not enter y

    simplex = AlaCarteRegressor(ac.FSARDKernel(3, 16, ard_num_dims=3, simplex=True, seed=0), **SMALL).fit(x, y)
    pi = simplex.model_.covar_module.simplex_weights.detach().numpy().ravel()
    assert np.allclose(simplex.relevance_, pi) and np.all(pi >= 0) and abs(pi.sum() - 1) < 1e-9
    exact = AlaCarteRegressor("exact-rbf", **SMALL).fit(x, y)
    assert np.allclose(exact.relevance_, 1 / 3)


def test_pickle_round_trip_predicts_identically():
    x, y = data(n=40)
    reg = AlaCarteRegressor("gm", **SMALL).fit(x, y)
    again = pickle.loads(pickle.dumps(reg))
    a, b = reg.predict(x, return_std=True), again.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_factory_knows_every_name_and_checks_dimensions():
    for name in KERNEL_NAMES:
        model = make_model(name, 3, num_samples=8, num_components=2)
        assert model.num_dims == 3 and model.input_offset.dtype == torch.float64
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        make_model("nope", 3)
    with pytest.raises(ValueError, match="built for 2 input dimensions"):
        make_model(ac.FSARDKernel(2, 8, seed=0), 3)
    for name in ("exact-rbf", "gm"):  # the exact model accepted any seed, "x" included
        with pytest.raises(ValueError, match="seed must be None or an integer"):
            make_model(name, 3, seed="x")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_kernel_object_gives_a_model_of_its_dtype_that_fits(dtype):
    kernel = ac.FSARDKernel(3, 8, ard_num_dims=3, seed=0).to(dtype)
    model = make_model(kernel, 3)
    assert model.covar_module is kernel
    assert {t.dtype for t in model.state_dict().values() if t.is_floating_point()} == {dtype}
    x = torch.randn(40, 3, dtype=dtype, generator=torch.Generator().manual_seed(0))
    ac.fit(model, x, x.sin().sum(1), max_iter=3, restarts=0, progress=False)
    assert model.predict(x).mean.dtype == dtype


def test_reversed_and_read_only_arrays_are_inputs_like_any_other(tmp_path):
    """X[:, ::-1] has negative strides, which torch.tensor refuses (fit, predict, score, sample_y);
    a read-only memmap makes torch warn that the array is not writable: both are copied first."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((60, 3)), rng.standard_normal(60)
    settings = dict(num_samples=16, max_iter=3, restarts=0, random_state=0, progress=False, num_draws=1)
    reference = AlaCarteRegressor(**settings).fit(x[:, ::-1].copy(), y[::-1].copy())
    model = AlaCarteRegressor(**settings).fit(x[:, ::-1], y[::-1])
    np.testing.assert_array_equal(model.predict(x[::-1]), reference.predict(x[::-1].copy()))
    assert model.score(x[::-1], y[::-1]) == reference.score(x[::-1].copy(), y[::-1].copy())
    assert model.sample_y(x[::-2], n_samples=2).shape == (30, 2)
    np.save(tmp_path / "x.npy", x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        mean = model.model_.predict(np.load(tmp_path / "x.npy", mmap_mode="r")).mean
    np.testing.assert_array_equal(mean.numpy(), model.predict(x))


@pytest.mark.parametrize("kernel", ["fsard", "gm", "exact-ard"])
def test_a_constant_input_has_relevance_zero(kernel):
    """A constant column is zeros once centred: its lengthscale gets no gradient and keeps its
    initial value while irrelevant inputs' grow, so it would rank first. With y from x₀, x₁
    of 5 inputs and a constant sixth (n = 300), its inverse lengthscale's share would be 0.59 (fsard),
    0.70 (gm) and 0.72 (exact-ard); an input without effect on the model has relevance 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 4))
    y = np.sin(2 * x[:, 0]) + x[:, 1] ** 2 / 2 + 0.05 * rng.standard_normal(120)
    x = np.column_stack([x, np.full(120, 1.5)])
    reg = AlaCarteRegressor(kernel, num_samples=32, num_components=2, max_iter=15, restarts=0).fit(x, y)
    assert reg.relevance_[4] == 0.0 and abs(reg.relevance_.sum() - 1) < 1e-12
    assert np.argmax(reg.relevance_) in (0, 1)


def test_exact_sample_y_does_not_warn_for_targets_in_large_units():
    """numpy's positive-semidefinite check has an absolute tolerance (1e-8): a PSD posterior covariance
    in units of 1e12 (targets ×1e6) fails it by round-off (numpy warns 'covariance is not symmetric
    positive-semidefinite'), where the same fit in ×1 units passes: sample_y draws in standardised units."""
    x, y = data(n=80)
    x_test = np.random.default_rng(0).uniform(-2, 2, size=(40, 3))
    reg = AlaCarteRegressor("exact-ard", **SMALL).fit(x, y * 1e6)
    _, cov = reg.predict(x_test, return_cov=True, include_noise=False)
    assert np.linalg.eigvalsh(cov).min() > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        draws = reg.sample_y(x_test, n_samples=4000, random_state=1)
    mean = reg.predict(x_test)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * sd / np.sqrt(4000))
    assert np.allclose(np.cov(draws), cov, atol=0.1 * sd.max() ** 2)


def test_select_holds_the_unneeded_inputs_at_zero_as_select_inputs_does():
    """select=True runs select_inputs after each draw's fit: the π of fit + select_inputs by hand with
    the first draw's seed; y = sin(2x₀) + cos(2x₁) keeps exactly {0, 1} on both draws, which predict
    their mixture; log_marginal_likelihood_ is the selected model's, against the dense Gaussian."""
    from alacarte.selection import select_inputs

    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 400, 6)
    kernel = ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=0).double()
    options = dict(max_iter=40, restarts=1, restart_iter=5)
    reg = AlaCarteRegressor(kernel, num_draws=2, select=True, random_state=0, **options).fit(x, y)
    assert reg.selected_.tolist() == [0, 1] and reg.selection_frequency_.tolist() == [1, 1, 0, 0, 0, 0]
    by_hand = ac.FeatureGP(None, None, ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=0).double()).double()
    ac.fit(by_hand, x, y, seed=0, progress=False, **options)
    select_inputs(by_hand, x, y, seed=0)
    # (the same fits but for the noise bound's round-off, which two 30-iteration refits carry to the
    # third decimal: the estimator's model comes from make_model)
    ours, theirs = reg.model_.covar_module.simplex_weights, by_hand.covar_module.simplex_weights
    assert torch.equal(ours == 0, theirs == 0) and torch.allclose(ours, theirs, atol=5e-3)
    model = reg.model_
    phi = model.covar_module.features(model.train_inputs[0]).detach().numpy()
    scale = float(model.target_scale)
    mean = float(model.target_offset) + scale * float(model.mean_module.constant.detach())
    cov = scale**2 * (phi @ phi.T + float(model.likelihood.noise.detach()) * np.eye(len(y)))
    assert reg.log_marginal_likelihood_ == pytest.approx(stats.multivariate_normal(np.full(len(y), mean), cov).logpdf(y),
                                                         rel=1e-9)
    assert not model.training


def test_select_needs_a_simplex_kernel_and_a_bool():
    x, y = data()
    for name in ("gm", "fastfood-rbf", "ssgpr", "exact-ard"):
        with pytest.raises(ValueError, match="select=True needs an ARD kernel to put on the simplex"):
            AlaCarteRegressor(name, select=True, **SMALL).fit(x, y)
    with pytest.raises(ValueError, match="simplex-ARD kernel"):
        AlaCarteRegressor(ac.FSARDKernel(3, 16, ard_num_dims=3), select=True, **SMALL).fit(x, y)
    with pytest.raises(ValueError, match="select"):
        AlaCarteRegressor(ac.FSARDKernel(3, 16, ard_num_dims=3, simplex=True), select="yes", **SMALL).fit(x, y)


def test_pilot_rows_fit_a_pilot_and_condition_on_every_row():
    """``pilot_rows`` is :func:`alacarte.fit_pilot` on the estimator's model (the same predictions), and
    log_marginal_likelihood_ is the conditioned model's on every row, against the dense Gaussian."""
    x, y = data(n=120)
    settings = dict(num_samples=32, num_components=2, num_draws=1, max_iter=10, restarts=1, restart_iter=3)
    reg = AlaCarteRegressor("gm", pilot_rows=40, **settings, random_state=3).fit(x, y)
    model = make_model("gm", 3, num_samples=32, num_components=2, seed=3).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ac.fit_pilot(model, x, y, rows=40, max_iter=10, restarts=1, restart_iter=3, seed=3, progress=False)
    mean, std = reg.predict(x[:10], return_std=True)
    direct = model.predict(torch.as_tensor(x[:10]))
    assert np.allclose(mean, direct.mean.numpy(), rtol=1e-12) and np.allclose(std**2, direct.observed_variance.numpy())
    assert reg.model_.train_targets.shape == (120,)
    scale, offset = float(reg.model_.target_scale), float(reg.model_.target_offset)
    with torch.no_grad():
        phi = reg.model_.covar_module.features(reg.model_.internal_inputs(torch.as_tensor(x))).numpy()
        noise, mu = float(reg.model_.likelihood.noise), float(reg.model_.mean_module.constant)
    expected = stats.multivariate_normal(np.full(120, offset + scale * mu),
                                         scale**2 * (phi @ phi.T + noise * np.eye(120))).logpdf(y)
    assert reg.log_marginal_likelihood_ == pytest.approx(expected, rel=1e-9)


def test_auto_fits_on_a_pilot_above_the_threshold_with_more_features(monkeypatch):
    """The defaults above AUTO_PILOT_ABOVE rows are the estimator with ``pilot_rows=PILOT_ROWS`` and
    ``num_samples=AUTO_PILOT_SAMPLES`` given (the same predictions); FSARD and ``select`` fit every row."""
    import alacarte.training._pilot as pilot

    monkeypatch.setattr(pilot, "AUTO_PILOT_ABOVE", 100)
    monkeypatch.setattr(pilot, "PILOT_ROWS", 40)
    monkeypatch.setattr(pilot, "AUTO_PILOT_SAMPLES", 64)
    x, y = data(n=120)
    settings = dict(num_components=2, num_draws=1, max_iter=10, restarts=1, restart_iter=3, random_state=3)
    auto = AlaCarteRegressor("gm", **settings).fit(x, y)
    given = AlaCarteRegressor("gm", pilot_rows=40, num_samples=64, **settings).fit(x, y)
    assert (auto.pilot_rows_, auto.num_samples_, auto.model_.covar_module.num_features) == (40, 64, 128)
    assert np.array_equal(auto.predict(x[:10], return_std=True), given.predict(x[:10], return_std=True))
    below = AlaCarteRegressor("gm", **settings).fit(x[:100], y[:100])
    assert (below.pilot_rows_, below.num_samples_) == (None, DEFAULT_SAMPLES)
    fsard = AlaCarteRegressor("fsard", num_samples=16, **settings).fit(x, y)
    assert fsard.pilot_rows_ is None and fsard.model_.train_targets.shape == (120,)


@pytest.mark.parametrize("kernel, n, select, expected", [
    ("gm", AUTO_PILOT_ABOVE + 1, False, PILOT_ROWS), ("pwl", AUTO_PILOT_ABOVE + 1, False, PILOT_ROWS),
    ("gm", AUTO_PILOT_ABOVE, False, None), ("fsard", 10**6, False, None), ("fsgbard", 10**6, False, None),
    ("ssgpr", 10**6, False, None), ("exact-ard", 10**6, False, None), ("fastfood-ard", 10**6, True, None)])
def test_resolve_pilot_auto(kernel, n, select, expected):
    assert resolve_pilot("auto", kernel, n, select) == expected
    assert resolve_pilot(None, kernel, n, select) is None
    assert resolve_samples("auto", expected) == (DEFAULT_SAMPLES if expected is None else AUTO_PILOT_SAMPLES)
    assert resolve_samples(96, expected) == 96
    # A model no wider than the pilot fits every row; a wider one, named or an object, takes the pilot.
    assert resolve_pilot("auto", kernel, n, select, num_samples=PILOT_SAMPLES) is None
    assert resolve_pilot("auto", kernel, n, select, num_samples=2 * PILOT_SAMPLES) == expected


def test_auto_takes_a_pilot_for_a_kernel_object_wider_than_it():
    wide, narrow = (ac.SpectralMixtureFastfoodKernel(3, m, num_components=4) for m in (2 * PILOT_SAMPLES, PILOT_SAMPLES))
    big = AUTO_PILOT_ABOVE + 1
    assert resolve_pilot("auto", wide, big, num_samples=wide.num_samples) == PILOT_ROWS
    assert resolve_pilot("auto", narrow, big, num_samples=narrow.num_samples) is None


@pytest.mark.parametrize("setting, message", [({"pilot_rows": "some"}, "pilot_rows"),
                                              ({"num_samples": "many"}, "num_samples"),
                                              ({"pilot_rows": 40, "kernel": "exact-ard"}, "per frequency"),
                                              ({"pilot_rows": 0}, "pilot_rows"), ({"pilot_rows": 2.5}, "pilot_rows"),
                                              ({"pilot_rows": 40, "kernel": "fsard"}, "per frequency"),
                                              ({"pilot_rows": 40, "select": True, "kernel": "fastfood-ard"}, "select")])
def test_bad_pilot_settings_are_value_errors(setting, message):
    x, y = data(n=60)
    with pytest.raises(ValueError, match=message):
        AlaCarteRegressor(**{**SMALL, **setting}).fit(x, y)
