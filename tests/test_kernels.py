"""Every feature kernel inherits the shared test case in kernel_cases.py."""
import unittest

import torch

from alacarte import (
    FastfoodRBFKernel,
    FSARDKernel,
    FSGBARDKernel,
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

    def test_radii_are_learnable_and_positive(self):
        kernel = self.make_kernel(3)
        names = {name for name, _ in kernel.named_parameters()}
        self.assertIn("raw_radius", names)
        self.assertTrue((kernel.radius > 0).all())
        kernel.radius = torch.full((self.num_samples,), 2.0)
        self.assertAllClose(kernel.radius.detach(), torch.full((self.num_samples,), 2.0))


class TestFSGBARDKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = FSGBARDKernel

    def test_equals_fsard_at_initialisation(self):
        x = torch.randn(10, 3)
        self.assertTrue(torch.equal(FSARDKernel(3, 32, seed=4).features(x), FSGBARDKernel(3, 32, seed=4).features(x)))


class TestRandomFourierKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = RandomFourierKernel


class TestSSGPRKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = SSGPRKernel
    supports_ard = False

    def make_ard_kernel(self, num_dims, num_samples, lengthscale):
        return self.make_kernel(num_dims, num_samples, lengthscale=lengthscale)

    def test_rejects_bad_lengthscale(self):
        with self.assertRaisesRegex(ValueError, "lengthscale"):
            self.make_kernel(3, lengthscale=-1.0)
        with self.assertRaisesRegex(ValueError, "lengthscale"):
            self.make_kernel(3, lengthscale=torch.ones(2))


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
