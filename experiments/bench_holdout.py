"""What held-out rows cost a fit: the demo's FSARD fit with ``validation_fraction="auto"`` and 0.

The two settings are timed round-robin in one process (CPU seconds of this process, one torch
thread, so that other load on the machine shifts both alike); every round appends a JSON line.
To compare two versions of the package, run the script alternately under each tree's
``PYTHONPATH`` with ``--label``, writing to the same file, and report:

    for i in 1 2 3; do
      PYTHONPATH=/path/old python experiments/bench_holdout.py run --label old --out results.jsonl
      PYTHONPATH=/path/new python experiments/bench_holdout.py run --label new --out results.jsonl
    done
    python experiments/bench_holdout.py report results.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from alacarte import fit  # noqa: E402
from alacarte.demo import demo_data  # noqa: E402
from alacarte.factory import make_model  # noqa: E402
from _jsonl_rows import append_row  # noqa: E402  (experiments/, the script's own folder)

SETTINGS = {"held out (auto)": "auto", "paper protocol (0)": 0.0}


def one_fit(data: dict, fraction) -> dict:
    model = make_model("fsard", 3, num_samples=96, seed=0)
    start = time.process_time()
    history = fit(model, data["x"], data["y"], max_iter=40, seed=0, progress=False, validation_fraction=fraction)
    return {"cpu_seconds": time.process_time() - start, "iterations": history.iterations,
            "loss": history.loss[-1] if history.loss else None}


def run(args) -> None:
    torch.set_num_threads(1)
    data = demo_data(8000, 2000, 0)
    for name, fraction in SETTINGS.items():
        row = {"label": args.label, "setting": name, "threads": torch.get_num_threads(),
               "load_average": os.getloadavg()[0], **one_fit(data, fraction)}
        append_row(args.out, row)
        print(row, flush=True)


def report(args) -> None:
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    print("| version | setting | rounds | CPU s, median | min–max | iterations |")
    print("|---|---|---:|---:|---|---:|")
    for label in dict.fromkeys(r["label"] for r in rows):
        for setting in SETTINGS:
            cell = [r for r in rows if r["label"] == label and r["setting"] == setting]
            if cell:
                seconds = [r["cpu_seconds"] for r in cell]
                print(f"| {label} | {setting} | {len(cell)} | {statistics.median(seconds):.1f} | "
                      f"{min(seconds):.1f}–{max(seconds):.1f} | {cell[0]['iterations']} |")
    loads = [r["load_average"] for r in rows]
    print(f"\nOne torch thread; load average {min(loads):.1f}–{max(loads):.1f} during the rounds.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--label", required=True)
    go.add_argument("--out", required=True)
    show = sub.add_parser("report")
    show.add_argument("results")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
