"""Predictive distributions away from the training inputs: what Bayesian optimisation and active
learning ask for, and what the UCI test rows (drawn like the training rows) never show.

``truth``: functions drawn from a GP prior with a known RBF/ARD kernel (d = 3, inputs on [−2, 2]³,
the draw of tests/test_calibration.py), test points inside the box and on shells at distance δ
outside it (one coordinate pushed to ±(2 + δ)); per kernel at the estimator's defaults and per
shell: 95% coverage, NLPD against the true posterior's, and the median ratio of the predictive
variance to the true posterior's.

With ``--num-samples`` and ``--num-draws`` the estimator's D and draws are set, and each draw's
``FeatureGP.prior_variance_ratio`` is recorded.

``uci``: a UCI split's test rows, each moved k training standard deviations along one random
input; per kernel the median predictive standard deviation (target units), the prior variance
k(x, x) of every draw (standardised targets), its prior variance ratio and its band scale, to set beside
exact ARD's.

Rows are appended as they finish; a rerun skips the rows it holds.

    python experiments/far_from_data.py truth --csv experiments/results/far_from_data_truth.csv \
        --lengthscales 0.5,0.5,0.5 1,1.5,3 --kernels exact-ard gm fsard
    python experiments/far_from_data.py truth --csv experiments/results/far_from_data_truth_d.csv \
        --lengthscales 0.5,0.5,0.5 --kernels fastfood-ard --num-samples 512 --num-draws 1   # then 1024, fsard
    python experiments/far_from_data.py uci --csv experiments/results/far_from_data_uci.csv \
        --datasets concrete yacht energy airfoil pendulum servo --kernels exact-ard gm fsard
    python experiments/far_from_data.py report experiments/results/far_from_data_truth.csv \
        experiments/results/far_from_data_truth_d.csv experiments/results/far_from_data_uci.csv
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from alacarte import AlaCarteRegressor, load_uci  # noqa: E402
from alacarte.factory import KERNEL_NAMES  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from calibration_truth import _truth_module  # noqa: E402  (the test's draw, kernel and scores)

SHELLS = (0.5, 1.0, 2.0, 4.0)
SHIFTS = (0, 1, 3, 10)
PER_SHELL = 300
TRUTH_FIELDS = ["kernel", "lengthscales", "n", "seed", "draws", "where", "coverage95", "true_coverage95", "nlpd",
                "true_nlpd", "variance_ratio", "true_variance", "seconds", "num_samples", "prior_variance_ratio",
                "band_scale"]
UCI_FIELDS = ["dataset", "kernel", "n", "draws", "shift", "rmse", "median_std", "y_std", "prior_variance", "noise",
              "excess", "seconds", "band_scale"]


def shell_points(rng: np.random.Generator, count: int, distance: float, half_width: float, d: int) -> np.ndarray:
    """``count`` points at sup-norm distance ``distance`` outside [−half_width, half_width]^d: uniform in the
    box, then one random coordinate moved to ±(half_width + distance)."""
    z = rng.uniform(-half_width, half_width, size=(count, d))
    z[np.arange(count), rng.integers(0, d, count)] = rng.choice([-1.0, 1.0], count) * (half_width + distance)
    return z


def draw(truth, n: int, seed: int, lengthscales: np.ndarray, half_width: float = 2.0):
    """Training rows in the box; test rows inside it, then :data:`PER_SHELL` on each shell; one function from
    the prior at all of them, noisy targets."""
    rng = np.random.default_rng(seed)
    d = len(lengthscales)
    x = np.concatenate([rng.uniform(-half_width, half_width, size=(n + PER_SHELL, d))]
                       + [shell_points(rng, PER_SHELL, s, half_width, d) for s in SHELLS])
    f = np.linalg.cholesky(truth.rbf(x, x, lengthscales) + 1e-8 * np.eye(len(x))) @ rng.standard_normal(len(x))
    y = f + math.sqrt(truth.NOISE) * rng.standard_normal(len(x))
    return x[:n], y[:n], x[n:], y[n:]


def run_truth(csv_path: Path, kernels, lengthscale_sets, n: int, seeds, num_samples="auto", num_draws="auto") -> None:
    truth = _truth_module()
    done = {(r["kernel"], r["lengthscales"], int(r["n"]), int(r["seed"]), r.get("num_samples", "auto"))
            for r in read_rows(csv_path)}
    for text in lengthscale_sets:
        lengthscales = np.array([float(v) for v in text.split(",")])
        for seed in seeds:
            x, y, x_test, y_test = draw(truth, n, seed, lengthscales)
            true_mean, true_var = truth.true_posterior(x, y, x_test, lengthscales)
            for kernel in kernels:
                if (kernel, text, n, seed, str(num_samples)) in done:
                    continue
                start = time.perf_counter()
                reg = AlaCarteRegressor(kernel, num_samples=num_samples, num_draws=num_draws).fit(x, y)
                seconds = time.perf_counter() - start
                mean, std = reg.predict(x_test, return_std=True)
                ratio = ";".join(f"{model.prior_variance_ratio():.4g}" for model in reg.models_
                                 if hasattr(model, "prior_variance_ratio"))
                bands = ";".join(f"{float(model.band_scale):.4g}" for model in reg.models_)
                for k, where in enumerate(["inside"] + [f"+{s:g}" for s in SHELLS]):
                    part = slice(k * PER_SHELL, (k + 1) * PER_SHELL)
                    m, v, t, tv = mean[part], std[part] ** 2, y_test[part], true_var[part]
                    row = {"kernel": kernel, "lengthscales": text, "n": n, "seed": seed, "draws": len(reg.models_),
                           "where": where, "coverage95": f"{truth.coverage95(m, v, t):.4f}",
                           "true_coverage95": f"{truth.coverage95(true_mean[part], tv, t):.4f}",
                           "nlpd": f"{truth.nlpd(m, v, t):.4f}", "true_nlpd": f"{truth.nlpd(true_mean[part], tv, t):.4f}",
                           "variance_ratio": f"{float(np.median(v / tv)):.4g}",
                           "true_variance": f"{float(np.median(tv)):.4g}", "seconds": f"{seconds:.1f}",
                           "num_samples": num_samples, "prior_variance_ratio": ratio, "band_scale": bands}
                    append_row(csv_path, TRUTH_FIELDS, row)
                print(kernel, text, n, seed, f"{seconds:.0f} s", flush=True)


@torch.no_grad()
def _prior_and_noise(reg) -> tuple[str, str, str, str]:
    """Each draw's k(x, x), σ², excess and band scale b (standardised targets), ';'-joined.

    The excess is ``FeatureGP.prior_variance_ratio`` on up to 1 000 training rows, for exact GPs too:
    k(x, x)·(1 − ρ̄)/b/(s² − σ²/b), ρ̄ the mean correlation of pairs of those rows, s² the training targets'
    variance; about 1 where the prior the likelihood fitted matches the data."""
    prior, noise, excess, bands = [], [], [], []
    for model in reg.models_:
        (x,), y = model.train_inputs, model.train_targets
        x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:1000]]
        k = model.covar_module(x).to_dense()
        diagonal = float(k.diagonal().mean())
        rho = (float(k.sum()) - float(k.trace())) / (len(x) * (len(x) - 1)) / diagonal
        band = float(model.band_scale)
        prior.append(diagonal)
        noise.append(float(model.likelihood.noise.reshape(-1)[0]))
        excess.append(diagonal * (1 - rho) / band / (float(y.var()) - noise[-1] / band))
        bands.append(band)
    return tuple(";".join(f"{v:.4g}" for v in values) for values in (prior, noise, excess, bands))


def run_uci(csv_path: Path, kernels, datasets, split: int, data_dir: str | None) -> None:
    done = {(r["dataset"], r["kernel"]) for r in read_rows(csv_path)}
    for name in datasets:
        data = load_uci(name, split, data_dir)
        x, y, x_test, y_test = data.x_train, data.y_train.ravel(), data.x_test, data.y_test.ravel()
        rng = np.random.default_rng(split)
        columns = rng.integers(0, x.shape[1], len(x_test))
        signs = rng.choice([-1.0, 1.0], len(x_test))
        scale = x.std(0)
        for kernel in kernels:
            if (name, kernel) in done:
                continue
            start = time.perf_counter()
            reg = AlaCarteRegressor(kernel).fit(x, y)
            seconds = time.perf_counter() - start
            prior, noise, excess, bands = _prior_and_noise(reg)
            for shift in SHIFTS:
                moved = x_test.copy()
                moved[np.arange(len(moved)), columns] += shift * signs * scale[columns]
                mean, std = reg.predict(moved, return_std=True)
                rmse = float(np.sqrt(np.mean((mean - y_test) ** 2))) if shift == 0 else float("nan")
                append_row(csv_path, UCI_FIELDS, {
                    "dataset": name, "kernel": kernel, "n": len(y), "draws": len(reg.models_), "shift": shift,
                    "rmse": f"{rmse:.4g}", "median_std": f"{float(np.median(std)):.4g}", "y_std": f"{float(y.std()):.4g}",
                    "prior_variance": prior, "noise": noise, "excess": excess, "seconds": f"{seconds:.1f}",
                    "band_scale": bands})
            print(name, kernel, f"{seconds:.0f} s", flush=True)


def report_truth(rows: list[dict]) -> list[str]:
    lines = ["| truth ℓ | kernel | D | draws | seeds | where | 95% coverage (true posterior's) | NLPD − true | "
             "variance / true | prior variance ratio | band scale |", "|---|---|---|---:|---:|---|---|---:|---:|---|---|"]
    for r in rows:  # rows from before the columns: the estimator's default D, ratio not recorded
        r["kernel"] = r["kernel"] if r.get("num_samples", "auto") == "auto" else f"{r['kernel']}@{2 * int(r['num_samples'])}"
    keys = sorted({(r["lengthscales"], r["kernel"], int(r["n"]), r["where"]) for r in rows},
                  key=lambda k: (k[0], k[1] != "exact-ard", KERNEL_NAMES.index(k[1].split("@")[0]), k[1], k[2], ["inside", *map(lambda s: f"+{s:g}", SHELLS)].index(k[3])))
    for text, kernel, n, where in keys:
        cell = [r for r in rows if (r["lengthscales"], r["kernel"], int(r["n"]), r["where"]) == (text, kernel, n, where)]
        mean = lambda field: float(np.mean([float(r[field]) for r in cell]))  # noqa: E731
        name, _, features = kernel.partition("@")
        ratio, band = ((cell[0].get(f) or "").replace(";", ", ") if where == "inside" else ""
                       for f in ("prior_variance_ratio", "band_scale"))
        lines.append(f"| {text} | {name} | {features or 'default'} | {cell[0]['draws']} | {len(cell)} | {where} | "
                     f"{mean('coverage95'):.3f} ({mean('true_coverage95'):.3f}) | "
                     f"{mean('nlpd') - mean('true_nlpd'):+.2f} | {float(np.median([float(r['variance_ratio']) for r in cell])):.3g} | "
                     f"{ratio} | {band} |")
    return lines


def report_uci(rows: list[dict]) -> list[str]:
    shifts = " | ".join(f"std at {s} sd" for s in SHIFTS)
    lines = [f"| dataset (n) | kernel | draws | test RMSE | {shifts} | k(x, x), standardised | σ², standardised | "
             "prior variance ratio | band scale |", "|---|---|---:|---:|" + "---:|" * len(SHIFTS) + "---|---|---|---|"]
    for name, kernel in dict.fromkeys((r["dataset"], r["kernel"]) for r in rows):
        cell = {int(r["shift"]): r for r in rows if (r["dataset"], r["kernel"]) == (name, kernel)}
        first = cell[SHIFTS[0]]
        stds = " | ".join(f"{float(cell[s]['median_std']):.3g}" if s in cell else "" for s in SHIFTS)
        lines.append(f"| {name} ({first['n']}) | {kernel} | {first['draws']} | {float(first['rmse']):.3g} | {stds} | "
                     f"{first['prior_variance'].replace(';', ', ')} | {first['noise'].replace(';', ', ')} | "
                     f"{first['excess'].replace(';', ', ')} | {(first.get('band_scale') or '').replace(';', ', ')} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    truth = sub.add_parser("truth")
    truth.add_argument("--csv", type=Path, required=True)
    truth.add_argument("--kernels", nargs="+", default=["exact-ard", "gm", "fsard"], choices=KERNEL_NAMES)
    truth.add_argument("--lengthscales", nargs="+", default=["0.5,0.5,0.5", "1,1.5,3"])
    truth.add_argument("--n", type=int, default=2000)
    truth.add_argument("--seeds", nargs="+", type=int, default=[1])
    truth.add_argument("--num-samples", default="auto", type=lambda v: v if v == "auto" else int(v),
                       help="AlaCarteRegressor's num_samples (default auto)")
    truth.add_argument("--num-draws", default="auto", type=lambda v: v if v == "auto" else int(v),
                       help="AlaCarteRegressor's num_draws (default auto)")
    uci = sub.add_parser("uci")
    uci.add_argument("--csv", type=Path, required=True)
    uci.add_argument("--kernels", nargs="+", default=["exact-ard", "gm", "fsard"], choices=KERNEL_NAMES)
    uci.add_argument("--datasets", nargs="+", default=["concrete", "housing"])
    uci.add_argument("--split", type=int, default=0)
    show = sub.add_parser("report")
    show.add_argument("csv", type=Path, nargs="+")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.command == "truth":
        run_truth(args.csv, args.kernels, args.lengthscales, args.n, args.seeds, args.num_samples, args.num_draws)
    elif args.command == "uci":
        run_uci(args.csv, args.kernels, args.datasets, args.split, os.environ.get("ALACARTE_DATA"))
    else:
        for path in args.csv:
            rows = read_rows(path)
            print("\n".join(report_truth(rows) if "where" in rows[0] else report_uci(rows)) + "\n")


if __name__ == "__main__":
    main()
