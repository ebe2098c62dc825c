"""The Woodbury building blocks against dense autograd and finite differences."""
import math

import pytest
import torch

from alacarte.features.fourier import fourier_features
from alacarte.woodbury import (
    SufficientStatistics,
    WoodburyPosterior,
    negative_log_marginal_likelihood,
    negative_log_marginal_likelihood_of_rows,
    sufficient_statistics,
)


def test_statistics_and_their_gradients_equal_autograd_of_the_plain_formulas():
    for shape in ((30, 6), (2, 30, 6)):  # the BLAS path and the batched torch path
        phi = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        r = torch.randn(*shape[:-1], dtype=torch.float64, requires_grad=True)
        stats = sufficient_statistics(phi, r)
        plain_gram, plain_phi_r = phi.transpose(-1, -2) @ phi, (r.unsqueeze(-2) @ phi).squeeze(-2)
        assert torch.allclose(stats.gram, plain_gram, rtol=1e-13, atol=1e-13)
        assert torch.equal(stats.gram, stats.gram.transpose(-1, -2))
        assert torch.allclose(stats.phi_r, plain_phi_r, rtol=1e-13, atol=1e-13)
        w_gram, w_phi_r = torch.randn_like(plain_gram), torch.randn_like(plain_phi_r)
        ours = torch.autograd.grad((stats.gram * w_gram).sum() + (stats.phi_r * w_phi_r).sum(), (phi, r))
        theirs = torch.autograd.grad((plain_gram * w_gram).sum() + (plain_phi_r * w_phi_r).sum(), (phi, r))
        for a, b in zip(ours, theirs):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_the_blas_gram_runs_on_torchs_thread_count(monkeypatch):
    """scipy's BLAS would otherwise use every core while torch keeps to the threads it was given."""
    from threadpoolctl import threadpool_info

    from alacarte import woodbury

    seen = []

    def recording_syrk(*args, **kwargs):
        seen.append({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})
        return real(*args, **kwargs)

    real = woodbury._SYRK[torch.float64]
    monkeypatch.setitem(woodbury._SYRK, torch.float64, recording_syrk)
    threads = torch.get_num_threads()
    phi = torch.randn(40, 8, dtype=torch.float64)
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            gram = sufficient_statistics(phi, torch.zeros(40, dtype=torch.float64)).gram
            assert torch.allclose(gram, phi.T @ phi, rtol=1e-13, atol=1e-13)
    finally:
        torch.set_num_threads(threads)
    assert seen == [{1}, {2}]


@pytest.mark.parametrize("size", [1, 5, 128, 129, 300])
def test_symmetrized_copies_the_upper_triangle_below_it(size):
    from alacarte.woodbury import symmetrized_

    upper = torch.randn(size, size, dtype=torch.float64)
    expected = upper.triu() + upper.triu(1).transpose(0, 1)
    result = symmetrized_(upper.clone())
    assert torch.equal(result, expected)


def test_gradcheck_of_the_likelihood():
    phi = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    r = torch.randn(12, dtype=torch.float64, requires_grad=True)
    noise = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    fn = lambda p, q, s: negative_log_marginal_likelihood(sufficient_statistics(p, q), s)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (phi, r, noise))


def test_a_noise_variance_that_is_not_positive_is_refused():
    """σ² = 0 at n < D would give latent variances of exactly 0 (the σ² → 0 limit is the prior's in the
    null space of Φ: 0.94, 0.46, 1.23 here) and a NaN loss; σ² < 0 a finite n×n loss."""
    generator = torch.Generator().manual_seed(0)
    phi = torch.randn(10, 32, generator=generator, dtype=torch.float64) / 32**0.5
    r = torch.randn(10, generator=generator, dtype=torch.float64)
    stats = sufficient_statistics(phi, r)
    for noise in (torch.tensor(0.0, dtype=torch.float64), torch.tensor([0.1, -1e-3], dtype=torch.float64)):
        for compute in (lambda: WoodburyPosterior(stats, noise), lambda: negative_log_marginal_likelihood(stats, noise),
                        lambda: negative_log_marginal_likelihood_of_rows(phi, r, noise)):
            with pytest.raises(ValueError, match="noise variance σ² must be positive"):
                compute()


def test_residuals_that_are_not_one_per_row_are_refused():
    phi = torch.randn(10, 4, dtype=torch.float64)
    for r in (torch.randn(7, dtype=torch.float64), torch.randn(10, 1, dtype=torch.float64), torch.tensor(1.0)):
        for compute in (lambda: sufficient_statistics(phi, r), lambda: negative_log_marginal_likelihood_of_rows(phi, r, 0.1)):
            with pytest.raises(ValueError, match=r"residuals r \(\.\.\., n\), one per row of Φ"):
                compute()
    with pytest.raises(ValueError, match="one per row"):
        sufficient_statistics(phi[0], phi[0])


@pytest.mark.parametrize(
    "batch, noise_shape, n, num_features",
    [((), (), 30, 6), ((), (1,), 4, 9), ((3,), (3,), 20, 5), ((2, 3), (1,), 7, 10), ((2, 3), (2, 1), 25, 4)],
)
def test_closed_form_adjoint_equals_autograd_of_the_dense_formula(batch, noise_shape, n, num_features):
    """The loss's closed-form adjoint against autograd through logdet and solve (independent of
    the Cholesky factor), for D < n and D > n, batches, and a noise that broadcasts."""
    phi = torch.randn(*batch, n, num_features, dtype=torch.float64)
    r = torch.randn(*batch, n, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in
              (phi.transpose(-1, -2) @ phi, (r.unsqueeze(-2) @ phi).squeeze(-2), (r * r).sum(-1))]
    noise = (torch.rand(noise_shape, dtype=torch.float64) + 0.2).requires_grad_()
    ours = negative_log_marginal_likelihood(SufficientStatistics(*leaves, n=n), noise)
    gram, phi_r, r_r = leaves
    a = gram + noise[..., None, None] * torch.eye(num_features, dtype=torch.float64)
    quad = (phi_r.unsqueeze(-2) @ torch.linalg.solve(a, phi_r.unsqueeze(-1))).squeeze(-1).squeeze(-1)
    dense = 0.5 * ((r_r - quad) / noise + torch.logdet(a) + (n - num_features) * noise.log()
                   + n * math.log(2 * math.pi))
    assert ours.shape == dense.shape
    assert torch.allclose(ours, dense, rtol=1e-12, atol=0)
    weights = torch.randn(dense.shape, dtype=torch.float64)
    for a_grad, b_grad in zip(torch.autograd.grad((ours * weights).sum(), (*leaves, noise)),
                              torch.autograd.grad((dense * weights).sum(), (*leaves, noise))):
        assert a_grad.shape == b_grad.shape
        assert torch.allclose(a_grad, b_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "phi_batch, r_batch, noise_shape, n, num_features",
    [((), (), (), 6, 40), ((), (), (), 40, 6), ((3,), (3,), (3,), 5, 9), ((2, 3), (2, 3), (2, 1), 7, 10),
     ((), (3,), (), 5, 9), ((3,), (), (2, 1), 5, 9)],
)
def test_the_n_by_n_form_equals_the_statistics_form(phi_batch, r_batch, noise_shape, n, num_features):
    """K = ΦΦᵀ + σ²I (used when n < D) and A = ΦᵀΦ + σ²I give the same loss and
    gradients in Φ, r and σ² to round-off, on either side of n = D, with batches
    that broadcast between Φ, r and σ² (the BLAS path is the unbatched one)."""
    phi = torch.randn(*phi_batch, n, num_features, dtype=torch.float64, requires_grad=True)
    r = torch.randn(*r_batch, n, dtype=torch.float64, requires_grad=True)
    noise = (torch.rand(noise_shape, dtype=torch.float64) + 0.1).requires_grad_()
    rows = negative_log_marginal_likelihood_of_rows(phi, r, noise)
    stats = negative_log_marginal_likelihood(sufficient_statistics(phi, r), noise)
    assert rows.shape == stats.shape
    assert torch.allclose(rows, stats, rtol=1e-12, atol=0)
    weights = torch.randn(rows.shape, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((rows * weights).sum(), (phi, r, noise)),
                    torch.autograd.grad((stats * weights).sum(), (phi, r, noise))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-11)


def test_gradcheck_of_the_n_by_n_form():
    phi = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    r = torch.randn(5, dtype=torch.float64, requires_grad=True)
    noise = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(negative_log_marginal_likelihood_of_rows, (phi, r, noise))


def test_gradcheck_of_fourier_features():
    proj = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    for scale_shape in ((1, 1), (2, 1, 1), (1, 4), (2, 1, 4)):
        scale = (torch.rand(*scale_shape, dtype=torch.float64) + 0.5).requires_grad_()
        assert torch.autograd.gradcheck(fourier_features, (proj, scale))


def test_second_derivatives_of_both_forms():
    """Hessians (create_graph=True) differentiate the forward's own operations: gradgradcheck
    of the statistics (ΦᵀΦ, Φᵀr), the D×D form and the n×n form."""
    phi = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    r = torch.randn(9, dtype=torch.float64, requires_grad=True)
    noise = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    stats = lambda p, q, s: negative_log_marginal_likelihood(sufficient_statistics(p, q), s)  # noqa: E731
    assert torch.autograd.gradgradcheck(stats, (phi, r, noise))
    assert torch.autograd.gradgradcheck(lambda p, q, s: negative_log_marginal_likelihood_of_rows(p.T, q[:4], s),
                                        (phi, r, noise))


@pytest.mark.parametrize("n", [40, 6])  # the D×D path and, below D = 16, the n×n one
def test_hessian_of_the_model_loss_equals_the_dense_gaussians(n):
    """The Hessian of the Woodbury loss in a kernel's raw lengthscales and the noise, against
    autograd's Hessian of −log N(y; 0, ΦΦᵀ + σ²I) built from the same features (the closed-form
    backwards must not be taken as constants there)."""
    from alacarte import FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood

    torch.manual_seed(0)
    x = torch.randn(n, 3, dtype=torch.float64)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(n, dtype=torch.float64)
    kernel = FSARDKernel(3, 8, ard_num_dims=3, seed=0).double()
    model = FeatureGP(x, y, kernel).double()
    model.train()
    with torch.no_grad():
        kernel.raw_lengthscale += 0.3
        model.likelihood.noise_covar.raw_noise -= 1.0
    params = [kernel.raw_lengthscale, model.likelihood.noise_covar.raw_noise]

    def hessian(loss):
        grads = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, create_graph=True)])
        return torch.stack([torch.cat([h.flatten() for h in torch.autograd.grad(g, params, retain_graph=True)])
                            for g in grads])

    ours = hessian(-WoodburyMarginalLogLikelihood(model.likelihood, model)(model(x), y) * n)
    phi = kernel.features(x)
    covariance = phi @ phi.T + model.likelihood.noise * torch.eye(n, dtype=torch.float64)
    theirs = hessian(-torch.distributions.MultivariateNormal(torch.zeros(n, dtype=torch.float64), covariance)
                     .log_prob(y))
    assert torch.allclose(ours, theirs, rtol=1e-8, atol=1e-9), (ours, theirs)
