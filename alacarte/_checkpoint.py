"""A fit's progress in one file, so that a killed :func:`alacarte.fit` resumes where it was.

The file holds a *key* — the fit's settings and fingerprints (SHA-256) of the model
as it was given and of the training data — and the progress: which stage
(restart k, the final optimisation, the noise refit, done), the optimiser's
and the model's state, the restarts' random generator and what the earlier
stages decided.  A file whose key differs from the fit asking for it is refused
with a ``ValueError`` naming the differences: resuming another fit would
silently return a wrong model.

The file is the model files' checksummed layout (:mod:`alacarte._files`):
written atomically (temporary file, fsync, ``os.replace``), so a kill mid-write
leaves the previous checkpoint; a truncated, damaged or foreign file is a
``ValueError``, never a resume from wrong state; no pickled code runs on reading.
A file whose key matches is still checked field by field against the resuming
fit (:mod:`alacarte._progress`) before any of its progress is restored.

In a data-parallel fit rank 0 alone writes and reads the file and sends what it
read to the other processes; the key holds every process's data fingerprint.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._files import read_checked, refuse_unwritable, write_checked
from ._progress import same

SIGNATURE = b"ALACARTE-FIT-CHECKPOINT\n"
# The model's fingerprint hashes its settings (a kernel's strategy, a constraint's transform) and the
# progress holds no torch generator; a file of another version is refused as such, not as "the model
# given to fit differs" for the very model that wrote it.
FORMAT_VERSION = 2
# Key entries that are fingerprints: a difference is said in words, not as two hashes.
_FINGERPRINTED = {
    "model": "the model given to fit differs (parameters, buffers such as the random features, frozen ones, "
             "or settings such as a Fastfood kernel's strategy)",
    "data": "the training data differ (or their rows come in another order, as from a shuffling DataLoader)",
}


def _raw_bytes(tensor: Tensor) -> bytes:
    """The tensor's values as bytes, row-major (any dtype, bfloat16 included)."""
    return tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def tensor_digest(hasher, tensor: Tensor) -> None:
    """Feed ``tensor``'s dtype, shape and bytes to ``hasher``."""
    hasher.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    hasher.update(_raw_bytes(tensor))


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of the model's structure, parameters, buffers and which parameters are trained.

    The structure is every submodule's class and plain settings: a Fastfood kernel's
    ``strategy`` or a constraint's transform changes the fit but no tensor."""
    hasher = hashlib.sha256(type(model).__qualname__.encode())
    for name, module in model.named_modules():
        # numpy scalars as the Python values they equal: np.int64(4) is no int, and np.float64(0.5)
        # prints otherwise than 0.5, so the same model spelt with either would make another fit
        settings = sorted((key, value.item() if isinstance(value, np.generic) else value)
                          for key, value in vars(module).items() if key != "training" and not key.startswith("_")
                          and isinstance(value, (bool, int, float, str, np.generic)))
        hasher.update(f"{name}:{type(module).__qualname__}:{settings}".encode())
    for name, value in model.state_dict().items():
        hasher.update(name.encode())
        tensor_digest(hasher, value)
    for name, parameter in model.named_parameters():
        hasher.update(f"{name}:{parameter.requires_grad}".encode())
    return hasher.hexdigest()


def data_fingerprint(batches) -> str:
    """SHA-256 of the rows, given as ``(x, y)`` batches in order (independent of how they are batched)."""
    x_hash, y_hash = hashlib.sha256(), hashlib.sha256()
    rows = 0
    for x, y in batches:
        x_hash.update(_raw_bytes(x))
        y_hash.update(_raw_bytes(y))
        rows += x.shape[0]
        dtype = x.dtype
    return hashlib.sha256(f"{rows} {dtype}".encode() + x_hash.digest() + y_hash.digest()).hexdigest()


def checkpoint_path(path: str | os.PathLike) -> Path:
    """``path`` as a :class:`~pathlib.Path`, refused (``ValueError``) where no checkpoint file can be written."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a directory; give the path of a file")
    if not path.parent.is_dir():
        raise ValueError(f"checkpoint {path}: its directory {path.parent} does not exist")
    refuse_unwritable(path, "checkpoint ")  # (else the first save would fail, after the first stage's work)
    return path


def _read_record(path: Path) -> dict[str, Any]:
    _, record = read_checked(path, SIGNATURE, FORMAT_VERSION, "alacarte fit checkpoint")
    if not (isinstance(record, dict) and isinstance(record.get("key"), dict)
            and isinstance(record.get("progress"), dict)):
        raise ValueError(f"{path} is damaged: its data are not a fit's key and progress")
    return record


def saved_progress(path: str | os.PathLike) -> dict[str, Any]:
    """The progress a checkpoint file holds (stage, optimiser state, …), whichever fit it is of."""
    return _read_record(Path(path))["progress"]


class FitCheckpoint:
    """The checkpoint file of one fit: :meth:`load` once at the start, :meth:`save` as it goes.

    ``data`` is the fit's :class:`~alacarte.streaming.ChunkedData` when it is
    distributed (rank 0 then reads and writes for every process), else ``None``.
    """

    def __init__(self, path: str | os.PathLike, key: dict[str, Any], data=None):
        self.path = checkpoint_path(path)
        self.distributed = data is not None and data.distributed
        self.group = data.group if self.distributed else None
        self.key = dict(key)
        if self.distributed:
            import torch.distributed as dist

            fingerprints = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(fingerprints, self.key.pop("data"), group=self.group)
            self.key["data"] = fingerprints
            self.writer = dist.get_rank(self.group) == 0
        else:
            self.writer = True

    def load(self) -> dict[str, Any] | None:
        """The saved progress of this fit, or ``None`` when there is no file yet."""
        progress, error = None, None
        if self.writer:
            try:
                progress = self._read()
            except ValueError as err:
                error = str(err)
        if self.distributed:
            import torch.distributed as dist

            shared = [progress, error]
            dist.broadcast_object_list(shared, src=dist.get_global_rank(self.group, 0) if self.group else 0,
                                       group=self.group)
            progress, error = shared
        if error is not None:
            raise ValueError(error)
        return progress

    def _read(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            record = _read_record(self.path)
        except OSError as err:
            raise ValueError(f"checkpoint {self.path} cannot be read ({err})") from None
        except ValueError as err:
            raise ValueError(f"checkpoint {err}; pass another path, or delete it to fit from the start") from None
        differences = [
            _FINGERPRINTED.get(name) or f"{name}: {record['key'].get(name)!r} there, {value!r} here"
            for name, value in self.key.items()
            if not same(record["key"].get(name), value)
        ]
        if differences:
            raise ValueError(
                f"checkpoint {self.path} is of another fit ({'; '.join(differences)}); resuming it would not give "
                "this fit's result — pass another path, or delete it to fit from the start"
            )
        return record["progress"]

    def save(self, progress: dict[str, Any]) -> None:
        if self.writer:
            write_checked(self.path, SIGNATURE, {"format_version": FORMAT_VERSION},
                          {"key": self.key, "progress": progress})
