"""UCI benchmark: methods × datasets × splits, resumable, and a report beside the paper's Table 1.

Each cell (dataset, split, method) runs in its own process and appends one row
to the CSV under a file lock; re-running skips finished cells, so a killed run
resumes where it stopped.

    python experiments/uci_benchmark.py run --datasets yacht energy --methods gm pwl \
        --splits 0-9 --csv experiments/results/uci_small.csv
    python experiments/uci_benchmark.py report --csv experiments/results/uci_small.csv \
        --out experiments/results/uci_small.md
"""
from __future__ import annotations

import argparse
import csv
import fcntl
import math
import multiprocessing as mp
import os
import resource
import sys
import time
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

FIELDS = ["dataset", "split", "method", "rmse", "nlpd", "train_seconds", "peak_rss_mb", "n_train", "d",
          "num_features", "restarts", "max_iter", "seed", "version"]
METHODS = ("exact-rbf", "exact-ard", "fastfood-ard", "fsard", "fsgbard", "gm", "pwl", "ssgpr", "rks")
PAPER_COLUMNS = {"exact-rbf": "RBF", "exact-ard": "ARD", "fsard": "FSARD", "gm": "GM", "pwl": "PWL",
                 "fsgbard": "FSGBARD", "ssgpr": "SSGPR"}


def run_cell(cell: tuple) -> dict:
    """Fit one method on one split; the CSV row, or {"error": ...} (runs in a fresh process)."""
    try:
        return _run_cell(cell)
    except Exception as err:  # one failed cell must not stop the run; it is retried on re-run
        dataset, split, method, _ = cell
        return {"error": f"{dataset} split {split} {method}: {type(err).__name__}: {err}"}


def _run_cell(cell: tuple) -> dict:
    dataset, split, method, cfg = cell
    import torch

    import alacarte as ac
    from alacarte.factory import make_model

    torch.set_num_threads(cfg["threads"])
    torch.set_default_dtype(torch.float64)
    data = ac.load_uci(dataset, split, cfg["data"])
    d = data.x_train.shape[1]
    model = make_model(method, d, num_samples=cfg["num_samples"], num_components=cfg["components"], seed=split)
    history = ac.fit(model, data.x_train, data.y_train, max_iter=cfg["max_iter"], restarts=cfg["restarts"],
                     restart_iter=cfg["restart_iter"], seed=split, progress=False)
    pred = model.predict(data.x_test)
    y = torch.as_tensor(data.y_test)
    var = pred.observed_variance
    return {
        "dataset": dataset, "split": split, "method": method,
        "rmse": float((pred.mean - y).pow(2).mean().sqrt()),
        "nlpd": float((0.5 * ((y - pred.mean) ** 2 / var + var.log() + math.log(2 * math.pi))).mean()),
        "train_seconds": round(history.seconds, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "n_train": data.x_train.shape[0], "d": d,
        "num_features": 2 * cfg["num_samples"] if not method.startswith("exact") else 0,
        "restarts": cfg["restarts"], "max_iter": cfg["max_iter"], "seed": split, "version": ac.__version__,
    }


def append_row(path: str, row: dict) -> None:
    with open(path, "a", newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if fh.tell() == 0:
                csv.writer(fh).writerow(FIELDS)
            csv.DictWriter(fh, FIELDS).writerow(row)
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def parse_splits(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def run(args: argparse.Namespace) -> None:
    done = {(r["dataset"], int(r["split"]), r["method"]) for r in read_rows(args.csv)}
    cfg = {"data": args.data, "num_samples": args.num_samples, "components": args.components,
           "max_iter": args.max_iter, "restarts": args.restarts, "restart_iter": args.restart_iter,
           "threads": args.threads}
    cells = [(ds, s, m, cfg) for ds in args.datasets for s in parse_splits(args.splits) for m in args.methods
             if (ds, s, m) not in done]
    if args.limit is not None:
        cells = cells[: args.limit]
    print(f"{len(done)} cells done, {len(cells)} to run", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    start = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
        for i, row in enumerate(pool.imap_unordered(run_cell, cells), 1):
            if "error" in row:
                print(f"[{i}/{len(cells)} {time.time() - start:7.0f}s] FAILED {row['error']}", flush=True)
                continue
            append_row(args.csv, row)
            print(f"[{i}/{len(cells)} {time.time() - start:7.0f}s] {row['dataset']} split {row['split']} "
                  f"{row['method']}: RMSE {row['rmse']:.4g} ({row['train_seconds']:.1f}s)", flush=True)


def load_paper(path: str) -> dict:
    table = {}
    for r in read_rows(path):
        table[(r["dataset"], r["method"])] = (float(r["rmse_mean"]), float(r["rmse_std"]))
    return table


def report(args: argparse.Namespace) -> None:
    rows = read_rows(args.csv)
    paper = load_paper(args.paper)
    results = defaultdict(list)
    seconds = defaultdict(list)
    for r in rows:
        results[(r["dataset"], r["method"])].append(float(r["rmse"]))
        seconds[(r["dataset"], r["method"])].append(float(r["train_seconds"]))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = [m for m in METHODS if any((ds, m) in results for ds in datasets)]
    lines = [f"Command: `{args.command}`" if args.command else "", "",
             "Test RMSE, mean ± std over splits (number of splits in brackets when fewer than 10); "
             "**bold** = best of ours per dataset; paper = À la carte Table 1.", ""]
    header = "| dataset | " + " | ".join(f"{m} (ours)" for m in methods) + " | " + \
        " | ".join(f"{PAPER_COLUMNS[m]} (paper)" for m in methods if m in PAPER_COLUMNS) + " |"
    lines += [header, "|" + "---|" * (1 + len(methods) + sum(m in PAPER_COLUMNS for m in methods))]
    for ds in datasets:
        means = {m: np.mean(results[(ds, m)]) for m in methods if results[(ds, m)]}
        best = min(means, key=means.get)
        cells = []
        for m in methods:
            v = results[(ds, m)]
            if not v:
                cells.append("—")
                continue
            text = f"{np.mean(v):.3g} ± {np.std(v):.2g}" + (f" [{len(v)}]" if len(v) < 10 else "")
            cells.append(f"**{text}**" if m == best else text)
        for m in methods:
            if m in PAPER_COLUMNS:
                p = paper.get((ds, PAPER_COLUMNS[m]))
                cells.append(f"{p[0]:.3g} ± {p[1]:.2g}" if p else "—")
        lines.append(f"| {ds} | " + " | ".join(cells) + " |")
    lines += ["", "Ours vs the paper, same method: ratio of mean RMSE (≤ 1.05 = within 5% or better).", "",
              "| dataset | " + " | ".join(m for m in methods if m in PAPER_COLUMNS) + " |",
              "|" + "---|" * (1 + sum(m in PAPER_COLUMNS for m in methods))]
    for ds in datasets:
        cells = []
        for m in methods:
            if m in PAPER_COLUMNS:
                p = paper.get((ds, PAPER_COLUMNS[m]))
                cells.append(f"{np.mean(results[(ds, m)]) / p[0]:.2f}" if p and results[(ds, m)] else "—")
        lines.append(f"| {ds} | " + " | ".join(cells) + " |")
    lines += ["", "Mean training seconds per split (one process, threads as in the command):", "",
              "| dataset | " + " | ".join(methods) + " |", "|" + "---|" * (1 + len(methods))]
    for ds in datasets:
        lines.append(f"| {ds} | " + " | ".join(f"{np.mean(seconds[(ds, m)]):.1f}" if seconds[(ds, m)] else "—"
                                               for m in methods) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command_name", required=True)
    r = sub.add_parser("run")
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--methods", nargs="+", default=["exact-ard", "fastfood-ard", "fsard", "gm", "pwl"])
    r.add_argument("--splits", default="0-9")
    r.add_argument("--csv", required=True)
    r.add_argument("--data", default=os.environ.get("ALACARTE_DATA", os.path.join(HERE, "..", "..", "shared", "uci")))
    r.add_argument("--num-samples", type=int, default=256, help="frequencies M (D = 2M features) for every method")
    r.add_argument("--components", type=int, default=4, help="Q for GM, C for PWL")
    r.add_argument("--max-iter", type=int, default=100)
    r.add_argument("--restarts", type=int, default=5)
    r.add_argument("--restart-iter", type=int, default=15)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    r.add_argument("--limit", type=int, default=None, help="run at most this many cells (testing)")
    r.set_defaults(run=run)
    p = sub.add_parser("report")
    p.add_argument("--csv", required=True)
    p.add_argument("--paper", default=os.path.join(HERE, "paper_table1.csv"))
    p.add_argument("--out", default=None)
    p.add_argument("--command", default=None, help="the run command to quote in the report")
    p.set_defaults(run=report)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
