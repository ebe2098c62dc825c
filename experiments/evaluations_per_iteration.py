"""Likelihood evaluations per L-BFGS iteration on real fits (issue 50's first goal: ≤ 1.15).

Fits each (dataset, kernel) on UCI split 0 with ``alacarte.fit``'s defaults (restarts, held-out rows),
counting every evaluation of the likelihood (``Optimization._loss``) and every iteration of every
optimisation — restarts, the final one and the noise refit — and appends one JSON line per fit, with
``by_optimisation``: [iterations, evaluations] of each optimisation in the order they ran, and
``line_searches``: the iterations that took more than one evaluation, as [optimisation, iteration,
evaluations], ``lowest``: the lowest loss each optimisation evaluated, ``trace``: [optimisation, loss] of
every evaluation in order, and the test scores.

``--line-search armijo`` replaces torch's strong-Wolfe search by one that accepts the first step with
sufficient decrease (backtracking by safeguarded quadratic interpolation): the search that never
extrapolates, to see whether the strong-Wolfe search's extra evaluations buy progress.

    python experiments/evaluations_per_iteration.py --out experiments/results/evaluations_per_iteration.jsonl \
        --datasets pol kin40k --kernels fsard gm --num-samples 256
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.optim.lbfgs as torch_lbfgs

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac
from alacarte.bench.scores import predictive_scores
from alacarte.bench.settings import package_version
from alacarte.factory import make_model
from alacarte.training import _optimization as optimization

from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)


class Counter:
    """Counts Optimization._loss and Optimization._iterate calls while installed, per optimisation."""

    def __init__(self):
        self.evaluations = self.iterations = 0
        self.by_optimisation: list[list[int]] = []  # [iterations, evaluations] per Optimization, in order
        self.lowest: list[float] = []  # the lowest loss each Optimization evaluated
        self.trace: list[list] = []  # [Optimization, loss] of every evaluation
        self.line_searches: list[list[int]] = []
        self._loss, self._iterate = optimization.Optimization._loss, optimization.Optimization._iterate

    def __enter__(self):
        counter = self

        def loss(opt, backward):
            counter.evaluations += 1
            value = counter._loss(opt, backward)
            if hasattr(opt, "counted_as"):
                counter.lowest[opt.counted_as] = min(counter.lowest[opt.counted_as], float(value))
                counter.trace.append([opt.counted_as, round(float(value), 6)])
            return value

        def iterate(opt):
            counter.iterations += 1
            if not hasattr(opt, "counted_as"):  # (an id() could be reused once an optimisation is freed)
                opt.counted_as = len(counter.by_optimisation)
                counter.by_optimisation.append([0, 0])
                counter.lowest.append(float("inf"))
            before = counter.evaluations
            result = counter._iterate(opt)
            spent = counter.evaluations - before
            tally = counter.by_optimisation[opt.counted_as]
            tally[0], tally[1] = tally[0] + 1, tally[1] + spent
            if spent > 1:
                counter.line_searches.append([opt.counted_as, opt.iteration, spent])
            return result

        optimization.Optimization._loss, optimization.Optimization._iterate = loss, iterate
        return self

    def __exit__(self, *exc):
        optimization.Optimization._loss, optimization.Optimization._iterate = self._loss, self._iterate


def first_sufficient_decrease(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's ``_strong_wolfe`` signature, without its curvature condition: the first step t (halved at
    least, cut to a tenth at most, by the quadratic through f, f'(0) and f(t)) with f(t) ≤ f + c1·t·f'(0)."""
    evaluations = 0
    while True:
        f_new, g_new = obj_func(x, t, d)
        evaluations += 1
        if f_new <= f + c1 * t * gtd or evaluations >= max_ls:
            return f_new, g_new, t, evaluations
        curvature = 2 * (f_new - f - gtd * t)
        minimiser = -gtd * t * t / curvature if curvature > 0 else 0.5 * t
        t = min(max(minimiser, 0.1 * t), 0.5 * t)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", default=["pol", "kin40k"])
    parser.add_argument("--kernels", nargs="+", default=["fsard", "gm"])
    parser.add_argument("--num-samples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    parser.add_argument("--line-search", choices=["strong-wolfe", "armijo"], default="strong-wolfe")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.line_search == "armijo":
        torch_lbfgs._strong_wolfe = first_sufficient_decrease
    done = {(r["dataset"], r["kernel"], r.get("line_search", "strong-wolfe"), r["num_features"])
            for r in read_rows(args.out)}
    for dataset in args.datasets:
        data = ac.load_uci(dataset, 0, args.data)
        for kernel in args.kernels:
            if (dataset, kernel, args.line_search, 2 * args.num_samples) in done:
                continue
            model = make_model(kernel, data.x_train.shape[1], num_samples=args.num_samples, seed=0).double()
            start = time.perf_counter()
            with Counter() as counted, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = ac.fit(model, data.x_train, data.y_train, seed=0, progress=False)
            seconds = time.perf_counter() - start
            predictive = model.predict(data.x_test)
            scores = predictive_scores(predictive.mean.detach(), predictive.observed_variance.detach(),
                                       torch.as_tensor(data.y_test))
            row = {"dataset": dataset, "kernel": kernel, "num_features": 2 * args.num_samples,
                   "line_search": args.line_search,
                   "evaluations": counted.evaluations, "iterations": counted.iterations,
                   "per_iteration": round(counted.evaluations / counted.iterations, 3),
                   "final_iterations": history.iterations,
                   "by_optimisation": counted.by_optimisation,
                   "line_searches": counted.line_searches, "lowest": counted.lowest, "trace": counted.trace,
                   **scores,
                   "seconds": round(seconds, 1),
                   "threads": torch.get_num_threads(), "version": package_version()}
            append_row(args.out, row)
            print(row, flush=True)


if __name__ == "__main__":
    main()
