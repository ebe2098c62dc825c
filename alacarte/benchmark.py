"""UCI benchmark runner: methods × datasets × splits, resumable, and a report beside the paper's Table 1.

Each cell (dataset, split, method) runs in its own process and appends one row
to a CSV under a file lock; re-running skips finished cells, so a killed run
resumes where it stopped.  A cell's fit keeps a checkpoint (``fit(checkpoint=)``)
in ``<csv stem>.checkpoints/`` beside the CSV, so a cell killed mid-fit goes on
from it on the next run and writes the row the uninterrupted cell would have
written; the file is deleted once the cell's row is written (the folder
stays).  A cell that outlives its time budget is stopped and recorded as
``timeout`` (not retried, unless a later run gives a longer ``--time-budget``);
a cell that raises is reported and retried on the next run.

Protocol as in the À la carte paper: inputs standardised on the training
split, RMSE in the target's original units, the same number of basis functions
for every method of a dataset, and exact RBF/ARD GPs only below 2000 training
points — above that the ``exact-*`` methods run as Fastfood expansions of the
same kernels (the row's ``model`` column says which). ::

    alacarte bench run --datasets yacht energy --methods gm pwl --splits 0-9 --csv uci.csv
    alacarte bench report --csv uci.csv --out uci.md
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import json
import math
import multiprocessing as mp
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ._validation import check_nonnegative_int, check_positive_int, check_real
from .datasets.uci import UCI_NUM_SPLITS, load_uci
from .holdout import check_fraction
from .training import noise_at_bound

__all__ = ["METHODS", "main", "run", "report"]

FIELDS = ["dataset", "split", "method", "model", "status", "rmse", "nlpd", "train_seconds", "peak_rss_mb",
          "n_train", "d", "num_features", "components", "restarts", "max_iter", "seed", "version",
          "iterations", "converged", "device", "peak_device_mb", "noise", "noise_floor", "restart_iter", "machine",
          "coverage50", "coverage95", "std_over_rmse", "validation_fraction"]
# (new columns go at the end: upgrade_csv gives an older file them, blank in its rows)
# The columns the report reads in every row (results files written before the others existed lack those).
# The numbers the report reads from every finished row, and how each parses.
_REPORTED_NUMBERS = {"split": int, "max_iter": int, "rmse": float, "train_seconds": float, "peak_rss_mb": float}
_REPORTED_FIELDS = ("dataset", "method", *_REPORTED_NUMBERS)
#: The methods a run can be given (``--methods``), in the order of the report's columns.
METHODS = ("exact-rbf", "exact-ard", "fastfood-rbf", "fastfood-ard", "fsard", "fsgbard", "gm", "pwl", "ssgpr", "rks")
# (the names of alacarte.factory.KERNEL_NAMES, in the order of the report's columns)
ALACARTE_METHODS = ("fsard", "fsgbard", "gm", "pwl")
PAPER_COLUMNS = {"exact-rbf": "RBF", "exact-ard": "ARD", "fsard": "FSARD", "gm": "GM", "pwl": "PWL",
                 "fsgbard": "FSGBARD", "ssgpr": "SSGPR"}
EXACT_LIMIT = 2000  # the paper's exact GPs stop here; Fastfood expansions of the same kernels above
DEFAULT_NOISE_FLOOR = 1e-4  # GPyTorch's GaussianLikelihood bound on σ² (standardised units); older rows ran at it
DEFAULT_PAPER_TABLE = Path(__file__).resolve().parents[1] / "experiments" / "paper_table1.csv"


def mixture_components(setting: str | int, n_train: int) -> int:
    """Q for GM and C for PWL: a number, or ``"auto"`` — 2 below 600 training points, else 4.

    The paper gives more components to larger datasets; on housing (n = 455)
    four components overfit the marginal likelihood (test RMSE rises as it
    trains), two do not.
    """
    if setting == "auto":
        return 2 if n_train < 600 else 4
    return int(setting)


def model_name(method: str, n_train: int) -> str:
    """The model a method runs as: exact GPs become Fastfood expansions at n ≥ 2000."""
    if method.startswith("exact-") and n_train >= EXACT_LIMIT:
        return method.replace("exact-", "fastfood-")
    return method


# -- running ------------------------------------------------------------------------------
def _cell_process(index: int, cell: tuple, results, runner: int) -> None:
    """Fit one method on one split in a fresh process; put (index, row or error) on ``results``.
    Exits when the runner (process ``runner``) is gone, even killed with SIGKILL or by the
    out-of-memory killer: an orphan would fit on with no time budget, its result lost."""
    threading.Thread(target=_exit_without, args=(runner,), daemon=True).start()
    try:
        results.put((index, _run_cell(cell)))
    except Exception as err:  # one failed cell must not stop the run; it is retried on re-run
        dataset, split, method, _ = cell
        results.put((index, {"error": f"{dataset} split {split} {method}: {type(err).__name__}: {err}"}))


def _exit_without(runner: int) -> None:
    while os.getppid() == runner:
        time.sleep(1.0)
    os._exit(1)


def _run_cell(cell: tuple) -> dict:
    dataset, split, method, cfg = cell
    import torch
    from gpytorch.constraints import GreaterThan

    import alacarte as ac
    from alacarte.factory import make_model

    torch.set_num_threads(cfg["threads"])
    # scipy's BLAS (syrk/symm of the Gram matrix) has a thread pool of its own.
    threadpool_limits(cfg["threads"])
    torch.set_default_dtype(torch.float64)
    device = torch.device(cfg["device"])
    data = ac.load_uci(dataset, split, cfg["data"])
    n_train, d = data.x_train.shape
    columns = _model_columns(method, n_train, cfg)
    components = mixture_components(cfg["components"], n_train)
    # Built on the CPU and then moved: the random frequencies are the same on every device.
    model = make_model(columns["model"], d, num_samples=cfg["num_samples"], num_components=components, seed=split)
    if cfg["noise_floor"] != DEFAULT_NOISE_FLOOR:  # the default model untouched: its rows stay those of older runs
        model.likelihood.noise_covar.register_constraint("raw_noise", GreaterThan(cfg["noise_floor"]))
    model = model.to(device)
    # (made here, not once per run: the folder may have been deleted since, by hand)
    os.makedirs(cfg["checkpoints"], exist_ok=True)
    history = ac.fit(model, data.x_train, data.y_train, max_iter=cfg["max_iter"], restarts=cfg["restarts"],
                     restart_iter=cfg["restart_iter"], seed=split, progress=False,
                     checkpoint=cell_checkpoint(cfg, dataset, split, method),
                     validation_fraction=columns["validation_fraction"])
    pred = model.predict(data.x_test)
    y = torch.as_tensor(data.y_test, device=device)
    on_gpu = device.type == "cuda"
    return _row(dataset, split, method, cfg, status="ok", d=d, **columns,
                **predictive_scores(pred.mean, pred.observed_variance, y),
                train_seconds=round(history.seconds, 3), iterations=history.iterations,
                converged=history.converged,
                peak_rss_mb=round(peak_rss_mb(), 1),
                device=f"cuda: {torch.cuda.get_device_name(device)}" if on_gpu else device.type,
                peak_device_mb=round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if on_gpu else "",
                noise=float(model.likelihood.noise.detach().min()),
                noise_floor=float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound),
                machine=machine_description(cfg["threads"]))


# Two-sided standard-normal quantiles of the central 50% and 95% intervals.
_Z50, _Z95 = 0.6744897501960817, 1.959963984540054


def predictive_scores(mean, variance, y) -> dict:
    """Test RMSE, mean NLPD, the coverage of the central 50% and 95% predictive intervals, and the mean
    predictive standard deviation over the RMSE (1 where the spread matches the errors; below 1: over-confident)."""
    z = (y - mean) / variance.sqrt()
    rmse = float((y - mean).pow(2).mean().sqrt())
    return {"rmse": rmse, "nlpd": float((0.5 * (z**2 + variance.log() + math.log(2 * math.pi))).mean()),
            "coverage50": float((z.abs() <= _Z50).double().mean()),
            "coverage95": float((z.abs() <= _Z95).double().mean()),
            "std_over_rmse": float(variance.sqrt().mean()) / rmse}


def _model_columns(method: str, n_train: int, cfg: dict) -> dict:
    """A cell's model, n, D, components and held-out share as its row records them: they depend on its training
    points (exact GPs run as Fastfood expansions at n ≥ 2000; ``auto`` components) and its method (exact GPs, the
    reference, are fitted by the marginal likelihood of all rows)."""
    kind = model_name(method, n_train)
    return {"model": kind, "n_train": n_train, "num_features": 0 if kind.startswith("exact") else 2 * cfg["num_samples"],
            "validation_fraction": cell_validation_fraction(method, cfg["validation_fraction"]),
            "components": mixture_components(cfg["components"], n_train) if method in ("gm", "pwl") else ""}


def machine_description(threads: int) -> str:
    """The CPU a cell ran on, as far as its round-off goes: the model name, the vector instruction set
    ATen's kernels dispatch to, and the threads it used.  A fit that stops at max_iter can reproduce only
    to ~1e-5–1e-2 elsewhere (the code of dcce354 gave concreteslump FSGBARD split 0 a test RMSE of 3.0330
    in uci_noise_floor.csv and 3.0116 when run again later; fertility FSARD 0.145166 → 0.145167), so the
    rows say where they were computed."""
    import platform

    import torch

    model = _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
    return f"{model} ({torch.backends.cpu.get_cpu_capability()}, {threads} thread{'s' if threads != 1 else ''})"


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (2²⁰ bytes).

    Not ``getrusage``'s ``ru_maxrss`` where Linux gives ``VmHWM``: exec keeps the larger of the
    old and the new address space's peaks in ``ru_maxrss``, so a cell process (spawned: fork,
    then exec) would report its runner's peak whenever that is the larger — a runner holding
    1.5 GB gave a 392 MB cell 1811 MB.  ``VmHWM`` is the peak of this process's own address space."""
    match = re.fullmatch(r"(\d+) kB", _proc_field("/proc/self/status", "VmHWM") or "")
    if match:
        return int(match.group(1)) / 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, else KiB


def _proc_field(path: str, key: str) -> str | None:
    """The value of a ``key: value`` line of a Linux /proc file; None without the file or the line."""
    with contextlib.suppress(OSError):
        found = re.search(rf"^{re.escape(key)}\s*:\s*(.+)$", Path(path).read_text(), re.MULTILINE)
        return found.group(1).strip() if found else None
    return None


def checkpoint_directory(csv_path: str | os.PathLike) -> Path:
    """Where a results file's cells keep their fits' checkpoints: ``<csv stem>.checkpoints/`` beside it."""
    path = Path(csv_path)
    return path.with_name(path.stem + ".checkpoints")


# The settings a cell's fit depends on; threads and the data folder are not among them
# (the fit's own key holds the data's fingerprint).
_FIT_SETTINGS = ("num_samples", "components", "max_iter", "restarts", "restart_iter", "device", "noise_floor",
                 "validation_fraction", "version")


def cell_checkpoint(cfg: dict, dataset: str, split: int, method: str) -> Path:
    """The checkpoint file of one cell.  Its name holds a hash of the run's settings and package
    version: a run at other settings, or of other code, fits its cells from the start rather than
    being refused another run's checkpoint.  The checkpoint format is part of it: an installed copy's
    version is the release alone, which a change of format need not change."""
    from ._checkpoint import FORMAT_VERSION

    settings = json.dumps({**{name: cfg[name] for name in _FIT_SETTINGS}, "checkpoint_format": FORMAT_VERSION},
                          sort_keys=True)
    tag = hashlib.sha256(settings.encode()).hexdigest()[:12]
    return Path(cfg["checkpoints"]) / f"{dataset}-{split}-{method}-{tag}.ckpt"


_TAGGED_CHECKPOINT = re.compile(r"(.+)-[0-9a-f]{12}\.ckpt")
# A write's temporary file older than this was left by a killed writer (a write takes milliseconds).
_STALE_WRITE_SECONDS = 3600.0


def _forget_checkpoints(cfg: dict, cells) -> None:
    """Delete the checkpoints of recorded cells, whichever settings or code wrote them (a
    recorded cell does not run again), and writes left half-done by a killed cell."""
    directory = Path(cfg["checkpoints"])
    cells = {f"{dataset}-{split}-{method}" for dataset, split, method, *_ in cells}
    paths = list(directory.iterdir()) if directory.is_dir() else []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # (another runner may delete it first)
            tagged = _TAGGED_CHECKPOINT.fullmatch(path.name)
            stale = path.name.endswith(".tmp") and time.time() - path.stat().st_mtime > _STALE_WRITE_SECONDS
            if (tagged and tagged.group(1) in cells) or stale:
                path.unlink()


def package_version() -> str:
    """``alacarte.__version__``, plus ``+g<commit>`` when the package runs from a git checkout, and
    ``.dirty<hash>`` (the first 8 hex digits of the SHA-256 of ``git diff HEAD`` of the package) for
    uncommitted changes: every row names the code that produced it, and two different edits are
    two versions (a cell killed under one does not resume its checkpoint under the other)."""
    import alacarte as ac

    root = Path(ac.__file__).resolve().parent.parent

    def git(*command: str) -> bytes:
        return subprocess.run(["git", "-C", str(root), *command], capture_output=True, timeout=10,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=7", "HEAD").decode()
        # An installed copy (site-packages of a virtual environment kept inside some project's
        # checkout) is in a git work tree too, but not in its commits: that commit is not this code.
        tracked = git("ls-files", "--", "alacarte/__init__.py")
        diff = git("diff", "HEAD", "--binary", "--", "alacarte")
    except (OSError, subprocess.SubprocessError):
        return ac.__version__
    if not commit or not tracked:
        return ac.__version__
    return f"{ac.__version__}+g{commit}" + (f".dirty{hashlib.sha256(diff).hexdigest()[:8]}" if diff else "")


def _row(dataset, split, method, cfg, **values) -> dict:
    row = {"dataset": dataset, "split": split, "method": method, "restarts": cfg["restarts"],
           "restart_iter": cfg["restart_iter"], "max_iter": cfg["max_iter"], "seed": split,
           "version": cfg["version"], "device": cfg["device"], "noise_floor": cfg["noise_floor"]}
    row.update(values)
    return row


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
                _drop_incomplete_last_line(fh)
                if fh.tell() == 0:
                    csv.writer(fh).writerow(FIELDS)
                else:
                    if (header := _header(path)) != FIELDS:
                        raise ValueError(f"{path} has the columns {header}, this runner writes {FIELDS}; "
                                         "`alacarte bench run` upgrades an older results file before it appends")
                    if any(_cell_key(r) == _cell_key(row) and _supersedes(r, row)
                           for r in read_rows(path) if _complete(r)):
                        return False
                csv.DictWriter(fh, FIELDS).writerow(row)
                fh.flush()
                os.fsync(fh.fileno())
                return True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _drop_incomplete_last_line(fh) -> str:
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


def _complete(row: dict) -> bool:
    """A row with every column and no extra field (csv.DictReader marks those with None)."""
    return None not in row and None not in row.values()


def _settings(row: dict) -> tuple:
    """The settings a row ran with, ``None`` where it does not record one (older rows; timeout rows
    written before d7c7b8c left blank the features and components that depend on the data)."""
    def number(name):
        value = row.get(name)
        return None if value in (None, "") else int(value)
    return (number("max_iter"), number("restarts"), number("restart_iter"), noise_floor_of(row),
            ran_on_gpu(row), number("num_features"), number("components"), held_out_share(row))


def _cell_key(row: dict) -> tuple:
    return (row["dataset"], int(row["split"]), row["method"], *_settings(row))


def _other_setting(row: dict, args: argparse.Namespace) -> str | None:
    """The first setting a results row ran with that this run does not ask for (``None``: none)."""
    max_iter, restarts, restart_iter, floor, gpu, features, components, held_out = _settings(row)
    wanted_gpu = args.device.startswith("cuda")
    checks = [("max_iter", max_iter, args.max_iter), ("restarts", restarts, args.restarts),
              ("restart_iter", restart_iter, args.restart_iter), ("noise_floor", floor, args.noise_floor),
              ("device", "cuda" if gpu else "cpu", "cuda" if wanted_gpu else "cpu"),
              ("validation_fraction", held_out, cell_validation_fraction(row["method"], args.validation_fraction))]
    if features:  # 0 for an exact GP: it has no features
        checks.append(("D", features, 2 * args.num_samples))
    if components is not None:
        if args.components != "auto":
            checks.append(("components", components, int(args.components)))
        elif row.get("n_train"):  # (an older timeout row has none: 'auto' chose by data it never read)
            checks.append(("components", components, mixture_components("auto", int(row["n_train"]))))
    for name, ran, wanted in checks:
        if ran is not None and ran != wanted:
            return f"{name}={ran} (this run: {wanted})"
    return None


def _header(path: str | os.PathLike) -> list[str]:
    with open(path, newline="") as fh:
        return _table(fh).fieldnames or []


def _table(lines) -> csv.DictReader:
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
            reader = _table(lines)
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
    if not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        return list(_table(fh))


def parse_splits(text: str) -> list[int]:
    """``"0-9"`` or ``"0,3,5"`` → split indices, each checked to be in 0..9."""
    try:
        if "-" in text:
            lo, hi = text.split("-")
            splits = list(range(int(lo), int(hi) + 1))
        else:
            splits = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"splits must look like '0-9' or '0,3,5', got {text!r}") from None
    if not splits:  # (a range from high to low)
        raise ValueError(f"splits {text!r} is an empty range; write the lower split first, as in '0-9'")
    if any(not 0 <= s <= 9 for s in splits):
        raise ValueError(f"splits must be in 0..9, got {text!r}")
    return splits


def run(args: argparse.Namespace) -> int:
    """``alacarte bench run``: fit every pending (dataset, split, method) cell, one process each.

    Cells already in ``args.csv`` at the same settings are skipped; the others run
    ``args.workers`` at a time and append their rows as they finish.

    Args:
        args: the options of ``alacarte bench run`` (``datasets``, ``methods``, ``splits``,
            ``csv``, ``data``, ``num_samples``, ``components``, ``max_iter``, ``restarts``,
            ``restart_iter``, ``workers``, ``threads``, ``device``, ``noise_floor``,
            ``time_budget``, ``limit``, ``quiet``), as :func:`main` parses them.

    Returns:
        The exit status, 1 if any cell failed (it is not written, and runs again on the
        next run), else 0.  A cell stopped at ``time_budget`` is written as ``timeout``, not a failure,
        and runs again only in a run with a longer ``time_budget``.

    Raises:
        ValueError: before any cell starts, for an unknown method or dataset, splits outside
            0..9, a setting every cell would fail on, a missing ``data`` folder or ``csv`` folder,
            a ``csv`` that is not a results file, or a dataset whose files are missing (and cannot
            be downloaded) or damaged.
    """
    from .datasets.uci import canonical_name, check_files

    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {METHODS}")
    datasets = list(dict.fromkeys(canonical_name(ds) for ds in args.datasets))  # each cell once
    _check_settings(args)
    check_device(args.device)
    if args.data is not None and not os.path.isdir(args.data):
        raise ValueError(f"--data {args.data}: no such folder")
    folder = os.path.dirname(os.path.abspath(args.csv))
    if not os.path.isdir(folder):
        raise ValueError(f"--csv {args.csv}: its folder {folder} does not exist")
    upgrade_csv(args.csv)
    done, other, retried = set(), [], set()
    for r in _finished_rows(args.csv):
        if r["status"] == "timeout" and args.time_budget is not None and args.time_budget > float(r["train_seconds"]):
            retried.add((r["dataset"], int(r["split"]), r["method"]))  # (done below if a row has its result)
            continue
        why = _other_setting(r, args)
        if why is None:
            done.add((r["dataset"], int(r["split"]), r["method"]))
        else:
            other.append(f"{r['dataset']} split {r['split']} {r['method']}: {why}")
    if retried - done:
        print(f"{len(retried - done)} timed-out cells run again: this run's --time-budget ({args.time_budget:g} s) "
              "is longer than theirs", flush=True)
    if other:
        print(f"{len(other)} rows of {args.csv} ran with other settings (e.g. {other[0]}): not counted as done; "
              "this run's rows go beside them, in report columns of their own", flush=True)
    cfg = cell_settings(args)
    cells = [(ds, s, m, cfg) for ds in datasets for s in dict.fromkeys(parse_splits(args.splits))
             for m in dict.fromkeys(args.methods) if (ds, s, m) not in done]
    if args.limit is not None:
        cells = cells[: args.limit]
    for ds in dict.fromkeys(ds for ds, *_ in cells):  # (else each of its cells would fail alone, after start-up)
        check_files(ds, args.data)
    print(f"{len(done)} cells done, {len(cells)} to run", flush=True)
    _forget_checkpoints(cfg, done)  # those a runner stopped between writing a row and deleting them
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    pending, running = list(enumerate(cells))[::-1], {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # `kill <runner>` must stop its workers too (see the finally below)
        previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        failures = _run_cells(args, cfg, ctx, pending, running, results)
    finally:
        # A stopped runner takes its workers with it: an orphan would fit on for minutes or hours,
        # its result lost (rows are written by the runner), beside the resumed run's cells.
        for proc, *_ in running.values():
            proc.kill()
            proc.join()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    return 1 if failures else 0


def cell_settings(args: argparse.Namespace) -> dict:
    """What every cell of a run is given, besides its dataset, split and method."""
    return {"data": args.data, "num_samples": args.num_samples, "components": args.components,
            "max_iter": args.max_iter, "restarts": args.restarts, "restart_iter": args.restart_iter,
            "threads": args.threads, "device": args.device, "noise_floor": args.noise_floor,
            "validation_fraction": args.validation_fraction,
            "version": package_version(), "checkpoints": str(checkpoint_directory(args.csv))}


def _finished_rows(path: str | os.PathLike) -> list[dict]:
    """A results file's rows, after cutting an incomplete last line (a runner stopped mid-write: that
    cell runs again); any other damaged row is an error, never a cell silently counted as done."""
    if not os.path.exists(path):
        return []
    with open(path, "a+", newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if cut := _drop_incomplete_last_line(fh):
                print(f"{path}: dropped an incomplete last line (a run stopped while writing it): {cut!r}",
                      flush=True)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    rows = read_rows(path)
    for number, r in enumerate(rows, 1):
        try:
            if not _complete(r) or r["status"] not in ("ok", "timeout"):
                raise ValueError
            int(r["split"])
        except ValueError:
            text = ",".join(v if isinstance(v, str) else ",".join(v) for v in r.values() if v is not None)
            raise ValueError(f"{path}: data row {number} ({text[:80]!r}) is not a complete results row "
                             f"(the {len(FIELDS)} columns {', '.join(FIELDS[:3])}, …, status ok or timeout); "
                             "repair or remove it") from None
    return rows


def _check_settings(args: argparse.Namespace) -> None:
    """Refuse settings every cell would fail on (or a run that could never finish) before any cell starts."""
    for name in ("num_samples", "max_iter", "restart_iter", "workers", "threads"):
        check_positive_int(getattr(args, name), "--" + name.replace("_", "-"))
    check_nonnegative_int(args.restarts, "--restarts")
    if args.limit is not None:
        check_nonnegative_int(args.limit, "--limit")
    if args.time_budget is not None:
        check_real(args.time_budget, "--time-budget", 0)
    check_fraction(args.validation_fraction)
    if check_real(args.noise_floor, "--noise-floor", 0) >= 1:
        raise ValueError(f"--noise-floor must be below 1, the standardised targets' variance, got {args.noise_floor!r}")
    if args.components != "auto":
        try:
            check_positive_int(int(args.components), "--components")
        except ValueError:
            raise ValueError(f"--components must be 'auto' or a positive integer, got {args.components!r}") from None
    if {"gm", "pwl"} & set(args.methods):
        for count in (2, 4) if args.components == "auto" else (int(args.components),):
            if args.num_samples % count:
                raise ValueError(f"--num-samples {args.num_samples} must be a multiple of the number of GM/PWL "
                                 f"components, {count} (each component has M/C frequencies)"
                                 + (" ('auto' uses 2 or 4)" if args.components == "auto" else ""))


def check_device(name: str) -> None:
    """Refuse a device the cells could not use before any cell starts (each would fail alone)."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a torch device ({err})") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:index], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r}: this torch build or machine has no CUDA device")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _run_cells(args, cfg, ctx, pending: list, running: dict, results) -> int:
    """Keep ``args.workers`` cell processes busy until ``pending`` is empty; returns the failures.
    ``running`` is the caller's, so that it can stop what is still running if this is interrupted."""
    failures = 0
    with tqdm(total=len(pending), disable=args.quiet, desc="cells", unit="cell") as bar:
        while pending or running:
            while pending and len(running) < args.workers:
                index, cell = pending.pop()
                proc = ctx.Process(target=_cell_process, args=(index, cell, results, os.getpid()), daemon=True)
                proc.start()
                running[index] = (proc, cell, time.monotonic())
            # Every result already sent is taken before any budget is judged: a cell that finished
            # in time is never recorded as a timeout.
            delivered, wait = [], 1.0
            while True:
                try:
                    delivered.append(results.get(timeout=wait))
                except queue.Empty:
                    break
                wait = 0.0
            for index, row in delivered:
                if index in running:  # (else already stopped and recorded)
                    proc, cell, _ = running.pop(index)
                    proc.join()
                    failures += _record(args, row, bar)
                    if "error" not in row:  # a failed cell runs again and resumes from its checkpoint
                        _forget_checkpoints(cfg, [cell])
            for index, (proc, cell, started) in list(running.items()):
                dataset, split, method, _ = cell
                if args.time_budget and time.monotonic() - started > args.time_budget:
                    proc.kill()
                    proc.join()
                    del running[index]
                    # The runner never sees the cell's model: its n, D and components are found from the
                    # split (a timeout row without them, as before, matched a run at any D or components,
                    # which then skipped the cell as done and never ran it).
                    n_train, d = load_uci(dataset, split, cfg["data"]).x_train.shape
                    _record(args, _row(dataset, split, method, cfg, status="timeout", train_seconds=args.time_budget,
                                       d=d, **_model_columns(method, n_train, cfg)), bar)
                    _forget_checkpoints(cfg, [cell])
                elif proc.exitcode not in (None, 0):  # died without a word: killed, out of memory
                    del running[index]
                    failures += _record(args, {"error": f"{dataset} split {split} {method}: worker died "
                                                        f"with exit code {proc.exitcode}"}, bar)
    return failures


def _record(args, row: dict, bar) -> int:
    """Write a finished cell's row; returns 1 for a failure (not written, so retried on re-run)."""
    bar.update(1)
    if "error" in row:
        tqdm.write(f"FAILED {row['error']}")
        return 1
    if not append_row(args.csv, row):
        tqdm.write(f"{row['dataset']} split {row['split']} {row['method']}: already in {args.csv} at these "
                   "settings (another runner on the same file finished it first); not written twice")
    elif row["status"] == "ok":
        bar.set_postfix_str(f"{row['dataset']}/{row['split']}/{row['method']} RMSE {row['rmse']:.4g}")
        if args.quiet:
            print(f"{row['dataset']} split {row['split']} {row['method']}: RMSE {row['rmse']:.4g} "
                  f"({row['train_seconds']:.1f}s)", flush=True)
    else:
        tqdm.write(f"{row['dataset']} split {row['split']} {row['method']}: timed out after {args.time_budget} s")
    return 0


# -- reporting ----------------------------------------------------------------------------
class PaperValue(NamedTuple):
    mean: float
    std: float
    decimals: int  # as printed: the paper's 0.47 is some value in [0.465, 0.475)
    printed: str  # "2.00 ± 0.38", as the paper prints it (a float would read back as "2")


def load_paper(path: str | os.PathLike) -> dict:
    """The paper's table: (dataset, method) → its printed mean RMSE and ± ."""
    if not os.path.isfile(path):  # e.g. the default, from an installed copy: the table is not package data
        raise ValueError(f"--paper {path}: no such file (the paper's table is experiments/paper_table1.csv in "
                         "alacarte's source tree; pass its path)")
    rows = read_rows(path)
    try:
        table = {(r["dataset"], r["method"]): PaperValue(float(r["rmse_mean"]), float(r["rmse_std"]),
                                                         len(r["rmse_mean"].partition(".")[2]),
                                                         f"{r['rmse_mean'].strip()} ± {r['rmse_std'].strip()}")
                 for r in rows}
    except (KeyError, TypeError, ValueError):
        table = {}
    if not table:
        raise ValueError(f"--paper {path}: not a table of the paper's values (a CSV with the columns dataset, "
                         f"method, rmse_mean, rmse_std; the default is {DEFAULT_PAPER_TABLE})")
    return table


def _fmt(mean: float, std: float) -> str:
    return f"{mean:.3g} ± {std:.2g}"


class Column(NamedTuple):
    """A report column: a method, and its number of features D, max_iter, noise floor, restarts and
    components where the rows hold the method at several, and ``cuda`` for rows fitted on a GPU
    (their seconds are not the CPU's)."""
    method: str
    features: int | None = None
    max_iter: int | None = None
    gpu: bool = False
    noise_floor: float | None = None
    restarts: int | None = None
    components: int | None = None
    held_out: float | None = None

    def __str__(self) -> str:
        return " ".join([self.method, *([f"D={self.features}"] if self.features else []),
                         *([f"max_iter={self.max_iter}"] if self.max_iter else []),
                         *([f"σ²≥{self.noise_floor:g}"] if self.noise_floor else []),
                         *([f"restarts={self.restarts}"] if self.restarts is not None else []),
                         *([f"components={self.components}"] if self.components else []),
                         *([f"held-out {self.held_out:g}"] if self.held_out else []),
                         *(["cuda"] if self.gpu else [])])

    def order(self) -> tuple:
        return (METHODS.index(self.method), self.features or 0, self.max_iter or 0, -(self.noise_floor or 1),
                self.restarts or 0, self.components or 0, self.held_out or 0, self.gpu)


def _features(row: dict) -> int:
    """The row's number of features D; 0 for an exact GP (blank in older rows)."""
    return int(row.get("num_features") or 0)


def noise_floor_of(row: dict) -> float:
    """A results row's lower bound on σ²; rows from before the column existed ran at GPyTorch's."""
    return float(row.get("noise_floor") or DEFAULT_NOISE_FLOOR)


def cell_validation_fraction(method: str, fraction: float) -> float:
    """The share of rows a method's fit holds out at the run's ``--validation-fraction``: none for exact GPs,
    the reference, fitted by the marginal likelihood of all rows."""
    return 0.0 if method.startswith("exact") else fraction


def held_out_share(row: dict) -> float:
    """The share of training rows a results row's fit held out (rows from before the column existed held none)."""
    return float(row.get("validation_fraction") or 0.0)


def ran_on_gpu(row: dict) -> bool:
    """Whether a results row was fitted on a GPU (rows from before the device column ran on the CPU)."""
    return str(row.get("device") or "cpu").startswith("cuda")


def ended_at_noise_floor(row: dict) -> bool | None:
    """Whether a results row's fit ended with σ² at its bound; ``None`` where σ² was not recorded."""
    return noise_at_bound(float(row["noise"]), noise_floor_of(row)) if row.get("noise") else None


def _column_of(rows: list[dict], timed_out: list[dict] = ()):
    """A function giving each row its report column: results files of several protocols in one
    report give a method found at several D (or several max_iter, noise floors, restarts) one column
    per setting (``gm D=4096``, ``gm D=4096 max_iter=300``, ``pwl σ²≥1e-08``).  A floor other than
    GPyTorch's is always named.  Exact GPs (no features) never split by D.  Components split a
    method only where one dataset holds it at several (``auto`` gives datasets of different sizes
    different numbers: one protocol, one column).  The settings ``timed_out`` rows recorded count
    too (blank ones, in older rows, do not)."""
    sizes, iterations, floors, restarts = defaultdict(set), defaultdict(set), defaultdict(set), defaultdict(set)
    components = defaultdict(set)
    # Timeout rows count too: a timeout at a setting no finished cell had (gm at D=64 beside gm's finished
    # cells at D=32) was counted in the column of the finished ones, as if those settings had timed out.
    for r in [*rows, *timed_out]:
        # A result's blank restarts or components are a setting of their own; an older timeout row's are none.
        blank = "" if r.get("status", "ok") == "ok" else None
        if _features(r):
            sizes[r["method"]].add(_features(r))
        if r.get("max_iter"):  # (every result has it)
            iterations[r["method"]].add(int(r["max_iter"]))
        floors[r["method"]].add(noise_floor_of(r))
        if (value := r.get("restarts") or blank) is not None:
            restarts[r["method"]].add(value)
        if (value := r.get("components") or blank) is not None:
            components[(r["dataset"], r["method"])].add(value)
    several_components = {method for (_, method), values in components.items() if len(values) > 1}

    def column(r: dict) -> Column:
        method, features = r["method"], _features(r)
        return Column(method, features if len(sizes[method]) > 1 and features else None,
                      int(r["max_iter"]) if len(iterations[method]) > 1 else None,
                      ran_on_gpu(r),
                      noise_floor_of(r) if len(floors[method]) > 1 or noise_floor_of(r) != DEFAULT_NOISE_FLOOR
                      else None,
                      int(r["restarts"]) if len(restarts[method]) > 1 and r.get("restarts") else None,
                      int(r["components"]) if method in several_components and r.get("components") else None,
                      held_out_share(r) or None)
    return column


def _results(path: str) -> list[dict]:
    """A results file's rows, checked to hold numbers wherever the report reads one."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such results file")
    try:
        header, rows = _header(path), read_rows(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a text CSV file ({err})") from None
    missing = [name for name in _REPORTED_FIELDS if name not in header]
    if missing:
        raise ValueError(f"{path} is not a benchmark results file: it lacks the column(s) {', '.join(missing)}")
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        for name, number in _REPORTED_NUMBERS.items():
            try:
                value = number(r[name])
            except (TypeError, ValueError):
                raise ValueError(f"{path}: the row of {r['dataset']}, split {r['split']}, {r['method']} has "
                                 f"{name} = {r[name]!r}, not a number") from None
            if not math.isfinite(value):  # a NaN RMSE made every mean and ratio of its column NaN, and won
                raise ValueError(f"{path}: the row of {r['dataset']}, split {r['split']}, {r['method']} has "
                                 f"{name} = {r[name]!r}, not a finite number")
    return rows


def report(args: argparse.Namespace) -> str:
    """``alacarte bench report``: a markdown table of results beside the paper's Table 1.

    Args:
        args: the options of ``alacarte bench report``: ``csv`` (a list of results files),
            ``paper`` (the paper's table as CSV), ``out`` (a file to write the table to, or
            ``None``) and ``command`` (the run command quoted at the top, or ``None``).

    Returns:
        The markdown text (also written to ``args.out`` if given).

    Raises:
        ValueError: if a file is missing or not a results file, holds no results, a number
            the report reads is not one, or a cell appears twice.
    """
    every_row = [(path, r) for path in args.csv for r in _results(path)]
    if not every_row:
        raise ValueError(f"{', '.join(args.csv)} hold(s) no results yet: run `alacarte bench run` first")
    rows = [r for _, r in every_row if r.get("status", "ok") == "ok"]
    timed_out = [r for _, r in every_row if r.get("status") == "timeout"]
    paper = load_paper(args.paper)
    column_of = _column_of(rows, timed_out)
    seen = {}
    for path, r in every_row:  # one cell counted twice would weigh twice in its mean
        if r.get("status", "ok") == "ok":
            cell = (r["dataset"], int(r["split"]), column_of(r))
            if cell in seen:
                raise ValueError(f"{r['dataset']} split {r['split']} {cell[2]} appears twice ({seen[cell]} and {path}): "
                                 "give each results file once, and remove the repeated row")
            seen[cell] = path
    rmse, seconds, memory, gpu_memory = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    nlpd, coverage95 = defaultdict(list), defaultdict(list)  # where recorded (coverage: rows since the column)
    ran_as_fastfood = set()  # (dataset, column) keys of exact GPs fitted as Fastfood expansions (n ≥ 2000)
    converged = defaultdict(list)  # rows from before the column existed have it blank: not counted
    at_floor = defaultdict(list)  # likewise
    for r in rows:
        key = (r["dataset"], column_of(r))
        rmse[key].append(float(r["rmse"]))
        if r.get("nlpd"):
            nlpd[key].append(float(r["nlpd"]))
        if r.get("coverage95"):
            coverage95[key].append(float(r["coverage95"]))
        seconds[key].append(float(r["train_seconds"]))
        memory[key].append(float(r["peak_rss_mb"]))
        if r.get("peak_device_mb"):
            gpu_memory[key].append(float(r["peak_device_mb"]))
        if r["method"].startswith("exact") and (r.get("model") or r["method"]).startswith("fastfood"):
            ran_as_fastfood.add(key)
        if r.get("converged"):
            converged[key].append(r["converged"] == "True")
        if (ended := ended_at_noise_floor(r)) is not None:
            at_floor[key].append(ended)
    datasets = list(dict.fromkeys(r["dataset"] for r in rows + timed_out))
    ran = {column for _, column in rmse}
    # settings none of whose cells finished in time still get their column (of timeouts)
    methods = sorted(ran | {column_of(r) for r in timed_out if not any(_timed_out_in(r, c, column_of) for c in ran)},
                     key=Column.order)
    paper_methods = [m for m in METHODS if m in PAPER_COLUMNS and any(c.method == m for c in methods)]
    sizes = sorted({_features(r) for r in rows} - {0})
    lines = [f"Command: `{args.command}`" if args.command else "", "",
             "Test RMSE, mean ± std over splits (number of splits in brackets when fewer than 10), and under it "
             "the mean test NLPD (nats per point, the targets' units) and the share of test targets inside the "
             "central 95% predictive interval where every split recorded them, the mean training seconds · peak "
             "resident MB of one cell's process (and, where recorded, how many "
             "fits converged before max_iter, and how many ended with the noise variance at its lower bound, "
             "σ² ≤ 2 × floor). **Bold**: the best mean of the "
             "row, ours or the paper's (À la carte Table 1). `exact-*` run as Fastfood expansions at n ≥ 2000 "
             "(marked ff), as in the paper."
             + (" Columns marked cuda ran on a GPU: GPU seconds, and the peak GPU memory allocated after the "
                "process's resident MB." if any(m.gpu for m in methods) else "")
             + (f" Feature methods use D = {' and '.join(map(str, sizes))} features"
                + (" (in the column's name where a method ran at several)." if len(sizes) > 1 else ".")
                if sizes else ""), ""]
    versions = defaultdict(int)
    for r in rows:
        versions[r.get("version") or "unknown"] += 1
    if len(versions) > 1:
        lines += ["Rows by the code that produced them (version column): "
                  + ", ".join(f"{v}: {k}" for v, k in versions.items()) + ".", ""]
    def table_row(*cells) -> str:
        return "| " + " | ".join(cells) + " |"
    lines += [table_row("dataset", "n train", *map(str, methods), *(f"{PAPER_COLUMNS[m]} (paper)" for m in paper_methods)),
              "|" + "---|" * (2 + len(methods) + len(paper_methods))]
    wins, normalised = defaultdict(int), defaultdict(dict)  # normalised[method][dataset]
    for ds in datasets:
        ours = {m: float(np.mean(rmse[(ds, m)])) for m in methods if rmse[(ds, m)]}
        theirs = {m: paper[(ds, PAPER_COLUMNS[m])].mean for m in paper_methods if (ds, PAPER_COLUMNS[m]) in paper}
        best = min([*ours.values(), *theirs.values()], default=None)
        if ours:  # (else every cell of the dataset timed out)
            best_ours = min(ours.values())
            wins[min(ours, key=ours.get)] += 1
            for m, v in ours.items():
                normalised[m][ds] = v / best_ours
        cells = []
        for m in methods:
            v = rmse[(ds, m)]
            # (splits, not rows: a split another runner finished, or one that timed out twice, is not counted)
            timed = len({int(r["split"]) for r in timed_out if r["dataset"] == ds and _timed_out_in(r, m, column_of)
                         and (ds, int(r["split"]), m) not in seen})
            if not v:
                cells.append("timeout" if timed else "—")
                continue
            text = _fmt(np.mean(v), np.std(v)) + _split_count_marker(len(v))
            text = f"**{text}**" if ours[m] == best else text
            marker = " ff" if (ds, m) in ran_as_fastfood else ""
            ended = converged[(ds, m)]
            fits = f" · {sum(ended)}/{len(ended)} converged" if ended else ""
            if any(at_floor[(ds, m)]):
                fits += f" · {sum(at_floor[(ds, m)])}/{len(at_floor[(ds, m)])} at the noise floor"
            if timed:  # (else the splits in brackets would seem never run)
                fits += f" · {timed} timed out"
            on_gpu = f" · {np.mean(gpu_memory[(ds, m)]):.0f} MB GPU" if gpu_memory[(ds, m)] else ""
            calibration = (f"NLPD {np.mean(nlpd[(ds, m)]):.3g} · " if len(nlpd[(ds, m)]) == len(v) else "") + (
                f"95% cover {np.mean(coverage95[(ds, m)]):.2f} · " if len(coverage95[(ds, m)]) == len(v) else "")
            cells.append(f"{text}{marker}<br><sub>{calibration}{np.mean(seconds[(ds, m)]):.0f} s · "
                         f"{np.mean(memory[(ds, m)]):.0f} MB{on_gpu}{fits}</sub>")
        for m in paper_methods:
            p = paper.get((ds, PAPER_COLUMNS[m]))
            cells.append("—" if p is None else (f"**{p.printed}**" if p.mean == best else p.printed))
        n_train = next((r["n_train"] for r in rows if r["dataset"] == ds), "—")
        lines.append(table_row(ds, n_train, *cells))
    # (the label and the empty n-train cell as one piece: "| label | | …", as the committed reports print it)
    # Where the methods ran on different datasets (exact GPs on the small ones only, a timeout), their wins and
    # means are over different rows and do not rank them: say over how many, and add the rows every one ran.
    ran_on = {m: len(normalised[m]) for m in methods}
    uneven = len(set(ran_on.values())) > 1
    lines.append(table_row("**datasets won** (ours" + (", of the datasets each ran" if uneven else "") + ") |",
                           *(f"{wins[m]}" + (f" of {ran_on[m]}" if uneven else "") for m in methods),
                           *("" for _ in paper_methods)))
    lines.append(table_row("**mean normalised RMSE** (ours, 1 = best of ours"
                           + (", over the datasets each ran, in brackets" if uneven else "") + ") |",
                           *(f"{np.mean(list(normalised[m].values())):.3f}" + (f" ({ran_on[m]})" if uneven else "")
                             if normalised[m] else "—" for m in methods),
                           *("" for _ in paper_methods)))
    common = [ds for ds in datasets if all(ds in normalised[m] for m in methods)]
    if uneven and common:
        lines.append(table_row(f"**mean normalised RMSE on the {len(common)} dataset{'s' * (len(common) > 1)} every method ran** |",
                               *(f"{np.mean([normalised[m][ds] for ds in common]):.3f}" for m in methods),
                               *("" for _ in paper_methods)))
    lines += _goals(datasets, methods, rmse, ran_as_fastfood, paper)
    lines += _same_method_ratios(datasets, methods, rmse, ran_as_fastfood, paper)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    return text


def _timed_out_in(row: dict, column: Column, column_of) -> bool:
    """Whether a timeout row belongs to a report column.  Such a row leaves blank what its cell
    never learnt from the data (an exact GP's D, ``auto`` components): those match any column's."""
    own = column_of(row)
    return own._replace(features=own.features if _features(row) else column.features,
                        components=own.components if row.get("components") else column.components) == column


def _goals(datasets, methods, rmse, ran_as_fastfood, paper) -> list[str]:
    """Issue goals: our best À la carte kernel vs the best of the paper's row; exact ARD vs the paper's
    ARD on the small datasets (above n = 2000 our ARD is a Fastfood expansion, as the paper's: shown,
    marked ff, and counted apart)."""
    lines = ["", "Our best À la carte kernel (FSARD, FSGBARD, GM, PWL) against the best value in the paper's row, "
             "and our ARD against the paper's ARD (ratios of mean RMSE; ≤ 1 is as good or better). The paper "
             "prints each mean to a few decimals, so its 0.47 stands for a mean in [0.465, 0.475): the fifth "
             "column compares ours rounded to the decimals the paper prints. The sixth gives the difference "
             "of the two means in standard errors of that difference, √(s²/k + s²ₚ/10) with s the standard "
             "deviation over our k splits and sₚ the paper's ± (read as the standard deviation over its 10 "
             "splits): how far a gap stands out from the spread between splits.", "",
             "| dataset | best ours (method) | best paper (method) | ratio | at the paper's decimals "
             "| difference / SE | our ARD / paper ARD |", "|---|---|---|---|---|---|---|"]
    beaten = within = printed = counted = 0
    behind = []  # the difference in standard errors where ours is above the paper's best (inf: no spread known)
    ard_ratios, fastfood_ard = {}, set()
    alacarte = [m for m in methods if m.method in ALACARTE_METHODS]
    for ds in datasets:
        ours = {m: float(np.mean(rmse[(ds, m)])) for m in alacarte if rmse[(ds, m)]}
        theirs = {PAPER_COLUMNS[m]: paper[(ds, PAPER_COLUMNS[m])] for m in PAPER_COLUMNS
                  if (ds, PAPER_COLUMNS[m]) in paper}
        if not ours or not theirs:
            continue
        m_ours, m_paper = min(ours, key=ours.get), min(theirs, key=lambda m: theirs[m].mean)
        verdict = _versus_paper(ours[m_ours], theirs[m_paper])
        beaten += verdict.as_good
        within += verdict.near
        printed += verdict.as_printed
        counted += 1
        ard = min((m for m in methods if m.method == "exact-ard" and rmse[(ds, m)]),
                  key=lambda m: np.mean(rmse[(ds, m)]), default=None)
        if ard is not None and (ds, "ARD") in paper:
            ard_ratios[ds] = float(np.mean(rmse[(ds, ard)])) / paper[(ds, "ARD")].mean
            if (ds, ard) in ran_as_fastfood:
                fastfood_ard.add(ds)
        ard_ratio = (f"{ard_ratios[ds]:.2f}" + (" ff" if ds in fastfood_ard else "")) if ds in ard_ratios else "—"
        digits = theirs[m_paper].decimals
        z = _standard_errors_apart(rmse[(ds, m_ours)], theirs[m_paper])
        if not verdict.as_good:
            behind.append(math.inf if z is None else z)
        lines.append(f"| {ds} | {ours[m_ours]:.3g} ({m_ours}) | {theirs[m_paper].printed.partition(' ')[0]} ({m_paper}) | "
                     f"{verdict.ratio} | {ours[m_ours]:.{digits}f} {'≤' if verdict.as_printed else '>'} "
                     f"{theirs[m_paper].mean:.{digits}f} | {'—' if z is None else f'{z:+.1f}'} | {ard_ratio} |")
    lines += ["", f"Best À la carte kernel ≤ the paper's best on {beaten} of {counted} datasets; "
                  f"within 10% on {within} of {counted}. Rounded to the decimals the paper prints, "
                  f"≤ on {printed} of {counted}."]
    if behind:
        lines[-1] += (f" Where ours is above the paper's best, the difference is under one standard error on "
                      f"{sum(z < 1 for z in behind)} of {len(behind)} and under two on {sum(z < 2 for z in behind)}.")
    for fastfood, kind in ((False, "exact ARD"), (True, "Fastfood ARD (n ≥ 2000, marked ff)")):
        ratios = {ds: ratio for ds, ratio in ard_ratios.items() if (ds in fastfood_ard) == fastfood}
        if not ratios:
            continue
        # Listed to three decimals: 1.104 prints as 1.10 in the table but is not within 10%.
        outside = [f"{ds} {ratio:.3f}" for ds, ratio in ratios.items() if ratio > 1.1]
        lines[-1] += (f" Our {kind} within 10% of the paper's ARD on {len(ratios) - len(outside)} of "
                      f"{len(ratios)}" + (f" (outside: {', '.join(outside)})." if outside else "."))
    paper_datasets = list(dict.fromkeys(ds for ds, _ in paper))
    not_run = [ds for ds in paper_datasets if ds not in datasets]
    if not_run:
        lines.append(f"Not run, so in neither count: {len(not_run)} of the paper's {len(paper_datasets)} "
                     f"datasets ({', '.join(not_run)}).")
    return lines


def _split_count_marker(k: int) -> str:
    """`` [k]`` after a cell averaged over fewer splits than the paper's, else nothing."""
    return f" [{k}]" if k < UCI_NUM_SPLITS else ""


def _standard_errors_apart(ours: list[float], theirs: PaperValue) -> float | None:
    """(our mean − the paper's) / √(s²/k + s²ₚ/10); ``None`` with fewer than two splits of ours or no spread."""
    if len(ours) < 2:
        return None
    error = math.sqrt(np.var(ours, ddof=1) / len(ours) + theirs.std ** 2 / UCI_NUM_SPLITS)
    return (float(np.mean(ours)) - theirs.mean) / error if error > 0 else None


class Verdict(NamedTuple):
    as_good: bool  # ours ≤ theirs
    near: bool  # ours within 10% of theirs
    as_printed: bool  # ours, rounded to the digits the paper prints, ≤ theirs
    ratio: str  # as the table prints it


def _versus_paper(ours: float, theirs: PaperValue) -> Verdict:
    as_printed = float(f"{ours:.{theirs.decimals}f}") <= theirs.mean
    if theirs.mean > 0:
        ratio = ours / theirs.mean
        return Verdict(ratio <= 1, ratio <= 1.1, as_printed, f"{ratio:.2f}")
    # A printed 0.00 is some value below 0.005: no ratio exists; ours matches it only if it
    # too prints as 0.00.
    return Verdict(as_printed, as_printed, as_printed, f"{'≤' if as_printed else '>'} (paper printed 0.00)")


def _same_method_ratios(datasets, columns, rmse, ran_as_fastfood, paper) -> list[str]:
    """Each method against the paper's value for the same method (ours / paper, mean RMSE).  An
    exact GP that ran as a Fastfood expansion (n ≥ 2000) is marked ff and counted apart."""
    methods = [m for m in columns if m.method in PAPER_COLUMNS
               and any(rmse[(ds, m)] and (ds, PAPER_COLUMNS[m.method]) in paper for ds in datasets)]
    if not methods:
        return []
    lines = ["", "Each method against the paper's value for the same method (ratio of mean RMSE; ≤ 1.05 is "
             "within 5% or better; splits run in brackets when fewer than 10):", "",
             "| dataset | " + " | ".join(map(str, methods)) + " |", "|---|" + "---|" * len(methods)]
    within, compared = defaultdict(int), defaultdict(int)  # keyed by (column, ran as Fastfood)
    for ds in datasets:
        cells = []
        for m in methods:
            ours, theirs = rmse[(ds, m)], paper.get((ds, PAPER_COLUMNS[m.method]))
            if not ours or theirs is None:
                cells.append("—")
                continue
            fastfood = (ds, m) in ran_as_fastfood
            mean = float(np.mean(ours))
            if theirs.mean > 0:
                good, text = mean / theirs.mean <= 1.05, f"{mean / theirs.mean:.2f}"
            else:  # printed as 0.00: compared at the paper's precision, as in the goal table
                verdict = _versus_paper(mean, theirs)
                good, text = verdict.as_good, verdict.ratio
            within[(m, fastfood)] += good
            compared[(m, fastfood)] += 1
            cells.append(text + _split_count_marker(len(ours)) + (" ff" if fastfood else ""))
        lines.append(f"| {ds} | " + " | ".join(cells) + " |")

    def count(m) -> str:
        exact, fastfood = (m, False), (m, True)
        parts = [f"{within[exact]} of {compared[exact]}"] if compared[exact] or not compared[fastfood] else []
        parts += [f"ff: {within[fastfood]} of {compared[fastfood]}"] if compared[fastfood] else []
        return ", ".join(parts)
    lines.append("| **within 5%** | " + " | ".join(count(m) for m in methods) + " |")
    return lines


# -- command line -------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` and ``report`` subcommands (shared by ``alacarte bench`` and the experiments script)."""
    sub = parser.add_subparsers(dest="bench_command", required=True)
    r = sub.add_parser("run", help="run (or resume) methods × datasets × splits, one CSV row per cell")
    r.add_argument("--datasets", nargs="+", required=True, help="folder or paper names (see alacarte.datasets.list_uci)")
    r.add_argument("--methods", nargs="+", default=["exact-ard", "fastfood-ard", "fsard", "gm", "pwl"],
                   help=f"any of {', '.join(METHODS)}")
    r.add_argument("--splits", default="0-9")
    r.add_argument("--csv", required=True)
    r.add_argument("--data", default=None, help="UCI data folder (default: $ALACARTE_DATA, else the download cache)")
    r.add_argument("--num-samples", type=int, default=512, help="frequencies M (D = 2M features) for every method")
    r.add_argument("--components", default="auto", help="Q for GM, C for PWL: a number or 'auto' (2 if n < 600 else 4)")
    r.add_argument("--max-iter", type=int, default=100)
    r.add_argument("--restarts", type=int, default=5)
    r.add_argument("--restart-iter", type=int, default=15)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    r.add_argument("--device", default="cpu", help="torch device of every cell: cpu, or cuda[:index] (its rows "
                                                   "get a column of their own in the report)")
    r.add_argument("--noise-floor", type=float, default=DEFAULT_NOISE_FLOOR,
                   help="lower bound on the noise variance σ² in standardised units (default: GPyTorch's)")
    r.add_argument("--validation-fraction", type=float, default=0.0,
                   help="share of the training rows a feature method's fit holds out (alacarte.fit; 0.2 gives "
                        "calibrated predictive intervals, docs/calibration.md; default 0, the paper's protocol); "
                        "exact GPs, the reference, are fitted by the marginal likelihood of all rows")
    r.add_argument("--time-budget", type=float, default=None,
                   help="seconds per cell before it is stopped (counted afresh when a killed cell resumes); "
                        "cells that timed out at a shorter budget run again")
    r.add_argument("--limit", type=int, default=None, help="run at most this many cells (testing)")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar; one line per cell")
    r.set_defaults(bench=run)
    p = sub.add_parser("report", help="markdown table of a results CSV beside the paper's Table 1")
    p.add_argument("--csv", nargs="+", required=True,
                   help="results files; a method found at several D gets a column per D")
    p.add_argument("--paper", default=str(DEFAULT_PAPER_TABLE), help="the paper's table as CSV")
    p.add_argument("--out", default=None)
    p.add_argument("--command", default=None, help="the run command to quote in the report")
    p.set_defaults(bench=lambda args: print(report(args)) or 0)


def main(argv: list[str] | None = None) -> int:
    """``alacarte bench`` with ``argv`` (default: the command line), errors handled as by the CLI."""
    from .cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])
