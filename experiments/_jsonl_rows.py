"""Appending result rows to an experiment's JSON-lines file, one fsync'ed line at a time, so a killed
run loses nothing it finished and resumes from the rows already there.

Standard library only: bench_holdout.py runs under other trees' ``PYTHONPATH``, and bench_streaming.py
imports this in workers whose peak memory it measures.
"""
from __future__ import annotations

import json
import os


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append ``row`` to ``path`` as one JSON line, flushed and fsync'ed.

    A last line without its newline (a run killed while writing it) is cut first, so that the new row
    does not run on from it."""
    line = json.dumps(row) + "\n"
    with open(path, "a+") as fh:
        _drop_incomplete_last_line(fh)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of ``path`` (none when it does not exist), skipping blank lines and a last line that
    lacks its newline: a row cut short by a killed run, which must count as not done (the next append
    cuts it)."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        text = fh.read()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def _drop_incomplete_last_line(fh) -> None:
    """Cut a last line that lacks its newline from a file open in ``a+`` mode; leaves the position at
    the end (as ``alacarte.bench.store.drop_incomplete_last_line``, which this module may not import)."""
    fd = fh.fileno()
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    if data and not data.endswith(b"\n"):
        os.ftruncate(fd, data.rfind(b"\n") + 1)
    fh.seek(0, os.SEEK_END)
