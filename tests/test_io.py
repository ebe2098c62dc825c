"""Saved models: bit-identical reloads, atomic writes, clear errors on bad files."""
import hashlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.constraints import Interval
from gpytorch.priors import GammaPrior, UniformPrior

import alacarte as ac
from alacarte import AlaCarteRegressor
from alacarte.factory import KERNEL_NAMES, make_model
from alacarte.io import FORMAT_VERSION, MAGIC, load_model, load_with_metadata, save_model

ROOT = os.path.join(os.path.dirname(__file__), "..")
SMALL = dict(num_samples=16, num_components=2, max_iter=5, restarts=1, restart_iter=2)


def data(n=60, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.sin(x).sum(1) + 0.1 * rng.normal(size=n)


def fitted_model(name="fsard"):
    x, y = data()
    model = make_model(name, 3, num_samples=16, num_components=2, seed=0)
    ac.fit(model, x, y, max_iter=5, restarts=1, restart_iter=2, progress=False)
    return model


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_save_load_gives_bit_identical_predictions(name, tmp_path):
    model = fitted_model(name)
    x_test = data(n=25, seed=3)[0]
    path = save_model(model, tmp_path / "m.alacarte")
    loaded = load_model(path)
    assert type(loaded) is type(model) and not loaded.training
    a, b = model.predict(x_test), loaded.predict(x_test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert torch.equal(a.observed_variance, b.observed_variance)
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    if name in ("gm", "ssgpr"):  # posterior function draws come from the stored factor
        assert torch.equal(model.sample_functions(3, seed=1)(x_test), loaded.sample_functions(3, seed=1)(x_test))
    ac.fit(loaded, *data(), max_iter=2, restarts=0, progress=False)  # and it trains on


def test_a_file_of_a_kernel_with_ard_num_dims_1_still_loads(tmp_path):
    """Kernels refuse ard_num_dims=1 for one shared lengthscale, but a file may hold such a kernel (a streamed
    fit trained one): it loads, as with ard_num_dims=None, rather than being a ValueError at load."""
    x, y = data()
    kernel = ac.FSARDKernel(3, 16, seed=0)
    kernel.ard_num_dims = 1  # what a file may hold, though FSARDKernel(3, 16, ard_num_dims=1) is refused
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, chunk_size=20, max_iter=3, restarts=1, restart_iter=2, progress=False)
    loaded = load_model(save_model(model, tmp_path / "m.alacarte"))
    assert loaded.covar_module.ard_num_dims is None
    x_test = data(n=25, seed=3)[0]
    a, b = model.predict(x_test), loaded.predict(x_test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


@pytest.mark.parametrize("learn_simplex_size", [True, False])
def test_simplex_kernels_and_frozen_parameters_round_trip(learn_simplex_size, tmp_path):
    x, y = data()
    kernel = ac.FSARDKernel(3, 16, ard_num_dims=3, simplex=True, learn_simplex_size=learn_simplex_size, seed=0)
    model = ac.FeatureGP(None, None, kernel).double()
    model.likelihood.raw_noise.requires_grad_(False)  # a parameter the user froze
    ac.fit(model, x, y, max_iter=5, restarts=0, progress=False)
    loaded = load_model(save_model(model, tmp_path / "s.alacarte"))
    assert loaded.covar_module.simplex
    assert {n: p.requires_grad for n, p in loaded.named_parameters()} == \
        {n: p.requires_grad for n, p in model.named_parameters()}
    assert loaded.covar_module.raw_simplex_size.requires_grad is learn_simplex_size
    assert torch.equal(loaded.predict(x).mean, model.predict(x).mean)
    assert torch.equal(loaded.covar_module.selected(), model.covar_module.selected())


def test_regressor_round_trip_with_metadata_and_kernel_object(tmp_path):
    x, y = data()
    kernel = ac.PiecewiseLinearRadialKernel(3, 16, num_components=2, ard_num_dims=3, seed=4)
    reg = AlaCarteRegressor(kernel, **SMALL).fit(x, y)
    save_model(reg, tmp_path / "r.alacarte", metadata={"columns": ["a", "b", "c"], "target": "y"})
    loaded, metadata = load_with_metadata(tmp_path / "r.alacarte")
    assert metadata == {"columns": ["a", "b", "c"], "target": "y"}
    assert isinstance(loaded.kernel, ac.PiecewiseLinearRadialKernel)
    assert all(torch.equal(v, loaded.kernel.state_dict()[k]) for k, v in kernel.state_dict().items())
    params = {k: v for k, v in reg.get_params().items() if k != "kernel"}
    assert params == {k: v for k, v in loaded.get_params().items() if k != "kernel"}
    a, b = reg.predict(x, return_std=True), loaded.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(reg.sample_y(x[:5], 3), loaded.sample_y(x[:5], 3))
    assert loaded.log_marginal_likelihood_ == reg.log_marginal_likelihood_
    assert loaded.history_ == reg.history_ and np.array_equal(loaded.relevance_, reg.relevance_)
    unfitted = AlaCarteRegressor("exact-ard")
    save_model(unfitted, tmp_path / "u.alacarte")
    assert load_model(tmp_path / "u.alacarte").get_params() == unfitted.get_params()


def test_every_draw_of_a_regressor_is_saved_and_a_file_missing_one_is_refused(tmp_path):
    x, y = data()
    reg = AlaCarteRegressor("gm", num_draws=2, **SMALL).fit(x, y)
    good = save_model(reg, tmp_path / "r.alacarte").read_bytes()
    loaded = load_model(tmp_path / "r.alacarte")
    assert len(loaded.models_) == 2 and loaded.num_draws == 2
    a, b = reg.predict(x, return_std=True), loaded.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    payload = torch.load(io.BytesIO(_parts(good)[1]), weights_only=True)
    fitted = {k: v for k, v in payload["record"]["fitted"].items() if k != "more_models"}
    short = {**payload, "record": {**payload["record"], "fitted": fitted}}
    (tmp_path / "bad.alacarte").write_bytes(_rewritten(good, body=_torch_bytes(short)))
    with pytest.raises(ValueError, match="num_draws"):
        load_model(tmp_path / "bad.alacarte")


def test_auto_components_reload_their_choice_and_scores_and_bad_scores_are_refused(tmp_path):
    x, y = data(n=2000)  # 400 rows held out: auto chooses
    reg = AlaCarteRegressor("gm", **{**SMALL, "num_components": "auto", "num_draws": 1}).fit(x, y)
    good = save_model(reg, tmp_path / "r.alacarte").read_bytes()
    loaded = load_model(tmp_path / "r.alacarte")
    assert loaded.num_components == "auto" and loaded.num_components_ == reg.num_components_
    assert loaded.component_scores_ == reg.component_scores_ and set(reg.component_scores_) == {1, 4}
    a, b = reg.predict(x, return_std=True), loaded.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    payload = torch.load(io.BytesIO(_parts(good)[1]), weights_only=True)
    fitted = {**payload["record"]["fitted"], "component_scores_": [["1", 0.5]]}
    bad = {**payload, "record": {**payload["record"], "fitted": fitted}}
    (tmp_path / "bad.alacarte").write_bytes(_rewritten(good, body=_torch_bytes(bad)))
    with pytest.raises(ValueError, match="component_scores_"):
        load_model(tmp_path / "bad.alacarte")


def test_auto_draws_reload_every_draw_and_a_count_auto_cannot_give_is_refused(tmp_path):
    x, y = data()  # 60 rows, D = 32 features: num_draws="auto" fits five
    reg = AlaCarteRegressor("fsard", **SMALL).fit(x, y)
    good = save_model(reg, tmp_path / "r.alacarte").read_bytes()
    loaded = load_model(tmp_path / "r.alacarte")
    assert loaded.num_draws == "auto" and len(loaded.models_) == len(reg.models_) == 5
    a, b = reg.predict(x, return_std=True), loaded.predict(x, return_std=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    payload = torch.load(io.BytesIO(_parts(good)[1]), weights_only=True)
    fitted = payload["record"]["fitted"]
    three = {**payload, "record": {**payload["record"], "fitted": {**fitted, "more_models": fitted["more_models"][:2]}}}
    (tmp_path / "bad.alacarte").write_bytes(_rewritten(good, body=_torch_bytes(three)))
    with pytest.raises(ValueError, match="2 models, but the estimator's num_draws is 'auto'"):
        load_model(tmp_path / "bad.alacarte")


def test_an_unwritable_directory_is_a_value_error(tmp_path, monkeypatch):
    """A directory the user may not write to (simulated: the tests may run as root) is a ValueError
    naming it, not a bare PermissionError naming the temporary file."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ValueError, match="cannot write .*m.alacarte: Permission denied"):
        save_model(fitted_model(), tmp_path / "m.alacarte")


def test_a_failed_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "m.alacarte"
    save_model(fitted_model(), path)
    original = path.read_bytes()
    other = fitted_model("gm")

    real_save = torch.save

    def save_half_then_fail(obj, fh, *args, **kwargs):
        real_save(obj, fh, *args, **kwargs)
        fh.truncate(fh.tell() // 2)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        save_model(other, path)
    monkeypatch.undo()

    def failing_fsync(fd):
        raise OSError("I/O error during fsync (simulated)")

    monkeypatch.setattr(os, "fsync", failing_fsync)  # the new bytes are written, not yet renamed
    with pytest.raises(OSError, match="simulated"):
        save_model(other, path)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["m.alacarte"]  # no temporary file left behind
    load_model(path)


def test_a_writer_killed_mid_write_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "m.alacarte"
    model = fitted_model()
    save_model(model, path)
    original = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {ROOT!r})
        import numpy as np
        import alacarte as ac
        from alacarte.factory import make_model
        from alacarte.io import save_model
        x = np.random.default_rng(1).normal(size=(50, 3))
        model = make_model("gm", 3, num_samples=16, num_components=2)
        ac.fit(model, x, x.sum(1), max_iter=2, restarts=0, progress=False)
        def stall(fd):  # the temporary file is written; the writer dies before the rename
            print("writing", flush=True)
            time.sleep(120)
        os.fsync = stall
        save_model(model, {str(path)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert path.read_bytes() == original
    x_test = data(n=5, seed=9)[0]
    assert torch.equal(load_model(path).predict(x_test).mean, model.predict(x_test).mean)


def test_saving_through_a_symbolic_link_writes_its_target(tmp_path):
    """The temporary file replaced the link itself: the link became a plain file with the new model
    and its target (what other links name) kept the old one."""
    target, link = tmp_path / "v1.alacarte", tmp_path / "current.alacarte"
    save_model(fitted_model(), target)
    link.symlink_to(target.name)
    save_model(fitted_model("gm"), link)
    assert link.is_symlink() and isinstance(load_model(target).covar_module, ac.SpectralMixtureFastfoodKernel)
    assert sorted(os.listdir(tmp_path)) == ["current.alacarte", "v1.alacarte"]


def _parts(good: bytes) -> tuple[dict, bytes]:
    """A model file's JSON header and its data bytes."""
    header_len = struct.unpack("<I", good[len(MAGIC): len(MAGIC) + 4])[0]
    return json.loads(good[len(MAGIC) + 4: len(MAGIC) + 4 + header_len]), good[len(MAGIC) + 4 + header_len:]


def _rewritten(good: bytes, edit_header=None, body: bytes | None = None) -> bytes:
    """``good`` with its header edited and/or its body replaced, checksums made to match again."""
    header, good_body = _parts(good)
    body = good_body if body is None else body
    header.update(body_bytes=len(body), body_sha256=hashlib.sha256(body).hexdigest())
    if edit_header:
        edit_header(header)
    new_header = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(new_header)) + new_header + body


def _torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_bad_files_give_clear_errors(tmp_path):
    path = save_model(fitted_model(), tmp_path / "m.alacarte")
    good = path.read_bytes()
    bad = tmp_path / "bad.alacarte"

    def expect(content: bytes, message: str):
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            load_model(bad)

    expect(good[: len(good) // 2], "truncated")
    expect(good[:-1], "truncated")
    expect(good[: len(MAGIC) + 2], "truncated")
    expect(good[: len(MAGIC) + 40], "truncated or damaged")
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF
    expect(bytes(flipped), "damaged: its data do not match their SHA-256 checksum")
    expect(b"x,y\n1,2\n", "not an alacarte model file")
    expect(b"", "not an alacarte model file")
    future = _rewritten(good, lambda header: header.update(format_version=FORMAT_VERSION + 1))
    expect(future, f"format version {FORMAT_VERSION + 1} .*reads format version {FORMAT_VERSION}")


def test_a_large_file_that_is_not_a_model_is_refused_without_reading_it(tmp_path):
    """The signature is checked before the file is read: read whole first, a 400 MB CSV given as the
    model (arguments swapped) would take 16 s and 760 MB to be refused."""
    path = tmp_path / "data.csv"
    with open(path, "wb") as fh:
        fh.truncate(64 * 2**20)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="not an alacarte model file"):
            load_model(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_damaged_metadata_in_the_header_are_detected(tmp_path):
    """The header is outside the body's checksum: a flipped bit in a column name ("x1" → "x3") loaded
    as other metadata, which the command line would use to pick another column of the CSV."""
    metadata = {"columns": ["x1", "x2"], "target": "y", "note": float("nan")}
    path = save_model(fitted_model(), tmp_path / "m.alacarte", metadata=metadata)
    good = path.read_bytes()
    assert json.dumps(load_with_metadata(path)[1]) == json.dumps(metadata)
    where = good.index(b'"x1"') + 2
    flipped = bytearray(good)
    flipped[where] ^= ord("1") ^ ord("3")
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="damaged: the metadata in its header differ from their checksummed copy"):
        load_with_metadata(path)


def test_large_metadata_reload(tmp_path):
    """The header (which holds the metadata) may exceed 64 KiB: a CSV with 8000 named columns is saved
    and read back, not refused on load as 'truncated or damaged'."""
    metadata = {"columns": [f"column_{i:05d}" for i in range(8000)]}
    path = save_model(fitted_model(), tmp_path / "m.alacarte", metadata=metadata)
    assert load_with_metadata(path)[1] == metadata


def test_the_command_line_refuses_a_model_whose_metadata_are_not_a_dict(tmp_path, capsys):
    """A file whose metadata are a str (save_model refuses them, other writers may not): 'alacarte predict'
    must not take `"columns" in metadata` as a substring test and crash with a TypeError traceback."""
    from alacarte.cli import main

    x, y = data()
    good = save_model(AlaCarteRegressor("fsard", **SMALL).fit(x, y), tmp_path / "m.alacarte").read_bytes()
    payload = torch.load(io.BytesIO(_parts(good)[1]), weights_only=True)
    text = "columns a,b,c"
    bad = _rewritten(good, lambda h: h.update(metadata=text), body=_torch_bytes({**payload, "metadata": text}))
    (tmp_path / "m.alacarte").write_bytes(bad)
    (tmp_path / "d.csv").write_text("a,b,c\n1,2,3\n")
    assert main(["predict", str(tmp_path / "m.alacarte"), str(tmp_path / "d.csv"), "-q"]) == 2
    assert "is not a model written by `alacarte fit`" in capsys.readouterr().err


def test_checksummed_files_with_foreign_content_are_value_errors(tmp_path):
    """A file whose checksums match but whose content this version cannot rebuild (hand-made, or
    written by another alacarte of the same format version) is a ValueError, not a KeyError."""
    model = fitted_model()
    good = save_model(model, tmp_path / "m.alacarte").read_bytes()
    payload = torch.load(io.BytesIO(_parts(good)[1]), weights_only=True)
    state = dict(payload["record"]["state_dict"])
    state.pop(next(k for k in state if k.startswith("covar_module.raw_")))
    incomplete = {**payload, "record": {**payload["record"], "state_dict": state}}
    bad = tmp_path / "bad.alacarte"
    cases = [
        (_rewritten(good, lambda h: h.pop("body_bytes")), "lacks the size or checksum"),
        (_rewritten(good, lambda h: h.pop("body_sha256")), "lacks the size or checksum"),
        (_rewritten(good, body=_torch_bytes([1, 2])), "not an alacarte model record"),
        (_rewritten(good, body=_torch_bytes({"kind": "model", "record": {}})), "cannot rebuild"),
        (_rewritten(good, body=_torch_bytes(incomplete)), "cannot rebuild"),
    ]
    for content, message in cases:
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            load_model(bad)
    bad.write_bytes(_rewritten(good))  # the helper itself keeps a good file good
    x_test = data(n=4, seed=3)[0]
    assert torch.equal(load_model(bad).predict(x_test).mean, model.predict(x_test).mean)


def test_models_a_file_cannot_rebuild_are_refused(tmp_path):
    x, y = data()
    custom = ac.FeatureGP(None, None, ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0,
                                                      lengthscale_constraint=Interval(0.01, 10.0))).double()
    ac.fit(custom, x, y, max_iter=2, restarts=0, progress=False)
    with pytest.raises(ValueError, match="rebuild parts of it as another type .*raw_lengthscale_constraint: .*Interval"):
        save_model(custom, tmp_path / "c.alacarte")
    with_prior = ac.FeatureGP(None, None, ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0,
                                                          lengthscale_prior=GammaPrior(2.0, 1.0))).double()
    ac.fit(with_prior, x, y, max_iter=2, restarts=0, progress=False)
    with pytest.raises(ValueError, match="cannot be saved faithfully"):
        save_model(with_prior, tmp_path / "p.alacarte")
    assert not (tmp_path / "c.alacarte").exists() and not (tmp_path / "p.alacarte").exists()
    with pytest.raises(ValueError, match="save_model takes"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "l.alacarte")


class _ShiftedMean(gpytorch.means.ConstantMean):
    def forward(self, x):
        return super().forward(x) + x[..., 0]


class _MyFeatureGP(ac.FeatureGP):
    pass


class _MyRegressor(AlaCarteRegressor):
    pass


def _exact_matern():
    model = make_model("exact-ard", 3)
    model.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(ard_num_dims=3)).double()
    return model


def _custom_mean():
    model = make_model("fsard", 3, num_samples=16)
    model.mean_module = _ShiftedMean().double()
    return model


def _float64_kernel_in_float32_model():
    kernel = ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0).double()
    kernel.lengthscale = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)  # not float32 numbers
    return ac.FeatureGP(None, None, kernel)  # likelihood and mean in the default float32


@pytest.mark.parametrize("build, part", [
    (_exact_matern, "covar_module.base_kernel: gpytorch.kernels.matern_kernel.MaternKernel"),
    (_custom_mean, "mean_module: .*_ShiftedMean"),
    (lambda: _MyFeatureGP(None, None, ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0)), "the model: .*_MyFeatureGP"),
    (lambda: _MyRegressor("fsard"), ": saved estimators are AlaCarteRegressor itself"),
    (_float64_kernel_in_float32_model, "covar_module.raw_lengthscale: torch.float64, rebuilt as torch.float32"),
], ids=["exact-matern", "custom-mean", "model-subclass", "regressor-subclass", "float64-kernel"])
def test_parts_a_file_would_rebuild_as_something_else_are_refused(build, part, tmp_path):
    """A file rebuilds alacarte's own classes in one dtype: an ExactRBFGP given a Matérn kernel came back
    with the RBF kernel (mean off by 0.29), a ConstantMean subclass as a ConstantMean (off by 1.67), a
    FeatureGP or AlaCarteRegressor subclass as the base class, float64 values of a float32 model rounded."""
    with pytest.raises(ValueError, match=f"cannot be saved faithfully.*{part}"):
        save_model(build(), tmp_path / "m.alacarte")
    assert not list(tmp_path.iterdir())


def test_a_prior_without_buffers_is_refused_not_dropped(tmp_path):
    """A UniformPrior holds no buffers, so the state dict cannot show it: it would be saved without it."""
    kernel = ac.FSARDKernel(3, 16, ard_num_dims=3, seed=0, lengthscale_prior=UniformPrior(0.01, 100.0))
    assert not any("prior" in key for key in kernel.state_dict())
    with pytest.raises(ValueError, match="has priors .*lengthscale_prior"):
        save_model(ac.FeatureGP(None, None, kernel).double(), tmp_path / "m.alacarte")
    with pytest.raises(ValueError, match="has priors"):
        save_model(AlaCarteRegressor(kernel), tmp_path / "r.alacarte")
    assert not list(tmp_path.iterdir())


def test_numpy_scalars_from_a_grid_search_save_and_reload(tmp_path):
    """GridSearchCV passes numpy integers; files hold Python values a weights-only load accepts."""
    x, y = data()
    reg = AlaCarteRegressor("gm", num_samples=np.int64(16), num_components=np.int32(2), max_iter=np.int64(5),
                            restarts=1, restart_iter=2, random_state=np.int64(3), progress=np.bool_(False),
                            pilot_rows=np.int64(40)).fit(x, y)
    path = save_model(reg, tmp_path / "r.alacarte")
    loaded = load_model(path)
    assert loaded.get_params() == reg.get_params()
    assert (loaded.pilot_rows_, loaded.num_samples_) == (reg.pilot_rows_, reg.num_samples_) == (40, 16)
    assert all(type(v) in (int, bool, str) for v in loaded.get_params().values())
    payload = torch.load(io.BytesIO(_parts(path.read_bytes())[1]), weights_only=True)
    for name in ("pilot_rows_", "num_samples_"):
        bad = {**payload, "record": {**payload["record"], "fitted": {**payload["record"]["fitted"], name: 0}}}
        (tmp_path / "bad.alacarte").write_bytes(_rewritten(path.read_bytes(), body=_torch_bytes(bad)))
        with pytest.raises(ValueError, match=name):
            load_model(tmp_path / "bad.alacarte")
    # A file written before the estimator resolved them: its int settings are what it fitted with.
    older = {k: v for k, v in payload["record"]["fitted"].items() if k not in ("pilot_rows_", "num_samples_")}
    (tmp_path / "old.alacarte").write_bytes(_rewritten(path.read_bytes(), body=_torch_bytes(
        {**payload, "record": {**payload["record"], "fitted": older}})))
    old = load_model(tmp_path / "old.alacarte")
    assert (old.pilot_rows_, old.num_samples_) == (40, 16)
    assert np.array_equal(loaded.predict(x), reg.predict(x))
    # A kernel built with numpy sizes keeps Python ints, which the model file records.
    kernel = ac.SpectralMixtureFastfoodKernel(np.int64(3), np.int64(16), num_components=np.int64(2), seed=0)
    assert (type(kernel.num_dims), type(kernel.num_samples), type(kernel.num_components)) == (int, int, int)
    model = make_model(kernel, np.int64(3))
    ac.fit(model, x, y, max_iter=2, restarts=0, progress=False)
    assert torch.equal(load_model(save_model(model, tmp_path / "m.alacarte")).predict(x).mean, model.predict(x).mean)


@pytest.mark.parametrize("how", ["fit chunk_size", "cache_posterior"])
def test_a_model_holding_only_a_streamed_posterior_reloads_and_predicts_bit_identically(how, tmp_path):
    """Streamed training keeps the weight posterior, not the rows: the file must carry the posterior."""
    x, y = data(n=200)
    model = make_model("fsard", 3, num_samples=16, seed=0)
    if how == "fit chunk_size":
        ac.fit(model, x, y, chunk_size=50, max_iter=3, restarts=0, progress=False)
    else:
        ac.fit(model, x, y, max_iter=3, restarts=0, progress=False)
        model.cache_posterior(x, y, chunk_size=64)
    assert model.train_inputs is None
    loaded = load_model(save_model(model, tmp_path / "m.alacarte"))
    x_test = data(n=25, seed=3)[0]
    a, b = model.predict(x_test), loaded.predict(x_test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert torch.equal(model.sample_functions(2, seed=0)(x_test), loaded.sample_functions(2, seed=0)(x_test))


def test_bad_paths_and_metadata_are_refused_before_anything_is_written(tmp_path):
    model = fitted_model()
    with pytest.raises(ValueError, match="is a directory; save_model needs a file path"):
        save_model(model, tmp_path)
    with pytest.raises(ValueError, match="directory .*missing does not exist"):
        save_model(model, tmp_path / "missing" / "m.alacarte")
    with pytest.raises(ValueError, match="metadata must be JSON-serialisable"):
        save_model(model, tmp_path / "m.alacarte", metadata={"columns": np.arange(3)})
    for metadata in ([], ["a"], {1: "a"}, "columns a,b,c"):  # came back as {}, ["a"], {"1": "a"} and the str
        with pytest.raises(ValueError, match="metadata must be a dict with str keys"):
            save_model(model, tmp_path / "m.alacarte", metadata=metadata)
    assert list(tmp_path.iterdir()) == []  # no file, and no temporary file left behind
    with pytest.raises(ValueError, match="is a directory, not an alacarte model file"):
        load_model(tmp_path)


def test_a_loop_of_symbolic_links_is_a_value_error_before_the_work(tmp_path):
    """save_model to a loop of links is refused by the path check (which the command line runs before it
    fits), not after writing the whole file body with a bare OSError 'Too many levels of symbolic links'."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ValueError, match="cannot write .*a: its symbolic links form a loop"):
        save_model(fitted_model(), tmp_path / "a")


def test_the_temporary_file_of_a_killed_save_is_removed_by_the_next_save(tmp_path):
    """kill -9 between writing the temporary file and renaming it left '.m.alacarte.<random>.tmp' for good."""
    from alacarte._files import atomic_write

    path = tmp_path / "m.alacarte"
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {ROOT!r})
        from pathlib import Path
        from alacarte._files import atomic_write
        def stall(fd):
            print("writing", flush=True)
            time.sleep(120)
        os.fsync = stall
        atomic_write(Path({str(path)!r}), b"half a model")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (orphan,) = [p for p in tmp_path.iterdir() if p.name.startswith(".m.alacarte.")]
    old = os.stat(orphan).st_mtime - 60
    os.utime(orphan, (old, old))  # (a temporary file seconds old may be a live writer's not yet locked)
    others = [tmp_path / ".n.alacarte.abcdefgh.tmp", tmp_path / ".m.alacarte.notours.tmp",
              tmp_path / "m.alacarte.abcdefgh.tmp", tmp_path / ".m.alacarte.live1234.tmp"]
    for other in others:
        other.write_bytes(b"not ours to remove")
        os.utime(other, (old, old))
    import fcntl

    with open(others[-1], "rb") as live:  # a writer at work holds its lock
        fcntl.flock(live.fileno(), fcntl.LOCK_EX)
        atomic_write(path, b"a whole model")
    assert path.read_bytes() == b"a whole model" and not orphan.exists()
    assert all(other.exists() for other in others)
    atomic_write(path, b"again")  # the file of a finished writer, whose lock is gone, is an orphan too
    assert not others[-1].exists() and all(other.exists() for other in others[:-1])
