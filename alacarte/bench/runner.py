"""Running a benchmark: one process per cell, a time budget each, and a row appended as each finishes.

A cell's fit keeps a checkpoint (``fit(checkpoint=)``) in ``<csv stem>.checkpoints/`` beside the results
file, so that a cell killed mid-fit goes on from it on the next run and writes the row the uninterrupted
cell would have written; the file is deleted once the cell's row is written.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import queue
import re
import resource
import signal
import sys
import threading
import time
from pathlib import Path

from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from .. import _checkpoint
from ..datasets.uci import canonical_name, check_files, load_uci
from ..factory import make_model
from ..training import fit
from .scores import predictive_scores
from .settings import (
    DEFAULT_NOISE_FLOOR,
    METHODS,
    cell_settings,
    cell_validation_fraction,
    check_device,
    check_settings,
    mixture_components,
    model_name,
    parse_splits,
)
from .store import append_row, finished_rows, row_settings, upgrade_csv

__all__ = ["run", "cell_checkpoint", "machine_description", "peak_rss_mb"]


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

    torch.set_num_threads(cfg["threads"])
    # scipy's BLAS (syrk/symm of the Gram matrix) has a thread pool of its own.
    threadpool_limits(cfg["threads"])
    torch.set_default_dtype(torch.float64)
    device = torch.device(cfg["device"])
    data = load_uci(dataset, split, cfg["data"])
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
    history = fit(model, data.x_train, data.y_train, max_iter=cfg["max_iter"], restarts=cfg["restarts"],
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
    to ~1e-5–1e-2 elsewhere (the same code gave concreteslump FSGBARD split 0 a test RMSE of 3.0330 in one
    run and 3.0116 in another; fertility FSARD 0.145166 and 0.145167), so the rows say where they were
    computed."""
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

# The settings a cell's fit depends on; threads and the data folder are not among them
# (the fit's own key holds the data's fingerprint).
_FIT_SETTINGS = ("num_samples", "components", "max_iter", "restarts", "restart_iter", "device", "noise_floor",
                 "validation_fraction", "version")


def cell_checkpoint(cfg: dict, dataset: str, split: int, method: str) -> Path:
    """The checkpoint file of one cell.  Its name holds a hash of the run's settings and package
    version: a run at other settings, or of other code, fits its cells from the start rather than
    being refused another run's checkpoint.  The checkpoint format is part of it: an installed copy's
    version is the release alone, which a change of format need not change."""
    # (the format read when called: a test stands in another)
    settings = json.dumps({**{name: cfg[name] for name in _FIT_SETTINGS},
                           "checkpoint_format": _checkpoint.FORMAT_VERSION}, sort_keys=True)
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


def _row(dataset, split, method, cfg, **values) -> dict:
    row = {"dataset": dataset, "split": split, "method": method, "restarts": cfg["restarts"],
           "restart_iter": cfg["restart_iter"], "max_iter": cfg["max_iter"], "seed": split,
           "version": cfg["version"], "device": cfg["device"], "noise_floor": cfg["noise_floor"]}
    row.update(values)
    return row


def _other_setting(row: dict, args: argparse.Namespace) -> str | None:
    """The first setting a results row ran with that this run does not ask for (``None``: none)."""
    max_iter, restarts, restart_iter, floor, gpu, features, components, held_out = row_settings(row)
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


def run(args: argparse.Namespace) -> int:
    """``alacarte bench run``: fit every pending (dataset, split, method) cell, one process each.

    Cells already in ``args.csv`` at the same settings are skipped; the others run
    ``args.workers`` at a time and append their rows as they finish.

    Args:
        args: the options of ``alacarte bench run`` (``datasets``, ``methods``, ``splits``,
            ``csv``, ``data``, ``num_samples``, ``components``, ``max_iter``, ``restarts``,
            ``restart_iter``, ``workers``, ``threads``, ``device``, ``noise_floor``,
            ``time_budget``, ``limit``, ``quiet``), as ``alacarte bench run`` parses them.

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
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {METHODS}")
    datasets = list(dict.fromkeys(canonical_name(ds) for ds in args.datasets))  # each cell once
    check_settings(args)
    check_device(args.device)
    if args.data is not None and not os.path.isdir(args.data):
        raise ValueError(f"--data {args.data}: no such folder")
    folder = os.path.dirname(os.path.abspath(args.csv))
    if not os.path.isdir(folder):
        raise ValueError(f"--csv {args.csv}: its folder {folder} does not exist")
    upgrade_csv(args.csv)
    done, other, retried = set(), [], set()
    for r in finished_rows(args.csv):
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
                    # split (a timeout row without them would match a run at any D or components,
                    # which would then skip the cell as done and never run it).
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
