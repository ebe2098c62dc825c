"""Lengthscales (GM: scales) as softplus arguments (GPyTorch's default) against their logarithm: the same fit otherwise.

    python experiments/log_lengthscales.py run OUT.jsonl --datasets yacht housing --methods fsard pwl exact-ard \
        --splits 0-2 [--parameterisations softplus log]
    python experiments/log_lengthscales.py report OUT.jsonl [...] > experiments/results/log_lengthscales.md

``run`` fits each (dataset, split, method, parameterisation) once, as ``calibration.py run --num-draws 1`` does
(seed = split, ``alacarte.fit``'s defaults, GM's and PWL's ``--num-components`` as there; exact GPs
with no rows held out, above n = 2 000 as their Fastfood expansion), with the constraint of the lengthscale
(GM: of its scales σ = 1/ℓ) replaced by the one named, and appends one fsync'ed JSON line per fit (a killed
run resumes).  ``report`` pairs the two parameterisations per cell.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from gpytorch.constraints import Positive

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.settings import parse_splits  # noqa: E402
from alacarte.holdout import RECOMMENDED_FRACTION  # noqa: E402
from alacarte.kernels._params import log_positive  # noqa: E402
from _jsonl_rows import append_row, read_rows  # noqa: E402
from calibration import SHIPPED_COMPONENTS, cell_model, fit_draws  # noqa: E402

CONSTRAINTS = {"softplus": Positive, "log": log_positive}


def fit_one(data, split: int, method: str, parameterisation: str, num_samples: int, num_components) -> dict:
    """``calibration.py``'s one-draw fit of the cell, with the lengthscale's (GM: scales') constraint replaced."""
    def build(seed: int):
        model = cell_model(method, data, seed, num_samples, num_components)
        kernel, name = scale_parameter(model)
        kernel.register_constraint(f"raw_{name}", CONSTRAINTS[parameterisation]())
        return model

    fraction = 0.0 if method.startswith("exact") else RECOMMENDED_FRACTION
    start = time.process_time()
    scores, (model,), (history,) = fit_draws(data, split, 1, build, validation_fraction=fraction)
    seconds = time.process_time() - start
    kernel, name = scale_parameter(model)
    value = getattr(kernel, name).detach().flatten()
    lengthscale = value if name == "lengthscale" else 1.0 / value
    return {**scores, "iterations": history.iterations, "cpu_s": round(seconds, 1),
            "lengthscale_min": float(lengthscale.min()), "lengthscale_max": float(lengthscale.max()),
            "noise": float(model.likelihood.noise.detach().min())}


def scale_parameter(model) -> tuple:
    """The kernel that holds the lengthscale (an exact GP's is inside its ScaleKernel) and the parameter's
    name: ``"scales"`` for GM, whose σ are inverse lengthscales, else ``"lengthscale"``."""
    kernel = getattr(model.covar_module, "base_kernel", model.covar_module)
    return kernel, ("scales" if hasattr(kernel, "raw_scales") else "lengthscale")


def run(args) -> None:
    torch.set_default_dtype(torch.float64)
    done = {(r["dataset"], r["split"], r["method"], r["parameterisation"]) for r in read_rows(args.out)}
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            data = ac.load_uci(dataset, split, args.data)
            for method in args.methods:
                for parameterisation in args.parameterisations:
                    key = (dataset, split, method, parameterisation)
                    if key in done:
                        continue
                    row = {"dataset": dataset, "split": split, "method": method,
                           "parameterisation": parameterisation,
                           **fit_one(data, split, method, parameterisation, args.num_samples, args.num_components)}
                    append_row(args.out, row)
                    print(f"{dataset} {split} {method} {parameterisation}: rmse {row['rmse']:.4g} "
                          f"nlpd {row['nlpd']:.3f} ({row['cpu_s']} s)", flush=True)


def report(args) -> str:
    cells = {}
    for path in args.jsonl:
        for r in read_rows(path):
            cells[(r["dataset"], r["split"], r["method"], r["parameterisation"])] = r
    lines = ["| dataset | split | method | softplus: RMSE, NLPD, cov 95%, iterations | log ℓ: RMSE, NLPD, cov 95%, "
             "iterations | NLPD log − softplus | RMSE log / softplus |", "|---|---:|---|---|---|---:|---:|"]
    changes: dict[str, list[tuple[float, float]]] = {}
    for (dataset, split, method, parameterisation), old in sorted(cells.items()):
        new = cells.get((dataset, split, method, "log"))
        if parameterisation != "softplus" or new is None:
            continue
        shown = [f"{r['rmse']:.4g}, {r['nlpd']:.3f}, {r['coverage95']:.3f}, {r['iterations']}" for r in (old, new)]
        delta, ratio = new["nlpd"] - old["nlpd"], new["rmse"] / old["rmse"]
        lines.append(f"| {dataset} | {split} | {method} | {shown[0]} | {shown[1]} | {delta:+.3f} | {ratio:.3f} |")
        changes.setdefault(method, []).append((delta, ratio))
    lines += ["", "| method | cells | NLPD change: mean, median | lower NLPD with log ℓ | RMSE ratio: median |",
              "|---|---:|---|---:|---:|"]
    for method, pairs in sorted(changes.items()):
        deltas = [d for d, _ in pairs]
        lines.append(f"| {method} | {len(pairs)} | {statistics.mean(deltas):+.3f}, {statistics.median(deltas):+.3f} | "
                     f"{sum(d < 0 for d in deltas)} | {statistics.median(r for _, r in pairs):.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--methods", nargs="+", default=["fsard", "pwl", "exact-ard"])
    r.add_argument("--splits", default="0-2")
    r.add_argument("--parameterisations", nargs="+", choices=sorted(CONSTRAINTS), default=["softplus", "log"])
    r.add_argument("--num-samples", type=int, default=512)
    r.add_argument("--num-components", default=str(SHIPPED_COMPONENTS),
                   help=f"GM/PWL components: a number or runner (the UCI runner's rule; default {SHIPPED_COMPONENTS})")
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
