"""Repeated training inputs: the per-input term against a dense GP with that term, and its plumbing
through the estimator, its files and the command line."""
import numpy as np
import pytest
import torch

from alacarte import AlaCarteRegressor
from alacarte.cli import main
from alacarte.io import load_model, save_model
from alacarte.replicates import FLOOR, Replicates

SMALL = dict(num_samples=16, num_components=2, max_iter=10, restarts=1, restart_iter=3, num_draws=1)


def one_repeated_input(m=4, n=50, seed=0):
    """n distinct inputs with noisy targets, the first measured m times (its targets 0.05 apart:
    a term of its own plus a small noise); and that input."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.3 * rng.normal(size=n)
    return np.vstack([x, np.repeat(x[:1], m - 1, axis=0)]), np.r_[y, y[0] + 0.05 * rng.normal(size=m - 1)], x[:1]


def dense_truth(model, x, y, x_star, s, sigma2):
    """Mean and variance of f(x*) + h(x*) under y = f + h + ε, with f the fitted model's GP prior,
    h ~ N(0, s) per distinct input and ε ~ N(0, σ²) per row: the n×n Gaussian, in target units."""
    scale, offset = float(model.target_scale), float(model.target_offset)
    internal = model.internal_inputs(torch.as_tensor(np.vstack([x, x_star]))).detach()
    with torch.no_grad():
        k = model.covar_module(internal, internal).to_dense().numpy() * scale**2
    same = (x[:, None, :] == np.vstack([x, x_star])[None, :, :]).all(-1)  # (n, n + 1): rows at one input
    cov = k[:-1, :-1] + s * same[:, :-1] + sigma2 * np.eye(len(y))
    cross = k[-1, :-1] + s * same[:, -1]
    mean = offset + scale * float(model.mean_module.constant.detach())
    solve = np.linalg.solve(cov, np.column_stack([y - mean, cross]))
    return mean + cross @ solve[:, 0], k[-1, -1] + s - cross @ solve[:, 1]


def dense_leave_one_out(model, x, y, rows, s, sigma2):
    """Mean NLPD of ``rows``, each predicted from all other rows by the n×n Gaussian above."""
    scale, offset = float(model.target_scale), float(model.target_offset)
    internal = model.internal_inputs(torch.as_tensor(x)).detach()
    with torch.no_grad():
        k = model.covar_module(internal, internal).to_dense().numpy() * scale**2
    cov = k + s * (x[:, None, :] == x[None, :, :]).all(-1) + sigma2 * np.eye(len(y))
    r = y - offset - scale * float(model.mean_module.constant.detach())
    total = 0.0
    for i in rows:
        keep = np.arange(len(y)) != i
        weights = np.linalg.solve(cov[np.ix_(keep, keep)], cov[keep, i])
        mean, var = weights @ r[keep], cov[i, i] - weights @ cov[keep, i]
        total += 0.5 * (np.log(2 * np.pi * var) + (r[i] - mean) ** 2 / var)
    return total / len(rows)


@pytest.mark.parametrize("name", ["gm", "exact-ard"])
def test_prediction_at_a_repeated_input_is_the_dense_gp_with_a_term_per_input(name):
    """With one input repeated the per-input term is exact: the fitted model's kernel and noise ν = s + σ²
    against the n×n Gaussian with s·1[x = x′] added; σ² is where that Gaussian's leave-one-out
    predictive of the repeated rows is best."""
    x, y, x_star = one_repeated_input()
    reg = AlaCarteRegressor(name, **SMALL, validation_fraction=0).fit(x, y)
    assert reg.replicates_.counts.tolist() == [4] + [1] * 49
    nu = float(reg.model_.likelihood.noise.detach()) * float(reg.model_.target_scale) ** 2
    sigma2 = reg.replicate_shares_[0] * nu
    assert sigma2 < 0.5 * nu  # the four rows agree more than the others scatter: a term of their own
    mean, std = reg.predict(x_star, return_std=True)
    _, latent = reg.predict(x_star, return_std=True, include_noise=False)
    expected_mean, expected_var = dense_truth(reg.model_, x, y, x_star, nu - sigma2, sigma2)
    assert mean[0] == pytest.approx(expected_mean, rel=1e-8)
    assert latent[0] ** 2 == pytest.approx(expected_var, rel=1e-7)
    assert std[0] ** 2 == pytest.approx(expected_var + sigma2, rel=1e-7)
    rows = [0, 50, 51, 52]
    best = dense_leave_one_out(reg.model_, x, y, rows, nu - sigma2, sigma2)
    for other in np.geomspace(1e-4 * np.var(y), nu, 25):
        assert best <= dense_leave_one_out(reg.model_, x, y, rows, nu - other, other) + 1e-6
    # ... and the model alone, which treats the four rows as four independent observations of f, differs.
    alone = AlaCarteRegressor(name, **SMALL, validation_fraction=0, replicates=False).fit(x, y)
    assert abs(alone.predict(x_star, return_std=True)[1][0] - std[0]) > 0.01 * std[0]


def test_repeats_that_scatter_as_much_as_new_inputs_leave_the_model_as_it_is():
    """Repeated rows spread far more widely than the function's noise elsewhere: no term of their own
    (σ² = ν), and every prediction is the fitted model's."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, size=(60, 2))
    y = np.sin(2 * x[:, 0]) + 0.05 * rng.normal(size=60)
    x, y = np.vstack([x, x[:10]]), np.r_[y, y[:10] + rng.normal(size=10)]
    on = AlaCarteRegressor("gm", **SMALL).fit(x, y)
    off = AlaCarteRegressor("gm", **SMALL, replicates=False).fit(x, y)
    assert on.replicate_shares_ == [1.0]
    a, b = on.predict(x, return_std=True), off.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_distinct_inputs_their_counts_and_means_and_none_without_repeats():
    x = np.array([[0.0, 1.0], [-0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0], [5.0, 5.0]])
    y = np.array([1.0, 2.0, 3.0, 10.0, 12.0, 0.0])
    reps = Replicates.of(x, y)
    assert reps.counts.tolist() == [3, 2, 1] and reps.means.tolist() == [2.0, 11.0, 0.0]
    assert reps.match(np.array([[2.0, 3.0], [0.0, 1.0], [0.5, 1.0]])).tolist() == [1, 0, -1]
    assert Replicates.of(x[2:], y[2:]).counts.tolist() == [1, 2, 1]
    assert Replicates.of(x[[0, 3, 5]], y[[0, 3, 5]]) is None
    with pytest.raises(ValueError, match="finite"):
        Replicates.of(x, np.r_[y[:-1], np.nan])


def copied_records(seed=1):
    """Records of which a quarter are copied once (the same input and target), as in wine."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(80, 3))
    y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.3 * rng.normal(size=80)
    return np.vstack([x, x[:20]]), np.r_[y, y[:20]]


def test_copied_records_are_predicted_at_their_target_and_new_inputs_as_before():
    x, y = copied_records()
    on = AlaCarteRegressor("fsard", **SMALL).fit(x, y)
    off = AlaCarteRegressor("fsard", **SMALL, replicates=False).fit(x, y)
    x_new = np.random.default_rng(2).uniform(-2, 2, size=(7, 3))
    queries = np.vstack([x[:30], x_new])
    mean, std = on.predict(queries, return_std=True)
    mean_off, std_off = off.predict(queries, return_std=True)
    # The copies agree exactly: σ² at its floor, so the repeated inputs' own target is the prediction.
    floor = FLOOR * np.var(y)
    nu = float(on.model_.likelihood.noise.detach()) * float(on.model_.target_scale) ** 2
    assert on.replicate_shares_[0] * nu == pytest.approx(floor, rel=0.05)
    assert np.allclose(mean[:20], y[:20], atol=1e-3 * np.std(y))
    assert np.allclose(std[:20] ** 2, floor * 1.5, rtol=0.05)  # σ²(1 + 1/m), m = 2
    # Inputs seen once are pulled towards their one target too (s ≫ σ²), new inputs are untouched.
    assert np.all(np.abs(mean[20:30] - y[20:30]) < np.abs(mean_off[20:30] - y[20:30]))
    assert np.array_equal(mean[30:], mean_off[30:]) and np.array_equal(std[30:], std_off[30:])
    assert np.allclose(on.predict(queries), mean, rtol=1e-12, atol=1e-14)  # the mean alone is the same mean
    # return_cov: the same mean and variances, a positive semi-definite matrix.
    cov_mean, cov = on.predict(queries, return_cov=True)
    assert np.allclose(cov_mean, mean, rtol=1e-12) and np.allclose(np.diag(cov), std**2, rtol=1e-8)
    assert np.linalg.eigvalsh(cov).min() > -1e-12 * np.diag(cov).max()


def test_no_repeated_input_changes_nothing():
    x, y = copied_records()
    x, y = x[:80], y[:80]
    on = AlaCarteRegressor("gm", **SMALL).fit(x, y)
    off = AlaCarteRegressor("gm", **SMALL, replicates=False).fit(x, y)
    assert on.replicates_ is None and off.replicates_ is None
    a, b = on.predict(x, return_std=True), off.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="replicates"):
        AlaCarteRegressor("gm", **SMALL, replicates="yes").fit(x, y)


def test_a_file_reloads_the_replicates_and_predicts_bit_identically(tmp_path):
    x, y = copied_records()
    reg = AlaCarteRegressor("gm", **SMALL).fit(x, y)
    same = load_model(save_model(reg, tmp_path / "r.alacarte"))
    assert torch.equal(same.replicates_.inputs, reg.replicates_.inputs)
    assert same.replicate_shares_ == reg.replicate_shares_
    a, b = reg.predict(x[:30], return_std=True), same.predict(x[:30], return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    off = AlaCarteRegressor("gm", **SMALL, replicates=False).fit(x, y)
    assert load_model(save_model(off, tmp_path / "o.alacarte")).replicates_ is None


def test_the_command_line_fits_with_replicates_unless_told_not_to(tmp_path, capsys):
    x, y = copied_records()
    data = tmp_path / "data.csv"
    np.savetxt(data, np.column_stack([x, y]), delimiter=",", header="a,b,c,y", comments="")
    small = ["--num-samples", "16", "--num-components", "2", "--max-iter", "5", "--restarts", "0",
             "--num-draws", "1", "-q", "--target", "y"]
    assert main(["fit", str(data), "--out", str(tmp_path / "on.alacarte"), *small]) == 0
    assert main(["fit", str(data), "--out", str(tmp_path / "off.alacarte"), "--no-replicates", *small]) == 0
    on, off = load_model(tmp_path / "on.alacarte"), load_model(tmp_path / "off.alacarte")
    assert on.replicates and on.replicates_ is not None
    assert not off.replicates and off.replicates_ is None


@pytest.mark.parametrize("field, value, message", [
    ("shares", [1.5], r"replicates_\.shares\[0\]: expected a number in \(0, 1\]"),
    ("shares", [0.5, 0.5], r"replicates_\.shares: expected one per draw \(1\)"),
    ("counts", torch.zeros(1, dtype=torch.int64), r"replicates_\.counts: expected shape"),
    ("inputs", torch.zeros(3, 2, dtype=torch.float64), r"replicates_\.inputs: expected shape \(G, 3\)"),
])
def test_a_crafted_replicates_record_is_refused(field, value, message):
    from alacarte.io import _build_regressor, _regressor_record

    x, y = copied_records()
    record = _regressor_record(AlaCarteRegressor("gm", **SMALL).fit(x, y))
    record["fitted"]["replicates_"][field] = value
    with pytest.raises(ValueError, match=message):
        _build_regressor(record)
