"""RFFNet and the derivative-based selector (Rosasco et al.) on the papers'
synthetic problems; resumable, one CSV row per (problem, n, method, replication).

    python experiments/selection_rffnet.py --part se --replications 5
    python experiments/selection_rffnet.py --part rosasco --replications 20
    python experiments/selection_rffnet.py --report

Rows go to experiments/results/selection_rffnet.csv (columns problem, n,
method, replication, rmse, selected, relevance, train_seconds, seed, version;
``selected`` and ``relevance`` space-separated, inputs 0-based) -- the schema
of selection_srff.csv.  Rows already there are skipped, so an interrupted run
continues where it stopped.  One thread: the machine is shared.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import alacarte  # noqa: E402
from alacarte.datasets import make_se1, make_se2, make_se3, rosasco_split  # noqa: E402
from alacarte.selection import DerivativeSelector, RFFNetRegressor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CSV_PATH = os.path.join(HERE, "results", "selection_rffnet.csv")
COLUMNS = ["problem", "n", "method", "replication", "rmse", "selected", "relevance", "train_seconds", "seed", "version"]

# SRFF paper, Table 1: test sizes 1k (SE1, SE2) and 10k (SE3); validation the same size as the test set
# (for SE3 we validate on 1k: only the learning rate is chosen on it).
SE_GENERATORS = {"se1": (make_se1, 1000, 1000), "se2": (make_se2, 1000, 1000), "se3": (make_se3, 1000, 10000)}
# smallest first; 50k last
SE_SCHEDULE = [("se1", 1000), ("se2", 1000), ("se3", 1000), ("se1", 5000), ("se2", 5000),
               ("se1", 10000), ("se2", 10000), ("se1", 50000), ("se2", 50000), ("se3", 50000)]
# (learning rate, μ) chosen on the validation set, as the RFFNet paper did; at 50k one setting
# (1400 steps per epoch are plenty at 1e-3, and a grid would cost hours of a shared CPU)
GRID = [(lr, mu) for lr in (1e-3, 1e-2) for mu in (1e-4, 1e-2)]
GRID_50K = [(1e-3, 1e-4)]


def version() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = ""
    return f"{alacarte.__version__}+{rev}" if rev else alacarte.__version__


def done_keys() -> set[tuple[str, int, str, int]]:
    if not os.path.exists(CSV_PATH):
        return set()
    with open(CSV_PATH) as fh:
        return {(r["problem"], int(r["n"]), r["method"], int(r["replication"])) for r in csv.DictReader(fh)}


def append(row: dict) -> None:
    new = not os.path.exists(CSV_PATH)
    with open(CSV_PATH, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)
        fh.flush()
        os.fsync(fh.fileno())


def row(problem, n, method, rep, rmse, selected, relevance, seconds, seed) -> dict:
    return {
        "problem": problem, "n": n, "method": method, "replication": rep, "rmse": f"{rmse:.6g}",
        "selected": " ".join(str(int(i)) for i in selected),
        "relevance": " ".join(f"{v:.4g}" for v in relevance),
        "train_seconds": f"{seconds:.2f}", "seed": seed, "version": version(),
    }


def rmse(pred, y) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def run_se(replications: int, problems: set[str] | None) -> None:
    done = done_keys()
    for problem, n in SE_SCHEDULE:
        if problems and problem not in problems:
            continue
        make, n_val, n_test = SE_GENERATORS[problem]
        for rep in range(replications):
            if (problem, n, "rffnet", rep) in done:
                continue
            seed = 1000 * rep + int(problem[-1])
            x, y, _ = make(n + n_val + n_test, seed=seed)
            xt, yt = x[:n], y[:n]
            xv, yv = x[n:n + n_val], y[n:n + n_val]
            xs, ys = x[n + n_val:], y[n + n_val:]
            large = n >= 50000
            grid = GRID_50K if large else GRID
            max_epochs = (20 if problem == "se3" else 40) if large else 200
            patience = 10 if large else 30
            start = time.perf_counter()
            best = None
            for lr, mu in grid:
                model = RFFNetRegressor(learning_rate=lr, alpha=mu, max_epochs=max_epochs, patience=patience,
                                        random_state=seed).fit(xt, yt)
                val = rmse(model.predict(xv), yv)
                if best is None or val < best[0]:
                    best = (val, model)
            seconds = time.perf_counter() - start
            model = best[1]
            test_rmse = rmse(model.predict(xs), ys)
            append(row(problem, n, "rffnet", rep, test_rmse, model.selected_, model.relevance_, seconds, seed))
            print(f"{problem} n={n} rep={rep} rmse={test_rmse:.4f} selected={model.selected_.tolist()} "
                  f"lr={model.learning_rate} mu={model.alpha} epochs={model.n_epochs_} {seconds:.1f}s", flush=True)


ROSASCO_GAMMAS = (0.1, 0.5)
ROSASCO_TAUS = np.geomspace(1.0, 1e-3, 8)  # times std(y), from large to small (continuation)
RIDGES = (1e-3, 1e-2, 1e-1, 1.0)


def run_rosasco(replications: int, problems: set[str] | None) -> None:
    """Rosasco et al. Table 1: f1-f3, n = 80 train / 200 validation / 200 test; Alg1 and Alg1-GR with
    (gamma, tau) chosen on validation along a warm-started tau path; G-ridge and the lasso (l1) references."""
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.linear_model import Lasso

    done = done_keys()
    for function in ("f1", "f2", "f3"):
        if problems and function not in problems:
            continue
        for rep in range(replications):
            if (function, 80, "alg1_gr", rep) in done:
                continue
            data = rosasco_split(function, seed=rep)
            (x, y), (xv, yv), (xs, ys) = data["train"], data["validation"], data["test"]
            scale = float(y.std())
            start = time.perf_counter()
            best_alg1 = best_gr = None
            for gamma in ROSASCO_GAMMAS:
                model = DerivativeSelector(gamma=gamma, mu=1e-4, refit=False, warm_start=True, tol=1e-5 * scale,
                                           max_iter=3000, max_inner_iter=300)
                for tau in ROSASCO_TAUS * scale:
                    model.set_params(tau=tau, refit=False).fit(x, y)
                    val = rmse(model.decision_function(xv), yv)
                    state = (val, gamma, tau, model.decision_function(xs), model.selected_.copy(), model.relevance_.copy())
                    if best_alg1 is None or val < best_alg1[0]:
                        best_alg1 = state
                    sel = model.selected_
                    for ridge in RIDGES:
                        if len(sel) == 0:
                            pv, ps = np.full(len(yv), y.mean()), np.full(len(ys), y.mean())
                        else:
                            kr = KernelRidge(alpha=ridge, kernel="rbf", gamma=gamma).fit(x[:, sel], y - y.mean())
                            pv, ps = kr.predict(xv[:, sel]) + y.mean(), kr.predict(xs[:, sel]) + y.mean()
                        val = rmse(pv, yv)
                        if best_gr is None or val < best_gr[0]:
                            best_gr = (val, gamma, tau, ps, sel.copy(), model.relevance_.copy())
            seconds = time.perf_counter() - start
            for method, best in (("alg1", best_alg1), ("alg1_gr", best_gr)):
                append(row(function, 80, method, rep, rmse(best[3], ys), best[4], best[5], seconds, rep))
                print(f"{function} rep={rep} {method} test mse={rmse(best[3], ys) ** 2:.4g} "
                      f"(var {ys.var():.4g}) selected={best[4].tolist()} gamma={best[1]} tau={best[2]:.3g}", flush=True)
            # references: Gaussian kernel ridge on all inputs, and the lasso; hyperparameters on validation
            t0 = time.perf_counter()
            best = None
            for gamma in (0.02, 0.05, 0.1, 0.2, 0.5):
                for ridge in RIDGES:
                    kr = KernelRidge(alpha=ridge, kernel="rbf", gamma=gamma).fit(x, y - y.mean())
                    val = rmse(kr.predict(xv) + y.mean(), yv)
                    if best is None or val < best[0]:
                        best = (val, kr.predict(xs) + y.mean())
            append(row(function, 80, "g_ridge", rep, rmse(best[1], ys), range(6), np.ones(6), time.perf_counter() - t0, rep))
            t0 = time.perf_counter()
            best = None
            for a in np.geomspace(1e-3, 10, 15) * scale:
                lasso = Lasso(alpha=a, max_iter=100000).fit(x, y)
                val = rmse(lasso.predict(xv), yv)
                if best is None or val < best[0]:
                    best = (val, lasso)
            coef = np.abs(best[1].coef_)
            append(row(function, 80, "l1", rep, rmse(best[1].predict(xs), ys), np.flatnonzero(coef),
                       coef / coef.max() if coef.max() > 0 else coef, time.perf_counter() - t0, rep))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["se", "rosasco"], default="se")
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--problems", nargs="*", help="restrict to these problems (se1 se2 se3 / f1 f2 f3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "se":
        run_se(args.replications, set(args.problems or []))
    else:
        run_rosasco(args.replications, set(args.problems or []))


if __name__ == "__main__":
    main()
