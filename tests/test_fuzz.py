"""Fuzzed readers: model files, fit checkpoints, UCI files and the command line's CSV reader.

Each reader is given real files (a small model, checkpoints saved during a fit, a UCI dataset
from ../shared/uci, a CSV table) mutated at every layer — the raw bytes, the torch archive's
pickle with its checksums recomputed, the record's fields (deleted, retyped, resized, given
NaN, infinities or huge sizes) re-saved, and records rebuilt at random within the schema.
Every input must either be refused with a ``ValueError`` (``OSError`` for I/O) or read
correctly: a loaded model predicts, a resumed fit finishes, a table is finite and rectangular.

The default run tries ``FAST`` inputs per reader (2 000 and more in all); ``-m slow`` tries
``SLOW`` per reader (100 000 and more in all).
"""
import copy
import gzip
import hashlib
import io
import math
import random
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import alacarte as ac
import alacarte.datasets.uci as uci
import alacarte.training._stages as stages
from alacarte import AlaCarteRegressor
from alacarte._checkpoint import SIGNATURE, FitCheckpoint
from alacarte._records import KERNEL_CLASSES
from alacarte.cli import read_table
from alacarte.factory import make_model
from alacarte.io import MAGIC, load_model, save_model

from model_files import parts, payload, torch_bytes, with_body

SHARED = Path(__file__).resolve().parents[2] / "shared" / "uci"
FAST = {"model": 650, "checkpoint": 150, "uci": 400, "csv": 800}
SLOW = {"model": 35_000, "checkpoint": 6_000, "uci": 25_000, "csv": 40_000}


def run(check, examples: int, slow: bool) -> None:
    """``check(rng)`` on ``examples`` inputs (all of them: fewer fails the test).

    Hypothesis draws the seed of each input's mutations; a failure prints the seed, and
    ``check(random.Random(seed))`` replays it.  (Drawing every choice through hypothesis cost
    ten times as much per input.)"""
    calls = [0]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=not slow,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
    @given(st.integers(0, 2**64 - 1))
    def inner(seed):
        calls[0] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a mutated model may well fit badly; warning of it is right
            check(random.Random(seed))

    inner()
    assert calls[0] >= examples


# -- mutations ------------------------------------------------------------------------------
def mutate_bytes(rng, content: bytes) -> bytes:
    """1–3 byte-level edits: a flipped byte, a cut, an insertion, a deletion or an overwrite."""
    content = bytearray(content)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["flip", "truncate", "insert", "delete", "overwrite"])
        at = rng.randint(0, max(len(content) - 1, 0))
        if kind == "flip" and content:
            content[at] ^= rng.randint(1, 255)
        elif kind == "truncate":
            del content[at:]
        elif kind == "insert":
            content[at:at] = rng.randbytes(rng.randint(1, 8))
        elif kind == "delete":
            del content[at:at + rng.randint(1, 64)]
        else:
            span = rng.randint(1, 8)
            content[at:at + span] = rng.randbytes(span)
    return bytes(content)


def mutate_pickle(rng, body: bytes) -> bytes:
    """The torch archive ``body`` with its pickle mutated and the archive rebuilt (its CRCs valid)."""
    archive = zipfile.ZipFile(io.BytesIO(body))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as rebuilt:
        for info in archive.infolist():
            member = archive.read(info.filename)
            if info.filename.endswith("data.pkl"):
                member = mutate_bytes(rng, member)
            rebuilt.writestr(info.filename, member)
    return out.getvalue()


SHAPES = [(), (0,), (1,), (2,), (3,), (16,), (32,), (1, 3), (3, 3), (4, 4), (32, 32), (60, 3)]
DTYPES = [torch.float64, torch.float32, torch.int64, torch.bool, torch.float16, torch.complex64]
SPECIAL = [0, -1, 1, 2, 3, 16, 2**31, 2**33, 2**63 - 1, -2**63, 2**70]


def random_tensor(rng) -> torch.Tensor:
    shape = rng.choice(SHAPES)
    dtype = rng.choice(DTYPES)
    fill = rng.choice([0.0, 1.0, -1.0, math.nan, math.inf, 1e300])
    if dtype in (torch.int64, torch.bool, torch.float16) and not abs(fill) < 1e4:
        fill = 1.0
    return torch.full(shape, fill, dtype=torch.float64).to(dtype)


NAMES = [*KERNEL_CLASSES, "alacarte.__main__:main", "os:system", "FeatureGP", "ExactRBFGP", "float32", "float64",
         "lbfgs", "adam", "restart", "final", "refit", "done", "", "x" * 200]
FLOATS = [0.0, -0.0, 1.0, -1.5, 0.5, 1e-300, 1e300, -1e300, math.nan, math.inf, -math.inf]


def random_value(rng):
    """Any value a torch archive can hold: None, bools, ints of any size, floats, strings, lists,
    dicts, tensors of any dtype."""
    kind = rng.randint(0, 8)
    if kind == 0:
        return random_tensor(rng)
    if kind == 1:
        return rng.choice([None, True, False])
    if kind == 2:
        return rng.choice(SPECIAL) if rng.random() < 0.5 else rng.randint(-2**80, 2**80)
    if kind == 3:
        return rng.choice(FLOATS) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
    if kind in (4, 5):
        return rng.choice(NAMES)
    if kind == 6:
        return [rng.choice(SPECIAL) for _ in range(rng.randint(0, 3))]
    if kind == 7:
        return {rng.choice(["", "a", "class", "0"]): rng.choice(SPECIAL) for _ in range(rng.randint(0, 2))}
    return (rng.choice(SPECIAL), rng.choice(FLOATS))


def perturbed(rng, value):
    """A value of the same kind as ``value``, changed: the mutations a schema must see."""
    if isinstance(value, torch.Tensor):
        kind = rng.choice(["fill", "cut", "grow", "dtype", "transpose", "flatten"])
        if kind == "fill" and value.numel() and value.is_floating_point():
            value = value.contiguous().clone()
            value.view(-1)[rng.randint(0, value.numel() - 1)] = torch.tensor(rng.choice(FLOATS), dtype=torch.float64)
            return value
        if kind == "cut" and value.dim():
            return value[..., :-1]
        if kind == "grow":
            return torch.cat([value.reshape(-1), value.reshape(-1)[:1]]) if value.numel() else value[None]
        if kind == "dtype":
            return value.to(rng.choice(DTYPES))
        if kind == "transpose" and value.dim() == 2:
            return value.T
        return value.reshape(-1)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice(SPECIAL) if rng.random() < 0.5 else value + rng.randint(-3, 3)
    if isinstance(value, float):
        return rng.choice(FLOATS)
    if isinstance(value, (list, tuple)) and value:
        cut = list(value)[:rng.randint(0, len(value) - 1)]
        return type(value)(cut)
    return random_value(rng)


def _nodes(obj, path=()):
    """(path, value) of every node under ``obj`` (dict entries and list items)."""
    yield path, obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _nodes(value, (*path, key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _nodes(value, (*path, i))


def _set(obj, path, value, delete=False):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, tuple):
        items = list(obj)
        items[head] = _set(items[head], rest, value, delete)
        return tuple(items)
    if delete and not rest:
        del obj[head]
    else:
        obj[head] = _set(obj[head], rest, value, delete)
    return obj


def mutate_record(rng, obj, under=()):
    """``obj`` (a file's payload, copied) with 1–3 of its fields deleted, replaced or perturbed;
    ``under``: the path below which the fields are chosen."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 3)):
        nodes = [(p, v) for p, v in _nodes(obj) if p[:len(under)] == under and len(p) > len(under)]
        if not nodes:  # (an earlier edit removed the part under ``under``)
            break
        path, value = rng.choice(nodes)
        kind = rng.choice(["perturb", "perturb", "replace", "delete", "add"])
        if kind == "delete" and isinstance(_parent(obj, path), (dict, list)):
            obj = _set(obj, path, None, delete=True)
        elif kind == "add" and isinstance(value, dict):
            value[rng.choice(["extra", "class", "config", "num_samples", "0"])] = random_value(rng)
        else:
            obj = _set(obj, path, perturbed(rng, value) if kind == "perturb" else random_value(rng))
    return obj


def _parent(obj, path):
    for key in path[:-1]:
        obj = obj[key]
    return obj


def mutated_file(rng, good: bytes, signature: bytes, under=(), obj=None) -> bytes:
    """``good`` mutated at one of its layers: bytes, archive, pickle (checksums made to match), record
    (``obj``: its payload, when already read)."""
    layer = rng.choice(["bytes", "archive", "pickle", "record", "record", "record"])
    _, body = parts(good, signature)
    if layer == "bytes":
        return mutate_bytes(rng, good)
    if layer == "archive":
        return with_body(good, signature, mutate_bytes(rng, body))
    if layer == "pickle":
        return with_body(good, signature, mutate_pickle(rng, body))
    obj = payload(good, signature) if obj is None else obj
    return with_body(good, signature, torch_bytes(mutate_record(rng, obj, under)))


# -- model files ----------------------------------------------------------------------------
def _data(n=30, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.sin(x).sum(1) + 0.1 * rng.normal(size=n)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """Bytes of small saved models: a feature GP, an estimator with names, an exact GP, an unfitted
    estimator with a kernel object."""
    tmp = tmp_path_factory.mktemp("fuzz-models")
    x, y = _data()
    feature = make_model("fsard", 3, num_samples=8, seed=0)
    ac.fit(feature, x, y, max_iter=2, restarts=0, progress=False)
    exact = make_model("exact-ard", 3)
    ac.fit(exact, x, y, max_iter=2, restarts=0, progress=False)
    import pandas as pd

    frame = pd.DataFrame(x, columns=["a", "b", "c"])
    estimator = AlaCarteRegressor("gm", num_samples=8, num_components=2, max_iter=2, restarts=0).fit(frame, y)
    unfitted = AlaCarteRegressor(ac.PiecewiseLinearRadialKernel(3, 8, num_components=2, seed=1))
    files = [save_model(m, tmp / f"{i}.alacarte", metadata={"columns": ["a", "b", "c"]}).read_bytes()
             for i, m in enumerate([feature, estimator, exact, unfitted])]
    return [(content, payload(content, MAGIC)) for content in files]


def _use(loaded, x):
    """What a correct load must be able to do: predict."""
    if isinstance(loaded, AlaCarteRegressor):
        if hasattr(loaded, "model_"):
            loaded.predict(x if not hasattr(loaded, "feature_names_in_") else _frame(x), return_std=True)
    else:
        prediction = loaded.predict(torch.as_tensor(x, dtype=loaded.input_offset.dtype))
        assert prediction.mean.shape == (len(x),)


def _frame(x):
    import pandas as pd

    return pd.DataFrame(x, columns=["a", "b", "c"])


def _check_model_file(rng, model_files, path):
    good, obj = rng.choice(model_files)
    path.write_bytes(mutated_file(rng, good, MAGIC, obj=obj))
    try:
        loaded = load_model(path)
        _use(loaded, _data(n=4, seed=1)[0])  # (predict's own ValueError: e.g. rows whose features overflow)
    except ValueError:
        return


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False], ids=["slow", "fast"])
def test_model_files(slow, model_files, tmp_path):
    run(lambda rng: _check_model_file(rng, model_files, tmp_path / "m.alacarte"),
        (SLOW if slow else FAST)["model"], slow)


def test_records_rebuilt_at_random_within_the_schema_load_or_are_refused(model_files, tmp_path):
    """Every field of a real record replaced by another value of its own kind, one at a time."""
    path = tmp_path / "m.alacarte"
    count = 0
    for good, obj in model_files:
        for field, value in list(_nodes(obj["record"], ("record",))):
            for replacement in _same_kind(value):
                edited = _set(copy.deepcopy(obj), field, replacement)
                path.write_bytes(with_body(good, MAGIC, torch_bytes(edited)))
                count += 1
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        _use(load_model(path), _data(n=4, seed=1)[0])
                    except ValueError:
                        continue
    assert count > 250


def _same_kind(value):
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [0, -1, value + 1, 2**33]
    if isinstance(value, float):
        return [float("nan"), -float("inf")]
    if isinstance(value, str):
        return ["", "alacarte.__main__:main"]
    if isinstance(value, torch.Tensor):
        shrunk = [value[..., :-1]] if value.dim() else []
        return [*shrunk, torch.full_like(value, float("nan")) if value.is_floating_point() else value + 2**40]
    return []


# -- checkpoints ----------------------------------------------------------------------------
SETTINGS = dict(max_iter=3, restarts=1, restart_iter=2)


def _checkpoint_model(simplex: bool):
    return make_model(ac.FSARDKernel(2, 8, ard_num_dims=2, simplex=simplex, seed=0), 2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Bytes of checkpoints saved at every iteration of three small fits (L-BFGS; Adam with a simplex
    kernel; L-BFGS with held-out rows), with the fit that reads each."""
    tmp = tmp_path_factory.mktemp("fuzz-checkpoints")
    x, y = _data(n=25, d=2)
    saved, save = [], FitCheckpoint.save
    interval = stages.CHECKPOINT_INTERVAL
    stages.CHECKPOINT_INTERVAL = 0.0
    fits = [dict(optimizer="lbfgs", simplex=False), dict(optimizer="adam", simplex=True),
            dict(optimizer="lbfgs", simplex=False, validation_fraction=0.4)]
    try:
        for i, settings_ in enumerate(fits):
            def keep(self, progress, settings_=settings_):
                save(self, progress)
                content = self.path.read_bytes()
                saved.append((content, payload(content, SIGNATURE), settings_))

            FitCheckpoint.save = keep
            options = {k: v for k, v in settings_.items() if k != "simplex"}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ac.fit(_checkpoint_model(settings_["simplex"]), x, y, checkpoint=tmp / f"{i}.ckpt", progress=False,
                       **SETTINGS, **options)
    finally:
        FitCheckpoint.save = save
        stages.CHECKPOINT_INTERVAL = interval
    return saved, (x, y)


def _check_checkpoint(rng, checkpoints, path):
    saved, (x, y) = checkpoints
    good, obj, settings_ = rng.choice(saved)
    under = rng.choice([(), ("progress",), ("progress", "run")])
    if under == ("progress", "run") and obj["progress"]["run"] is None:
        under = ("progress",)
    path.write_bytes(mutated_file(rng, good, SIGNATURE, under, obj))
    model = _checkpoint_model(settings_["simplex"])
    options = {k: v for k, v in settings_.items() if k != "simplex"}
    try:
        history = ac.fit(model, x, y, checkpoint=path, progress=False, **SETTINGS, **options)
    except ValueError:
        return
    assert history.iterations <= SETTINGS["max_iter"] * 2 and not model.training


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False], ids=["slow", "fast"])
def test_checkpoints(slow, checkpoints, tmp_path):
    run(lambda rng: _check_checkpoint(rng, checkpoints, tmp_path / "fit.ckpt"),
        (SLOW if slow else FAST)["checkpoint"], slow)


# -- UCI files ------------------------------------------------------------------------------
needs_data = pytest.mark.skipif(not (SHARED / "challenger").is_dir(), reason="../shared/uci is not present")


def _check_uci(rng, directory, registry, monkeypatch):
    name = rng.choice(uci._FILES)
    good = (SHARED / "challenger" / name).read_bytes()
    layer = rng.choice(["gzip", "text", "text", "text", "unchecked"])
    if layer == "gzip":
        content = mutate_bytes(rng, good)
    else:
        content = gzip.compress(mutate_bytes(rng, gzip.decompress(good)), mtime=0)
    for other in uci._FILES:
        shutil.copyfile(SHARED / "challenger" / other, directory / "challenger" / other)
    (directory / "challenger" / name).write_bytes(content)
    entry = dict(registry["challenger"])
    if layer != "unchecked":  # the checksum made to match: what the parser then sees
        entry[name] = hashlib.sha256(content).hexdigest()
    monkeypatch.setattr(uci, "_registry", lambda: {**registry, "challenger": entry})
    uci._load_arrays.cache_clear()
    split = rng.randint(0, 9)
    try:
        loaded = uci.load_uci("challenger", split, directory)
    except ValueError:
        return
    assert loaded.x_train.shape[1] == loaded.x_test.shape[1] and loaded.x_train.shape[0] == len(loaded.y_train)
    assert len(loaded.x_test) == len(loaded.y_test)


@needs_data
@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False], ids=["slow", "fast"])
def test_uci_files(slow, tmp_path, monkeypatch):
    (tmp_path / "challenger").mkdir()
    registry = uci._registry()
    try:
        run(lambda rng: _check_uci(rng, tmp_path, registry, monkeypatch), (SLOW if slow else FAST)["uci"], slow)
    finally:
        uci._load_arrays.cache_clear()


# -- the command line's CSV reader -----------------------------------------------------------
CELLS = ["", " ", "nan", "NaN", "inf", "-inf", "1e400", "1_000", '"1"', '"1,2"', "0x10", " 1 ", "١", "1,2", "\r",
         '"', "#1", "1e-400", "+1", "1.", ".5", "1d3", "\x00", "\ufeff1", "a", "y", "x1", '"a"']


def _csv(rng) -> bytes:
    rows = rng.randint(0, 6)
    width = rng.randint(1, 4)
    names = [rng.choice(["x1", "x2", "x3", "y", "", "x1 ", '"y"']) for _ in range(width)]
    lines = [",".join(names)]
    for _ in range(rows):
        cells = [repr(rng.gauss(0, 1)) for _ in range(width)]
        for _ in range(rng.randint(0, 2)):
            cells[rng.randint(0, width - 1)] = rng.choice(CELLS)
        if rng.randint(0, 9) == 0:
            cells = cells[:-1] if (rng.random() < 0.5) else [*cells, "0"]
        lines.append(",".join(cells))
    text = rng.choice(["\n", "\r\n", "\r"]).join(lines) + rng.choice(["", "\n"])
    content = text.encode("utf-8")
    if rng.randint(0, 3) == 0:
        content = mutate_bytes(rng, content)
    return content


def _check_csv(rng, path):
    path.write_bytes(_csv(rng))
    columns = rng.choice([None, ["x1"], ["x2", "x1"], ["y"]])
    try:
        names, values = read_table(path, columns)
    except ValueError:
        return
    assert values.dtype == np.float64 and values.ndim == 2 and values.shape[0] >= 1
    assert values.shape[1] == (len(names) if columns is None else len(columns))
    assert np.isfinite(values).all()


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False], ids=["slow", "fast"])
def test_csv_reader(slow, tmp_path):
    run(lambda rng: _check_csv(rng, tmp_path / "data.csv"), (SLOW if slow else FAST)["csv"], slow)
