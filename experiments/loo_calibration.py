"""σ² and the variance scale chosen for the final posterior: the held-out rows scored under the kept
rows' posterior (*kept*) or each predicted from all other rows (*leave-one-out*, what ``fit`` does).

    python experiments/loo_calibration.py run OUT.jsonl --datasets airfoil housing --methods fsard gm \
        --splits 0-2
    python experiments/loo_calibration.py report OUT.jsonl --exact experiments/results/calibration.csv
    python experiments/loo_calibration.py rows OUT.jsonl --csv experiments/results/calibration_default.csv \
        [--datasets D ...]

``run`` fits each (dataset, split, method) as ``calibration.py run`` does (``make_model``, ``fit``'s
defaults, 20% held out, the estimator's feature draws, their mixture's moment-matched Gaussian).
Inside every fit ``HeldOut.calibrate`` runs twice from the same state, once with each score; the fit
goes on with the kept rows' choice, and the test rows are then predicted under both choices (the
two differ only in σ² and σ_f²).  One JSON line per cell, appended; a re-run skips the cells done.
``report`` prints a markdown table: NLPD, 95% coverage and std/RMSE under both rules, beside exact
ARD's NLPD on the same splits (the ``--exact`` CSVs, ``calibration.py``'s rows).  ``rows`` appends
the leave-one-out rule's cells to a ``calibration.py`` CSV: they are what ``fit`` now predicts, the
same fits to the last digit, so ``calibration.py report`` (later rows win) shows the defaults.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from unittest import mock

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.bench.settings import parse_splits  # noqa: E402
from alacarte.factory import draws_for_features, make_model  # noqa: E402
from alacarte.holdout import HeldOut  # noqa: E402
from alacarte.regressor import mixture_moments  # noqa: E402
from _csv_rows import append_row as append_csv_row, read_rows as read_csv_rows  # noqa: E402
from calibration import FIELDS  # noqa: E402
from _jsonl_rows import append_row, read_rows  # noqa: E402

SHIPPED = HeldOut.calibrate
RULES = ("kept", "loo")


def _kept_rows_score(self):
    statistics = self._kept_statistics()
    return lambda: self.score_and_scale(statistics)


class BothRules:
    """Patches ``HeldOut.calibrate`` to run both rules from the same state; remembers the state and
    the (σ², s*) each chose, and leaves the model as the kept rows' rule set it."""

    def __init__(self):
        self.states, self.chosen = [], []

    def __call__(self, held_out: HeldOut):
        model = held_out.model
        start = copy.deepcopy(model.state_dict())
        loo = SHIPPED(held_out)
        self.states.append(copy.deepcopy(model.state_dict()))
        model.load_state_dict(start)
        with mock.patch.object(HeldOut, "calibration_score", _kept_rows_score):
            kept = SHIPPED(held_out)
        self.chosen.append({"kept": kept, "loo": loo})
        return kept


def run_cell(data, split: int, method: str, num_features: int) -> dict:
    n, d = data.x_train.shape
    draws = draws_for_features("auto", num_features, n)
    predictions = {rule: ([], []) for rule in RULES}
    both, start = BothRules(), time.perf_counter()
    for k in range(draws):
        seed = split + 1000 * k  # AlaCarteRegressor(random_state=split)'s draws
        model = make_model(method, d, num_samples=num_features // 2, seed=seed)
        with warnings.catch_warnings(), mock.patch.object(HeldOut, "calibrate", lambda held_out: both(held_out)):
            warnings.simplefilter("ignore")
            ac.fit(model, data.x_train, data.y_train, seed=seed, progress=False)
        for rule in RULES:
            if rule == "loo":
                model.load_state_dict(both.states[-1])
            pred = model.predict(data.x_test)
            predictions[rule][0].append(pred.mean.detach())
            predictions[rule][1].append(pred.observed_variance.detach())
    y = torch.as_tensor(data.y_test)
    scores = {rule: predictive_scores(*mixture_moments(torch.stack(m), torch.stack(v)), y)
              for rule, (m, v) in predictions.items()}
    return {"split": split, "method": method, "n_train": n, "num_features": num_features, "draws": draws,
            "scores": scores, "chosen": both.chosen, "seconds": round(time.perf_counter() - start, 1)}


def run(args) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    done = {(r["dataset"], r["split"], r["method"]) for r in read_rows(args.out)}
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split, args.data)
            for method in args.methods:
                if (dataset, split, method) in done:
                    continue
                row = {"dataset": dataset, **run_cell(data, split, method, args.num_features)}
                append_row(args.out, row)
                s = row["scores"]
                print(f"{dataset} {split} {method}: nlpd {s['kept']['nlpd']:.3f} -> {s['loo']['nlpd']:.3f}, "
                      f"cov95 {s['kept']['coverage95']:.2f} -> {s['loo']['coverage95']:.2f} ({row['seconds']:.0f} s)",
                      flush=True)


def report(args) -> str:
    exact = {(r["dataset"], int(r["split"])): float(r["nlpd"])
             for path in args.exact for r in read_csv_rows(path)
             if r["method"] == "exact-ard" and float(r["validation_fraction"]) == 0}
    cells = defaultdict(list)
    for r in read_rows(args.out):
        cells[(r["dataset"], r["method"])].append(r)
    out = ["| dataset | kernel | splits | exact ARD NLPD | NLPD kept → LOO | excess kept → LOO | 95% cov. kept → LOO "
           "| std/RMSE kept → LOO |", "|---|---|---:|---:|---|---|---|---|"]
    tally, changes = {rule: 0 for rule in RULES}, []
    for (dataset, method), rows in cells.items():
        rows = [r for r in rows if (dataset, r["split"]) in exact]
        if not rows:
            continue
        ref = np.mean([exact[(dataset, r["split"])] for r in rows])
        mean = {rule: {m: np.mean([r["scores"][rule][m] for r in rows]) for m in ("nlpd", "coverage95", "std_over_rmse")}
                for rule in RULES}
        for rule in RULES:
            tally[rule] += mean[rule]["nlpd"] - ref <= 0.10
        changes.append(mean["loo"]["nlpd"] - mean["kept"]["nlpd"])
        out.append(f"| {dataset} | {method} | {len(rows)} | {ref:.3f} | {mean['kept']['nlpd']:.3f} → "
                   f"{mean['loo']['nlpd']:.3f} | {mean['kept']['nlpd'] - ref:+.3f} → {mean['loo']['nlpd'] - ref:+.3f} | "
                   f"{mean['kept']['coverage95']:.3f} → {mean['loo']['coverage95']:.3f} | "
                   f"{mean['kept']['std_over_rmse']:.2f} → {mean['loo']['std_over_rmse']:.2f} |")
    total = len(changes)
    out += ["", f"Within +0.10 nats of exact ARD: kept rows {tally['kept']}/{total}, leave-one-out {tally['loo']}/{total}. "
            f"NLPD, leave-one-out minus kept rows: lower in {sum(c < 0 for c in changes)} cells, higher in "
            f"{sum(c > 0 for c in changes)}; median {np.median(changes):+.3f}, mean {np.mean(changes):+.3f}, "
            f"range {min(changes):+.3f} to {max(changes):+.3f} nats."]
    return "\n".join(out)


def rows(args) -> None:
    """Append the leave-one-out rule's cells to ``args.csv`` as ``calibration.py`` rows."""
    for r in read_rows(args.out):
        if args.datasets and r["dataset"] not in args.datasets:
            continue
        scores = r["scores"]["loo"]
        append_csv_row(args.csv, FIELDS, {
            "dataset": r["dataset"], "split": r["split"], "method": r["method"], "validation_fraction": 0.2,
            "num_features": r["num_features"], "n_train": r["n_train"],
            **{m: scores[m] for m in ("rmse", "nlpd", "coverage50", "coverage95", "std_over_rmse")},
            "noise": r["chosen"][0]["loo"][0], "held_out_rows": "", "iterations": "", "seconds": r["seconds"],
            "version": args.version, "num_draws": r["draws"]})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("out")
    go.add_argument("--datasets", nargs="+", required=True)
    go.add_argument("--methods", nargs="+", default=["fsard", "fsgbard", "gm", "pwl"])
    go.add_argument("--splits", default="0-2")
    go.add_argument("--num-features", type=int, default=1024)
    go.add_argument("--data", default=os.environ.get("ALACARTE_DATA", "/work/shared/uci"))
    rep = sub.add_parser("report")
    rep.add_argument("out")
    rep.add_argument("--exact", nargs="+", default=["experiments/results/calibration.csv"])
    add = sub.add_parser("rows")
    add.add_argument("out")
    add.add_argument("--csv", required=True)
    add.add_argument("--datasets", nargs="*", help="only these datasets' cells (default: all)")
    add.add_argument("--version", default="0.1.0+loo", help="the rows' version column")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "rows":
        rows(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
