"""GM kernel: the shared kernel test case, its closed form, and GPyTorch's SpectralMixtureKernel."""
import math
import unittest

import gpytorch
import pytest
import torch

from alacarte import SpectralMixtureFastfoodKernel
from alacarte.kernels.spectral_mixture import spectral_mixture_kernel
from kernel_cases import FeatureKernelTestCase


def set_random_mixture(kernel, gen):
    q, d = kernel.means.shape[-2:]
    with torch.no_grad():
        kernel.means.copy_(torch.randn(q, d, generator=gen, dtype=torch.float64))
        kernel.scales = 0.4 + torch.rand(q, d, generator=gen, dtype=torch.float64)
        weights = 0.2 + torch.rand(q, generator=gen, dtype=torch.float64)
        kernel.weights = weights / weights.sum()  # k(0) = 1, comparable with the RBF tolerance
    return kernel


class TestSpectralMixtureFastfoodKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = SpectralMixtureFastfoodKernel
    supports_ard = False

    def make_kernel(self, num_dims, num_samples=None, **kwargs):
        kwargs.pop("ard_num_dims", None)  # scales are per dimension already
        kwargs.setdefault("num_components", 2)
        return super().make_kernel(num_dims, num_samples, **kwargs)

    def make_ard_kernel(self, num_dims, num_samples, lengthscale):
        # A genuinely mixed spectrum (random means, scales, weights), not just ARD.
        kernel = self.make_kernel(num_dims, num_samples, num_components=4).double()
        return set_random_mixture(kernel, torch.Generator().manual_seed(2))

    def expected_kernel(self, kernel, x1, x2, lengthscale):
        return kernel.expected_kernel(x1, x2).detach()

    def test_rejects_uneven_components_and_outputscale(self):
        with self.assertRaisesRegex(ValueError, "multiple of num_components"):
            SpectralMixtureFastfoodKernel(3, 10, num_components=4)
        with self.assertRaisesRegex(ValueError, "no outputscale"):
            SpectralMixtureFastfoodKernel(3, 8, num_components=2, outputscale_prior=gpytorch.priors.GammaPrior(1, 1))

    def test_diag_is_total_weight(self):
        kernel = set_random_mixture(self.make_kernel(3, 16, num_components=4).double(), torch.Generator().manual_seed(0))
        x = torch.randn(5, 3, dtype=torch.float64)
        self.assertAllClose(kernel(x, diag=True).detach(), kernel.weights.sum().detach().expand(5), rtol=1e-14)


def gpytorch_mixture(weights, means, scales):
    """GPyTorch's SpectralMixtureKernel with angular (ω) parameters converted to cycles."""
    q, d = means.shape
    ref = gpytorch.kernels.SpectralMixtureKernel(num_mixtures=q, ard_num_dims=d).double()
    ref.mixture_weights = weights
    # GPyTorch keeps means positive; each of its per-dimension cosines is even in μ_j.
    ref.mixture_means = (means.abs() / (2 * math.pi)).reshape(q, 1, d)
    ref.mixture_scales = (scales / (2 * math.pi)).reshape(q, 1, d)
    return ref


def random_mixture(q, d, gen, zero_means=False):
    weights = 0.2 + torch.rand(q, generator=gen, dtype=torch.float64)
    means = torch.zeros(q, d, dtype=torch.float64) if zero_means else 2 * torch.randn(q, d, generator=gen, dtype=torch.float64)
    scales = 0.3 + torch.rand(q, d, generator=gen, dtype=torch.float64)
    return weights, means, scales


def compare_with_gpytorch(weights, means, scales, gpytorch_weights, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = means.shape[1]
    x1 = torch.randn(30, d, generator=gen, dtype=torch.float64)
    x2 = torch.randn(20, d, generator=gen, dtype=torch.float64)
    ours = spectral_mixture_kernel(x1, x2, weights, means, scales)
    theirs = gpytorch_mixture(gpytorch_weights, means, scales)(x1, x2).to_dense().detach()
    return (ours - theirs).abs().max().item()


def test_closed_form_agrees_with_gpytorch_in_one_dimension():
    weights, means, scales = random_mixture(3, 1, torch.Generator().manual_seed(1))
    assert compare_with_gpytorch(weights, means, scales, weights) < 1e-10


@pytest.mark.parametrize("d", [3, 5])
def test_closed_form_agrees_with_gpytorch_for_zero_mean(d):
    """GPyTorch multiplies per-dimension mixtures, Π_j Σ_q w_q k_qj(τ_j); at μ = 0 with
    one component that is w^d times an ARD RBF kernel, i.e. ours with w_gpytorch = w^(1/d)."""
    weights, means, scales = random_mixture(1, d, torch.Generator().manual_seed(d), zero_means=True)
    assert compare_with_gpytorch(weights, means, scales, weights ** (1 / d)) < 1e-10


@pytest.mark.parametrize("q, zero_means", [(1, False), (3, True)])
def test_closed_form_differs_from_gpytorch_elsewhere(q, zero_means):
    """In d > 1 the families differ: a full-dimensional cosine (μ ≠ 0), or a sum of
    products vs a product of sums (Q > 1) — the difference docs/mathematics.md §3 describes."""
    weights, means, scales = random_mixture(q, 2, torch.Generator().manual_seed(7), zero_means)
    assert compare_with_gpytorch(weights, means, scales, weights ** 0.5) > 0.01
