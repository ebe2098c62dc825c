"""The posterior of a fitted model: its cache, draws, priors, eval-mode GPyTorch behaviour, fantasies."""
import copy
from unittest import mock

import gpytorch
import pytest
import torch

import alacarte
from alacarte import ExactRBFGP, FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood, fit

from model_cases import toy_data, feature_model, with_value


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_state_dict_reload_gives_bit_identical_predictions(make, tmp_path):
    x, y = toy_data(n=80)
    model = make()
    fit(model, x, y, max_iter=10, progress=False)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = make()
    fresh.load_state_dict(torch.load(path))
    fresh.set_train_data(*model.train_inputs, model.train_targets, strict=False)
    fresh.eval()
    x_test = toy_data(n=30, seed=2)[0]
    a, b = model.predict(x_test), fresh.predict(x_test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


def test_posterior_is_factorised_once_across_predict_calls():
    x, y = toy_data(n=80)
    model = feature_model()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    with mock.patch("alacarte.models.WoodburyPosterior", wraps=alacarte.models.WoodburyPosterior) as built:
        for _ in range(3):
            model.predict(x[:10])
        model(x[:5]).variance
    assert built.call_count == 1
    model.train()
    model.eval()
    with mock.patch("alacarte.models.WoodburyPosterior", wraps=alacarte.models.WoodburyPosterior) as built:
        model.predict(x[:10])
    assert built.call_count == 1  # training mode invalidated the cache
    with pytest.raises(ValueError, match="chunk_size"):
        model.predict(x[:10], chunk_size=0)


def test_posterior_function_samples_match_the_predictive_moments():
    x, y = toy_data(n=100)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=10, restarts=0, progress=False)
    x_test = toy_data(n=6, seed=3)[0]
    draws = model.sample_functions(40000, seed=1)
    values = draws(x_test)  # (k, m), original units
    assert values.shape == (40000, 6)
    pred = model.predict(x_test)
    with torch.no_grad():
        latent_cov = model(model.internal_inputs(x_test)).covariance_matrix * model.target_scale**2
    sd = pred.variance.sqrt()
    assert ((values.mean(0) - pred.mean).abs() < 5 * sd / 200).all()  # 5 standard errors, k = 40000
    empirical = torch.cov(values.T)
    assert torch.allclose(empirical, latent_cov, rtol=0.05, atol=0.05 * sd.max().item() ** 2)
    again = model.sample_functions(40000, seed=1)(x_test)
    assert torch.equal(values, again)
    with pytest.raises(ValueError, match="num_samples"):
        model.sample_functions(0)
    for seed in (-1, 1.5, 2**70):
        with pytest.raises(ValueError, match=r"seed must be None or an integer in \[0, 2\*\*64\)"):
            model.sample_functions(2, seed=seed)


def test_priors_on_our_constrained_parameters_enter_the_likelihood_and_survive_pickling():
    """outputscale_prior= registers through the shared helper: its log density (at the
    constrained value) is added to the marginal likelihood, and the kernel still pickles."""
    import pickle

    torch.manual_seed(0)
    x, y = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, dtype=torch.float64)
    prior = gpytorch.priors.GammaPrior(2.0, 3.0)
    for num_samples in (16, 32):  # D = 32 < n = 40 (statistics path), D = 64 > n (n×n path)
        with_prior = FeatureGP(x, y, FSARDKernel(3, num_samples, ard_num_dims=3, seed=0,
                                                 outputscale_prior=prior)).double()
        plain = FeatureGP(x, y, FSARDKernel(3, num_samples, ard_num_dims=3, seed=0)).double()
        plain.load_state_dict(with_prior.state_dict(), strict=False)  # (the prior has buffers)
        kernel = with_prior.covar_module
        kernel.outputscale = 0.7
        plain.covar_module.outputscale = 0.7
        losses = []
        for model in (with_prior, plain):
            model.train()
            mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
            losses.append(float(mll(model(x), y).detach()))
        expected = float(prior.log_prob(torch.tensor(0.7, dtype=torch.float64))) / len(y)  # (the prior in float64)
        assert losses[0] - losses[1] == pytest.approx(expected, rel=1e-10)
    assert isinstance(kernel.outputscale_prior, gpytorch.priors.GammaPrior)
    clone = pickle.loads(pickle.dumps(kernel))
    assert torch.equal(clone.outputscale, kernel.outputscale)


def test_woodbury_likelihood_refuses_a_target_that_does_not_match_the_prior():
    """GPyTorch's exact likelihood broadcasts an (n, 1) target into an n-batch of losses and
    fails inside a subtraction on a wrong length; ours says what the target must be."""
    x, y = toy_data(n=40)
    model = FeatureGP(x, y, FSARDKernel(3, 8, ard_num_dims=3, seed=0)).double().train()
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    prior = model(x)
    for bad in (y[:-1], y[:, None]):
        with pytest.raises(ValueError, match=r"target must have shape \(\*batch, n\) with n = 40"):
            mll(prior, bad)
    with pytest.raises(ValueError, match="non-finite"):
        mll(prior, with_value(y.clone(), 3, float("nan")))
    torch.testing.assert_close(mll(prior, torch.stack([y, y]))[1], mll(prior, y))  # batches of targets still work


def test_woodbury_likelihood_refuses_a_target_batch_that_does_not_broadcast():
    """A batch-(2,) model given targets (3, n) is a ValueError that names them, not torch's 'Attempting to
    broadcast a dimension of length 3' from inside the statistics (GPyTorch's: 'LinearOperator cannot be
    multiplied')."""
    x, y = toy_data(n=30)
    kernel = FSARDKernel(3, 8, seed=0, batch_shape=torch.Size([2]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([2]))
    model = FeatureGP(x, y, kernel, likelihood).double().train()
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    prior = model(x)
    with pytest.raises(ValueError, match=r"a batch that broadcasts with the prior's \(2,\), got \(3, 30\)"):
        mll(prior, torch.stack([y, y, y]))
    assert mll(prior, torch.stack([y, -y])).shape == (2,)


def test_a_cached_posterior_follows_load_state_dict_and_dtype_changes():
    """The posterior cached in eval mode belongs to the parameters and dtype it was computed with
    (GPyTorch's own models drop their caches on load_state_dict and convert them with .to())."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=20, seed=2)[0]
    fitted, other = feature_model(), feature_model()
    fit(fitted, x, y, max_iter=10, restarts=0, progress=False)
    fit(other, x, y + 5 * x[:, 2], max_iter=10, restarts=0, progress=False)
    expected = fitted.predict(x_test)
    other.predict(x_test)  # caches other's posterior
    other.load_state_dict(fitted.state_dict())
    other.set_train_data(*fitted.train_inputs, fitted.train_targets, strict=False)
    got = other.predict(x_test)
    assert torch.equal(got.mean, expected.mean) and torch.equal(got.variance, expected.variance)

    # .float() after predicting: as a model converted before it ever predicted
    never_queried = copy.deepcopy(fitted).float()
    converted = copy.deepcopy(fitted)
    converted.predict(x_test)
    converted.float()
    a, b = converted.predict(x_test.float()), never_queried.predict(x_test.float())
    assert a.mean.dtype == torch.float32 and converted.posterior().cholesky.dtype == torch.float32
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)

    # a streamed posterior has no rows to be recomputed from: it moves with the model,
    # and parameters loaded into the model drop it
    streamed = copy.deepcopy(fitted)
    streamed.cache_posterior(x, y)
    streamed.float()
    assert streamed.posterior().cholesky.dtype == torch.float32
    torch.testing.assert_close(streamed.predict(x_test).mean, expected.mean.float(), rtol=1e-4, atol=1e-3)
    streamed.load_state_dict(fitted.float().state_dict())
    with pytest.raises(ValueError, match="no training data"):
        streamed.predict(x_test)


def test_a_batched_feature_gp_predicts_each_batch_with_its_own_noise():
    x, y = toy_data(n=40)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([3]))
    kernel = FSARDKernel(3, 16, ard_num_dims=3, seed=0, batch_shape=torch.Size([3]))
    model = FeatureGP(x, y, kernel, likelihood).double()
    model.likelihood.noise = torch.tensor([[0.01], [0.1], [1.0]])
    model.eval()
    x_test = toy_data(n=3, seed=2)[0]  # as many test points as batches: a wrong axis broadcasts silently
    whole = model.predict(x_test)
    chunked = model.predict(x_test, chunk_size=2)
    assert whole.mean.shape == whole.variance.shape == (3, 3)
    torch.testing.assert_close(chunked.mean, whole.mean)  # equal up to the triangular solves' blocking
    torch.testing.assert_close(chunked.variance, whole.variance)
    with torch.no_grad():
        reference = model.likelihood(model(x_test)).variance  # GPyTorch's, internal = original units here
    torch.testing.assert_close(whole.observed_variance, reference)
    torch.testing.assert_close(whole.observed_variance - whole.variance,
                               torch.tensor([0.01, 0.1, 1.0], dtype=torch.float64)[:, None].expand(3, 3))
    assert model.sample_functions(5, seed=0)(x_test).shape == (3, 5, 3)


def test_a_feature_gp_refuses_a_kernel_with_active_dims():
    kernel = FSARDKernel(2, 16, ard_num_dims=2, active_dims=[1, 0], seed=0)
    with pytest.raises(ValueError, match="select the columns in the data instead"):
        FeatureGP(None, None, kernel)


@pytest.mark.parametrize("kind", ["feature", "exact"])
def test_predictions_follow_hyperparameters_changed_in_eval_mode(kind):
    """A posterior cached by one predict() belongs to the parameters it was computed from: setting
    the noise, a lengthscale or the constant mean afterwards (no .train() in between) gives the
    predictions of a model that never predicted with the old values, not the cached ones."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=20, seed=2)[0]
    model = feature_model() if kind == "feature" else ExactRBFGP(None, None, num_dims=3, ard=True).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    changes = [
        lambda m: setattr(m.likelihood, "noise", m.likelihood.noise * 3),
        lambda m: setattr(_lengthscaled(m), "lengthscale", _lengthscaled(m).lengthscale * 1.7),
        lambda m: m.mean_module.constant.data.add_(0.5),  # in place, through .data
    ]
    for change in changes:
        model.predict(x_test)  # caches the posterior
        fresh = copy.deepcopy(model)
        fresh.train()  # drops the copy's cache
        fresh.eval()
        with torch.no_grad():
            change(model)
            change(fresh)
        got, expected = model.predict(x_test), fresh.predict(x_test)
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(got.variance, expected.variance, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            torch.testing.assert_close(model(x_test).mean, fresh(x_test).mean, rtol=1e-12, atol=1e-10)


def _lengthscaled(model):
    kernel = model.covar_module
    return kernel if isinstance(model, FeatureGP) else kernel.base_kernel


def test_prior_mode_gives_the_prior_in_eval_mode_as_in_gpytorch():
    """model(x) under gpytorch.settings.prior_mode is the prior, as for any ExactGP (and ExactRBFGP),
    although FeatureGP's eval-mode __call__ has a path of its own."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=10, seed=2)[0]
    for model in (feature_model(), ExactRBFGP(None, None, num_dims=3, ard=True).double()):
        fit(model, x, y, max_iter=3, restarts=0, progress=False)
        model.eval()
        inner = model.internal_inputs(x_test)
        with torch.no_grad():
            model(inner)  # a cached posterior must not leak into prior mode either
            with gpytorch.settings.prior_mode(True):
                got = model(inner)
            expected = model.forward(inner)
            torch.testing.assert_close(got.mean, expected.mean)
            torch.testing.assert_close(got.covariance_matrix, expected.covariance_matrix)
            assert model(inner).variance.max() < 0.5 * expected.variance.min()  # and the posterior after it


def test_eval_mode_gradients_wrt_test_inputs_work_on_every_call():
    """Optimising over test inputs (an acquisition function) calls model(x) and backward() repeatedly.
    A posterior cached with the autograd graph of the first call would make the second
    backward() fail ('Trying to backward through the graph a second time'); as GPyTorch's
    ExactGP detaches its test caches (gpytorch.settings.detach_test_caches, on by default), so does FeatureGP."""
    x, y = toy_data(n=80)
    model = feature_model()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    model.eval()
    x_test = model.internal_inputs(toy_data(n=5, seed=2)[0]).clone().requires_grad_(True)
    grads = []
    for _ in range(2):
        x_test.grad = None
        model(x_test).mean.sum().backward()
        grads.append(x_test.grad.clone())
    assert torch.equal(grads[0], grads[1])
    eps = 1e-6
    with torch.no_grad():
        shifted = [model(x_test + eps * e).mean - model(x_test - eps * e).mean for e in torch.eye(3, dtype=x.dtype)]
    torch.testing.assert_close(grads[0], torch.stack(shifted, -1) / (2 * eps), rtol=1e-6, atol=1e-8)
    model(x_test).variance.sum().backward()  # the variance too


def test_function_samples_stay_the_functions_drawn():
    """Draws are weights w for the features φ they were drawn with: a FunctionSamples evaluating
    φ_new(x)ᵀw with whatever kernel the model has at call time would, after the model's lengthscales
    change (a refit, a setter), give functions of neither posterior."""
    x, y = toy_data(n=100)
    x_test = toy_data(n=20, seed=2)[0]
    model = feature_model(m=16)
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    draws = model.sample_functions(8, seed=0)
    before = draws(x_test)
    with torch.no_grad():
        model.covar_module.lengthscale = model.covar_module.lengthscale * 3
        model.mean_module.constant.add_(1.0)
    model.set_standardization(model.input_offset + 1, model.input_scale * 2, model.target_offset + 5,
                              model.target_scale * 2)
    assert torch.equal(draws(x_test), before)


def test_get_fantasy_model_conditions_on_the_added_rows_as_gpytorch_does():
    """GPyTorch's get_fantasy_model raises "Call the model on some data first!" for a FeatureGP even after
    model(x) (its eval path keeps no GPyTorch prediction cache).  The fantasy must predict what a
    plain GPyTorch ExactGP with the same kernel predicts after its own get_fantasy_model, for one
    fantasy and a batch of f = 3, and leave the model itself alone."""

    class PlainGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood, kernel):
            super().__init__(x, y, likelihood)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), kernel

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    gen = torch.Generator().manual_seed(0)
    x, x_new, x_test = (torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (40, 5, 7))
    y, y_new = torch.sin(x.sum(-1)), torch.randn(3, 5, generator=gen, dtype=torch.float64)
    model = FeatureGP(x, y, FSARDKernel(3, 16, ard_num_dims=3, seed=0)).double()
    with torch.no_grad():
        model.likelihood.noise = torch.tensor(0.05, dtype=torch.float64)
        model.mean_module.constant.fill_(0.3)
    plain = PlainGP(x, y, copy.deepcopy(model.likelihood), copy.deepcopy(model.covar_module)).double()
    plain.mean_module.load_state_dict(model.mean_module.state_dict())
    model.eval()
    plain.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**6):
        before = model(x_test).mean
        plain(x_test)  # GPyTorch needs its cache first
        for targets in (y_new[0], y_new):
            got = model.get_fantasy_model(x_new, targets)(x_test)
            expected = plain.get_fantasy_model(x_new, targets)(x_test)
            torch.testing.assert_close(got.mean, expected.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(got.variance, expected.variance, rtol=0, atol=1e-12)
        torch.testing.assert_close(model(x_test).mean, before, rtol=0, atol=0)
    assert model.train_inputs[0].shape == (40, 3)
    with pytest.raises(ValueError, match="targets"):
        model.get_fantasy_model(x_new, y_new[0, :4])
    with pytest.raises(ValueError, match="non-finite"):
        model.get_fantasy_model(x_new, y_new[0].clone().fill_(float("nan")))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_feature_gp_without_training_rows_has_the_prior_posterior(training):
    """The statistics are summed over chunks of rows, and a model given no rows has none to sum: the sum
    must still be the prior's (weights 0, A = σ²I), as one product over no rows gives, not TypeError
    'reduce() of empty iterable' in eval mode nor ValueError 'range() arg 3 must not be zero' in training."""
    x, y = toy_data(n=50)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    (inputs,) = model.train_inputs
    model.set_train_data(inputs[:0], model.train_targets[:0], strict=False)
    model.train(training)
    posterior = model.posterior()
    assert torch.equal(posterior.weights, torch.zeros_like(posterior.weights))
    noise = model.likelihood.noise.detach().squeeze()
    torch.testing.assert_close(posterior.cholesky, noise.sqrt() * torch.eye(32, dtype=noise.dtype))


def _at_true_kernel(seed: int, outputscale: float):
    """Fastfood ARD (D = 1 024) at the true kernel of tests/test_calibration.py's draw (ℓ = 0.5), on 400 of its rows."""
    import numpy as np

    from alacarte.factory import make_model
    from test_calibration import NOISE, SIGNAL, draw

    lengthscales = np.array([0.5, 0.5, 0.5])
    x, y, _, _ = draw(400, seed, lengthscales)
    torch.manual_seed(seed)
    model = make_model("fastfood-ard", 3, num_samples=512)
    model.covar_module.lengthscale = torch.as_tensor(lengthscales)
    model.covar_module.outputscale = SIGNAL * outputscale
    model.likelihood.noise = NOISE
    model.set_train_data(torch.as_tensor(x), torch.as_tensor(y), strict=False)
    return model


def test_the_prior_variance_ratio_is_the_dense_kernels_spread_over_the_targets_and_near_1_at_the_truth():
    """(mean k(xᵢ, xᵢ) − mean k(xᵢ, xⱼ)) / (the targets' spread − σ²(n − 1)/n), summed over chunks, against the
    dense kernel matrix; about 1 at the kernel that drew the targets, and σ_f² times more at σ_f² times the
    prior variance (the likelihood's inflation that docs/calibration.md measures far from the data)."""
    for seed in (1, 2):
        model = _at_true_kernel(seed, 1.0)
        model.memory_budget = 2_000_000  # chunks of a few dozen rows
        assert model.chunk_rows() < 100
        (x,), y = model.train_inputs, model.train_targets
        with torch.no_grad():
            k = model.covar_module(x).to_dense()
        n = len(y)
        dense = float(k.diagonal().mean() - k.mean()) / float(y.var(unbiased=False) - model.likelihood.noise * (n - 1) / n)
        assert model.prior_variance_ratio() == pytest.approx(dense, rel=1e-10)
        assert 0.8 <= dense <= 1.25
        assert _at_true_kernel(seed, 300.0).prior_variance_ratio() == pytest.approx(300 * dense, rel=1e-6)
    model.cache_posterior(x, y)  # a streamed posterior: the model drops its rows
    with pytest.raises(ValueError, match="training rows"):
        model.prior_variance_ratio()
