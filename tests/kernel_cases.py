"""The shared test case every alacarte kernel's tests inherit.

Built on GPyTorch's own ``BaseKernelTestCase`` (batch shapes, slicing,
active dims, pickling, dtype moves) and extended with what an explicit-feature
kernel must satisfy, each against an independent truth:

* convergence to the analytic kernel as M grows, at the 1/sqrt(M) rate;
* the Woodbury likelihood, its gradients and the predictive moments equal the
  dense n×n GP computed with ``torch.distributions.MultivariateNormal``;
* float32/float64, gradients reach every learnable parameter, ``state_dict``
  round trip gives identical features, ``diag=True`` equals the full diagonal.
"""
from __future__ import annotations

import copy

import gpytorch
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from linear_operator.operators import LowRankRootLinearOperator, MatmulLinearOperator

from alacarte import FeatureGP, WoodburyMarginalLogLikelihood
from alacarte.factory import default_dtype


def rbf_kernel(x1, x2, lengthscale, outputscale):
    """σ_f² exp(−½‖(x − x')/ℓ‖²), computed densely."""
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)) / lengthscale
    return outputscale * torch.exp(-0.5 * diff.pow(2).sum(-1))


class FeatureKernelTestCase(BaseKernelTestCase):
    """Subclasses set ``kernel_class`` (and may override the hooks below)."""

    kernel_class = None
    seed = 0
    num_samples = 64
    supports_ard = True
    redraws = True  # False where the random state is learned (FSGBARD's blocks, SSGPR's frequencies)
    widens = True  # False where a value is learned per frequency (FSARD's radii too)

    # -- hooks ------------------------------------------------------------------------
    def make_kernel(self, num_dims, num_samples=None, **kwargs):
        kwargs.setdefault("seed", 3)
        return self.kernel_class(num_dims, self.num_samples if num_samples is None else num_samples, **kwargs)

    def make_ard_kernel(self, num_dims, num_samples, lengthscale):
        """A kernel at its initial state whose expected kernel is ARD with ``lengthscale``."""
        kernel = self.make_kernel(num_dims, num_samples, ard_num_dims=num_dims)
        kernel.lengthscale = lengthscale
        return kernel

    def expected_kernel(self, kernel, x1, x2, lengthscale):
        return rbf_kernel(x1, x2, lengthscale, kernel.outputscale.detach())

    # -- GPyTorch's BaseKernelTestCase hooks ---------------------------------------------
    def create_kernel_no_ard(self, **kwargs):
        active_dims = kwargs.get("active_dims")
        num_dims = len(active_dims) if active_dims is not None else 2
        return self.make_kernel(num_dims, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        if not self.supports_ard:
            raise NotImplementedError
        return self.make_kernel(num_dims, ard_num_dims=num_dims, **kwargs)

    # GPyTorch's versions build the reference kernel without telling it the input
    # dimension; ours needs it (the random state depends on d), so say it.
    def _check_active_dims(self, active_dims):
        x = self.create_data_no_batch()
        kernel = self.create_kernel_no_ard(active_dims=active_dims)
        reference = self.make_kernel(len(active_dims))
        self.assertAllClose(
            kernel(x).evaluate_kernel().to_dense(),
            reference(x[:, active_dims]).evaluate_kernel().to_dense(),
            rtol=1e-3,
            atol=1e-5,
        )

    def test_active_dims_list(self):
        self._check_active_dims([0, 2, 4, 6])

    def test_active_dims_range(self):
        self._check_active_dims(list(range(3, 9)))

    # -- convergence ------------------------------------------------------------------
    def test_converges_to_analytic_kernel(self):
        gen = torch.Generator().manual_seed(11)
        x = torch.randn(200, 5, generator=gen, dtype=torch.float64)
        lengthscale = torch.tensor([0.7, 1.0, 1.6, 2.0, 1.3], dtype=torch.float64)
        errors = {}
        for m in (512, 8192):
            kernel = self.make_ard_kernel(5, m, lengthscale).double()
            approx = kernel(x).to_dense().detach()
            errors[m] = (approx - self.expected_kernel(kernel, x, x, lengthscale)).abs().max().item()
        self.assertLessEqual(errors[8192], 0.05)
        # 16× the frequencies: the error should shrink ~4× (1/sqrt(M)); allow 2–8×.
        ratio = errors[512] / errors[8192]
        self.assertTrue(2.0 <= ratio <= 8.0, f"error ratio {ratio:.2f} for 16x M ({errors})")

    def test_execution_strategies_agree(self):
        """Fastfood kernels: the FWHT path and the materialised-GEMM path, batched."""
        x = torch.randn(2, 6, 5, dtype=torch.float64)
        ard = {"ard_num_dims": 5} if self.supports_ard else {}
        kernel = self.make_kernel(5, 40, batch_shape=torch.Size([2]), **ard).double()
        if not hasattr(kernel, "strategy"):
            self.skipTest(f"{type(kernel).__name__} has a single (dense) execution path")
        kernel.strategy = "dense"
        dense = kernel.features(x)
        kernel.strategy = "fwht"
        self.assertAllClose(kernel.features(x), dense, rtol=1e-10, atol=1e-12)

    # -- operator structure, diag, dtypes ---------------------------------------------
    def test_returns_feature_operators(self):
        kernel = self.make_kernel(3).double()
        x1, x2 = torch.randn(7, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        same = kernel.forward(x1, x1)
        cross = kernel.forward(x1, x2)
        self.assertIsInstance(same, LowRankRootLinearOperator)
        self.assertIsInstance(cross, MatmulLinearOperator)
        phi1, phi2 = kernel.features(x1), kernel.features(x2)
        self.assertEqual(phi1.shape, torch.Size([7, kernel.num_features]))
        self.assertAllClose(cross.to_dense(), phi1 @ phi2.T, rtol=1e-12, atol=1e-12)
        self.assertAllClose(same.to_dense(), phi1 @ phi1.T, rtol=1e-12, atol=1e-12)

    def test_diag_matches_full(self):
        kernel = self.make_kernel(3).double()
        x1, x2 = torch.randn(9, 3, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
        for a, b in ((x1, x1), (x1, x2)):
            full = kernel(a, b).to_dense().diagonal()
            self.assertAllClose(kernel(a, b, diag=True).detach(), full.detach(), rtol=1e-12, atol=1e-12)

    def test_is_stationary(self):
        """GPyTorch's ``is_stationary`` (default: has a lengthscale) would be False for GM and SSGPR; check the
        claim too."""
        kernel = self.make_kernel(3).double()
        self.assertTrue(kernel.is_stationary)
        x1, x2 = torch.randn(6, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
        shift = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
        self.assertAllClose(kernel(x1 + shift, x2 + shift).to_dense(), kernel(x1, x2).to_dense(), rtol=1e-10, atol=1e-12)

    def test_float32_and_float64(self):
        x = torch.randn(20, 3, dtype=torch.float64)
        k64 = self.make_kernel(3).double()
        k32 = copy.deepcopy(k64).float()
        phi64 = k64.features(x)
        phi32 = k32.features(x.float())
        self.assertEqual(phi32.dtype, torch.float32)
        self.assertEqual(phi64.dtype, torch.float64)
        self.assertAllClose(phi32.double().detach(), phi64.detach(), rtol=1e-4, atol=1e-5)

    def test_gradients_reach_every_parameter(self):
        kernel = self.make_kernel(3, ard_num_dims=3 if self.supports_ard else None).double()
        x = torch.randn(15, 3, dtype=torch.float64)
        kernel.features(x).pow(2).sin().sum().backward()
        for name, param in kernel.named_parameters():
            self.assertIsNotNone(param.grad, f"no gradient reached {name}")
            self.assertTrue(torch.isfinite(param.grad).all(), name)
            self.assertGreater(param.grad.abs().max().item(), 0.0, f"zero gradient for {name}")

    def test_state_dict_round_trip(self):
        kernel = self.make_kernel(3, ard_num_dims=3 if self.supports_ard else None).double()
        with torch.no_grad():
            for param in kernel.parameters():
                param.add_(0.1 * torch.randn_like(param))
        other = self.make_kernel(3, ard_num_dims=3 if self.supports_ard else None, seed=99).double()
        other.load_state_dict(kernel.state_dict())
        x = torch.randn(10, 3, dtype=torch.float64)
        self.assertTrue(torch.equal(kernel.features(x), other.features(x)))

    def test_same_seed_same_features(self):
        x = torch.randn(10, 3)
        a, b, c = self.make_kernel(3, seed=5), self.make_kernel(3, seed=5), self.make_kernel(3, seed=6)
        self.assertTrue(torch.equal(a.features(x), b.features(x)))
        self.assertFalse(torch.equal(a.features(x), c.features(x)))

    def test_redrawn_is_the_kernel_built_with_that_seed(self):
        """Within ``redrawn(s)`` the features are those of a kernel built with seed s that carries
        this kernel's learned parameters; after the block, this kernel's own, bit for bit."""
        ard = 3 if self.supports_ard else None
        kernel = self.make_kernel(3, ard_num_dims=ard)
        with torch.no_grad():
            for param in kernel.parameters():
                param.add_(0.1 * torch.randn_like(param))
        x = torch.randn(10, 3)
        own = kernel.features(x)
        self.assertEqual(kernel.redrawable, self.redraws)
        if not self.redraws:
            with self.assertRaisesRegex(ValueError, "draw"), kernel.redrawn(5):
                pass
            self.assertTrue(torch.equal(kernel.features(x), own))
            return
        fresh = self.make_kernel(3, ard_num_dims=ard, seed=5)
        drawn = {"perm", "sign", "gauss", "radius", "weights"} & set(dict(kernel.named_buffers()))
        fresh.load_state_dict({name: v for name, v in kernel.state_dict().items() if name not in drawn}, strict=False)
        with kernel.redrawn(5):
            self.assertTrue(torch.equal(kernel.features(x), fresh.features(x)))
            self.assertFalse(torch.equal(kernel.features(x), own))
        self.assertTrue(torch.equal(kernel.features(x), own))
        with self.assertRaisesRegex(ValueError, "seed"), kernel.redrawn(None):
            pass
        self.assertIs(kernel.redraw_(5), kernel)
        self.assertTrue(torch.equal(kernel.features(x), fresh.features(x)))
        self.assertEqual(kernel.seed, 5)

    def test_widened_is_the_same_kernel_with_more_features(self):
        """``widened(M′)`` puts every learned parameter on M′ fresh frequencies: its Gram at 64× the
        frequencies lies closer to the kernel's expectation than the narrow draw's; at its own M and seed
        it is the kernel bit for bit; the kernel is left as it was."""
        lengthscale = torch.tensor([0.7, 1.3, 2.0], dtype=torch.float64)
        with default_dtype(torch.float64):
            kernel = self.make_ard_kernel(3, 16, lengthscale) if self.supports_ard else self.make_kernel(3, 16)
        if not self.widens:
            with self.assertRaisesRegex(ValueError, "per frequency"):
                kernel.widened(32)
            return
        x = torch.randn(100, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        own = kernel.features(x)
        self.assertTrue(torch.equal(kernel.widened(16).features(x), own))
        wide = kernel.widened(1024, seed=7)
        self.assertEqual((wide.num_samples, wide.seed, wide.num_features), (1024, 7, 2048))
        for (name, value), (_, widened) in zip(kernel.named_parameters(), wide.named_parameters()):
            self.assertTrue(torch.equal(value, widened), name)
        truth = self.expected_kernel(kernel, x, x, lengthscale)
        errors = [(k(x).to_dense().detach() - truth).abs().max().item() for k in (kernel, wide)]
        self.assertLess(errors[1], errors[0] / 3, errors)  # 64× the frequencies: about 8× less error
        self.assertTrue(torch.equal(kernel.features(x), own))
        bad = [0, 2.5] + ([kernel.num_components * 4 + 1] if hasattr(kernel, "num_components") else [])
        for num_samples in bad:
            with self.assertRaisesRegex(ValueError, "num_samples"):
                kernel.widened(num_samples)

    # -- bad input ----------------------------------------------------------------------
    def test_rejects_bad_settings(self):
        for bad in (0, -3, 2.5):
            with self.assertRaisesRegex(ValueError, "num_samples"):
                self.make_kernel(3, num_samples=bad)
        with self.assertRaisesRegex(ValueError, "num_dims"):
            self.make_kernel(0)

    def test_parameters_set_outside_their_constraints_are_value_errors(self):
        """On a bound the raw parameter is ±∞ (a positive one set to 0: raw −∞, NaN gradients)."""
        from alacarte.kernels._params import ConstrainedParameter

        kernel = self.make_kernel(3, ard_num_dims=3 if self.supports_ard else None).double()
        names = [n for n, _ in kernel.named_parameters() if n.startswith("raw_") and "." not in n]
        names = [n[4:] for n in names if isinstance(getattr(type(kernel), n[4:], None), ConstrainedParameter)
                 or n == "raw_lengthscale"]
        self.assertTrue(names)
        for name in names:
            before = getattr(kernel, name).detach().clone()
            constraint = getattr(kernel, f"raw_{name}_constraint")
            for bad in (constraint.lower_bound.item(), float("nan"), -1.0):
                with self.assertRaisesRegex(ValueError, f"{name} must be finite and strictly inside"):
                    setattr(kernel, name, bad)
            with self.assertRaisesRegex(ValueError, f"{name} has shape .* does not broadcast"):
                setattr(kernel, name, torch.full((before.numel() + 1,), 0.5, dtype=torch.float64))
            self.assertTrue(torch.equal(getattr(kernel, name), before), name)
            setattr(kernel, name, before.squeeze())  # its values without singleton dimensions: taken in its shape
            self.assertTrue(torch.allclose(getattr(kernel, name), before, rtol=1e-12), name)
            if before.squeeze().dim() > 1:  # the right number of values in another layout would be scrambled
                with self.assertRaisesRegex(ValueError, f"{name} has shape .* does not broadcast"):
                    setattr(kernel, name, before.flatten())

    def test_rejects_wrong_input_dimension(self):
        kernel = self.make_kernel(3)
        with self.assertRaisesRegex(ValueError, "3 input dimensions"):
            kernel.features(torch.randn(4, 5))

    # -- Woodbury vs dense ----------------------------------------------------------------
    def _dense_gp(self, model, x, y):
        kernel = model.covar_module
        phi = kernel.features(x)
        noise = model.likelihood.noise.squeeze(-1)
        cov = phi @ phi.T + noise * torch.eye(x.shape[0], dtype=x.dtype)
        return phi, cov, noise

    def _model(self, num_samples, n=40, d=3):
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(n, d, generator=gen, dtype=torch.float64)
        y = torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
        kernel = self.make_kernel(d, num_samples, ard_num_dims=d if self.supports_ard else None)
        model = FeatureGP(x, y, kernel).double()
        with torch.no_grad():
            for param in model.covar_module.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=gen, dtype=torch.float64))
            model.likelihood.noise = 0.05
            model.mean_module.constant.fill_(0.3)
        return model, x, y

    def test_woodbury_likelihood_and_gradients_equal_dense(self):
        for num_samples in (8, 64):  # D = 16 < n and D = 128 > n
            model, x, y = self._model(num_samples)
            params = [p for p in model.parameters() if p.requires_grad]
            model.train()
            woodbury = WoodburyMarginalLogLikelihood(model.likelihood, model)(model(x), y) * x.shape[0]
            grads = torch.autograd.grad(woodbury, params)
            phi, cov, _ = self._dense_gp(model, x, y)
            mean = model.mean_module(x)
            dense = torch.distributions.MultivariateNormal(mean, cov).log_prob(y)
            dense_grads = torch.autograd.grad(dense, params)
            self.assertLessEqual(abs(woodbury.item() - dense.item()), 1e-8 * abs(dense.item()))
            for (name, _), g, dg in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad],
                                        grads, dense_grads):
                scale = max(dg.abs().max().item(), 1e-3)
                self.assertLessEqual((g - dg).abs().max().item(), 1e-6 * scale, f"{name} (M={num_samples})")

    def test_exact_mll_gives_the_same_number(self):
        model, x, y = self._model(16)
        model.train()
        ours = WoodburyMarginalLogLikelihood(model.likelihood, model)(model(x), y)
        with gpytorch.settings.max_cholesky_size(10**6):
            theirs = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y)
        self.assertLessEqual(abs(ours.item() - theirs.item()), 1e-8 * abs(theirs.item()))

    def test_predictions_equal_dense_posterior(self):
        for num_samples in (8, 64):
            model, x, y = self._model(num_samples)
            x_star = torch.randn(25, 3, dtype=torch.float64)
            model.eval()
            with torch.no_grad():
                pred = model.predict(x_star, chunk_size=7)
                dist = model(x_star)
                phi, cov, noise = self._dense_gp(model, x, y)
                phi_star = model.covar_module.features(x_star)
                k_star = phi_star @ phi.T
                mean = model.mean_module(x_star) + k_star @ torch.linalg.solve(cov, y - model.mean_module(x))
                var = (phi_star * phi_star).sum(-1) - (k_star * torch.linalg.solve(cov, k_star.T).T).sum(-1)
            for got in (pred.mean, dist.mean):
                self.assertAllClose(got, mean, rtol=1e-8, atol=1e-10)
            for got in (pred.variance, dist.variance):
                self.assertAllClose(got, var, rtol=1e-8, atol=1e-10)
            self.assertAllClose(pred.observed_variance, var + noise, rtol=1e-8, atol=1e-10)
