"""Why the simplex-ARD GP drops x₁ and x₃ on SE1 (docs/variable_selection.md).

    python experiments/se1_relevance.py subsets OUT.jsonl --reps 2
    python experiments/se1_relevance.py reentry OUT.jsonl --reps 0
    python experiments/se1_relevance.py scan OUT.jsonl --reps 0,1,2,3,4 --n 5000
    python experiments/se1_relevance.py fresh OUT.jsonl --reps 0,1,2,3,4 --n 5000 [--num-samples 512]
    python experiments/se1_relevance.py exact OUT.jsonl --reps 0 --n 2000 --sizes 128,512,1024
    python experiments/se1_relevance.py optimum OUT.jsonl --reps 0,1,3 --n 5000
    python experiments/se1_relevance.py restarts OUT.jsonl --reps 0 --n 5000

``subsets``: plain FSARD (ARD, all rows, no held-out rows) on the columns {x₇, x₈, x₉} and on
{x₁, x₃, x₇, x₈, x₉} of a fresh SE1 draw (n = 10 000, 1 000 test rows), at the settings of
``selection_benchmark.py``: does the marginal likelihood want x₁ and x₃?  ``reentry``: the
benchmark's simplex fit and ``select_inputs`` on its replication, then every zeroed input re-entered
at weight 1/(4d), refitted (100 iterations) and selected again.  One JSON line per fit, appended;
``loss`` is the negative log marginal likelihood per row (``subsets``) or in total (``reentry``),
in standardised units.  ``scan``: the benchmark's fit and ``select_inputs`` (``n`` rows), then the rise of
the marginal likelihood (``gains``, nats; negative: it falls) when one zeroed input, or x₁ and x₃ together
(``pair``), re-enters at ``q`` times the median fitted γ, nothing refitted.  ``fresh``: each input's cost
(``select_inputs``'s) on the fitted draw and its mean and standard deviation over 6 fresh feature draws
(``FeatureKernel.redrawn``), after the fit and after ``select_inputs``.  ``exact``: on the benchmark's
split (``n`` rows), the exact ARD GP and the Fastfood RBF feature GP with each of ``--sizes`` frequencies
(no learned radii: what its features lose is the kernel's, not a draw's), both by marginal likelihood
on all rows, on {x₇, x₈, x₉} and on {x₁, x₃, x₇, x₈, x₉}: the total negative log marginal
likelihood (``nll``, nats, standardised targets) says what x₁ and x₃ are worth to the kernel with
all its features and with D of them.  ``optimum``: ``gp-simplex-rbf``'s fit (before ``select_inputs``) on
the benchmark's replication, then the same fit moved to x₁ and x₃ at γ = 1.5 and refitted (150 iterations):
at each, γ, the total ``nll`` and every input's cost on the fitted draw, on ``select_inputs``' fresh draws
(mean) and under the exact kernel these parameters approximate (σ_f² exp(−½‖γ ⊙ (x − x′)‖²), the fitted σ²)
on ``--rows`` of the training rows.  ``restarts``: ``gp-simplex-exact`` with ``fit``'s own restarts (5 × 15
iterations) instead of the benchmark's 2 × 10: every restart's and the final total ``nll``, the chosen restart, γ,
then ``select_inputs(draws="exact")``'s selection and the test RMSE, NLPD and 95% coverage.  One thread.
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
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.datasets import make_se1  # noqa: E402
from alacarte.selection.evidence import (  # noqa: E402
    FRESH_DRAWS, ClosedFormEvidence, fresh_seeds, input_costs, select_inputs)
from alacarte.training import negative_mll  # noqa: E402
from _jsonl_rows import append_row  # noqa: E402  (experiments/, the script's own folder)
from selection_benchmark import RBF_SAMPLES, gp_settings, split  # noqa: E402

N = 10000


def _fit(model, x, y, seed, **options):
    options.setdefault("validation_fraction", 0)  # the evidence of all rows, as select_inputs reads it here
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
        select_inputs(model, x, y, seed=seed, draws=0, validation_fraction=0)
        stage("benchmark", _fit(model, x, y, seed, max_iter=1, restarts=0))  # (its loss at the selection)
        with torch.no_grad():
            zero = ~kernel.simplex_mask.reshape(-1).clone()
            kernel.simplex_mask.fill_(True)
            pi = kernel.simplex_weights.detach().clone()
            pi.reshape(-1)[zero] = 0.25 / d
            kernel.simplex_weights.copy_(pi / pi.sum())
        stage("re-entered, refitted", _fit(model, x, y, seed, max_iter=100, restarts=0))
        select_inputs(model, x, y, seed=seed, draws=0, validation_fraction=0)
        stage("re-entered, selected", _fit(model, x, y, seed, max_iter=1, restarts=0))


QS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2)


def _benchmark_model(n: int, rep: int, num_samples: int | None, kernel_class):
    """The benchmark's simplex GP for SE1's replication ``rep``, unfitted, with its split and seed."""
    parts, relevant, seed = split("se1", n, rep)
    d = parts[0][0].shape[1]
    torch.manual_seed(seed)
    kernel = kernel_class(d, num_samples or gp_settings(n, d)["num_samples"], ard_num_dims=d, seed=seed,
                          simplex=True).double()
    return ac.FeatureGP(None, None, kernel).double(), kernel, parts, relevant, seed


def _benchmark_fit(n: int, rep: int, num_samples: int | None = None, kernel_class=ac.FSARDKernel):
    """The benchmark's simplex fit of SE1's replication ``rep``."""
    model, kernel, ((x, y), _, _), _, seed = _benchmark_model(n, rep, num_samples, kernel_class)
    s = gp_settings(n, x.shape[1])
    _fit(model, x, y, seed, max_iter=s["max_iter"], restarts=s["restarts"], restart_iter=10)
    return model, kernel, x, y, seed


@torch.no_grad()
def _total_loss(model, kernel, gamma) -> float:
    kernel._set_simplex_gamma(gamma)
    x, y = model.train_inputs[0], model.train_targets
    with model.inference_settings():
        return float(negative_mll(model, x, y, backward=False)) * len(y)


def scan(out, reps: list[int], n: int) -> None:
    for rep in reps:
        model, kernel, x, y, seed = _benchmark_fit(n, rep)
        select_inputs(model, x, y, seed=seed, draws=0, validation_fraction=0)
        model.train()
        gamma = kernel.inverse_lengthscale().detach().clone()
        active = gamma.reshape(-1) > 0
        ref = float(gamma.reshape(-1)[active].median())
        base = _total_loss(model, kernel, gamma)

        def gains(inputs):
            rises = []
            for q in QS:
                trial = gamma.clone()
                trial[..., inputs] = q * ref
                rises.append(round(base - _total_loss(model, kernel, trial), 2))
            return rises

        row = dict(part="scan", n=n, rep=rep, selected=kernel.selected().tolist(), q=list(QS), median_gamma=ref,
                   gains={j: gains([j]) for j in torch.nonzero(~active).reshape(-1).tolist()}, pair=gains([0, 2]))
        _total_loss(model, kernel, gamma)
        _write(out, row)


def fresh(out, reps: list[int], n: int, num_samples: int | None) -> None:
    for rep in reps:
        model, kernel, x, y, seed = _benchmark_fit(n, rep, num_samples)
        seeds = [10**6 + 1000 * rep + k for k in range(6)]

        def costs():
            own, on_fresh = input_costs(model, kernel), [input_costs(model, kernel, [s]) for s in seeds]
            stacked = torch.stack(on_fresh)
            return {j: [round(float(own[j]), 1), round(float(stacked[:, j].mean()), 1),
                        round(float(stacked[:, j].std()), 1)] for j in kernel.selected().tolist()}

        after_fit = costs()
        select_inputs(model, x, y, seed=seed, draws=0, validation_fraction=0)
        _write(out, dict(part="fresh", n=n, rep=rep, num_samples=kernel.num_samples, after_fit=after_fit,
                         after_select=costs()))


def exact(out, reps: list[int], n: int, sizes: list[int]) -> None:
    for rep in reps:
        ((x, y), _, (xt, yt)), _, seed = split("se1", n, rep)
        for cols in ([6, 7, 8], [0, 2, 6, 7, 8]):
            d = len(cols)
            models = [("exact-ard", None, lambda: ac.ExactRBFGP(None, None, num_dims=d, ard=True))]
            models += [("rbf", m, lambda m=m: ac.FeatureGP(None, None, ac.FastfoodRBFKernel(
                d, m, ard_num_dims=d, seed=seed))) for m in sizes]
            for name, m, build in models:
                torch.manual_seed(seed)
                model = build().double()
                start = time.time()
                history = _fit(model, x[:, cols], y, seed)
                pred = model.predict(xt[:, cols], mean_only=True).mean.numpy()
                _write(out, dict(part="exact", n=n, rep=rep, model=name, num_samples=m, cols=cols,
                                 nll=history.final_loss * n, rmse=float(np.sqrt(np.mean((pred - yt) ** 2))),
                                 seconds=round(time.time() - start, 1)))


@torch.no_grad()
def _exact_costs(model, kernel, rows: int) -> list[float]:
    """Each input's cost (nats) under the exact kernel of the fitted γ, σ_f² and σ², on ``rows`` training rows
    drawn by this script (its committed rows were read on them; ``ClosedFormEvidence``'s own subsample is another)."""
    pick = torch.randperm(len(model.train_targets), generator=torch.Generator().manual_seed(0))[:rows]
    costs = ClosedFormEvidence(model, kernel, rows=pick).costs()
    return [round(float(c), 1) for c in costs]


def optimum(out, reps: list[int], n: int, rows: int) -> None:
    for rep in reps:
        model, kernel, x, y, seed = _benchmark_fit(n, rep, RBF_SAMPLES, ac.FastfoodRBFKernel)
        seeds = fresh_seeds(kernel, FRESH_DRAWS)
        for start in ("fit", "x1,x3 at 1.5"):
            if start != "fit":
                gamma = kernel.inverse_lengthscale().detach().clone()
                gamma[..., [0, 2]] = 1.5
                kernel._set_simplex_gamma(gamma)
                _fit(model, x, y, seed, max_iter=150, restarts=0)
            model.train()
            gamma = kernel.inverse_lengthscale().detach().clone()
            _write(out, dict(part="optimum", n=n, rep=rep, start=start,
                             gamma=[round(float(g), 3) for g in gamma.reshape(-1)],
                             nll=round(_total_loss(model, kernel, gamma), 1),
                             cost_fitted=[round(float(c), 1) for c in input_costs(model, kernel)],
                             cost_fresh=[round(float(c), 1) for c in input_costs(model, kernel, seeds)],
                             cost_exact=_exact_costs(model, kernel, rows), exact_rows=rows))


def restarts(out, reps: list[int], n: int) -> None:
    for rep in reps:
        start = time.perf_counter()
        model, kernel, ((x, y), _, (xt, yt)), relevant, seed = _benchmark_model(n, rep, RBF_SAMPLES,
                                                                                ac.FastfoodRBFKernel)
        history = _fit(model, x, y, seed, max_iter=gp_settings(n, x.shape[1])["max_iter"], restarts=5,
                       restart_iter=15)
        gamma = kernel.inverse_lengthscale().detach().reshape(-1)
        row = dict(part="restarts", n=n, rep=rep, restarts=5, restart_iter=15,
                   restart_nll=[round(loss * n, 1) for loss in history.restart_losses],
                   chosen=history.chosen_restart, nll=round(history.final_loss * n, 1),
                   gamma=[round(float(g), 3) for g in gamma])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            select_inputs(model, x, y, seed=seed, draws="exact", validation_fraction=0)
        prediction = model.predict(xt)
        scores = predictive_scores(prediction.mean, prediction.observed_variance, torch.as_tensor(yt))
        selected = kernel.selected().tolist()
        _write(out, dict(row, selected=selected, exact=selected == list(relevant), rmse=round(scores["rmse"], 4),
                         nlpd=round(scores["nlpd"], 3), coverage95=round(scores["coverage95"], 3),
                         seconds=round(time.perf_counter() - start)))


def _write(out: Path, row: dict) -> None:
    append_row(out, row)
    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["subsets", "reentry", "scan", "fresh", "exact", "optimum", "restarts"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", default="2", help="subsets: how many; the others: which, comma-separated")
    parser.add_argument("--n", type=int, default=N, help="scan, fresh: training rows (the benchmark's split)")
    parser.add_argument("--num-samples", type=int, default=None, help="fresh: D (default: the benchmark's)")
    parser.add_argument("--sizes", default="128,512,1024", help="exact: the feature GPs' frequencies, comma-separated")
    parser.add_argument("--rows", type=int, default=2000, help="optimum: the rows the exact kernel's costs are read on")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "subsets":
        subsets(args.out, int(args.reps))
        return
    reps = [int(r) for r in args.reps.split(",")]
    if args.part == "reentry":
        reentry(args.out, reps)
    elif args.part == "exact":
        exact(args.out, reps, args.n, [int(m) for m in args.sizes.split(",")])
    elif args.part == "scan":
        scan(args.out, reps, args.n)
    elif args.part == "optimum":
        optimum(args.out, reps, args.n, args.rows)
    elif args.part == "restarts":
        restarts(args.out, reps, args.n)
    else:
        fresh(args.out, reps, args.n, args.num_samples)


if __name__ == "__main__":
    main()
