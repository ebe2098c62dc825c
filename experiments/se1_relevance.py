"""Why the simplex-ARD GP drops x₁ and x₃ on SE1 (docs/variable_selection.md).

    python experiments/se1_relevance.py subsets OUT.jsonl --reps 2
    python experiments/se1_relevance.py reentry OUT.jsonl --reps 0

``subsets``: plain FSARD (ARD, all rows, no held-out rows) on the columns {x₇, x₈, x₉} and on
{x₁, x₃, x₇, x₈, x₉} of a fresh SE1 draw (n = 10 000, 1 000 test rows), at the settings of
``selection_benchmark.py``: does the marginal likelihood want x₁ and x₃?  ``reentry``: the
benchmark's simplex fit and ``select_inputs`` on its replication, then every zeroed input re-entered
at weight 1/(4d), refitted (100 iterations) and selected again.  One JSON line per fit, appended;
``loss`` is the negative log marginal likelihood per row (``subsets``) or in total (``reentry``),
in standardised units.  One thread.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import alacarte as ac  # noqa: E402
from alacarte.datasets import make_se1  # noqa: E402
from alacarte.selection.evidence import select_inputs  # noqa: E402
from _jsonl_rows import append_row  # noqa: E402  (experiments/, the script's own folder)
from selection_benchmark import gp_settings, split  # noqa: E402

N = 10000


def _fit(model, x, y, seed, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ac.fit(model, x, y, progress=False, seed=seed, **options)


def subsets(out, reps: int) -> None:
    for rep in range(reps):
        seed = N + 7919 * rep
        x, y, _ = make_se1(N, seed=seed)
        xt, yt, _ = make_se1(1000, seed=seed + 1)
        for cols in ([6, 7, 8], [0, 2, 6, 7, 8]):
            torch.manual_seed(seed)
            s = gp_settings(N, len(cols))
            kernel = ac.FSARDKernel(len(cols), s["num_samples"], ard_num_dims=len(cols), seed=seed).double()
            model = ac.FeatureGP(None, None, kernel).double()
            start = time.time()
            history = _fit(model, x[:, cols], y, seed, max_iter=s["max_iter"], restarts=s["restarts"],
                           restart_iter=10, validation_fraction=0)
            pred = model.predict(xt[:, cols], mean_only=True).mean.numpy()
            _write(out, dict(rep=rep, cols=cols, loss=history.final_loss, rmse=float(np.sqrt(np.mean((pred - yt) ** 2))),
                             seconds=round(time.time() - start, 1), num_samples=s["num_samples"],
                             relevance=[round(float(v), 4) for v in kernel.relevance]))


def reentry(out, reps: list[int]) -> None:
    for rep in reps:
        (train, _, test), _, seed = split("se1", N, rep)
        x, y = train
        d = x.shape[1]
        torch.manual_seed(seed)
        s = gp_settings(N, d)
        kernel = ac.FSARDKernel(d, s["num_samples"], ard_num_dims=d, seed=seed, simplex=True).double()
        model = ac.FeatureGP(None, None, kernel).double()
        start = time.time()

        def stage(name, history):
            pred = model.predict(test[0], mean_only=True).mean.numpy()
            _write(out, dict(rep=rep, stage=name, selected=kernel.selected().tolist(),
                             rmse=float(np.sqrt(np.mean((pred - test[1]) ** 2))), loss=float(history.final_loss) * N,
                             relevance=[round(float(v), 4) for v in kernel.relevance],
                             seconds=round(time.time() - start, 1)))

        _fit(model, x, y, seed, max_iter=s["max_iter"], restarts=s["restarts"], restart_iter=10)
        select_inputs(model, x, y, seed=seed)
        stage("benchmark", _fit(model, x, y, seed, max_iter=1, restarts=0))  # (its loss at the selection)
        with torch.no_grad():
            zero = ~kernel.simplex_mask.reshape(-1).clone()
            kernel.simplex_mask.fill_(True)
            pi = kernel.simplex_weights.detach().clone()
            pi.reshape(-1)[zero] = 0.25 / d
            kernel.simplex_weights.copy_(pi / pi.sum())
        stage("re-entered, refitted", _fit(model, x, y, seed, max_iter=100, restarts=0))
        select_inputs(model, x, y, seed=seed)
        stage("re-entered, selected", _fit(model, x, y, seed, max_iter=1, restarts=0))


def _write(out: Path, row: dict) -> None:
    append_row(out, row)
    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["subsets", "reentry"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", default="2", help="subsets: how many; reentry: which, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "subsets":
        subsets(args.out, int(args.reps))
    else:
        reentry(args.out, [int(r) for r in args.reps.split(",")])


if __name__ == "__main__":
    main()
