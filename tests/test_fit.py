"""fit: settings and data it refuses, determinism, restarts, broken steps, models of the user's own."""
import math
import warnings
from unittest import mock

import gpytorch
import numpy as np
import pytest
import torch

import alacarte
from alacarte import ExactRBFGP, FeatureGP, FSARDKernel, fit
from alacarte.woodbury import cholesky_with_jitter

from model_cases import toy_data, feature_model, with_value


@pytest.mark.parametrize(
    "x_mod, y_mod, message",
    [
        (lambda x: with_value(x, (3, 1), float("nan")), None, "x contains 1 non-finite value.*NaN"),
        (lambda x: with_value(x, (0, 0), float("inf")), None, "x contains.*inf"),
        (None, lambda y: with_value(y, 2, float("nan")), "y contains.*NaN"),
        (None, lambda y: y[:-1], "y has 199 values but x has 200 rows"),
        (lambda x: x[:0], lambda y: y[:0], "x is empty"),
        (lambda x: x[:, :2], None, "x has 2 columns but the model expects 3"),
        (lambda x: x.unsqueeze(0), None, r"x must have shape \(n, d\)"),
        (None, lambda y: torch.stack([y, y], 1), r"y must have shape \(n,\)"),
        # One row or a constant target: the likelihood grows without bound as the variances go to 0.
        (lambda x: x[:1], lambda y: y[:1], "at least 2 training rows.*got n_samples = 1"),
        (None, lambda y: torch.full_like(y, 3.0), "y is constant"),
    ],
)
def test_fit_rejects_bad_data(x_mod, y_mod, message):
    x, y = toy_data()
    x = x_mod(x.clone()) if x_mod else x
    y = y_mod(y.clone()) if y_mod else y
    with pytest.raises(ValueError, match=message):
        fit(feature_model(), x, y, max_iter=2, progress=False)


def test_fit_rejects_bad_settings():
    x, y = toy_data()
    with pytest.raises(ValueError, match="optimizer"):
        fit(feature_model(), x, y, optimizer="sgd")
    with pytest.raises(ValueError, match="max_iter"):
        fit(feature_model(), x, y, max_iter=0)
    for bad_lr in (-1.0, float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"lr must be a finite number in \(0, inf\)"):
            fit(feature_model(), x, y, lr=bad_lr)
    for bad_seed in (-1, 1.5, "0", 2**64):
        with pytest.raises(ValueError, match="seed must be None or an integer"):
            fit(feature_model(), x, y, seed=bad_seed)
    with pytest.raises(ValueError, match="tolerance"):
        fit(feature_model(), x, y, tolerance=float("nan"))
    for bad_flag in ("no", "False", 0, None):  # truthy strings standardised without a word
        with pytest.raises(ValueError, match="standardize must be True or False"):
            fit(feature_model(), x, y, standardize=bad_flag)
    with pytest.raises(ValueError, match="num_dims must be a positive integer"):
        ExactRBFGP(None, None, num_dims=0)
    with pytest.raises(ValueError, match="float32 or float64"):
        fit(feature_model().half(), x, y)
    with pytest.raises(ValueError, match="FeatureKernel"):
        FeatureGP(None, None, gpytorch.kernels.RBFKernel())
    with pytest.raises(ValueError, match="homoskedastic"):
        FeatureGP(None, None, FSARDKernel(3, 8), gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.ones(3)))


def test_a_kernel_of_the_users_own_needs_restarts_0_and_says_so():
    """Restarts initialise only alacarte's kernels: a FeatureKernel subclass without a lengthscale (the
    documented extension, :meth:`projection` alone) gets the ValueError that names restarts=0, not an
    AttributeError ('raw_lengthscale'); with restarts=0 it trains."""
    from alacarte import FeatureKernel

    class Linear(FeatureKernel):
        def projection(self, x):
            return x @ torch.ones(x.shape[-1], self.num_samples, dtype=x.dtype)

    x, y = toy_data()
    with pytest.raises(ValueError, match="no data-driven initialisation for Linear; use restarts=0"):
        fit(FeatureGP(None, None, Linear(x.shape[1], 4)), x, y, max_iter=2, progress=False)
    fit(FeatureGP(None, None, Linear(x.shape[1], 4)), x, y, max_iter=2, restarts=0, progress=False)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_fit_improves_and_is_deterministic(optimizer):
    x, y = toy_data()
    runs = []
    for _ in range(2):
        model = feature_model()
        history = fit(model, x, y, optimizer=optimizer, max_iter=30, restarts=0, progress=False)
        runs.append((history, model.predict(x[:10])))
    (h1, p1), (h2, p2) = runs
    assert h1.loss[-1] < h1.loss[0] - 0.3
    assert h1.loss == h2.loss
    assert torch.equal(p1.mean, p2.mean) and torch.equal(p1.variance, p2.variance)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
@pytest.mark.parametrize("restarts", [0, 1])
def test_fit_takes_data_that_require_grad(make, restarts):
    """Data from an autograd computation train as their values: as variables they would fail at the first
    backward ("backward through the graph a second time"; with restarts, "modified by an inplace operation")."""
    x, y = toy_data(n=60)
    settings = dict(max_iter=5, restarts=restarts, restart_iter=2, progress=False)
    model, reference = make(), make()
    history = fit(model, x.clone().requires_grad_(), y.clone().requires_grad_(), **settings)
    assert history.loss == fit(reference, x, y, **settings).loss


def test_fit_leaves_torch_global_generator_alone():
    """A fit that reset torch's generator to its seed would make every kernel built with seed=None after a
    fit draw the same random features (seeds 1895649597198586619 twice), and torch.randn() after any fit
    give 1.5410. Nothing in a fit draws from it, so fits stay reproducible without the reset."""
    x, y = toy_data(n=60)
    torch.manual_seed(123)
    seeds, losses = [], []
    for _ in range(3):
        kernel = FSARDKernel(3, 16, ard_num_dims=3)  # its seed drawn from torch's generator
        seeds.append(kernel.seed)
        state = torch.get_rng_state()
        fit(FeatureGP(None, None, kernel).double(), x, y, max_iter=3, restarts=1, restart_iter=2, progress=False)
        assert torch.equal(torch.get_rng_state(), state)
        torch.manual_seed(len(seeds))  # another global state: the same fit
        losses.append(fit(feature_model(), x, y, max_iter=3, restarts=1, restart_iter=2, progress=False).loss)
    assert len(set(seeds)) == 3 and losses[0] == losses[1] == losses[2]


def test_a_step_that_underflows_an_unbounded_noise_to_zero_does_not_end_the_fit():
    """With a noise constraint that allows 0 (Positive()), an L-BFGS probe can underflow the float32
    softplus to σ² = 0 exactly (n = 20 < D = 32, targets in the features' span); the Woodbury forms
    refuse σ² ≤ 0, and that ValueError must not end the fit.  Like a probe that breaks the Cholesky,
    it is a failed step: the fit ends at loss -0.2482, σ² 2.9e-7."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=gen)
    # (softplus lengthscales: the path on which a probe underflows σ²)
    kernel = FSARDKernel(2, 16, ard_num_dims=2, seed=0, lengthscale_constraint=gpytorch.constraints.Positive())
    y = kernel.features(x).detach() @ torch.randn(32, generator=gen)  # noise-free: the optimum is σ² → 0
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.Positive())
    model = FeatureGP(None, None, kernel, likelihood)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (jitter and float32 advice)
        history = fit(model, x, y, max_iter=200, restarts=0, standardize=False, progress=False, validation_fraction=0)
    assert math.isfinite(history.loss[-1]) and 0 < float(model.likelihood.noise) < 1e-5


@pytest.mark.parametrize("kind", ["feature", "exact"])
def test_a_fit_that_starts_at_a_nonpositive_noise_is_refused_not_stopped_with_a_warning(kind):
    """A failed step is retried or ends the fit with a warning, but σ² ≤ 0 where the fit starts is the
    model's own setting (restarts=0 under LessThan(0.05): σ² = 0.05 − softplus(0) = −0.64).  Taken as a
    failed step, fit would stop after 0 iterations with a RuntimeWarning and return the model with σ² < 0;
    it must be the ValueError that names σ²."""
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(x).sum(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.LessThan(0.05))
    if kind == "feature":
        model = FeatureGP(None, None, FSARDKernel(2, 8, ard_num_dims=2, seed=0), likelihood).double()
    else:
        model = ExactRBFGP(None, None, num_dims=2, ard=True, likelihood=likelihood).double()
    assert float(model.likelihood.noise) < 0
    with pytest.raises(ValueError, match=r"σ² must be positive, got -0.64\d* where fit starts"):
        fit(model, x, y, max_iter=5, restarts=0, progress=False)


def test_a_fit_that_starts_at_nan_parameters_is_refused_not_stopped_with_a_warning():
    """As for σ² ≤ 0: a NaN lengthscale where fit starts (restarts=0) is no failed step, after which fit
    would stop after 0 iterations with a RuntimeWarning and return the model with NaN lengthscales."""
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = FeatureGP(None, None, FSARDKernel(2, 8, ard_num_dims=2, seed=0)).double()
    with torch.no_grad():
        model.covar_module.raw_lengthscale.fill_(math.nan)
    with pytest.raises(ValueError, match=r"parameters \['covar_module.raw_lengthscale'\] are NaN where fit starts"):
        fit(model, x, torch.sin(x).sum(-1), max_iter=5, restarts=0, progress=False)


def test_lbfgs_line_search_backtracks_an_overshooting_first_step():
    """One L-BFGS iteration per step(): the first trial step of f(x) = x² from x = 0.1 lands on
    x = −0.1 (no decrease).  Torch's default evaluation budget for max_iter=1 leaves the line
    search none, so it stays at 0.1 for ever (fits "converge" where they stall); ours
    must backtrack to the minimum."""
    from alacarte.training._optimization import make_optimizer

    x = torch.tensor([0.1], dtype=torch.float64, requires_grad=True)
    opt = make_optimizer([x], "lbfgs", None)

    def closure():
        opt.zero_grad()
        loss = (x * x).sum()
        loss.backward()
        return loss

    opt.step(closure)
    assert float(x.detach().abs()) < 1e-3


def test_a_converged_fit_is_at_a_stationary_point():
    x, y = toy_data()
    model = FeatureGP(None, None, alacarte.FastfoodRBFKernel(3, 64, ard_num_dims=3, seed=0)).double()
    history = fit(model, x, y, max_iter=300, restarts=2, restart_iter=5, progress=False, validation_fraction=0)
    assert history.converged
    from alacarte.training import marginal_log_likelihood

    model.train()
    loss = -marginal_log_likelihood(model)(model(model.train_inputs[0]), model.train_targets)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    assert max(float(g.abs().max()) for g in grads) < 1e-3


def test_jitter_escalation_warns_and_recovers():
    a = torch.ones(4, 4, dtype=torch.float32)  # rank one: Cholesky fails without jitter
    with pytest.warns(RuntimeWarning, match="jitter"):
        factor = cholesky_with_jitter(a)
    assert torch.isfinite(factor).all()
    with pytest.raises(ValueError, match="not positive definite"):
        cholesky_with_jitter(torch.full((3, 3), float("nan")))


@pytest.mark.parametrize("make", [
    lambda: feature_model(),
    lambda: FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 64, num_components=4, seed=0)).double(),
    lambda: FeatureGP(None, None, alacarte.PiecewiseLinearRadialKernel(3, 64, num_components=4, ard_num_dims=3, seed=0)).double(),
    lambda: FeatureGP(None, None, alacarte.SSGPRKernel(3, 32, seed=0)).double(),
    lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double(),
])
def test_restarts_are_reproducible_and_keep_the_best(make):
    x, y = toy_data(n=120)
    runs = []
    for seed in (0, 0, 1):
        model = make()
        history = fit(model, x, y, restarts=4, restart_iter=5, max_iter=5, seed=seed, progress=False, validation_fraction=0)
        runs.append((history, {k: v.clone() for k, v in model.state_dict().items()}))
    (h1, s1), (h2, s2), (h3, _) = runs
    assert len(h1.restart_losses) == 4
    assert h1.restart_losses == h2.restart_losses and h1.loss == h2.loss
    assert all(torch.equal(s1[k], s2[k]) for k in s1)  # bit for bit
    assert h1.chosen_restart == int(np.argmin(h1.restart_losses))
    assert h1.restart_losses != h3.restart_losses  # another seed, other initialisations
    # training continued from the chosen restart: its first loss is that restart's loss
    assert abs(h1.loss[0] - h1.restart_losses[h1.chosen_restart]) < 1e-9


def test_fsgbard_restarts_are_fsards_and_its_final_optimisation_learns_the_blocks():
    """FSGBARD is FSARD plus learned blocks G, B: its restarts, which hold the blocks at their draw, are
    FSARD's restarts (the same seed draws the same state), and the final optimisation moves the blocks."""
    x, y = toy_data(n=120)
    settings = dict(restarts=3, restart_iter=4, max_iter=4, seed=0, progress=False, validation_fraction=0)
    fsard, fsgbard = (alacarte.factory.make_model(name, 3, num_samples=16, seed=0) for name in ("fsard", "fsgbard"))
    drawn = fsgbard.covar_module.gauss.detach().clone()
    runs = [fit(model, x, y, **settings) for model in (fsard, fsgbard)]
    assert runs[1].restart_losses == pytest.approx(runs[0].restart_losses, rel=1e-10, abs=1e-12)
    assert runs[1].chosen_restart == runs[0].chosen_restart
    assert not torch.equal(fsgbard.covar_module.gauss.detach(), drawn)
    assert fsgbard.covar_module.gauss.requires_grad and fsgbard.covar_module.sign.requires_grad
    frozen = alacarte.factory.make_model("fsgbard", 3, num_samples=16, seed=0)
    frozen.covar_module.sign.requires_grad_(False)  # the user's: held in every stage, and left so
    signs = frozen.covar_module.sign.detach().clone()
    fit(frozen, x, y, **settings)
    assert not frozen.covar_module.sign.requires_grad and torch.equal(frozen.covar_module.sign.detach(), signs)
    assert not torch.equal(frozen.covar_module.gauss.detach(), drawn)


def test_numpy_integers_are_integers():
    """A grid search hands settings over as numpy integers."""
    x, y = toy_data()
    a, b = feature_model(), feature_model()
    fit(a, x, y, max_iter=3, restarts=2, restart_iter=2, seed=4, progress=False)
    fit(b, x, y, max_iter=np.int64(3), restarts=np.int64(2), restart_iter=np.int32(2), seed=np.uint32(4),
        progress=False)
    assert torch.equal(a.predict(x).mean, b.predict(x).mean)


def test_fit_rejects_bad_restart_settings():
    x, y = toy_data()
    with pytest.raises(ValueError, match="restarts"):
        fit(feature_model(), x, y, restarts=-1)
    with pytest.raises(ValueError, match="restart_iter"):
        fit(feature_model(), x, y, restarts=2, restart_iter=0)


def _failures(kind: str) -> Exception:
    from linear_operator.utils.errors import NanError, NotPSDError

    from alacarte.woodbury import NotPositiveDefiniteError

    return {"gpytorch": NotPSDError, "nan": NanError, "woodbury": NotPositiveDefiniteError}[kind]("simulated")


def _fit_with_failing_steps(model, failing_calls, error):
    """fit() with L-BFGS steps that, at the given call numbers, leave the parameters at a bad
    point and raise what a broken factorisation raises."""
    x, y = toy_data(n=60)
    real_step = torch.optim.LBFGS.step
    calls = []

    def failing_step(self, closure):
        calls.append(1)
        if len(calls) in failing_calls:
            for group in self.param_groups:  # the probe leaves parameters at a bad point
                for p in group["params"]:
                    p.data.fill_(1e6)
            raise _failures(error)
        return real_step(self, closure)

    with mock.patch.object(torch.optim.LBFGS, "step", failing_step):
        history = fit(model, x, y, restarts=0, max_iter=10, progress=False)
    return history, x


MODELS = [
    ("gpytorch", lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()),
    ("nan", lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()),
    ("woodbury", lambda: feature_model()),
]


@pytest.mark.parametrize("error, make", MODELS)
def test_two_broken_factorisations_in_a_row_stop_training_at_the_last_good_state(error, make):
    model = make()
    with pytest.warns(RuntimeWarning, match="last good parameters are kept"):
        history, x = _fit_with_failing_steps(model, {4, 5}, error)
    assert history.iterations == 3 and not history.converged
    assert all(torch.isfinite(p).all() and p.abs().max() < 1e5 for p in model.parameters())
    assert torch.isfinite(model.predict(x[:5]).mean).all()


@pytest.mark.parametrize("error, make", MODELS)
def test_one_broken_factorisation_is_retried_from_the_last_good_state(error, make):
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "training stopped"
        history, x = _fit_with_failing_steps(model, {4}, error)
    assert history.iterations >= 4  # it went on past the failure
    assert all(torch.isfinite(p).all() and p.abs().max() < 1e5 for p in model.parameters())
    assert all(b <= a + 1e-9 * abs(a) for a, b in zip(history.loss, history.loss[1:]))


@pytest.mark.parametrize("make", [lambda: feature_model(), lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_restarts_leave_the_parameters_a_user_froze_alone(make):
    x, y = toy_data(n=80)
    model = make()
    with torch.no_grad():
        model.likelihood.noise = 0.3
        model.covar_module.outputscale = 2.0
        model.mean_module.constant.fill_(0.5)
    for raw in (model.likelihood.noise_covar.raw_noise, model.covar_module.raw_outputscale,
                model.mean_module.raw_constant):
        raw.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fit(model, x, y, restarts=3, restart_iter=3, max_iter=3, progress=False)
    # (GPyTorch's setters take a Python number through float32)
    assert float(model.likelihood.noise) == pytest.approx(0.3, rel=1e-7)
    assert float(model.covar_module.outputscale) == pytest.approx(2.0, rel=1e-7)
    assert float(model.mean_module.constant) == pytest.approx(0.5, rel=1e-7)


def test_a_step_to_non_finite_parameters_is_undone_not_kept():
    """A finite loss with a NaN gradient (from the 5th evaluation on) steps Adam to NaN parameters. The
    fit stops there with the last finite parameters (keeping the NaN ones, it would fail deep inside the
    Cholesky)."""
    x, y = toy_data(n=100, dtype=torch.float32)
    model = FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0)).float()
    calls = [0]

    def nan_from_the_fifth(grad):
        calls[0] += 1
        return grad * float("nan") if calls[0] >= 5 else grad

    model.covar_module.raw_outputscale.register_hook(nan_from_the_fifth)
    with pytest.warns(RuntimeWarning, match="last good parameters are kept"):
        history = fit(model, x, y, optimizer="adam", lr=0.1, max_iter=30, restarts=0, progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(np.isfinite(history.loss)) and torch.isfinite(model.predict(x[:5]).mean).all()


def test_restarts_start_inside_the_constraints_the_user_set():
    """A data-driven value outside a user's constraint would be refused by the setter, and fit fail at
    its first restart: lengthscale_constraint=Interval(0.05, 1) against an initial 1.66 ("lengthscale
    must be ... strictly inside (0.05, 1)"), GM scales in (0.9, 2) against 0.6, a noise in (1e-3, 5e-3)
    against 0.01 (GPyTorch's RuntimeError)."""
    from gpytorch.constraints import Interval

    x, y = toy_data(n=100)
    models = [
        FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0, lengthscale_constraint=Interval(0.05, 1.0))),
        FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 32, num_components=2, seed=0,
                                                                     scales_constraint=Interval(0.9, 2.0))),
        FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0),
                  likelihood=gpytorch.likelihoods.GaussianLikelihood(noise_constraint=Interval(1e-3, 5e-3))),
        ExactRBFGP(None, None, num_dims=3, ard=True),
    ]
    models[-1].covar_module.base_kernel.register_constraint("raw_lengthscale", Interval(0.05, 1.0))
    # an upper bound alone: the lengthscales (1.66) are inside it (not NaN)
    models.append(FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0,
                                                    lengthscale_constraint=gpytorch.constraints.LessThan(10.0))))
    for model in models:
        model.double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (a noise at its bound, on purpose)
            history = fit(model, x, y, restarts=2, restart_iter=2, max_iter=2, progress=False)
        assert all(np.isfinite(history.restart_losses)), type(model.covar_module).__name__


def test_restarts_of_a_simplex_kernel_with_a_fixed_size_start_from_different_points():
    x, y = toy_data(n=100, d=4)
    kernel = FSARDKernel(4, 32, ard_num_dims=4, simplex=True, learn_simplex_size=False, seed=0)
    model = FeatureGP(None, None, kernel).double()
    history = fit(model, x, y, restarts=3, restart_iter=3, max_iter=2, progress=False)
    assert len(set(history.restart_losses)) == 3  # (not all three from uniform π, the same point)


def test_models_refuse_what_they_cannot_train():
    x, y = toy_data(n=50)
    with pytest.raises(ValueError, match="homoskedastic gpytorch.likelihoods.GaussianLikelihood.*FixedNoise"):
        ExactRBFGP(None, None, num_dims=3,
                   likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.full((50,), 0.01)))
    frozen = feature_model()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of the model is frozen"):
        fit(frozen, x, y, restarts=0, progress=False)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        alacarte.factory.make_model("fsard", 3, dtype=torch.int64)
    # π alone trainable: no optimiser for the rest, projected-gradient steps on π still run
    kernel = FSARDKernel(3, 32, ard_num_dims=3, simplex=True, learn_simplex_size=False, seed=0)
    model = FeatureGP(None, None, kernel).double()
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith("simplex_weights"))
    before = kernel.simplex_weights.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = fit(model, x, y, restarts=0, max_iter=5, progress=False)
    assert history.iterations >= 1 and not torch.equal(kernel.simplex_weights.detach(), before)


@pytest.mark.parametrize("part", ["kernel", "mean", "noise"])
def test_fit_refuses_a_batch_of_models_by_name(part):
    """A batch-shaped kernel, mean or noise gives one loss per member, which torch cannot back-propagate
    ('grad can be implicitly created only for scalar outputs'); fit trains one model at a time and says so."""
    x = torch.randn(30, 2, dtype=torch.float64)
    y = torch.sin(x[:, 0])
    batch = torch.Size([2])
    kernel = FSARDKernel(2, 8, seed=0, batch_shape=batch if part == "kernel" else torch.Size([]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch if part == "noise" else torch.Size([]))
    model = FeatureGP(x, y, kernel, likelihood).double()
    if part == "mean":
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=batch).double()
    with pytest.raises(ValueError, match=f"one model at a time; this one has a batch_shape in its {part}"):
        fit(model, x, y, max_iter=2, progress=False)
    exact = ExactRBFGP(x, y, num_dims=2).double()
    exact.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch),
                                                      batch_shape=batch).double()
    with pytest.raises(ValueError, match="batch_shape in its kernel"):
        fit(exact, x, y, max_iter=2, progress=False)


@pytest.mark.parametrize("mean", ["zero", "linear"])
def test_fit_trains_a_mean_of_the_users_own_with_restarts_0(mean):
    """The batch check must not read the mean's .constant, which a ZeroMean or LinearMean does not have: fit
    trains such a model with restarts=0. A batched ZeroMean is refused by name."""
    x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x[:, 0])
    model = FeatureGP(x, y, FSARDKernel(2, 8, seed=0)).double()
    model.mean_module = (gpytorch.means.ZeroMean() if mean == "zero" else gpytorch.means.LinearMean(2)).double()
    history = fit(model, x, y, max_iter=3, restarts=0, progress=False)
    assert history.loss[-1] < history.loss[0]
    model.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([2]))
    with pytest.raises(ValueError, match="batch_shape in its mean"):
        fit(model, x, y, max_iter=3, restarts=0, progress=False)


@pytest.mark.parametrize("mean", ["zero", "linear"])
def test_restarts_leave_a_mean_of_the_users_own_as_it_is(mean):
    """The restarts' initialisation sets model.mean_module.constant where there is one; a ZeroMean or
    LinearMean has none, so fit with restarts (the default) initialises the kernel and the noise and leaves
    such a mean alone (a ZeroMean stays zero: the targets are standardised)."""
    x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x[:, 0])
    model = FeatureGP(x, y, FSARDKernel(2, 8, seed=0)).double()
    model.mean_module = (gpytorch.means.ZeroMean() if mean == "zero" else gpytorch.means.LinearMean(2)).double()
    history = fit(model, x, y, max_iter=3, restarts=2, restart_iter=2, progress=False)
    assert len(history.restart_losses) == 2 and history.loss[-1] < history.loss[0]


def test_a_kernel_of_the_users_own_is_refused_before_any_data_is_read():
    """With restarts, a FeatureKernel of the user's own is refused before any pass over the data: refused
    at the first initialisation, a streamed fit would have read its 20 chunks three times (moments,
    target moments, the restarts' sample) and set the noise variance (0.3 -> 0.01) first."""
    from alacarte import FeatureKernel

    class Linear(FeatureKernel):
        def projection(self, x):
            return x @ torch.ones(x.shape[-1], self.num_samples, dtype=x.dtype)

    x, y = toy_data()
    reads = []

    class Chunks:
        def __iter__(self):
            for start in range(0, x.shape[0], 10):
                reads.append(start)
                yield x[start : start + 10], y[start : start + 10]

    model = FeatureGP(None, None, Linear(x.shape[1], 4)).to(x.dtype)
    model.likelihood.noise = 0.3
    with pytest.raises(ValueError, match="no data-driven initialisation for Linear; use restarts=0"):
        fit(model, Chunks(), None, max_iter=2, progress=False)
    assert reads == [] and abs(model.likelihood.noise.item() - 0.3) < 1e-6
