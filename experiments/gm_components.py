"""GM's (and PWL's) number of components Q, and choosing it by the held-out rows' score.

    python experiments/gm_components.py run OUT.jsonl --datasets sml yacht --splits 0-2 [--method pwl] [--components 1 4]
    python experiments/gm_components.py report OUT.jsonl [...] > experiments/results/gm_components.md

GM gives each of its Q components M/Q of the M frequencies, so at a fixed D a mixture whose data want one
Gaussian spends a quarter of its features on it (Q = 4).  ``run`` fits each (dataset, split, Q) as
``calibration.py run`` fits a GM cell (``calibration.cell_model``, ``alacarte.fit``'s defaults, the
estimator's number of feature draws), and appends one fsync'ed JSON line per cell with its test scores and
its held-out score: the mean over draws of the best held-out NLPD ``fit`` reached (standardised units), the
score by which ``fit`` already chooses among restarts.  ``report`` pairs the components per split and scores
the rule "the Q with the lower held-out score".
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.settings import package_version, parse_splits  # noqa: E402
from alacarte.factory import draws_for_features  # noqa: E402
from _jsonl_rows import append_row, read_rows  # noqa: E402
from calibration import cell_model, fit_draws  # noqa: E402


def fit_cell(data, split: int, method: str, components: int, num_samples: int) -> dict:
    draws = draws_for_features("auto", 2 * num_samples, data.x_train.shape[0])
    start = time.process_time()
    scores, _, histories = fit_draws(data, split, draws, lambda seed: cell_model(method, data, seed, num_samples,
                                                                               components))
    held_out = statistics.mean(min(h.validation_loss) for h in histories)
    # The restarts' best held-out score: whether the short restarts alone would choose Q as well.
    restarts = statistics.mean(min(h.restart_losses) for h in histories)
    return {**scores, "held_out": held_out, "restart_held_out": restarts, "num_draws": draws, "iterations": histories[0].iterations,
            "cpu_s": round(time.process_time() - start, 1), "version": package_version()}


def run(args) -> None:
    torch.set_default_dtype(torch.float64)
    done = {(r["dataset"], r["split"], r.get("method", "gm"), r["components"]) for r in read_rows(args.out)}
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split, args.data)
            for components in args.components:
                if (dataset, split, args.method, components) in done:
                    continue
                row = {"dataset": dataset, "split": split, "method": args.method, "components": components,
                       **fit_cell(data, split, args.method, components, args.num_samples)}
                append_row(args.out, row)
                print(f"{dataset} {split} {args.method} Q={components} ×{row['num_draws']}: nlpd {row['nlpd']:.3f} "
                      f"held-out {row['held_out']:.3f} ({row['cpu_s']} s)", flush=True)


def report(args) -> str:
    cells: dict[tuple, dict[int, dict]] = {}
    for path in args.jsonl:
        for r in read_rows(path):
            cells.setdefault((r.get("method", "gm"), r["dataset"], r["split"]), {})[r["components"]] = r
    qs = sorted({q for by_q in cells.values() for q in by_q})
    lines = ["| kernel | dataset | split | " + " | ".join(f"Q = {q}: NLPD (held-out)" for q in qs)
             + f" | chosen Q | lower test NLPD | NLPD chosen − Q = {max(qs)} |",
             "|---|---|---:|" + "---|" * len(qs) + "---:|---:|---:|"]
    changes, right = [], 0
    for (method, dataset, split), by_q in sorted(cells.items()):
        if set(by_q) != set(qs):
            continue
        chosen = min(qs, key=lambda q: by_q[q]["held_out"])
        better = min(qs, key=lambda q: by_q[q]["nlpd"])
        shown = " | ".join(f"{by_q[q]['nlpd']:.3f} ({by_q[q]['held_out']:.3f})" for q in qs)
        changes.append(by_q[chosen]["nlpd"] - by_q[max(qs)]["nlpd"])
        right += chosen == better
        lines.append(f"| {method} | {dataset} | {split} | {shown} | {chosen} | {better} | {changes[-1]:+.3f} |")
    lines += ["", "Means over the splits above:", "",
              "| kernel | dataset | Q | test RMSE | NLPD | 95% coverage |", "|---|---|---:|---:|---:|---:|"]
    for method, dataset in sorted({(m, d) for m, d, _ in cells}):
        paired = [by_q for (m, d, _), by_q in sorted(cells.items())
                  if (m, d) == (method, dataset) and set(by_q) == set(qs)]
        if not paired:
            continue
        for q in qs:
            means = [statistics.mean(by_q[q][name] for by_q in paired) for name in ("rmse", "nlpd", "coverage95")]
            lines.append(f"| {method} | {dataset} | {q} | {means[0]:.4g} | {means[1]:.3f} | {means[2]:.3f} |")
    if changes:
        lines += ["", f"The held-out score chose the Q with the lower test NLPD on {right} of {len(changes)} splits; "
                  f"mean NLPD change against Q = {max(qs)}: {statistics.mean(changes):+.3f}."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--splits", default="0-2")
    r.add_argument("--method", choices=["gm", "pwl"], default="gm", help="the mixture kernel (default gm)")
    r.add_argument("--components", nargs="+", type=int, default=[1, 4])
    r.add_argument("--num-samples", type=int, default=512)
    r.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    p = sub.add_parser("report")
    p.add_argument("jsonl", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
