"""select_inputs(draws="exact"): input costs read on the RBF/ARD kernel the features approximate."""
import gpytorch
import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte.selection import evidence
from alacarte.selection.evidence import ClosedFormEvidence, select_inputs
from selection_cases import two_sines, two_sines_mean


def _fitted(n=150, seed=0, kernel_class=ac.FastfoodRBFKernel):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4))
    y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.standard_normal(n)
    kernel = kernel_class(4, 32, ard_num_dims=4, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=15, restarts=0, progress=False, seed=seed, validation_fraction=0)
    return model, kernel, x, y


def _exact_nll(model, kernel, gamma, rows=None):
    """The total negative log marginal likelihood under GPyTorch's RBF kernel with lengthscales 1/γ on the
    inputs in use, the model's σ_f², σ² and mean: the dense reference."""
    x, y = model.train_inputs[0].detach(), model.train_targets.detach()
    if rows is not None:
        x, y = x[rows], y[rows]
    used = torch.nonzero(gamma > 0).reshape(-1)
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=len(used)).double()
    rbf.lengthscale = 1 / gamma[used]
    with torch.no_grad():
        covariance = float(kernel.prior_variance()) * rbf(x[:, used]).to_dense()
        covariance += float(model.likelihood.noise) * torch.eye(len(y), dtype=torch.float64)
        mean = model.mean_module(x)
        return -float(torch.distributions.MultivariateNormal(mean, covariance).log_prob(y))


def test_closed_form_rises_are_the_dense_rbf_gps(single_thread):
    model, kernel, _, _ = _fitted()
    gamma = kernel.inverse_lengthscale().detach().reshape(-1).clone()
    assert float(gamma[0]) > 0 and float(gamma[1]) > 0
    judge = ClosedFormEvidence(model, kernel)
    base = _exact_nll(model, kernel, gamma)
    for j, value in [(0, 0.0), (1, 0.0), (3, 0.0), (2, 0.7), (0, 2 * float(gamma[0]))]:
        trial = gamma.clone()
        trial[j] = value
        assert judge.rise(j, value) == pytest.approx(_exact_nll(model, kernel, trial) - base, rel=1e-8, abs=1e-7)
    costs = judge.costs()
    assert costs[0] == pytest.approx(judge.rise(0, 0.0)) and float(costs[0]) > 20  # sin(2x₀) carries the signal


def test_closed_form_evidence_reads_a_seeded_subsample_beyond_its_rows(single_thread, monkeypatch):
    model, kernel, _, _ = _fitted(n=150)
    monkeypatch.setattr(evidence, "EXACT_ROWS", 100)
    judge = ClosedFormEvidence(model, kernel, seed=3)
    assert judge.x.shape[0] == 100
    assert torch.equal(ClosedFormEvidence(model, kernel, seed=3).x, judge.x)
    rows = [int(torch.nonzero((model.train_inputs[0] == row).all(-1))[0]) for row in judge.x]
    gamma = kernel.inverse_lengthscale().detach().reshape(-1).clone()
    trial = gamma.clone()
    trial[1] = 0.0
    expected = _exact_nll(model, kernel, trial, rows) - _exact_nll(model, kernel, gamma, rows)
    assert judge.rise(1, 0.0) == pytest.approx(expected, rel=1e-8, abs=1e-7)
    # rows given: read as they are, whatever EXACT_ROWS says
    given = ClosedFormEvidence(model, kernel, rows=torch.tensor(rows[:60]))
    expected = _exact_nll(model, kernel, trial, rows[:60]) - _exact_nll(model, kernel, gamma, rows[:60])
    assert given.x.shape[0] == 60 and given.rise(1, 0.0) == pytest.approx(expected, rel=1e-8, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_select_inputs_exact_keeps_exactly_the_inputs_the_function_uses(seed, single_thread):
    """y = sin(2x₀) + cos(2x₁), four unused inputs: select_inputs(draws="exact") leaves exactly {0, 1}."""
    rng = np.random.default_rng(seed)
    x, y = two_sines(rng, 400, 6)
    xt = rng.standard_normal((200, 6))
    yt = torch.as_tensor(two_sines_mean(xt))
    kernel = ac.FastfoodRBFKernel(6, 64, ard_num_dims=6, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=40, restarts=1, restart_iter=5, progress=False, seed=seed)
    result = select_inputs(model, x, y, refit_iter=20, draws="exact", seed=seed)
    assert result.selected.tolist() == [0, 1]
    assert float(result.costs[0]) > result.threshold and float(result.costs[1]) > result.threshold
    assert float(model.predict(xt, mean_only=True).mean.sub(yt).pow(2).mean()) < 0.05


def test_select_inputs_exact_brings_back_a_relevant_input_held_at_zero(single_thread):
    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 300, 4)
    kernel = ac.FastfoodRBFKernel(4, 64, ard_num_dims=4, simplex=True, seed=0).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=40, restarts=0, progress=False, seed=0, validation_fraction=0)
    kernel.drop_inputs_([1])
    result = select_inputs(model, x, y, refit_iter=20, draws="exact", seed=0, validation_fraction=0)
    assert result.selected.tolist() == [0, 1] and 1 in result.entered


def test_select_inputs_exact_refuses_a_kernel_without_an_rbf_limit(single_thread):
    assert ac.FastfoodRBFKernel.rbf_limit and ac.RandomFourierKernel.rbf_limit
    assert not (ac.FSARDKernel.rbf_limit or ac.FSGBARDKernel.rbf_limit)
    model, _, x, y = _fitted(kernel_class=ac.FSARDKernel)
    with pytest.raises(ValueError, match="RBF/ARD"):
        select_inputs(model, x, y, draws="exact")
