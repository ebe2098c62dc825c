"""PWL kernel: the shared kernel test case against the numerically integrated radial kernel."""
import unittest

import gpytorch
import numpy as np
import pytest
import torch
from scipy import integrate, interpolate, special

from alacarte import PiecewiseLinearRadialKernel
from alacarte.features.fastfood import padded_dim
from alacarte.kernels.piecewise_linear import hat_quantiles
from kernel_cases import FeatureKernelTestCase


def sphere_characteristic(t, p):
    """Ω_p(t) = Γ(p/2)(2/t)^(p/2−1) J_(p/2−1)(t): E[cos(t·u₁)] for u uniform on S^(p−1)."""
    t = np.asarray(t, dtype=float)
    out = np.ones_like(t)
    nonzero = t > 1e-12
    nu = p / 2 - 1
    out[nonzero] = special.gamma(p / 2) * (2 / t[nonzero]) ** nu * special.jv(nu, t[nonzero])
    return out


def hat_density(r, a, b):
    return np.clip(b - np.abs(r - a), 0, None) / b**2


def radial_kernel(rho, modes, half_widths, weights, p, nodes=64):
    """Σ_c w_c ∫ hat_c(r) Ω_p(r ρ) dr by Gauss–Legendre on each linear piece."""
    xs, ws = np.polynomial.legendre.leggauss(nodes)
    total = np.zeros_like(rho, dtype=float)
    for a, b, w in zip(modes, half_widths, weights):
        for lo, hi in ((a - b, a), (a, a + b)):
            r = 0.5 * (hi - lo) * xs + 0.5 * (hi + lo)
            total += w * (sphere_characteristic(np.outer(rho, r), p) * hat_density(r, a, b) * 0.5 * (hi - lo) * ws).sum(1)
    return total


def test_quadrature_matches_scipy_quad():
    for a, b, p, rho in ((2.0, 1.0, 8, 1.3), (3.0, 0.4, 4, 0.7), (1.0, 1.0, 1, 2.5)):
        expected = integrate.quad(lambda r: hat_density(r, a, b) * sphere_characteristic([rho * r], p)[0], a - b, a + b, points=[a])[0]
        assert abs(radial_kernel(np.array([rho]), [a], [b], [1.0], p)[0] - expected) < 1e-12


class TestPiecewiseLinearRadialKernel(FeatureKernelTestCase, unittest.TestCase):
    kernel_class = PiecewiseLinearRadialKernel

    def make_kernel(self, num_dims, num_samples=None, **kwargs):
        kwargs.setdefault("num_components", 2)
        return super().make_kernel(num_dims, num_samples, **kwargs)

    def make_ard_kernel(self, num_dims, num_samples, lengthscale):
        kernel = self.make_kernel(num_dims, num_samples, num_components=4, ard_num_dims=num_dims).double()
        kernel.lengthscale = lengthscale
        kernel.weights = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
        return kernel

    def expected_kernel(self, kernel, x1, x2, lengthscale):
        ell = lengthscale.numpy()
        rho = np.linalg.norm((x1.numpy()[:, None, :] - x2.numpy()[None, :, :]) / ell, axis=-1)
        # The quadrature on 2001 distances and a cubic spline between them: within 3.3e-12 of the quadrature at
        # every one of 40 000 pairs, and 17× faster than it (the test compares at 0.05).
        grid = np.linspace(0.0, max(rho.max(), 1.0), 2001)
        values = radial_kernel(
            grid,
            kernel.modes.detach().numpy(),
            kernel.half_widths.detach().numpy(),
            kernel.weights.detach().numpy(),
            padded_dim(kernel.num_dims),
        )
        return torch.as_tensor(interpolate.CubicSpline(grid, values)(rho))

    def test_frequency_lengths_are_the_quantile_radii(self):
        kernel = self.make_kernel(4, 64, num_components=2, ard_num_dims=4).double()  # d = p: whole rows
        omega_t = kernel.projection(torch.eye(4, dtype=torch.float64) * kernel.lengthscale.detach()).detach()
        self.assertAllClose(omega_t.norm(dim=0), kernel.radii().detach().reshape(-1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num", [8, 101, 4000])
def test_quantile_radii_reproduce_hat_moments(num):
    a, b = torch.tensor([2.0, 5.0], dtype=torch.float64), torch.tensor([0.5, 5.0], dtype=torch.float64)
    r = hat_quantiles(a, b, num)
    assert torch.allclose(r.mean(-1), a, rtol=1e-12)  # symmetric quantiles: the mean is exact
    assert ((r >= a[:, None] - b[:, None]) & (r <= a[:, None] + b[:, None])).all()
    # midpoint quantiles give the variance b²/6 to O(num^-3/2) (F⁻¹ has square-root ends):
    # measured relative errors 7.6e-2, 1.9e-3, 8.1e-6 for num = 8, 101, 4000
    assert torch.allclose(r.var(-1, unbiased=False), b**2 / 6, rtol=3.0 / num**1.5)


def test_quantile_radii_gradcheck():
    a = torch.tensor([1.5, 3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.4, 2.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a_, b_: hat_quantiles(a_, b_, 7), (a, b))


def test_features_gradcheck_in_hat_parameters():
    kernel = PiecewiseLinearRadialKernel(3, 8, num_components=2, seed=0).double()
    x = torch.randn(4, 3, dtype=torch.float64)

    def features(raw_modes, raw_width_ratios):
        params = {"raw_modes": raw_modes, "raw_width_ratios": raw_width_ratios}
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return torch.func.functional_call(kernel, params, (x,)).root.to_dense()

    raw = (kernel.raw_modes.detach().clone().requires_grad_(), kernel.raw_width_ratios.detach().clone().requires_grad_())
    assert torch.autograd.gradcheck(features, raw)


def test_rejects_uneven_components():
    with pytest.raises(ValueError, match="multiple of num_components"):
        PiecewiseLinearRadialKernel(3, 10, num_components=4)
