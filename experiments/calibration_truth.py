"""Calibration against a known truth, every kernel at the estimator's shipped defaults.

Functions are drawn from a GP prior with a known RBF/ARD kernel and noise (the draw of
tests/test_calibration.py); the reference is the exact posterior of that kernel.  Per kernel,
size and seed: 95% interval coverage of 2 000 fresh test targets, mean NLPD against the true
posterior's, RMSE and the fit's seconds.  Rows are appended to the CSV as they finish and a
rerun skips the rows it holds.

    python experiments/calibration_truth.py run --csv experiments/results/calibration_truth.csv \
        --sizes 500 5000 --seeds 1 2 3
    python experiments/calibration_truth.py report experiments/results/calibration_truth.csv
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from alacarte import AlaCarteRegressor  # noqa: E402
from alacarte.factory import KERNEL_NAMES, draws_for_features  # noqa: E402
from alacarte.training import resolve_pilot, resolve_samples  # noqa: E402
from _draws import draws_setting, row_draws  # noqa: E402  (experiments/, the script's own folder)

FIELDS = ["kernel", "n", "seed", "coverage95", "nlpd", "true_nlpd", "excess", "rmse", "true_rmse", "seconds",
          "threads", "num_draws"]
FEATURE_KERNELS = [name for name in KERNEL_NAMES if not name.startswith("exact")]


def _truth_module():
    """The test's draw and true posterior, so the experiment and the test share one definition."""
    path = Path(__file__).resolve().parents[1] / "tests" / "test_calibration.py"
    spec = importlib.util.spec_from_file_location("calibration_truth_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(truth, kernel: str, n: int, seed: int, num_draws: int | str = "auto") -> dict:
    lengthscales = truth.ISOTROPIC.get(kernel, truth.LENGTHSCALES)
    x, y, x_test, y_test = truth.draw(n, seed, lengthscales)
    true_mean, true_var = truth.true_posterior(x, y, x_test, lengthscales)
    start = time.perf_counter()
    reg = AlaCarteRegressor(kernel, num_draws=num_draws).fit(x, y)
    seconds = time.perf_counter() - start
    mean, std = reg.predict(x_test, return_std=True)
    ours, best = truth.nlpd(mean, std**2, y_test), truth.nlpd(true_mean, true_var, y_test)
    return {"kernel": kernel, "n": n, "seed": seed, "coverage95": f"{truth.coverage95(mean, std**2, y_test):.4f}",
            "nlpd": f"{ours:.4f}", "true_nlpd": f"{best:.4f}", "excess": f"{ours - best:.4f}",
            "rmse": f"{np.sqrt(np.mean((mean - y_test) ** 2)):.4f}",
            "true_rmse": f"{np.sqrt(np.mean((true_mean - y_test) ** 2)):.4f}",
            "seconds": f"{seconds:.1f}", "threads": torch.get_num_threads(), "num_draws": len(reg.models_)}


def resolved_draws(kernel: str, n: int, num_draws: int | str) -> int:
    """The draws ``AlaCarteRegressor(kernel, num_draws=num_draws)`` fits to n rows."""
    reg = AlaCarteRegressor(kernel)
    samples = resolve_samples(reg.num_samples, resolve_pilot(reg.pilot_rows, kernel, n, num_samples=reg.num_samples))
    features = 2 * samples if kernel in FEATURE_KERNELS else None
    return draws_for_features(num_draws, features, n)


def run(csv_path: Path, kernels: list[str], sizes: list[int], seeds: list[int],
        num_draws: int | str = "auto") -> None:
    done = set()
    if csv_path.exists():
        with csv_path.open() as f:
            done = {(r["kernel"], int(r["n"]), int(r["seed"]), row_draws(r)) for r in csv.DictReader(f)}
    truth = _truth_module()
    for n in sizes:
        for seed in seeds:
            for kernel in kernels:
                if (kernel, n, seed, resolved_draws(kernel, n, num_draws)) in done:
                    continue
                row = measure(truth, kernel, n, seed, num_draws)
                new = not csv_path.exists()
                with csv_path.open("a", newline="") as f:
                    writer = csv.DictWriter(f, FIELDS)
                    if new:
                        writer.writeheader()
                    writer.writerow(row)
                print(row, flush=True)


def report(csv_path: Path) -> str:
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    lines = ["| kernel | n | draws | seeds | 95% coverage (each seed) | NLPD − true posterior's (each seed) | "
             "RMSE / true RMSE | fit s |", "|---|---:|---:|---:|---|---|---:|---:|"]
    keys = sorted({(r["kernel"], int(r["n"]), row_draws(r)) for r in rows},
                  key=lambda k: (k[2], k[1], FEATURE_KERNELS.index(k[0])))
    for kernel, n, draws in keys:
        cell = [r for r in rows if r["kernel"] == kernel and int(r["n"]) == n and row_draws(r) == draws]
        cov = ", ".join(f"{float(r['coverage95']):.3f}" for r in cell)
        exc = ", ".join(f"{float(r['excess']):+.3f}" for r in cell)
        ratio = np.mean([float(r["rmse"]) / float(r["true_rmse"]) for r in cell])
        seconds = np.median([float(r["seconds"]) for r in cell])
        lines.append(f"| {kernel} | {n} | {draws} | {len(cell)} | {cov} | {exc} | {ratio:.3f} | {seconds:.0f} |")
    met = sum(0.93 <= float(r["coverage95"]) <= 0.97 and abs(float(r["excess"])) <= 0.05 for r in rows)
    lines.append("")
    lines.append(f"Fits meeting both goals (coverage in [0.93, 0.97] and |NLPD excess| ≤ 0.05): {met} of {len(rows)}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--csv", type=Path, required=True)
    go.add_argument("--kernels", nargs="+", default=FEATURE_KERNELS, choices=FEATURE_KERNELS)
    go.add_argument("--sizes", nargs="+", type=int, default=[500, 5000])
    go.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    go.add_argument("--num-draws", type=draws_setting, default="auto",
                    help="AlaCarteRegressor's num_draws: a positive integer or auto (default, the estimator's)")
    show = sub.add_parser("report")
    show.add_argument("csv", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        run(args.csv, args.kernels, args.sizes, args.seeds, args.num_draws)
    else:
        print(report(args.csv))


if __name__ == "__main__":
    main()
