"""Simplex-ARD kernels, the simplex step, and selection by a simplex-ARD GP."""
import contextlib
import copy
import math
import unittest

import numpy as np
import pytest
import torch

import alacarte as ac
from kernel_cases import FeatureKernelTestCase
from selection_cases import built_with, exhaustive_projection, two_sines, two_sines_mean


# -- simplex-ARD kernels: the shared kernel tests, with ℓ = 1/γ -----------------------------
class SimplexCase(FeatureKernelTestCase):
    """Every shared test on the simplex variant; an ARD lengthscale ℓ maps to γ = 1/ℓ = c·π."""

    def make_kernel(self, num_dims, num_samples=None, **kwargs):
        kwargs.pop("ard_num_dims", None)
        kwargs.setdefault("seed", 3)
        m = self.num_samples if num_samples is None else num_samples
        return self.kernel_class(num_dims, m, ard_num_dims=num_dims, simplex=True, **kwargs)

    def test_lengthscale_reads_and_writes_through_the_simplex(self):
        kernel = self.make_kernel(4).double()
        kernel.lengthscale = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
        gamma = torch.tensor([2.0, 1.0, 0.5, 0.25], dtype=torch.float64)
        self.assertAllClose(kernel.simplex_size.detach().reshape(()), gamma.sum(), rtol=1e-12, atol=0)
        self.assertAllClose(kernel.relevance, gamma / gamma.sum(), rtol=1e-12, atol=0)
        self.assertAllClose(kernel.lengthscale.detach().reshape(-1), 1 / gamma, rtol=1e-12, atol=0)

    def test_zero_weight_removes_the_input_exactly(self):
        kernel = self.make_kernel(3).double()
        with torch.no_grad():
            kernel.simplex_weights.copy_(torch.tensor([[0.6, 0.0, 0.4]]))
        x = torch.randn(8, 3, dtype=torch.float64)
        x2 = x.clone()
        x2[:, 1] = torch.randn(8, dtype=torch.float64) * 100
        self.assertTrue(torch.equal(kernel.features(x), kernel.features(x2)))
        self.assertEqual(kernel.selected().tolist(), [0, 2])
        self.assertTrue(torch.isinf(kernel.lengthscale[..., 1]).all())

    def test_project_restores_the_simplex(self):
        kernel = self.make_kernel(5).double()
        with torch.no_grad():
            kernel.simplex_weights.add_(torch.randn(1, 5, dtype=torch.float64))
        kernel.project_()
        w = kernel.simplex_weights.detach()
        self.assertTrue(bool((w >= 0).all()))
        self.assertLessEqual(abs(float(w.sum()) - 1.0), 1e-14)

    def test_fixed_simplex_size(self):
        kernel = self.make_kernel(3, simplex_size=2.5, learn_simplex_size=False)
        self.assertFalse(kernel.raw_simplex_size.requires_grad)
        kernel.lengthscale = torch.tensor([1.0, 2.0, 4.0])  # keeps c, sets the direction π
        self.assertAlmostEqual(float(kernel.simplex_size), 2.5, places=6)
        self.assertAllClose(kernel.relevance, torch.tensor([4.0, 2.0, 1.0]) / 7.0, rtol=1e-6, atol=0)

    def test_gradients_reach_every_parameter(self):
        # As the shared test, but from a π off the uniform point (which is a critical point
        # of some test functions) — and π gets a gradient like every other parameter.
        kernel = self.make_kernel(3).double()
        with torch.no_grad():
            kernel.simplex_weights.copy_(torch.tensor([[0.5, 0.3, 0.2]]))
        kernel.features(torch.randn(15, 3, dtype=torch.float64)).pow(2).sin().sum().backward()
        for name, param in kernel.named_parameters():
            self.assertIsNotNone(param.grad, name)
            self.assertGreater(param.grad.abs().max().item(), 0.0, name)


class TestSimplexFSARDKernel(SimplexCase, unittest.TestCase):
    kernel_class = ac.FSARDKernel
    widens = False


class TestSimplexFastfoodRBFKernel(SimplexCase, unittest.TestCase):
    kernel_class = ac.FastfoodRBFKernel


class TestSimplexRandomFourierKernel(SimplexCase, unittest.TestCase):
    kernel_class = ac.RandomFourierKernel


def test_simplex_needs_ard_lengthscales():
    with pytest.raises(ValueError, match="ard_num_dims"):
        ac.FSARDKernel(3, 8, simplex=True)
    with pytest.raises(ValueError, match="does not have"):
        ac.SSGPRKernel(3, 8, simplex=True)
    with pytest.raises(ValueError, match="does not have"):
        ac.SpectralMixtureFastfoodKernel(3, 8, num_components=2, simplex=True)
    with pytest.raises(ValueError, match="only with simplex=True"):
        ac.FSARDKernel(3, 8, ard_num_dims=3, simplex_size=2.0)
    with pytest.raises(ValueError, match="simplex_size"):
        ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=True, simplex_size=-1.0)


def test_simplex_lengthscale_setter_takes_what_the_plain_one_takes():
    per_batch = torch.tensor([[0.5, 1.0, 2.0], [1.0, 1.0, 4.0]], dtype=torch.float64)
    for simplex in (False, True):
        kernel = ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=simplex, batch_shape=torch.Size([2]), seed=0).double()
        kernel.lengthscale = per_batch
        assert torch.allclose(kernel.lengthscale.reshape(2, 3), per_batch, rtol=1e-12)
        for bad in ([1.0, 2.0], per_batch.t()):
            with pytest.raises(ValueError, match="does not broadcast"):
                kernel.lengthscale = bad


def test_pwl_and_fsgbard_take_the_simplex_option():
    x = torch.randn(6, 4, dtype=torch.float64)
    for kernel in (ac.PiecewiseLinearRadialKernel(4, 16, num_components=2, ard_num_dims=4, simplex=True, seed=0),
                   ac.FSGBARDKernel(4, 16, ard_num_dims=4, simplex=True, seed=0)):
        kernel = kernel.double()
        with torch.no_grad():
            kernel.simplex_weights.copy_(torch.tensor([[0.5, 0.0, 0.5, 0.0]]))
        x2 = x.clone()
        x2[:, [1, 3]] = 7.0
        assert torch.equal(kernel.features(x), kernel.features(x2))


def test_relevance_of_plain_kernels_and_the_bar_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from alacarte.plotting import plot_relevance, save_kernel_figure

    plain = ac.FSARDKernel(3, 8, ard_num_dims=3, seed=0)
    plain.lengthscale = torch.tensor([1.0, 2.0, 4.0])
    assert torch.allclose(plain.relevance, torch.tensor([4.0, 2.0, 1.0]) / 7, atol=1e-6)
    simplex = ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=True, seed=0)
    with torch.no_grad():
        simplex.simplex_weights.copy_(torch.tensor([[0.25, 0.0, 0.75]]))
    bars = plot_relevance(simplex).patches
    assert [b.get_height() for b in bars] == pytest.approx([0.25, 0.0, 0.75])
    assert save_kernel_figure(simplex, tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"
    # Several feature draws: bars at their mean, one dot per draw and input.
    draws = np.array([[0.25, 0.0, 0.75], [0.5, 0.1, 0.4]])
    ax = plot_relevance(simplex, draws=draws)
    assert [b.get_height() for b in ax.patches] == pytest.approx([0.375, 0.05, 0.575])
    assert sorted(map(tuple, ax.collections[0].get_offsets().tolist())) == sorted(
        (j, v) for row in draws.tolist() for j, v in enumerate(row))
    with pytest.raises(ValueError, match=r"draws must have shape \(K, 3\)"):
        plot_relevance(simplex, draws=draws[:, :2])


def fit_simplex_gp(x, y, num_samples, seed=0):
    """A simplex-FSARD GP with a fixed, binding budget c = 1.5, trained by fit(); π checked on Δ."""
    d = x.shape[1]
    kernel = ac.FSARDKernel(d, num_samples, ard_num_dims=d, simplex=True, simplex_size=1.5,
                            learn_simplex_size=False, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=40, restarts=1, restart_iter=5, progress=False)
    pi = kernel.simplex_weights.detach()
    assert bool((pi >= 0).all()) and abs(float(pi.sum()) - 1.0) <= 1e-12
    return model, kernel


@pytest.mark.parametrize("seed", [0, 5])
def test_a_simplex_gp_puts_its_weight_on_the_relevant_inputs_and_exact_zeros_elsewhere(seed, single_thread):
    """Trained by fit(), a simplex-FSARD GP on y = sin(2x₂) + cos(2x₇) (10 inputs) keeps π on
    the simplex to 1e-12, puts ≥ 99% of it on the two relevant inputs, and exactly zero
    on at least 3 of the 8 irrelevant ones.

    Measured over 6 feature draws (seeds 0–5, D = 64, c = 1.5, 40 iterations): the relevant
    mass was 0.9986, 0.9987, 0.9974, 0.9968, 0.9906, 0.9983; the exact zeros 5, 3, 1, 1, 3, 5
    of 8 (150 iterations: 6, 2, 1, 3, 3, 4). The rest keep small weights at a stationary
    point (their gradient equals the simplex's multiplier), so the exact set came out in none.
    The test pins the two draws with the most zeros; the others would fail its zero count.
    One thread: the count of exact zeros can depend on the round-off of threaded BLAS.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 10))
    y = np.sin(2 * x[:, 1]) + np.cos(2 * x[:, 6]) + 0.05 * rng.standard_normal(600)
    model, kernel = fit_simplex_gp(x, y, num_samples=32, seed=seed)
    pi = kernel.simplex_weights.detach().ravel()
    assert float(pi[[1, 6]].sum()) >= 0.99
    assert int((pi == 0).sum()) >= 3
    assert model.predict(x[:50]).mean.sub(torch.as_tensor(y[:50])).pow(2).mean() < 0.1


@pytest.mark.slow
def test_a_simplex_gp_selects_the_relevant_inputs_of_se2():
    """After fit(), π is on the simplex, the 5 relevant inputs of SE2 are in and
    almost all of the 95 irrelevant ones weigh exactly zero.

    The simplex size c is fixed and small enough to bind (the SRFF setting): with c
    learnable, γ = c·π ranges over the whole positive orthant, and with a c larger
    than the likelihood wants, the surplus has to go somewhere — onto irrelevant
    inputs.  Measured (n = 600, 40 iterations): 7 of 95 irrelevant inputs kept a
    small weight; exact recovery of the set needs a longer run (see
    experiments/results/selection.md).
    """
    from alacarte.datasets import make_se2

    x, y, relevant = make_se2(600, seed=0)
    _, kernel = fit_simplex_gp(x, y, num_samples=64)
    selected = set(kernel.selected().tolist())
    assert set(relevant) <= selected
    assert len(selected - set(relevant)) <= 10  # ≥ 85 of the 95 irrelevant inputs exactly zero


def test_simplex_step_descends_to_the_constrained_minimiser():
    """On f(π) = ½‖A(π − v)‖², every accepted step decreases f and the steps reach the
    minimiser over the simplex (checked against the exhaustive KKT solve for A = I)."""
    from alacarte.selection import SimplexStep

    kernel = ac.FSARDKernel(6, 8, ard_num_dims=6, simplex=True, seed=0).double()
    v = torch.tensor([0.9, -0.2, 0.4, 0.05, 0.3, -1.0], dtype=torch.float64)
    objective = lambda: 0.5 * ((kernel.simplex_weights.squeeze(0) - v) ** 2).sum()  # noqa: E731
    step = SimplexStep(kernel, step_size=10.0)  # too long at first: backtracking must cut it
    values = [objective().item()]
    for _ in range(30):
        values.append(step.step(objective, steps=1))
    assert all(b <= a for a, b in zip(values, values[1:]))
    expected = exhaustive_projection(v.numpy(), 1.0)
    assert np.allclose(kernel.simplex_weights.detach().numpy().ravel(), expected, atol=1e-12)


def test_simplex_step_extrapolates_with_the_previous_momentum():
    """Beck & Teboulle: after the k-th accepted step the extrapolation weight is
    (t_k − 1)/t_{k+1}, t_1 = 1 — so the step after the first has no momentum at all."""
    from alacarte.selection import SimplexStep

    kernel = ac.FSARDKernel(6, 8, ard_num_dims=6, simplex=True, seed=0).double()
    v = torch.tensor([0.9, -0.2, 0.4, 0.05, 0.3, -1.0], dtype=torch.float64)
    objective = lambda: 0.5 * ((kernel.simplex_weights.squeeze(0) - 3 * v) ** 2).sum()  # noqa: E731
    step = SimplexStep(kernel, step_size=0.01)  # short steps: every one is accepted
    t = 1.0
    for _ in range(4):
        step.step(objective, steps=1)
        t_next = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
        assert step.fista.extrapolation == pytest.approx((t - 1) / t_next, abs=1e-15)
        t = t_next


def test_simplex_step_survives_a_failing_objective_and_leaves_a_frozen_pi_alone():
    from alacarte.selection import SimplexStep

    kernel = ac.FSARDKernel(4, 8, ard_num_dims=4, simplex=True, seed=0).double()
    before = kernel.simplex_weights.detach().clone()
    nan_objective = lambda: kernel.simplex_weights.sum() * float("nan")  # noqa: E731
    step = SimplexStep(kernel)
    assert math.isnan(step.step(nan_objective)) and not step.moved
    assert torch.equal(kernel.simplex_weights.detach(), before)

    def broken():
        raise RuntimeError("the factorisation failed")

    step.step(broken)
    assert torch.equal(kernel.simplex_weights.detach(), before)

    kernel.simplex_weights.requires_grad_(False)
    assert not SimplexStep(kernel)
    x = torch.randn(40, 4, dtype=torch.float64)
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, torch.sin(x[:, 0]), max_iter=3, restarts=0, progress=False)
    assert torch.equal(kernel.simplex_weights.detach(), before)


def test_selected_leaves_out_weights_at_round_off():
    """A float32 fit's projections leave ~6e-9 where float64 leaves 0: by default those are not in use."""
    kernel = ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=True, seed=0)
    kernel.simplex_weights.data = torch.tensor([[0.7, 6e-9, 0.3 - 6e-9]])
    assert kernel.selected().tolist() == [0, 2]
    assert kernel.selected(0.0).tolist() == [0, 1, 2]
    kernel.double().simplex_weights.data = torch.tensor([[0.7, 1e-12, 0.3 - 1e-12]], dtype=torch.float64)
    assert kernel.selected().tolist() == [0, 1, 2]  # 1e-12 is no round-off in float64 (ε = 2.2e-16)
    wide = ac.FSARDKernel(4096, 8, ard_num_dims=4096, simplex=True, seed=0)  # uniform π = 2.4e-4 each
    assert len(wide.selected()) == 4096  # a threshold growing with d (d·ε = 4.9e-4) dropped them all


def test_a_constant_input_gets_no_simplex_weight(single_thread):
    """A constant column is zeros once centred, so its π_j gets no gradient; left free, the
    projection's shift poured into it the mass the other inputs gave up (a slack lowering their
    total below c): with c = 3 fixed, y = sin(2x₀) + x₁²/2 (4 inputs, n = 200) and a fifth,
    constant input, π of the constant input came out 0.50, the largest of all. It is held at 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4))
    y = np.sin(2 * x[:, 0]) + x[:, 1] ** 2 / 2 + 0.05 * rng.standard_normal(200)
    x = np.column_stack([x, np.full(200, 1.5)])
    kernel = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, simplex_size=3.0, learn_simplex_size=False,
                            seed=0).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=30, restarts=0, progress=False)
    pi = kernel.simplex_weights.detach().ravel()
    assert float(pi[4]) == 0.0 and abs(float(pi.sum()) - 1.0) <= 1e-12
    assert float(pi[[0, 1]].sum()) >= 0.95
    assert 4 not in kernel.selected().tolist()


@pytest.mark.parametrize("seed, draws", [(0, 0), (1, 0), (2, 0), (0, 4), (1, 4)])
def test_select_inputs_keeps_exactly_the_inputs_the_function_uses(seed, draws, single_thread):
    """y = sin(2x₀) + cos(2x₁) + noise, four more inputs it does not use: after fit() alone
    (c learnable) irrelevant inputs keep small weights; select_inputs leaves exactly {0, 1}
    with non-zero π, on every feature draw, and predicts no worse."""
    from alacarte.selection.evidence import select_inputs

    rng = np.random.default_rng(seed)
    x, y = two_sines(rng, 400, 6)
    xt = rng.standard_normal((200, 6))
    yt = torch.as_tensor(two_sines_mean(xt))
    kernel = ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=40, restarts=1, restart_iter=5, progress=False, seed=seed)
    before = float(model.predict(xt, mean_only=True).mean.sub(yt).pow(2).mean())
    result = select_inputs(model, x, y, refit_iter=20, draws=draws, seed=seed)
    pi = kernel.simplex_weights.detach().ravel()
    assert result.selected.tolist() == [0, 1]
    assert bool((pi[2:] == 0).all()) and abs(float(pi.sum()) - 1.0) <= 1e-12
    assert float(result.costs[0]) > result.threshold and float(result.costs[1]) > result.threshold
    after = float(model.predict(xt, mean_only=True).mean.sub(yt).pow(2).mean())
    assert after <= before * 1.1 and after < 0.05
    # Every input at 0 is held there, so no later fit hands it a chance weight.
    assert kernel.simplex_mask.ravel().tolist() == [True, True] + [False] * 4
    ac.fit(model, x, y, max_iter=20, restarts=0, progress=False, seed=seed)
    assert bool((kernel.simplex_weights.detach().ravel()[2:] == 0).all())


def test_input_costs_on_fresh_draws_are_the_mean_over_kernels_built_with_those_seeds(single_thread):
    """input_costs(draws=seeds) equals the mean of the costs of models whose kernels were built
    with those seeds and given the fitted parameters; the model's own draw is untouched."""
    from alacarte.selection.evidence import input_costs

    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 5))
    y = np.sin(2 * x[:, 0]) * x[:, 3] + 0.1 * rng.standard_normal(300)
    kernel = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, seed=2).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=30, restarts=0, progress=False, seed=0)
    own = input_costs(model, kernel)
    reference = []
    for seed in (11, 12):
        other = built_with(model, seed)
        reference.append(input_costs(other, other.covar_module))
    assert torch.allclose(input_costs(model, kernel, [11, 12]), (reference[0] + reference[1]) / 2, rtol=1e-9, atol=1e-9)
    assert torch.equal(input_costs(model, kernel), own)
    assert not torch.allclose(reference[0], own)


@pytest.mark.parametrize("draws", [0, 4])
def test_select_inputs_brings_back_a_relevant_input_held_at_zero(draws, single_thread):
    """y = sin(2x₀) + cos(2x₁): with x₁ held at 0 after the fit, its gradient there is 0 and no refit
    moves it; select_inputs asks the held inputs at finite weights, brings x₁ back, and ends
    with exactly {0, 1}, predicting as well as the fit that never lost x₁."""
    from alacarte.selection.evidence import entry_gains, select_inputs

    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 400, 6)
    xt = rng.standard_normal((200, 6))
    yt = torch.as_tensor(two_sines_mean(xt))
    kernel = ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=0).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=40, restarts=1, restart_iter=5, progress=False, seed=0)
    kernel.drop_inputs_([1])
    gains, values = entry_gains(model, kernel, [1, 2])
    assert float(gains[0]) > 100 and float(values[0]) > 0
    result = select_inputs(model, x, y, refit_iter=20, draws=draws, seed=0)
    assert result.selected.tolist() == [0, 1] and 1 in result.entered
    error = float(model.predict(xt, mean_only=True).mean.sub(yt).pow(2).mean())
    assert error < 0.05


def test_reentry_with_fresh_draws_is_decided_on_fresh_draws_alone(single_thread, monkeypatch):
    """With fresh draws, a held input's re-entry is what the fresh draws' mean gain says, whatever it
    gains on the fitted draw (fitted without it); with none, the fitted draw decides.  Gains are
    prescribed per draw: x₁ costs on the fitted draw and gains on fresh ones, x₂ the reverse, x₃
    gains on the first fresh draw only (below the threshold on the mean)."""
    from alacarte.selection import evidence

    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 100, 4)
    kernel = ac.FSARDKernel(4, 8, ard_num_dims=4, simplex=True, seed=0).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=3, restarts=0, progress=False)
    fitted = kernel.gauss.clone()
    seeds = evidence.fresh_seeds(kernel, 4)
    first = [None]

    def gains(model, kernel, inputs):
        if torch.equal(kernel.gauss, fitted):
            table = {1: -50.0, 2: 50.0, 3: -1.0}
        else:
            first[0] = kernel.gauss.clone() if first[0] is None else first[0]
            table = {1: 50.0, 2: -50.0, 3: 30.0 if torch.equal(kernel.gauss, first[0]) else -5.0}
        return (torch.tensor([table[j] for j in inputs], dtype=torch.float64),
                torch.full((len(inputs),), 0.5, dtype=torch.float64))

    monkeypatch.setattr(evidence, "entry_gains", gains)
    assert list(evidence._entries(model, kernel, [1, 2, 3], seeds, threshold=5.0)) == [1]
    assert list(evidence._entries(model, kernel, [1, 2, 3], [], threshold=5.0)) == [2]


def test_joint_costs_are_the_likelihood_with_those_columns_set_to_zero(single_thread):
    """Zeroing γ_j for j in S is the model at the fitted γ on inputs whose columns S are 0: the joint cost
    of a set, on the fitted draw, on fresh draws and in closed form, against that reference (a dense exact
    GP for the closed form); a set of one is the input's own cost."""
    from alacarte.selection import evidence
    from alacarte.training import negative_mll

    rng = np.random.default_rng(3)
    x = rng.standard_normal((150, 5))
    y = np.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.standard_normal(150)
    kernel = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, seed=1).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=20, restarts=0, progress=False, validation_fraction=0)
    xs, ys = model.train_inputs[0], model.train_targets

    def nll(gp, inputs, seed):
        gp.train()
        with torch.no_grad(), gp.inference_settings(), (
                gp.covar_module.redrawn(seed) if seed is not None else contextlib.nullcontext()):
            return float(negative_mll(gp, inputs, ys, backward=False))

    def reference(columns, seed=None):
        zeroed = xs.clone()
        zeroed[:, columns] = 0
        other = copy.deepcopy(model)
        other.set_train_data(zeroed, ys, strict=False)
        return (nll(other, zeroed, seed) - nll(model, xs, seed)) * len(y)

    assert evidence.joint_cost(model, kernel, [1, 2]) == pytest.approx(reference([1, 2]), rel=1e-9)
    assert evidence.joint_cost(model, kernel, [3]) == pytest.approx(float(evidence.input_costs(model, kernel)[3]),
                                                                    rel=1e-9, abs=1e-9)
    seeds = evidence.fresh_seeds(kernel, 2)
    fresh = sum(reference([1, 2], seed) for seed in seeds) / 2
    assert evidence.joint_cost(model, kernel, [1, 2], seeds) == pytest.approx(fresh, rel=1e-9)
    closed = evidence.ClosedFormEvidence(model, kernel)
    gamma = closed.gamma.clone()

    def dense(g):
        scaled = closed.x * g
        cov = closed.signal * torch.exp(-0.5 * torch.cdist(scaled, scaled).square()) + closed.noise * torch.eye(150)
        return float(0.5 * closed.residual @ torch.linalg.solve(cov, closed.residual) + 0.5 * torch.logdet(cov))

    trial = gamma.clone()
    trial[[1, 2]] = 0
    assert closed.joint_rise([1, 2]) == pytest.approx(dense(trial) - dense(gamma), rel=1e-6)
    assert closed.joint_rise([4]) == pytest.approx(closed.rise(4, 0.0), rel=1e-12)


def test_weak_inputs_that_are_worth_something_together_are_dropped_a_share_at_a_time():
    """Four weak inputs: where their joint cost is below the χ²_k threshold all go in one round; where
    x₁ and x₂ (copies) are worth 500 nats together, the cheapest half holds both, so only x₁ goes."""
    from alacarte.selection.evidence import _jointly_weak, joint_threshold

    weak = torch.tensor([False, True, True, True, True, False])
    costs = torch.tensor([50.0, -5.0, -4.0, 1.0, 2.0, 40.0])
    asked = []

    def additive(inputs):
        asked.append(list(inputs))
        return float(costs[inputs].sum())

    def copies(inputs):
        asked.append(list(inputs))
        return 500.0 if {1, 2} <= set(inputs) else float(costs[inputs].sum())

    assert _jointly_weak(weak, costs, additive, 0.05).tolist() == weak.tolist()
    assert asked == [[1, 2, 3, 4]]
    asked.clear()
    assert torch.nonzero(_jointly_weak(weak, costs, copies, 0.05)).reshape(-1).tolist() == [1]
    assert asked == [[1, 2, 3, 4], [1, 2]]
    # One input: the single-input threshold log(d/α); k irrelevant inputs: about k/2 + O(√k) nats.
    assert joint_threshold(1, 6, 0.05) == pytest.approx(math.log(6 / 0.05))
    assert 400 < joint_threshold(700, 1000, 0.05) < 500


def test_select_inputs_draws_by_default_where_the_kernel_can_and_refuses_bad_draws(single_thread, monkeypatch):
    from alacarte.selection import evidence
    from alacarte.selection.evidence import FRESH_DRAWS, select_inputs

    asked = []
    real = evidence.input_costs
    monkeypatch.setattr(evidence, "input_costs", lambda model, kernel, draws=(): asked.append(len(draws)) or
                        real(model, kernel, draws))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 3))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(60)  # noisy: no refit may end at the noise floor
    for cls, default in ((ac.FSARDKernel, FRESH_DRAWS), (ac.FSGBARDKernel, 0)):
        model = ac.FeatureGP(None, None, cls(3, 16, ard_num_dims=3, simplex=True, seed=0)).double()
        ac.fit(model, x, y, max_iter=3, restarts=0, progress=False)
        assert model.covar_module.redrawable == bool(default)
        asked.clear()
        select_inputs(model, x, y, refit_iter=2, max_rounds=1)
        assert asked and set(asked) == {default}
        for bad in (-1, "all"):
            with pytest.raises(ValueError, match="draws"):
                select_inputs(model, x, y, draws=bad)
    with pytest.raises(ValueError, match="learns its Fastfood blocks"):
        select_inputs(model, x, y, draws=2)


def test_selection_frequency_counts_each_draws_selection(single_thread):
    """Over three feature draws of the problem above, each draw's select_inputs keeps exactly {0, 1}:
    frequency 1 for those, 0 for the four unused inputs, and the stable set is {0, 1}."""
    from alacarte.selection import selection_frequency

    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 400, 6)
    built = []

    def build(seed):
        built.append(seed)
        return ac.FeatureGP(None, None, ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=seed)).double()

    found = selection_frequency(build, x, y, seeds=[3, 4, 5], max_iter=40, restarts=1, restart_iter=5)
    assert built == [3, 4, 5] and found.seeds == [3, 4, 5]
    assert [s.tolist() for s in found.selections] == [[0, 1]] * 3
    assert found.frequency.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert found.stable().tolist() == [0, 1]
    with pytest.raises(ValueError, match="seeds="):
        selection_frequency(build, x, y, seed=1)
    with pytest.raises(ValueError, match="at least one seed"):
        selection_frequency(build, x, y, seeds=[])


def test_dropped_inputs_stay_at_zero_through_a_fit(single_thread):
    """drop_inputs_ sets π_j = 0, keeps the others' γ (c learnable), and fit() never moves π_j again."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4))
    y = np.sin(2 * x[:, 2]) + 0.1 * rng.standard_normal(200)  # input 2 is the one that matters
    kernel = ac.FSARDKernel(4, 16, ard_num_dims=4, simplex=True, seed=0).double()
    gamma = kernel.inverse_lengthscale().detach().clone()
    kernel.drop_inputs_([2])
    assert float(kernel.simplex_weights.detach()[0, 2]) == 0.0
    assert torch.allclose(kernel.inverse_lengthscale().detach()[0, [0, 1, 3]], gamma[0, [0, 1, 3]], rtol=1e-12)
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=15, restarts=0, progress=False)
    assert float(kernel.simplex_weights.detach()[0, 2]) == 0.0 and kernel.selected().tolist() != []
    with pytest.raises(ValueError, match="no input"):
        kernel.drop_inputs_([0, 1, 3])
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        kernel.drop_inputs_([4])
    with pytest.raises(ValueError, match="simplex kernel"):
        ac.FSARDKernel(4, 16, ard_num_dims=4).drop_inputs_([0])


def test_select_inputs_reads_the_evidence_on_the_rows_the_fit_kept_at_the_likelihoods_band(single_thread, monkeypatch):
    """Where the fit held rows out to set the band, every cost is read on the kept rows (those of the
    fit's seeded split) at the marginal likelihood's own σ² and σ_f² there, not the band's: shuffling
    the held-out rows' targets among themselves changes neither the selection nor π.  The model ends
    on all rows, with the band the last refit set on the held-out rows."""
    from alacarte.holdout import split_rows
    from alacarte.selection import evidence

    rng = np.random.default_rng(0)
    x, y = two_sines(rng, 400, 6)
    kept, held = split_rows(400, 0.2, 1)
    read = []
    real = evidence.input_costs

    def recorded(model, kernel, draws=()):
        rows = model.train_inputs[0]
        noise, gradient = float(model.likelihood.noise), None
        model.train()
        with model.inference_settings():
            loss = ac.training.negative_mll(model, rows, model.train_targets, backward=False)
            gradient = torch.autograd.grad(loss, model.likelihood.noise_covar.raw_noise)[0]
        same_rows = torch.equal(rows, model.internal_query_inputs(torch.as_tensor(x[kept.numpy()])))
        read.append((same_rows, noise, float(gradient.abs().max())))
        return real(model, kernel, draws)

    monkeypatch.setattr(evidence, "input_costs", recorded)
    results = []
    for shuffled in (False, True):
        targets = y.copy()
        if shuffled:
            targets[held.numpy()] = targets[held.numpy()][rng.permutation(len(held))]
        model = ac.FeatureGP(None, None, ac.FSARDKernel(6, 32, ard_num_dims=6, simplex=True, seed=1)).double()
        ac.fit(model, x, targets, max_iter=40, restarts=1, restart_iter=5, progress=False, seed=1)
        band = float(model.likelihood.noise)
        read.clear()
        # (on the fitted draw: with fresh draws the point is first fitted to those, away from the optimum here)
        result = evidence.select_inputs(model, x, targets, refit_iter=20, seed=1, draws=0)
        assert read and all(same_rows and gradient < 1e-6 for same_rows, _, gradient in read)
        assert read[0][1] != pytest.approx(band, rel=1e-2)  # the likelihood's σ², not the band's
        assert model.train_inputs[0].shape[0] == 400
        results.append((result.selected.tolist(), model.covar_module.simplex_weights.detach().clone()))
    assert results[0][0] == results[1][0] == [0, 1]
    assert torch.allclose(results[0][1], results[1][1], atol=1e-6)


def test_a_failed_select_inputs_leaves_the_model_on_all_rows_with_its_band(single_thread, monkeypatch):
    """An error while the evidence is read on the kept rows restores the rows and the band the fit set."""
    from alacarte.selection import evidence

    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 4))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(300)
    model = ac.FeatureGP(None, None, ac.FSARDKernel(4, 16, ard_num_dims=4, simplex=True, seed=1)).double()
    ac.fit(model, x, y, max_iter=10, restarts=0, progress=False, seed=1)
    rows, band = model.train_inputs[0].clone(), model.likelihood.noise.detach().clone()
    scale = model.covar_module.outputscale.detach().clone()

    def failing(model, kernel, draws=()):
        assert model.train_inputs[0].shape[0] < 300  # raised while on the kept rows
        raise RuntimeError("interrupted")

    monkeypatch.setattr(evidence, "input_costs", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        evidence.select_inputs(model, x, y, seed=1)
    assert torch.equal(model.train_inputs[0], rows)
    assert torch.equal(model.likelihood.noise.detach(), band)
    assert torch.equal(model.covar_module.outputscale.detach(), scale)
