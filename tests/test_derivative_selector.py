"""DerivativeSelector (Rosasco et al. 2010): Algorithm 1 against a direct convex
solve of the same objective, whose derivative matrices come from autograd."""
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from sklearn.exceptions import ConvergenceWarning

from alacarte.datasets import make_rosasco, rosasco_split
from alacarte.datasets.synthetic import ROSASCO_MEAN_ABS
from alacarte.selection import DerivativeSelector
from derivative_reference import paper_iteration


def _representation_maps(x, gamma):
    """Linear maps c = (a, b) ↦ (f(xᵢ))ᵢ and ↦ (∂ⱼf(xᵢ))ᵢ for
    f(p) = (1/n) Σₛ aₛ k(xₛ, p) + (1/n) Σₛⱼ bₛʲ ∂k(p, u)/∂uʲ|_{u=xₛ},
    built by automatic differentiation (independent of the closed-form blocks)."""
    xt = torch.from_numpy(x)
    n, d = x.shape

    def basis(p):
        u = xt.clone().requires_grad_()
        k = torch.exp(-gamma * (p - u).square().sum(1))
        du = torch.autograd.grad(k.sum(), u, create_graph=True)[0]
        return torch.cat([k, du.reshape(-1)]) / n

    values = np.stack([basis(xt[i]).detach().numpy() for i in range(n)])
    jac = np.stack([torch.autograd.functional.jacobian(basis, xt[i]).numpy() for i in range(n)])  # (i, c, j)
    return values, jac.transpose(2, 0, 1)


def _objective(c, values, derivs, y, tau, mu):
    """E + 2τR + μ‖f‖²_H, with ‖f‖²_H = (1/n)[aᵀ f(x) + bᵀ ∇f(x)] by the (derivative) reproducing property."""
    n, d = values.shape[0], derivs.shape[0]
    gram = np.concatenate([values, derivs.transpose(1, 0, 2).reshape(n * d, -1)]) / n
    return (np.mean((y - values @ c) ** 2) + 2 * tau * np.sqrt(np.mean((derivs @ c) ** 2, axis=1)).sum()
            + mu * c @ gram @ c)


def test_algorithm_1_matches_a_direct_convex_solve():
    rng = np.random.default_rng(0)
    n, d, gamma, tau, mu = 9, 3, 0.4, 0.05, 1e-2
    x = rng.uniform(-2, 2, (n, d))
    y = np.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1] + 0.01 * rng.standard_normal(n)
    model = DerivativeSelector(tau=tau, mu=mu, gamma=gamma, refit=False, tol=1e-10, max_iter=100000,
                               max_inner_iter=20000).fit(x, y)
    assert model.converged_
    yc = y - y.mean()
    # the selector works on the inputs standardised on the training set: solve the same problem there
    z = (x - x.mean(0)) / x.std(0)
    np.testing.assert_allclose(model.x_mean_, x.mean(0), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(model.x_scale_, x.std(0), rtol=1e-15)
    values, derivs = _representation_maps(z, gamma)
    c_alg = np.concatenate([model.dual_coef_, model.derivative_coef_.reshape(-1)])
    f_alg = _objective(c_alg, values, derivs, yc, tau, mu)

    # direct solve: epigraph form, min E(c) + 2τ Σ tⱼ  s.t.  tⱼ² ≥ (1/n)‖Dⱼc‖², t ≥ 0
    m = values.shape[1]

    gram = np.concatenate([values, derivs.transpose(1, 0, 2).reshape(n * d, -1)]) / n
    gram = (gram + gram.T) / 2

    def obj(w):
        return np.mean((yc - values @ w[:m]) ** 2) + 2 * tau * w[m:].sum() + mu * w[:m] @ gram @ w[:m]

    def obj_grad(w):
        g = np.zeros_like(w)
        g[:m] = -2 * values.T @ (yc - values @ w[:m]) / n + 2 * mu * gram @ w[:m]
        g[m:] = 2 * tau
        return g

    cons = [{"type": "ineq",
             "fun": lambda w, j=j: w[m + j] ** 2 - np.mean((derivs[j] @ w[:m]) ** 2),
             "jac": lambda w, j=j: np.concatenate([-2 * derivs[j].T @ (derivs[j] @ w[:m]) / n,
                                                    2 * w[m + j] * np.eye(d)[j]])} for j in range(d)]
    # SLSQP from c = 0 stops short of the optimum or not depending on BLAS threading (0.176 against
    # 0.111): its constraints are degenerate where tⱼ = 0, at exactly the sparse optimum. Start it from
    # the smooth, jointly convex variational form 2τ‖v‖ = min_{η>0} τ(‖v‖²/η + η), solved by L-BFGS-B.
    def variational(w):
        c, eta = w[:m], w[m:]
        residual, group = yc - values @ c, derivs @ c
        sq_norms = np.mean(group ** 2, axis=1)
        grad = np.empty_like(w)
        grad[:m] = (-2 * values.T @ residual / n + 2 * mu * gram @ c
                    + tau * np.einsum("j,jik,ji->k", 2 / (n * eta), derivs, group))
        grad[m:] = tau * (1 - sq_norms / eta ** 2)
        return np.mean(residual ** 2) + mu * c @ gram @ c + tau * np.sum(sq_norms / eta + eta), grad

    smooth = minimize(variational, np.concatenate([np.zeros(m), np.ones(d)]), jac=True, method="L-BFGS-B",
                      bounds=[(None, None)] * m + [(1e-12, None)] * d,
                      options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 100000, "maxfun": 200000})
    c_smooth = smooth.x[:m]
    start = np.concatenate([c_smooth, np.sqrt(np.mean((derivs @ c_smooth) ** 2, axis=1))])
    res = minimize(obj, start, jac=obj_grad, constraints=cons, bounds=[(None, None)] * m + [(0, None)] * d,
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 5000})
    f_direct = _objective(res.x[:m], values, derivs, yc, tau, mu)
    # Algorithm 1 reaches the optimum (it can only be ≥ it)
    assert f_alg == pytest.approx(f_direct, rel=1e-7, abs=1e-10)
    # μ > 0: the minimiser is unique, so the functions agree, at the data and elsewhere
    np.testing.assert_allclose(model.fitted_values_ - y.mean(), values @ res.x[:m], atol=2e-5)
    fresh = rng.uniform(-2, 2, (5, d))
    direct = DerivativeSelector(tau=tau, mu=mu, gamma=gamma, refit=False).fit(x, y)
    direct.dual_coef_, direct.derivative_coef_ = res.x[:n], res.x[n:m].reshape(n, d)
    np.testing.assert_allclose(model.predict_penalized(fresh), direct.predict_penalized(fresh), atol=2e-5)
    np.testing.assert_allclose(model.fitted_values_, model.predict_penalized(x), atol=1e-10)
    # partial-derivative norms agree with autograd's
    np.testing.assert_allclose(model.derivative_norms_, np.sqrt(np.mean((derivs @ c_alg) ** 2, axis=1)), rtol=1e-9, atol=1e-12)
    # this τ switches the second input off (an exact zero at the optimum, ~tol after the iteration)
    norms = model.derivative_norms_
    assert norms[1] < 1e-9 and norms[0] > 1e-2 and norms[2] > 1e-2
    # the paper's rule: Σᵢ (∂ⱼf(xᵢ))² > τ
    np.testing.assert_array_equal(model.selected_, np.flatnonzero(n * norms**2 > tau))
    assert 0 in model.selected_ and 1 not in model.selected_


def test_iterates_are_those_of_the_papers_equations():
    """The selector carries f's values and derivatives at the data, and L v, along the iteration instead
    of recomputing them: the same iterates and iteration counts as eq. 14–17 computed as printed."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, (30, 4))
    y = np.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1] + 0.05 * rng.standard_normal(30)
    for tol, max_iter in ((1e-6, 5000), (1e-12, 300)):  # one run that converges, one stopped by max_iter
        params = dict(tau=0.05, mu=1e-3, gamma=0.4, tol=tol, max_iter=max_iter, max_inner_iter=50)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = DerivativeSelector(refit=False, **params).fit(x, y)
        z = torch.from_numpy((x - x.mean(0)) / x.std(0))
        alpha, beta, outer, inner = paper_iteration(z, torch.from_numpy(y - y.mean()), **params)
        assert (model.n_iter_, model.n_inner_iter_) == (outer, inner)
        assert model.converged_ == (outer < max_iter) == (tol > 1e-9)
        assert 0 in model.selected_ and 2 not in model.selected_  # the projection zeroes an input
        scale = abs(model.dual_coef_).max()
        np.testing.assert_allclose(model.dual_coef_, alpha.numpy(), rtol=0, atol=1e-11 * scale)
        np.testing.assert_allclose(model.derivative_coef_, beta.reshape(4, 30).T.numpy(), rtol=0, atol=1e-11 * scale)


def test_objective_decreases_along_the_iterations():
    x, y, _ = make_rosasco("f3", 30, seed=1)
    yc = y - y.mean()
    objs = []
    for iters in (1, 2, 5, 20, 100, 400):
        m = DerivativeSelector(tau=1e-3, mu=0.0, gamma=0.3, refit=False, max_iter=iters, tol=1e-14).fit(x, y)
        grads = m.derivative_norms_
        objs.append(np.mean((yc - (m.fitted_values_ - y.mean())) ** 2) + 2e-3 * grads.sum())
    assert all(b <= a + 1e-12 for a, b in zip(objs, objs[1:]))


def test_gr_refit_on_the_selected_inputs_predicts_well():
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (40, 4))
    y = np.sin(1.5 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.05 * rng.standard_normal(40)
    xt = rng.uniform(-2, 2, (200, 4))
    yt = np.sin(1.5 * xt[:, 0]) + 0.5 * xt[:, 1] ** 2
    # hyperparameters picked for the raw inputs (Var = 4/3), written for the standardised ones z the
    # selector works on: γ·Var for the kernels; ∂f/∂z = std·∂f/∂x, so τ/std keeps the same penalty
    var = 4 / 3
    model = DerivativeSelector(tau=0.1 / np.sqrt(var), gamma=0.2 * var, refit_gamma=0.5 * var, max_iter=1000).fit(x, y)
    assert {0, 1} <= set(model.selected_)
    assert model.relevance_[:2].min() > model.relevance_[2:].max()
    assert np.mean((model.predict(xt) - yt) ** 2) < 0.15 * np.var(yt)
    # the refit is kernel ridge on the selected columns
    assert model.ridge_.n_features_in_ == len(model.selected_)


def test_refuses_problems_that_would_not_fit_in_memory():
    x = np.zeros((2000, 50))
    with pytest.raises(ValueError, match=r"needs about 153\.5\d GiB for n=2000, d=50.*max_memory_bytes=2\.00 GiB"):
        DerivativeSelector().fit(x, np.zeros(2000))
    with pytest.raises(ValueError, match="max_memory_bytes=0.00"):
        DerivativeSelector(max_memory_bytes=1000).fit(x[:10, :3], np.arange(10.0))


def test_warm_start_continues_from_the_previous_solution():
    x, y, _ = make_rosasco("f2", 40, seed=2)
    # raw-input hyperparameters (γ = 0.2, τ = 0.5 → 1.0; Var(x) = 3) for the standardised inputs
    t = 1 / np.sqrt(3)
    common = dict(gamma=0.6, tol=1e-6, max_iter=20000)
    cold = DerivativeSelector(tau=0.5 * t, **common).fit(x, y)
    warm = DerivativeSelector(tau=1.0 * t, warm_start=True, **common).fit(x, y)
    warm.set_params(tau=0.5 * t).fit(x, y)
    assert cold.converged_ and warm.converged_
    np.testing.assert_allclose(warm.fitted_values_, cold.fitted_values_, atol=1e-8)
    # the same fixed point, reached from the τ = 1 solution rather than from 0
    assert warm.n_iter_ < cold.n_iter_ and warm.n_inner_iter_ < 0.8 * cold.n_inner_iter_


def test_rosasco_generators():
    from scipy import integrate
    for name, f in (("f1", lambda a, b: (a**4 - a**2) * (3 + b)),
                    ("f3", lambda a, b: -2 * (2 * a**2 - 1) * b * np.exp(-a**2 - b**2))):
        mean_abs = integrate.dblquad(lambda b, a: abs(f(a, b)), -3, 3, -3, 3, epsabs=1e-9)[0] / 36
        assert ROSASCO_MEAN_ABS[name] == pytest.approx(mean_abs, rel=1e-6)
        x, y, relevant = make_rosasco(name, 4000, seed=0)
        assert x.shape == (4000, 6) and relevant == (0, 1) and x.min() >= -3 and x.max() <= 3
        assert np.std(y - f(x[:, 0], x[:, 1])) == pytest.approx(np.sqrt(0.01 * mean_abs), rel=0.05)
    split = rosasco_split("f2", seed=3)
    assert [split[k][0].shape[0] for k in ("train", "validation", "test")] == [80, 200, 200]
    np.testing.assert_array_equal(split["test"][1], rosasco_split("f2", seed=4)["test"][1])
    assert not np.array_equal(split["train"][1], rosasco_split("f2", seed=4)["train"][1])
    with pytest.raises(ValueError, match="function must be one of"):
        make_rosasco("f4", 10)
    with pytest.raises(ValueError, match="noise_fraction"):
        make_rosasco("f1", 10, noise_fraction=float("inf"))
    for bad in ({"n_train": -10}, {"n_train": 0}, {"n_validation": 0}, {"n_test": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            rosasco_split("f1", **bad)
    with pytest.raises(ValueError, match="fixed test set"):
        rosasco_split("f2", seed=10_001)


def test_warm_start_with_other_inputs_starts_cold_and_non_convergence_warns():
    x, y, _ = make_rosasco("f2", 40, seed=2)
    model = DerivativeSelector(tau=0.5, gamma=0.2, tol=1e-8, warm_start=True).fit(x, y)
    model.fit(x[:, :4], y)  # same n, other d: not a warm start
    assert model.derivative_coef_.shape == (40, 4)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        DerivativeSelector(tau=0.5, gamma=0.2, tol=1e-14, max_iter=2).fit(x, y)


def test_selection_and_predictions_do_not_depend_on_the_inputs_units():
    """Rescaling one input (metres → millimetres) and shifting another leaves the fit unchanged:
    the selector standardises its inputs on the training set."""
    x, y, _ = make_rosasco("f1", 50, seed=3)
    xt, _, _ = make_rosasco("f1", 20, seed=4)

    def units(a):  # input 0 (relevant) in 1000× smaller units, input 2 (irrelevant) shifted
        a = a.copy()
        a[:, 0] *= 1000.0
        a[:, 2] += 250.0
        return a

    scale = float(y.std())
    common = dict(tol=1e-7 * scale, max_iter=20000, max_inner_iter=5000)
    # an explicit γ with the GR refit (selects exactly the relevant pair), and the default γ = 1/d
    for params in ({"tau": 0.005 * scale, "gamma": 0.5, "refit_gamma": 1.0, "mu": 1e-4},
                   {"tau": 0.02 * scale, "mu": 1e-3, "refit": False}):
        a = DerivativeSelector(**common, **params).fit(x, y)
        b = DerivativeSelector(**common, **params).fit(units(x), y)
        assert a.converged_ and b.converged_
        np.testing.assert_allclose(b.x_scale_ / a.x_scale_, [1000, 1, 1, 1, 1, 1], rtol=1e-12)
        np.testing.assert_allclose(b.x_mean_ - a.x_mean_ * [1000, 1, 1, 1, 1, 1], [0, 0, 250, 0, 0, 0], atol=1e-9)
        if "gamma" in params:
            np.testing.assert_array_equal(a.selected_, [0, 1])
        else:
            assert b.gamma_ == a.gamma_ == 1 / 6
        np.testing.assert_array_equal(b.selected_, a.selected_)
        # The two fits' standardised inputs differ by round-off only (~2e-14 absolute, from the ×1000
        # and the shift), and the fits then agree to ~1e-14 relative.  1e-9 relative leaves room for
        # round-off accumulating over thousands of iterations and is still orders of magnitude below
        # any real unit effect (unstandardised, the ×1000 changes relevances by O(1)).  Derivative
        # norms that are exact zeros at the optimum are ~1e-11 (the stopping tolerance) and differ
        # in their own leading digits: atol 1e-12 (relevance) / 1e-12·std(y) (norms) covers them.
        np.testing.assert_allclose(b.relevance_, a.relevance_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b.derivative_norms_, a.derivative_norms_, rtol=1e-9, atol=1e-12 * scale)
        for method in ("predict", "predict_penalized"):
            np.testing.assert_allclose(getattr(b, method)(units(xt)), getattr(a, method)(xt), rtol=1e-9,
                                       atol=1e-12 * scale)


def test_a_constant_input_is_centred_not_scaled_and_never_selected():
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (60, 3))
    y = np.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1] + 0.05 * rng.standard_normal(60)
    xt = rng.uniform(-2, 2, (10, 3))
    kw = dict(tau=0.03, mu=1e-3, gamma=1.0, refit_gamma=0.5, tol=1e-8, max_iter=20000, max_inner_iter=5000)
    without = DerivativeSelector(**kw).fit(x, y)
    # 5.0: the column's std is exactly 0; 0.1 has no exact binary form, so the column's mean is off by
    # round-off and its computed std is ~4e-17, not 0 -- it must still count as constant
    for value in (5.0, 0.1):
        with_const = DerivativeSelector(**kw).fit(np.insert(x, 1, value, axis=1), y)
        assert with_const.x_scale_[1] == 1.0 and with_const.converged_ and without.converged_
        assert with_const.derivative_norms_[1] == 0.0 and 1 not in with_const.selected_
        for attr in ("derivative_norms_", "relevance_", "dual_coef_", "derivative_coef_", "fitted_values_"):
            assert np.all(np.isfinite(getattr(with_const, attr))), attr
        # the constant column changes nothing: its differences are exactly 0, so the kernel, the data
        # term and the other inputs' derivatives are those of the fit without it (up to round-off;
        # only the inner step 1/‖L‖ could differ, through the column's own block of L)
        np.testing.assert_array_equal(with_const.selected_, [j + (j >= 1) for j in without.selected_])
        np.testing.assert_allclose(np.delete(with_const.derivative_norms_, 1), without.derivative_norms_,
                                   rtol=1e-9, atol=1e-12)
        for method in ("predict", "predict_penalized"):
            pred = getattr(with_const, method)(np.insert(xt, 1, value, axis=1))
            assert np.all(np.isfinite(pred))
            np.testing.assert_allclose(pred, getattr(without, method)(xt), rtol=1e-9, atol=1e-12)


def test_the_default_gamma_does_not_count_a_constant_input():
    """gamma=None meant 1/d with a constant column counted in d: adding one to three inputs narrowed
    the kernel from 1/3 to 1/4 and moved the relevances by 0.011 (Rosasco's f3, n = 60: 1/6 to
    1/7, 0.056), though the column is zeros once centred and the fit should not see it."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (60, 3))
    y = np.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1] + 0.05 * rng.standard_normal(60)
    kw = dict(tau=0.03, mu=1e-3, refit_gamma=0.5, tol=1e-8, max_iter=20000, max_inner_iter=5000)
    without = DerivativeSelector(**kw).fit(x, y)
    with_const = DerivativeSelector(**kw).fit(np.column_stack([x, np.full(60, 3.0)]), y)
    assert with_const.gamma_ == without.gamma_ == 1 / 3 and with_const.converged_ and without.converged_
    np.testing.assert_allclose(with_const.relevance_[:-1], without.relevance_, rtol=1e-9, atol=1e-12)
    assert with_const.relevance_[-1] == 0.0
    np.testing.assert_array_equal(with_const.selected_, without.selected_)


@pytest.mark.filterwarnings("ignore", category=ConvergenceWarning)
def test_penalized_predictions_need_no_array_of_queries_by_points_by_inputs():
    """predict_penalized formed the (m, n, d) differences of m queries and the n training points (541 MB
    and 5.7 s at m = 20,000, n = 300, d = 6); products with the (m, n) kernel matrix give the same f."""
    x, y, _ = make_rosasco("f2", 60, seed=0)
    model = DerivativeSelector(tau=0.05, gamma=0.6, refit=False, max_iter=200).fit(x, y)
    queries = np.random.default_rng(1).uniform(-3, 3, (4000, 6))
    tracemalloc.start()
    try:
        values = model.predict_penalized(queries)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    m_by_n = queries.shape[0] * 60 * 8
    assert peak < 5 * m_by_n  # a few (m, n) arrays; the (m, n, d) differences alone are 6 of them
    # f(x) = (1/n) Σₛ k(x, xₛ) [αₛ + 2γ Σⱼ βₛʲ (xʲ − xₛʲ)], summed directly at a few queries
    diff = model._standardise(queries[:5])[:, None, :] - model.x_train_[None]
    k = np.exp(-model.gamma_ * np.square(diff).sum(-1))
    direct = (k * (model.dual_coef_ + 2 * model.gamma_ * (diff * model.derivative_coef_).sum(-1))).mean(1)
    np.testing.assert_allclose(values[:5], direct + model.y_mean_, rtol=1e-12, atol=1e-12 * np.abs(y).max())
    # refit=False: predict is predict_penalized, bit for bit (on the same rows: a BLAS may round a
    # product of 5 rows otherwise than the same rows among 4000, as numpy 1.24's OpenBLAS does)
    np.testing.assert_array_equal(model.predict(queries[:5]), model.predict_penalized(queries[:5]))


def test_the_penalties_are_in_the_targets_units():
    """y is not standardised (documented): for s·y, s·τ, s²·threshold and s·tol give s·f and the same
    selection, while the settings for y select other inputs (none for y/1000; all six for 1000·y, not
    refitted here: 2700 iterations)."""
    x, y, _ = make_rosasco("f3", 60, seed=0)
    settings = dict(tau=1e-3, gamma=0.6, tol=1e-5, max_iter=20000)
    reference = DerivativeSelector(**settings).fit(x, y)
    assert reference.converged_ and reference.selected_.tolist() == [0, 4]
    assert len(DerivativeSelector(**settings).fit(x, y / 1000).selected_) == 0
    for s in (1e3, 1e-3):
        scaled = DerivativeSelector(**{**settings, "tau": s * 1e-3, "threshold": s * s * 1e-3, "tol": s * 1e-5})
        scaled.fit(x, s * y)
        np.testing.assert_array_equal(scaled.selected_, reference.selected_)
        # agreement to the stopping tolerance (the two runs stop at iterates ~1e-9 apart)
        np.testing.assert_allclose(scaled.derivative_norms_ / s, reference.derivative_norms_, rtol=0, atol=1e-8)
        np.testing.assert_allclose(scaled.predict(x) / s, reference.predict(x), rtol=1e-9, atol=1e-12)
