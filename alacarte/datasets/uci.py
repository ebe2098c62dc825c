"""The 29 UCI regression datasets with the À la carte paper's 10 standard splits.

Layout (as in the public ``treforevans/uci_datasets`` collection), one folder
per dataset: ``data.csv.gz`` (inputs then target, no header) and
``test_mask.csv.gz`` (n × 10 of 0/1; column ``s`` marks split ``s``'s test
points).  Every file is checked against the SHA-256 in ``uci_registry.json``
before it is parsed, so a truncated or damaged file is an error, never a
wrong dataset.

The data directory is the ``data_dir`` argument, else ``$ALACARTE_DATA``, else a
user cache directory (``$XDG_CACHE_HOME/alacarte/uci``, by default
``~/.cache/alacarte/uci``) into which missing files are downloaded from the
public collection (``$ALACARTE_UCI_URL`` overrides its address) and checked
against the same checksums before they are kept.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import io
import json
import os
import tempfile
import urllib.error
import urllib.request
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["UCISplit", "load_uci", "list_uci", "cache_dir", "UCI_NUM_SPLITS"]

#: Train/test splits per dataset (the ``split`` of :func:`~alacarte.load_uci` is one of ``0 … UCI_NUM_SPLITS − 1``).
UCI_NUM_SPLITS = 10
ENV_VAR = "ALACARTE_DATA"
URL_ENV_VAR = "ALACARTE_UCI_URL"
PUBLIC_URL = "https://github.com/treforevans/uci_datasets/raw/master/uci_datasets"
_FILES = ("data.csv.gz", "test_mask.csv.gz")

# The paper's names (Table 1) → folder names.
PAPER_NAMES = {
    "challenger": "challenger", "fertility": "fertility", "slump": "concreteslump",
    "automobile": "autos", "servo": "servo", "cancer": "breastcancer", "hardware": "machine",
    "yacht": "yacht", "auto mpg": "autompg", "housing": "housing", "forest fires": "forest",
    "stock": "stock", "pendulum": "pendulum", "energy": "energy", "concrete": "concrete",
    "solar flare": "solar", "airfoil": "airfoil", "wine": "wine", "gas sensor": "gas",
    "skillcraft": "skillcraft", "sml": "sml", "parkinsons": "parkinsons", "pumadyn": "pumadyn32nm",
    "pole tele": "pol", "elevators": "elevators", "kin40k": "kin40k", "protein": "protein",
    "kegg": "keggdirected", "keggu": "keggundirected",
}


@dataclass(frozen=True)
class UCISplit:
    """One train/test split, float64 arrays; targets in the files' units.

    Attributes:
        name: the dataset's folder name (``"pol"`` for "Pole Tele").
        split: the split's index, 0 … 9.
        x_train: training inputs (n, d).
        y_train: training targets (n,).
        x_test: test inputs (m, d).
        y_test: test targets (m,).
    """

    name: str
    split: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@functools.lru_cache(maxsize=1)
def _registry() -> dict:
    with open(Path(__file__).with_name("uci_registry.json"), encoding="utf-8") as fh:
        return json.load(fh)


def canonical_name(name: str) -> str:
    """Folder name for a paper name or folder name (case-insensitive)."""
    key = " ".join(str(name).lower().replace("_", " ").split())
    folder = PAPER_NAMES.get(key, key)
    if folder not in _registry():
        known = ", ".join(sorted(_registry()))
        raise ValueError(f"unknown UCI dataset {name!r}; known: {known} (or their names in the paper's Table 1)")
    return folder


def list_uci() -> dict[str, tuple[int, int]]:
    """Every dataset's folder name with its (n, d).

    Example:
        >>> from alacarte import list_uci
        >>> list_uci()["yacht"]
        (308, 6)
    """
    return {name: (entry["n"], entry["d"]) for name, entry in sorted(_registry().items())}


def cache_dir() -> Path:
    """Where downloaded datasets are kept: ``$XDG_CACHE_HOME/alacarte/uci`` (default ``~/.cache``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "alacarte" / "uci"


def _data_dir(data_dir: str | os.PathLike | None) -> tuple[Path, bool]:
    """The data folder and whether missing files may be downloaded into it (the cache only)."""
    # an empty setting (ALACARTE_DATA= ...) means unset, as for XDG_CACHE_HOME, not the working directory
    chosen = data_dir if data_dir not in (None, "") else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return cache_dir(), True
    path = Path(chosen).expanduser()
    if not path.is_dir():
        source = "data_dir" if data_dir not in (None, "") else f"${ENV_VAR}"
        raise ValueError(f"UCI data directory {str(path)!r} (from {source}) does not exist or is not a directory")
    return path, False


def _download(folder: str, filename: str, target: Path, sha256: str) -> None:
    """Fetch one file into ``target``, kept only if its checksum matches (atomic rename)."""
    base = os.environ.get(URL_ENV_VAR, PUBLIC_URL).rstrip("/")
    url = f"{base}/{folder}/{filename}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            raw = response.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        # (HTTPException: a connection cut mid-body or a garbled reply; ValueError: a malformed URL)
        raise ValueError(
            f"UCI dataset {folder!r} is not in the cache {str(target.parent.parent)!r} and could not be "
            f"downloaded from {url} ({err}). Without a network, point data_dir= or ${ENV_VAR} at a folder "
            "that holds the files"
        ) from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"the download of {url} does not match its checksum (sha256 {digest[:12]}…, expected "
            f"{sha256[:12]}…); nothing was written to the cache"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{filename}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _checked_bytes(path: Path, sha256: str) -> bytes:
    if not path.is_file():
        raise ValueError(f"missing UCI file {str(path)!r}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"UCI file {str(path)!r} is damaged or not the expected version "
            f"(sha256 {digest[:12]}…, expected {sha256[:12]}…); replace it with a fresh copy"
        )
    return raw


def _read_checked(path: Path, sha256: str) -> np.ndarray:
    """The finite numbers of a checksummed file; a ValueError for one that is not a table of them
    (its checksum vouches for the bytes the registry names, not for what they hold)."""
    raw = _checked_bytes(path, sha256)
    try:
        with gzip.open(io.BytesIO(raw)) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": refused below
            table = np.loadtxt(fh, delimiter=",", ndmin=2, comments=None)
    except (OSError, EOFError, zlib.error, ValueError) as err:  # (gzip.BadGzipFile is an OSError)
        raise ValueError(f"UCI file {str(path)!r} is not a gzip-compressed numeric CSV table ({err})") from None
    if table.size == 0 or not np.isfinite(table).all():
        raise ValueError(f"UCI file {str(path)!r} holds no rows or a value that is not a finite number")
    return table


def _fetch(folder: str, base: Path, download: bool) -> None:
    """Download the dataset's missing files into ``base`` where allowed (the cache)."""
    if download:
        for filename in _FILES:
            if not (base / filename).is_file():
                _download(folder, filename, base / filename, _registry()[folder][filename])


def check_files(name: str, data_dir: str | os.PathLike | None = None) -> None:
    """What :func:`load_uci` does before it parses: find (or download) a dataset's files and check
    their checksums.  The benchmark runner calls it for every dataset before it starts a cell, so that
    a missing folder, an unreachable download or a damaged file is one error at once, not a failure
    in every cell of the dataset after the cell's start-up."""
    folder = canonical_name(name)
    directory, download = _data_dir(data_dir)
    base = directory / folder
    _fetch(folder, base, download)
    for filename in _FILES:
        _checked_bytes(base / filename, _registry()[folder][filename])


@functools.lru_cache(maxsize=8)
def _load_arrays(folder: str, directory: str, download: bool) -> tuple[np.ndarray, np.ndarray]:
    entry = _registry()[folder]
    base = Path(directory) / folder
    _fetch(folder, base, download)
    data = _read_checked(base / "data.csv.gz", entry["data.csv.gz"])
    masks = _read_checked(base / "test_mask.csv.gz", entry["test_mask.csv.gz"])
    if data.shape[1] < 2 or masks.shape != (data.shape[0], UCI_NUM_SPLITS) or not np.isin(masks, (0, 1)).all():
        raise ValueError(f"UCI dataset {folder!r}: {data.shape} data and {masks.shape} test masks of 0/1 do not "
                         f"form a table of inputs and a target with {UCI_NUM_SPLITS} splits")
    masks = masks.astype(bool)
    data.flags.writeable = False
    masks.flags.writeable = False
    return data, masks


def load_uci(name: str, split: int, data_dir: str | os.PathLike | None = None) -> UCISplit:
    """Train/test arrays of ``split`` (0–9) of a UCI dataset.

    Args:
        name: a folder name (``"kin40k"``) or the paper's name (``"Pole Tele"``).
        split: 0 … 9, the paper's standard splits.
        data_dir: the data folder; default ``$ALACARTE_DATA``, else the user cache
            (:func:`~alacarte.datasets.uci.cache_dir`), downloading and checksumming missing files.

    Returns:
        The :class:`~alacarte.datasets.UCISplit`.

    Raises:
        ValueError: for an unknown dataset, a split outside 0 … 9, a missing ``data_dir``, a
            file missing or failing its checksum, or a download that fails.

    Example:
        >>> from alacarte import load_uci
        >>> s = load_uci("yacht", 0)                   # from $ALACARTE_DATA, else downloaded
        >>> s.x_train.shape, s.x_test.shape
        ((278, 6), (30, 6))
    """
    folder = canonical_name(name)
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < UCI_NUM_SPLITS:
        raise ValueError(f"split must be an integer in 0..{UCI_NUM_SPLITS - 1}, got {split!r}")
    directory, download = _data_dir(data_dir)
    data, masks = _load_arrays(folder, str(directory.resolve()), download)
    test = masks[:, split]
    x, y = data[:, :-1], data[:, -1]
    return UCISplit(folder, int(split), x[~test].copy(), y[~test].copy(), x[test].copy(), y[test].copy())
