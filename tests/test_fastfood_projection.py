"""Fastfood projection: the fused FWHT path equals the definition and the dense path."""
import math

import numpy as np
import pytest
import scipy.linalg
import torch

from alacarte.features.fastfood import (
    choose_strategy,
    draw_fastfood_state,
    fastfood_matrix,
    fastfood_project,
    padded_dim,
    row_scale,
)


def state_tensors(d, m, batch_shape=(), seed=0, requires_grad=False):
    st = draw_fastfood_state(d, m, batch_shape, seed)

    def real(a):
        return torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad)

    return real(st.sign), torch.as_tensor(st.perm), real(st.gauss), real(st.radius)


def definition_matrix(sign, perm, gauss, radius, d):
    """V (M×d) straight from V_k = S_k H G_k Π_k H B_k with dense numpy matrices (unbatched)."""
    k, p = sign.shape
    h = scipy.linalg.hadamard(p).astype(np.float64)
    blocks = []
    for j in range(k):
        pi = np.eye(p)[perm[j].numpy()]  # (Π u)_i = u_{perm_i}
        vk = h @ np.diag(gauss[j].detach().numpy()) @ pi @ h @ np.diag(sign[j].detach().numpy())
        blocks.append(vk)
    v = np.concatenate(blocks, 0)[: radius.shape[-1], :d]
    return v * row_scale(gauss, radius).detach().numpy()[:, None]


def close(a, b, tol=1e-10):
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("d", [1, 3, 8, 17, 64])
def test_matrix_matches_definition(d):
    m = 3 * padded_dim(d) + 5 if d > 1 else 7
    sign, perm, gauss, radius = state_tensors(d, m)
    v = fastfood_matrix(sign, perm, gauss, radius, d)
    assert v.shape == (m, d)
    np.testing.assert_allclose(v.numpy(), definition_matrix(sign, perm, gauss, radius, d), atol=1e-10)


@pytest.mark.parametrize("d", [1, 3, 8, 17, 64])
def test_fwht_equals_dense_batched(d):
    p = padded_dim(d)
    m = 2 * p + 3  # not a multiple of p
    sign, perm, gauss, radius = state_tensors(d, m, (2,))
    x = torch.randn(3, 1, 11, d, dtype=torch.float64)  # own batch dims, broadcast against (2,)
    y_fwht = fastfood_project(x, sign, perm, gauss, radius, "fwht")
    y_dense = fastfood_project(x, sign, perm, gauss, radius, "dense")
    assert y_fwht.shape == (3, 2, 11, m)
    assert close(y_fwht, y_dense)
    # and both equal the definition, batch element by batch element
    for b in range(2):
        v = torch.as_tensor(definition_matrix(sign[b], perm[b], gauss[b], radius[b], d))
        assert close(y_fwht[:, b], x[:, 0] @ v.T)


@pytest.mark.parametrize("d", [1, 3, 8, 17, 64])
def test_gradients_of_both_paths_agree(d):
    p = padded_dim(d)
    m = p + 3
    grads = []
    for strategy in ("fwht", "dense"):
        sign, perm, gauss, radius = state_tensors(d, m, (2,), requires_grad=True)
        x = torch.randn(2, 9, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        y = fastfood_project(x, sign, perm, gauss, radius, strategy)
        w = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        grads.append(torch.autograd.grad((y * w).sum(), (x, sign, gauss, radius)))
    for a, b in zip(*grads):
        assert close(a, b)


def test_gradients_match_autograd_reference():
    """The fused backward equals autograd through the plain composition."""
    from alacarte.features.fastfood import _block_transform

    d, m = 5, 19
    sign, perm, gauss, radius = state_tensors(d, m, (2,), requires_grad=True)
    x = torch.randn(4, d, dtype=torch.float64, requires_grad=True)
    y = fastfood_project(x, sign, perm, gauss, radius, "fwht")
    p = sign.shape[-1]
    u = torch.nn.functional.pad(x, (0, p - d)).unsqueeze(-2)
    u = _block_transform(u, sign.unsqueeze(-3), perm.unsqueeze(-3), gauss.unsqueeze(-3))
    ref = u.reshape(*u.shape[:-2], -1)[..., :m] * row_scale(gauss, radius).unsqueeze(-2)
    assert close(y, ref)
    w = torch.randn(y.shape, dtype=torch.float64)
    g1 = torch.autograd.grad((y * w).sum(), (x, sign, gauss, radius))
    g2 = torch.autograd.grad((ref * w).sum(), (x, sign, gauss, radius))
    for a, b in zip(g1, g2):
        assert close(a, b)


def test_gradcheck_fwht_path():
    sign, perm, gauss, radius = state_tensors(3, 6, requires_grad=True)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: fastfood_project(a[0], a[1], perm, a[2], a[3], "fwht"), (x, sign, gauss, radius)
    )


def test_many_rows_and_float32():
    d, m = 40, 200
    sign, perm, gauss, radius = state_tensors(d, m)
    x = torch.randn(5000, d, dtype=torch.float64)  # several row chunks
    assert close(fastfood_project(x, sign, perm, gauss, radius, "fwht"), fastfood_project(x, sign, perm, gauss, radius, "dense"))
    y32 = fastfood_project(x.float(), sign.float(), perm, gauss.float(), radius.float(), "fwht")
    assert y32.dtype == torch.float32
    assert close(y32.double(), fastfood_project(x, sign, perm, gauss, radius, "dense"), tol=1e-5)


@pytest.mark.parametrize("batch_shape", [(), (2,)])
def test_zero_rows_fwht_path(batch_shape):
    """n = 0 rows (which GPyTorch's kernels accept) on the FWHT path, the default for d > 512: no
    RuntimeError "cannot reshape tensor of 0 elements"."""
    sign, perm, gauss, radius = state_tensors(3, 8, batch_shape, requires_grad=True)
    x = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    y = fastfood_project(x, sign, perm, gauss, radius, "fwht")
    assert y.shape == (*batch_shape, 0, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and sign.grad.abs().max() == 0 and radius.grad.abs().max() == 0


@pytest.mark.parametrize("d", [1, 3, 8, 17, 64])
def test_row_lengths_equal_radius(d):
    m = 2 * padded_dim(d)
    sign, perm, gauss, radius = state_tensors(d, m, (2,))
    p = padded_dim(d)
    v = fastfood_matrix(sign, perm, gauss, radius, p)  # all p columns
    assert torch.allclose(v.norm(dim=-1), radius, rtol=1e-12, atol=0)


def test_draw_is_deterministic():
    a = draw_fastfood_state(10, 50, (2,), 123)
    b = draw_fastfood_state(10, 50, (2,), 123)
    c = draw_fastfood_state(10, 50, (2,), 124)
    for name in ("sign", "perm", "gauss", "radius"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.gauss, c.gauss)
    assert a.sign.shape == (2, math.ceil(50 / 16), 16)
    assert sorted(a.perm[1, 2]) == list(range(16))


def test_strategy_rule_and_errors():
    assert choose_strategy(8) == "dense"
    assert choose_strategy(512) == "dense"
    assert choose_strategy(1024) == "fwht"
    sign, perm, gauss, radius = state_tensors(4, 8)
    with pytest.raises(ValueError):
        fastfood_project(torch.randn(2, 5, dtype=torch.float64), sign, perm, gauss, radius)
    with pytest.raises(ValueError):
        fastfood_project(torch.randn(2, 4, dtype=torch.float64), sign, perm, gauss, radius, "nope")


def test_threads_do_not_share_scratch():
    """Two threads projecting at once wrote into each other's cached scratch (all 20 results wrong)."""
    from concurrency import failures_in_two_threads

    sign, perm, gauss, radius = state_tensors(700, 64)
    xs = [torch.randn(1000, 700, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    expected = [fastfood_project(x, sign, perm, gauss, radius, "fwht") for x in xs]
    expected_grad = [torch.autograd.grad(y.sin().sum(), x)[0] for x, y in zip(xs, expected)]

    def same(i):
        y = fastfood_project(xs[i], sign, perm, gauss, radius, "fwht")
        g = torch.autograd.grad(y.sin().sum(), xs[i])[0]
        return torch.equal(y, expected[i]) and torch.equal(g, expected_grad[i])

    assert failures_in_two_threads(same, repeats=5) == [0, 0]


@pytest.mark.parametrize("strategy", ["dense", "fwht"])
def test_second_derivatives(strategy):
    """The fused backward builds no graph: under create_graph=True its result must not be taken as a
    constant in x, B, G and s (an FSARD Hessian-vector product in the radii would be off by 100%)."""
    sign, perm, gauss, radius = state_tensors(3, 6, (2,), requires_grad=True)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda *a: fastfood_project(a[0], a[1], perm, a[2], a[3], strategy), (x, sign, gauss, radius)
    )
