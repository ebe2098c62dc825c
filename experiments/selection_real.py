"""Variable selection on real data with irrelevant columns appended (issue 49, item 3).

For each UCI dataset (split 0, or ``--splits``) the d real columns get d more: the first ⌈d/2⌉ Gaussian
noise, the rest row-permuted copies of real columns (each its own permutation, so a copy keeps its column's
marginal distribution and loses its relation to y).  The simplex-ARD GP (FSARD, ``simplex=True``,
then :func:`alacarte.selection.select_inputs`; the settings of ``selection_benchmark.py``'s
``gp-simplex-fsard``) is fitted on the original and on the widened columns; a row per fit is
appended as it finishes, so a killed run resumes.  ``--draws K`` fits the widened columns K times,
with K feature draws (fit seeds seed, seed + 1, …): the report then gives each input's selection
frequency and the set kept by at least 4 of 5 draws (:meth:`~alacarte.selection.SelectionFrequency.stable`'s rule).
``--select-draws K`` has ``select_inputs`` ask K fresh feature draws what each input is worth (its ``draws``).
``--defaults`` fits and selects at the library's defaults instead of the benchmark's all-rows settings.
``--estimator`` fits what a user gets, ``AlaCarteRegressor("fsard", select=True)`` at every default (D = 1 024,
five feature draws at n ≤ 2 048), and reports its ``selected_`` (kept by at least 4 of 5 draws) and its predictions.
``--exact`` fits the Fastfood RBF simplex kernel instead (``selection_benchmark.py``'s ``gp-simplex-exact``: 512 frequencies, D = 1 024)
and has ``select_inputs`` ask the RBF/ARD kernel itself (``draws="exact"``).

    python experiments/selection_real.py run --out experiments/results/appended_columns.csv \
        --datasets yacht housing concrete wine skillcraft elevators [--draws 5]
    python experiments/selection_real.py report experiments/results/appended_columns.csv \
        > experiments/results/appended_columns.md
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.bench.settings import package_version, parse_splits  # noqa: E402
from alacarte.selection import SelectionFrequency, select_inputs  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from selection_benchmark import RBF_SAMPLES, gp_settings  # noqa: E402

FIELDS = ["dataset", "split", "columns", "seed", "draw", "n_train", "d", "selected", "rmse", "nlpd", "coverage95",
          "seconds", "threads", "version"]


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


def fit_selected(x: np.ndarray, y: np.ndarray, seed: int, select_draws: int | str = 0, defaults: bool = False):
    """The simplex GP fitted and selected with the benchmark's settings on all rows, or (``defaults``)
    with ``fit``'s and ``select_inputs``' own: 20% of the rows held out for the band, fresh draws.
    ``select_draws="exact"``: the Fastfood RBF kernel, its inputs' costs read on the RBF/ARD kernel."""
    n, d = x.shape
    settings = gp_settings(n, d)
    if select_draws == "exact":
        kernel = ac.FastfoodRBFKernel(d, RBF_SAMPLES, ard_num_dims=d, simplex=True, seed=seed).double()
    else:
        kernel = ac.FSARDKernel(d, settings["num_samples"], ard_num_dims=d, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if defaults:
            ac.fit(model, x, y, progress=False, seed=seed)
            select_inputs(model, x, y, seed=seed, draws="exact" if select_draws == "exact" else "auto")
        else:
            ac.fit(model, x, y, max_iter=settings["max_iter"], restarts=settings["restarts"], restart_iter=10,
                   progress=False, seed=seed, validation_fraction=0)
            select_inputs(model, x, y, seed=seed, draws=select_draws, validation_fraction=0)
    return model


def fit_and_predict(x: np.ndarray, y: np.ndarray, xt: np.ndarray, seed: int, args) -> tuple[list, object, object]:
    """The inputs kept, and the predictive mean and variance of a new y at ``xt``: of the simplex GP fitted by
    :func:`fit_selected`, or (``--estimator``) of ``AlaCarteRegressor("fsard", select=True)`` at its defaults
    (D = 1 024, five feature draws at n ≤ 2 048 each selecting, the inputs kept by at least 4 of 5)."""
    if args.estimator:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            reg = ac.AlaCarteRegressor("fsard", select=True, random_state=seed).fit(x, y)
        mean, std = reg.predict(xt, return_std=True)
        return reg.selected_.tolist(), torch.as_tensor(mean), torch.as_tensor(std) ** 2
    model = fit_selected(x, y, seed, "exact" if args.exact else args.select_draws, args.defaults)
    pred = model.predict(xt)
    return model.covar_module.selected().tolist(), pred.mean, pred.observed_variance


def run(args) -> None:
    torch.set_num_threads(args.threads)
    done = {(r["dataset"], _split(r), r["columns"], int(r["seed"]), int(r["draw"])) for r in read_rows(args.out)}
    cells = [("original", 0)] + [("widened", draw) for draw in range(args.draws)]
    for dataset, split in ((ds, s) for s in parse_splits(args.splits) for ds in args.datasets):
        data = ac.load_uci(dataset, split, args.data)
        for columns, draw in cells:
            if (dataset, split, columns, args.seed, draw) in done:
                continue
            x, xt = data.x_train, data.x_test
            if columns == "widened":
                x, xt = widen(x, xt, args.seed)
            start = time.perf_counter()
            selected, mean, variance = fit_and_predict(x, data.y_train, xt, args.seed + draw, args)
            seconds = time.perf_counter() - start
            scores = predictive_scores(mean, variance, torch.as_tensor(data.y_test))
            row = {"dataset": dataset, "split": split, "columns": columns, "seed": args.seed, "draw": draw,
                   "n_train": len(x), "d": data.x_train.shape[1], "selected": " ".join(map(str, selected)),
                   "rmse": scores["rmse"], "nlpd": scores["nlpd"], "coverage95": scores["coverage95"],
                   "seconds": round(seconds, 1), "threads": torch.get_num_threads(), "version": package_version()}
            append_row(args.out, FIELDS, row)
            print(dataset, split, columns, draw, f"rmse {row['rmse']:.4g} nlpd {row['nlpd']:.3f} "
                  f"kept [{row['selected']}] ({seconds:.0f} s)", flush=True)


def _split(row: dict) -> int:
    return int(row.get("split") or 0)  # (rows written before the column: split 0)


def report(args) -> str:
    """One line per dataset over its splits: shares and columns per split, RMSE and NLPD as means."""
    all_rows = [r for path in args.results for r in read_rows(path)]
    pairs = defaultdict(dict)  # dataset -> (split, seed) -> {columns: row}, each split's first feature draw
    for r in all_rows:
        if int(r["draw"]) == 0:
            pairs[r["dataset"]].setdefault((_split(r), int(r["seed"])), {})[r["columns"]] = r
    out = ["| dataset (n, d) | splits | appended zeroed | appended kept: noise / copies | real dropped, original | "
           "real dropped, widened | RMSE widened / original | NLPD original → widened | 95% cov. widened | "
           "s (widened) |",
           "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    shares, ratios = [], []
    for dataset, by_split in pairs.items():
        both = [p for _, p in sorted(by_split.items()) if "original" in p and "widened" in p]
        if not both:
            continue
        d = int(both[0]["widened"]["d"])
        kept = [[int(j) for j in p["widened"]["selected"].split()] for p in both]
        noise = sum(d <= j < d + (d + 1) // 2 for k in kept for j in k)
        copies = sum(j >= d + (d + 1) // 2 for k in kept for j in k)
        zeroed = min(1 - sum(j >= d for j in k) / d for k in kept)

        def mean(columns, key):
            return np.mean([float(p[columns][key]) for p in both])

        ratio = mean("widened", "rmse") / mean("original", "rmse")
        shares.append(zeroed)
        ratios.append(ratio)

        def dropped(columns):
            gone = [sorted(set(range(d)) - {int(j) for j in p[columns]["selected"].split()}) for p in both]
            return " · ".join(" ".join(map(str, g)) or "none" for g in gone)

        out.append(f"| {dataset} ({both[0]['widened']['n_train']}, {d}) | {len(both)} | {zeroed:.0%} | "
                   f"{noise} / {copies} | {dropped('original')} | {dropped('widened')} | {ratio:.3f} | "
                   f"{mean('original', 'nlpd'):.3f} → {mean('widened', 'nlpd'):.3f} | "
                   f"{mean('widened', 'coverage95'):.2f} | {mean('widened', 'seconds'):.1f} |")
    if shares:
        out += ["", "*appended zeroed*: the fewest over the splits; columns dropped are listed per split (·); RMSE and "
                    "NLPD are means over the splits.", "",
                f"Goals (issue 49): ≥ 95% of appended columns zeroed on every dataset — "
                f"{sum(s >= 0.95 for s in shares)}/{len(shares)}; RMSE within 3% of the original columns' — "
                f"{sum(r <= 1.03 for r in ratios)}/{len(ratios)}."]
    return "\n".join(out + draws_table(all_rows, pairs))


def draws_table(all_rows: list[dict], pairs: dict) -> list[str]:
    """Where the widened columns of a split were fitted on several feature draws: what the draws agree on."""
    draws = defaultdict(list)
    for r in all_rows:
        if r["columns"] == "widened":
            draws[r["dataset"], _split(r), int(r["seed"])].append(r)
    out = ["", "**Over feature draws** (the widened columns; *stable*: kept by at least 80% of the draws)", "",
           "| dataset (n, d) | split | draws | appended zeroed, per draw | appended zeroed by the stable set | "
           "appended in some draw's set | real columns not stable | RMSE widened / original, mean over draws |",
           "|---|---:|---:|---|---:|---|---|---:|"]
    shown = 0
    for (dataset, split, seed), rs in draws.items():
        original = pairs[dataset].get((split, seed), {}).get("original")
        if len(rs) < 2 or original is None:
            continue
        d = int(rs[0]["d"])
        kept = [{int(j) for j in r["selected"].split()} for r in rs]
        frequency = np.array([sum(j in k for k in kept) for j in range(2 * d)]) / len(rs)
        stable = set(SelectionFrequency(torch.as_tensor(frequency), [], []).stable().tolist())
        zeroed = [1 - sum(j >= d for j in k) / d for k in kept]
        ever = sorted(j for j in range(d, 2 * d) if frequency[j] > 0)
        ratio = np.mean([float(r["rmse"]) for r in rs]) / float(original["rmse"])
        out.append(f"| {dataset} ({rs[0]['n_train']}, {d}) | {split} | {len(rs)} | {min(zeroed):.0%}–{max(zeroed):.0%} | "
                   f"{1 - sum(j >= d for j in stable) / d:.0%} | "
                   f"{' '.join(f'{j} ({frequency[j]:.0%})' for j in ever) or 'none'} | "
                   f"{' '.join(map(str, sorted(set(range(d)) - stable))) or 'none'} | {ratio:.3f} |")
        shown += 1
    return out if shown else []


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--splits", default="0", help="UCI splits, as '0-2' or '0,3' (default 0)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--draws", type=int, default=1, help="feature draws of the widened columns' fit")
    r.add_argument("--select-draws", type=int, default=0, help="fresh feature draws select_inputs asks")
    r.add_argument("--exact", action="store_true", help="the Fastfood RBF simplex kernel, select_inputs(draws='exact')")
    r.add_argument("--estimator", action="store_true",
                   help='AlaCarteRegressor("fsard", select=True) at its defaults; selected: its selected_')
    r.add_argument("--defaults", action="store_true",
                   help="fit and select_inputs at their defaults (20%% held out for the band, fresh draws; "
                        "--select-draws ignored), D still the benchmark's")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    p = sub.add_parser("report")
    p.add_argument("results", nargs="+", help="results files, read in turn")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
