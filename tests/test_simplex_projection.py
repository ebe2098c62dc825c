"""The exact Euclidean projection onto the scaled simplex, against KKT solves and SciPy."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import minimize

from alacarte.selection import project_to_simplex
from selection_cases import exhaustive_projection

finite = st.floats(min_value=-100, max_value=100, allow_nan=False, allow_infinity=False)
vectors = st.integers(1, 300).flatmap(lambda d: arrays(np.float64, d, elements=finite))
sizes = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=200, deadline=None)
@given(vectors, sizes)
def test_projection_lies_on_the_simplex(v, size):
    w = project_to_simplex(torch.tensor(v), size)
    assert w.dtype == torch.float64 and w.shape == v.shape
    assert bool((w >= 0).all())
    assert abs(float(w.sum()) - size) <= 1e-12 * max(1.0, size, float(np.abs(v).sum()))


@settings(max_examples=100, deadline=None)
@given(vectors, sizes)
def test_projection_is_idempotent(v, size):
    w = project_to_simplex(torch.tensor(v), size)
    assert torch.allclose(project_to_simplex(w, size), w, rtol=0, atol=1e-12 * max(1.0, size))


@settings(max_examples=100, deadline=None)
@given(vectors, st.randoms(use_true_random=False))
def test_projection_is_permutation_equivariant(v, random):
    order = list(range(v.size))
    random.shuffle(order)
    w = project_to_simplex(torch.tensor(v))
    w_perm = project_to_simplex(torch.tensor(v[order]))
    assert torch.allclose(w_perm, w[order], rtol=0, atol=1e-13)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8).flatmap(lambda d: arrays(np.float64, d, elements=st.floats(-5, 5))), st.floats(0.1, 10))
def test_projection_equals_an_exhaustive_kkt_solve(v, size):
    w = project_to_simplex(torch.tensor(v), size).numpy()
    assert np.allclose(w, exhaustive_projection(v, size), rtol=0, atol=1e-12)


def test_projection_equals_scipy_slsqp_on_random_cases():
    rng = np.random.default_rng(0)
    for d in (2, 5, 20):
        v = rng.normal(size=d)
        result = minimize(lambda w: 0.5 * np.sum((w - v) ** 2), np.full(d, 1 / d), jac=lambda w: w - v,
                          bounds=[(0, None)] * d, method="SLSQP", options={"ftol": 1e-14, "maxiter": 500},
                          constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1, "jac": lambda w: np.ones(d)}])
        assert result.success
        assert np.allclose(project_to_simplex(torch.tensor(v)).numpy(), result.x, atol=1e-6)


def test_projection_is_batched_and_fixes_points_of_the_simplex():
    v = torch.randn(3, 4, 50, dtype=torch.float64)
    sizes = torch.rand(3, 4, dtype=torch.float64) + 0.5
    w = project_to_simplex(v, sizes)
    for i in range(3):
        for j in range(4):
            assert torch.equal(w[i, j], project_to_simplex(v[i, j], float(sizes[i, j])))
    assert torch.allclose(w.sum(-1), sizes, rtol=0, atol=1e-13)
    inside = torch.tensor([0.2, 0.0, 0.8], dtype=torch.float64)
    assert torch.allclose(project_to_simplex(inside), inside, rtol=0, atol=1e-16)
    assert torch.equal(project_to_simplex(torch.tensor([3.0, -1.0, 0.5], dtype=torch.float64)),
                       torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("v, expected", [
    ([1e17, 0.0], [1.0, 0.0]),  # the partial sums of v itself would cancel the size away
    ([1e308, 1e308], [0.5, 0.5]),  # ... or overflow
    ([-1e300, -1e300, -1e300 - 1e285], [0.5, 0.5, 0.0]),
])
def test_projection_of_huge_entries_lies_on_the_simplex(v, expected):
    for dtype in (torch.float64, torch.float32):
        if dtype == torch.float32 and max(map(abs, v)) > 1e38:
            continue
        assert torch.equal(project_to_simplex(torch.tensor(v, dtype=dtype)), torch.tensor(expected, dtype=dtype))
    assert torch.equal(project_to_simplex(torch.tensor([3e7, 1.0, -5.0])), torch.tensor([1.0, 0.0, 0.0]))


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([1.0, float("nan")]), "non-finite"),
    (torch.tensor([1, 2]), "floating"),
    (torch.zeros(0), "non-empty"),
])
def test_projection_rejects_bad_input(bad, message):
    with pytest.raises(ValueError, match=message):
        project_to_simplex(bad)
    with pytest.raises(ValueError, match="size"):
        project_to_simplex(torch.ones(3), -1.0)


def test_projection_refuses_a_size_of_another_shape():
    for size in (torch.ones(4), torch.ones(3, 4), torch.ones(2)):
        with pytest.raises(ValueError, match=r"size must be a number or broadcast to v's leading shape \(3,\)"):
            project_to_simplex(torch.ones(3, 4), size)
