"""Units and the noise: standardisation, the noise variance's bounds and refit, unstandardised targets'
starting values."""
import copy
import math
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import alacarte
from alacarte import ExactRBFGP, FeatureGP, FSARDKernel, fit
from alacarte.streaming import ChunkedData

from model_cases import toy_data, feature_model


def test_a_constant_column_is_centred_not_divided_by_round_off():
    """A constant column's computed std can be round-off rather than 0 (1/3s: ~1e-17 in
    the streamed two-pass sums, and in torch's std of a whole vector); dividing by it
    would turn round-off into an O(1) input. In memory and streamed, it gets scale 1."""
    x, y = toy_data(n=50)
    x[:, 1] = 1 / 3
    assert float((x[:, 1] - x[:, 1].sum() / 50).square().sum()) > 0  # the round-off guarded against
    model = feature_model()
    model.standardize(x, y)
    streamed = feature_model()
    streamed.set_standardization(*ChunkedData(x, y, chunk_size=7).moments(streamed))
    for m in (model, streamed):
        assert float(m.input_scale[1]) == 1.0
        assert torch.allclose(m.input_scale[[0, 2]], x[:, [0, 2]].std(0), rtol=1e-12)
        assert float(m.internal_inputs(x)[:, 1].abs().max()) < 1e-15
    constant_y = torch.full_like(y, 1 / 3)
    assert float(constant_y.std()) > 0
    model.standardize(x, constant_y)
    assert float(model.target_scale) == 1.0
    with pytest.raises(ValueError, match="y is constant"):  # fit refuses it (test_fit_rejects_bad_data); so do moments
        ChunkedData(x, constant_y, chunk_size=7).moments(streamed)


def test_standardisation_gives_original_units():
    """Predictions come back in the targets' units: equal to a model trained on
    hand-standardised data, mapped back by hand."""
    x, y = toy_data()
    model = feature_model()
    fit(model, x, y, max_iter=20, progress=False)
    pred = model.predict(x)
    rmse = (pred.mean - y).pow(2).mean().sqrt()
    assert rmse < 0.2 * y.std()
    xs = (x - x.mean(0)) / x.std(0)
    ys = (y - y.mean()) / y.std()
    manual = feature_model()
    fit(manual, xs, ys, max_iter=20, progress=False, standardize=False)
    manual_pred = manual.predict(xs)
    assert torch.allclose(pred.mean, manual_pred.mean * y.std() + y.mean(), rtol=1e-7, atol=1e-7)
    assert torch.allclose(pred.variance, manual_pred.variance * y.var(), rtol=1e-6, atol=1e-9)


def test_an_unstandardised_fit_whose_noise_bound_exceeds_the_targets_variance_says_so():
    """Targets of scale 1e-8 with standardize=False: the bound 1e-4 (in y's units) is above var y, so the
    model predicts about the mean. The warning said it 'interpolates its training targets ... in
    standardised units', the opposite on both counts."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 3, generator=gen, dtype=torch.float64)
    y = 1e-8 * torch.sin(6 * x[:, 0])
    model = feature_model()
    with pytest.warns(RuntimeWarning, match=r"lower bound \(1.0e-04 in the targets' units, standardize=False\) "
                                            r"is not below the targets' variance") as caught:
        fit(model, x, y, standardize=False, max_iter=20, restarts=0, progress=False, validation_fraction=0)
    assert not any("interpolates" in str(w.message) for w in caught)
    mean = model.predict(x).mean
    assert float(mean.std()) < 0.01 * float(y.std())  # indeed about the mean: the targets were taken for noise


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_fit_that_ends_with_the_noise_at_its_lower_bound_warns_and_counts_repeated_rows(make):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 3, generator=gen, dtype=torch.float64)
    x = torch.cat([x, x[:7]])  # seven rows twice, their targets equal: σ² → 0 pays
    y = torch.sin(3 * x[:, 0]) + x[:, 1]  # and noise-free
    model = make()
    with pytest.warns(RuntimeWarning, match="lower bound .* repeat 7 rows"):
        history = fit(model, x, y, max_iter=50, restarts=0, progress=False, validation_fraction=0)
    # The refit from a larger noise was tried, went no lower, and was dropped.
    assert history.noise_refit_loss >= float(alacarte.training.current_loss(model, *model.train_inputs,
                                                                             model.train_targets))
    assert model.likelihood.noise.item() < 2e-4
    noisy = y + 0.3 * torch.randn(len(y), generator=gen, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = make()
        fit(model, x, noisy, max_iter=50, restarts=0, progress=False, validation_fraction=0)
    assert model.likelihood.noise.item() > 1e-2  # the first fit's warning was about its noise, not the data


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_fit_stalled_at_the_noise_lower_bound_is_refitted_from_a_larger_noise(make):
    """Started with σ² at its lower bound, L-BFGS stalls there (the constraint's softplus flattens the
    gradient): without the refit FSARD ends at a loss of 1.05 per point and exact ARD at 0.19, against
    -1.64 and -1.54 from σ² = 0.01 (the data's noise is 0.0016 in standardised units)."""
    x, y = toy_data(n=200)
    model, reference = make(), make()
    model.likelihood.noise, reference.likelihood.noise = 1.00001e-4, 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor does it warn about the bound: it left it
        history = fit(model, x, y, max_iter=100, restarts=0, progress=False, validation_fraction=0)
        fit(reference, x, y, max_iter=100, restarts=0, progress=False, validation_fraction=0)
    x_std, y_std = model.train_inputs[0], model.train_targets  # the reference's too: the same standardisation
    final = alacarte.training.current_loss(model, x_std, y_std)
    assert history.noise_refit_loss == pytest.approx(final)  # the refit was kept
    assert final < alacarte.training.current_loss(reference, x_std, y_std) + 0.05
    assert 0.5 < model.likelihood.noise.item() / reference.likelihood.noise.item() < 2


@pytest.mark.parametrize("upper", [0.05, 0.005, 3e-4])
def test_a_noise_with_an_upper_bound_is_initialised_and_refitted_inside_it(upper):
    """σ² = 0.01 (initialisation) or 0.1 (noise refit) × the target variance above an Interval's upper
    bound would raise GPyTorch's RuntimeError: at 0.05 after the whole fit, in the refit; at 0.005 and
    3e-4 before it, in the first restart."""
    x, _ = toy_data(n=100)
    y = 10 * torch.sin(x[:, 0]) + x[:, 1]  # noise-free: the fit ends at the lower bound and is refitted
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.Interval(1e-4, upper))
    model = FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0), likelihood).double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, x, y, max_iter=20, restarts=1, restart_iter=3, progress=False, validation_fraction=0)
    assert 0.99e-4 < model.likelihood.noise.item() <= upper
    # where σ² ends within twice its lower bound the refit runs, from 0.1 × var y moved inside the interval
    # (under 3e-4 = 3 × the lower bound the fit may end above 2e-4, not at the bound)
    at_bound = any("ended at its lower bound" in str(w.message) for w in caught)
    assert at_bound == (history.noise_refit_loss is not None) and (at_bound or upper < 1e-3)


def test_a_noise_with_no_lower_bound_is_initialised_inside_it():
    """The middle of a LessThan constraint's (-inf, high) is σ² = -inf: set there (no error), every restart
    would fail at once and fit return the model with σ² = -inf and no loss; and asked for 0.1 under
    LessThan(0.05), the setter would refuse it.  A variance lies in (0, high): kept 1% of it inside, as for
    an Interval; below that σ² is set as asked."""
    from alacarte.init import set_noise

    def model(high):
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.LessThan(high))
        return FeatureGP(None, None, FSARDKernel(3, 16, ard_num_dims=3, seed=0), likelihood).double()

    for high, expected in ((1.0, 0.1), (0.05, 0.0495)):
        m = model(high)
        set_noise(m, 0.1)
        assert m.likelihood.noise.item() == pytest.approx(expected)
    x, y = toy_data(n=60)
    m = model(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a step to σ² < 0 ends it: the constraint allows that)
        history = fit(m, x, y, max_iter=5, restarts=1, restart_iter=3, progress=False)
    assert math.isfinite(history.restart_losses[0]) and m.likelihood.noise.item() > 0


def test_an_upper_bound_alone_does_not_lift_small_initial_values():
    """Under an upper bound alone, keeping initial values 1% of (0, b) inside it at both ends would lift
    σ² = 0.01 var y to 0.1 under LessThan(10), and ARD lengthscales of ~0.02 (inputs in units of 100)
    all to 0.1, erasing their data-driven differences.  0 bounds nothing there: only b is kept off."""
    from alacarte.init import initialize

    gen = torch.Generator().manual_seed(0)
    x = 0.01 * torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(40, generator=gen, dtype=torch.float64)
    initial = []
    for constraint in (gpytorch.constraints.Positive(), gpytorch.constraints.LessThan(10.0)):
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=copy.deepcopy(constraint))
        kernel = FSARDKernel(3, 8, ard_num_dims=3, seed=0, lengthscale_constraint=copy.deepcopy(constraint))
        model = FeatureGP(None, None, kernel, likelihood).double()
        initialize(model, x, y, np.random.default_rng(0), 0, standardized=False)
        initial.append((model.likelihood.noise.item(), model.covar_module.lengthscale.detach()))
    (noise, lengthscale), (bounded_noise, bounded_lengthscale) = initial
    assert noise == pytest.approx(0.01 * y.var().item()) and bool((lengthscale < 0.05).all())
    assert bounded_noise == pytest.approx(noise, rel=1e-12)
    torch.testing.assert_close(bounded_lengthscale, lengthscale, rtol=1e-12, atol=0)


def test_a_noise_that_is_not_trained_is_left_at_its_bound():
    x, y = toy_data(n=100)
    model = feature_model()
    model.likelihood.noise = 1.00001e-4
    model.likelihood.noise_covar.raw_noise.requires_grad_(False)
    with pytest.warns(RuntimeWarning, match="is fixed \\(not trained\\) at its lower bound") as caught:
        history = fit(model, x, y, max_iter=20, restarts=0, progress=False)
    assert not any("refit" in str(w.message) for w in caught)  # none ran: the warning does not claim one
    assert history.noise_refit_loss is None and model.likelihood.noise.item() == pytest.approx(1.00001e-4)


def test_unstandardised_targets_start_from_their_own_variance():
    from alacarte.init import initialize

    x, y = toy_data(n=200)
    y = 1000 * y + 5
    for model in (feature_model(), ExactRBFGP(None, None, num_dims=3).double(),
                  FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 64, num_components=4, seed=0)).double(),
                  FeatureGP(None, None, alacarte.PiecewiseLinearRadialKernel(3, 64, num_components=2, ard_num_dims=3,
                                                                             seed=0)).double()):
        initialize(model, x, y, np.random.default_rng(0))
        kernel = model.covar_module
        signal = (kernel.weights.sum() if hasattr(kernel, "weights") else kernel.outputscale).detach()
        assert float(signal) == pytest.approx(float(y.var()), rel=1e-9), type(kernel).__name__
        assert float(model.likelihood.noise.detach()) == pytest.approx(0.01 * float(y.var()), rel=1e-6)


def test_ard_and_isotropic_initial_lengthscales_relate_as_documented():
    """The sqrt(d) factor does not make an ARD initialisation of isotropic data equal the isotropic one:
    it is 0.67× it at large d (the median of |N(0, 2)| is 0.95, a full distance ~ sqrt(2d)), as
    alacarte.init's docstring says."""
    from alacarte.init import _lengthscales, pair_distances

    for d, ratio in ((2, 0.81), (10, 0.70), (100, 0.676)):
        x = torch.randn(4000, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        diffs = pair_distances(x, np.random.default_rng(0), 20_000)
        ard, isotropic = _lengthscales(diffs, 0.5, True), _lengthscales(diffs, 0.5, False)
        assert float(ard.mean() / isotropic) == pytest.approx(ratio, abs=0.02), d


@pytest.mark.parametrize("unit", [1e160, 1e-170])
def test_unstandardised_targets_whose_variance_is_not_a_float_are_refused_by_name(unit):
    """var y of targets in units of 1e160 (1e-170) is inf (0) in float64; the restarts' initialisation
    then would fail with "outputscale must be finite and strictly inside (0, inf), got inf" (got 0.0),
    which names neither the targets nor a remedy."""
    x, y = toy_data(n=50)
    with pytest.raises(ValueError, match=r"the targets' variance is (inf|0) .*standardize=True"):
        fit(feature_model(), x, unit * y, standardize=False, restarts=1, restart_iter=1, max_iter=1, progress=False)


def test_rescaling_a_mixture_whose_weight_underflowed_to_zero_keeps_the_others():
    """The held-out calibration multiplies σ_f² (a mixture's weights) by a factor; a weight whose
    softplus underflowed to exactly 0 must not make that fail."""
    from alacarte import PiecewiseLinearRadialKernel
    from alacarte.factory import make_model
    from alacarte.init import scale_signal

    model = make_model(PiecewiseLinearRadialKernel(3, 16, num_components=4, ard_num_dims=3, seed=0), 3)
    kernel = model.covar_module
    with torch.no_grad():
        kernel.raw_weights[..., 1] = -1000.0  # softplus(-1000) == 0.0 in float64
    before = kernel.weights.detach().clone()
    assert before.reshape(-1)[1] == 0
    scale_signal(model, 2.5)
    after = kernel.weights.detach()
    keep = torch.tensor([0, 2, 3])
    torch.testing.assert_close(after.reshape(-1)[keep], 2.5 * before.reshape(-1)[keep])
    assert 0 < after.reshape(-1)[1] < 1e-30
