"""Predictive calibration on the UCI splits: RMSE, NLPD, interval coverage and sharpness, per kernel.

    python experiments/calibration.py run --csv experiments/results/calibration.csv \
        --datasets breastcancer pendulum --methods exact-ard fsard gm --splits 0-2
    python experiments/calibration.py report experiments/results/calibration.csv \
        [--paper-protocol experiments/results/uci_full.csv] > experiments/results/calibration.md
    python experiments/calibration.py compare BEFORE.csv [...] --after AFTER.csv

``run`` fits each (dataset, split, method) with ``alacarte.fit``'s defaults (restarts, max_iter)
and 20% of the training rows held out (``--validation-fraction``; 0 is the À la carte paper's
protocol: the marginal likelihood of all rows alone) and appends one fsync'ed row per cell, so a
killed run resumes.  ``--num-draws`` (default ``auto``, the estimator's) fits that many draws, each
with its own seed split + 1000·k as ``AlaCarteRegressor`` does, and scores their equal mixture's
moment-matched Gaussian, which is what the estimator predicts.  GM and PWL get ``--num-components`` components: by default make_model's (the
estimator's and the command line's), ``auto`` the benchmark runner's rule (2 below 600 training rows).
``report`` averages over splits and compares each kernel at D = 2·``--num-samples`` (default 1024) with exact ARD
on the splits both have; where
several CSVs hold the same cell, the last one given wins (and any CSV over ``--feature-draws``).  It reports the rows fitted with
``--num-draws`` draws (default ``auto``: those the estimator's default would fit; rows without the
column are one draw's); ``--feature-draws`` adds ``feature_draws.py``'s JSON lines, the same fits.  ``--paper-protocol`` adds the NLPD and RMSE that the UCI
runner recorded for the same cells under the paper's protocol (its rows with D = 2·num_samples).
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
import warnings
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.bench.settings import mixture_components, model_name, package_version, parse_splits  # noqa: E402
from alacarte.factory import component_candidates, draws_for_features, make_model, widenable  # noqa: E402
from alacarte.holdout import RECOMMENDED_FRACTION, held_out_count  # noqa: E402
from alacarte.regressor import choose_components, mixture_moments  # noqa: E402
from alacarte.training import resolve_pilot, resolve_samples  # noqa: E402
from alacarte.replicates import Replicates  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from _draws import draws_setting, row_draws  # noqa: E402
from alacarte.cli import count_or_auto, pilot_rows  # noqa: E402

SHIPPED_COMPONENTS = inspect.signature(make_model).parameters["num_components"].default
FIELDS = ["dataset", "split", "method", "validation_fraction", "num_features", "n_train", "rmse", "nlpd",
          "coverage50", "coverage95", "std_over_rmse", "noise", "held_out_rows", "iterations", "seconds", "version",
          "num_draws", "num_components"]


def cell_model(method: str, data, seed: int, num_samples: int = 512, num_components: str | int = SHIPPED_COMPONENTS):
    """The model a cell fits: exact GPs as their Fastfood expansion above n = 2 000; GM and PWL with
    ``num_components`` components (a number, or ``"runner"``: the UCI runner's rule, ``mixture_components``)."""
    n, d = data.x_train.shape
    q = mixture_components("auto" if num_components == "runner" else num_components, n)
    return make_model(model_name(method, n), d, num_samples=num_samples, num_components=q, seed=seed)


def cell_components(method: str, n: int, setting: str | int, num_samples: int, fraction: float) -> tuple:
    """The numbers of components a cell fits (and keeps the held-out score's choice of): ``setting``'s, where
    ``"auto"`` is the estimator's rule (``alacarte.factory.component_candidates``)."""
    if setting != "auto":
        return (setting,)
    return component_candidates("auto", method, num_samples, held_out_count(n, fraction))


def fit_draws(data, split: int, draws: int, build, replicates: bool = True, pilot: int | None = None,
              **settings) -> tuple[dict, list, list]:
    """Fit ``draws`` models ``build(seed)`` on the training rows with ``alacarte.fit`` (``settings`` passed on;
    ``alacarte.fit_pilot`` on ``pilot`` rows where that is not ``None``)
    and the seeds ``AlaCarteRegressor(random_state=split)`` gives its draws; returns the test scores of
    their equal mixture's moment-matched Gaussian, which is what the estimator predicts (test rows at a
    repeated training input by the model with replicates, unless ``replicates`` is off), the fitted models
    and their histories."""
    reps = Replicates.of(data.x_train, data.y_train) if replicates else None
    means, variances, models, histories = [], [], [], []
    for k in range(draws):
        seed = split + 1000 * k
        model = build(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitting = ac.fit if pilot is None else partial(ac.fit_pilot, rows=pilot)
            histories.append(fitting(model, data.x_train, data.y_train, seed=seed, progress=False, **settings))
        pred = model.predict(data.x_test)
        if reps is not None:
            share = reps.choose_share(data.x_train, data.y_train, model.predict(reps.inputs[reps.repeated]))
            pred = reps.predictive(data.x_test, pred, share)
        means.append(pred.mean)
        variances.append(pred.observed_variance)
        models.append(model)
    mean, variance = mixture_moments(torch.stack(means), torch.stack(variances))
    return predictive_scores(mean, variance, torch.as_tensor(data.y_test)), models, histories


def cell_size(method: str, n: int, num_samples, pilot_rows) -> tuple[int, int | None]:
    """A cell's frequencies M and pilot rows (``None``: every row) as the estimator resolves
    ``num_samples`` and ``pilot_rows`` (``"auto"``: a pilot, at D = 4 096, above 20 000 rows for GM and PWL);
    exact ARD, the reference, and the kernels that learn a value per frequency fit every row."""
    pilot = resolve_pilot(pilot_rows, method, n, num_samples=num_samples) if widenable(method) else None
    return resolve_samples(num_samples, pilot), pilot


def run_cell(data, dataset: str, split: int, method: str, draws: int, args) -> dict:
    """The row of one cell; with ``--alone-csv`` the same fits' scores without replicates are written there."""
    n = data.x_train.shape[0]
    samples, pilot = cell_size(method, n, args.num_samples, args.pilot_rows)
    start = time.perf_counter()
    fits = {}
    for q in cell_components(method, n, args.num_components, samples, args.validation_fraction):
        fits[q] = fit_draws(data, split, draws, partial(cell_model, method, data, num_samples=samples,
                                                        num_components=q), replicates=args.replicates,
                             pilot=pilot, validation_fraction=args.validation_fraction)
    chosen, _ = choose_components({q: fit[2] for q, fit in fits.items()})
    scores, models, histories = fits[chosen]
    seconds = time.perf_counter() - start
    row = {"dataset": dataset, "split": split, "method": method,
           "validation_fraction": args.validation_fraction,
           "num_features": 0 if method.startswith("exact") else 2 * samples, "n_train": n, **scores,
           "noise": float(models[0].likelihood.noise.detach().min()), "held_out_rows": histories[0].held_out_rows,
           "iterations": histories[0].iterations, "seconds": round(seconds, 2), "version": package_version(),
           "num_draws": draws, "num_components": chosen if method in ("gm", "pwl") else ""}
    if args.alone_csv and args.replicates:
        append_row(args.alone_csv, FIELDS, {**row, **alone_scores(models, data)})
    return row


def alone_scores(models, data) -> dict:
    """The test scores of the fitted models' own predictions, without the term per repeated input."""
    preds = [model.predict(data.x_test) for model in models]
    mean, variance = mixture_moments(torch.stack([p.mean for p in preds]),
                                     torch.stack([p.observed_variance for p in preds]))
    return predictive_scores(mean, variance, torch.as_tensor(data.y_test))


def _key(row: dict) -> tuple:
    return (row["dataset"], int(row["split"]), row["method"], str(row["validation_fraction"]),
            int(row["num_features"]), row_draws(row))


def run(args) -> None:
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    done = {_key(r) for r in read_rows(args.csv)}
    fraction = str(args.validation_fraction)
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split, args.data)
            for method in args.methods:
                samples, _ = cell_size(method, data.x_train.shape[0], args.num_samples, args.pilot_rows)
                features = 0 if method.startswith("exact") else 2 * samples
                draws = 1 if method.startswith("exact") else draws_for_features(
                    args.num_draws, features, data.x_train.shape[0])
                if (dataset, split, method, fraction, features, draws) in done:
                    continue
                row = run_cell(data, dataset, split, method, draws, args)
                append_row(args.csv, FIELDS, row)
                print(f"{dataset} {split} {method} ×{draws}: rmse {row['rmse']:.4g} nlpd {row['nlpd']:.3f} "
                      f"cov95 {row['coverage95']:.2f} ({row['seconds']:.0f} s)", flush=True)


def _counted(rows, setting) -> list[dict]:
    """The rows with the draws ``setting`` asks for (``auto``: the estimator's rule per cell)."""
    return [r for r in rows if row_draws(r) == _wanted_draws(r, setting)]


def _wanted_draws(row: dict, setting) -> int:
    """The draws a row must have to count under ``--num-draws setting`` (``auto``: the estimator's rule)."""
    if setting != "auto":  # a row's n_train is then not needed
        return setting
    return draws_for_features(setting, int(row["num_features"]), int(row["n_train"]))


def _asked_features(row: dict, num_samples, pilot_rows) -> int:
    """The D a feature kernel's row must have to be reported: ``num_samples``' (``auto``: as ``run`` resolves
    it for the row's training rows, where the row has them)."""
    n = int(row["n_train"]) if row.get("n_train") else 0
    return 2 * cell_size(row["method"], n, num_samples, pilot_rows)[0]


def _feature_draw_rows(path: str, n_train: dict) -> list[dict]:
    """``feature_draws.py``'s JSON lines as rows of this script: its mixture is the one ``run`` scores
    (the same seeds, ``fit``'s defaults, 20% held out, D = 1024)."""
    rows = []
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            rows.append({"dataset": r["dataset"], "split": r["split"], "method": r["method"],
                         "validation_fraction": RECOMMENDED_FRACTION, "num_features": 1024,
                         "n_train": n_train[r["dataset"]], "num_draws": r["K"], **r["moment_matched"]})
    return rows


def _mean(values) -> float:
    return float(np.mean(values)) if values else math.nan


def _over(cell: dict, metric: str, splits=None) -> list[float]:
    """A cell's per-split values of one metric, on the given splits (all of the cell's by default)."""
    return [row[metric] for split, row in sorted(cell.items()) if splits is None or split in splits]


def report(args) -> str:
    rows = [r for path in args.csv for r in read_rows(path)]
    n_train = {r["dataset"]: r["n_train"] for r in rows}
    # The feature-draw lines first: a CSV row of the same cell is a later re-run of it.
    rows = [r for path in args.feature_draws or [] for r in _feature_draw_rows(path, n_train)] + rows
    rows = list({_key(r): r for r in _counted(rows, args.num_draws)}.values())  # later files win
    # Feature kernels at the D asked; exact ARD, the reference, is exact or its D = 1024 expansion whatever D is asked.
    rows = [r for r in rows if r["method"].startswith("exact")
            or int(r["num_features"]) == _asked_features(r, args.num_samples, args.pilot_rows)]
    if args.splits:
        wanted = set(parse_splits(args.splits))
        rows = [r for r in rows if int(r["split"]) in wanted]
    cells = defaultdict(dict)  # (dataset, method) -> split -> metric -> value
    for r in rows:
        # The reference, exact ARD, by the marginal likelihood of all its rows.
        if str(r["validation_fraction"]) != ("0.0" if r["method"].startswith("exact") else args.protocol):
            continue
        cells[(r["dataset"], r["method"])][int(r["split"])] = {
            metric: float(r[metric]) for metric in ("rmse", "nlpd", "coverage50", "coverage95", "std_over_rmse")}
    paper = defaultdict(dict)  # (dataset, method) -> split -> metric -> value
    for path in args.paper_protocol or []:
        for r in read_rows(path):
            key = (r["dataset"], r["method"])
            features = int(r.get("num_features") or 0)
            if (r["status"] == "ok" and int(r["split"]) in cells.get(key, {})
                    and features in (0, 2 * resolve_samples(args.num_samples, None)) and r.get("nlpd")):
                paper[key][int(r["split"])] = {"nlpd": float(r["nlpd"]), "rmse": float(r["rmse"])}
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = [m for m in ("exact-ard", "fsard", "fsgbard", "gm", "pwl", "fastfood-ard", "ssgpr")
               if any((ds, m) in cells for ds in datasets)]
    out = [f"Protocol: validation_fraction = {args.protocol} (the share of training rows held out; 0 is the "
           "À la carte paper's marginal likelihood of all rows); exact GPs at 0. Number of splits in brackets "
           "after the dataset, and after a cell that has fewer; the summary compares each kernel with exact ARD "
           "on the splits both have.", ""]

    def table(title, metric, fmt, paper_metric=None):
        out.extend([f"**{title}**", "", "| dataset | " + " | ".join(methods) + " |",
                    "|---|" + "---:|" * len(methods)])
        for ds in datasets:
            n = max(len(cells.get((ds, m), {})) for m in methods)
            line = []
            for m in methods:
                cell = cells.get((ds, m), {})
                text = fmt(_mean(_over(cell, metric))) if cell else "—"
                if paper_metric and paper.get((ds, m)):
                    text += f" ({fmt(_mean(_over(paper[(ds, m)], paper_metric)))})"
                line.append(text + (f" [{len(cell)}]" if cell and len(cell) < n else ""))
            out.append(f"| {ds} [{n}] | " + " | ".join(line) + " |")
        out.append("")

    out.extend(summary(cells, paper, datasets, methods))
    out.extend(excesses(cells, datasets, methods))
    paper_note = " — in brackets, the same splits under the paper's protocol (UCI runner)" if args.paper_protocol else ""
    table("NLPD (nats per test point, original units)" + paper_note, "nlpd", lambda v: f"{v:.2f}", "nlpd")
    table("95% interval coverage (target 0.95)", "coverage95", lambda v: f"{v:.2f}")
    table("50% interval coverage (target 0.50)", "coverage50", lambda v: f"{v:.2f}")
    table("Mean predictive std / RMSE (1 when the spread matches the errors)", "std_over_rmse", lambda v: f"{v:.2f}")
    table("RMSE" + paper_note, "rmse", lambda v: f"{v:.4g}", "rmse")
    return "\n".join(out)


def summary(cells, paper, datasets, methods) -> list[str]:
    """Per feature kernel: datasets within +0.10 nats of exact ARD's NLPD on the same splits (held out /
    paper protocol), the worst excess, how the RMSE compares with the paper protocol's on the same splits,
    and the datasets where the kernel's NLPD is at or below exact ARD's."""
    out = ["**Summary** — datasets whose mean NLPD is within +0.10 nats of exact ARD's on the same splits "
           "(worst excess in brackets), with held-out rows and under the paper's protocol; RMSE against the "
           "paper protocol's", "",
           "| kernel | within 0.10, held out | within 0.10, paper protocol | RMSE ≤ paper protocol's | RMSE > 1.1× "
           "| NLPD ≤ exact ARD's, held out |",
           "|---|---:|---:|---:|---:|---:|"]
    for m in methods[1:]:
        ours, theirs, better, worse = [], [], 0, 0
        for ds in datasets:
            mine, ref = cells.get((ds, m), {}), cells.get((ds, "exact-ard"), {})
            shared = set(mine) & set(ref)
            if not shared:
                continue
            ours.append(_mean(_over(mine, "nlpd", shared)) - _mean(_over(ref, "nlpd", shared)))
            theirs_cell = paper.get((ds, m), {})
            both = shared & set(theirs_cell)
            if both:
                theirs.append(_mean(_over(theirs_cell, "nlpd", both)) - _mean(_over(ref, "nlpd", both)))
                ratio = _mean(_over(mine, "rmse", both)) / _mean(_over(theirs_cell, "rmse", both))
                better, worse = better + (ratio <= 1), worse + (ratio > 1.1)
        within = lambda xs: f"{sum(x <= 0.1 for x in xs)}/{len(xs)} ({max(xs):+.2f})" if xs else "—"
        out.append(f"| {m} | {within(ours)} | {within(theirs)} | {better}/{len(theirs)} | {worse}/{len(theirs)} "
                   f"| {sum(x <= 0 for x in ours)}/{len(ours)} |")
    return out + [""]


def excesses(cells, datasets, methods) -> list[str]:
    """The cells above +0.10 nats of exact ARD's NLPD: the excess with its standard error over the splits
    both have (the per-split differences' spread over √splits; none from one split)."""
    out = ["**Cells above +0.10** — mean NLPD excess over exact ARD ± its standard error over the splits",
           "", "| dataset | kernel | splits | excess | standard error |", "|---|---|---:|---:|---:|"]
    for ds in datasets:
        ref = cells.get((ds, "exact-ard"), {})
        for m in methods[1:]:
            mine = cells.get((ds, m), {})
            shared = sorted(set(mine) & set(ref))
            differences = np.subtract(_over(mine, "nlpd", shared), _over(ref, "nlpd", shared))
            if not shared or differences.mean() <= 0.1:
                continue
            error = f"{differences.std(ddof=1) / math.sqrt(len(shared)):.2f}" if len(shared) > 1 else "—"
            out.append(f"| {ds} | {m} | {len(shared)} | {differences.mean():+.2f} | {error} |")
    return out + [""]


def _last_rows(paths, setting, protocol: str) -> dict:
    """The rows of ``paths`` (later ones win) at ``protocol`` — exact GPs at 0, the reference — with the draws
    ``setting`` asks, by cell."""
    rows = _counted([r for path in paths for r in read_rows(path)], setting)
    return {(r["dataset"], int(r["split"]), r["method"]): r for r in rows
            if str(r["validation_fraction"]) == ("0.0" if r["method"].startswith("exact") else protocol)}


def compare(args) -> str:
    """Each cell of ``--after`` beside the same cell in the ``before`` CSVs: NLPD, RMSE and 95% coverage,
    then per dataset and kernel their means over the splits both have."""
    before = _last_rows(args.before, args.num_draws, args.protocol)
    after = _last_rows([args.after], args.num_draws, args.protocol)
    shared = [key for key in after if key in before]
    out = ["| dataset | split | kernel | NLPD before → after | RMSE before → after | cov 95% before → after |",
           "|---|---:|---|---|---|---|"]
    pairs = defaultdict(list)
    for key in sorted(shared):
        b, a = before[key], after[key]
        pairs[(key[0], key[2])].append((b, a))
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {float(b['nlpd']):.3f} → {float(a['nlpd']):.3f} | "
                   f"{float(b['rmse']):.4g} → {float(a['rmse']):.4g} | "
                   f"{float(b['coverage95']):.2f} → {float(a['coverage95']):.2f} |")
    out += ["", "| dataset | kernel | splits | mean NLPD before → after | mean RMSE ratio | mean cov 95% before → after |",
            "|---|---|---:|---|---:|---|"]
    for (ds, method), cell in pairs.items():
        def mean(metric, i):
            return _mean([float(p[i][metric]) for p in cell])
        ratio = _mean([float(a["rmse"]) / float(b["rmse"]) for b, a in cell])
        out.append(f"| {ds} | {method} | {len(cell)} | {mean('nlpd', 0):.3f} → {mean('nlpd', 1):.3f} | {ratio:.3f} | "
                   f"{mean('coverage95', 0):.3f} → {mean('coverage95', 1):.3f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--csv", required=True)
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--methods", nargs="+", default=["exact-ard", "fsard", "fsgbard", "gm", "pwl"])
    r.add_argument("--splits", default="0-2")
    r.add_argument("--num-samples", type=count_or_auto, default="auto",
                   help="frequencies M: a number or auto (default: the estimator's, 512, or 2048 with a pilot)")
    r.add_argument("--pilot-rows", type=pilot_rows, default="auto",
                   help="fit GM/PWL on a pilot of this many rows, all (every row) or auto (default: the "
                        "estimator's, a pilot of 5000 rows above 20000)")
    r.add_argument("--num-components", default="auto", type=lambda t: t if t in ("auto", "runner") else int(t),
                   help="GM/PWL components: a number, runner (the UCI runner's rule) or auto (default: the "
                        "estimator's, which keeps the better of 1 and 4 by the held-out score above 400 held-out rows)")
    r.add_argument("--validation-fraction", type=float, default=RECOMMENDED_FRACTION)
    r.add_argument("--num-draws", type=draws_setting, default="auto",
                   help="fits averaged per cell: a positive integer or auto (default, the estimator's rule)")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--no-replicates", dest="replicates", action="store_false",
                   help="score the fitted models alone at repeated training inputs (default: with replicates, "
                        "as the estimator)")
    r.add_argument("--alone-csv", help="also write the same fits' scores without replicates here")
    r.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    p = sub.add_parser("report")
    p.add_argument("csv", nargs="+")
    p.add_argument("--protocol", default=str(RECOMMENDED_FRACTION))
    p.add_argument("--num-samples", type=count_or_auto, default="auto",
                   help="feature kernels' rows at D = 2·num_samples only, here and under --paper-protocol (a "
                        "number, or auto: the D the estimator's defaults give each cell, and 1024 under "
                        "--paper-protocol)")
    p.add_argument("--pilot-rows", type=pilot_rows, default="auto",
                   help="with --num-samples auto, the rows the D is resolved for (default auto, as run)")
    p.add_argument("--splits", default=None, help="only these splits, e.g. 0-2 (default: every split the CSVs hold)")
    p.add_argument("--paper-protocol", nargs="*")
    p.add_argument("--num-draws", type=draws_setting, default="auto",
                   help="report the rows with this many draws (default auto: the estimator's rule per cell)")
    p.add_argument("--feature-draws", nargs="*", help="feature_draws.py JSON lines to add")
    c = sub.add_parser("compare", help="the cells of one CSV beside the same cells in others")
    c.add_argument("before", nargs="+")
    c.add_argument("--after", required=True)
    c.add_argument("--num-draws", type=draws_setting, default="auto")
    c.add_argument("--protocol", default=str(RECOMMENDED_FRACTION))
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args) if args.command == "report" else compare(args))


if __name__ == "__main__":
    main()
