"""Every feature kernel inherits the shared test case in kernel_cases.py."""
import copy
import unittest

import pytest
import torch

from alacarte import (
    ExactRBFGP,
    FastfoodRBFKernel,
    FSARDKernel,
    FSGBARDKernel,
    PiecewiseLinearRadialKernel,
    RandomFourierKernel,
    SSGPRKernel,
)
from kernel_cases import FeatureKernelTestCase, rbf_kernel


class TestFastfoodRBFKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = FastfoodRBFKernel

    def test_no_learnable_spectrum(self):
        names = {name for name, _ in self.make_kernel(3).named_parameters()}
        self.assertEqual(names, {"raw_outputscale", "raw_lengthscale"})

    def test_rejects_unknown_strategy(self):
        with self.assertRaisesRegex(ValueError, "strategy"):
            self.make_kernel(3, strategy="gpu")


class TestFSARDKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = FSARDKernel
    widens = False

    def test_radii_are_learnable_and_positive(self):
        kernel = self.make_kernel(3)
        names = {name for name, _ in kernel.named_parameters()}
        self.assertIn("raw_radius", names)
        self.assertTrue((kernel.radius > 0).all())
        kernel.radius = torch.full((self.num_samples,), 2.0)
        self.assertAllClose(kernel.radius.detach(), torch.full((self.num_samples,), 2.0))


class TestFSGBARDKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = FSGBARDKernel
    redraws = False
    widens = False

    def test_equals_fsard_at_initialisation(self):
        x = torch.randn(10, 3)
        self.assertTrue(torch.equal(FSARDKernel(3, 32, seed=4).features(x), FSGBARDKernel(3, 32, seed=4).features(x)))


class TestRandomFourierKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = RandomFourierKernel


class TestSSGPRKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = SSGPRKernel
    supports_ard = False
    redraws = False
    widens = False

    def make_ard_kernel(self, num_dims, num_samples, lengthscale):
        return self.make_kernel(num_dims, num_samples, lengthscale=lengthscale)

    def test_rejects_bad_lengthscale(self):
        with self.assertRaisesRegex(ValueError, "lengthscale"):
            self.make_kernel(3, lengthscale=-1.0)
        with self.assertRaisesRegex(ValueError, "lengthscale"):
            self.make_kernel(3, lengthscale=torch.ones(2))
        # ∞ would give all-zero frequencies (a constant kernel) and 1e-40 in float32 infinite ones (NaN features).
        for bad in (float("inf"), 1e-40, float("nan")):
            with self.assertRaisesRegex(ValueError, "lengthscale must be positive and finite"):
                self.make_kernel(3, lengthscale=bad)


def test_fastfood_matches_gpytorch_rbf_in_expectation():
    """Against GPyTorch's own RBFKernel: the Fastfood expansion of a learnt state."""
    import gpytorch

    x = torch.randn(100, 4, dtype=torch.float64)
    ref = gpytorch.kernels.RBFKernel(ard_num_dims=4).double()
    ref.lengthscale = torch.tensor([0.5, 1.0, 1.5, 2.0])
    ours = FastfoodRBFKernel(4, 8192, ard_num_dims=4, seed=1).double()
    ours.lengthscale = ref.lengthscale.detach()
    err = (ours(x).to_dense() - ref(x).to_dense()).abs().max().item()
    assert err < 0.05
    assert torch.allclose(ref(x).to_dense(), rbf_kernel(x, x, ref.lengthscale, 1.0))


def test_a_constraint_that_excludes_the_starting_value_is_refused():
    """Out of its constraint a starting value inverts to a NaN raw parameter (NaN features, silently)."""
    from gpytorch.constraints import GreaterThan, Interval

    from alacarte import PiecewiseLinearRadialKernel, SpectralMixtureFastfoodKernel

    cases = [
        (lambda: FSARDKernel(3, 64, seed=0, radius_constraint=Interval(0.5, 2.0)), "radius"),
        (lambda: FastfoodRBFKernel(3, 64, seed=0, outputscale_constraint=GreaterThan(2.0)), "outputscale"),
        (lambda: SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0,
                                               weights_constraint=Interval(0.6, 1.0)), "weights"),
        (lambda: PiecewiseLinearRadialKernel(3, 8, num_components=2, seed=0,
                                             modes_constraint=GreaterThan(1e3)), "modes"),
    ]
    for build, name in cases:
        try:
            build()
        except ValueError as err:
            assert f"excludes the starting value of {name}" in str(err)
        else:
            raise AssertionError(f"{name}: a constraint excluding the starting value was accepted")
    # A constraint that holds the start is fine and gives finite features.
    kernel = FSARDKernel(3, 64, seed=0, outputscale_constraint=Interval(0.1, 10.0)).double()
    assert torch.isfinite(kernel.features(torch.randn(5, 3, dtype=torch.float64))).all()


def test_a_copy_of_x1_as_x2_gets_its_own_gradient():
    """Equal values in distinct tensors are not the same input when gradients flow (finite differences)."""
    kernel = FSARDKernel(3, 32, ard_num_dims=3, seed=0).double()
    x1 = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    kernel(x1, x2).to_dense().sum().backward()
    assert x2.grad is not None
    # d/dx1 of Σ k(x1, c) with c a constant copy of x1, against central differences.
    constant = x1.detach().clone()
    assert torch.autograd.gradcheck(lambda x: kernel(x, constant).to_dense().sum(), (x1,),
                                    eps=1e-6, atol=1e-8, rtol=1e-6)


def test_a_weight_that_underflowed_to_zero_has_a_finite_gradient():
    """softplus(−110) is 0 in float32; √0 has an infinite slope and ∞·0 would make the raw gradient NaN."""
    from alacarte import SpectralMixtureFastfoodKernel

    x = torch.randn(20, 3)
    mixture = SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0)
    with torch.no_grad():
        mixture.raw_weights[0] = -110.0
    assert mixture.weights[0] == 0
    mixture.features(x).square().sum().backward()
    assert torch.isfinite(mixture.raw_weights.grad).all() and mixture.raw_weights.grad[0] == 0
    single = FSARDKernel(3, 8, seed=0)
    with torch.no_grad():
        single.raw_outputscale.fill_(-110.0)
    single.features(x).square().sum().backward()
    assert torch.isfinite(single.raw_outputscale.grad).all()


def test_diag_of_equal_inputs_checks_them_too():
    """k(x, diag=True) returns σ_f² without features, so nothing else would refuse inputs of 7 columns
    for a 3-input kernel, or float64 inputs to a float32 kernel (a float32 result), as k(x) does."""
    kernel = FastfoodRBFKernel(3, 8, seed=0)
    with pytest.raises(ValueError, match="built for 3 input dimensions, got 7"):
        kernel(torch.randn(5, 7), diag=True)
    with pytest.raises(ValueError, match="inputs are torch.float64 and the kernel torch.float32"):
        kernel(torch.randn(5, 3, dtype=torch.float64), diag=True)


def test_inputs_of_another_dtype_than_the_kernel_are_a_clear_error():
    """Unchecked, GM, PWL, SSGPR and RKS fail inside a matmul and the Fastfood ones silently mix dtypes."""
    from alacarte import SpectralMixtureFastfoodKernel

    x = torch.randn(5, 3, dtype=torch.float64)
    for kernel in (SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0), SSGPRKernel(3, 8, seed=0),
                   FastfoodRBFKernel(3, 8, seed=0)):
        try:
            kernel.features(x)
        except ValueError as err:
            assert "inputs are torch.float64 and the kernel torch.float32" in str(err)
        else:
            raise AssertionError(f"{type(kernel).__name__} took float64 inputs")
        assert kernel.double().features(x).dtype == torch.float64


def test_inputs_whose_batch_does_not_broadcast_with_the_kernels_are_a_clear_error():
    """(3, 10, 3) inputs to a kernel of batch_shape (2,): a ValueError, not a RuntimeError from inside a projection."""
    from alacarte import SpectralMixtureFastfoodKernel

    for kernel in (SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0, batch_shape=torch.Size([2])),
                   FastfoodRBFKernel(3, 8, seed=0, batch_shape=torch.Size([2]))):
        with pytest.raises(ValueError, match=r"inputs of batch shape \(3,\) do not broadcast with the kernel's "
                                             r"batch_shape \(2,\)"):
            kernel(torch.randn(3, 10, 3)).to_dense()
        with pytest.raises(ValueError, match="do not broadcast"):
            kernel(torch.randn(3, 10, 3), diag=True)
        assert kernel(torch.randn(1, 10, 3)).to_dense().shape == (2, 10, 10)


def test_zero_rows_on_the_fwht_path():
    """GPyTorch's kernels take inputs of 0 rows, and so does the default (FWHT) path above d = 512."""
    kernel = FastfoodRBFKernel(600, 8, seed=0).double()
    empty, x = torch.zeros(0, 600, dtype=torch.float64), torch.randn(4, 600, dtype=torch.float64)
    assert kernel(empty, x).to_dense().shape == (0, 4)
    assert kernel(x, empty).to_dense().shape == (4, 0)
    assert kernel.features(empty).shape == (0, 16)


def test_simplex_kernels_are_stationary():
    """simplex=True drops GPyTorch's raw_lengthscale, and GPyTorch's is_stationary is has_lengthscale."""
    assert FSARDKernel(3, 8, ard_num_dims=3, simplex=True, seed=0).is_stationary


LENGTHSCALE_MODELS = {
    "fsard": lambda: FSARDKernel(4, 64, ard_num_dims=4, seed=0),
    "fastfood-rbf": lambda: FastfoodRBFKernel(4, 64, seed=0),
    "random-fourier": lambda: RandomFourierKernel(4, 64, ard_num_dims=4, seed=0),
    "pwl": lambda: PiecewiseLinearRadialKernel(4, 64, ard_num_dims=4, seed=0),
    "exact-ard": lambda: ExactRBFGP(None, None, num_dims=4, ard=True).covar_module.base_kernel,
}


@pytest.mark.parametrize("name", sorted(LENGTHSCALE_MODELS))
def test_lengthscales_are_stored_as_their_logarithm(name):
    kernel = LENGTHSCALE_MODELS[name]()
    kernel.lengthscale = torch.tensor([0.5, 2.0, 40.0, 3e4])[: kernel.raw_lengthscale.shape[-1]]
    torch.testing.assert_close(kernel.raw_lengthscale, kernel.lengthscale.detach().log(), rtol=1e-12, atol=0)


def test_a_users_lengthscale_constraint_replaces_the_logarithm():
    import gpytorch

    constraint = gpytorch.constraints.Interval(0.1, 2.0)
    kernel = FSARDKernel(4, 64, ard_num_dims=4, seed=0, lengthscale_constraint=constraint)
    kernel.lengthscale = 1.0
    # the interval's scaled sigmoid: raw −0.105 for ℓ = 1, where log ℓ would be 0
    torch.testing.assert_close(kernel.raw_lengthscale, constraint.inverse_transform(torch.ones(1, 4)))
    assert float(kernel.raw_lengthscale[0, 0]) < -0.1


def test_a_fit_switches_off_an_unused_input_within_its_budget(single_thread):
    """Only x₀ matters: in 30 L-BFGS iterations FSARD's other lengthscales reach over 200 times x₀'s.
    Under GPyTorch's softplus they end near 20 (about 45 times x₀'s), the fit's budget spent climbing."""
    import alacarte as ac
    from alacarte.factory import make_model

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(300, 4, generator=generator, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(300, generator=generator, dtype=torch.float64)
    model = make_model("fsard", 4, num_samples=128, seed=0).double()
    ac.fit(model, x, y, max_iter=30, restarts=0, seed=0, progress=False, validation_fraction=0)
    lengthscale = model.covar_module.lengthscale.detach().flatten()
    assert lengthscale[1:].min() > 200 * lengthscale[0]


def test_lengthscale_options_of_kernels_without_one_are_refused():
    """GM and SSGPR have no lengthscale: GPyTorch's Kernel drops a lengthscale prior or constraint silently
    (named_priors() empty, the fit unregularised), where a prior on a missing outputscale is refused."""
    import gpytorch

    from alacarte import SpectralMixtureFastfoodKernel

    builds = (lambda **kw: SSGPRKernel(3, 8, seed=0, **kw),
              lambda **kw: SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0, **kw))
    for build in builds:
        for key, value in (("lengthscale_prior", gpytorch.priors.GammaPrior(3.0, 6.0)),
                           ("lengthscale_constraint", gpytorch.constraints.Interval(0.1, 2.0))):
            with pytest.raises(ValueError, match=f"has no lengthscale: {key} would be ignored"):
                build(**{key: value})
        # Setting one is a ValueError, not an AttributeError about raw_lengthscale_constraint.
        with pytest.raises(ValueError, match="has no lengthscale"):
            build().lengthscale = 0.5


def test_misspelt_keyword_arguments_are_refused():
    """GPyTorch's Kernel takes **kwargs and drops what it does not read: FSARDKernel(..., outputscale_priors=p)
    built a kernel with no prior (named_priors() empty, the fit unregularised) without a word."""
    import gpytorch

    from alacarte import PiecewiseLinearRadialKernel, SpectralMixtureFastfoodKernel

    prior = gpytorch.priors.GammaPrior(2.0, 3.0)
    builds = (lambda **kw: FSARDKernel(3, 8, ard_num_dims=3, seed=0, **kw),
              lambda **kw: RandomFourierKernel(3, 8, seed=0, **kw),
              lambda **kw: SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0, **kw),
              lambda **kw: PiecewiseLinearRadialKernel(3, 8, num_components=2, seed=0, **kw))
    for build in builds:
        for key in ("outputscale_priors", "lenghtscale_prior", "noise_prior"):
            with pytest.raises(ValueError, match=f"unexpected keyword arguments \\['{key}'\\]"):
                build(**{key: prior})
    # GPyTorch's own options still pass.
    kernel = FSARDKernel(3, 8, seed=0, ard_num_dims=3, batch_shape=torch.Size([2]), lengthscale_prior=prior)
    assert [name for name, *_ in kernel.named_priors()] == ["lengthscale_prior"]


def test_ard_num_dims_other_than_the_input_width_is_refused():
    """ard_num_dims=1 with num_dims=3 is no isotropic kernel: GPyTorch reads ard_num_dims as the input width,
    so every kernel(x), and so fit(), would raise its RuntimeError 'Expected the input to have 1
    dimensionality'.  Isotropic is ard_num_dims=None."""
    from alacarte import SpectralMixtureFastfoodKernel

    builds = (lambda **kw: FSARDKernel(3, 8, seed=0, **kw), lambda **kw: RandomFourierKernel(3, 8, seed=0, **kw),
              lambda **kw: SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0, **kw))
    x = torch.randn(5, 3)
    for build in builds:
        for bad in (1, 2, 4):
            with pytest.raises(ValueError, match=f"ard_num_dims must be num_dims=3 .* or None .*, got {bad}"):
                build(ard_num_dims=bad)
        for good in (3, None):
            assert build(ard_num_dims=good)(x).to_dense().shape == (5, 5)
    assert FSARDKernel(1, 8, ard_num_dims=1, seed=0)(torch.randn(5, 1)).to_dense().shape == (5, 5)


def test_active_dims_of_another_count_than_num_dims_are_refused():
    """FSARDKernel(3, 8, active_dims=[0, 1]) is refused when built: else every call on 6-column inputs
    would fail with 'built for 3 input dimensions, got 2' (or GPyTorch's RuntimeError with ard_num_dims=3)."""
    for kwargs in ({}, {"ard_num_dims": 3}):
        with pytest.raises(ValueError, match=r"active_dims selects 2 inputs \(\[0, 1\]\), but num_dims=3"):
            FSARDKernel(3, 8, active_dims=[0, 1], seed=0, **kwargs)
    x = torch.randn(5, 6)
    kernel = FSARDKernel(3, 8, active_dims=[4, 0, 2], seed=0)
    assert torch.equal(kernel(x).to_dense(), kernel.features(x) @ kernel.features(x).T)


def test_wrappers_that_ask_for_last_dim_is_batch_are_named_in_the_refusal():
    """GridInterpolationKernel(FastfoodRBFKernel(...)) asks for last_dim_is_batch, a flag the user never
    passed (GPyTorch's GridKernel passes it, for one 1-d kernel per input column): the refusal names the wrapper."""
    import gpytorch

    x = torch.rand(10, 2)
    wrapped = gpytorch.kernels.GridInterpolationKernel(FastfoodRBFKernel(2, 16, seed=0), grid_size=8, num_dims=2)
    with pytest.raises(ValueError, match="last_dim_is_batch .* GridInterpolationKernel"):
        wrapped(x).to_dense()


def test_fourier_features_take_a_zero_dimensional_scale():
    """fourier_features(proj, torch.tensor(0.5)) works, as its docstring takes any scale broadcastable to
    (..., n, 1) (reading scale.shape[-1] of a 0-d tensor would be an IndexError)."""
    from alacarte.features.fourier import fourier_features

    proj = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    expected = 0.7 * torch.cat([proj.cos(), proj.sin()], -1)
    assert torch.allclose(fourier_features(proj, scale), expected, rtol=1e-15, atol=0)
    assert torch.autograd.gradcheck(fourier_features, (proj, scale))


def test_batch_indices_beyond_the_kernels_batch_shape():
    """k(x) for inputs of batch shape (3, 1) and a kernel of batch_shape (2,) is (3, 2, n, n); GPyTorch's lazy
    kernel tensor indexed [:, 1] indexes the kernel with (:, 1), which for GM would reach the component dimension
    of every parameter (0.6 off, silently) and for PWL fail with a RuntimeError."""
    from alacarte import PiecewiseLinearRadialKernel, SpectralMixtureFastfoodKernel

    batch = torch.Size([2])
    x = torch.randn(3, 1, 5, 3, dtype=torch.float64)
    for kernel in (SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0, batch_shape=batch),
                   PiecewiseLinearRadialKernel(3, 8, num_components=2, ard_num_dims=3, seed=0, batch_shape=batch),
                   FSARDKernel(3, 8, ard_num_dims=3, seed=0, batch_shape=batch)):
        kernel = kernel.double()
        with torch.no_grad():
            for param in kernel.parameters():
                param.add_(0.3 * torch.randn_like(param))
        full = kernel(x).to_dense()
        for index in ((slice(None), 1), (2, 0), (1,)):  # linear_operator pads (1,) to (1, :)
            assert torch.allclose(kernel(x)[index].to_dense(), full[index], rtol=1e-12, atol=1e-14)
        with pytest.raises(IndexError, match=r"2 indices for a kernel of batch_shape \(2,\)"):
            kernel[:, 1]
        assert torch.allclose(kernel[1](x[0]).to_dense(), full[0, 1], rtol=1e-12, atol=1e-14)


def _cpu_has_half_matmul() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.half) @ torch.ones(2, 2, dtype=torch.half)
    except RuntimeError:  # torch 2.1: "addmm_impl_cpu_" not implemented for 'Half'
        return False
    return True


@pytest.mark.skipif(not _cpu_has_half_matmul(), reason="this torch has no float16 matrix product on the CPU")
def test_half_precision_kernels_keep_their_signal_variance():
    """Feature weights √(σ_f²/M) clamped at the dtype's smallest normal would be wrong in float16, where
    σ_f²/M = 0.1/4096 is subnormal: the clamp would raise it and k(x, x) from the features would be 0.25
    where σ_f² = 0.1 (and k(x, diag=True) says 0.1); likewise a mixture weight of 0.1 over 2048 frequencies."""
    from alacarte import SpectralMixtureFastfoodKernel

    x = torch.randn(6, 3, dtype=torch.float64)
    rff = RandomFourierKernel(3, 4096, seed=0).double()
    rff.outputscale = 0.1
    mixture = SpectralMixtureFastfoodKernel(3, 4096, num_components=2, seed=0).double()
    mixture.weights = torch.tensor([0.1, 0.3])
    for kernel in (rff, mixture):
        exact = kernel(x).to_dense()
        half = copy.deepcopy(kernel).half()(x.half()).to_dense().double()
        assert (half - exact).abs().max() < 2e-3, (half - exact).abs().max()


def test_features_select_the_active_dims_as_the_kernel_does():
    """kernel(x) takes the active_dims columns, and so must kernel.features(x): fed every column of x, the
    feature map's ΦΦᵀ for active_dims=[1, 0] is 0.51 away from kernel(x), silently; for [4, 0, 2] and 6
    columns it is a ValueError about the width."""
    x = torch.randn(5, 6, dtype=torch.float64)
    for dims in ([1, 0], [4, 0, 2]):
        kernel = FSARDKernel(len(dims), 8, ard_num_dims=len(dims), active_dims=dims, seed=0).double()
        kernel.lengthscale = torch.linspace(0.5, 2.0, len(dims))
        inputs = x[:, :2] if dims == [1, 0] else x
        phi = kernel.features(inputs)
        assert torch.allclose(phi @ phi.T, kernel(inputs).to_dense(), rtol=1e-12, atol=1e-14)
        kernel.active_dims = None
        assert torch.equal(phi, kernel.features(inputs[:, dims]))


def test_features_of_too_few_columns_for_the_active_dims_are_a_value_error():
    """features() of inputs narrower than its active_dims reach is the ValueError its Raises promise for the
    width, not torch's RuntimeError 'INDICES element is out of DATA bounds, id=4 axis_dim=3'."""
    kernel = FSARDKernel(2, 8, active_dims=[4, 0], seed=0).double()
    with pytest.raises(ValueError, match=r"reads columns \[4, 0\] \(active_dims\), but x has 3"):
        kernel.features(torch.randn(5, 3, dtype=torch.float64))
    assert kernel.features(torch.randn(5, 5, dtype=torch.float64)).shape == (5, 16)


def test_every_kernel_prints_its_size():
    """print(kernel) shows d and M for every kernel, not only the constraints."""
    from alacarte import SpectralMixtureFastfoodKernel

    assert "num_dims=3, num_samples=8\n" in repr(FSARDKernel(3, 8, seed=0))
    assert "num_dims=3, num_samples=8\n" in repr(SSGPRKernel(3, 8, seed=0))
    assert "num_dims=3, num_samples=8, num_components=2\n" in repr(
        SpectralMixtureFastfoodKernel(3, 8, num_components=2, seed=0))


def test_indexing_and_expanding_a_batch_kernel_keep_its_active_dims():
    """GPyTorch's Kernel.__getitem__ indexes every buffer, active_dims too: kernel[1] of a kernel with
    active_dims [4, 0, 2] and batch_shape (2,) would get active_dims tensor(0) ('built for 3 input dimensions,
    got 1'; GPyTorch's RBFKernel keeps column 0 silently); expand_batch would make them a (3, 3) matrix."""
    from alacarte import SpectralMixtureFastfoodKernel

    x = torch.randn(5, 6, dtype=torch.float64)
    for kernel in (FSARDKernel(3, 8, active_dims=[4, 0, 2], seed=0, batch_shape=torch.Size([2])),
                   SSGPRKernel(3, 8, active_dims=[4, 0, 2], seed=0, batch_shape=torch.Size([2])),
                   SpectralMixtureFastfoodKernel(3, 8, num_components=2, active_dims=[4, 0, 2], seed=0,
                                                 batch_shape=torch.Size([2]))):
        kernel = kernel.double()
        with torch.no_grad():
            for param in kernel.parameters():
                param.add_(0.3 * torch.randn_like(param))
        full = kernel(x).to_dense()
        assert kernel[1].active_dims.tolist() == [4, 0, 2] and kernel[1].batch_shape == torch.Size([])
        assert torch.allclose(kernel[1](x).to_dense(), full[1], rtol=1e-12, atol=1e-14)
        expanded = kernel.expand_batch(3, 2)
        assert expanded.active_dims.tolist() == [4, 0, 2] and kernel.active_dims.tolist() == [4, 0, 2]
        assert torch.allclose(expanded(x).to_dense(), full.expand(3, 2, 5, 5), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("strategy", ["dense", "fwht"])
def test_hessian_vector_product_in_the_radii(strategy):
    """Second derivatives through the Fastfood projection are right (a wrong double backward is off by Hv's
    own size, silently)."""
    kernel = FSARDKernel(3, 8, seed=0, strategy=strategy).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    raw = kernel.raw_radius

    def gradient():
        return torch.autograd.grad(kernel.features(x).sin().sum(), raw, create_graph=True)[0]

    v = torch.randn_like(raw)
    hv = torch.autograd.grad((gradient() * v).sum(), raw)[0]
    eps = 1e-6
    with torch.no_grad():
        raw.add_(eps * v)
    plus = gradient().detach()
    with torch.no_grad():
        raw.sub_(2 * eps * v)
    minus = gradient().detach()
    assert torch.allclose(hv, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)
