"""Float32 features with float64 statistics against float64 throughout: loss and gradient error, and time.

For each dataset a float64 FSARD model (M frequencies, D = 2M) is evaluated after one
L-BFGS iteration from its default hyperparameters and after a short float64 fit; at each point the streamed
loss and gradient of float32 features are compared with float64's:

* ``widened``: each chunk's features widened to float64 before any product;
* ``blocks of k``: ΦᵀΦ and Φᵀr by float32 products over blocks of k rows, summed in
  float64, the backward's Φ(Ā + Āᵀ) in float32 (:mod:`alacarte._mixed_precision`);
* ``float32``: float32 statistics (everything in float32).

Usage::

    python experiments/mixed_precision.py [--datasets kin40k energy yacht se1] [--threads 1]
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alacarte  # noqa: E402
import alacarte._mixed_precision as mixed  # noqa: E402
from alacarte import FeatureGP, FSARDKernel, load_uci  # noqa: E402
from alacarte.datasets import make_se1  # noqa: E402
from alacarte.streaming import ChunkedData, streamed_negative_mll  # noqa: E402
from _timing import load_average, sample_times, spread  # noqa: E402

BLOCKS = (128, 256, 512, 1024)


def data(name: str, directory: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "se1":
        x, y, _ = make_se1(4000, seed=0)
        return x, y
    split = load_uci(name, 0, directory)
    return split.x_train, split.y_train


def loss_and_gradient(model, data_) -> tuple[float, torch.Tensor]:
    model.zero_grad()
    loss = float(streamed_negative_mll(model, data_))
    return loss, torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.requires_grad])


def variants(model64, x, y):
    """(name, function evaluating loss and gradient) of every arithmetic compared."""
    model32 = copy.deepcopy(model64).float()
    wide = ChunkedData(x, y, statistics_dtype=torch.float64)

    def widened():
        mixed_path = mixed.float32_products
        mixed.float32_products = lambda *args: False  # features widened, as below MIN_NOISE
        try:
            return loss_and_gradient(model32, wide)
        finally:
            mixed.float32_products = mixed_path

    def blocks(k):
        def run():
            default, mixed.BLOCK_ROWS = mixed.BLOCK_ROWS, k
            try:
                return loss_and_gradient(model32, wide)
            finally:
                mixed.BLOCK_ROWS = default
        return run

    return ([("float64", lambda: loss_and_gradient(model64, ChunkedData(x, y))), ("widened", widened)]
            + [(f"blocks of {k}", blocks(k)) for k in BLOCKS]
            + [("float32", lambda: loss_and_gradient(model32, ChunkedData(x, y)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("ALACARTE_DATA", os.path.join("..", "shared", "uci")))
    parser.add_argument("--datasets", nargs="+", default=["kin40k", "energy", "yacht", "se1"])
    parser.add_argument("--num-samples", type=int, default=512)
    parser.add_argument("--fit-iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="timed evaluations per variant (kin40k only)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "mixed_precision.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    lines, timing, verdicts = [], [], []
    for name in args.datasets:
        x, y = data(name, args.data)
        n, d = x.shape
        model = FeatureGP(None, None, FSARDKernel(d, args.num_samples, ard_num_dims=d, seed=0)).double()
        alacarte.fit(model, x, y, restarts=0, max_iter=1, progress=False, validation_fraction=0)
        points = [("after 1 L-BFGS iteration", copy.deepcopy(model))]
        alacarte.fit(model, x, y, restarts=0, max_iter=args.fit_iterations, progress=False, validation_fraction=0)
        points.append((f"after {args.fit_iterations} L-BFGS iterations", model))
        for where, point in points:
            noise = float(point.likelihood.noise)
            results = [(label, run()) for label, run in variants(point, x, y)]
            loss64, grad64 = results[0][1]
            for label, (loss, grad) in results[1:]:
                error = abs(loss - loss64) / abs(loss64)
                lines.append(f"| {name} | {n} | {where} | {noise:.2g} | {label} | {error:.1e} "
                             f"| {float((grad - grad64).norm() / grad64.norm()):.1e} |")
                if label == f"blocks of {mixed.BLOCK_ROWS}":
                    verdicts.append(f"{name} {where} (σ² = {noise:.2g}): {error:.1e} "
                                    f"{'within' if error <= 1e-6 else 'not within'} 1e-6")
            print("\n".join(lines[-len(results) + 1:]), flush=True)
        if name == "kin40k":
            runs = variants(model, x, y)
            before = load_average()
            samples = sample_times([run for _, run in runs], args.repeats)
            after = load_average()
            for (label, _), ts in zip(runs, samples):
                ratio = np.median(ts) / np.median(samples[0])
                timing.append(f"| {label} | {np.median(ts):.2f} | {spread(ts, digits=2)} | {ratio:.2f}× |")
            timing.append(f"\nLoad average (1 min) before and after: {before}, {after} (2 cores; other jobs ran).")
            print("\n".join(timing), flush=True)

    report = [
        "# Float32 features with float64 statistics: error against float64",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}. "
        f"FSARD, M = {args.num_samples} frequencies (D = {2 * args.num_samples}), streamed with the default memory "
        "budget, σ² and the other hyperparameters those of a float64 model (one L-BFGS iteration from the defaults, "
        "then a short float64 fit; no held-out rows). Relative error of the loss and of "
        "the gradient's norm-wise difference against float64 streamed at the same hyperparameters.",
        "",
        "| dataset | n | point | σ² | arithmetic | loss rel. error | gradient rel. error |",
        "|---|---:|---|---:|---|---:|---:|",
        *lines,
        "",
        f"The default block ({mixed.BLOCK_ROWS} rows), loss: " + "; ".join(verdicts) + ".",
    ]
    if timing:
        report += ["", f"Time of one streamed loss + gradient on kin40k (fitted point), seconds, {args.repeats} "
                   "round-robin repeats:", "", "| arithmetic | median | min–max | vs float64 |", "|---|---:|---:|---:|",
                   *timing]
    text = "\n".join(report) + "\n"
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
