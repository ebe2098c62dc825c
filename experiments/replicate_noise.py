"""A probe of a noise term per distinct input (docs/calibration.md, "Repeated inputs"): GM on wine.

The model y = f(x) + h_g + e, with h_g ~ N(0, s) for each distinct input g and e ~ N(0, σ²) for each row,
factorises into a GP on the group means ȳ_g with noise s + σ²/m_g and a within-group term that sets σ².
Where σ² → 0 (wine's repeats never differ) the means' noise is s for every group, so the estimator's GM,
fitted at its defaults on the distinct inputs and their mean targets, learns s as its noise. A test row at
a training input g is then predicted N(ȳ_g, σ²(1 + 1/m_g)) — the latent f + h_g is pinned by ȳ_g — and
any other test row by the fit, plus σ²; σ² is the within-group variance, floored at 10⁻⁴·var(y) (the
likelihood's floor on standardised targets). This is the σ² → 0 limit of the model, not the model itself.

    python experiments/replicate_noise.py run --out experiments/results/replicate_noise.jsonl --splits 0-9
    python experiments/replicate_noise.py report experiments/results/replicate_noise.jsonl

One JSON line per split, appended as it finishes (a killed run resumes); data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench import parse_splits, predictive_scores  # noqa: E402
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)
from repeated_inputs import input_groups, within_group_variance  # noqa: E402

FLOOR = 1e-4  # the noise constraint's lower bound on standardised targets


def distinct_inputs(x: np.ndarray, y: np.ndarray):
    """``(index, x_g, ȳ_g, m_g, σ²)``: each distinct row of ``x`` (``index`` maps its bytes to its position),
    its mean target and count, and the pooled within-group variance, floored at ``FLOOR·var(y)``."""
    groups = input_groups(x)
    rows = list(groups.values())
    within = within_group_variance(y, groups)
    sigma2 = max(0.0 if np.isnan(within) else within, FLOOR * float(y.var()))
    index = {key: g for g, key in enumerate(groups)}
    y_mean, counts = np.array([y[r].mean() for r in rows]), np.array([len(r) for r in rows])
    return index, x[[r[0] for r in rows]], y_mean, counts, sigma2


def replicate_predictive(mean, var, x_test, index, y_mean, m, sigma2):
    """The predictive mean and variance of each test row (module docstring), and which rows repeat a training
    input; ``mean`` and ``var`` are the distinct-input fit's, its noise s included."""
    mean, var = np.array(mean, dtype=np.float64), np.asarray(var, dtype=np.float64) + sigma2
    repeat = np.zeros(len(mean), dtype=bool)
    for i, row in enumerate(np.ascontiguousarray(x_test, dtype=np.float64)):
        g = index.get(row.tobytes())
        if g is not None:
            repeat[i], mean[i], var[i] = True, y_mean[g], sigma2 * (1 + 1 / m[g])
    return mean, var, repeat


def run_split(dataset: str, split: int, data_dir) -> dict:
    data = ac.load_uci(dataset, split, data_dir)
    x, y = np.asarray(data.x_train, dtype=np.float64), np.asarray(data.y_train, dtype=np.float64).ravel()
    x_test, y_test = np.asarray(data.x_test, dtype=np.float64), np.asarray(data.y_test, dtype=np.float64).ravel()
    index, x_g, y_g, m, sigma2 = distinct_inputs(x, y)
    reg = ac.AlaCarteRegressor("gm").fit(x_g, y_g)
    fit_mean, fit_std = reg.predict(x_test, return_std=True)
    mean, var, repeat = replicate_predictive(fit_mean, fit_std**2, x_test, index, y_g, m, sigma2)

    def scores(mean, var, rows=slice(None)) -> dict:
        return predictive_scores(*(torch.as_tensor(a[rows]) for a in (mean, var, y_test)))

    probe, model = scores(mean, var), reg.models_[0]
    return {"dataset": dataset, "split": split, "n_distinct": len(y_g), "n_train": len(y), "sigma2": sigma2,
            "s": float(model.likelihood.noise.item() * model.target_scale**2),
            "test_repeats": int(repeat.sum()), "n_test": len(y_test), "nlpd": probe["nlpd"],
            "nlpd_repeats": scores(mean, var, repeat)["nlpd"] if repeat.any() else None,
            "nlpd_new": scores(mean, var, ~repeat)["nlpd"],
            "nlpd_distinct_fit_alone": scores(fit_mean, fit_std**2)["nlpd"],
            "rmse": probe["rmse"], "coverage95": probe["coverage95"]}


def report(rows: list[dict]) -> str:
    lines = ["| split | distinct / train rows | σ² | s | test rows repeating | NLPD | at repeats | elsewhere | "
             "the fit alone | RMSE | cov. 95% |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: r["split"]):
        lines.append(f"| {r['split']} | {r['n_distinct']} / {r['n_train']} | {r['sigma2']:.2g} | {r['s']:.3f} | "
                     f"{r['test_repeats']} / {r['n_test']} | {r['nlpd']:.3f} | {r['nlpd_repeats']:.2f} | "
                     f"{r['nlpd_new']:.3f} | {r['nlpd_distinct_fit_alone']:.3f} | {r['rmse']:.3f} | "
                     f"{r['coverage95']:.3f} |")
    mean = {k: statistics.mean(r[k] for r in rows) for k in ("nlpd", "nlpd_distinct_fit_alone", "rmse", "coverage95")}
    lines.append(f"\nMean over {len(rows)} splits: NLPD {mean['nlpd']:.3f} (the distinct-input fit alone "
                 f"{mean['nlpd_distinct_fit_alone']:.3f}), RMSE {mean['rmse']:.3f}, 95% coverage {mean['coverage95']:.3f}.")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--dataset", default="wine")
    run.add_argument("--splits", default="0-9", type=parse_splits)
    run.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    rep = sub.add_parser("report")
    rep.add_argument("jsonl", type=Path)
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(read_rows(args.jsonl)))
        return
    done = {(r["dataset"], r["split"]) for r in read_rows(args.out)}
    for split in args.splits:
        if (args.dataset, split) not in done:
            row = run_split(args.dataset, split, args.data)
            append_row(args.out, row)
            print(row, flush=True)


if __name__ == "__main__":
    main()
