"""RFFNet: hand-written gradients against autograd, the ridge penalty against its
closed form, early stopping restoring the best epoch, and selection on SE2
(scikit-learn's estimator checks: tests/test_estimator_checks.py)."""
import math

import numpy as np
import pytest
import torch

from alacarte.datasets import make_se1, make_se2
from alacarte.selection import RFFNetClassifier, RFFNetRegressor
from alacarte.selection.rffnet import _Adam, _loss, _RFFNetParameters, block_gradients, objective


def _random_params(d=4, s=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = _RFFNetParameters(
        torch.randn(s, d, generator=g, dtype=torch.float64),
        torch.rand(s, generator=g, dtype=torch.float64) * 2 * math.pi,
        torch.rand(d, generator=g, dtype=torch.float64) + 0.2,
    )
    params.beta.copy_(torch.randn(s, generator=g, dtype=torch.float64))
    params.intercept.fill_(0.3)
    return params


@pytest.mark.parametrize("kind", ["squared", "logistic"])
def test_block_gradients_match_autograd(kind):
    params = _random_params()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64)
    y = (torch.rand(9, generator=g, dtype=torch.float64) > 0.5).double() if kind == "logistic" else torch.randn(9, generator=g, dtype=torch.float64)
    alpha = 0.37

    leaves = [t.clone().requires_grad_() for t in (params.beta, params.intercept, params.relevance)]
    f = torch.cos((x * leaves[2]) @ params.omega.T + params.phase) @ leaves[0] * params.scale + leaves[1]
    loss = _loss(f, y, kind) + alpha * leaves[0].square().sum()
    expected = torch.autograd.grad(loss, leaves)
    got = block_gradients(params, x, y, alpha, kind)
    for e, a in zip(expected, got):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-14)
    # objective() is the same function
    torch.testing.assert_close(objective(params, x, y, alpha, kind), loss.detach(), rtol=1e-14, atol=0)


def test_lambda_gradient_is_taken_after_the_beta_step():
    params = _random_params()
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def step(gb, gi):
        params.beta.sub_(0.1 * gb)
        params.intercept.sub_(0.1 * gi)

    _, _, g_rel = block_gradients(params, x, y, 0.0, "squared", step)
    # at the updated β the plain gradient must agree
    torch.testing.assert_close(g_rel, block_gradients(params, x, y, 0.0, "squared")[2], rtol=1e-12, atol=1e-14)


def _ridge_closed_form(params, x, y, alpha):
    """argmin_β,b (1/n)‖y − Zβ − b‖² + μ‖β‖² with the intercept unpenalised."""
    z = torch.cos(params.projections(x)) * params.scale
    zc, yc = z - z.mean(0), y - y.mean()
    n = x.shape[0]
    beta = torch.linalg.solve(zc.T @ zc / n + alpha * torch.eye(z.shape[1], dtype=z.dtype), zc.T @ yc / n)
    return beta, (y.mean() - z.mean(0) @ beta).reshape(1)


def test_ridge_penalty_is_exact_and_matters():
    params = _random_params(d=3, s=12, seed=4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    for alpha in (0.0, 0.05):
        beta, b0 = _ridge_closed_form(params, x, y, alpha)
        params.beta.copy_(beta)
        params.intercept.copy_(b0)
        gb, gi, _ = block_gradients(params, x, y, alpha, "squared")
        assert gb.abs().max() < 1e-12 and gi.abs().max() < 1e-12
    # the penalised solution is measurably different from the unpenalised one
    unpenalised, _ = _ridge_closed_form(params, x, y, 0.0)
    penalised, _ = _ridge_closed_form(params, x, y, 0.05)
    assert torch.linalg.norm(penalised) < 0.7 * torch.linalg.norm(unpenalised)

    # the training machinery (Adam on the β block, λ fixed) reaches the closed form
    params.beta.zero_()
    params.intercept.zero_()
    adam = _Adam([params.beta, params.intercept], lr=0.02)
    for step in range(4000):
        adam.lr = 0.02 * 0.998 ** step  # Adam only settles with a decaying step
        gb, gi, _ = block_gradients(params, x, y, 0.05, "squared")
        adam.step([gb, gi])
    torch.testing.assert_close(params.beta, penalised, rtol=0, atol=1e-6)


def test_alpha_changes_the_fitted_model():
    x, y, _ = make_se1(400, seed=0)
    small = RFFNetRegressor(alpha=0.0, max_epochs=20, random_state=0).fit(x, y)
    large = RFFNetRegressor(alpha=1.0, max_epochs=20, random_state=0).fit(x, y)
    assert np.linalg.norm(large.output_weights_) < 0.5 * np.linalg.norm(small.output_weights_)


def test_early_stopping_restores_the_best_epoch():
    # a small noisy problem with a large step overfits: validation loss rises after a few epochs
    x, y, _ = make_se1(300, seed=1)
    model = RFFNetRegressor(learning_rate=0.05, n_random_features=200, patience=8, max_epochs=60,
                            validation_fraction=0.3, random_state=0).fit(x, y)
    history = model.validation_loss_
    assert model.best_epoch_ == int(np.argmin(history))
    assert model.best_epoch_ < model.n_epochs_ - 1
    assert history[-1] > history[model.best_epoch_]
    # re-evaluate the restored parameters on the held-out points: the best epoch's loss, not the last
    idx = model.validation_indices_
    z = (y[idx] - model.y_mean_) / model.y_scale_
    restored = np.mean(((model.predict(x[idx]) - model.y_mean_) / model.y_scale_ - z) ** 2)
    assert restored == pytest.approx(history[model.best_epoch_], rel=1e-12)
    assert abs(restored - history[-1]) > 1e-3 * history[-1]


def test_one_dimensional_and_column_targets_give_the_same_model():
    x, y, _ = make_se1(200, seed=2)
    a = RFFNetRegressor(max_epochs=5, random_state=3).fit(x, y)
    b = RFFNetRegressor(max_epochs=5, random_state=3).fit(x, y.reshape(-1, 1))
    np.testing.assert_array_equal(a.predict(x), b.predict(x))


def test_deterministic_under_random_state():
    x, y, _ = make_se1(300, seed=3)
    p1 = RFFNetRegressor(max_epochs=5, random_state=7).fit(x, y).predict(x)
    p2 = RFFNetRegressor(max_epochs=5, random_state=7).fit(x, y).predict(x)
    p3 = RFFNetRegressor(max_epochs=5, random_state=8).fit(x, y).predict(x)
    np.testing.assert_array_equal(p1, p2)
    assert not np.array_equal(p1, p3)


def test_selects_exactly_the_relevant_inputs_of_se2_at_n_5000():
    x, y, relevant = make_se2(5000, seed=0)
    model = RFFNetRegressor(max_epochs=30, learning_rate=0.01, random_state=0).fit(x, y)
    np.testing.assert_array_equal(model.selected_, relevant)
    assert model.relevance_.max() == 1.0
    assert np.delete(model.relevance_, relevant).max() < 0.2


def test_classifier_binary_labels():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 6))
    labels = np.where(x[:, 0] * x[:, 1] > 0, "yes", "no")
    clf = RFFNetClassifier(max_epochs=40, learning_rate=0.01, random_state=0).fit(x[:400], labels[:400])
    np.testing.assert_array_equal(clf.classes_, ["no", "yes"])
    proba = clf.predict_proba(x[400:])
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert np.mean(clf.predict(x[400:]) == labels[400:]) > 0.8
    assert set(clf.selected_) >= {0, 1}
    with pytest.raises(ValueError, match="binary classification.*y has 3 class"):
        RFFNetClassifier().fit(x[:30], np.arange(30) % 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size"),
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"alpha": -1.0}, "alpha"),
    ({"validation_fraction": 1.0}, "validation_fraction"),
    ({"n_random_features": 2.5}, "n_random_features"),
])
def test_bad_settings_are_refused(kwargs, message):
    x, y, _ = make_se1(50, seed=0)
    with pytest.raises(ValueError, match=message):
        RFFNetRegressor(**kwargs).fit(x, y)


def test_nan_inputs_are_refused():
    x, y, _ = make_se1(50, seed=0)
    x[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        RFFNetRegressor().fit(x, y)

