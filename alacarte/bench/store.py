"""The results file of a benchmark run: one CSV row per finished cell, appended under a file lock.

Rows are never rewritten in place: :func:`append_row` appends (and refuses a cell another runner already
finished at the same settings), :func:`upgrade_csv` gives a file of an older runner the current columns
atomically, and a row a stopped writer left without its newline is cut before anything is appended.
"""
from __future__ import annotations

import csv
import fcntl
import os

from ..training import noise_at_bound
from .settings import DEFAULT_NOISE_FLOOR

__all__ = ["FIELDS", "append_row", "read_rows", "finished_rows", "upgrade_csv"]

#: The columns of a results file, in order (new columns go at the end: :func:`upgrade_csv` gives an
#: older file them, blank in its rows).
FIELDS = ["dataset", "split", "method", "model", "status", "rmse", "nlpd", "train_seconds", "peak_rss_mb",
          "n_train", "d", "num_features", "components", "restarts", "max_iter", "seed", "version",
          "iterations", "converged", "device", "peak_device_mb", "noise", "noise_floor", "restart_iter", "machine",
          "coverage50", "coverage95", "std_over_rmse", "validation_fraction"]


def append_row(path: str | os.PathLike, row: dict) -> bool:
    """Append one row (and the header to a new file) under an exclusive lock, synced to disk.

    Returns ``False``, writing nothing, when the file already holds the same cell finished at the
    same settings (another runner on the same file finished it first; for a timeout row, also one
    that timed out).  A last line without its newline
    (a writer stopped mid-row) is cut first, so that the new row does not run on from it."""
    while True:
        with open(path, "a+", newline="") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                if os.fstat(fh.fileno()).st_ino != os.stat(path).st_ino:
                    continue  # upgrade_csv replaced the file while we waited for the lock: append to the new one
                drop_incomplete_last_line(fh)
                if fh.tell() == 0:
                    csv.writer(fh).writerow(FIELDS)
                else:
                    if (header := read_header(path)) != FIELDS:
                        raise ValueError(f"{path} has the columns {header}, this runner writes {FIELDS}; "
                                         "`alacarte bench run` upgrades an older results file before it appends")
                    if any(_cell_key(r) == _cell_key(row) and _supersedes(r, row)
                           for r in read_rows(path) if is_complete(r)):
                        return False
                csv.DictWriter(fh, FIELDS).writerow(row)
                fh.flush()
                os.fsync(fh.fileno())
                return True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def drop_incomplete_last_line(fh) -> str:
    """Cut a last line that lacks its newline from a file open in ``a+`` mode (the caller holds its
    lock); returns what was cut.  Leaves the position at the end."""
    fd = fh.fileno()
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0)
    if size and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        os.ftruncate(fd, keep)
        fh.seek(0, os.SEEK_END)
        return data[keep:].decode("utf-8", "replace")
    fh.seek(0, os.SEEK_END)
    return ""


def _supersedes(old: dict, new: dict) -> bool:
    """Whether a recorded row of a cell makes a new row of it redundant: a result does; a timeout
    only a new timeout at no longer a budget (a timeout row's train_seconds is its budget)."""
    if old["status"] == "ok":
        return True
    return new["status"] == "timeout" and float(new["train_seconds"]) <= float(old["train_seconds"])


def is_complete(row: dict) -> bool:
    """A row with every column and no extra field (csv.DictReader marks those with None)."""
    return None not in row and None not in row.values()


def row_settings(row: dict) -> tuple:
    """The settings a row ran with (max_iter, restarts, restart_iter, noise floor, GPU, D, components,
    held-out share), ``None`` where it does not record one (older rows; older timeout rows left blank
    the features and components that depend on the data)."""
    def number(name):
        value = row.get(name)
        return None if value in (None, "") else int(value)
    return (number("max_iter"), number("restarts"), number("restart_iter"), noise_floor_of(row),
            ran_on_gpu(row), number("num_features"), number("components"), held_out_share(row))


def _cell_key(row: dict) -> tuple:
    return (row["dataset"], int(row["split"]), row["method"], *row_settings(row))


def read_header(path: str | os.PathLike) -> list[str]:
    """The column names of a results or paper CSV (after its comment lines)."""
    with open(path, newline="") as fh:
        return table_rows(fh).fieldnames or []


def table_rows(lines) -> csv.DictReader:
    """The rows of a results or paper CSV; lines starting with ``#`` are comments."""
    return csv.DictReader(line for line in lines if not line.startswith("#"))


def upgrade_csv(path: str | os.PathLike) -> None:
    """Give a results file written before a column was added the current columns, blank in its
    old rows; comment lines are kept.  Atomic: the file is rewritten aside and renamed over the
    old one, under the lock that :func:`append_row` takes, so no row is lost or misaligned."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    with open(path, newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            lines = fh.readlines()
            comments = [line for line in lines if line.startswith("#")]
            reader = table_rows(lines)
            header = reader.fieldnames or []
            if header == FIELDS:
                return
            unknown = [name for name in header if name not in FIELDS]
            rows = list(reader)
            if unknown or not header or any(None in row for row in rows):  # None: a row longer than the header
                raise ValueError(
                    f"{path} is not a results CSV of `alacarte bench run`"
                    + (f": it has columns this runner does not know: {unknown}" if unknown else
                       " (no header, or rows longer than it)")
                    + f"; expected the columns {FIELDS}"
                )
            staged = f"{path}.upgrade"
            with open(staged, "w", newline="") as out:
                out.writelines(comments)
                writer = csv.DictWriter(out, FIELDS)
                writer.writeheader()
                writer.writerows(rows)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staged, path)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a results file as dicts (comment lines left out); none for a file that does not exist."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        return list(table_rows(fh))


def finished_rows(path: str | os.PathLike) -> list[dict]:
    """A results file's rows, after cutting an incomplete last line (a runner stopped mid-write: that
    cell runs again); any other damaged row is an error, never a cell silently counted as done."""
    if not os.path.exists(path):
        return []
    with open(path, "a+", newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if cut := drop_incomplete_last_line(fh):
                print(f"{path}: dropped an incomplete last line (a run stopped while writing it): {cut!r}",
                      flush=True)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    rows = read_rows(path)
    for number, r in enumerate(rows, 1):
        try:
            if not is_complete(r) or r["status"] not in ("ok", "timeout"):
                raise ValueError
            int(r["split"])
        except ValueError:
            text = ",".join(v if isinstance(v, str) else ",".join(v) for v in r.values() if v is not None)
            raise ValueError(f"{path}: data row {number} ({text[:80]!r}) is not a complete results row "
                             f"(the {len(FIELDS)} columns {', '.join(FIELDS[:3])}, …, status ok or timeout); "
                             "repair or remove it") from None
    return rows


def noise_floor_of(row: dict) -> float:
    """A results row's lower bound on σ²; rows from before the column existed ran at GPyTorch's."""
    return float(row.get("noise_floor") or DEFAULT_NOISE_FLOOR)


def held_out_share(row: dict) -> float:
    """The share of training rows a results row's fit held out (rows from before the column existed held none)."""
    return float(row.get("validation_fraction") or 0.0)


def ran_on_gpu(row: dict) -> bool:
    """Whether a results row was fitted on a GPU (rows from before the device column ran on the CPU)."""
    return str(row.get("device") or "cpu").startswith("cuda")


def ended_at_noise_floor(row: dict) -> bool | None:
    """Whether a results row's fit ended with σ² at its bound; ``None`` where σ² was not recorded."""
    return noise_at_bound(float(row["noise"]), noise_floor_of(row)) if row.get("noise") else None
