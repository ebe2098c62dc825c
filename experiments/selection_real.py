"""Variable selection on real data with irrelevant columns appended (issue 49, item 3).

For each UCI dataset (split 0) the d real columns get d more: the first ⌈d/2⌉ Gaussian noise, the
rest row-permuted copies of real columns (each its own permutation, so a copy keeps its column's
marginal distribution and loses its relation to y).  The simplex-ARD GP (FSARD, ``simplex=True``,
then :func:`alacarte.selection.select_inputs`; the settings of ``selection_benchmark.py``'s
``gp-simplex-fsard``) is fitted on the original and on the widened columns; a row per fit is
appended as it finishes, so a killed run resumes.

    python experiments/selection_real.py run --out experiments/results/appended_columns.csv \
        --datasets yacht housing concrete wine skillcraft elevators
    python experiments/selection_real.py report experiments/results/appended_columns.csv \
        > experiments/results/appended_columns.md
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.bench.settings import package_version  # noqa: E402
from alacarte.selection import select_inputs  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from selection_benchmark import gp_settings  # noqa: E402

FIELDS = ["dataset", "columns", "seed", "n_train", "d", "selected", "rmse", "nlpd", "coverage95", "seconds",
          "threads", "version"]


def widen(x_train: np.ndarray, x_test: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """[x, noise, permuted copies]: d appended columns, ⌈d/2⌉ Gaussian and ⌊d/2⌋ permuted copies.

    Train and test rows are permuted within their own part, so a copy carries no row's y."""
    rng = np.random.default_rng(seed)
    d = x_train.shape[1]
    noise, copies = (d + 1) // 2, d // 2
    sources = rng.choice(d, size=copies, replace=False)
    parts = []
    for x in (x_train, x_test):
        gauss = rng.standard_normal((len(x), noise))
        permuted = np.stack([x[rng.permutation(len(x)), j] for j in sources], 1) if copies else x[:, :0]
        parts.append(np.hstack([x, gauss, permuted]))
    return parts[0], parts[1]


def fit_selected(x: np.ndarray, y: np.ndarray, seed: int):
    n, d = x.shape
    settings = gp_settings(n, d)
    kernel = ac.FSARDKernel(d, settings["num_samples"], ard_num_dims=d, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ac.fit(model, x, y, max_iter=settings["max_iter"], restarts=settings["restarts"], restart_iter=10,
               progress=False, seed=seed)
        select_inputs(model, x, y, seed=seed)
    return model


def run(args) -> None:
    torch.set_num_threads(args.threads)
    done = {(r["dataset"], r["columns"], int(r["seed"])) for r in read_rows(args.out)}
    for dataset in args.datasets:
        data = ac.load_uci(dataset, 0, args.data)
        for columns in ("original", "widened"):
            if (dataset, columns, args.seed) in done:
                continue
            x, xt = data.x_train, data.x_test
            if columns == "widened":
                x, xt = widen(x, xt, args.seed)
            start = time.perf_counter()
            model = fit_selected(x, data.y_train, args.seed)
            seconds = time.perf_counter() - start
            pred = model.predict(xt)
            scores = predictive_scores(pred.mean, pred.observed_variance, torch.as_tensor(data.y_test))
            row = {"dataset": dataset, "columns": columns, "seed": args.seed, "n_train": len(x),
                   "d": data.x_train.shape[1], "selected": " ".join(map(str, model.covar_module.selected().tolist())),
                   "rmse": scores["rmse"], "nlpd": scores["nlpd"], "coverage95": scores["coverage95"],
                   "seconds": round(seconds, 1), "threads": torch.get_num_threads(), "version": package_version()}
            append_row(args.out, FIELDS, row)
            print(dataset, columns, f"rmse {row['rmse']:.4g} nlpd {row['nlpd']:.3f} kept [{row['selected']}] "
                  f"({seconds:.0f} s)", flush=True)


def report(args) -> str:
    rows = {(r["dataset"], r["columns"]): r for r in read_rows(args.results)}
    out = ["| dataset (n, d) | appended zeroed | appended kept: noise / copies | real dropped, original | "
           "real dropped, widened | RMSE widened / original | NLPD original → widened | 95% cov. widened | "
           "s (widened) |",
           "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    shares, ratios = [], []
    for dataset in dict.fromkeys(key[0] for key in rows):
        original, widened = rows.get((dataset, "original")), rows.get((dataset, "widened"))
        if not (original and widened):
            continue
        d = int(widened["d"])
        kept = [int(j) for j in widened["selected"].split()]
        noise = sum(d <= j < d + (d + 1) // 2 for j in kept)
        copies = sum(j >= d + (d + 1) // 2 for j in kept)
        zeroed = 1 - (noise + copies) / d
        ratio = float(widened["rmse"]) / float(original["rmse"])
        shares.append(zeroed)
        ratios.append(ratio)

        def dropped(row):
            gone = sorted(set(range(d)) - {int(j) for j in row["selected"].split()})
            return " ".join(map(str, gone)) or "none"

        out.append(f"| {dataset} ({widened['n_train']}, {d}) | {zeroed:.0%} | {noise} / {copies} | "
                   f"{dropped(original)} | {dropped(widened)} | {ratio:.3f} | "
                   f"{float(original['nlpd']):.3f} → {float(widened['nlpd']):.3f} | "
                   f"{float(widened['coverage95']):.2f} | {widened['seconds']} |")
    if shares:
        out += ["", f"Goals (issue 49): ≥ 95% of appended columns zeroed on every dataset — "
                    f"{sum(s >= 0.95 for s in shares)}/{len(shares)}; RMSE within 3% of the original columns' — "
                    f"{sum(r <= 1.03 for r in ratios)}/{len(ratios)}."]
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    p = sub.add_parser("report")
    p.add_argument("results")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
