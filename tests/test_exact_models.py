"""ExactRBFGP: test rows that do not couple through round-off, chunks that bound the test-by-test block,
agreement with GPyTorch."""
import copy
import warnings
from unittest import mock

import gpytorch
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import alacarte
from alacarte import ExactRBFGP, FeatureGP, fit

from model_cases import toy_data


@pytest.mark.parametrize("ard", [True, False])
def test_exact_predictions_of_a_row_do_not_depend_on_the_other_test_rows(ard):
    """GPyTorch expands squared distances about the test chunk's mean: a row at 1e8 beside
    [0.5, 0.5, 0.5] moved that row's mean by 0.89 (1e10: by 8.7). Each row must stand alone, and a
    row far from the data gets the prior mean."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    good = torch.tensor([[0.5, 0.5, 0.5], [0.1, -0.2, 0.3]], dtype=torch.float64)
    alone = model.predict(good)
    for far in (1e4, 1e8, 1e10, 1e100):
        pred = model.predict(torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good]))
        torch.testing.assert_close(pred.mean[1:], alone.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(pred.variance[1:], alone.variance, rtol=0, atol=1e-12)
        if far >= 1e8:
            prior_mean = model.mean_module.constant.detach() * model.target_scale + model.target_offset
            torch.testing.assert_close(pred.mean[0], prior_mean.reshape(()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_exact_posterior_covariance_of_test_rows_does_not_depend_on_the_other_rows(ard):
    """The test–test block (return_cov, sample_y) must not expand ‖a − b‖² either: beside a row at 1e8,
    the covariance of two rows near the data would go from 0.00108 to −0.0141 (their draws' correlation
    from 0.98 to −0.06)."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    model.eval()

    def covariance(q):
        with torch.no_grad(), model.inference_settings(), gpytorch.settings.debug(False):
            return model(model.internal_query_inputs(q)).covariance_matrix

    good = torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.6, 0.5]], dtype=torch.float64)
    alone = covariance(good)
    for far in (1e4, 1e8, 1e100):
        cov = covariance(torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good]))
        torch.testing.assert_close(cov[1:, 1:], alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(cov[0, 1:], torch.zeros(2, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_the_joint_test_by_train_and_test_block_older_gpytorch_asks_for_is_centred_on_the_training_rows(ard):
    """GPyTorch up to 1.15.1 evaluates k(test, [train; test]) in one call, not the two blocks 1.15.2
    asks for; centring it on all its rows would take the test rows in again, so that with GPyTorch 1.11
    a row at 1e8 would move two nearby rows' covariance by 1e-5 and a row at 1.7e308 make the others NaN.
    Called here directly, so that it is checked whichever GPyTorch is installed."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    kernel = model.covar_module.base_kernel.eval()
    train = model.train_inputs[0]
    good = model.internal_query_inputs(torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.6, 0.5]], dtype=torch.float64))
    with torch.no_grad():
        expected = torch.cat([kernel(good, train).to_dense(), kernel(good, good).to_dense()], dim=-1)
        for far in (1e8, 1.7e308):
            test = torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good])
            joint = kernel(test, torch.cat([train, test])).to_dense()
            torch.testing.assert_close(joint[1:, :-3], expected[:, :-2], rtol=0, atol=1e-15)
            torch.testing.assert_close(joint[1:, -2:], expected[:, -2:], rtol=0, atol=1e-15)
            if far == 1e8:  # (at 1.7e308 the row's own distances overflow: predict refuses it)
                assert (joint[0, :-3] == 0).all() and joint[0, -3] == 1


class _LargestTensor(TorchDispatchMode):
    """Records the most numbers any one tensor produced by a torch operation held."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numel = max([self.numel] + [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
        return out


def test_exact_prediction_chunks_bound_the_test_by_test_block():
    """GPyTorch evaluates each chunk's test–test covariance (rows × rows), even for the mean; the chunk
    rows counted only the rows × n cross-covariance (32 MiB / 8n rows): with n = 200 training rows, a
    prediction at 20 000 points formed a 20 000 × 20 000 block (peak RSS +6.1 GB)."""
    x, y = toy_data(n=50)
    model = ExactRBFGP(None, None, num_dims=3).double()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    x_test = toy_data(n=3000, seed=3)[0]
    budget = 8 * 50 * 1000  # bytes: 1000 rows of the cross-covariance alone
    whole = model.predict(x_test)
    with mock.patch.object(model, "memory_budget", budget):
        for mean_only in (True, False):
            with _LargestTensor() as largest:
                chunked = model.predict(x_test, mean_only=mean_only)
            assert largest.numel <= budget // 8
            torch.testing.assert_close(chunked.mean, whole.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.variance, whole.variance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_exact_kernel_in_eval_mode_keeps_gpytorchs_last_dim_is_batch_blocks(ard):
    """k(x, x, last_dim_is_batch=True) is one block per input dimension, in eval mode too, where the
    kernel's exact-difference path gives one (n, n) block (GPyTorch: 'expected shape ... (3, 5, 5)')."""
    kernel = ExactRBFGP(None, None, num_dims=3, ard=ard).double().covar_module.base_kernel
    kernel.lengthscale = torch.tensor([0.7, 1.3, 2.0] if ard else [1.1], dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scaled = (x / kernel.lengthscale).T.unsqueeze(-1)  # (3, 5, 1): one input dimension per block
    expected = (-(scaled - scaled.transpose(-2, -1)).square() / 2).exp()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        for training in (True, False):
            kernel.train(training)
            torch.testing.assert_close(kernel(x, x, last_dim_is_batch=True).to_dense(), expected)


def test_exact_baseline_same_api_and_agrees_with_gpytorch():
    x, y = toy_data(n=120)
    model = ExactRBFGP(None, None, num_dims=3, ard=True).double()
    history = fit(model, x, y, max_iter=30, progress=False)
    assert history.loss[-1] < history.loss[0]
    pred = model.predict(x[:15], chunk_size=4)
    # The same posterior, computed densely by hand from GPyTorch's fitted kernel.
    xs = model.internal_inputs(x)
    ys = model.train_targets
    with torch.no_grad():
        k = model.covar_module(xs).to_dense()
        noise = model.likelihood.noise
        k_star = k[:15]
        mean = model.mean_module.constant + k_star @ torch.linalg.solve(k + noise * torch.eye(120, dtype=x.dtype), ys - model.mean_module.constant)
        var = k.diagonal()[:15] - (k_star * torch.linalg.solve(k + noise * torch.eye(120, dtype=x.dtype), k_star.T).T).sum(-1)
    assert torch.allclose(pred.mean, mean * y.std() + y.mean(), rtol=1e-8)
    assert torch.allclose(pred.variance, var * y.var(), rtol=1e-6, atol=1e-10)


def test_feature_gp_with_exact_hyperparameters_approaches_exact_gp():
    """Given the exact ARD GP's fitted hyperparameters, the Fastfood GP's predictions
    approach the exact GP's as M grows (the kernel converges, so does the posterior)."""
    x, y = toy_data(n=150)
    exact = ExactRBFGP(None, None, num_dims=3, ard=True).double()
    fit(exact, x, y, max_iter=50, restarts=0, progress=False)
    x_test = toy_data(n=100, seed=1)[0]
    reference = exact.predict(x_test)
    errors = []
    for m in (256, 4096):
        approx = FeatureGP(None, None, alacarte.FastfoodRBFKernel(3, m, ard_num_dims=3, seed=0)).double()
        approx.load_state_dict(exact.state_dict(), strict=False)  # mean, noise, standardisation
        approx.covar_module.lengthscale = exact.covar_module.base_kernel.lengthscale.detach()
        approx.covar_module.outputscale = exact.covar_module.outputscale.detach()
        approx.set_train_data(*exact.train_inputs, exact.train_targets, strict=False)
        approx.eval()
        errors.append((approx.predict(x_test).mean - reference.mean).abs().max().item())
    # (the fitted noise is small, 0.2% of the target's variance, so the mean is sensitive to the kernel)
    assert errors[1] < 0.03 * y.std() and errors[1] < errors[0] / 2, errors


def test_an_exact_gp_that_predicted_changes_dtype_like_one_that_never_did():
    """GPyTorch keeps an ExactGP's prediction cache through .double()/.float(); ours drops it."""
    x, y = toy_data(n=60)
    x_test = toy_data(n=10, seed=2)[0]
    fitted = ExactRBFGP(None, None, num_dims=3, ard=True)  # float32, GPyTorch's default
    fit(fitted, x.float(), y.float(), max_iter=3, restarts=0, progress=False)
    never_queried = copy.deepcopy(fitted).double()
    fitted.predict(x_test)  # caches the float32 prediction strategy
    a, b = fitted.double().predict(x_test), never_queried.predict(x_test)
    assert a.mean.dtype == torch.float64
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert torch.equal(fitted.float().predict(x_test).mean, never_queried.float().predict(x_test).mean)
