"""The same UCI cells in two runs (CPU and GPU, or committed rows and a rerun): test RMSE side by side.

A cell is one (dataset, split, method) at one protocol — D, components, restarts,
max_iter and noise floor all equal; rows that differ in any of them are not compared.
Each line gives both rows' code version, and the summary counts the cells by how far
their RMSEs differ: unconverged fits amplify round-off (and any change of code
between the versions) over their iterations, so equal numerics give equal RMSE only
to round-off, and a changed code path can move a fit to another optimum.

    python experiments/compare_runs.py --a experiments/results/uci_full.csv \
        --b experiments/results/uci_cuda.csv --labels CPU GPU --out experiments/results/compare_devices.md
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from alacarte.bench.store import ended_at_noise_floor, noise_floor_of, read_rows  # noqa: E402

PROTOCOL = ("num_features", "components", "restarts", "max_iter")
BUCKETS = (1e-6, 1e-3, 1e-2)


def _cells(paths: list[str]) -> dict:
    cells = {}
    for path in paths:
        for r in read_rows(path):
            if r["status"] == "ok":
                key = (r["dataset"], int(r["split"]), r["method"], *(r[k] for k in PROTOCOL), noise_floor_of(r))
                cells[key] = r  # a cell in several files of one run: the last file's row
    return cells


def render(a_paths: list[str], b_paths: list[str], labels: tuple[str, str], command: str) -> str:
    a, b = _cells(a_paths), _cells(b_paths)
    la, lb = labels
    lines = [f"Command: `{command}`", "",
             f"| dataset | split | method | RMSE {la} | RMSE {lb} | relative difference | seconds {la} "
             f"| seconds {lb} | version {la} | version {lb} |", "|---|---|---|---|---|---|---|---|---|---|"]
    buckets, floor_moved, noise_known = Counter(), 0, 0
    for key in sorted(a.keys() & b.keys()):
        x, y = float(a[key]["rmse"]), float(b[key]["rmse"])
        rel = abs(x - y) / x
        bucket = next((f"< {t:g}" for t in BUCKETS if rel < t), f"≥ {BUCKETS[-1]:g}")
        buckets[bucket] += 1
        ended = [ended_at_noise_floor(a[key]), ended_at_noise_floor(b[key])]
        floor = any(ended)
        floor_moved += floor and rel >= BUCKETS[-1]
        noise_known += ended != [None, None] and rel >= BUCKETS[-1]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {x:.6f} | {y:.6f} | {rel:.1e}{' (σ² at floor)' if floor else ''} "
                     f"| {float(a[key]['train_seconds']):.1f} | {float(b[key]['train_seconds']):.1f} "
                     f"| {a[key].get('version', '')} | {b[key].get('version', '')} |")
    total = sum(buckets.values())
    order = [f"< {t:g}" for t in BUCKETS] + [f"≥ {BUCKETS[-1]:g}"]
    lines += ["", f"{total} cells in both; relative difference of the RMSEs "
              + ", ".join(f"{name}: {buckets[name]}" for name in order)
              + (f"; of the {buckets[order[-1]]} at ≥ {BUCKETS[-1]:g}, {floor_moved} ended with σ² at its floor "
                 f"in one of the runs (σ² recorded for {noise_known} of them)" if noise_known else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", nargs="+", required=True, help="the first run's results CSVs")
    parser.add_argument("--b", nargs="+", required=True, help="the second run's results CSVs")
    parser.add_argument("--labels", nargs=2, default=["A", "B"], metavar=("A", "B"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    missing = [path for path in args.a + args.b if not os.path.isfile(path)]
    if missing:  # read_rows reads a missing file as no rows: the comparison would be silently empty
        parser.error(f"no such results file: {', '.join(missing)}")
    command = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    text = render(args.a, args.b, tuple(args.labels), command)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
