"""SRFFRegressor: its pieces against independent truths, scikit-learn's conventions, selection."""
import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from sklearn.exceptions import ConvergenceWarning, NotFittedError

from alacarte import AlaCarteRegressor, DerivativeSelector, RFFNetClassifier, RFFNetRegressor, SRFFRegressor
from alacarte.selection.srff import _GRID_RANGE, _median_neighbour_distance, _SRFFProblem, monotone_fista

SMALL = dict(n_components=20, n_alphas=4, max_iter=5, fista_iter=5, random_state=0)


def small_problem(n=200, d=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    eps = torch.randn(50, d, generator=gen, dtype=torch.float64)
    offset = 2 * math.pi * torch.rand(50, generator=gen, dtype=torch.float64)
    return _SRFFProblem(x, y - y.mean(), eps, offset)


def test_gradient_matches_autograd():
    problem = small_problem()
    gamma = torch.tensor([0.9, 0.7, 0.1, 0.0, 0.2, 0.1], dtype=torch.float64)
    coef = problem.ridge(gamma, 0.5)
    value, grad = problem.loss_and_grad(gamma, coef)
    g = gamma.clone().requires_grad_(True)
    z = math.sqrt(2 / 50) * torch.cos(problem.x * g @ problem.eps.T + problem.offset)
    reference = ((problem.y - z @ coef) ** 2).mean()
    (reference_grad,) = torch.autograd.grad(reference, g)
    assert abs(value - float(reference.detach())) <= 1e-14 * abs(value)
    assert torch.allclose(grad, reference_grad, rtol=1e-12, atol=1e-15)


def test_ridge_step_equals_sklearn_ridge():
    problem = small_problem()
    gamma = torch.full((6,), 0.4, dtype=torch.float64)
    ours = problem.ridge(gamma, 0.3).numpy()
    theirs = Ridge(alpha=0.3, fit_intercept=False, solver="cholesky").fit(
        problem.features(gamma).numpy(), problem.y.numpy()).coef_
    assert np.allclose(ours, theirs, rtol=1e-9, atol=1e-12)


def test_fista_never_increases_the_objective_and_stays_on_the_simplex():
    problem = small_problem()
    size = 3.0
    gamma = torch.full((6,), size / 6, dtype=torch.float64)
    coef = problem.ridge(gamma, 0.1)
    gamma, value, _, history = monotone_fista(problem, gamma, coef, size, step_size=1e3, max_iter=60, tol=0.0)
    steps = np.diff(history)
    assert (steps <= 0).all(), steps.max()
    assert history[-1] < 0.9 * history[0]  # and it does descend
    assert abs(value - problem.loss(gamma, coef)) <= 1e-15 * value
    assert bool((gamma >= 0).all()) and abs(float(gamma.sum()) - size) <= 1e-12


def test_median_neighbour_distance_equals_brute_force():
    x = torch.randn(300, 4, dtype=torch.float64)
    dist = torch.cdist(x, x)
    dist.fill_diagonal_(math.inf)
    brute = float(dist.topk(20, dim=1, largest=False).values.median())
    assert abs(_median_neighbour_distance(x, 20, np.random.default_rng(0)) - brute) <= 1e-12 * brute


def test_selects_the_relevant_inputs_and_predicts():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((900, 8))
    y = np.sin(3 * x[:, 1]) + np.cos(3 * x[:, 4]) + 0.05 * rng.standard_normal(900)
    model = SRFFRegressor(n_components=100, n_alphas=12, random_state=0).fit(x[:600], y[:600])
    # The two relevant inputs carry most of the budget c (exact zeros elsewhere need more
    # data and alternations than a unit test can afford: see experiments/results/selection.md).
    assert sorted(np.argsort(model.relevance_)[-2:].tolist()) == [1, 4]
    assert model.relevance_[[1, 4]].sum() > 0.8
    assert set(model.selected_) >= {1, 4}
    assert abs(model.relevance_.sum() - 1) <= 1e-12 and (model.relevance_ >= 0).all()
    assert np.allclose(model.gamma_, model.relevance_ * model.simplex_size_)
    assert model.score(x[600:], y[600:]) > 0.9
    assert model.alpha_ in model.alphas_ and len(model.alphas_) == len(model.validation_mse_) <= 12
    # Deterministic under random_state.
    again = SRFFRegressor(n_components=100, n_alphas=12, random_state=0).fit(x[:600], y[:600])
    assert np.array_equal(again.predict(x[600:]), model.predict(x[600:]))
    # Run longer (at about the λ chosen), γ reaches exact zeros, and those inputs do not change predictions.
    model = SRFFRegressor(n_components=100, alpha=0.02, max_iter=200, random_state=0).fit(x[:600], y[:600])
    dropped = np.setdiff1d(np.arange(8), model.selected_)
    assert dropped.size > 0 and {1, 4}.isdisjoint(dropped) and (model.gamma_[dropped] == 0).all()
    shuffled = x[600:].copy()
    shuffled[:, dropped] = rng.standard_normal((300, dropped.size))
    assert np.array_equal(model.predict(shuffled), model.predict(x[600:]))


def test_a_path_stopped_early_reports_the_alphas_it_tried_with_their_scores():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 8))
    y = np.sin(3 * x[:, 1]) + np.cos(3 * x[:, 4]) + 0.05 * rng.standard_normal(600)
    model = SRFFRegressor(n_components=100, n_alphas=12, path_patience=1, random_state=0).fit(x, y)
    assert 2 <= len(model.alphas_) == len(model.validation_mse_) < 12
    # the first steps of the 12-point geometric grid, in order
    assert np.allclose(model.alphas_[1:] / model.alphas_[:-1], _GRID_RANGE ** (1 / 11), rtol=1e-12)
    assert model.alpha_ == model.alphas_[np.argmin(model.validation_mse_)]


def test_fixed_alpha_and_simplex_size_skip_the_search():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((100, 3)), rng.standard_normal(100)
    model = SRFFRegressor(n_components=30, alpha=1.0, simplex_size=2.0, random_state=0).fit(x, y)
    assert model.alpha_ == 1.0 and model.validation_mse_ is None
    assert model.simplex_size_ == 2.0 and abs(model.gamma_.sum() - 2.0) <= 1e-12


def test_works_in_pipelines_and_grid_search():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((120, 3))
    y = x[:, 0] ** 2 + 0.1 * rng.standard_normal(120)
    search = GridSearchCV(make_pipeline(StandardScaler(), SRFFRegressor(**SMALL)),
                          {"srffregressor__n_components": [10, 30]}, cv=2).fit(x, y)
    assert search.best_params_["srffregressor__n_components"] in (10, 30)


@pytest.mark.parametrize("params, message", [
    (dict(n_components=0), "n_components"),
    (dict(alpha=-1.0), "alpha"),
    (dict(validation_fraction=1.0), "validation_fraction"),
    (dict(path_patience=0), "path_patience"),
    (dict(simplex_size=float("nan")), "simplex_size"),
])
def test_rejects_bad_settings(params, message):
    with pytest.raises(ValueError, match=message):
        SRFFRegressor(**params).fit(np.ones((10, 2)), np.arange(10.0))


def test_refuses_to_choose_alpha_without_validation_rows():
    """Too few rows to hold any out: a clear error, not a silently unregularised model."""
    x, y = np.random.default_rng(3).standard_normal((20, 2)), np.arange(20.0)
    with pytest.raises(ValueError, match="holds out 0"):
        SRFFRegressor(n_components=10, validation_fraction=0.01).fit(x, y)
    model = SRFFRegressor(n_components=10, validation_fraction=0.01, alpha=0.5, random_state=0).fit(x, y)
    assert model.alpha_ == 0.5


def test_srff_and_rffnet_only_centre_a_constant_column():
    """A column of 0.1s has a computed std of ~4e-17, not 0: dividing by it would turn
    round-off into an O(1) input. Both estimators give it scale 1 (shared rule)."""
    rng = np.random.default_rng(0)
    x = np.insert(rng.standard_normal((60, 2)), 1, 0.1, axis=1)
    assert 0 < x[:, 1].std() < 1e-15  # the round-off the rule is for
    y = np.sin(x[:, 0])
    for model in (SRFFRegressor(n_components=20, alpha=1.0, max_iter=2, random_state=0),
                  RFFNetRegressor(max_epochs=2, random_state=0)):
        model.fit(x, y)
        assert model.x_scale_[1] == 1.0 and abs(model.x_mean_[1] - 0.1) < 1e-15
        assert np.all(np.isfinite(model.predict(x)))


def test_rffnet_only_centres_a_constant_target():
    """The same rule for y: np.std of 60 copies of 1/3 is 1.1e-16; dividing the centred
    targets (round-off) by it would give the network O(1) noise to fit."""
    x = np.random.default_rng(0).standard_normal((60, 2))
    y = np.full(60, 1 / 3)
    assert 0 < y.std() < 1e-15
    model = RFFNetRegressor(max_epochs=2, random_state=0).fit(x, y)
    assert model.y_scale_ == 1.0
    assert np.allclose(model.predict(x), 1 / 3, atol=1e-2)


@pytest.mark.parametrize("make", [
    lambda: SRFFRegressor(n_components=16, n_alphas=3, max_iter=3, fista_iter=3, random_state=0),
    lambda: RFFNetRegressor(n_random_features=16, max_epochs=3, random_state=0),
    lambda: DerivativeSelector(tau=1e-3, max_iter=30, max_inner_iter=30),
])
def test_selection_estimators_take_float32_targets_and_refuse_strings(make):
    """float32 targets are the float64 values they hold (a float32 y once met float64 features in a solve)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 3))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(80)
    y32 = y.astype(np.float32)
    np.testing.assert_array_equal(make().fit(x, y32).predict(x[:5]), make().fit(x, y32.astype(np.float64)).predict(x[:5]))
    with pytest.raises(ValueError, match="y must be numeric"):
        make().fit(x, y.astype(str))


def regression_data(n=200, d=6, seed=0):
    """x (n, d) and y = sin(2x₀)·x₁ + noise, as numpy arrays."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    return x, np.sin(2 * x[:, 0]) * x[:, 1] + 0.1 * rng.standard_normal(n)


def test_srff_and_rffnet_do_not_depend_on_the_targets_units():
    """SRFF only centred y: with y in units 1000× larger, its first γ-step moved γ by ~1e-6, which
    passed its stopping test, and the fit ended at the uniform start (relevance 1/6 each)."""
    x, y = regression_data()
    for make in (lambda: SRFFRegressor(**SMALL), lambda: RFFNetRegressor(max_epochs=5, random_state=0)):
        reference = make().fit(x, y)
        assert reference.relevance_.std() > 0.05  # it did select
        for units in (1e-3, 1e10):
            model = make().fit(x, y * units)
            np.testing.assert_allclose(model.relevance_, reference.relevance_, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(model.predict(x[:20]), reference.predict(x[:20]) * units, rtol=1e-6)


def test_a_constant_input_has_relevance_zero():
    """A constant column is zeros once centred; RFFNet kept its λ at the start (relevance 0.37, selected)
    and SRFF's γ put the simplex's spare weight on it (relevance 0.59, the largest)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 6))
    x[:, 3] = 0.1
    y = np.sin(2 * x[:, 0]) + x[:, 1] ** 2 + 0.05 * rng.standard_normal(600)
    for model in (SRFFRegressor(n_components=50, n_alphas=6, random_state=0),
                  RFFNetRegressor(max_epochs=20, random_state=0)):
        model.fit(x, y)
        assert model.relevance_[3] == 0 and 3 not in model.selected_, type(model).__name__
        assert {0, 1} <= set(model.selected_)
    srff = SRFFRegressor(n_components=20, alpha=1.0, random_state=0).fit(x[:, [3]], y)  # no varying input at all
    assert (srff.gamma_ == 0).all() and np.allclose(srff.predict(x[:3, [3]]), srff.predict(x[3:6, [3]]))


@pytest.mark.parametrize("make, refit_error", [
    (lambda: SRFFRegressor(**SMALL), dict(validation_fraction=0.001)),  # refused after the standardisation
    (lambda: RFFNetRegressor(max_epochs=3, random_state=0), dict(learning_rate=True)),
    (lambda: DerivativeSelector(tau=1e-3, max_iter=30), dict(max_memory_bytes=1)),
    (lambda: AlaCarteRegressor(num_samples=16, max_iter=3, restarts=0, progress=False), None),
])
def test_a_failed_refit_leaves_the_estimator_unfitted(make, refit_error):
    """A refit that raises must not leave the new data's standardisation with the old coefficients:
    SRFF would predict [2.35, −0.35, …] for [0.92, 0.08, …], without an error."""
    x, y = regression_data(n=80)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # DerivativeSelector's: not the point here
        model = make().fit(x, y)
    x_new, y_new = x[:, :4] * 10 + 3, y * 5 - 1
    if refit_error is None:
        y_new = np.full_like(y, 2.0)  # a constant target: nothing to learn
    else:
        model.set_params(**refit_error)
    with pytest.raises(ValueError):
        model.fit(x_new, y_new)
    with pytest.raises(NotFittedError):
        model.predict(x[:, :4])
    assert not [name for name in vars(model) if name.endswith("_")]


def test_targets_too_large_to_standardise_are_refused_by_name():
    x, y = regression_data(n=60)
    for model in (SRFFRegressor(**SMALL), RFFNetRegressor(max_epochs=2), DerivativeSelector(max_iter=5)):
        with pytest.raises(ValueError, match="y is too large in magnitude to standardise"):
            model.fit(x, 1e308 * np.sign(y))


@pytest.mark.parametrize("model", [
    SRFFRegressor(alpha=True), SRFFRegressor(tol=math.inf), SRFFRegressor(simplex_size=True),
    RFFNetRegressor(learning_rate=True), RFFNetRegressor(validation_fraction=False),
    RFFNetClassifier(alpha=True), DerivativeSelector(tau=True), DerivativeSelector(refit="no"),
    DerivativeSelector(warm_start=1),
])
def test_bools_are_no_numbers_and_numbers_no_bools(model):
    x, y = regression_data(n=60)
    with pytest.raises(ValueError, match="must be"):
        model.fit(x, y > 0 if isinstance(model, RFFNetClassifier) else y)


def test_derivative_selector_predicts_as_it_was_fitted():
    """predict read self.refit: set_params(refit=True) after a refit=False fit predicted the mean."""
    x, y = regression_data(n=60, d=3)
    model = DerivativeSelector(tau=1e-3, max_iter=200, refit=False).fit(x, y)
    before = model.predict(x)
    assert np.array_equal(model.set_params(refit=True).predict(x), before) and not model.refit_


def test_srff_fits_targets_of_huge_magnitude():
    """y_scale**2 as a Python float overflows for |y| above ~1e154 (y·1e155), although the fit itself
    runs on standardised targets: SRFF fits such data, as RFFNetRegressor does."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(40)
    small = SRFFRegressor(**SMALL).fit(x, y)
    huge = SRFFRegressor(**SMALL).fit(x, y * 1e200)
    np.testing.assert_array_equal(huge.selected_, small.selected_)
    np.testing.assert_allclose(huge.predict(x[:5]), small.predict(x[:5]) * 1e200, rtol=1e-9)
    assert np.all(np.isinf(huge.validation_mse_))  # the MSE in the target's units is beyond float64


@pytest.mark.parametrize("make", [
    lambda: SRFFRegressor(**{**SMALL, "n_components": 6}),  # D = d: output weights have the shape of an input weight
    lambda: RFFNetRegressor(max_epochs=3, random_state=0),
    lambda: DerivativeSelector(tau=1e-3, max_iter=30),
])
def test_sklearn_feature_selectors_read_the_relevances(make):
    """SelectFromModel and RFE take coef_ (else feature_importances_) as one weight per input. SRFF's and
    RFFNet's output weights are one per random feature, not per input: read as coef_ on y = sin(2x₀)x₂
    (n = 300, d = 6), SelectFromModel(SRFFRegressor(n_components=6)) would keep inputs 1 and 4, where
    relevance_ ranks 0, 1, 2 first (with D ≠ d its mask would have D entries). The relevances are every
    selector's feature_importances_, DerivativeSelector's too."""
    from sklearn.feature_selection import RFE, SelectFromModel

    x, y = regression_data(n=80)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        selector = SelectFromModel(make()).fit(x, y)
        relevance = selector.estimator_.relevance_
        np.testing.assert_array_equal(selector.estimator_.feature_importances_, relevance)
        np.testing.assert_array_equal(selector.get_support(), relevance >= relevance.mean())
        assert selector.transform(x).shape == (80, int((relevance >= relevance.mean()).sum()))
        assert RFE(make(), n_features_to_select=5).fit(x, y).support_.shape == (6,)
    assert not hasattr(make(), "feature_importances_")


def test_srff_predicts_in_blocks_of_rows(monkeypatch):
    """predict takes blocks of rows, as RFFNet: the features of all m rows at once are m×D (at
    m = 160 000 and D = 300, 743 MB more peak memory, more than fitting on 40 000 rows takes)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (100, 3))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(100)
    model = SRFFRegressor(n_components=20, alpha=1e-3, random_state=0).fit(x, y)
    x_test = rng.uniform(-2, 2, (250, 3))
    whole = model.transform_features(x_test) @ model.output_weights_ + model.intercept_
    rows, cos = [], np.cos
    # the package's memory budget sized for 64 rows of the m×D phases and their cosines
    monkeypatch.setattr("alacarte.selection.rffnet.DEFAULT_MEMORY_BUDGET", 64 * 2 * len(model.output_weights_) * 8)
    monkeypatch.setattr(np, "cos", lambda phases: rows.append(phases.shape[0]) or cos(phases))  # the features' rows
    predicted = model.predict(x_test)
    monkeypatch.undo()
    assert rows == [64, 64, 64, 58]
    np.testing.assert_allclose(predicted, whole, rtol=1e-12, atol=1e-12)
