"""Appending result rows to an experiment's CSV, one fsync'ed row at a time, so a killed run loses
nothing it finished and resumes from the rows already there."""
from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path


def append_row(path: str | os.PathLike, fields: Sequence[str], row: dict) -> None:
    """Append ``row`` to ``path`` (with the ``fields`` header first when the file is new or empty)."""
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fields)
        if new:
            writer.writeheader()
        writer.writerow(row)
        fh.flush()
        os.fsync(fh.fileno())
