"""FeatureGP predictions: the D×D fast path, chunks of rows within the memory budget, bad and overflowing inputs."""
import contextlib
import weakref
from unittest import mock

import gpytorch
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import alacarte
from alacarte import ExactRBFGP, FeatureGP, RandomFourierKernel, fit
from alacarte._chunks import rows_within
from alacarte.streaming import DEFAULT_MEMORY_BUDGET

from model_cases import toy_data, feature_model


@contextlib.contextmanager
def forbid_solves_larger_than(max_size):
    """Fail on any Cholesky factorisation larger than max_size×max_size (every
    Cholesky in torch and linear_operator goes through torch.linalg.cholesky_ex)
    and on any CG or Lanczos solve; yield the list of factorised sizes."""
    real_cholesky_ex = torch.linalg.cholesky_ex
    sizes = []

    def guarded_cholesky_ex(a, *args, **kwargs):
        if a.shape[-1] > max_size:
            raise AssertionError(f"a {a.shape[-1]}×{a.shape[-1]} Cholesky was computed")
        sizes.append(a.shape[-1])
        return real_cholesky_ex(a, *args, **kwargs)

    iterative = mock.Mock(side_effect=AssertionError("an iterative n×n solver (CG/Lanczos) was called"))
    with mock.patch("torch.linalg.cholesky_ex", guarded_cholesky_ex), \
         mock.patch("torch.linalg.cholesky", iterative), \
         mock.patch("linear_operator.utils.linear_cg", iterative), \
         mock.patch("linear_operator.utils.lanczos.lanczos_tridiag", iterative):
        yield sizes


def test_fast_path_never_factorises_an_n_by_n_matrix():
    """Training and prediction run on one D×D Cholesky: no n×n factorisation,
    no CG, no Lanczos."""
    x, y = toy_data(n=300)
    model = feature_model(m=16)  # D = 32 ≪ n = 300
    with forbid_solves_larger_than(32) as sizes:
        fit(model, x, y, max_iter=5, progress=False)
        model.predict(torch.randn(50, 3, dtype=torch.float64))
        model.likelihood(model(torch.randn(20, 3, dtype=torch.float64))).variance
    assert sizes and set(sizes) == {32}


def test_training_on_fewer_points_than_features_factorises_the_smaller_n_by_n_matrix():
    """With n < D the likelihood reads the Woodbury identity the other way round:
    training factorises only n×n matrices (the cheaper side); the posterior for
    predictions is still the one D×D factor."""
    x, y = toy_data(n=20)
    model = feature_model(m=32)  # D = 64 > n = 20
    with forbid_solves_larger_than(20) as sizes:
        fit(model, x, y, max_iter=5, progress=False, validation_fraction=0)
    assert sizes and set(sizes) == {20}
    with forbid_solves_larger_than(64) as sizes:
        model.predict(torch.randn(10, 3, dtype=torch.float64))
    assert set(sizes) == {64}


def test_the_guard_above_catches_gpytorchs_dense_paths():
    """Control: the same guard trips on GPyTorch's exact GP (Cholesky) and on its
    default CG path, so the test above can fail."""
    x, y = toy_data(n=300)
    model = ExactRBFGP(x, y, num_dims=3).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with forbid_solves_larger_than(32), pytest.raises(AssertionError, match="Cholesky"), \
         gpytorch.settings.max_cholesky_size(10**6):
        mll(model(x), y)
    with forbid_solves_larger_than(32), pytest.raises(AssertionError, match="iterative"), \
         gpytorch.settings.max_cholesky_size(0):
        mll(model(x), y)


def test_predict_a_million_points_in_bounded_chunks():
    x, y = toy_data(n=100, d=2)
    model = FeatureGP(None, None, RandomFourierKernel(2, 32, seed=0)).double()
    fit(model, x, y, max_iter=3, progress=False)
    features = model.covar_module.features
    rows = []

    def recording_features(inputs):
        rows.append(inputs.shape[-2])
        return features(inputs)

    x_test = torch.randn(1_000_000, 2, dtype=torch.float64)
    with mock.patch.object(model.covar_module, "features", side_effect=recording_features):
        pred = model.predict(x_test, mean_only=True, chunk_size=50_000)
    assert pred.mean.shape == (1_000_000,) and pred.variance is None and pred.observed_variance is None
    training_rows, *test_rows = rows  # the posterior is built once from the 100 training rows
    assert training_rows == 100 and max(test_rows) <= 50_000 and sum(test_rows) == 1_000_000
    # the default chunk keeps one chunk's features, their projection and whitened copy within the default budget
    assert model.chunk_rows() * 3 * model.covar_module.num_features * 8 <= DEFAULT_MEMORY_BUDGET
    ref = model.predict(x_test[:1000])
    assert torch.allclose(pred.mean[:1000], ref.mean, rtol=1e-12, atol=1e-12)


def test_predict_honours_the_memory_budget_its_fit_was_given():
    """fit(memory_budget=b) bounds the model's later predictions by b too, as predict(memory_budget=b)
    does: no chunk's features have more rows than the policy allows within b, and the chunked
    predictions are the unchunked ones."""
    x, y = toy_data(n=300)
    model = feature_model(m=16)  # D = 32
    budget = 2**16
    fit(model, x, y, memory_budget=budget, max_iter=3, restarts=0, progress=False)
    assert model.memory_budget == budget
    x_test = toy_data(n=1000, seed=3)[0]
    whole = model.predict(x_test, chunk_size=len(x_test))
    allowed = rows_within(budget, 3 * 32 * 8)
    assert model.chunk_rows() == allowed < 100
    features, rows = model.covar_module.features, []

    def recording_features(inputs):
        rows.append(inputs.shape[-2])
        return features(inputs)

    in_memory = feature_model(m=16)
    fit(in_memory, x, y, max_iter=3, restarts=0, progress=False)
    in_memory_whole = in_memory.predict(x_test, chunk_size=len(x_test))
    for gp, call, reference in ((model, lambda: model.predict(x_test), whole),
                                (in_memory, lambda: in_memory.predict(x_test, memory_budget=budget), in_memory_whole)):
        rows.clear()
        features = gp.covar_module.features
        with mock.patch.object(gp.covar_module, "features", side_effect=recording_features):
            chunked = call()
        assert max(rows) <= allowed and sum(rows) == len(x_test) and len(rows) > 10
        for a, b in ((chunked.mean, reference.mean), (chunked.variance, reference.variance),
                     (chunked.observed_variance, reference.observed_variance)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="not both"):
        model.predict(x_test, chunk_size=10, memory_budget=budget)
    with pytest.raises(ValueError, match="memory_budget must be a positive integer"):
        model.predict(x_test, memory_budget=0)
    with pytest.raises(ValueError, match="memory_budget=100 bytes is too small"):
        model.predict(x_test, memory_budget=100)


def test_predict_rejects_bad_inputs():
    x, y = toy_data()
    model = feature_model()
    with pytest.raises(ValueError, match="call alacarte.fit"):
        model.predict(x)
    fit(model, x, y, max_iter=2, progress=False)
    with pytest.raises(ValueError, match="4 columns but the model expects 3"):
        model.predict(torch.randn(5, 4))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(torch.full((5, 3), float("nan")))
    with pytest.raises(ValueError, match="numeric"):
        model.predict(np.array([["a", "b", "c"]]))


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_finite_input_that_overflows_once_standardised_is_refused_not_spread_as_nan(make):
    """1.7e308 is finite, (1.7e308 − offset)/scale is not: the exact GP's distance code centres a
    chunk on its mean, so one such row would turn every other row of the chunk into NaN."""
    x, y = toy_data()
    model = make()
    fit(model, x / 10, y, max_iter=2, restarts=0, progress=False)  # input scales 0.2: 1.7e308 / 0.2 = inf
    far = torch.tensor([[1.7e308, 0.0, 0.0], [0.5, 0.5, 0.5], [0.4, 0.6, 0.5]], dtype=torch.float64)
    for query in (model.predict, lambda q: model.predict(q, mean_only=True)):
        with pytest.raises(ValueError, match=r"x rows \[0\] .* overflow to inf once standardised"):
            query(far)
    assert torch.isfinite(model.predict(far[1:]).mean).all()
    if isinstance(model, FeatureGP):
        with pytest.raises(ValueError, match="overflow to inf"):
            model.sample_functions(2, seed=0)(far)


def test_the_posterior_for_prediction_sums_its_statistics_over_chunks_of_training_rows():
    """The eval-mode posterior computed the features of all n training rows at once, n×D (a model fitted on
    10 000 rows with 512 features: +39 MB at its first prediction, +2 MB in chunks; 160 000 rows: 625 MB),
    also in a process that only loads a model and predicts. Without a graph to keep it takes predict's chunks;
    in training mode (the likelihood's graph) all rows stay one product."""
    x, y = toy_data(n=200)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=3, restarts=0, progress=False, validation_fraction=0)
    with torch.no_grad():
        model.train()
        whole = model.posterior()
        model.eval()
    features, rows = model.covar_module.features, []

    def recording_features(inputs):
        rows.append(inputs.shape[-2])
        return features(inputs)

    with mock.patch.object(model, "memory_budget", 64 * 3 * 32 * 8), \
         mock.patch.object(model.covar_module, "features", side_effect=recording_features):
        chunked = model.posterior()
        assert rows == [64, 64, 64, 8]
        rows.clear()
        model.train()
        model.posterior()
        assert rows == [200]
    torch.testing.assert_close(chunked.cholesky, whole.cholesky, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.weights, whole.weights, rtol=1e-10, atol=1e-12)


class _LiveTensors(TorchDispatchMode):
    """Weak references to every tensor a torch operation produced in the block."""

    def __init__(self):
        super().__init__()
        self.refs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.refs += [weakref.ref(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out

    def count(self, rows: int) -> int:
        """How many of them are alive with an axis of ``rows``."""
        return sum(1 for ref in self.refs if (t := ref()) is not None and rows in t.shape)


def test_chunked_predictions_keep_no_chunk_results_while_the_next_chunks_are_computed():
    """predict and sample_functions write each chunk's results into the outputs rather than keep them for a
    final torch.cat: small blocks held while the later chunks' large features come and go fragment glibc's
    heap, and the peak memory grows with the number of test points after all (m = 160 000, 512 features:
    kept, predict +670 MB, draws +296 MB; written, +84 MB and +48 MB, flat in m). At most the previous
    chunk's are alive."""
    x, y = toy_data(n=100)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    x_test = toy_data(n=1000, seed=3)[0]
    whole, draws = model.predict(x_test), model.sample_functions(3, seed=0)
    whole_draws = draws(x_test)
    rows = 37  # an axis length no other tensor here has
    for gp, call in ((model, lambda: model.predict(x_test, chunk_size=rows)), (draws._model, lambda: draws(x_test))):
        features, alive = gp.covar_module.features, []

        def counting_features(inputs, features=features):  # (not a Mock: it would keep every chunk's inputs)
            alive.append(live.count(rows))
            return features(inputs)

        with _LiveTensors() as live, mock.patch.object(gp, "memory_budget", rows * 3 * 32 * 8), \
             mock.patch.object(gp.covar_module, "features", counting_features):
            result = call()
        assert len(alive) == 28 and max(alive) <= 2, alive  # this chunk's inputs, not every chunk's results so far
        if gp is model:
            for a, b in ((result.mean, whole.mean), (result.variance, whole.variance)):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        else:
            torch.testing.assert_close(result, whole_draws, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_row_that_overflows_the_kernels_arithmetic_is_refused_not_predicted_as_nan(make):
    """1.7e308 stays finite once standardised (input scales ~2), but ω·x or the squared distance does
    not: cos(inf) = NaN must not be returned as the prediction (exit 0 from 'alacarte predict')."""
    x, y = toy_data()
    model = make()
    fit(model, x, y, max_iter=2, restarts=0, progress=False)
    far = torch.tensor([[0.5, 0.5, 0.5], [1.7e308, 0.0, 0.0]], dtype=torch.float64)
    assert torch.isfinite(model.internal_query_inputs(far)).all()
    for query in (model.predict, lambda q: model.predict(q, mean_only=True)):
        with pytest.raises(ValueError, match=r"x rows \[1\] .* NaN predictions"):
            query(far)
    if isinstance(model, FeatureGP):
        with pytest.raises(ValueError, match=r"x rows \[1\]"):
            model.sample_functions(2, seed=0)(far)
    reg = alacarte.AlaCarteRegressor("fsard" if isinstance(model, FeatureGP) else "exact-ard", max_iter=2,
                                     restarts=0, progress=False).fit(x.numpy(), y.numpy())
    with pytest.raises(ValueError, match=r"x rows \[1\]"):
        reg.predict(far.numpy(), return_cov=True)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
@pytest.mark.parametrize("x_unit, y_unit", [(1e155, 1.0), (1.0, 1e200), (1e-160, 1e-200)])
def test_predictions_are_equivariant_to_the_units_far_outside_the_range_squares_survive(make, x_unit, y_unit):
    """Rescaling x and y rescales the predictions and nothing else, even where x² or y² overflow
    or underflow (a naive standard deviation is then inf or 0: the fit fails, or is silently
    wrong, scoring R² = 0)."""
    x, y = toy_data(n=60)
    plain, scaled = make(), make()
    fit(plain, x, y, max_iter=5, restarts=1, restart_iter=2, progress=False)
    fit(scaled, x * x_unit, y * y_unit, max_iter=5, restarts=1, restart_iter=2, progress=False)
    a, b = plain.predict(x[:7]), scaled.predict(x[:7] * x_unit)
    torch.testing.assert_close(b.mean / y_unit, a.mean, rtol=1e-8, atol=0)
    if y_unit == 1.0:  # otherwise variances in y's units (y_unit² × O(1)) are beyond float64 themselves
        torch.testing.assert_close(b.variance, a.variance, rtol=1e-6, atol=0)


def test_model_call_in_eval_mode_takes_arrays_and_checks_them():
    x, y = toy_data()
    model = feature_model().eval()
    with pytest.raises(ValueError, match="holds no training data: call alacarte.fit"):
        model(x)
    fit(model, x, y, max_iter=2, progress=False)
    inner = model.internal_inputs(x[:4])
    torch.testing.assert_close(model(inner.numpy()).mean, model(inner).mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match="2 columns but the model expects 3"):
        model(inner[:, :2])


def test_function_samples_are_evaluated_in_bounded_chunks_of_rows():
    """Draws evaluated at m points computed the features of all m rows at once, m×D (at m = 160 000
    and D = 512 the peak memory grew by 954 MB, predict's by 63 MB): they take predict's chunks."""
    x, y = toy_data(n=100)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    draws = model.sample_functions(3, seed=0)
    x_test = toy_data(n=1000, seed=3)[0]
    whole = draws(x_test)
    rows = []
    features = draws._model.covar_module.features

    def recording_features(inputs):
        rows.append(inputs.shape[-2])
        return features(inputs)

    with mock.patch.object(draws._model, "memory_budget", 32 * 8 * 3 * 64), \
         mock.patch.object(draws._model.covar_module, "features", side_effect=recording_features):
        chunked = draws(x_test)
    assert max(rows) == 64 and sum(rows) == 1000
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
