"""Large data at equal CPU time: alacarte GM, FSARD and FSGBARD against GPyTorch SGPR and SVGP, with
scikit-learn's HistGradientBoostingRegressor as the non-GP reference.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 python experiments/large_data.py \
        --csv experiments/results/large_data.csv --report experiments/results/large_data.md

On each dataset (UCI split 0 by default) the alacarte estimators run first, at their shipped
defaults (``AlaCarteRegressor(kernel)``: D = 2·256 features, restarts, 20% of the rows held out).
The CPU time of the slowest of them (``time.process_time``, one torch thread, so other load on
the machine does not count), capped at ``--max-budget``, is the budget that SGPR and SVGP then
train for, each checking the clock after every optimiser step; HistGradientBoostingRegressor
runs at its defaults.  Every contestant is scored by ``alacarte.bench.predictive_scores`` on
the test rows in the targets' original units (NLPD of a new observation, noise included).

One fsync'ed CSV row per (dataset, split, contestant), appended as it finishes: a re-run skips
the rows already there.  ``--report`` writes the tables from the CSV (after the run, or alone
with ``--report-only``).  ``--contestants`` runs some of them (the alacarte fits among them set the budget);
``--subsample N --max-budget S`` makes a quick trial run.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import gpytorch
import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench import package_version, predictive_scores  # noqa: E402
from alacarte.factory import make_model  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

CONTESTANTS = ("alacarte-gm", "alacarte-fsard", "alacarte-fsgbard", "alacarte-gm-pilot", "sgpr", "svgp", "hgb")
FIELDS = ["dataset", "split", "contestant", "n_train", "n_test", "d", "size", "rmse", "nlpd", "coverage50",
          "coverage95", "std_over_rmse", "budget_cpu_s", "train_cpu_s", "predict_cpu_s", "train_wall_s",
          "steps", "threads", "loadavg", "version", "torch", "gpytorch", "commit", "date"]


def scores(y_test: np.ndarray, mean: np.ndarray, variance: np.ndarray | None) -> dict:
    """The one scoring function of every contestant, in the targets' units; a point predictor
    (no ``variance``) gets its RMSE only."""
    y, m = torch.as_tensor(y_test, dtype=torch.float64), torch.as_tensor(mean, dtype=torch.float64)
    if variance is None:
        return {"rmse": float((y - m).pow(2).mean().sqrt()), "nlpd": math.nan, "coverage50": math.nan,
                "coverage95": math.nan, "std_over_rmse": math.nan}
    return predictive_scores(m, torch.as_tensor(variance, dtype=torch.float64), y)


class Standardiser:
    """x and y standardised on the training rows, as a GPyTorch user would do by hand."""

    def __init__(self, x: np.ndarray, y: np.ndarray, dtype: torch.dtype):
        self.x_mean, self.x_std = x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0)
        self.y_mean, self.y_std = y.mean(), y.std()
        self.dtype = dtype

    def x(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((x - self.x_mean) / self.x_std, dtype=self.dtype)

    def y(self, y: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((y - self.y_mean) / self.y_std, dtype=self.dtype)

    def back(self, mean: torch.Tensor, variance: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        mean, variance = mean.detach().double().numpy(), variance.detach().double().numpy()
        return mean * self.y_std + self.y_mean, variance * self.y_std**2


def _cpu_timed(fn):
    """``fn()``'s result, its CPU seconds and its wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


# -- the contestants -----------------------------------------------------------------------------------
def run_alacarte(kernel: str, data, args) -> dict:
    reg = ac.AlaCarteRegressor(kernel, num_samples=args.num_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, train_cpu, train_wall = _cpu_timed(lambda: reg.fit(data.x_train, data.y_train))
    (mean, std), predict_cpu, _ = _cpu_timed(lambda: reg.predict(data.x_test, return_std=True))
    return {**scores(data.y_test, mean, std**2), "size": 2 * args.num_samples, "train_cpu_s": train_cpu,
            "predict_cpu_s": predict_cpu, "train_wall_s": train_wall, "steps": reg.n_iter_}


def run_pilot(data, args) -> dict:
    """GM with D = 2·``--pilot-samples`` features on every row, its hyperparameters fitted on a pilot
    (:func:`alacarte.fit_pilot`'s defaults: 5 000 rows, D = 1 024); training time includes the posterior,
    which ``fit_pilot`` leaves conditioned on every row."""
    model = make_model("gm", data.x_train.shape[1], num_samples=args.pilot_samples)

    def train():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ac.fit_pilot(model, data.x_train, data.y_train, progress=False)

    history, train_cpu, train_wall = _cpu_timed(train)
    prediction, predict_cpu, _ = _cpu_timed(lambda: model.predict(data.x_test))
    return {**scores(data.y_test, prediction.mean, prediction.observed_variance), "size": 2 * args.pilot_samples,
            "train_cpu_s": train_cpu, "predict_cpu_s": predict_cpu, "train_wall_s": train_wall,
            "steps": history.iterations}


class SGPR(gpytorch.models.ExactGP):
    """Titsias' SGPR: an exact GP over ``InducingPointKernel``, whose marginal likelihood is the
    collapsed bound."""

    def __init__(self, x, y, inducing, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        base = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1]))
        self.covar_module = gpytorch.kernels.InducingPointKernel(base, inducing.clone(), likelihood)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SVGP(gpytorch.models.ApproximateGP):
    """Hensman et al.'s SVGP: learned inducing locations, a full-covariance variational posterior."""

    def __init__(self, inducing):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[0])
        strategy = gpytorch.variational.VariationalStrategy(self, inducing.clone(), distribution,
                                                            learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=inducing.shape[-1]))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _inducing(x: torch.Tensor, m: int) -> torch.Tensor:
    """A seeded random subset of the training rows (k-means would spend the budget's CPU time)."""
    return x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:m]]


def train_for(budget: float, step) -> int:
    """Call ``step()`` until the CPU time since the call reaches ``budget``; the number of steps."""
    start, steps = time.process_time(), 0
    while time.process_time() - start < budget:
        step()
        steps += 1
    return steps


def run_sgpr(data, budget: float, args) -> dict:
    st = Standardiser(data.x_train, data.y_train, torch.float64)  # the collapsed bound's Cholesky wants float64
    x, y = st.x(data.x_train), st.y(data.y_train)
    torch.manual_seed(0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = SGPR(x, y, _inducing(x, args.inducing), likelihood).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.1)  # GPyTorch's SGPR example

    def step():
        optimiser.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimiser.step()

    model.train(), likelihood.train()
    steps, train_cpu, train_wall = _cpu_timed(lambda: train_for(budget, step))
    model.eval(), likelihood.eval()

    def predict():
        with torch.no_grad():
            pred = likelihood(model(st.x(data.x_test)))
            return st.back(pred.mean, pred.variance)

    (mean, var), predict_cpu, _ = _cpu_timed(predict)
    return {**scores(data.y_test, mean, var), "size": args.inducing, "train_cpu_s": train_cpu,
            "predict_cpu_s": predict_cpu, "train_wall_s": train_wall, "steps": steps}


def run_svgp(data, budget: float, args) -> dict:
    st = Standardiser(data.x_train, data.y_train, torch.float32)  # SVGP's usual float32
    x, y = st.x(data.x_train), st.y(data.y_train)
    torch.manual_seed(0)
    model, likelihood = SVGP(_inducing(x, args.inducing)), gpytorch.likelihoods.GaussianLikelihood()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    optimiser = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.01)
    batches = iter(())

    def step():
        nonlocal batches
        rows = next(batches, None)
        if rows is None:  # a new epoch, reshuffled
            batches = iter(torch.randperm(x.shape[0]).split(args.batch_size))
            rows = next(batches)
        optimiser.zero_grad()
        loss = -elbo(model(x[rows]), y[rows])
        loss.backward()
        optimiser.step()

    model.train(), likelihood.train()
    steps, train_cpu, train_wall = _cpu_timed(lambda: train_for(budget, step))
    model.eval(), likelihood.eval()

    def predict():
        means, variances = [], []
        with torch.no_grad():
            for rows in st.x(data.x_test).split(args.batch_size):
                pred = likelihood(model(rows))
                means.append(pred.mean), variances.append(pred.variance)
        return st.back(torch.cat(means), torch.cat(variances))

    (mean, var), predict_cpu, _ = _cpu_timed(predict)
    return {**scores(data.y_test, mean, var), "size": args.inducing, "train_cpu_s": train_cpu,
            "predict_cpu_s": predict_cpu, "train_wall_s": train_wall, "steps": steps}


def run_hgb(data, args) -> dict:
    from sklearn.ensemble import HistGradientBoostingRegressor

    reg = HistGradientBoostingRegressor(random_state=0)
    _, train_cpu, train_wall = _cpu_timed(lambda: reg.fit(data.x_train, data.y_train))
    mean, predict_cpu, _ = _cpu_timed(lambda: reg.predict(data.x_test))
    return {**scores(data.y_test, mean, None), "size": "", "train_cpu_s": train_cpu,
            "predict_cpu_s": predict_cpu, "train_wall_s": train_wall, "steps": reg.n_iter_}


# -- running -------------------------------------------------------------------------------------------
def load(dataset: str, args):
    data = ac.load_uci(dataset, args.split, args.data)
    if args.subsample and args.subsample < data.x_train.shape[0]:  # a trial run
        rows = np.random.default_rng(0).choice(data.x_train.shape[0], args.subsample, replace=False)
        data = type(data)(data.name, data.split, data.x_train[rows], data.y_train[rows], data.x_test, data.y_test)
    return data


def budget_of(rows: list[dict], args) -> float:
    """The slowest alacarte fit's CPU seconds, capped at ``--max-budget``."""
    return min(max(float(r["train_cpu_s"]) for r in rows if r["contestant"].startswith("alacarte")),
               args.max_budget)


def run_contestant(contestant: str, data, budget: float, args) -> dict:
    if contestant == "alacarte-gm-pilot":
        return run_pilot(data, args)
    if contestant.startswith("alacarte"):
        return run_alacarte(contestant.split("-", 1)[1], data, args)
    if contestant == "sgpr":
        return run_sgpr(data, budget, args)
    if contestant == "svgp":
        return run_svgp(data, budget, args)
    return run_hgb(data, args)


def run_dataset(dataset: str, args) -> None:
    data = load(dataset, args)
    common = {"dataset": dataset, "split": args.split, "n_train": data.x_train.shape[0],
              "n_test": data.x_test.shape[0], "d": data.x_train.shape[1], "threads": torch.get_num_threads(),
              "version": package_version(), "torch": torch.__version__, "gpytorch": gpytorch.__version__,
              "commit": args.commit}
    for contestant in sorted(set(args.contestants), key=CONTESTANTS.index):  # alacarte first: it sets the budget
        rows = [r for r in read_rows(args.csv) if r["dataset"] == dataset and int(r["split"]) == args.split]
        if any(r["contestant"] == contestant for r in rows):
            continue
        budget = budget_of(rows, args) if contestant in ("sgpr", "svgp") else math.nan
        try:
            result = run_contestant(contestant, data, budget, args)
        except Exception as err:  # an unattended run goes on to the other contestants; a re-run retries this one
            print(f"{dataset} {contestant} failed: {err!r}", flush=True)
            continue
        row = {**common, "contestant": contestant, **result, "budget_cpu_s": budget,
               "loadavg": "%.2f" % os.getloadavg()[0], "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        append_row(args.csv, FIELDS, row)
        print(f"{dataset} {contestant}: rmse {row['rmse']:.4g} nlpd {row['nlpd']:.3f} "
              f"train {row['train_cpu_s']:.0f} CPU s ({row['steps']} steps)", flush=True)


# -- the report ----------------------------------------------------------------------------------------
def _f(value, fmt: str) -> str:
    value = float(value) if value not in ("", None) else math.nan
    return "–" if math.isnan(value) else format(value, fmt)


def goal_line(rows: list[dict]) -> str:
    """Whether one alacarte kernel beats both SGPR and SVGP in RMSE and in NLPD."""
    by = {r["contestant"]: r for r in rows}
    rivals = [by[c] for c in ("sgpr", "svgp") if c in by]
    ours = [r for c, r in by.items() if c.startswith("alacarte")]
    if not rivals or not ours:
        return "Goal: not measured yet."
    winners = [r["contestant"] for r in ours
               if all(float(r[m]) < min(float(o[m]) for o in rivals) for m in ("rmse", "nlpd"))]
    if winners:
        verb = "beats" if len(winners) == 1 else "beat"
        return f"Goal met: {', '.join(winners)} {verb} SGPR and SVGP in both RMSE and NLPD."
    return "Goal missed: no alacarte kernel beats both SGPR and SVGP in both RMSE and NLPD."


def report(args, header: dict) -> str:
    rows = read_rows(args.csv)
    out = ["# Large data at equal CPU time", "", "```", header["command"], "```", "",
           f"torch {torch.__version__}, gpytorch {gpytorch.__version__}, alacarte {package_version()}, "
           f"commit {args.commit}; {header['threads']} torch thread, CPU seconds by `time.process_time`; "
           f"{platform.processor() or platform.machine()}; report written {header['date']}; "
           f"load average (1 min) {header['load']}. Train CPU seconds of SGPR and SVGP stop at the budget "
           "(the slowest alacarte fit's, capped) at the end of the step that reaches it. Steps: L-BFGS "
           "iterations (alacarte's final fit), Adam steps (SGPR: full batch; SVGP: mini-batches), "
           "boosting iterations (HGB). NLPD of a new observation in the targets' units; coverage of the "
           "central 50% and 95% intervals; std/RMSE: mean predictive std over RMSE.", ""]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        cells = [r for r in rows if r["dataset"] == dataset]
        first = cells[0]
        budget = next((r["budget_cpu_s"] for r in cells if r["contestant"] == "sgpr"), "")
        out += [f"## {dataset}, split {first['split']} (n = {first['n_train']}, d = {first['d']}, "
                f"{first['n_test']} test rows; budget {_f(budget, '.0f')} CPU s)", "",
                "| contestant | size | RMSE | NLPD | cov 50% | cov 95% | std/RMSE | train CPU s | predict CPU s "
                "| steps | load |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted(cells, key=lambda r: CONTESTANTS.index(r["contestant"])):
            size = {"alacarte": f"D = {r['size']}", "sgpr": f"m = {r['size']}", "svgp": f"m = {r['size']}"}
            out.append(f"| {r['contestant']} | {size.get(r['contestant'].split('-')[0], '')} | "
                       f"{_f(r['rmse'], '.4f')} | {_f(r['nlpd'], '.3f')} | {_f(r['coverage50'], '.3f')} | "
                       f"{_f(r['coverage95'], '.3f')} | {_f(r['std_over_rmse'], '.2f')} | "
                       f"{_f(r['train_cpu_s'], '.1f')} | {_f(r['predict_cpu_s'], '.1f')} | {r['steps']} | "
                       f"{r['loadavg']} |")
        out += ["", goal_line(cells), ""]
    return "\n".join(out)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", default="experiments/results/large_data.csv")
    parser.add_argument("--report", help="write the markdown tables here at the end")
    parser.add_argument("--report-only", action="store_true", help="write the report from the CSV; fit nothing")
    parser.add_argument("--datasets", nargs="+", default=["kin40k", "protein"])
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--data", default=os.environ.get("ALACARTE_DATA", "/work/shared/uci"))
    parser.add_argument("--num-samples", type=int, default=256, help="alacarte's M (D = 2M); the estimator default")
    parser.add_argument("--pilot-samples", type=int, default=2048,
                        help="alacarte-gm-pilot's M on every row (D = 2M); its pilot: fit_pilot's defaults")
    parser.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS),
                        help="a subset of the contestants (default: all)")
    parser.add_argument("--inducing", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1024, help="SVGP's mini-batch")
    parser.add_argument("--max-budget", type=float, default=600.0, help="cap on the CPU seconds of SGPR/SVGP")
    parser.add_argument("--subsample", type=int, default=0, help="training rows per dataset (0: all); trials")
    parser.add_argument("--commit", default=None, help="the code's commit (default: git rev-parse here)")
    args = parser.parse_args(argv)
    args.commit = args.commit or _commit()
    torch.set_num_threads(1)  # CPU seconds then measure work, not how many cores were free
    command = " ".join(["python", "experiments/large_data.py", *(argv if argv is not None else sys.argv[1:])])
    load_start = "%.2f" % os.getloadavg()[0]
    if not args.report_only:
        for dataset in args.datasets:
            run_dataset(dataset, args)
    if args.report:
        header = {"command": command, "threads": torch.get_num_threads(),
                  "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "load": f"{load_start} at start, {os.getloadavg()[0]:.2f} at end"}
        Path(args.report).write_text(report(args, header) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
