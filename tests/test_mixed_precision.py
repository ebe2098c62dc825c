"""Float32 features with float64 statistics (alacarte._mixed_precision) against the float64 dense reference."""
import pytest
import torch

import alacarte._mixed_precision as mixed
from alacarte import FeatureGP, FSARDKernel
from alacarte._mixed_precision import MIN_NOISE, chunk_adjoint, float32_products, mixed_adjoint, mixed_statistics
from alacarte.mll import WoodburyMarginalLogLikelihood
from alacarte.streaming import ChunkedData, streamed_negative_mll
from alacarte.woodbury import statistics_adjoint, sufficient_statistics


def _rows(n, num_features, seed=0, offset=0.0):
    generator = torch.Generator().manual_seed(seed)
    phi = torch.randn(n, num_features, generator=generator, dtype=torch.float64) + offset
    r = torch.randn(n, generator=generator, dtype=torch.float64)
    return phi.float(), r.float()


@pytest.mark.parametrize("n, block_rows", [(1000, 256), (1000, 1000), (100, 256), (257, 256), (1, 256)])
def test_block_sums_equal_the_float64_statistics_for_any_row_count(n, block_rows):
    # Φ float32 and exact in float64: the reference's products are exact, its sums float64.
    phi, r = _rows(n, 300, offset=0.5)
    expected = sufficient_statistics(phi.double(), r.double())
    got = mixed_statistics(phi, r, block_rows=block_rows)
    assert got.n == n and got.gram.dtype == torch.float64
    assert torch.equal(got.gram, got.gram.T)
    # float32 sums of at most 256 terms: a few ε√k of the largest entry
    assert (got.gram - expected.gram).abs().max() <= 2e-6 * expected.gram.abs().max()
    assert torch.allclose(got.phi_r, expected.phi_r, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got.r_r, expected.r_r, rtol=1e-12)


def test_the_block_size_changes_only_float32_rounding():
    phi, r = _rows(1000, 200)
    whole, blocks = mixed_statistics(phi, r, block_rows=1000), mixed_statistics(phi, r, block_rows=96)
    assert (whole.gram - blocks.gram).abs().max() <= 2e-6 * whole.gram.abs().max()
    assert torch.allclose(whole.phi_r, blocks.phi_r, rtol=1e-12) and torch.equal(whole.r_r, blocks.r_r)


def test_the_mixed_adjoint_equals_the_float64_adjoint():
    # ΦS + e b̄ᵀ with S = Ā + Āᵀ − b̄b̄ᵀ/(2c̄) is the same adjoint for any Ā, b̄, c̄ ≠ 0.
    phi, r = _rows(700, 64, seed=1)
    generator = torch.Generator().manual_seed(2)
    grad_gram = torch.randn(64, 64, generator=generator, dtype=torch.float64)
    grad_phi_r = torch.randn(64, generator=generator, dtype=torch.float64)
    grad_r_r = torch.tensor(0.3, dtype=torch.float64)
    expected = statistics_adjoint(phi.double(), r.double(), grad_gram, grad_phi_r, grad_r_r)
    for adjoint in (mixed_adjoint(grad_gram, grad_phi_r, grad_r_r),
                    chunk_adjoint(torch.float32, 0.1, grad_gram, grad_phi_r, grad_r_r)):
        got = adjoint(phi, r)
        assert got[0].dtype == got[1].dtype == torch.float32
        for a, b in zip(got, expected):
            assert (a.double() - b).norm() <= 1e-6 * b.norm()
    direct = mixed_adjoint(grad_gram, grad_phi_r, None)(phi, r)
    reference = statistics_adjoint(phi.double(), r.double(), grad_gram, grad_phi_r, None)
    assert (direct[0].double() - reference[0]).norm() <= 1e-6 * reference[0].norm()


def _case(noise):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 3, generator=generator, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(1000, generator=generator, dtype=torch.float64)
    model64 = FeatureGP(None, None, FSARDKernel(3, 64, ard_num_dims=3, seed=0)).double()
    model64.set_standardization(x.mean(0), x.std(0), y.mean(), y.std())
    model64.likelihood.noise = noise
    model32 = FeatureGP(None, None, FSARDKernel(3, 64, ard_num_dims=3, seed=0))
    model32.load_state_dict(model64.state_dict())
    return x, y, model64, model32


def _flat_grads(model):
    grads = torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.requires_grad])
    model.zero_grad()
    return grads


# σ² = 0.1: 2.7e-7 and 1.8e-6 measured on one CPU, 1.03e-6 for the loss on another (MKL's float32
# kernels round differently per CPU); σ² = 1e-3: 3.4e-5 and 1.4e-4, where float32 statistics are
# 2.3e-4 and 6.1e-4 off and features widened before any product 4.0e-7 and 7.7e-7 (float32 sums of
# ΦᵀΦ, amplified by σ⁻²).
@pytest.mark.parametrize("noise, loss_tolerance, gradient_tolerance", [(1e-1, 2e-6, 1e-5), (1e-3, 1e-4, 5e-4)])
def test_float32_features_with_float64_statistics_match_the_float64_dense_loss_and_gradient(
        noise, loss_tolerance, gradient_tolerance):
    x, y, model64, model32 = _case(noise)
    inner, target = model64.internal_inputs(x), (y - model64.target_offset) / model64.target_scale
    model64.set_train_data(inner, target, strict=False)
    model64.train()
    loss = -WoodburyMarginalLogLikelihood(model64.likelihood, model64)(model64(inner), target)
    loss.backward()
    grads = _flat_grads(model64)
    # 300-row chunks, 256-row blocks: a chunk's last block is short, and the last chunk is 100 rows.
    data = ChunkedData(x, y, chunk_size=300, statistics_dtype=torch.float64)
    model32.train()
    mixed_loss = streamed_negative_mll(model32, data)
    mixed_grads = _flat_grads(model32)
    assert mixed.BLOCK_ROWS == 256 and mixed_loss.dtype == torch.float64
    loss = float(loss.detach())
    assert abs(float(mixed_loss) - loss) <= loss_tolerance * abs(loss)
    assert (mixed_grads - grads).norm() <= gradient_tolerance * grads.norm()


def test_small_noise_widens_the_features_first():
    # At σ² = 1e-6 float32 sums left ΦᵀΦ + σ²I indefinite (tests/test_numerics.py fits there).
    assert float32_products(torch.float32, torch.float64, MIN_NOISE)
    assert not float32_products(torch.float32, torch.float64, MIN_NOISE / 2)
    assert not float32_products(torch.float64, torch.float64, 1.0)
    x, y, model64, model32 = _case(2e-4)  # (the default noise constraint's bound is 1e-4)
    data = ChunkedData(x, y, chunk_size=300, statistics_dtype=torch.float64)
    loss, wide = streamed_negative_mll(model64, ChunkedData(x, y)), streamed_negative_mll(model32, data)
    assert abs(float(wide - loss)) <= 1e-6 * abs(float(loss))  # 5.6e-8 measured
