"""How to combine the estimator's feature draws into one predictive: the rules, scored offline.

    python experiments/mixture_rules.py run OUT_DIR --datasets pendulum yacht --methods fsard gm --splits 0-2
    python experiments/mixture_rules.py report OUT_DIR [--exact experiments/results/calibration.csv]
    python experiments/mixture_rules.py rows OUT_DIR --csv experiments/results/calibration_default.csv --version V \
        [--datasets D ...]

``run`` fits each (dataset, split, method) exactly as ``calibration.py run`` does at the shipped
defaults (``make_model``, ``fit``'s defaults, the estimator's draws with seeds split + 1000·k, each
holding out its own 20% of the rows) and saves, per draw, in standardised units: which rows it held
out, every training row's leave-one-out predictive under its final posterior (mean and variance,
noise included: the rank-one downdate of ``HeldOut``), and the test rows' predictive.  One ``.npz``
per cell; a re-run skips the cells done.  ``report`` scores every rule of :data:`RULES` on the saved
cells and prints a markdown table of mean test NLPD and 95% coverage, beside exact ARD's NLPD.
``rows`` appends the shipped rule's cells to a ``calibration.py`` CSV (the same fits as ``calibration.py
run`` makes, to round-off).

Why: each draw's band is widened on its own held-out rows for its own error, which includes how
far its feature draw puts its mean from the other draws'; the moment-matched mixture adds the spread
of the draws' means on top (docs/calibration.md).  The rules differ in how they treat that spread.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize_scalar

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.bench.settings import parse_splits  # noqa: E402
from alacarte.factory import draws_for_features, make_model  # noqa: E402
from alacarte.holdout import RECOMMENDED_FRACTION, SCALE_PRIOR_ROWS, HeldOut, split_rows  # noqa: E402
from alacarte.woodbury import sufficient_statistics  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from calibration import FIELDS  # noqa: E402
from _draws import draws_setting  # noqa: E402


def leave_one_out(model, xs, ys) -> tuple[torch.Tensor, torch.Tensor]:
    """Every training row's predictive from all other rows (standardised), the model's final posterior."""
    with torch.no_grad():
        phi = model.covar_module.features(xs)
        stats = sufficient_statistics(phi, ys - model.mean_module(xs))
        return HeldOut(model, xs, ys)._leave_one_out(stats, phi)


def run_cell(data, split: int, method: str, num_features: int, draws="auto") -> dict:
    n, d = data.x_train.shape
    draws = draws_for_features(draws, num_features, n)
    out = defaultdict(list)
    start = time.perf_counter()
    for k in range(draws):
        seed = split + 1000 * k  # AlaCarteRegressor(random_state=split)'s draws
        model = make_model(method, d, num_samples=num_features // 2, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ac.fit(model, data.x_train, data.y_train, seed=seed, progress=False)
        xs, ys = model.standardize(torch.as_tensor(data.x_train), torch.as_tensor(data.y_train))
        held = torch.zeros(n, dtype=torch.bool)
        held[split_rows(n, RECOMMENDED_FRACTION, seed)[1]] = True
        m, v = leave_one_out(model, xs, ys)
        offset, unit = model.target_offset, model.target_scale
        pred = model.predict(data.x_test)
        out["held"].append(held.numpy())
        out["loo_mean"].append(m.numpy()), out["loo_var"].append(v.numpy())
        out["test_mean"].append(((pred.mean - offset) / unit).detach().numpy())
        out["test_var"].append((pred.observed_variance / unit**2).detach().numpy())
        out["y_train"], out["y_test"] = ys.numpy(), ((torch.as_tensor(data.y_test) - offset) / unit).numpy()
    cell = {key: np.stack(value) if isinstance(value, list) else value for key, value in out.items()}
    # The test NLPD in original units is the standardised one plus log(y's scale).
    return {**cell, "log_unit": math.log(float(model.target_scale)), "seconds": time.perf_counter() - start}


def run(args) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split, os.environ.get("ALACARTE_DATA"))
            for method in args.methods:
                path = Path(args.out) / f"{dataset}-{method}-{split}.npz"
                if path.exists():
                    continue
                cell = run_cell(data, split, method, args.num_features, args.num_draws)
                tmp = path.with_suffix(".tmp.npz")
                np.savez(tmp, **cell)
                os.replace(tmp, path)
                print(dataset, split, method, f"{cell['seconds']:.0f} s", flush=True)


# --- rules: (draw means K×m, variances K×m, saved cell) -> mixture variance at the test rows ---

def _moments(means, variances):
    mean = means.mean(0)
    return mean, variances.mean(0), ((means - mean) ** 2).mean(0)


def _nlpd(y, mean, var) -> float:
    return float(np.mean(0.5 * np.log(2 * math.pi * var) + 0.5 * (y - mean) ** 2 / var))


def _scale_on(y, mean, vbar, spread, prior_rows: float) -> float:
    """The s of N(mean, s·v̄ + spread) with the lowest NLPD on rows (y, …), plus a prior of
    ``prior_rows`` rows at s = 1 (each contributes the NLPD of a row whose standardised residual is 1)."""
    def objective(t: float) -> float:
        s = math.exp(t)
        rows = len(y) * _nlpd(y, mean, s * vbar + spread)
        return rows + prior_rows * 0.5 * (t + 1 / s)

    return math.exp(minimize_scalar(objective, bounds=(-5, 5), method="bounded").x)


def _out_of_bag(cell, prior_rows: float, inner: bool = True) -> float:
    """The scale chosen on the rows some draw held out, each row's mixture from all draws' leave-one-out."""
    rows = cell["held"].any(0)
    mean, vbar, spread = _moments(cell["loo_mean"][:, rows], cell["loo_var"][:, rows])
    y = cell["y_train"][rows]
    if inner:
        return _scale_on(y, mean, vbar, spread, prior_rows)
    return float(((y - mean) ** 2 / (vbar + spread)).mean())


def _honest(cell, prior_rows: float) -> float:
    """The scale chosen on the rows that two or more draws held out, each row's mixture formed from
    those draws alone: every prediction from a draw whose hyperparameters never saw the row."""
    held = cell["held"]
    rows = held.sum(0) >= 2
    if not rows.any():
        return 1.0
    weight = held[:, rows].astype(float)
    count = weight.sum(0)
    mean = (weight * cell["loo_mean"][:, rows]).sum(0) / count
    vbar = (weight * cell["loo_var"][:, rows]).sum(0) / count
    spread = (weight * (cell["loo_mean"][:, rows] - mean) ** 2).sum(0) / count
    return _scale_on(cell["y_train"][rows], mean, vbar, spread, prior_rows)


def _held_only(cell, prior_rows: float) -> float:
    """The scale chosen per draw on its own held-out rows, for the mixture formed there: every draw's
    leave-one-out, the draw that held the row out honest, the others not; averaged over draws."""
    scales = []
    for k in range(cell["held"].shape[0]):
        rows = cell["held"][k]
        mean, vbar, spread = _moments(cell["loo_mean"][:, rows], cell["loo_var"][:, rows])
        scales.append(_scale_on(cell["y_train"][rows], mean, vbar, spread, prior_rows))
    return float(np.exp(np.mean(np.log(scales))))


SHIPPED = "plain v̄ + S (shipped)"
# Each rule: (saved cell, mean variance v̄, spread S of the means at the test rows) -> the mixture's variance.
RULES = {
    SHIPPED: lambda c, v, S: v + S,
    "v̄ − S (floor v̄/K)": lambda c, v, S: np.maximum(v - S, v / c["test_mean"].shape[0]),
    "mean of draws' variances v̄": lambda c, v, S: v,
    "s·v̄ + S, s on out-of-bag rows, no prior": lambda c, v, S: _out_of_bag(c, 0.0) * v + S,
    f"s·v̄ + S, s on out-of-bag rows, prior {SCALE_PRIOR_ROWS}": lambda c, v, S: _out_of_bag(c, SCALE_PRIOR_ROWS) * v + S,
    f"s·v̄ + S, s per draw's held-out rows, prior {SCALE_PRIOR_ROWS}":
        lambda c, v, S: _held_only(c, SCALE_PRIOR_ROWS) * v + S,
    f"s·v̄ + S, s on rows ≥ 2 draws held out, those draws only, prior {SCALE_PRIOR_ROWS}":
        lambda c, v, S: _honest(c, SCALE_PRIOR_ROWS) * v + S,
    "s·(v̄ + S), s on out-of-bag rows": lambda c, v, S: _out_of_bag(c, 0.0, inner=False) * (v + S),
}


def score(cell, rule: str) -> dict:
    """The rule's test NLPD (original units) and 95% coverage on one saved cell."""
    mean, vbar, spread = _moments(cell["test_mean"], cell["test_var"])
    var = RULES[rule](cell, vbar, spread)
    y = cell["y_test"]
    inside = np.abs(y - mean) <= 1.959964 * np.sqrt(var)
    return {"nlpd": _nlpd(y, mean, var) + float(cell["log_unit"]), "cov95": float(inside.mean())}


def report(args) -> str:
    """A markdown table of every rule on every saved cell, and a summary per rule."""
    exact = {(r["dataset"], int(r["split"])): float(r["nlpd"]) for path in args.exact for r in read_rows(path)
             if r["method"] == "exact-ard" and float(r["validation_fraction"]) == 0}
    cells = _cells(args.out)
    rules = list(RULES)
    lines = ["| dataset | kernel | splits | exact ARD | " + " | ".join(rules) + " |",
             "|---|---|---:|---:|" + "---:|" * len(rules)]
    tally = defaultdict(list)  # rule -> [(NLPD − plain, within 0.10 of exact ARD or None, 95% coverage)]
    for (dataset, method), splits in sorted(cells.items()):
        ex = [exact[(dataset, s)] for s in splits if (dataset, s) in exact]
        scored = {rule: [score(cell, rule) for cell in splits.values()] for rule in rules}
        nlpd = {rule: np.mean([r["nlpd"] for r in scored[rule]]) for rule in rules}
        cov = {rule: np.mean([r["cov95"] for r in scored[rule]]) for rule in rules}
        for rule in rules:
            within = nlpd[rule] <= np.mean(ex) + 0.10 if len(ex) == len(splits) else None
            tally[rule].append((nlpd[rule] - nlpd[rules[0]], within, cov[rule]))
        lines.append(f"| {dataset} | {method} | {len(splits)} | " + ("%.3f" % np.mean(ex) if ex else "—") + " | "
                     + " | ".join("%.3f (%.2f)" % (nlpd[rule], cov[rule]) for rule in rules) + " |")
    lines += ["", "| rule | NLPD − plain: mean | median | max | cells lower | within +0.10 of exact ARD "
              "| 95% coverage < 0.90 | mean distance of 95% coverage from 0.95 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rule in rules:
        deltas = np.array([d for d, _, _ in tally[rule]])
        judged = [w for _, w, _ in tally[rule] if w is not None]
        covers = np.array([c for _, _, c in tally[rule]])
        lines.append(f"| {rule} | {deltas.mean():+.3f} | {np.median(deltas):+.3f} | {deltas.max():+.3f} | "
                     f"{int((deltas < 0).sum())}/{len(deltas)} | {sum(judged)}/{len(judged)} | "
                     f"{int((covers < 0.90).sum())}/{len(covers)} | {np.abs(covers - 0.95).mean():.3f} |")
    return "\n".join(lines)


def _cells(out: str) -> dict:
    """{(dataset, method): {split: saved cell}} of the finished cells in ``out``."""
    cells = defaultdict(dict)
    for path in sorted(Path(out).glob("*.npz")):
        if not path.name.endswith(".tmp.npz"):
            dataset, method, split = path.stem.rsplit("-", 2)
            cells[(dataset, method)][int(split)] = dict(np.load(path))
    return cells


def rows(args) -> None:
    """Append the shipped rule's cells (the plain moment-matched mixture, what the estimator predicts)
    to ``args.csv`` as ``calibration.py`` rows (``calibration.py report``: later rows win)."""
    for (dataset, method), splits in sorted(_cells(args.out).items()):
        if args.datasets and dataset not in args.datasets:
            continue
        for split, cell in sorted(splits.items()):
            mean, vbar, spread = _moments(cell["test_mean"], cell["test_var"])
            unit = math.exp(float(cell["log_unit"]))
            var = RULES[SHIPPED](cell, vbar, spread)
            scores = predictive_scores(*(torch.as_tensor(a) for a in (unit * mean, unit**2 * var, unit * cell["y_test"])))
            append_row(args.csv, FIELDS, {
                "dataset": dataset, "split": split, "method": method, "validation_fraction": RECOMMENDED_FRACTION,
                "num_features": args.num_features, "n_train": cell["y_train"].shape[0], **scores, "noise": "",
                "held_out_rows": int(cell["held"][0].sum()), "iterations": "", "seconds": round(float(cell["seconds"]), 1),
                "version": args.version, "num_draws": cell["held"].shape[0]})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--methods", nargs="+", default=["fsard", "gm"])
    r.add_argument("--splits", default="0-2")
    r.add_argument("--num-features", type=int, default=1024)
    r.add_argument("--num-draws", type=draws_setting, default="auto",
                   help="feature draws per cell (default: the estimator's rule); the first five are the default's")
    p = sub.add_parser("report")
    p.add_argument("out")
    p.add_argument("--exact", nargs="*", default=["experiments/results/calibration.csv"])
    w = sub.add_parser("rows")
    w.add_argument("out")
    w.add_argument("--csv", required=True)
    w.add_argument("--num-features", type=int, default=1024)
    w.add_argument("--datasets", nargs="*", help="only these datasets' cells (default: all)")
    w.add_argument("--version", required=True, help="the version the cells were fitted with (their snapshot's)")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "rows":
        rows(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
