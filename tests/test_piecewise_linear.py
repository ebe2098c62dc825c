"""PWL kernel: the shared kernel test case against the numerically integrated radial kernel."""
import unittest

import gpytorch
import numpy as np
import pytest
import torch
from scipy import integrate, interpolate, special

from alacarte import PiecewiseLinearRadialKernel, fit
from alacarte.factory import make_model
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


def _pwl(seed=0):
    return PiecewiseLinearRadialKernel(3, 32, num_components=4, ard_num_dims=3, seed=seed).double()


def test_modes_and_lengthscales_share_one_unidentified_scale():
    """k depends on (a, ℓ) only through r/ℓ: scaling both by c leaves the features unchanged."""
    x = torch.randn(6, 3, dtype=torch.float64)
    kernel, scaled = _pwl(), _pwl()
    scaled.modes = 3.0 * kernel.modes.detach()
    scaled.lengthscale = 3.0 * kernel.lengthscale.detach()
    torch.testing.assert_close(scaled.features(x), kernel.features(x), rtol=1e-10, atol=1e-12)


def test_modes_geometric_mean_is_pinned():
    kernel = _pwl()
    kernel.modes = torch.tensor([1.0, 2.0, 3.0, 4.0])
    set_modes = kernel.modes.detach()
    assert torch.equal(set_modes, kernel.raw_modes_constraint.transform(kernel.raw_modes).detach())
    x = torch.randn(6, 3, dtype=torch.float64)
    before = kernel.features(x).detach()
    # a common factor on the free modes (the direction the data cannot see) changes nothing
    kernel.raw_modes.data = kernel.raw_modes_constraint.inverse_transform(5.0 * set_modes)
    torch.testing.assert_close(kernel.modes.detach(), set_modes, rtol=1e-13, atol=0)
    torch.testing.assert_close(kernel.features(x).detach(), before, rtol=1e-12, atol=1e-13)
    # any other move of the free modes keeps their geometric mean and changes their shape
    kernel.raw_modes.data += torch.tensor([0.5, -0.2, 1.0, 0.3], dtype=torch.float64)
    assert torch.allclose(kernel.modes.detach().log().mean().exp(), set_modes.log().mean().exp(), rtol=1e-14)
    assert not torch.allclose(kernel.modes.detach() / set_modes, torch.ones(4, dtype=torch.float64), rtol=1e-3)


def test_fit_keeps_the_modes_scale_and_learns_lengthscales():
    torch.manual_seed(0)
    x = torch.rand(120, 3, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(120, dtype=torch.float64)
    model = make_model("pwl", 3, num_samples=64, num_components=4, seed=0)
    fit(model, x, y, seed=0, max_iter=30, restarts=1, validation_fraction=0.0, progress=False)
    kernel = model.covar_module
    assert torch.allclose(kernel.modes.detach().log().mean().exp(), kernel.mode_scale.squeeze(), rtol=1e-12)
    assert kernel.lengthscale.detach().reshape(-1).argmin() == 0  # the one relevant input


def test_state_saved_without_the_pin_reloads_its_modes():
    kernel = _pwl()
    kernel.raw_modes.data += torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    state = kernel.state_dict()
    del state["mode_scale"]
    unpinned = kernel.raw_modes_constraint.transform(kernel.raw_modes).detach()
    reloaded = _pwl(seed=1)
    reloaded.load_state_dict(state)
    assert torch.equal(reloaded.modes.detach(), unpinned)
