"""Appending result rows to an experiment's CSV, one fsync'ed row at a time, so a killed run loses
nothing it finished and resumes from the rows already there."""
from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence

from alacarte.bench.store import drop_incomplete_last_line, is_complete


def append_row(path: str | os.PathLike, fields: Sequence[str], row: dict) -> None:
    """Append ``row`` to ``path`` (with the ``fields`` header first when the file is new or empty).

    A last line without its newline (a run killed while writing it) is cut first, so that the new row
    does not run on from it; the row is written in one piece.  A file with other columns (written by an
    older version of the script) is refused with a ``ValueError``."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fields)
    with open(path, "a+", newline="") as fh:
        drop_incomplete_last_line(fh)
        if fh.tell() == 0:
            writer.writeheader()
        else:
            fh.seek(0)
            header = next(csv.reader(fh))
            if header != list(fields):  # the row's values would land under other columns
                raise ValueError(f"{path} has the columns {header}; this script writes {list(fields)}: "
                                 "pass another file, or bring this one to the new columns")
            fh.seek(0, os.SEEK_END)
        writer.writerow(row)
        fh.write(text.getvalue())
        fh.flush()
        os.fsync(fh.fileno())


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of ``path`` (none when it does not exist), without a last line that lacks its newline:
    a row cut short by a killed run, which must count as not done (the next append cuts it)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        text = fh.read()
    return [r for r in csv.DictReader(io.StringIO(text[:text.rfind("\n") + 1], newline="")) if is_complete(r)]
