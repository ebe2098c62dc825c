"""How stable the simplex-ARD GP's selection is over feature draws: one SRFF problem, several seeds.

Each seed draws its own Fastfood features and restarts (the data stay one draw) and runs
:func:`alacarte.selection.selection_frequency`'s fit and :func:`~alacarte.selection.select_inputs`
with the settings of ``experiments/selection_benchmark.py``'s ``gp-simplex-fresh`` (all rows in the
likelihood) or, with ``--validation-fraction auto``, its ``gp-simplex-band`` (``fit``'s default held-out
rows; select_inputs' defaults either way).  One JSON line
per seed is appended as it finishes (a rerun skips the seeds it holds); ``report`` prints the
per-input frequency.

    python experiments/selection_stability.py run --problem se2 --n 5000 --seeds 0 1 2 3 4 \
        --out experiments/results/selection_stability.jsonl [--validation-fraction auto]
    python experiments/selection_stability.py report experiments/results/selection_stability.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac
from alacarte.datasets.synthetic import make_se1, make_se2, make_se3
from alacarte.selection import selection_frequency

from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

PROBLEMS = {"se1": make_se1, "se2": make_se2, "se3": make_se3}


def run(args) -> None:
    x, y, relevant = PROBLEMS[args.problem](args.n, seed=0)
    out = Path(args.out)
    fraction = _fraction(args.validation_fraction)
    done = {r["seed"] for r in read_rows(out) if (r["problem"], r["n"], _key(r)) == (args.problem, args.n, fraction)}
    d = x.shape[1]

    def build(seed):
        return ac.FeatureGP(None, None, ac.FSARDKernel(d, 128, ard_num_dims=d, simplex=True, seed=seed).double()).double()

    for seed in args.seeds:
        if seed in done:
            continue
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            found = selection_frequency(build, x, y, seeds=[seed], max_iter=100, restarts=2, restart_iter=10,
                                        validation_fraction=fraction)
        row = {"problem": args.problem, "n": args.n, "validation_fraction": fraction, "seed": seed,
               "relevant": list(relevant),
               "selected": found.selections[0].tolist(), "seconds": round(time.perf_counter() - start, 1),
               "threads": torch.get_num_threads()}
        append_row(out, row)
        print(row, flush=True)


def report(args) -> None:
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    for (problem, n, fraction) in dict.fromkeys((r["problem"], r["n"], _key(r)) for r in rows):
        cell = [r for r in rows if (r["problem"], r["n"], _key(r)) == (problem, n, fraction)]
        relevant = set(cell[0]["relevant"])
        counts: dict[int, int] = {}
        for r in cell:
            for j in r["selected"]:
                counts[j] = counts.get(j, 0) + 1
        exact = sum(set(r["selected"]) == relevant for r in cell)
        print(f"{problem} n = {n}, validation_fraction {fraction}: {len(cell)} feature draws, exact relevant set on {exact}; "
              f"median {np.median([r['seconds'] for r in cell]):.0f} s a draw")
        print("| input | relevant | kept on |")
        print("|---:|---|---:|")
        for j in sorted(counts, key=lambda j: (-counts[j], j)):
            print(f"| {j} | {'yes' if j in relevant else 'no'} | {counts[j]} of {len(cell)} |")
        missing = sorted(relevant - set(counts))
        if missing:
            print(f"\nRelevant inputs never kept: {missing}")


def _fraction(text: str) -> float | str:
    return text if text == "auto" else float(text)


def _key(row: dict) -> float | str:
    return row.get("validation_fraction", 0.0)  # (rows written before the field: all rows in the likelihood)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--problem", choices=sorted(PROBLEMS), default="se2")
    go.add_argument("--n", type=int, default=5000)
    go.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    go.add_argument("--validation-fraction", default="0", help="fit's validation_fraction: 0 or 'auto'")
    go.add_argument("--out", required=True)
    show = sub.add_parser("report")
    show.add_argument("results")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
