"""The UCI loader against the shared copies in ../shared/uci."""
import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from alacarte.datasets import list_uci, load_uci

SHARED = Path(__file__).resolve().parents[2] / "shared" / "uci"
needs_data = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")


@needs_data
@pytest.mark.parametrize("name, paper_name, n, d", [("yacht", "Yacht", 308, 6), ("concrete", "Concrete", 1030, 8),
                                                   ("pol", "Pole Tele", 15000, 26)])
def test_shapes_and_split_sizes(name, paper_name, n, d):
    with gzip.open(SHARED / name / "test_mask.csv.gz") as fh:
        masks = np.loadtxt(fh, delimiter=",").astype(bool)
    for split in (0, 9):
        s = load_uci(paper_name, split, SHARED)
        assert s.name == name
        assert s.x_train.shape == (n - masks[:, split].sum(), d) and s.x_test.shape == (masks[:, split].sum(), d)
        assert s.y_train.shape == (s.x_train.shape[0],) and 0.05 < s.x_test.shape[0] / n < 0.15
    assert list_uci()[name] == (n, d)


@needs_data
def test_repeated_calls_are_identical_and_env_var_works(monkeypatch):
    monkeypatch.setenv("ALACARTE_DATA", str(SHARED))
    a, b = load_uci("energy", 3), load_uci("ENERGY", 3)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    a.x_train[0, 0] = 1e9  # callers get their own copies
    assert load_uci("energy", 3).x_train[0, 0] != 1e9


def test_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    with pytest.raises(ValueError, match="unknown UCI dataset 'nope'"):
        load_uci("nope", 0, tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_uci("yacht", 0, tmp_path / "missing")
    with pytest.raises(ValueError, match="missing UCI file"):
        load_uci("yacht", 0, tmp_path)
    with pytest.raises(ValueError, match="split must be"):
        load_uci("yacht", 10, tmp_path)


@needs_data
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_file_is_an_error(tmp_path, damage):
    shutil.copytree(SHARED / "servo", tmp_path / "servo")
    path = tmp_path / "servo" / "data.csv.gz"
    raw = bytearray(path.read_bytes())
    raw = raw[: len(raw) // 2] if damage == "truncate" else raw[:-20] + bytes([raw[-20] ^ 1]) + raw[-19:]
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="damaged"):
        load_uci("servo", 0, tmp_path)


@needs_data
def test_download_into_cache_is_checksummed(tmp_path, monkeypatch):
    """Without a data folder, missing files are fetched into the user cache, checked, then read."""
    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ALACARTE_UCI_URL", SHARED.as_uri())  # the same files, served by file://
    fetched = load_uci("servo", 2)
    reference = load_uci("servo", 2, SHARED)
    assert np.array_equal(fetched.x_train, reference.x_train) and np.array_equal(fetched.y_test, reference.y_test)
    assert sorted(p.name for p in (tmp_path / "cache" / "alacarte" / "uci" / "servo").iterdir()) == [
        "data.csv.gz", "test_mask.csv.gz"]


@needs_data
def test_download_with_wrong_checksum_writes_nothing(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    shutil.copytree(SHARED / "machine", mirror / "machine")
    (mirror / "machine" / "data.csv.gz").write_bytes(b"not the data")
    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ALACARTE_UCI_URL", mirror.as_uri())
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_uci("machine", 0)
    assert not (tmp_path / "cache" / "alacarte" / "uci" / "machine" / "data.csv.gz").exists()


def test_download_without_network_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ALACARTE_UCI_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    with pytest.raises(ValueError, match="could not be downloaded.*ALACARTE_DATA"):
        load_uci("challenger", 0)


@pytest.mark.parametrize("failure", ["cut mid-body", "garbled reply", "malformed address"])
def test_a_broken_download_is_a_clear_error(tmp_path, monkeypatch, failure):
    import http.client
    import urllib.request

    def urlopen(url, timeout):
        if failure == "cut mid-body":
            raise http.client.IncompleteRead(b"x" * 1228, 1229)
        if failure == "garbled reply":
            raise http.client.BadStatusLine("garbage")
        raise ValueError(f"unknown url type: {url!r}")

    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(ValueError, match="could not be downloaded.*ALACARTE_DATA"):
        load_uci("challenger", 0)
    assert not (tmp_path / "cache" / "alacarte" / "uci" / "challenger" / "data.csv.gz").exists()


@needs_data
def test_an_empty_data_variable_means_unset(tmp_path, monkeypatch):
    """``ALACARTE_DATA=`` (as in ``ALACARTE_DATA= python …``) falls back to the cache, as an empty
    XDG_CACHE_HOME does, instead of reading the working directory."""
    shutil.copytree(SHARED / "yacht", tmp_path / "cache" / "alacarte" / "uci" / "yacht")
    monkeypatch.setenv("ALACARTE_DATA", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert np.array_equal(load_uci("yacht", 1).x_test, load_uci("yacht", 1, SHARED).x_test)
    assert np.array_equal(load_uci("yacht", 1, "").x_test, load_uci("yacht", 1, SHARED).x_test)


@pytest.mark.parametrize("data, masks, message", [
    (b"\x1f\x8b" + b"\x00" * 10, None, "not a gzip-compressed numeric CSV table"),  # a truncated gzip stream
    ("1,2\n3,nan\n", "0\n1\n", "not a finite number"),
    ("1,2\n3,4\n", "0,1\n1,0\n", "do not form a table"),
    ("1,2\n3,4\n", "0," * 9 + "2\n" + "1," * 9 + "0\n", "do not form a table"),
    ("1,x\n", "0\n", "not a gzip-compressed numeric CSV table"),
])
def test_files_whose_checksum_matches_but_that_are_no_dataset_are_value_errors(data, masks, message, tmp_path,
                                                                               monkeypatch):
    """The registry vouches for the bytes, not what they hold: a truncated gzip stream under a matching
    checksum escaped as an EOFError, a mask of the wrong shape as an IndexError in load_uci."""
    import gzip
    import hashlib

    from alacarte.datasets import uci

    folder = tmp_path / "yacht"
    folder.mkdir()
    mask_text = masks if masks is not None else "0,1,0,0,0,0,0,0,0,0\n"
    contents = {"data.csv.gz": data if isinstance(data, bytes) else gzip.compress(data.encode()),
                "test_mask.csv.gz": gzip.compress(mask_text.encode())}
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    entry = {name: hashlib.sha256(content).hexdigest() for name, content in contents.items()}
    registry = uci._registry()
    monkeypatch.setattr(uci, "_registry", lambda: {**registry, "yacht": {**registry["yacht"], **entry}})
    uci._load_arrays.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            load_uci("yacht", 0, tmp_path)
    finally:
        uci._load_arrays.cache_clear()
