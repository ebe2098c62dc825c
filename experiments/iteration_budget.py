"""What a larger iteration budget buys: `fit`'s defaults but for ``max_iter``, with the held-out trace.

    python experiments/iteration_budget.py run --out OUT.jsonl --datasets parkinsons --methods fsard pwl \
        --splits 0-2 --max-iter 100 1000
    python experiments/iteration_budget.py report OUT.jsonl

Each (dataset, split, method, max_iter) is fitted as ``calibration.py run`` fits it at the defaults (D = 1024,
the estimator's draws, 20% held out) with ``max_iter`` final iterations (and ``--patience``: the iterations
without a better held-out score after which an optimisation stops), and scored on the test rows: RMSE,
NLPD, 95% coverage, the final optimisation's iterations, and the first draw's held-out score at every iterate
(``FitHistory.validation_loss``), from which the report says where a stopping rule on that score would have
stopped. One JSON line per fit, appended as it finishes (a killed run resumes). Data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from calibration import fit_draws  # noqa: E402

import alacarte as ac  # noqa: E402
from alacarte.bench.settings import model_name, package_version, parse_splits  # noqa: E402
from alacarte.factory import draws_for_features, make_model  # noqa: E402
from alacarte.holdout import PATIENCE  # noqa: E402
from alacarte.training import _optimization  # noqa: E402

NUM_SAMPLES = 512


def fit_cell(data, split: int, method: str, max_iter: int) -> dict:
    n, d = data.x_train.shape
    draws = 1 if method.startswith("exact") else draws_for_features("auto", 2 * NUM_SAMPLES, n)
    start = time.process_time()
    scores, _, histories = fit_draws(
        data, split, draws, lambda seed: make_model(model_name(method, n), d, num_samples=NUM_SAMPLES, seed=seed),
        max_iter=max_iter)
    seconds = time.process_time() - start
    first = histories[0]
    return {**scores, "draws": draws,
            "cpu_seconds": round(seconds, 1), "iterations": [h.iterations for h in histories],
            "best_iteration": first.best_iteration, "validation_loss": first.validation_loss,
            "version": package_version()}


def run(args) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    _optimization.PATIENCE = args.patience  # the early stopping's, read by each held-out score
    done = {(r["dataset"], r["split"], r["method"], r["max_iter"], r.get("patience", PATIENCE))
            for r in read_rows(args.out)}
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split)
            for method in args.methods:
                for max_iter in args.max_iter:
                    if (dataset, split, method, max_iter, args.patience) in done:
                        continue
                    row = {"dataset": dataset, "split": split, "method": method, "max_iter": max_iter,
                           "patience": args.patience,
                           **fit_cell(data, split, method, max_iter)}
                    append_row(args.out, row)
                    print(f"{dataset} {split} {method} max_iter {max_iter}: rmse {row['rmse']:.4g} "
                          f"nlpd {row['nlpd']:.3f} cov95 {row['coverage95']:.3f} it {row['iterations']} "
                          f"({row['cpu_seconds']:.0f} s)", flush=True)


def stop_at(trace: list[float], patience: int, min_gain: float) -> int:
    """The iterate a rule stops at: no score better by ``min_gain`` than the best for ``patience`` iterates."""
    best = 0
    for i, value in enumerate(trace):
        if value < trace[best] - min_gain:
            best = i
        if i - best >= patience:
            return i
    return len(trace) - 1


def report(args) -> str:
    rows = read_rows(args.out)
    lines = ["| dataset | split | method | max_iter | patience | RMSE | NLPD | cov 95% | iterations | CPU s "
             "| stop at gain ≥ 1e-3 | ≥ 1e-2 |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["dataset"], r["method"], r["split"], r["max_iter"],
                                         r.get("patience", PATIENCE))):
        trace = r["validation_loss"]
        stops = [stop_at(trace, 20, gain) if trace else "" for gain in (1e-3, 1e-2)]
        lines.append(f"| {r['dataset']} | {r['split']} | {r['method']} | {r['max_iter']} | "
                     f"{r.get('patience', PATIENCE)} | {r['rmse']:.4g} | "
                     f"{r['nlpd']:.3f} | {r['coverage95']:.3f} | {', '.join(map(str, r['iterations']))} | "
                     f"{r['cpu_seconds']:.0f} | {stops[0]} | {stops[1]} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--methods", nargs="+", required=True)
    r.add_argument("--splits", default="0-2")
    r.add_argument("--max-iter", nargs="+", type=int, default=[100, 1000])
    r.add_argument("--patience", type=int, default=PATIENCE,
                   help=f"iterations without a better held-out score before a fit stops (default {PATIENCE}, fit's)")
    p = sub.add_parser("report")
    p.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
