"""A whole default fit, old code beside new: time, test RMSE, NLPD and coverage (issue 50, item 3).

    python experiments/time_to_accuracy.py run --out OUT.jsonl --trees old=/path/old new=/path/new \
        --datasets pol kin40k --kernels fsard gm --num-samples 256 --rounds 1
    python experiments/time_to_accuracy.py report OUT.jsonl

``--pilot NAME=M``: the tree NAME fits by ``alacarte.fit_pilot`` instead, its model with M frequencies
(D = 2M) on every row; its rows are reported in the cell of the reference's D.  The CPU seconds then
include the posterior on every row (one prediction inside the clock), for every tree of the run.

Each tree is a source snapshot of the package (e.g. ``git archive <commit>`` unpacked); every fit runs in
a fresh process with that tree first on ``sys.path``, one thread, ``alacarte.fit``'s defaults on UCI
split 0 (seed 0).  The trees take turns within each (round, dataset, kernel) cell, so a change of load
hits both; the CPU seconds are the fit's process time.  One JSON line per fit, appended as it finishes:
a killed run resumes.  Data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

from alacarte.bench.scores import predictive_scores  # noqa: E402

WORKER = r"""
import json, sys, time, warnings
import torch
torch.set_num_threads(1)
import numpy as np
import alacarte as ac
from alacarte.factory import make_model
dataset, kernel, num_samples, predictions = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pilot, posterior = int(sys.argv[5]), sys.argv[6] == "1"
data = ac.load_uci(dataset, 0, None)
model = make_model(kernel, data.x_train.shape[1], num_samples=pilot or num_samples, seed=0).double()
start = time.process_time()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    if pilot:
        history = ac.fit_pilot(model, data.x_train, data.y_train, seed=0, progress=False)
    else:
        history = ac.fit(model, data.x_train, data.y_train, seed=0, progress=False)
    if posterior:
        model.predict(data.x_test[:1])
seconds = time.process_time() - start
pred = model.predict(data.x_test)
np.savez(predictions, mean=pred.mean.detach().numpy(), variance=pred.observed_variance.detach().numpy(),
         y=np.asarray(data.y_test))
print(json.dumps({"cpu_seconds": round(seconds, 1), "iterations": history.iterations}))
"""


def fit_in(tree: str, dataset: str, kernel: str, num_samples: int, pilot: int = 0, posterior: bool = False) -> dict:
    """Fit in a fresh process on ``tree``; its test predictions are scored here, by this tree's
    :func:`predictive_scores`, so that trees older than that function are scored alike."""
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as folder:
        predictions = os.path.join(folder, "predictions.npz")
        # In the tree's folder: ``python -c`` puts the working directory first on sys.path.
        done = subprocess.run([sys.executable, "-c", WORKER, dataset, kernel, str(num_samples), predictions,
                               str(pilot), str(int(posterior))],
                              env=env, cwd=tree, capture_output=True, text=True, check=True)
        with np.load(predictions) as p:
            scores = predictive_scores(*(torch.as_tensor(p[k]) for k in ("mean", "variance", "y")))
    return {**json.loads(done.stdout.strip().splitlines()[-1]), **scores}


def run(args) -> None:
    trees = dict(t.split("=", 1) for t in args.trees)
    pilots = {name: int(m) for name, m in (p.split("=", 1) for p in args.pilot)}
    done = {(r["round"], r["dataset"], r["kernel"], r["tree"]) for r in read_rows(args.out)}
    for round_ in range(args.rounds):
        for dataset in args.datasets:
            for kernel in args.kernels:
                # Alternate which tree goes first, so that neither always meets the same load.
                order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
                for name in order:
                    if (round_, dataset, kernel, name) in done:
                        continue
                    load = os.getloadavg()[0]
                    row = {"round": round_, "dataset": dataset, "kernel": kernel, "tree": name,
                           "num_features": 2 * args.num_samples, "pilot_samples": pilots.get(name, 0),
                           **fit_in(trees[name], dataset, kernel, args.num_samples, pilots.get(name, 0), bool(pilots)),
                           "load_average": round(load, 2)}
                    append_row(args.out, row)
                    print(row, flush=True)


def report(args) -> str:
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    cells = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["dataset"], r["kernel"], r["num_features"])][r["tree"]].append(r)
    trees = list(dict.fromkeys(r["tree"] for r in rows))
    out = ["| dataset | kernel | D | " + " | ".join(f"{t}: CPU s, RMSE, NLPD, cov 95%" for t in trees)
           + f" | time {trees[-1]} / {trees[0]} |", "|---|---|---:|" + "---|" * len(trees) + "---:|"]
    for (dataset, kernel, features), by_tree in cells.items():
        def cell(t):
            rs = by_tree.get(t, [])
            if not rs:
                return "—"
            mean = lambda key: float(np.mean([r[key] for r in rs]))  # noqa: E731
            return f"{mean('cpu_seconds'):.0f}, {mean('rmse'):.4g}, {mean('nlpd'):.3f}, {mean('coverage95'):.3f}"
        ratio = "—"
        if all(by_tree.get(t) for t in (trees[0], trees[-1])):
            ratio = (np.median([r["cpu_seconds"] for r in by_tree[trees[-1]]])
                     / np.median([r["cpu_seconds"] for r in by_tree[trees[0]]]))
            ratio = f"{ratio:.2f}"
        out.append(f"| {dataset} | {kernel} | {features} | " + " | ".join(cell(t) for t in trees) + f" | {ratio} |")
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--trees", nargs="+", required=True, help="name=path of each source tree, the reference first")
    r.add_argument("--datasets", nargs="+", default=["pol", "kin40k", "protein"])
    r.add_argument("--kernels", nargs="+", default=["fsard", "gm"])
    r.add_argument("--num-samples", type=int, default=256)
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--pilot", nargs="*", default=[], help="NAME=M: tree NAME fits by fit_pilot, its model with M frequencies")
    p = sub.add_parser("report")
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
