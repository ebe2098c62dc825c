"""Atomic, checksummed files, shared by the model files (:mod:`alacarte.io`) and fit checkpoints.

Layout::

    signature  |  u32 header length  |  JSON header  |  body

The header carries the format version and the body's length and SHA-256; the
body is a ``torch.save`` archive of tensors, numbers and strings, read back with
``weights_only=True`` (no pickled code runs).  A truncated, damaged or foreign
file is a ``ValueError`` that says which, never a wrong object.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # (Windows: orphaned temporary files are not cleaned up)
    fcntl = None

# A temporary file this young may be a writer's that has not locked it yet: left alone.
_ORPHAN_AGE = 5.0


def _file_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def refuse_unwritable(path: Path, label: str = "") -> None:
    """A ValueError unless :func:`atomic_write` can create its temporary file for ``path`` (the
    target's directory, links followed): a read-only directory or mount, a link into a missing
    directory or a loop of links shows before the work whose result it would hold, not after it."""
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops inside a loop of links
        raise ValueError(f"cannot write {label}{path}: its symbolic links form a loop")
    try:
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise ValueError(f"cannot write {label}{path}: {err.strerror or err} (in {target.parent})") from None
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):  # (removed as an orphan by another writer)
        os.unlink(probe)


def _temporary_names(path: Path) -> re.Pattern:
    """The names :func:`tempfile.mkstemp` gives this module's temporary files for ``path``."""
    return re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")


def remove_orphans(path: Path) -> None:
    """Delete the temporary files of earlier writes of ``path`` whose writer died (kill -9 mid-write).

    A live writer holds a lock on its temporary file from its creation; a dead one's lock is
    gone with its process. Only names of this module's own pattern for ``path`` are touched."""
    if fcntl is None:
        return
    pattern = _temporary_names(path)
    try:
        names = [name for name in os.listdir(path.parent) if pattern.fullmatch(name)]
    except OSError:
        return
    for name in names:
        candidate = path.parent / name
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime < _ORPHAN_AGE:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(candidate)
        except OSError:  # locked: a writer at work
            pass
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    # A symbolic link is followed, as open(path, "w") follows it: replacing the link itself left its
    # target (what other links and readers use) holding the old file.
    path = Path(os.path.realpath(path))
    directory = path.parent
    remove_orphans(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if fcntl is not None:  # held until the file is closed: the mark of a live writer
            fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible on every platform)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_checked(path: Path, signature: bytes, header: dict[str, Any], payload: Any) -> None:
    """Write ``payload`` atomically after ``signature`` and ``header`` (which must hold
    ``format_version``), with the body's length and SHA-256 added to the header."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    header_bytes = json.dumps(
        {**header, "body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}).encode()
    atomic_write(path, signature + struct.pack("<I", len(header_bytes)) + header_bytes + body)


def read_checked(path: Path, signature: bytes, format_version: int, kind: str) -> tuple[dict[str, Any], Any]:
    """(header, payload) of a file :func:`write_checked` wrote; ``kind`` names it in errors
    ("alacarte model file")."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not an {kind}")
    with open(path, "rb") as fh:  # the signature first: a data file given by mistake is not read whole
        data = fh.read(len(signature))
        if data != signature:
            raise ValueError(f"{path} is not an {kind} (it does not start with the {kind}'s signature)")
        data += fh.read()
    start = len(signature) + 4
    if len(data) < start:
        raise ValueError(f"{path} is truncated: it ends inside the file header")
    (header_bytes,) = struct.unpack("<I", data[len(signature):start])
    if len(data) < start + header_bytes:
        raise ValueError(f"{path} is truncated or damaged: its header is incomplete")
    try:
        header = json.loads(data[start:start + header_bytes])
        version = header["format_version"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is damaged: its header is not readable ({err})") from err
    if version != format_version:
        writer = f" (written by alacarte {header['alacarte_version']})" if "alacarte_version" in header else ""
        raise ValueError(f"{path} is an {kind} of format version {version}{writer}; "
                         f"this alacarte reads format version {format_version}")
    if not (isinstance(header.get("body_bytes"), int) and isinstance(header.get("body_sha256"), str)):
        raise ValueError(f"{path} is damaged: its header lacks the size or checksum of its data")
    body = data[start + header_bytes:]
    if len(body) != header["body_bytes"]:
        raise ValueError(f"{path} is truncated: {len(body)} of {header['body_bytes']} data bytes are present")
    if hashlib.sha256(body).hexdigest() != header["body_sha256"]:
        raise ValueError(f"{path} is damaged: its data do not match their SHA-256 checksum")
    try:
        payload = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as err:  # a checksummed body that torch cannot read: a foreign writer
        raise ValueError(f"{path} is damaged: its data cannot be read ({err})") from err
    return header, payload
