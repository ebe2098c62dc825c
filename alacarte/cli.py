"""The ``alacarte`` command line.

* ``alacarte demo`` — the main job (:mod:`alacarte.demo`): an FSARD feature GP on all
  8 000 rows of a synthetic problem against an exact ARD GP on the 1 000 it fits in
  the same time, compared on test RMSE, NLPD, interval coverage and time.
* ``alacarte fit DATA.csv --target y --kernel gm --out model.alacarte`` — fit an
  :class:`~alacarte.AlaCarteRegressor` on a CSV file (header row, numeric cells)
  and save it (:mod:`alacarte.io`).
* ``alacarte predict model.alacarte NEW.csv`` — predictive mean and standard
  deviation for every row, as CSV on stdout or ``--out``.
* ``alacarte plot model.alacarte`` — a PNG of the learned spectrum and the input
  relevances (:mod:`alacarte.plotting`).
* ``alacarte bench run|report ...`` — the resumable UCI benchmark and its report
  beside the paper's Table 1 (:mod:`alacarte.bench`).

Every command but ``bench`` (whose CSV is its machine-readable output) takes ``-q``
(no progress bars) and ``--json`` (machine-readable output); ``bench run`` takes
``-q`` too (one line per cell instead of the bar).  Errors — a missing file, a bad CSV, an unreadable model — end with
exit status 2 and one line ``alacarte: error: ...`` on stderr.  A new command is
one ``_add_<name>(commands, common)`` function listed in :data:`COMMANDS`.
"""
from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ._files import refuse_unwritable
from ._validation import check_nonnegative_int, check_positive_int, check_seed
from .factory import (DEFAULT_SAMPLES, EXACT_GP_ROWS, KERNEL_NAMES, SIMPLEX_KERNEL_NAMES, check_draws,
                      check_simplex_name, component_candidates, exact_gp_cost, widenable)
from .holdout import check_fraction
from .kernels import FeatureKernel
from .training import (AUTO_PILOT_ABOVE, AUTO_PILOT_SAMPLES, PILOT_ROWS, PILOT_SAMPLES, fit, resolve_pilot,
                       resolve_samples)

__all__ = ["main", "build_parser", "read_table", "COMMANDS"]

def _demo(args: argparse.Namespace) -> int:
    from .demo import command

    return command(args)


def read_table(path: str | Path, columns: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """Column names and an (n, k) float64 array from a CSV file with a header row.

    Every cell must be a finite number; the first offending cell is named in
    the ``ValueError`` (line and column).  With ``columns``, only those are read,
    in that order (the array is (n, len(columns))), and the others may hold anything.

    Args:
        path: the CSV file (UTF-8, an optional byte-order mark, comma-separated).
        columns: the names of the columns to read, in this order (default: every column).

    Returns:
        Every name of the header row (all of them, also with ``columns``), stripped of
        surrounding spaces, and the values read.

    Raises:
        ValueError: if the file is missing, unreadable or empty, lacks one of ``columns``,
            has duplicate or empty names among the columns read, a row with another number of
            fields than the header, or a cell read that is not a finite number.
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), None)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:  # csv.Error: a NUL byte, before Python 3.11
        raise ValueError(f"{path}: cannot be read as a text CSV file ({err})") from None
    if not header or not any(name.strip() for name in header):
        raise ValueError(f"{path} is empty: it needs a header row and at least one data row")
    names = [name.strip() for name in header]
    missing = [c for c in columns or [] if c not in names]
    if missing:
        raise ValueError(f"{path} lacks the input column(s) {', '.join(map(repr, missing))} (the model's: {columns})")
    wanted = names if columns is None else columns
    # Only the columns read need names of their own: pandas' to_csv writes its index under an empty one.
    duplicated = sorted({n for n in wanted if names.count(n) > 1})
    if duplicated or "" in wanted:
        raise ValueError(f"{path}: column names must be unique and non-empty, got {names}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": reported below
            # comments=None: numpy's default '#' would silently drop or cut rows.
            values = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64, quotechar='"',
                                encoding="utf-8-sig", comments=None,
                                usecols=None if columns is None else [names.index(c) for c in wanted])
    except ValueError:
        values = None  # locate the offending cell for the message below
    if values is not None and values.size == 0:
        raise ValueError(f"{path} has a header but no data rows")
    parsed = values is not None and values.shape[1:] == (len(wanted),) and bool(np.isfinite(values).all())
    # usecols reads rows with fields missing or extra (beyond the columns used) without a word
    if not parsed or columns is not None:
        _check_rows(path, names, wanted)
    if not parsed:
        raise ValueError(f"{path} cannot be parsed as a numeric CSV file")
    return names, values


def _check_rows(path: Path, names: list[str], wanted: list[str]) -> None:
    """Raise on the first row with another number of fields than the header, or bad cell of ``wanted``;
    return if there is none (also the check of every row when numpy read only ``wanted``)."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        rows = csv.reader(fh)
        try:
            next(rows)
            _check_cells(path, names, wanted, rows)
        except csv.Error as err:  # a NUL byte, before Python 3.11
            raise ValueError(f"{path} line {rows.line_num}: {err}") from None


def _check_cells(path: Path, names: list[str], wanted: list[str], rows) -> None:
    """:func:`_check_rows` on the rows of a CSV reader past its header."""
    for row in rows:
        line = rows.line_num
        if not row:  # an empty line, which the reader skips too
            continue
        if len(row) != len(names):
            raise ValueError(f"{path} line {line}: {len(row)} fields, but the header has {len(names)}")
        for name, cell in zip(names, row):
            if name not in wanted:
                continue
            text = cell.strip()
            where = f"{path} line {line}, column {name!r}"
            if not text:
                raise ValueError(f"{where}: empty cell (missing values are not supported)")
            try:
                if "_" in text:  # float() takes "1_000"; the reader does not
                    raise ValueError
                number = float(text)
            except ValueError:
                raise ValueError(f"{where}: {text!r} is not a number") from None
            if not math.isfinite(number):
                if math.isinf(number) and "inf" not in text.lower():  # 1e400: a finite number, but not in float64
                    raise ValueError(f"{where}: {text} is beyond the range of float64 (|x| ≤ 1.8e308)")
                raise ValueError(f"{where}: {text} is not allowed (every value must be finite)")


def pilot_rows(text: str) -> int | str | None:
    """``--pilot-rows``' value: ``auto``, ``all`` (every row: the estimator's ``None``) or an integer."""
    return None if text == "all" else count_or_auto(text)


def count_or_auto(text: str) -> int | str:
    """``--num-draws``' and ``--num-components``' value: ``auto`` or an integer (checked before the data are read)."""
    return text if text == "auto" else int(text)


def fraction(text: str) -> float | str:
    """``--validation-fraction``'s value: ``auto`` or a number (checked by the fit)."""
    return text if text == "auto" else float(text)


def _rms(r: np.ndarray) -> float:
    """√mean(r²) of residuals divided by their largest magnitude: squares of targets in units of 1e300
    overflowed (a training RMSE of inf, and 'Infinity' in the JSON), of 1e-300 underflowed to 0."""
    peak = float(np.abs(r).max())
    return peak * float(np.sqrt(np.mean((r / peak) ** 2))) if peak > 0 else 0.0


def _refuse_overwriting_inputs(out: str | Path, *inputs: str) -> None:
    """A ValueError if ``out`` names one of the command's input files, which writing it would replace."""
    for given in inputs:
        if Path(out).exists() and Path(given).exists() and Path(out).samefile(given):
            raise ValueError(f"the output {out} is the input file {given}: writing it would replace it")


def _output_path(path: str | Path) -> Path:
    """``path`` as a Path the command can write, checked before the work whose result it holds."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"the output {path} is a directory; give a file path")
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: the directory {path.parent} does not exist")
    refuse_unwritable(path)
    return path


def _emit(args: argparse.Namespace, result: dict, text: str) -> None:
    print(json.dumps(result) if args.json else text)


def _fit(args: argparse.Namespace) -> int:
    from .io import check_model_path, save_model
    from .regressor import AlaCarteRegressor

    # Named as the flags, and before the data are read (the estimator would name its parameters: num_samples).
    check_positive_int(args.max_iter, "--max-iter")
    samples = resolve_samples(args.num_samples, None, "--num-samples")
    check_draws(args.num_draws, "--num-draws")
    component_candidates(args.num_components, args.kernel, samples, name="--num-components")
    if check_nonnegative_int(args.restarts, "--restarts"):
        check_positive_int(args.restart_iter, "--restart-iter")
    check_seed(args.seed, "--seed")
    check_fraction(args.validation_fraction)
    check_simplex_name(args.kernel, args.select, "--select")
    resolve_pilot(args.pilot_rows, args.kernel, 0, args.select, name="--pilot-rows")
    names, table = read_table(args.data)
    if args.target not in names:
        raise ValueError(f"{args.data} has no target column {args.target!r} (columns: {', '.join(names)})")
    columns = [n for n in names if n != args.target]
    if not columns:
        raise ValueError(f"{args.data} has no input columns besides the target {args.target!r}")
    x, y = table[:, [names.index(c) for c in columns]], table[:, names.index(args.target)]
    out = check_model_path(args.out if args.out else Path(args.data).with_suffix(".alacarte"))  # before the fit
    _refuse_overwriting_inputs(out, args.data)
    if args.kernel.startswith("exact") and len(y) > EXACT_GP_ROWS:
        print(f"alacarte: note: {exact_gp_cost(len(y))}", file=sys.stderr)
    reg = AlaCarteRegressor(
        args.kernel, num_samples=args.num_samples, num_components=args.num_components, num_draws=args.num_draws,
        max_iter=args.max_iter, restarts=args.restarts, restart_iter=args.restart_iter, random_state=args.seed,
        progress=not args.quiet, validation_fraction=args.validation_fraction, replicates=args.replicates,
        select=args.select, pilot_rows=args.pilot_rows,
    )
    start = time.perf_counter()
    reg.fit(x, y)
    seconds = time.perf_counter() - start
    save_model(reg, out, metadata={"columns": columns, "target": args.target, "data": str(args.data),
                                   "rows": int(len(y))})
    rmse = _rms(reg.predict(x) - y)
    try:
        relevance = dict(zip(columns, reg.relevance_.tolist()))
    except ValueError:  # a kernel without a notion of relevance
        relevance = None
    result = {"model": str(out), "kernel": args.kernel, "rows": int(len(y)), "inputs": columns,
              "target": args.target, "log_marginal_likelihood": reg.log_marginal_likelihood_,
              "train_rmse": rmse, "iterations": reg.n_iter_, "seconds": seconds, "relevance": relevance,
              "pilot_rows": reg.pilot_rows_}
    pilot = "" if reg.pilot_rows_ is None else f" (hyperparameters from a pilot of {reg.pilot_rows_} rows)"
    text = (f"fitted {args.kernel} on {len(y)} rows × {len(columns)} inputs{pilot} in {seconds:.1f} s: "
            f"log marginal likelihood {reg.log_marginal_likelihood_:.6g}, training RMSE {rmse:.4g}\nsaved {out}")
    if args.select:
        result["selected"] = [columns[j] for j in reg.selected_]
        result["selection_frequency"] = dict(zip(columns, reg.selection_frequency_.tolist()))
        draws = len(reg.models_)
        kept = f"kept by at least 4 in 5 of {draws} feature draws" if draws > 1 else "kept by the fit"
        text += (f"\nselected {len(reg.selected_)} of {len(columns)} inputs ({kept}): "
                 f"{', '.join(result['selected']) or 'none'}")
    _emit(args, result, text)
    return 0


def _load_regressor(path: str):
    from .io import load_with_metadata
    from .regressor import AlaCarteRegressor

    try:
        reg, metadata = load_with_metadata(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    if not isinstance(reg, AlaCarteRegressor) or not hasattr(reg, "model_") or not isinstance(metadata, dict) \
            or "columns" not in metadata:
        raise ValueError(f"{path} is not a model written by `alacarte fit` (from Python, save a fitted "
                         "AlaCarteRegressor with save_model(regressor, path, metadata={'columns': [its input names], "
                         "'target': name}))")
    columns = metadata["columns"]
    if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)
            and len(columns) == reg.n_features_in_):
        raise ValueError(f"{path}: its metadata 'columns' must be a list of the model's {reg.n_features_in_} "
                         f"input names, got {columns!r}")
    return reg, metadata


def _predict(args: argparse.Namespace) -> int:
    reg, metadata = _load_regressor(args.model)
    _, x = read_table(args.data, metadata["columns"])
    if args.out:  # before the predictions are computed
        _refuse_overwriting_inputs(_output_path(args.out), args.model, args.data)
    means, stds = [], []
    block = reg.model_.chunk_rows()  # one chunk of the model's prediction per progress-bar step
    for start in tqdm(range(0, len(x), block), disable=args.quiet, desc="predict", leave=False):
        mean, std = reg.predict(x[start:start + block], return_std=True, include_noise=not args.latent)
        means.append(mean)
        stds.append(std)
    mean, std = np.concatenate(means), np.concatenate(stds)
    if args.json:
        text = json.dumps({"mean": mean.tolist(), "std": std.tolist(), "std_of": "f" if args.latent else "y"}) + "\n"
    else:  # 17 significant digits: the CSV holds the float64 values exactly
        text = "mean,std\n" + "".join(f"{m:.17g},{s:.17g}\n" for m, s in zip(mean, std))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from .plotting import save_kernel_figure

    reg, metadata = _load_regressor(args.model)
    kernel = reg.model_.covar_module
    if not isinstance(kernel, FeatureKernel):
        raise ValueError(f"{args.model} is an exact GP ({reg.kernel}): it has no learned spectrum to draw "
                         "(`alacarte fit --json` reports its input relevances)")
    out = _output_path(args.out if args.out else Path(args.model).with_suffix(".png"))  # before drawing
    _refuse_overwriting_inputs(out, args.model)
    title = f"{reg.kernel if isinstance(reg.kernel, str) else type(kernel).__name__}: {metadata.get('target', 'y')}"
    # The kernel sees standardised inputs: frequencies are drawn per unit of the CSV's columns.
    try:
        draws = reg.relevance_draws_ if len(reg.models_) > 1 else None  # the spread of --num-draws' fits
        save_kernel_figure(kernel, out, title=title, names=metadata["columns"], input_scale=reg.model_.input_scale,
                           draws=draws)
    except ValueError as err:  # which model and kernel the message is about ("no spectrum picture for ...")
        raise ValueError(f"{args.model} ({reg.kernel}): {err}") from None
    _emit(args, {"figure": str(out)}, f"saved {out}")
    return 0


def _add_demo(commands, common) -> None:
    from .demo import add_arguments

    demo = commands.add_parser("demo", parents=[common], help="the main job: a feature GP on all the rows against an "
                               "exact GP on the rows it fits in the same time (about 30 s)")
    add_arguments(demo)
    demo.set_defaults(run=_demo)


def _defaults(function: Callable) -> dict:
    """The defaults of ``function`` (or a class's constructor), which a command runs: stated once, there."""
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def _add_fit(commands, common) -> None:
    cmd = commands.add_parser("fit", parents=[common], help="fit a GP to a CSV file and save it",
                              description="Fit an AlaCarteRegressor to DATA.csv (a header row, numeric cells) "
                                          "and save it as one model file.")
    cmd.add_argument("data", help="CSV file with a header row")
    cmd.add_argument("--target", required=True, help="name of the column to predict; all others are inputs")
    from .regressor import AlaCarteRegressor

    default = _defaults(AlaCarteRegressor)
    cmd.add_argument("--kernel", default=default["kernel"], choices=KERNEL_NAMES,
                     help=f"kernel (default {default['kernel']})")
    cmd.add_argument("--out", help="model file to write (default: DATA with suffix .alacarte)")
    cmd.add_argument("--num-samples", type=count_or_auto, default=default["num_samples"],
                     help=f"frequencies M (D = 2M features), or auto: {DEFAULT_SAMPLES}, and {AUTO_PILOT_SAMPLES} "
                          f"where a pilot fits the hyperparameters (default {default['num_samples']})")
    cmd.add_argument("--num-components", type=count_or_auto, default=default["num_components"],
                     help="mixture components of gm/pwl, or auto: fit with 1 and with 4 and keep the one whose "
                          f"held-out rows score lower, at twice the cost (default {default['num_components']})")
    cmd.add_argument("--num-draws", type=count_or_auto, default=default["num_draws"],
                     help="independent fits, each with its own feature draw, whose predictive distributions are "
                          f"averaged: truer bands where one draw's features fall short, at that many times the cost "
                          f"(default {default['num_draws']}: 5 for a feature kernel with at most twice as many rows "
                          "as features, else 1)")
    cmd.add_argument("--max-iter", type=int, default=default["max_iter"],
                     help=f"L-BFGS iterations of the final optimisation (default {default['max_iter']}; as many "
                          "again for a refit when the noise ends at the lower bound)")
    cmd.add_argument("--restarts", type=int, default=default["restarts"],
                     help=f"random initialisations tried first (default {default['restarts']})")
    cmd.add_argument("--restart-iter", type=int, default=default["restart_iter"],
                     help=f"iterations per restart (default {default['restart_iter']})")
    cmd.add_argument("--seed", type=int, default=default["random_state"],
                     help=f"seed of the features and restarts (default {default['random_state']})")
    cmd.add_argument("--validation-fraction", type=fraction, default=default["validation_fraction"],
                     help="share of the rows held out to stop the fit before it over-fits and to calibrate the "
                          f"predictive intervals (default {default['validation_fraction']}: 0.2 for feature "
                          "kernels, 0 for exact GPs; 0: the marginal likelihood of all rows, as in the paper)")
    cmd.add_argument("--no-replicates", dest="replicates", action="store_false",
                     help="predict at repeated training inputs with the fitted model alone, without a term per "
                          "distinct input (default: with it, where inputs repeat)")
    cmd.add_argument("--select", action="store_true",
                     help="variable selection: the kernel's inverse lengthscales on the simplex, and the inputs the "
                          "marginal likelihood does not need held at exactly 0 after each draw's fit; reports the "
                          f"inputs kept by at least 4 in 5 draws (kernels: {', '.join(SIMPLEX_KERNEL_NAMES)}; "
                          "docs/variable_selection.md)")
    cmd.add_argument("--pilot-rows", type=pilot_rows, default=default["pilot_rows"],
                     help="fit the hyperparameters on this many rows with D = 1024 features, then condition the "
                          "model (--num-samples) on every row: for large data, with more features "
                          f"({', '.join(k for k in KERNEL_NAMES if widenable(k))}); all: every row; auto (default): "
                          f"{PILOT_ROWS} rows above {AUTO_PILOT_ABOVE} where --num-samples is auto or above {PILOT_SAMPLES}, the kernel "
                          "allows it and --select is off")
    cmd.set_defaults(run=_fit)


def _add_predict(commands, common) -> None:
    cmd = commands.add_parser("predict", parents=[common], help="predict with a saved model",
                              description="Predictive mean and standard deviation for every row of NEW.csv "
                                          "(which needs the model's input columns, in any order).")
    cmd.add_argument("model", help="model file written by `alacarte fit`")
    cmd.add_argument("data", help="CSV file with the model's input columns")
    cmd.add_argument("--out", help="write the predictions here instead of stdout")
    cmd.add_argument("--latent", action="store_true",
                     help="std of the latent function f instead of a new observation y (= f + noise)")
    cmd.set_defaults(run=_predict)


def _add_plot(commands, common) -> None:
    cmd = commands.add_parser("plot", parents=[common], help="draw a saved model's spectrum and relevances")
    cmd.add_argument("model", help="model file written by `alacarte fit`")
    cmd.add_argument("--out", help="PNG file to write (default: MODEL with suffix .png)")
    cmd.set_defaults(run=_plot)


def _add_bench(commands, common) -> None:
    from . import bench

    cmd = commands.add_parser("bench", help="UCI benchmark: resumable runs and a report beside the paper's Table 1",
                              description="Methods × UCI datasets × splits, one CSV row per cell; re-running "
                                          "resumes. 'report' writes the markdown table.")
    sub = cmd.add_subparsers(dest="bench_command", required=True)
    _add_bench_run(sub, bench)
    report = sub.add_parser("report", help="markdown table of a results CSV beside the paper's Table 1")
    report.add_argument("--csv", nargs="+", required=True,
                        help="results files; a method found at several D gets a column per D")
    report.add_argument("--paper", default=None,
                        help="the paper's table as CSV (default: the one shipped with alacarte)")
    report.add_argument("--out", default=None)
    report.add_argument("--command", default=None, help="the run command to quote in the report")
    report.set_defaults(bench=lambda args: print(bench.report(args)) or 0)
    cmd.set_defaults(run=lambda args: args.bench(args))


def _add_bench_run(sub, bench) -> None:
    r = sub.add_parser("run", help="run (or resume) methods × datasets × splits, one CSV row per cell")
    r.add_argument("--datasets", nargs="+", required=True, help="folder or paper names (see alacarte.datasets.list_uci)")
    r.add_argument("--methods", nargs="+", default=["exact-ard", "fastfood-ard", "fsard", "gm", "pwl"],
                   help=f"any of {', '.join(bench.METHODS)}")
    r.add_argument("--splits", default="0-9")
    r.add_argument("--csv", required=True)
    r.add_argument("--data", default=None, help="UCI data folder (default: $ALACARTE_DATA, else the download cache)")
    r.add_argument("--num-samples", type=int, default=512, help="frequencies M (D = 2M features) for every method")
    r.add_argument("--components", default="auto", help="Q for GM, C for PWL: a number or 'auto' (2 if n < 600 else 4)")
    default = _defaults(fit)  # each cell runs alacarte.fit
    r.add_argument("--max-iter", type=int, default=default["max_iter"],
                   help=f"iterations of each final optimisation (default: alacarte.fit's, {default['max_iter']})")
    r.add_argument("--restarts", type=int, default=default["restarts"],
                   help=f"random initialisations tried first (default: alacarte.fit's, {default['restarts']})")
    r.add_argument("--restart-iter", type=int, default=default["restart_iter"],
                   help=f"iterations per restart (default: alacarte.fit's, {default['restart_iter']})")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    r.add_argument("--device", default="cpu", help="torch device of every cell: cpu, or cuda[:index] (its rows "
                                                   "get a column of their own in the report)")
    r.add_argument("--noise-floor", type=float, default=bench.DEFAULT_NOISE_FLOOR,
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
    r.set_defaults(bench=bench.run)


#: The subcommands, in the order ``alacarte --help`` lists them.  Each adds its parser to
#: ``(commands, common)`` (the subparsers and the shared ``-q``/``--json`` options) and sets ``run``
#: to the function that carries the command out.
COMMANDS: list[Callable] = [_add_demo, _add_fit, _add_predict, _add_plot, _add_bench]


def build_parser() -> argparse.ArgumentParser:
    """The ``alacarte`` argument parser, one subcommand per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="alacarte", description="À la carte Gaussian-process kernels.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    common.add_argument("--json", action="store_true", help="print the results as JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``alacarte`` command line.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The command's exit status (0 on success; ``bench run`` returns 1 if a cell failed),
        or 2 after a ``ValueError``, ``OSError``, ``ImportError`` or an allocation that failed
        (out of memory), printed as one line ``alacarte: error: ...`` on stderr.  A usage error
        exits (``SystemExit(2)``) as argparse does.  ``fit`` with an exact GP on more than
        :data:`~alacarte.factory.EXACT_GP_ROWS` rows says what it will cost before it starts.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError, ImportError, MemoryError, RuntimeError) as err:
        # (ImportError: an optional extra, matplotlib, missing.)  torch reports an allocation that failed as a
        # RuntimeError; any other RuntimeError is a bug, whose traceback is wanted.
        if isinstance(err, RuntimeError) and not _out_of_memory(err):
            raise
        message = " ".join(str(err).split())  # one line, whatever the exception text holds
        if isinstance(err, MemoryError) or _out_of_memory(err):
            message = f"out of memory ({message or type(err).__name__}): use fewer rows or features, or a feature kernel"
        print(f"alacarte: error: {message}", file=sys.stderr)
        return 2


def _out_of_memory(err: BaseException) -> bool:
    """Whether torch failed to allocate (CPU: "can't allocate memory"; CUDA: "out of memory")."""
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


if __name__ == "__main__":
    sys.exit(main())
