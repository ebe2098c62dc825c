"""The streamed likelihood equals the in-memory Woodbury path; out-of-core input to fit."""
import copy

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import alacarte
from alacarte import ExactRBFGP, FeatureGP, FSARDKernel, SpectralMixtureFastfoodKernel
from alacarte.mll import WoodburyMarginalLogLikelihood
from alacarte.streaming import ChunkedData, rows_per_chunk, streamed_negative_mll, streamed_statistics
from streaming_case import AugmentedChunks, make_case


def _in_memory_loss_and_grads(model, x, y):
    """The reference: WoodburyMarginalLogLikelihood on all rows at once (model's standardisation applied)."""
    model.zero_grad()
    inner, target = model.internal_inputs(x), (y - model.target_offset) / model.target_scale
    model.set_train_data(inner, target, strict=False)
    model.train()
    loss = -WoodburyMarginalLogLikelihood(model.likelihood, model)(model(inner), target)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return loss.detach(), grads


def _streamed_loss_and_grads(model, data):
    model.zero_grad()
    model.train()
    loss = streamed_negative_mll(model, data)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return loss, grads


def _assert_same(a, b, tol=1e-10):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.allclose(loss_a, loss_b, rtol=tol, atol=tol), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=tol, atol=tol), name


@pytest.mark.parametrize("chunk_size", [1, 7, 20, 61, 1000])
def test_streamed_loss_and_every_gradient_equal_the_in_memory_path(chunk_size):
    x, y, model = make_case()
    with torch.no_grad():  # a non-trivial standardisation, applied chunk by chunk
        model.set_standardization(x.mean(0), x.std(0), y.mean(), y.std())
    reference = _in_memory_loss_and_grads(model, x, y)
    assert all(g.abs().max() > 0 for g in reference[1].values())  # every parameter is exercised
    assert {"likelihood.noise_covar.raw_noise", "mean_module.raw_constant",
            "covar_module.raw_radius", "covar_module.raw_lengthscale"} <= reference[1].keys()
    _assert_same(_streamed_loss_and_grads(model, ChunkedData(x, y, chunk_size=chunk_size)), reference)


def test_streamed_statistics_equal_the_in_memory_n_by_n_path_when_n_is_below_d():
    """With n = 61 < D = 128 the in-memory likelihood factorises the n×n K, the streamed one
    the D×D A: two different computations of the same number (priors included)."""
    x, y, model = make_case(num_samples=64)
    with torch.no_grad():
        model.set_standardization(x.mean(0), x.std(0), y.mean(), y.std())
    reference = _in_memory_loss_and_grads(model, x, y)
    _assert_same(_streamed_loss_and_grads(model, ChunkedData(x, y, chunk_size=20)), reference, tol=1e-9)


def test_streamed_gradients_of_a_mixture_kernel_equal_the_in_memory_path():
    x, y, _ = make_case()
    kernel = SpectralMixtureFastfoodKernel(3, 16, num_components=2, seed=3)
    model = FeatureGP(None, None, kernel).double()
    _assert_same(_streamed_loss_and_grads(model, ChunkedData(x, y, chunk_size=9)), _in_memory_loss_and_grads(model, x, y))


def test_memmap_iterator_and_dataloader_inputs_equal_tensors(tmp_path):
    x, y, model = make_case()
    reference = _streamed_loss_and_grads(model, ChunkedData(x, y, chunk_size=13))
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    x_map, y_map = np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    uneven = [(x[:5], y[:5]), (x[5:40].numpy(), y[5:40].numpy()), (x[40:], y[40:])]
    loader = DataLoader(TensorDataset(x, y), batch_size=11)
    for data in (ChunkedData(x_map, y_map, chunk_size=13), ChunkedData(uneven, chunk_size=13),
                 ChunkedData(loader, memory_budget=2**20)):
        _assert_same(_streamed_loss_and_grads(model, data), reference, tol=1e-12)


def test_a_shuffling_dataloader_gives_the_loss_and_gradient_of_the_rows_in_order():
    x, y, model = make_case()
    reference = _streamed_loss_and_grads(model, ChunkedData(x, y, chunk_size=13))
    shuffled = DataLoader(TensorDataset(x, y), batch_size=11, shuffle=True, generator=torch.Generator().manual_seed(5))
    _assert_same(_streamed_loss_and_grads(model, ChunkedData(shuffled)), reference, tol=1e-12)


def test_a_second_pass_over_other_rows_is_refused():
    """The gradient pass must see the rows the statistics pass saw; else the gradient is another loss's."""
    x, y, model = make_case()
    dropping = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=True,
                          generator=torch.Generator().manual_seed(5))  # 61 rows: 5 others dropped each pass
    for source in (dropping, AugmentedChunks(x, y, 1e-6)):
        with pytest.raises(ValueError, match="other rows on a second pass than on the first"):
            _streamed_loss_and_grads(model, ChunkedData(source))
        with pytest.raises(ValueError, match="other rows on a second pass than on the first"):
            ChunkedData(source).moments(model)  # the two passes of the standardisation
    # a loss without gradient reads the data once: nothing to compare
    assert torch.isfinite(streamed_negative_mll(model, ChunkedData(dropping), backward=False))
    assert _streamed_loss_and_grads(model, ChunkedData(AugmentedChunks(x, y, 0.0)))[0].isfinite()
    from alacarte._chunks import RowTally  # the same rows whose column sums overflow still match

    huge = RowTally(1, "cpu")
    huge.add(torch.tensor([[1e308], [1e308], [-1e308], [-1e308]], dtype=torch.float64), torch.zeros(4))
    assert not huge.sums.isfinite().all() and huge.matches(huge)


def test_the_row_count_survives_a_float32_sum_over_many_processes():
    """n travels in the float32 all-reduce of the statistics; 64 processes of ~2²⁰ rows and one of
    3·10⁹ must still sum to the exact count (two base-2²⁰ parts would not: the low ones pass 2²⁴)."""
    from alacarte.streaming import _N_DIGITS, _pack_rows, _unpack

    counts = [2**20 - 1 - k for k in range(64)] + [3 * 10**9, 1]
    total = torch.zeros(4 + 2 + 1 + _N_DIGITS, dtype=torch.float32)
    for rows in counts:
        buffer = torch.zeros_like(total)
        _pack_rows(buffer, rows)
        assert _unpack(buffer, 2).n == rows
        total += buffer
    assert _unpack(total, 2).n == sum(counts)


def test_chunks_never_exceed_the_chunk_size():
    x, y, model = make_case()
    seen = []
    features = model.covar_module.features
    model.covar_module.features = lambda inputs: seen.append(inputs.shape[0]) or features(inputs)
    streamed_negative_mll(model, ChunkedData(x, y, chunk_size=8))
    assert max(seen) == 8 and sum(seen) == 2 * len(x)  # two passes, chunks of at most 8 rows


def test_rows_per_chunk_follows_the_memory_budget():
    rows = rows_per_chunk(2048, 18, 8, 2**30)
    assert 5 * 2048**2 * 8 + rows * 6 * 2048 * 8 <= 2**30 < 5 * 2048**2 * 8 + (rows + 1) * 7 * 2048 * 8
    with pytest.raises(ValueError, match="memory_budget=.* too small"):
        rows_per_chunk(2048, 18, 8, 100 * 2**20)


def test_streamed_fit_from_a_memmap_equals_the_in_memory_fit(tmp_path):
    x, y, model = make_case()
    state = copy.deepcopy(model.state_dict())
    # streamed fits use every row: so must the in-memory one compared with them
    history = alacarte.fit(model, x, y, restarts=2, restart_iter=3, max_iter=15, progress=False, validation_fraction=0)
    expected_state, expected = copy.deepcopy(model.state_dict()), model.predict(x[:9])

    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    x_map, y_map = np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    model.load_state_dict(state)
    streamed = alacarte.fit(model, x_map, y_map, chunk_size=10, restarts=2, restart_iter=3, max_iter=15, progress=False)
    assert model.train_inputs is None  # nothing of the training data is held
    assert len(streamed.loss) == len(history.loss)
    assert np.allclose(streamed.loss, history.loss, rtol=1e-9, atol=1e-9)
    for name, value in expected_state.items():
        assert torch.allclose(model.state_dict()[name], value, rtol=1e-8, atol=1e-8), name
    pred = model.predict(x[:9])  # from the posterior streamed at the end of the fit
    for a, b in zip(pred, expected):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-7)

    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    model.load_state_dict(state)
    alacarte.fit(model, loader, restarts=2, restart_iter=3, max_iter=15, progress=False)
    for name, value in expected_state.items():
        assert torch.allclose(model.state_dict()[name], value, rtol=1e-8, atol=1e-8), name


def test_an_unstandardised_streamed_fit_refits_from_the_noise_the_in_memory_fit_does():
    """The noise refit starts from 0.1 × the target variance, streamed too: taking 1 for it is right
    only for standardised targets (here var y = 214: refit losses −2.381 from 1, −1.309 from 0.1 × var y)."""
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(200, 2)))
    y = 30 * torch.sin(x[:, 0]) * torch.cos(x[:, 1])  # noise-free: σ² ends at its bound, and is refitted
    settings = dict(restarts=0, max_iter=15, standardize=False, progress=False)
    models = [FeatureGP(None, None, FSARDKernel(2, 32, ard_num_dims=2, seed=0)).double() for _ in range(2)]
    with pytest.warns(RuntimeWarning, match="lower bound"):
        in_memory = alacarte.fit(models[0], x, y, validation_fraction=0, **settings)
    with pytest.warns(RuntimeWarning, match="lower bound"):
        streamed = alacarte.fit(models[1], x, y, chunk_size=50, **settings)
    assert in_memory.noise_refit_loss is not None
    # (a near-interpolating fit: round-off grows to ~1e-6 over the refit's 15 iterations)
    assert np.isclose(streamed.noise_refit_loss, in_memory.noise_refit_loss, rtol=1e-5)
    assert np.allclose(streamed.loss, in_memory.loss, rtol=1e-8, atol=1e-8)
    x_test = torch.as_tensor(rng.normal(size=(5, 2)))
    assert torch.allclose(models[1].predict(x_test).mean, models[0].predict(x_test).mean, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("standardize", [True, False])
def test_a_streamed_fit_initialises_the_mean_and_noise_from_all_targets(monkeypatch, standardize):
    """Restarts initialise from the first 10 000 rows, but the mean constant and σ² = 0.01 var y came
    from those rows too: with rows sorted by y (a time series, a file sorted by its target) the
    streamed fit started at constant −0.568 (standardised; 3.76 unstandardised), the in-memory fit
    at 0 (5.01)."""
    import alacarte.training._stages as stages

    starts = []

    def recorded(model, *args, **kwargs):
        initialize(model, *args, **kwargs)
        starts.append((float(model.mean_module.constant.detach()), float(model.likelihood.noise.detach())))

    initialize = stages.initialize
    monkeypatch.setattr(stages, "initialize", recorded)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(15_000, 2)))
    y = 3 * torch.sin(x[:, 0]) + x[:, 1] + 5
    order = torch.argsort(y)
    x, y = x[order], y[order]
    settings = dict(restarts=1, restart_iter=1, max_iter=1, standardize=standardize, progress=False)
    for chunks in (None, 5000):
        model = FeatureGP(None, None, FSARDKernel(2, 8, ard_num_dims=2, seed=0)).double()
        alacarte.fit(model, x, y, chunk_size=chunks, **settings)
    (mean, noise), (streamed_mean, streamed_noise) = starts
    assert streamed_mean == pytest.approx(mean, rel=1e-9, abs=1e-9)
    assert streamed_noise == pytest.approx(noise, rel=1e-9)


def test_a_big_endian_memmap_trains_and_predicts_like_native_arrays(tmp_path):
    """A .npy file written big-endian (another machine's, a FITS table's) memory-maps with a
    non-native dtype, which torch refuses ("byte order different from the native byte order")."""
    x, y, model = make_case()
    state = copy.deepcopy(model.state_dict())
    settings = dict(chunk_size=10, restarts=0, max_iter=3, progress=False)
    alacarte.fit(model, x.numpy(), y.numpy(), **settings)
    expected_state, expected = copy.deepcopy(model.state_dict()), model.predict(x[:9])
    np.save(tmp_path / "x.npy", x.numpy().astype(">f8"))
    np.save(tmp_path / "y.npy", y.numpy().astype(">f8"))
    x_map, y_map = np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    assert not x_map.dtype.isnative
    model.load_state_dict(state)
    alacarte.fit(model, x_map, y_map, **settings)
    for name, value in expected_state.items():
        assert torch.equal(model.state_dict()[name], value), name
    got = model.predict(x_map[:9])
    assert torch.equal(got.mean, expected.mean) and torch.equal(got.variance, expected.variance)


def test_cache_posterior_predicts_like_the_in_memory_posterior():
    x, y, model = make_case()
    alacarte.fit(model, x, y, restarts=0, max_iter=3, progress=False)
    expected = model.predict(x[:7])
    draws = model.sample_functions(3, seed=1)(x[:7])
    model.cache_posterior([(x[:30], y[:30]), (x[30:], y[30:])], chunk_size=4)
    assert model.train_inputs is None
    for a, b in zip(model.predict(x[:7]), expected):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)
    assert torch.allclose(model.sample_functions(3, seed=1)(x[:7]), draws, rtol=1e-10, atol=1e-10)
    model.train()  # the streamed posterior is stale once training resumes
    with pytest.raises(ValueError, match="cache_posterior"):
        model.eval().predict(x[:7])


def test_float64_statistics_keep_a_float32_model_accurate():
    # Small noise and many features: A = ΦᵀΦ + σ²I spans ~7 decades, beyond float32.  (σ² below
    # alacarte._mixed_precision.MIN_NOISE: features widened before any product; tests/test_mixed_precision.py above it.)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 4, generator=gen, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.01 * torch.randn(2000, generator=gen, dtype=torch.float64)
    model64 = FeatureGP(None, None, FSARDKernel(4, 128, ard_num_dims=4, seed=0)).double()
    model64.likelihood.noise = 1e-4
    model32 = FeatureGP(None, None, FSARDKernel(4, 128, ard_num_dims=4, seed=0))
    model32.load_state_dict(model64.state_dict())

    def flat(grads):
        return torch.cat([g.reshape(-1).double() for g in grads.values()])

    loss, grads = _streamed_loss_and_grads(model64, ChunkedData(x, y, chunk_size=500))
    wide_loss, wide_grads = _streamed_loss_and_grads(model32, ChunkedData(x, y, chunk_size=500, statistics_dtype=torch.float64))
    plain_loss, plain_grads = _in_memory_loss_and_grads(model32, x.float(), y.float())
    assert wide_loss.dtype == torch.float64 and plain_loss.dtype == torch.float32

    def error(other_loss, other_grads):
        return (abs(float(other_loss) - float(loss)) / abs(float(loss)),
                float((flat(other_grads) - flat(grads)).norm() / flat(grads).norm()))

    wide, plain = error(wide_loss, wide_grads), error(plain_loss, plain_grads)
    assert wide[0] < 1e-6 and wide[1] < 1e-5, wide
    # The plain float32 loss's error depends on the platform's rounding: 9.6× the wide one's with the
    # oldest supported torch on one CPU; its gradient's stays well above 10×.
    assert plain[0] > 3 * wide[0] and plain[1] > 10 * wide[1], (plain, wide)

    # fit takes the same option; the in-memory tensors are then streamed.
    history = alacarte.fit(model32, x.float()[:500], y.float()[:500], statistics_dtype=torch.float64,
                           restarts=0, max_iter=3, progress=False)
    # Three iterations end with σ² still at its bound, where it started: three more from a larger noise, kept.
    assert history.iterations == 6 and history.noise_refit_loss is not None and np.isfinite(history.loss).all()


def test_rows_of_zero_dimensional_tensors_are_fitted_as_rows_not_taken_for_chunks():
    # list(zip(a, b)) of two 1-D tensors: rows of two columns, each a pair of 0-d tensors — not
    # (x, y) chunks, whose parts hold rows (not refused with 'x holds (x, y) chunks ...').
    generator = torch.Generator().manual_seed(0)
    a, b, noise = torch.randn(3, 40, generator=generator, dtype=torch.float64)
    y = torch.sin(a) + 0.3 * noise
    fitted = []
    for x in (list(zip(a, b)), torch.stack([a, b], 1)):
        model = FeatureGP(None, None, FSARDKernel(num_dims=2, num_samples=16, ard_num_dims=2, seed=0)).double()
        alacarte.fit(model, x, y, restarts=0, max_iter=2, progress=False)
        fitted.append(model.state_dict())
    assert all(torch.equal(fitted[0][name], fitted[1][name]) for name in fitted[1])


def test_streaming_refuses_bad_input(tmp_path):
    x, y, model = make_case()
    with pytest.raises(ValueError, match="ExactRBFGP needs all rows in memory"):
        alacarte.fit(ExactRBFGP(None, None, num_dims=3), x, y, chunk_size=10)
    with pytest.raises(ValueError, match="one-shot iterator"):
        alacarte.fit(model, ((x[i : i + 10], y[i : i + 10]) for i in range(0, 61, 10)))
    with pytest.raises(ValueError, match="set y, chunk_size, memory_budget and statistics_dtype on it"):
        alacarte.fit(model, ChunkedData(x, y), chunk_size=4)
    with pytest.raises(ValueError, match="set y, chunk_size, memory_budget and statistics_dtype on it"):
        model.cache_posterior(ChunkedData(x, y), chunk_size=-5)  # not ignored
    # an unbatched DataLoader yields one row at a time, with 0-d targets; plain numbers are no chunks either
    unbatched = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=None)
    with pytest.raises(ValueError, match="y of chunk 0 is a scalar, not a batch of rows"):
        alacarte.fit(model, unbatched, progress=False)
    with pytest.raises(ValueError, match="x of chunk 0 is a scalar"):
        alacarte.fit(model, [(1.0, 2.0), (3.0, 1.0)], progress=False)
    with pytest.raises(ValueError, match="chunk_size or memory_budget, not both"):
        ChunkedData(x, y, chunk_size=3, memory_budget=2**20)
    with pytest.raises(ValueError, match="y is required"):
        alacarte.fit(model, x)
    with pytest.raises(ValueError, match="y has 60 values but x has 61 rows"):
        ChunkedData(x, y[:-1])
    with pytest.raises(ValueError, match=r"\(x, y\) pair"):
        streamed_negative_mll(model, ChunkedData([x, y]))
    with pytest.raises(ValueError, match=r"\(x, y\) pair, got list .*for x given as rows, pass y too"):
        alacarte.fit(model, x.tolist(), progress=False)  # y forgotten
    for chunks in ([(x[:30], y[:30]), (x[30:], y[30:])], torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y), batch_size=16)):
        with pytest.raises(ValueError, match="chunks, which carry the targets: pass y=None"):
            ChunkedData(chunks, y)  # y given twice
        with pytest.raises(ValueError, match="chunks, which carry the targets: pass y=None"):
            alacarte.fit(model, chunks, y, progress=False)  # (not numpy's 'inhomogeneous shape' or 'dtype object')
    bad = x.numpy().copy()
    bad[33, 1] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(ValueError, match=r"x \(rows 30–39\) contains 1 non-finite value\(s\) \(NaN\)"):
        streamed_statistics(model, ChunkedData(np.load(tmp_path / "bad.npy", mmap_mode="r"), y, chunk_size=10))
    with pytest.raises(ValueError, match="the model expects 3 input dimensions"):
        streamed_statistics(model, ChunkedData([(x[:, :2], y)]))
    with pytest.raises(ValueError, match="statistics_dtype"):
        ChunkedData(x, y, statistics_dtype=torch.float16)
    with pytest.raises(ValueError, match="y is constant"):
        alacarte.fit(model, x, torch.full_like(y, 2.0), chunk_size=10, progress=False)
    with pytest.raises(ValueError, match="at least 2 training rows.*got n_samples = 1"):
        alacarte.fit(model, x[:1], y[:1], chunk_size=10, progress=False)
