"""DerivativeSelector benchmark: its iteration against eq. 14–17 of Rosasco et al. computed as printed.

The selector carries f's values and derivatives at the data (Kα + Zβ, Zᵀα + Lβ) and L v along the
iteration, so each inner step takes one product with the (nd)² matrix L and each outer step none; the
printed form takes two per inner step and three per outer step (tests/derivative_reference.py).  Both
run the paper's f1 at n training points (d = 6) with the settings of experiments/selection_rffnet.py
(γ = 0.3 on standardised inputs, μ = 1e-4, tol = 1e-5·std(y), max_iter = 2000, max_inner_iter = 300)
and τ = 0.01·std(y)/√3, one thread.  Reported: seconds of each (best of ``--repeats``), the ratio,
both iteration counts (they must agree) and the largest difference of the coefficients relative to
their largest magnitude.

    python experiments/bench_derivative.py [--sizes 80 200 400] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

# torch reads it at its first allocation, which importing it (or alacarte) makes: set later, as the
# import of bench_features below did, it is reported in the table's Machine line but not in effect
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from alacarte.datasets import make_rosasco  # noqa: E402
from alacarte.selection import DerivativeSelector  # noqa: E402
from derivative_reference import paper_iteration  # noqa: E402

sys.path.insert(0, HERE)
from bench_features import machine  # noqa: E402


def best_time(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[80, 200, 400])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "derivative_selector.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        f"Command: `python experiments/bench_derivative.py --sizes {' '.join(map(str, args.sizes))} "
        f"--repeats {args.repeats}`",
        "",
        f"Machine: {machine()}",
        "",
        "| n | nd | printed eq. 14–17 (s) | DerivativeSelector (s) | speed-up | outer / inner iterations "
        "(both) | max coefficient difference / max coefficient |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in args.sizes:
        x, y, _ = make_rosasco("f1", n, seed=0)
        scale = float(y.std())
        params = dict(tau=0.01 * scale / np.sqrt(3), mu=1e-4, gamma=0.3, tol=1e-5 * scale, max_iter=2000,
                      max_inner_iter=300)
        z = torch.from_numpy((x - x.mean(0)) / x.std(0))
        yc = torch.from_numpy(y - y.mean())
        ref_seconds, (alpha, beta, outer, inner) = best_time(lambda: paper_iteration(z, yc, **params), args.repeats)

        def fit():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return DerivativeSelector(refit=False, **params).fit(x, y)

        seconds, model = best_time(fit, args.repeats)
        if (model.n_iter_, model.n_inner_iter_) != (outer, inner):
            raise SystemExit(f"n={n}: iteration counts differ: {(model.n_iter_, model.n_inner_iter_)} vs {(outer, inner)}")
        coefs = np.concatenate([alpha.numpy(), beta.numpy()])
        ours = np.concatenate([model.dual_coef_, model.derivative_coef_.T.reshape(-1)])
        difference = np.abs(ours - coefs).max() / np.abs(coefs).max()
        lines.append(f"| {n} | {n * x.shape[1]} | {ref_seconds:.2f} | {seconds:.2f} | {ref_seconds / seconds:.2f} | "
                     f"{outer} / {inner} | {difference:.1e} |")
        print(lines[-1], flush=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
