"""The ``alacarte`` command line.

``alacarte demo`` — the main job on an embedded default: an FSARD feature GP
and an exact ARD GP fitted on the SE1 problem (MATH.md §8), compared on test
RMSE, NLPD and training time.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from .datasets import make_se1
from .kernels import FSARDKernel
from .models import ExactRBFGP, FeatureGP
from .training import fit


def _nlpd(pred, y: torch.Tensor) -> float:
    """Mean negative log predictive density of y under N(mean, observed variance)."""
    var = pred.observed_variance
    return float((0.5 * ((y - pred.mean) ** 2 / var + var.log() + math.log(2 * math.pi))).mean())


def _demo(args: argparse.Namespace) -> int:
    torch.set_default_dtype(torch.float64)
    x, y, _ = make_se1(args.n + args.n_test, seed=args.seed)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    x_train, y_train, x_test, y_test = x[: args.n], y[: args.n], x[args.n :], y[args.n :]
    d = x.shape[1]
    models = {
        f"FSARD feature GP (D = {2 * args.num_samples})": FeatureGP(
            None, None, FSARDKernel(d, args.num_samples, ard_num_dims=d, seed=args.seed)
        ),
        "exact ARD GP": ExactRBFGP(None, None, num_dims=d, ard=True),
    }
    rows = []
    for name, model in models.items():
        history = fit(model, x_train, y_train, max_iter=args.max_iter, seed=args.seed, progress=not args.quiet)
        start = time.perf_counter()
        pred = model.predict(x_test)
        predict_seconds = time.perf_counter() - start
        rows.append(
            {
                "model": name,
                "rmse": float((pred.mean - y_test).pow(2).mean().sqrt()),
                "nlpd": _nlpd(pred, y_test),
                "fit_seconds": history.seconds,
                "iterations": history.iterations,
                "predict_seconds": predict_seconds,
            }
        )
    if args.json:
        print(json.dumps({"dataset": "SE1", "n_train": args.n, "n_test": args.n_test, "results": rows}))
        return 0
    print(f"SE1 (d = {d}), {args.n} training and {args.n_test} test points, seed {args.seed}")
    print(f"{'model':<32} {'RMSE':>8} {'NLPD':>8} {'fit s':>8} {'iters':>6} {'predict s':>10}")
    for r in rows:
        print(
            f"{r['model']:<32} {r['rmse']:>8.4f} {r['nlpd']:>8.4f} {r['fit_seconds']:>8.2f} "
            f"{r['iterations']:>6d} {r['predict_seconds']:>10.3f}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alacarte", description="À la carte Gaussian-process kernels.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="FSARD feature GP vs exact ARD GP on the SE1 problem")
    demo.add_argument("--n", type=int, default=2000, help="training points (default 2000)")
    demo.add_argument("--n-test", type=int, default=1000, help="test points (default 1000)")
    demo.add_argument("--num-samples", type=int, default=256, help="frequencies M of the FSARD kernel")
    demo.add_argument("--max-iter", type=int, default=100, help="L-BFGS iterations per model")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    demo.add_argument("--json", action="store_true", help="print the results as JSON")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as err:
        print(f"alacarte: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
