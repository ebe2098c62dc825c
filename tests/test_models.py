"""FeatureGP / ExactRBFGP / fit: the fast path, chunked prediction, bad input, training."""
import contextlib
import copy
import math
import warnings
import weakref
from unittest import mock

import gpytorch
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import alacarte
from alacarte import ExactRBFGP, FeatureGP, FSARDKernel, RandomFourierKernel, WoodburyMarginalLogLikelihood, fit
from alacarte._chunks import rows_within
from alacarte.streaming import DEFAULT_MEMORY_BUDGET, ChunkedData
from alacarte.woodbury import cholesky_with_jitter


def toy_data(n=200, d=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype) * 2 + 5
    y = 10 * torch.sin(x[:, 0]) + x[:, 1] + 0.3 * torch.randn(n, generator=gen, dtype=dtype) + 100
    return x, y


def feature_model(d=3, m=64, seed=0):
    return FeatureGP(None, None, FSARDKernel(d, m, ard_num_dims=d, seed=seed)).double()


def test_public_surface_is_small():
    assert set(alacarte.__all__) == {
        "FeatureKernel", "FastfoodRBFKernel", "FSARDKernel", "FSGBARDKernel", "RandomFourierKernel",
        "SSGPRKernel", "SpectralMixtureFastfoodKernel", "PiecewiseLinearRadialKernel", "FeatureGP", "ExactRBFGP",
        "WoodburyMarginalLogLikelihood", "fit", "AlaCarteRegressor", "list_uci", "load_uci",
        "SRFFRegressor", "RFFNetRegressor", "RFFNetClassifier", "DerivativeSelector",
    }


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


def with_value(t, index, value):
    t = t.clone()
    t[index] = value
    return t


@pytest.mark.parametrize(
    "x_mod, y_mod, message",
    [
        (lambda x: with_value(x, (3, 1), float("nan")), None, "x contains 1 non-finite value.*NaN"),
        (lambda x: with_value(x, (0, 0), float("inf")), None, "x contains.*inf"),
        (None, lambda y: with_value(y, 2, float("nan")), "y contains.*NaN"),
        (None, lambda y: y[:-1], "y has 199 values but x has 200 rows"),
        (lambda x: x[:0], lambda y: y[:0], "x is empty"),
        (lambda x: x[:, :2], None, "x has 2 columns but the model expects 3"),
        (lambda x: x.unsqueeze(0), None, r"x must have shape \(n, d\)"),
        (None, lambda y: torch.stack([y, y], 1), r"y must have shape \(n,\)"),
        # One row or a constant target: the likelihood grows without bound as the variances go to 0.
        (lambda x: x[:1], lambda y: y[:1], "at least 2 training rows.*got n_samples = 1"),
        (None, lambda y: torch.full_like(y, 3.0), "y is constant"),
    ],
)
def test_fit_rejects_bad_data(x_mod, y_mod, message):
    x, y = toy_data()
    x = x_mod(x.clone()) if x_mod else x
    y = y_mod(y.clone()) if y_mod else y
    with pytest.raises(ValueError, match=message):
        fit(feature_model(), x, y, max_iter=2, progress=False)


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
    chunk on its mean, so one such row used to turn every other row of the chunk into NaN."""
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


@pytest.mark.parametrize("ard", [True, False])
def test_exact_predictions_of_a_row_do_not_depend_on_the_other_test_rows(ard):
    """GPyTorch expands squared distances about the test chunk's mean: a row at 1e8 beside
    [0.5, 0.5, 0.5] moved that row's mean by 0.89 (1e10: by 8.7). Each row must stand alone, and a
    row far from the data gets the prior mean."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    good = torch.tensor([[0.5, 0.5, 0.5], [0.1, -0.2, 0.3]], dtype=torch.float64)
    alone = model.predict(good)
    for far in (1e4, 1e8, 1e10, 1e100):
        pred = model.predict(torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good]))
        torch.testing.assert_close(pred.mean[1:], alone.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(pred.variance[1:], alone.variance, rtol=0, atol=1e-12)
        if far >= 1e8:
            prior_mean = model.mean_module.constant.detach() * model.target_scale + model.target_offset
            torch.testing.assert_close(pred.mean[0], prior_mean.reshape(()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_exact_posterior_covariance_of_test_rows_does_not_depend_on_the_other_rows(ard):
    """The test–test block (return_cov, sample_y) expanded ‖a − b‖² too: beside a row at 1e8, the
    covariance of two rows near the data went from 0.00108 to −0.0141 (their draws' correlation
    from 0.98 to −0.06)."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    model.eval()

    def covariance(q):
        with torch.no_grad(), model.inference_settings(), gpytorch.settings.debug(False):
            return model(model.internal_query_inputs(q)).covariance_matrix

    good = torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.6, 0.5]], dtype=torch.float64)
    alone = covariance(good)
    for far in (1e4, 1e8, 1e100):
        cov = covariance(torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good]))
        torch.testing.assert_close(cov[1:, 1:], alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(cov[0, 1:], torch.zeros(2, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_the_joint_test_by_train_and_test_block_older_gpytorch_asks_for_is_centred_on_the_training_rows(ard):
    """GPyTorch up to 1.15.1 evaluates k(test, [train; test]) in one call, not the two blocks 1.15.2
    asks for; centring it on all its rows took the test rows in again, so with GPyTorch 1.11 a row at
    1e8 moved two nearby rows' covariance by 1e-5 and a row at 1.7e308 made the others NaN. Called
    here directly, so that it is checked whichever GPyTorch is installed."""
    x, y = toy_data()
    model = ExactRBFGP(None, None, num_dims=3, ard=ard).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    kernel = model.covar_module.base_kernel.eval()
    train = model.train_inputs[0]
    good = model.internal_query_inputs(torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.6, 0.5]], dtype=torch.float64))
    with torch.no_grad():
        expected = torch.cat([kernel(good, train).to_dense(), kernel(good, good).to_dense()], dim=-1)
        for far in (1e8, 1.7e308):
            test = torch.cat([torch.tensor([[far, 0.0, 0.0]], dtype=torch.float64), good])
            joint = kernel(test, torch.cat([train, test])).to_dense()
            torch.testing.assert_close(joint[1:, :-3], expected[:, :-2], rtol=0, atol=1e-15)
            torch.testing.assert_close(joint[1:, -2:], expected[:, -2:], rtol=0, atol=1e-15)
            if far == 1e8:  # (at 1.7e308 the row's own distances overflow: predict refuses it)
                assert (joint[0, :-3] == 0).all() and joint[0, -3] == 1


class _LargestTensor(TorchDispatchMode):
    """Records the most numbers any one tensor produced by a torch operation held."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numel = max([self.numel] + [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
        return out


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
    """predict and sample_functions kept every chunk's results for a final torch.cat: small blocks held while
    the later chunks' large features came and went fragmented glibc's heap, and the peak memory grew with the
    number of test points after all (m = 160 000, 512 features: predict +670 MB, draws +296 MB; written
    into the outputs, +84 MB and +48 MB, flat in m). Now at most the previous chunk's are alive."""
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


def test_exact_prediction_chunks_bound_the_test_by_test_block():
    """GPyTorch evaluates each chunk's test–test covariance (rows × rows), even for the mean; the chunk
    rows counted only the rows × n cross-covariance (32 MiB / 8n rows): with n = 200 training rows, a
    prediction at 20 000 points formed a 20 000 × 20 000 block (peak RSS +6.1 GB)."""
    x, y = toy_data(n=50)
    model = ExactRBFGP(None, None, num_dims=3).double()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    x_test = toy_data(n=3000, seed=3)[0]
    budget = 8 * 50 * 1000  # bytes: 1000 rows of the cross-covariance alone
    whole = model.predict(x_test)
    with mock.patch.object(model, "memory_budget", budget):
        for mean_only in (True, False):
            with _LargestTensor() as largest:
                chunked = model.predict(x_test, mean_only=mean_only)
            assert largest.numel <= budget // 8
            torch.testing.assert_close(chunked.mean, whole.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.variance, whole.variance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ard", [True, False])
def test_exact_kernel_in_eval_mode_keeps_gpytorchs_last_dim_is_batch_blocks(ard):
    """k(x, x, last_dim_is_batch=True) is one block per input dimension; in eval mode the kernel's
    exact-difference path returned one (n, n) block and GPyTorch raised 'expected shape ... (3, 5, 5)'."""
    kernel = ExactRBFGP(None, None, num_dims=3, ard=ard).double().covar_module.base_kernel
    kernel.lengthscale = torch.tensor([0.7, 1.3, 2.0] if ard else [1.1], dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scaled = (x / kernel.lengthscale).T.unsqueeze(-1)  # (3, 5, 1): one input dimension per block
    expected = (-(scaled - scaled.transpose(-2, -1)).square() / 2).exp()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        for training in (True, False):
            kernel.train(training)
            torch.testing.assert_close(kernel(x, x, last_dim_is_batch=True).to_dense(), expected)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_row_that_overflows_the_kernels_arithmetic_is_refused_not_predicted_as_nan(make):
    """1.7e308 stays finite once standardised (input scales ~2), but ω·x or the squared distance does
    not: cos(inf) = NaN was returned as the prediction (exit 0 from 'alacarte predict')."""
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


def test_fit_rejects_bad_settings():
    x, y = toy_data()
    with pytest.raises(ValueError, match="optimizer"):
        fit(feature_model(), x, y, optimizer="sgd")
    with pytest.raises(ValueError, match="max_iter"):
        fit(feature_model(), x, y, max_iter=0)
    for bad_lr in (-1.0, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="lr must be a finite number in \(0, inf\)"):
            fit(feature_model(), x, y, lr=bad_lr)
    for bad_seed in (-1, 1.5, "0", 2**64):
        with pytest.raises(ValueError, match="seed must be None or an integer"):
            fit(feature_model(), x, y, seed=bad_seed)
    with pytest.raises(ValueError, match="tolerance"):
        fit(feature_model(), x, y, tolerance=float("nan"))
    for bad_flag in ("no", "False", 0, None):  # truthy strings standardised without a word
        with pytest.raises(ValueError, match="standardize must be True or False"):
            fit(feature_model(), x, y, standardize=bad_flag)
    with pytest.raises(ValueError, match="num_dims must be a positive integer"):
        ExactRBFGP(None, None, num_dims=0)
    with pytest.raises(ValueError, match="float32 or float64"):
        fit(feature_model().half(), x, y)
    with pytest.raises(ValueError, match="FeatureKernel"):
        FeatureGP(None, None, gpytorch.kernels.RBFKernel())
    with pytest.raises(ValueError, match="homoskedastic"):
        FeatureGP(None, None, FSARDKernel(3, 8), gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.ones(3)))


def test_a_kernel_of_the_users_own_needs_restarts_0_and_says_so():
    """Restarts initialise only alacarte's kernels: a FeatureKernel subclass without a lengthscale (the
    documented extension, :meth:`projection` alone) raised AttributeError ('raw_lengthscale') instead of
    the ValueError that names restarts=0; with restarts=0 it trains."""
    from alacarte import FeatureKernel

    class Linear(FeatureKernel):
        def projection(self, x):
            return x @ torch.ones(x.shape[-1], self.num_samples, dtype=x.dtype)

    x, y = toy_data()
    with pytest.raises(ValueError, match="no data-driven initialisation for Linear; use restarts=0"):
        fit(FeatureGP(None, None, Linear(x.shape[1], 4)), x, y, max_iter=2, progress=False)
    fit(FeatureGP(None, None, Linear(x.shape[1], 4)), x, y, max_iter=2, restarts=0, progress=False)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_fit_improves_and_is_deterministic(optimizer):
    x, y = toy_data()
    runs = []
    for _ in range(2):
        model = feature_model()
        history = fit(model, x, y, optimizer=optimizer, max_iter=30, restarts=0, progress=False)
        runs.append((history, model.predict(x[:10])))
    (h1, p1), (h2, p2) = runs
    assert h1.loss[-1] < h1.loss[0] - 0.3
    assert h1.loss == h2.loss
    assert torch.equal(p1.mean, p2.mean) and torch.equal(p1.variance, p2.variance)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
@pytest.mark.parametrize("restarts", [0, 1])
def test_fit_takes_data_that_require_grad(make, restarts):
    """Data from an autograd computation train as their values: they failed at the first backward
    ("backward through the graph a second time"; with restarts, "modified by an inplace operation")."""
    x, y = toy_data(n=60)
    settings = dict(max_iter=5, restarts=restarts, restart_iter=2, progress=False)
    model, reference = make(), make()
    history = fit(model, x.clone().requires_grad_(), y.clone().requires_grad_(), **settings)
    assert history.loss == fit(reference, x, y, **settings).loss


def test_fit_leaves_torch_global_generator_alone():
    """fit reset torch's generator to its seed: every kernel built with seed=None after a fit drew the
    same random features (seeds 1895649597198586619 twice), and torch.randn() after any fit gave 1.5410.
    Nothing in a fit draws from it, so fits stay reproducible without the reset."""
    x, y = toy_data(n=60)
    torch.manual_seed(123)
    seeds, losses = [], []
    for _ in range(3):
        kernel = FSARDKernel(3, 16, ard_num_dims=3)  # its seed drawn from torch's generator
        seeds.append(kernel.seed)
        state = torch.get_rng_state()
        fit(FeatureGP(None, None, kernel).double(), x, y, max_iter=3, restarts=1, restart_iter=2, progress=False)
        assert torch.equal(torch.get_rng_state(), state)
        torch.manual_seed(len(seeds))  # another global state: the same fit
        losses.append(fit(feature_model(), x, y, max_iter=3, restarts=1, restart_iter=2, progress=False).loss)
    assert len(set(seeds)) == 3 and losses[0] == losses[1] == losses[2]


def test_a_step_that_underflows_an_unbounded_noise_to_zero_does_not_end_the_fit():
    """With a noise constraint that allows 0 (Positive()), an L-BFGS probe underflowed the float32
    softplus to σ² = 0 exactly; the Woodbury forms refuse σ² ≤ 0, and that ValueError ended the fit
    at n = 20 < D = 32 on targets in the features' span.  Like a probe that breaks the Cholesky, it
    must be a failed step: the fit ends as before the refusal existed (loss -0.2482, σ² 2.9e-7)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=gen)
    kernel = FSARDKernel(2, 16, ard_num_dims=2, seed=0)
    y = kernel.features(x).detach() @ torch.randn(32, generator=gen)  # noise-free: the optimum is σ² → 0
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.Positive())
    model = FeatureGP(None, None, kernel, likelihood)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (jitter and float32 advice)
        history = fit(model, x, y, max_iter=200, restarts=0, standardize=False, progress=False, validation_fraction=0)
    assert math.isfinite(history.loss[-1]) and 0 < float(model.likelihood.noise) < 1e-5


@pytest.mark.parametrize("kind", ["feature", "exact"])
def test_a_fit_that_starts_at_a_nonpositive_noise_is_refused_not_stopped_with_a_warning(kind):
    """A failed step is retried or ends the fit with a warning, but σ² ≤ 0 where the fit starts is the
    model's own setting (restarts=0 under LessThan(0.05): σ² = 0.05 − softplus(0) = −0.64).  Taken as a
    failed step, fit stopped after 0 iterations with a RuntimeWarning and returned the model with σ² < 0;
    it must be the ValueError that names σ²."""
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(x).sum(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.LessThan(0.05))
    if kind == "feature":
        model = FeatureGP(None, None, FSARDKernel(2, 8, ard_num_dims=2, seed=0), likelihood).double()
    else:
        model = ExactRBFGP(None, None, num_dims=2, ard=True, likelihood=likelihood).double()
    assert float(model.likelihood.noise) < 0
    with pytest.raises(ValueError, match=r"σ² must be positive, got -0.64\d* where fit starts"):
        fit(model, x, y, max_iter=5, restarts=0, progress=False)


def test_a_fit_that_starts_at_nan_parameters_is_refused_not_stopped_with_a_warning():
    """As for σ² ≤ 0: a NaN lengthscale where fit starts (restarts=0) was taken for a failed step, and fit
    stopped after 0 iterations with a RuntimeWarning and returned the model with NaN lengthscales."""
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = FeatureGP(None, None, FSARDKernel(2, 8, ard_num_dims=2, seed=0)).double()
    with torch.no_grad():
        model.covar_module.raw_lengthscale.fill_(math.nan)
    with pytest.raises(ValueError, match=r"parameters \['covar_module.raw_lengthscale'\] are NaN where fit starts"):
        fit(model, x, torch.sin(x).sum(-1), max_iter=5, restarts=0, progress=False)


def test_lbfgs_line_search_backtracks_an_overshooting_first_step():
    """One L-BFGS iteration per step(): the first trial step of f(x) = x² from x = 0.1 lands on
    x = −0.1 (no decrease).  Torch's default evaluation budget for max_iter=1 leaves the line
    search none, so it stays at 0.1 for ever (fits "converged" where they had stalled); ours
    must backtrack to the minimum."""
    from alacarte.training._optimization import make_optimizer

    x = torch.tensor([0.1], dtype=torch.float64, requires_grad=True)
    opt = make_optimizer([x], "lbfgs", None)

    def closure():
        opt.zero_grad()
        loss = (x * x).sum()
        loss.backward()
        return loss

    opt.step(closure)
    assert float(x.detach().abs()) < 1e-3


def test_a_converged_fit_is_at_a_stationary_point():
    x, y = toy_data()
    model = FeatureGP(None, None, alacarte.FastfoodRBFKernel(3, 64, ard_num_dims=3, seed=0)).double()
    history = fit(model, x, y, max_iter=300, restarts=2, restart_iter=5, progress=False, validation_fraction=0)
    assert history.converged
    from alacarte.training import marginal_log_likelihood

    model.train()
    loss = -marginal_log_likelihood(model)(model(model.train_inputs[0]), model.train_targets)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    assert max(float(g.abs().max()) for g in grads) < 1e-3


def test_a_constant_column_is_centred_not_divided_by_round_off():
    """A constant column's computed std can be round-off rather than 0 (1/3s: ~1e-17 in
    the streamed two-pass sums, and in torch's std of a whole vector); dividing by it
    would turn round-off into an O(1) input. In memory and streamed, it gets scale 1."""
    x, y = toy_data(n=50)
    x[:, 1] = 1 / 3
    assert float((x[:, 1] - x[:, 1].sum() / 50).square().sum()) > 0  # the round-off guarded against
    model = feature_model()
    model.standardize(x, y)
    streamed = feature_model()
    streamed.set_standardization(*ChunkedData(x, y, chunk_size=7).moments(streamed))
    for m in (model, streamed):
        assert float(m.input_scale[1]) == 1.0
        assert torch.allclose(m.input_scale[[0, 2]], x[:, [0, 2]].std(0), rtol=1e-12)
        assert float(m.internal_inputs(x)[:, 1].abs().max()) < 1e-15
    constant_y = torch.full_like(y, 1 / 3)
    assert float(constant_y.std()) > 0
    model.standardize(x, constant_y)
    assert float(model.target_scale) == 1.0
    with pytest.raises(ValueError, match="y is constant"):  # fit refuses it (test_fit_rejects_bad_data); so do moments
        ChunkedData(x, constant_y, chunk_size=7).moments(streamed)


def test_standardisation_gives_original_units():
    """Predictions come back in the targets' units: equal to a model trained on
    hand-standardised data, mapped back by hand."""
    x, y = toy_data()
    model = feature_model()
    fit(model, x, y, max_iter=20, progress=False)
    pred = model.predict(x)
    rmse = (pred.mean - y).pow(2).mean().sqrt()
    assert rmse < 0.2 * y.std()
    xs = (x - x.mean(0)) / x.std(0)
    ys = (y - y.mean()) / y.std()
    manual = feature_model()
    fit(manual, xs, ys, max_iter=20, progress=False, standardize=False)
    manual_pred = manual.predict(xs)
    assert torch.allclose(pred.mean, manual_pred.mean * y.std() + y.mean(), rtol=1e-7, atol=1e-7)
    assert torch.allclose(pred.variance, manual_pred.variance * y.var(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
@pytest.mark.parametrize("x_unit, y_unit", [(1e155, 1.0), (1.0, 1e200), (1e-160, 1e-200)])
def test_predictions_are_equivariant_to_the_units_far_outside_the_range_squares_survive(make, x_unit, y_unit):
    """Rescaling x and y rescales the predictions and nothing else, even where x² or y² overflow
    or underflow (a naive standard deviation is then inf or 0: the fit failed, or was silently
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


def test_exact_baseline_same_api_and_agrees_with_gpytorch():
    x, y = toy_data(n=120)
    model = ExactRBFGP(None, None, num_dims=3, ard=True).double()
    history = fit(model, x, y, max_iter=30, progress=False)
    assert history.loss[-1] < history.loss[0]
    pred = model.predict(x[:15], chunk_size=4)
    # The same posterior, computed densely by hand from GPyTorch's fitted kernel.
    xs = model.internal_inputs(x)
    ys = model.train_targets
    with torch.no_grad():
        k = model.covar_module(xs).to_dense()
        noise = model.likelihood.noise
        k_star = k[:15]
        mean = model.mean_module.constant + k_star @ torch.linalg.solve(k + noise * torch.eye(120, dtype=x.dtype), ys - model.mean_module.constant)
        var = k.diagonal()[:15] - (k_star * torch.linalg.solve(k + noise * torch.eye(120, dtype=x.dtype), k_star.T).T).sum(-1)
    assert torch.allclose(pred.mean, mean * y.std() + y.mean(), rtol=1e-8)
    assert torch.allclose(pred.variance, var * y.var(), rtol=1e-6, atol=1e-10)


def test_feature_gp_with_exact_hyperparameters_approaches_exact_gp():
    """Given the exact ARD GP's fitted hyperparameters, the Fastfood GP's predictions
    approach the exact GP's as M grows (the kernel converges, so does the posterior)."""
    x, y = toy_data(n=150)
    exact = ExactRBFGP(None, None, num_dims=3, ard=True).double()
    fit(exact, x, y, max_iter=50, restarts=0, progress=False)
    x_test = toy_data(n=100, seed=1)[0]
    reference = exact.predict(x_test)
    errors = []
    for m in (256, 4096):
        approx = FeatureGP(None, None, alacarte.FastfoodRBFKernel(3, m, ard_num_dims=3, seed=0)).double()
        approx.load_state_dict(exact.state_dict(), strict=False)  # mean, noise, standardisation
        approx.covar_module.lengthscale = exact.covar_module.base_kernel.lengthscale.detach()
        approx.covar_module.outputscale = exact.covar_module.outputscale.detach()
        approx.set_train_data(*exact.train_inputs, exact.train_targets, strict=False)
        approx.eval()
        errors.append((approx.predict(x_test).mean - reference.mean).abs().max().item())
    # (the fitted noise is small, 0.2% of the target's variance, so the mean is sensitive to the kernel)
    assert errors[1] < 0.03 * y.std() and errors[1] < errors[0] / 2, errors


def test_jitter_escalation_warns_and_recovers():
    a = torch.ones(4, 4, dtype=torch.float32)  # rank one: Cholesky fails without jitter
    with pytest.warns(RuntimeWarning, match="jitter"):
        factor = cholesky_with_jitter(a)
    assert torch.isfinite(factor).all()
    with pytest.raises(ValueError, match="not positive definite"):
        cholesky_with_jitter(torch.full((3, 3), float("nan")))


def test_an_unstandardised_fit_whose_noise_bound_exceeds_the_targets_variance_says_so():
    """Targets of scale 1e-8 with standardize=False: the bound 1e-4 (in y's units) is above var y, so the
    model predicts about the mean. The warning said it 'interpolates its training targets ... in
    standardised units', the opposite on both counts."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 3, generator=gen, dtype=torch.float64)
    y = 1e-8 * torch.sin(6 * x[:, 0])
    model = feature_model()
    with pytest.warns(RuntimeWarning, match=r"lower bound \(1.0e-04 in the targets' units, standardize=False\) "
                                            r"is not below the targets' variance") as caught:
        fit(model, x, y, standardize=False, max_iter=20, restarts=0, progress=False, validation_fraction=0)
    assert not any("interpolates" in str(w.message) for w in caught)
    mean = model.predict(x).mean
    assert float(mean.std()) < 0.01 * float(y.std())  # indeed about the mean: the targets were taken for noise


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_fit_that_ends_with_the_noise_at_its_lower_bound_warns_and_counts_repeated_rows(make):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 3, generator=gen, dtype=torch.float64)
    x = torch.cat([x, x[:7]])  # seven rows twice, their targets equal: σ² → 0 pays
    y = torch.sin(3 * x[:, 0]) + x[:, 1]  # and noise-free
    model = make()
    with pytest.warns(RuntimeWarning, match="lower bound .* repeat 7 rows"):
        history = fit(model, x, y, max_iter=50, restarts=0, progress=False, validation_fraction=0)
    # The refit from a larger noise was tried, went no lower, and was dropped.
    assert history.noise_refit_loss >= float(alacarte.training.current_loss(model, *model.train_inputs,
                                                                             model.train_targets))
    assert model.likelihood.noise.item() < 2e-4
    noisy = y + 0.3 * torch.randn(len(y), generator=gen, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = make()
        fit(model, x, noisy, max_iter=50, restarts=0, progress=False, validation_fraction=0)
    assert model.likelihood.noise.item() > 1e-2  # the first fit's warning was about its noise, not the data


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_a_fit_stalled_at_the_noise_lower_bound_is_refitted_from_a_larger_noise(make):
    """Started with σ² at its lower bound, L-BFGS stalls there (the constraint's softplus flattens the
    gradient): without the refit FSARD ends at a loss of 1.05 per point and exact ARD at 0.19, against
    -1.64 and -1.54 from σ² = 0.01 (the data's noise is 0.0016 in standardised units)."""
    x, y = toy_data(n=200)
    model, reference = make(), make()
    model.likelihood.noise, reference.likelihood.noise = 1.00001e-4, 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor does it warn about the bound: it left it
        history = fit(model, x, y, max_iter=100, restarts=0, progress=False, validation_fraction=0)
        fit(reference, x, y, max_iter=100, restarts=0, progress=False, validation_fraction=0)
    x_std, y_std = model.train_inputs[0], model.train_targets  # the reference's too: the same standardisation
    final = alacarte.training.current_loss(model, x_std, y_std)
    assert history.noise_refit_loss == pytest.approx(final)  # the refit was kept
    assert final < alacarte.training.current_loss(reference, x_std, y_std) + 0.05
    assert 0.5 < model.likelihood.noise.item() / reference.likelihood.noise.item() < 2


@pytest.mark.parametrize("upper", [0.05, 0.005, 3e-4])
def test_a_noise_with_an_upper_bound_is_initialised_and_refitted_inside_it(upper):
    """σ² = 0.01 (initialisation) or 0.1 (noise refit) × the target variance above an Interval's upper
    bound raised GPyTorch's RuntimeError: at 0.05 after the whole fit, in the refit; at 0.005 and 3e-4
    before it, in the first restart."""
    x, _ = toy_data(n=100)
    y = 10 * torch.sin(x[:, 0]) + x[:, 1]  # noise-free: the fit ends at the lower bound and is refitted
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.Interval(1e-4, upper))
    model = FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0), likelihood).double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, x, y, max_iter=20, restarts=1, restart_iter=3, progress=False, validation_fraction=0)
    assert 0.99e-4 < model.likelihood.noise.item() <= upper
    # where σ² ends within twice its lower bound the refit runs, from 0.1 × var y moved inside the interval
    # (under 3e-4 = 3 × the lower bound the fit may end above 2e-4, not at the bound)
    at_bound = any("ended at its lower bound" in str(w.message) for w in caught)
    assert at_bound == (history.noise_refit_loss is not None) and (at_bound or upper < 1e-3)


def test_a_noise_with_no_lower_bound_is_initialised_inside_it():
    """The middle of a LessThan constraint's (-inf, high) was σ² = -inf (7ea2f3c): set_noise put it there
    (no error), every restart failed at once and fit returned the model with σ² = -inf and no loss; and
    asked for 0.1 under LessThan(0.05), the setter refused it.  A variance lies in (0, high): kept 1% of
    it inside, as for an Interval; below that σ² is set as asked, as before."""
    from alacarte.init import set_noise

    def model(high):
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.LessThan(high))
        return FeatureGP(None, None, FSARDKernel(3, 16, ard_num_dims=3, seed=0), likelihood).double()

    for high, expected in ((1.0, 0.1), (0.05, 0.0495)):
        m = model(high)
        set_noise(m, 0.1)
        assert m.likelihood.noise.item() == pytest.approx(expected)
    x, y = toy_data(n=60)
    m = model(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a step to σ² < 0 ends it: the constraint allows that)
        history = fit(m, x, y, max_iter=5, restarts=1, restart_iter=3, progress=False)
    assert math.isfinite(history.restart_losses[0]) and m.likelihood.noise.item() > 0


def test_an_upper_bound_alone_does_not_lift_small_initial_values():
    """Under an upper bound alone, 85bc5f4 kept initial values 1% of (0, b) inside it at both ends:
    LessThan(10) lifted σ² = 0.01 var y to 0.1, and ARD lengthscales of ~0.02 (inputs in units of 100)
    all to 0.1, erasing their data-driven differences.  0 bounds nothing there: only b is kept off."""
    from alacarte.init import initialize

    gen = torch.Generator().manual_seed(0)
    x = 0.01 * torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(40, generator=gen, dtype=torch.float64)
    initial = []
    for constraint in (gpytorch.constraints.Positive(), gpytorch.constraints.LessThan(10.0)):
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=copy.deepcopy(constraint))
        kernel = FSARDKernel(3, 8, ard_num_dims=3, seed=0, lengthscale_constraint=copy.deepcopy(constraint))
        model = FeatureGP(None, None, kernel, likelihood).double()
        initialize(model, x, y, np.random.default_rng(0), 0, standardized=False)
        initial.append((model.likelihood.noise.item(), model.covar_module.lengthscale.detach()))
    (noise, lengthscale), (bounded_noise, bounded_lengthscale) = initial
    assert noise == pytest.approx(0.01 * y.var().item()) and bool((lengthscale < 0.05).all())
    assert bounded_noise == pytest.approx(noise, rel=1e-12)
    torch.testing.assert_close(bounded_lengthscale, lengthscale, rtol=1e-12, atol=0)


def test_a_noise_that_is_not_trained_is_left_at_its_bound():
    x, y = toy_data(n=100)
    model = feature_model()
    model.likelihood.noise = 1.00001e-4
    model.likelihood.noise_covar.raw_noise.requires_grad_(False)
    with pytest.warns(RuntimeWarning, match="is fixed \\(not trained\\) at its lower bound") as caught:
        history = fit(model, x, y, max_iter=20, restarts=0, progress=False)
    assert not any("refit" in str(w.message) for w in caught)  # none ran: the warning does not claim one
    assert history.noise_refit_loss is None and model.likelihood.noise.item() == pytest.approx(1.00001e-4)


@pytest.mark.parametrize("make", [feature_model, lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_state_dict_reload_gives_bit_identical_predictions(make, tmp_path):
    x, y = toy_data(n=80)
    model = make()
    fit(model, x, y, max_iter=10, progress=False)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = make()
    fresh.load_state_dict(torch.load(path))
    fresh.set_train_data(*model.train_inputs, model.train_targets, strict=False)
    fresh.eval()
    x_test = toy_data(n=30, seed=2)[0]
    a, b = model.predict(x_test), fresh.predict(x_test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


@pytest.mark.parametrize("make", [
    lambda: feature_model(),
    lambda: FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 64, num_components=4, seed=0)).double(),
    lambda: FeatureGP(None, None, alacarte.PiecewiseLinearRadialKernel(3, 64, num_components=4, ard_num_dims=3, seed=0)).double(),
    lambda: FeatureGP(None, None, alacarte.SSGPRKernel(3, 32, seed=0)).double(),
    lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double(),
])
def test_restarts_are_reproducible_and_keep_the_best(make):
    x, y = toy_data(n=120)
    runs = []
    for seed in (0, 0, 1):
        model = make()
        history = fit(model, x, y, restarts=4, restart_iter=5, max_iter=5, seed=seed, progress=False, validation_fraction=0)
        runs.append((history, {k: v.clone() for k, v in model.state_dict().items()}))
    (h1, s1), (h2, s2), (h3, _) = runs
    assert len(h1.restart_losses) == 4
    assert h1.restart_losses == h2.restart_losses and h1.loss == h2.loss
    assert all(torch.equal(s1[k], s2[k]) for k in s1)  # bit for bit
    assert h1.chosen_restart == int(np.argmin(h1.restart_losses))
    assert h1.restart_losses != h3.restart_losses  # another seed, other initialisations
    # training continued from the chosen restart: its first loss is that restart's loss
    assert abs(h1.loss[0] - h1.restart_losses[h1.chosen_restart]) < 1e-9


def test_numpy_integers_are_integers():
    """A grid search hands settings over as numpy integers."""
    x, y = toy_data()
    a, b = feature_model(), feature_model()
    fit(a, x, y, max_iter=3, restarts=2, restart_iter=2, seed=4, progress=False)
    fit(b, x, y, max_iter=np.int64(3), restarts=np.int64(2), restart_iter=np.int32(2), seed=np.uint32(4),
        progress=False)
    assert torch.equal(a.predict(x).mean, b.predict(x).mean)


def test_fit_rejects_bad_restart_settings():
    x, y = toy_data()
    with pytest.raises(ValueError, match="restarts"):
        fit(feature_model(), x, y, restarts=-1)
    with pytest.raises(ValueError, match="restart_iter"):
        fit(feature_model(), x, y, restarts=2, restart_iter=0)


def _failures(kind: str) -> Exception:
    from linear_operator.utils.errors import NanError, NotPSDError

    from alacarte.woodbury import NotPositiveDefiniteError

    return {"gpytorch": NotPSDError, "nan": NanError, "woodbury": NotPositiveDefiniteError}[kind]("simulated")


def _fit_with_failing_steps(model, failing_calls, error):
    """fit() with L-BFGS steps that, at the given call numbers, leave the parameters at a bad
    point and raise what a broken factorisation raises."""
    x, y = toy_data(n=60)
    real_step = torch.optim.LBFGS.step
    calls = []

    def failing_step(self, closure):
        calls.append(1)
        if len(calls) in failing_calls:
            for group in self.param_groups:  # the probe leaves parameters at a bad point
                for p in group["params"]:
                    p.data.fill_(1e6)
            raise _failures(error)
        return real_step(self, closure)

    with mock.patch.object(torch.optim.LBFGS, "step", failing_step):
        history = fit(model, x, y, restarts=0, max_iter=10, progress=False)
    return history, x


MODELS = [
    ("gpytorch", lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()),
    ("nan", lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()),
    ("woodbury", lambda: feature_model()),
]


@pytest.mark.parametrize("error, make", MODELS)
def test_two_broken_factorisations_in_a_row_stop_training_at_the_last_good_state(error, make):
    model = make()
    with pytest.warns(RuntimeWarning, match="last good parameters are kept"):
        history, x = _fit_with_failing_steps(model, {4, 5}, error)
    assert history.iterations == 3 and not history.converged
    assert all(torch.isfinite(p).all() and p.abs().max() < 1e5 for p in model.parameters())
    assert torch.isfinite(model.predict(x[:5]).mean).all()


@pytest.mark.parametrize("error, make", MODELS)
def test_one_broken_factorisation_is_retried_from_the_last_good_state(error, make):
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "training stopped"
        history, x = _fit_with_failing_steps(model, {4}, error)
    assert history.iterations >= 4  # it went on past the failure
    assert all(torch.isfinite(p).all() and p.abs().max() < 1e5 for p in model.parameters())
    assert all(b <= a + 1e-9 * abs(a) for a, b in zip(history.loss, history.loss[1:]))


def test_posterior_is_factorised_once_across_predict_calls():
    x, y = toy_data(n=80)
    model = feature_model()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    with mock.patch("alacarte.models.WoodburyPosterior", wraps=alacarte.models.WoodburyPosterior) as built:
        for _ in range(3):
            model.predict(x[:10])
        model(x[:5]).variance
    assert built.call_count == 1
    model.train()
    model.eval()
    with mock.patch("alacarte.models.WoodburyPosterior", wraps=alacarte.models.WoodburyPosterior) as built:
        model.predict(x[:10])
    assert built.call_count == 1  # training mode invalidated the cache
    with pytest.raises(ValueError, match="chunk_size"):
        model.predict(x[:10], chunk_size=0)


def test_posterior_function_samples_match_the_predictive_moments():
    x, y = toy_data(n=100)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=10, restarts=0, progress=False)
    x_test = toy_data(n=6, seed=3)[0]
    draws = model.sample_functions(40000, seed=1)
    values = draws(x_test)  # (k, m), original units
    assert values.shape == (40000, 6)
    pred = model.predict(x_test)
    with torch.no_grad():
        latent_cov = model(model.internal_inputs(x_test)).covariance_matrix * model.target_scale**2
    sd = pred.variance.sqrt()
    assert ((values.mean(0) - pred.mean).abs() < 5 * sd / 200).all()  # 5 standard errors, k = 40000
    empirical = torch.cov(values.T)
    assert torch.allclose(empirical, latent_cov, rtol=0.05, atol=0.05 * sd.max().item() ** 2)
    again = model.sample_functions(40000, seed=1)(x_test)
    assert torch.equal(values, again)
    with pytest.raises(ValueError, match="num_samples"):
        model.sample_functions(0)
    for seed in (-1, 1.5, 2**70):
        with pytest.raises(ValueError, match=r"seed must be None or an integer in \[0, 2\*\*64\)"):
            model.sample_functions(2, seed=seed)


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


def test_priors_on_our_constrained_parameters_enter_the_likelihood_and_survive_pickling():
    """outputscale_prior= registers through the shared helper: its log density (at the
    constrained value) is added to the marginal likelihood, and the kernel still pickles."""
    import pickle

    torch.manual_seed(0)
    x, y = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, dtype=torch.float64)
    prior = gpytorch.priors.GammaPrior(2.0, 3.0)
    for num_samples in (16, 32):  # D = 32 < n = 40 (statistics path), D = 64 > n (n×n path)
        with_prior = FeatureGP(x, y, FSARDKernel(3, num_samples, ard_num_dims=3, seed=0,
                                                 outputscale_prior=prior)).double()
        plain = FeatureGP(x, y, FSARDKernel(3, num_samples, ard_num_dims=3, seed=0)).double()
        plain.load_state_dict(with_prior.state_dict(), strict=False)  # (the prior has buffers)
        kernel = with_prior.covar_module
        kernel.outputscale = 0.7
        plain.covar_module.outputscale = 0.7
        losses = []
        for model in (with_prior, plain):
            model.train()
            mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
            losses.append(float(mll(model(x), y).detach()))
        expected = float(prior.log_prob(torch.tensor(0.7, dtype=torch.float64))) / len(y)  # (prior now float64)
        assert losses[0] - losses[1] == pytest.approx(expected, rel=1e-10)
    assert isinstance(kernel.outputscale_prior, gpytorch.priors.GammaPrior)
    clone = pickle.loads(pickle.dumps(kernel))
    assert torch.equal(clone.outputscale, kernel.outputscale)


def test_woodbury_likelihood_refuses_a_target_that_does_not_match_the_prior():
    """GPyTorch's exact likelihood broadcasts an (n, 1) target into an n-batch of losses and
    fails inside a subtraction on a wrong length; ours says what the target must be."""
    x, y = toy_data(n=40)
    model = FeatureGP(x, y, FSARDKernel(3, 8, ard_num_dims=3, seed=0)).double().train()
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    prior = model(x)
    for bad in (y[:-1], y[:, None]):
        with pytest.raises(ValueError, match=r"target must have shape \(\*batch, n\) with n = 40"):
            mll(prior, bad)
    with pytest.raises(ValueError, match="non-finite"):
        mll(prior, with_value(y.clone(), 3, float("nan")))
    torch.testing.assert_close(mll(prior, torch.stack([y, y]))[1], mll(prior, y))  # batches of targets still work


def test_woodbury_likelihood_refuses_a_target_batch_that_does_not_broadcast():
    """A batch-(2,) model given targets (3, n) failed with torch's 'Attempting to broadcast a dimension
    of length 3' from inside the statistics (GPyTorch's: 'LinearOperator cannot be multiplied')."""
    x, y = toy_data(n=30)
    kernel = FSARDKernel(3, 8, seed=0, batch_shape=torch.Size([2]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([2]))
    model = FeatureGP(x, y, kernel, likelihood).double().train()
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    prior = model(x)
    with pytest.raises(ValueError, match=r"a batch that broadcasts with the prior's \(2,\), got \(3, 30\)"):
        mll(prior, torch.stack([y, y, y]))
    assert mll(prior, torch.stack([y, -y])).shape == (2,)


@pytest.mark.parametrize("make", [lambda: feature_model(), lambda: ExactRBFGP(None, None, num_dims=3, ard=True).double()])
def test_restarts_leave_the_parameters_a_user_froze_alone(make):
    x, y = toy_data(n=80)
    model = make()
    with torch.no_grad():
        model.likelihood.noise = 0.3
        model.covar_module.outputscale = 2.0
        model.mean_module.constant.fill_(0.5)
    for raw in (model.likelihood.noise_covar.raw_noise, model.covar_module.raw_outputscale,
                model.mean_module.raw_constant):
        raw.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fit(model, x, y, restarts=3, restart_iter=3, max_iter=3, progress=False)
    # (GPyTorch's setters take a Python number through float32)
    assert float(model.likelihood.noise) == pytest.approx(0.3, rel=1e-7)
    assert float(model.covar_module.outputscale) == pytest.approx(2.0, rel=1e-7)
    assert float(model.mean_module.constant) == pytest.approx(0.5, rel=1e-7)


def test_a_step_to_non_finite_parameters_is_undone_not_kept():
    """A finite loss with a NaN gradient (from the 5th evaluation on) steps Adam to NaN parameters. The
    fit stops there with the last finite parameters (it used to keep the NaN ones and then fail deep
    inside the Cholesky)."""
    x, y = toy_data(n=100, dtype=torch.float32)
    model = FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0)).float()
    calls = [0]

    def nan_from_the_fifth(grad):
        calls[0] += 1
        return grad * float("nan") if calls[0] >= 5 else grad

    model.covar_module.raw_outputscale.register_hook(nan_from_the_fifth)
    with pytest.warns(RuntimeWarning, match="last good parameters are kept"):
        history = fit(model, x, y, optimizer="adam", lr=0.1, max_iter=30, restarts=0, progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(np.isfinite(history.loss)) and torch.isfinite(model.predict(x[:5]).mean).all()


def test_unstandardised_targets_start_from_their_own_variance():
    from alacarte.init import initialize

    x, y = toy_data(n=200)
    y = 1000 * y + 5
    for model in (feature_model(), ExactRBFGP(None, None, num_dims=3).double(),
                  FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 64, num_components=4, seed=0)).double(),
                  FeatureGP(None, None, alacarte.PiecewiseLinearRadialKernel(3, 64, num_components=2, ard_num_dims=3,
                                                                             seed=0)).double()):
        initialize(model, x, y, np.random.default_rng(0))
        kernel = model.covar_module
        signal = (kernel.weights.sum() if hasattr(kernel, "weights") else kernel.outputscale).detach()
        assert float(signal) == pytest.approx(float(y.var()), rel=1e-9), type(kernel).__name__
        assert float(model.likelihood.noise.detach()) == pytest.approx(0.01 * float(y.var()), rel=1e-6)


def test_ard_and_isotropic_initial_lengthscales_relate_as_documented():
    """alacarte.init's docstring said the sqrt(d) factor made an ARD initialisation of isotropic data
    equal the isotropic one; it is 0.67× it at large d (the median of |N(0, 2)| is 0.95, a full
    distance ~ sqrt(2d))."""
    from alacarte.init import _lengthscales, pair_distances

    for d, ratio in ((2, 0.81), (10, 0.70), (100, 0.676)):
        x = torch.randn(4000, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        diffs = pair_distances(x, np.random.default_rng(0), 20_000)
        ard, isotropic = _lengthscales(diffs, 0.5, True), _lengthscales(diffs, 0.5, False)
        assert float(ard.mean() / isotropic) == pytest.approx(ratio, abs=0.02), d


def test_restarts_start_inside_the_constraints_the_user_set():
    """A data-driven value outside a user's constraint was refused by the setter, so fit failed at
    its first restart: lengthscale_constraint=Interval(0.05, 1) against an initial 1.66 ("lengthscale
    must be ... strictly inside (0.05, 1)"), GM scales in (0.9, 2) against 0.6, a noise in (1e-3, 5e-3)
    against 0.01 (GPyTorch's RuntimeError)."""
    from gpytorch.constraints import Interval

    x, y = toy_data(n=100)
    models = [
        FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0, lengthscale_constraint=Interval(0.05, 1.0))),
        FeatureGP(None, None, alacarte.SpectralMixtureFastfoodKernel(3, 32, num_components=2, seed=0,
                                                                     scales_constraint=Interval(0.9, 2.0))),
        FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0),
                  likelihood=gpytorch.likelihoods.GaussianLikelihood(noise_constraint=Interval(1e-3, 5e-3))),
        ExactRBFGP(None, None, num_dims=3, ard=True),
    ]
    models[-1].covar_module.base_kernel.register_constraint("raw_lengthscale", Interval(0.05, 1.0))
    # an upper bound alone: the lengthscales (1.66) are inside it (the first version of the fix made them NaN)
    models.append(FeatureGP(None, None, FSARDKernel(3, 32, ard_num_dims=3, seed=0,
                                                    lengthscale_constraint=gpytorch.constraints.LessThan(10.0))))
    for model in models:
        model.double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (a noise at its bound, on purpose)
            history = fit(model, x, y, restarts=2, restart_iter=2, max_iter=2, progress=False)
        assert all(np.isfinite(history.restart_losses)), type(model.covar_module).__name__


@pytest.mark.parametrize("unit", [1e160, 1e-170])
def test_unstandardised_targets_whose_variance_is_not_a_float_are_refused_by_name(unit):
    """var y of targets in units of 1e160 (1e-170) is inf (0) in float64; the restarts' initialisation
    then failed with "outputscale must be finite and strictly inside (0, inf), got inf" (got 0.0),
    which names neither the targets nor a remedy."""
    x, y = toy_data(n=50)
    with pytest.raises(ValueError, match=r"the targets' variance is (inf|0) .*standardize=True"):
        fit(feature_model(), x, unit * y, standardize=False, restarts=1, restart_iter=1, max_iter=1, progress=False)


def test_restarts_of_a_simplex_kernel_with_a_fixed_size_start_from_different_points():
    x, y = toy_data(n=100, d=4)
    kernel = FSARDKernel(4, 32, ard_num_dims=4, simplex=True, learn_simplex_size=False, seed=0)
    model = FeatureGP(None, None, kernel).double()
    history = fit(model, x, y, restarts=3, restart_iter=3, max_iter=2, progress=False)
    assert len(set(history.restart_losses)) == 3  # (all three used to start from uniform π, the same point)


def test_models_refuse_what_they_cannot_train():
    x, y = toy_data(n=50)
    with pytest.raises(ValueError, match="homoskedastic gpytorch.likelihoods.GaussianLikelihood.*FixedNoise"):
        ExactRBFGP(None, None, num_dims=3,
                   likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.full((50,), 0.01)))
    frozen = feature_model()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of the model is frozen"):
        fit(frozen, x, y, restarts=0, progress=False)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        alacarte.factory.make_model("fsard", 3, dtype=torch.int64)
    # π alone trainable: no optimiser for the rest, projected-gradient steps on π still run
    kernel = FSARDKernel(3, 32, ard_num_dims=3, simplex=True, learn_simplex_size=False, seed=0)
    model = FeatureGP(None, None, kernel).double()
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith("simplex_weights"))
    before = kernel.simplex_weights.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = fit(model, x, y, restarts=0, max_iter=5, progress=False)
    assert history.iterations >= 1 and not torch.equal(kernel.simplex_weights.detach(), before)


def test_a_cached_posterior_follows_load_state_dict_and_dtype_changes():
    """The posterior cached in eval mode belongs to the parameters and dtype it was computed with
    (GPyTorch's own models drop their caches on load_state_dict and convert them with .to())."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=20, seed=2)[0]
    fitted, other = feature_model(), feature_model()
    fit(fitted, x, y, max_iter=10, restarts=0, progress=False)
    fit(other, x, y + 5 * x[:, 2], max_iter=10, restarts=0, progress=False)
    expected = fitted.predict(x_test)
    other.predict(x_test)  # caches other's posterior
    other.load_state_dict(fitted.state_dict())
    other.set_train_data(*fitted.train_inputs, fitted.train_targets, strict=False)
    got = other.predict(x_test)
    assert torch.equal(got.mean, expected.mean) and torch.equal(got.variance, expected.variance)

    # .float() after predicting: as a model converted before it ever predicted
    never_queried = copy.deepcopy(fitted).float()
    converted = copy.deepcopy(fitted)
    converted.predict(x_test)
    converted.float()
    a, b = converted.predict(x_test.float()), never_queried.predict(x_test.float())
    assert a.mean.dtype == torch.float32 and converted.posterior().cholesky.dtype == torch.float32
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)

    # a streamed posterior has no rows to be recomputed from: it moves with the model,
    # and parameters loaded into the model drop it
    streamed = copy.deepcopy(fitted)
    streamed.cache_posterior(x, y)
    streamed.float()
    assert streamed.posterior().cholesky.dtype == torch.float32
    torch.testing.assert_close(streamed.predict(x_test).mean, expected.mean.float(), rtol=1e-4, atol=1e-3)
    streamed.load_state_dict(fitted.float().state_dict())
    with pytest.raises(ValueError, match="no training data"):
        streamed.predict(x_test)


def test_an_exact_gp_that_predicted_changes_dtype_like_one_that_never_did():
    """GPyTorch keeps an ExactGP's prediction cache through .double()/.float(); ours drops it."""
    x, y = toy_data(n=60)
    x_test = toy_data(n=10, seed=2)[0]
    fitted = ExactRBFGP(None, None, num_dims=3, ard=True)  # float32, GPyTorch's default
    fit(fitted, x.float(), y.float(), max_iter=3, restarts=0, progress=False)
    never_queried = copy.deepcopy(fitted).double()
    fitted.predict(x_test)  # caches the float32 prediction strategy
    a, b = fitted.double().predict(x_test), never_queried.predict(x_test)
    assert a.mean.dtype == torch.float64
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert torch.equal(fitted.float().predict(x_test).mean, never_queried.float().predict(x_test).mean)


def test_a_batched_feature_gp_predicts_each_batch_with_its_own_noise():
    x, y = toy_data(n=40)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([3]))
    kernel = FSARDKernel(3, 16, ard_num_dims=3, seed=0, batch_shape=torch.Size([3]))
    model = FeatureGP(x, y, kernel, likelihood).double()
    model.likelihood.noise = torch.tensor([[0.01], [0.1], [1.0]])
    model.eval()
    x_test = toy_data(n=3, seed=2)[0]  # as many test points as batches: a wrong axis broadcasts silently
    whole = model.predict(x_test)
    chunked = model.predict(x_test, chunk_size=2)
    assert whole.mean.shape == whole.variance.shape == (3, 3)
    torch.testing.assert_close(chunked.mean, whole.mean)  # equal up to the triangular solves' blocking
    torch.testing.assert_close(chunked.variance, whole.variance)
    with torch.no_grad():
        reference = model.likelihood(model(x_test)).variance  # GPyTorch's, internal = original units here
    torch.testing.assert_close(whole.observed_variance, reference)
    torch.testing.assert_close(whole.observed_variance - whole.variance,
                               torch.tensor([0.01, 0.1, 1.0], dtype=torch.float64)[:, None].expand(3, 3))
    assert model.sample_functions(5, seed=0)(x_test).shape == (3, 5, 3)


def test_a_feature_gp_refuses_a_kernel_with_active_dims():
    kernel = FSARDKernel(2, 16, ard_num_dims=2, active_dims=[1, 0], seed=0)
    with pytest.raises(ValueError, match="select the columns in the data instead"):
        FeatureGP(None, None, kernel)


@pytest.mark.parametrize("kind", ["feature", "exact"])
def test_predictions_follow_hyperparameters_changed_in_eval_mode(kind):
    """A posterior cached by one predict() belongs to the parameters it was computed from: setting
    the noise, a lengthscale or the constant mean afterwards (no .train() in between) gives the
    predictions of a model that never predicted with the old values, not the cached ones."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=20, seed=2)[0]
    model = feature_model() if kind == "feature" else ExactRBFGP(None, None, num_dims=3, ard=True).double()
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    changes = [
        lambda m: setattr(m.likelihood, "noise", m.likelihood.noise * 3),
        lambda m: setattr(_lengthscaled(m), "lengthscale", _lengthscaled(m).lengthscale * 1.7),
        lambda m: m.mean_module.constant.data.add_(0.5),  # in place, through .data
    ]
    for change in changes:
        model.predict(x_test)  # caches the posterior
        fresh = copy.deepcopy(model)
        fresh.train()  # drops the copy's cache
        fresh.eval()
        with torch.no_grad():
            change(model)
            change(fresh)
        got, expected = model.predict(x_test), fresh.predict(x_test)
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(got.variance, expected.variance, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            torch.testing.assert_close(model(x_test).mean, fresh(x_test).mean, rtol=1e-12, atol=1e-10)


def _lengthscaled(model):
    kernel = model.covar_module
    return kernel if isinstance(model, FeatureGP) else kernel.base_kernel


def test_prior_mode_gives_the_prior_in_eval_mode_as_in_gpytorch():
    """model(x) under gpytorch.settings.prior_mode is the prior, as for any ExactGP (and ExactRBFGP);
    FeatureGP's eval-mode __call__ returned the posterior regardless."""
    x, y = toy_data(n=80)
    x_test = toy_data(n=10, seed=2)[0]
    for model in (feature_model(), ExactRBFGP(None, None, num_dims=3, ard=True).double()):
        fit(model, x, y, max_iter=3, restarts=0, progress=False)
        model.eval()
        inner = model.internal_inputs(x_test)
        with torch.no_grad():
            model(inner)  # a cached posterior must not leak into prior mode either
            with gpytorch.settings.prior_mode(True):
                got = model(inner)
            expected = model.forward(inner)
            torch.testing.assert_close(got.mean, expected.mean)
            torch.testing.assert_close(got.covariance_matrix, expected.covariance_matrix)
            assert model(inner).variance.max() < 0.5 * expected.variance.min()  # and the posterior after it


def test_eval_mode_gradients_wrt_test_inputs_work_on_every_call():
    """Optimising over test inputs (an acquisition function) calls model(x) and backward() repeatedly.
    FeatureGP cached its posterior with the autograd graph of the first call, so the second
    backward() failed ('Trying to backward through the graph a second time'); GPyTorch's
    ExactGP detaches its test caches (gpytorch.settings.detach_test_caches, on by default)."""
    x, y = toy_data(n=80)
    model = feature_model()
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    model.eval()
    x_test = model.internal_inputs(toy_data(n=5, seed=2)[0]).clone().requires_grad_(True)
    grads = []
    for _ in range(2):
        x_test.grad = None
        model(x_test).mean.sum().backward()
        grads.append(x_test.grad.clone())
    assert torch.equal(grads[0], grads[1])
    eps = 1e-6
    with torch.no_grad():
        shifted = [model(x_test + eps * e).mean - model(x_test - eps * e).mean for e in torch.eye(3, dtype=x.dtype)]
    torch.testing.assert_close(grads[0], torch.stack(shifted, -1) / (2 * eps), rtol=1e-6, atol=1e-8)
    model(x_test).variance.sum().backward()  # the variance too


def test_function_samples_stay_the_functions_drawn():
    """Draws are weights w for the features φ they were drawn with: a FunctionSamples evaluated
    φ_new(x)ᵀw with whatever kernel the model had at call time, so after the model's lengthscales
    changed (a refit, a setter) the old draws were functions of neither posterior."""
    x, y = toy_data(n=100)
    x_test = toy_data(n=20, seed=2)[0]
    model = feature_model(m=16)
    fit(model, x, y, max_iter=5, restarts=0, progress=False)
    draws = model.sample_functions(8, seed=0)
    before = draws(x_test)
    with torch.no_grad():
        model.covar_module.lengthscale = model.covar_module.lengthscale * 3
        model.mean_module.constant.add_(1.0)
    model.set_standardization(model.input_offset + 1, model.input_scale * 2, model.target_offset + 5,
                              model.target_scale * 2)
    assert torch.equal(draws(x_test), before)


def test_get_fantasy_model_conditions_on_the_added_rows_as_gpytorch_does():
    """FeatureGP.get_fantasy_model raised GPyTorch's "Call the model on some data first!" even after
    model(x) (its eval path keeps no GPyTorch prediction cache).  The fantasy must predict what a
    plain GPyTorch ExactGP with the same kernel predicts after its own get_fantasy_model, for one
    fantasy and a batch of f = 3, and leave the model itself alone."""

    class PlainGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood, kernel):
            super().__init__(x, y, likelihood)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), kernel

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    gen = torch.Generator().manual_seed(0)
    x, x_new, x_test = (torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (40, 5, 7))
    y, y_new = torch.sin(x.sum(-1)), torch.randn(3, 5, generator=gen, dtype=torch.float64)
    model = FeatureGP(x, y, FSARDKernel(3, 16, ard_num_dims=3, seed=0)).double()
    with torch.no_grad():
        model.likelihood.noise = torch.tensor(0.05, dtype=torch.float64)
        model.mean_module.constant.fill_(0.3)
    plain = PlainGP(x, y, copy.deepcopy(model.likelihood), copy.deepcopy(model.covar_module)).double()
    plain.mean_module.load_state_dict(model.mean_module.state_dict())
    model.eval()
    plain.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**6):
        before = model(x_test).mean
        plain(x_test)  # GPyTorch needs its cache first
        for targets in (y_new[0], y_new):
            got = model.get_fantasy_model(x_new, targets)(x_test)
            expected = plain.get_fantasy_model(x_new, targets)(x_test)
            torch.testing.assert_close(got.mean, expected.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(got.variance, expected.variance, rtol=0, atol=1e-12)
        torch.testing.assert_close(model(x_test).mean, before, rtol=0, atol=0)
    assert model.train_inputs[0].shape == (40, 3)
    with pytest.raises(ValueError, match="targets"):
        model.get_fantasy_model(x_new, y_new[0, :4])
    with pytest.raises(ValueError, match="non-finite"):
        model.get_fantasy_model(x_new, y_new[0].clone().fill_(float("nan")))


@pytest.mark.parametrize("part", ["kernel", "mean", "noise"])
def test_fit_refuses_a_batch_of_models_by_name(part):
    """A batch-shaped kernel, mean or noise crashed fit with torch's 'grad can be implicitly created only
    for scalar outputs' (one loss per member); fit trains one model at a time and now says so."""
    x = torch.randn(30, 2, dtype=torch.float64)
    y = torch.sin(x[:, 0])
    batch = torch.Size([2])
    kernel = FSARDKernel(2, 8, seed=0, batch_shape=batch if part == "kernel" else torch.Size([]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch if part == "noise" else torch.Size([]))
    model = FeatureGP(x, y, kernel, likelihood).double()
    if part == "mean":
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=batch).double()
    with pytest.raises(ValueError, match=f"one model at a time; this one has a batch_shape in its {part}"):
        fit(model, x, y, max_iter=2, progress=False)
    exact = ExactRBFGP(x, y, num_dims=2).double()
    exact.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch),
                                                      batch_shape=batch).double()
    with pytest.raises(ValueError, match="batch_shape in its kernel"):
        fit(exact, x, y, max_iter=2, progress=False)


@pytest.mark.parametrize("mean", ["zero", "linear"])
def test_fit_trains_a_mean_of_the_users_own_with_restarts_0(mean):
    """The batch check read the mean's .constant, which a ZeroMean or LinearMean does not have: fit, which had
    trained such a model with restarts=0, raised AttributeError. A batched ZeroMean is still refused by name."""
    x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x[:, 0])
    model = FeatureGP(x, y, FSARDKernel(2, 8, seed=0)).double()
    model.mean_module = (gpytorch.means.ZeroMean() if mean == "zero" else gpytorch.means.LinearMean(2)).double()
    history = fit(model, x, y, max_iter=3, restarts=0, progress=False)
    assert history.loss[-1] < history.loss[0]
    model.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([2]))
    with pytest.raises(ValueError, match="batch_shape in its mean"):
        fit(model, x, y, max_iter=3, restarts=0, progress=False)


@pytest.mark.parametrize("mean", ["zero", "linear"])
def test_restarts_leave_a_mean_of_the_users_own_as_it_is(mean):
    """The restarts' initialisation set model.mean_module.constant, which a ZeroMean or LinearMean does not
    have: fit with restarts (the default) raised AttributeError. It now initialises the kernel and the noise
    and leaves such a mean alone (a ZeroMean stays zero: the targets are standardised)."""
    x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x[:, 0])
    model = FeatureGP(x, y, FSARDKernel(2, 8, seed=0)).double()
    model.mean_module = (gpytorch.means.ZeroMean() if mean == "zero" else gpytorch.means.LinearMean(2)).double()
    history = fit(model, x, y, max_iter=3, restarts=2, restart_iter=2, progress=False)
    assert len(history.restart_losses) == 2 and history.loss[-1] < history.loss[0]


def test_a_kernel_of_the_users_own_is_refused_before_any_data_is_read():
    """With restarts, a FeatureKernel of the user's own was refused only at the first initialisation: a
    streamed fit had read its 20 chunks three times (moments, target moments, the restarts' sample) and
    set the noise variance (0.3 -> 0.01) first."""
    from alacarte import FeatureKernel

    class Linear(FeatureKernel):
        def projection(self, x):
            return x @ torch.ones(x.shape[-1], self.num_samples, dtype=x.dtype)

    x, y = toy_data()
    reads = []

    class Chunks:
        def __iter__(self):
            for start in range(0, x.shape[0], 10):
                reads.append(start)
                yield x[start : start + 10], y[start : start + 10]

    model = FeatureGP(None, None, Linear(x.shape[1], 4)).to(x.dtype)
    model.likelihood.noise = 0.3
    with pytest.raises(ValueError, match="no data-driven initialisation for Linear; use restarts=0"):
        fit(model, Chunks(), None, max_iter=2, progress=False)
    assert reads == [] and abs(model.likelihood.noise.item() - 0.3) < 1e-6


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_feature_gp_without_training_rows_has_the_prior_posterior(training):
    """Summing the statistics over chunks of rows (528a68a) left nothing to sum for a model given no rows:
    eval mode raised TypeError 'reduce() of empty iterable', training mode ValueError 'range() arg 3 must not
    be zero', where the one product gave the prior (weights 0, A = σ²I)."""
    x, y = toy_data(n=50)
    model = feature_model(m=16)
    fit(model, x, y, max_iter=3, restarts=0, progress=False)
    (inputs,) = model.train_inputs
    model.set_train_data(inputs[:0], model.train_targets[:0], strict=False)
    model.train(training)
    posterior = model.posterior()
    assert torch.equal(posterior.weights, torch.zeros_like(posterior.weights))
    noise = model.likelihood.noise.detach().squeeze()
    torch.testing.assert_close(posterior.cholesky, noise.sqrt() * torch.eye(32, dtype=noise.dtype))
