"""What each noisy copy of z₁ and z₂ is worth on SE3 to the kernel itself (docs/variable_selection.md).

    python experiments/se3_copies.py OUT.jsonl --n 2000 --reps 0,1,2 [--models exact,rbf128,fsard128]
    python experiments/se3_copies.py OUT.jsonl --report

SE3's relevant inputs are five noisy copies (noise 0.1) of each of z₁ and z₂.  On the selection
benchmark's split (``n`` training rows of replication ``rep``), the exact ARD GP is fitted by
marginal likelihood on all rows (``fit``'s restarts, no held-out rows) on k copies of each for
k = 1 … 5, and on the two copies' means (the inputs' sufficient summary, which no ARD weighting of
the copies reproduces: the kernel sums the copies' squared distances instead of averaging them).
``nll``: the total negative log marginal likelihood (nats, standardised targets): the evidence for
the k-th copy is the drop from k − 1 to k.  Test RMSE, NLPD and 95% coverage on the benchmark's test
rows.  ``--models``: ``exact`` (the exact ARD GP), ``rbfM`` (Fastfood RBF/ARD, M frequencies: what D = 2M
features of the same kernel see of the copies) and ``fsardM`` (FSARD, radii learned, as the selection
benchmark's ``gp-simplex-*`` fits, without the simplex).  One JSON line per fit, appended; a finished
(rep, n, design, model) is skipped on a rerun.  One thread.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from _jsonl_rows import append_row, read_rows  # noqa: E402
from selection_benchmark import split  # noqa: E402


def _designs():
    """(name, function of x giving the model's inputs)."""
    for k in range(1, 6):
        cols = list(range(k)) + list(range(5, 5 + k))
        yield f"{k} copies", lambda x, cols=cols: x[:, cols]
    yield "means", lambda x: np.stack([x[:, :5].mean(1), x[:, 5:10].mean(1)], axis=1)


def _model(name: str, d: int, seed: int):
    if name == "exact":
        return ac.ExactRBFGP(None, None, num_dims=d, ard=True).double()
    for prefix, kernel_class in (("rbf", ac.FastfoodRBFKernel), ("fsard", ac.FSARDKernel)):
        if name.startswith(prefix):
            kernel = kernel_class(d, int(name[len(prefix):]), ard_num_dims=d, seed=seed)
            return ac.FeatureGP(None, None, kernel).double()
    raise ValueError(f"unknown model {name!r}")


def run(out: Path, reps: list[int], n: int, models: list[str]) -> None:
    done = {(r["rep"], r["n"], r["design"], r["model"]) for r in read_rows(out)}
    for rep in reps:
        ((x, y), _, (xt, yt)), _, seed = split("se3", n, rep)
        for (name, inputs), model_name in itertools.product(_designs(), models):
            if (rep, n, name, model_name) in done:
                continue
            train, test = inputs(x), inputs(xt)
            torch.manual_seed(seed)
            model = _model(model_name, train.shape[1], seed)
            start = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = ac.fit(model, train, y, progress=False, seed=seed, validation_fraction=0)
            pred = model.predict(test)
            scores = predictive_scores(pred.mean, pred.observed_variance, torch.as_tensor(yt))
            row = dict(rep=rep, n=n, design=name, model=model_name, nll=round(history.final_loss * n, 1),
                       rmse=round(scores["rmse"], 4), nlpd=round(scores["nlpd"], 3),
                       coverage95=round(scores["coverage95"], 3),
                       cpu_seconds=round(time.process_time() - start, 1))
            append_row(out, row)
            print(row, flush=True)


def report(out: Path) -> None:
    """Per model and design, over the replications: the mean total nll, the evidence the last copy
    pair added (the drop of nll from k − 1 to k copies), test RMSE, NLPD and 95% coverage."""
    rows = read_rows(out)
    print("| model | design | reps | nll (nats) | drop from one pair fewer | RMSE | NLPD | cov. 95% |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    names = [name for name, _ in _designs()]
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {name: [r for r in rows if r["model"] == model and r["design"] == name] for name in names}
        for k, name in enumerate(names):
            cells = by[name]
            if not cells:
                continue
            reps = {r["rep"] for r in cells}
            drop = ""
            if 0 < k < 5 and {r["rep"] for r in by[names[k - 1]]} >= reps:
                before = {r["rep"]: r["nll"] for r in by[names[k - 1]]}
                drop = f"{np.mean([before[r['rep']] - r['nll'] for r in cells]):.0f}"
            mean = {key: np.mean([r[key] for r in cells]) for key in ("nll", "rmse", "nlpd", "coverage95")}
            print(f"| {model} | {name} | {len(reps)} | {mean['nll']:.0f} | {drop} | {mean['rmse']:.4f} | "
                  f"{mean['nlpd']:.3f} | {mean['coverage95']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--reps", default="0", help="replications, comma-separated")
    parser.add_argument("--models", default="exact", help="comma-separated: exact, rbfM, fsardM")
    parser.add_argument("--report", action="store_true", help="print the table of OUT's rows instead")
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    torch.set_num_threads(1)
    run(args.out, [int(r) for r in args.reps.split(",")], args.n, args.models.split(","))


if __name__ == "__main__":
    main()
