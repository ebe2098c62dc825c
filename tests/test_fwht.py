"""The fast Walsh–Hadamard transform: values, every scheme, autograd, shapes, errors."""
import numpy as np
import pytest
import scipy.linalg
import torch

import alacarte as ac
import alacarte.ops.fwht as ops
from alacarte.ops.fwht import SCHEMES, fwht, fwht_scheme, hadamard_matrix, plan_for

POWERS = [1 << k for k in range(13)]  # 1 … 4096


def reference(x: torch.Tensor) -> torch.Tensor:
    p = x.shape[-1]
    return x @ torch.as_tensor(scipy.linalg.hadamard(p), dtype=x.dtype)


def kron_reference(x: torch.Tensor) -> torch.Tensor:
    """x @ H_p via H_p = H_2 ⊗ H_{p/2} applied recursively (slow, independent)."""
    p = x.shape[-1]
    if p == 1:
        return x.clone()
    a, b = x[..., : p // 2], x[..., p // 2 :]
    return torch.cat([kron_reference(a + b), kron_reference(a - b)], -1)


def close(a, b, tol=1e-10):
    scale = max(1.0, b.abs().max().item())
    return (a - b).abs().max().item() <= tol * scale


@pytest.mark.parametrize("p", POWERS)
def test_matches_scipy_float64(p):
    x = torch.randn(5, p, dtype=torch.float64)
    assert close(fwht(x), reference(x))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("p", [1, 2, 4, 8, 16, 32, 64, 128, 256, 2048])
def test_every_scheme(scheme, p):
    x = torch.randn(33, p, dtype=torch.float64)  # 33 rows: not a multiple of the 16-wide blocks
    assert close(fwht_scheme(x, scheme), reference(x))


@pytest.mark.parametrize("scheme", ["radix2", "gemm_radix2", "kron"])
@pytest.mark.parametrize("p", [1 << 14, 1 << 16])
def test_large_p_against_recursive_reference(scheme, p):
    x = torch.randn(3, p, dtype=torch.float64)
    assert close(fwht_scheme(x, scheme), kron_reference(x))


def test_auto_plan_covers_every_kind_of_step():
    kinds = {step[0] for p in POWERS + [1 << 14, 1 << 16] for step in plan_for(p)}
    assert kinds == {"mm", "bmm", "r2"}
    assert plan_for(1) == ()
    # no dense p×p GEMM for large p
    assert all(step[1] <= 64 for p in [1 << k for k in range(17)] for step in plan_for(p) if step[0] == "mm")


def test_many_rows_cross_chunks():
    x = torch.randn(3000, 512, dtype=torch.float64)  # several row chunks
    assert close(fwht(x), reference(x))


@pytest.mark.parametrize("p", [1, 8, 64, 1024])
def test_float32(p):
    x = torch.randn(7, p, dtype=torch.float32)
    y = fwht(x)
    assert y.dtype == torch.float32
    assert close(y.double(), reference(x.double()), tol=1e-5)


@pytest.mark.parametrize("p", POWERS)
def test_self_inverse(p):
    x = torch.randn(4, p, dtype=torch.float64)
    assert close(fwht(fwht(x)), p * x)


def test_hadamard_matrix():
    np.testing.assert_array_equal(hadamard_matrix(8).numpy(), scipy.linalg.hadamard(8))
    assert torch.equal(fwht(torch.eye(16, dtype=torch.float64)), hadamard_matrix(16))


@pytest.mark.parametrize("p", [1, 2, 16, 128, 512])
def test_gradcheck(p):
    x = torch.randn(3, p, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fwht, (x,))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradcheck_schemes(scheme):
    x = torch.randn(2, 64, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fwht_scheme(t, scheme), (x,))


def test_gradgradcheck():
    x = torch.randn(2, 32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(fwht, (x,))


@pytest.mark.parametrize("shape", [(0, 8), (8,), (2, 3, 16), (2, 0, 4), (4, 1, 3, 256)])
def test_batch_shapes(shape):
    x = torch.randn(*shape, dtype=torch.float64)
    y = fwht(x)
    assert y.shape == x.shape
    assert close(y, reference(x)) if x.numel() else y.numel() == 0


def test_non_contiguous_input():
    base = torch.randn(64, 40, dtype=torch.float64)
    x = base.T[:, :32]  # (40, 32), strided
    assert not x.is_contiguous()
    assert close(fwht(x), reference(x.contiguous()))
    x2 = torch.randn(6, 256, dtype=torch.float64)[::2]
    assert close(fwht(x2), reference(x2.contiguous()))


def test_output_is_fresh_and_input_untouched():
    x = torch.randn(10, 1024, dtype=torch.float64)
    x0 = x.clone()
    y1 = fwht(x)
    y2 = fwht(2 * x)
    assert torch.equal(x, x0)
    assert y1.data_ptr() != y2.data_ptr()
    assert close(y2, 2 * y1)


@pytest.mark.parametrize("p", [0, 3, 6, 100])
def test_not_power_of_two(p):
    with pytest.raises(ValueError, match="power of two"):
        fwht(torch.randn(2, p))


def test_caches_filled_under_inference_mode_still_work_with_autograd():
    """Predicting under torch.inference_mode() first must not break later training (its cached
    buffers would be inference tensors, which cannot be written or saved for backward outside it)."""
    ops._WORKSPACES.clear()
    ops._hadamard_cached.cache_clear()
    ops._blockdiag_cached.cache_clear()
    kernel = ac.FastfoodRBFKernel(5, 64, ard_num_dims=5, seed=0).double()
    x = torch.randn(30, 5, dtype=torch.float64)
    with torch.inference_mode():
        kernel.features(x)
        for scheme in SCHEMES:
            fwht_scheme(torch.randn(3, 256, dtype=torch.float64), scheme)
    features = kernel.features(x)
    features.sum().backward()
    assert torch.isfinite(kernel.raw_lengthscale.grad).all()
    for scheme in SCHEMES:
        y = torch.randn(3, 256, dtype=torch.float64, requires_grad=True)
        fwht_scheme(y, scheme).sum().backward()
        assert torch.allclose(y.grad, hadamard_matrix(256).sum(0).expand(3, -1).contiguous())


def test_threads_do_not_share_scratch():
    """The cached workspaces are shared: two threads transforming at once wrote into each other's scratch
    (3000×1024 rows: 26 of 30 results wrong, by up to 4e3)."""
    from concurrency import failures_in_two_threads

    xs = [torch.randn(1500, 1024, dtype=torch.float64) for _ in range(2)]
    expected = [fwht(x) for x in xs]
    assert failures_in_two_threads(lambda i: torch.equal(fwht(xs[i]), expected[i]), repeats=8) == [0, 0]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_transforms_can_transform():
    """The workspace lock is not inherited held: a child forked (a DataLoader worker, say) while another
    thread held it would wait forever at its first transform."""
    import multiprocessing
    import threading

    held, release = threading.Event(), threading.Event()

    def hold():
        with ops._WORKSPACE_LOCK:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_transform_into, args=(queue,))
        child.start()
        child.join(30)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
    finally:
        release.set()
        holder.join()
    assert not hung
    assert queue.get(timeout=5) == 4.0  # the sum of H_4


def _transform_into(queue):
    queue.put(float(fwht(torch.eye(4, dtype=torch.float64)).sum()))
