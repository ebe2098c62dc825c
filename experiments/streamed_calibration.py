"""Does a streamed fit, which holds no rows out, predict as well as the in-memory default fit?

    python experiments/streamed_calibration.py --out OUT.jsonl --datasets kin40k protein --kernels gm fsard
    python experiments/streamed_calibration.py --out OUT.jsonl --report

The same model (D = 512, seed 0) fitted at ``alacarte.fit``'s defaults on UCI split 0 twice: with the rows
in memory (20% held out to choose iterates and set σ² and the band's scale, then conditioned on all rows)
and streamed in chunks (``chunk_size``; the marginal likelihood of all rows alone, the streamed posterior
for prediction). One thread; scored by ``alacarte.bench.scores.predictive_scores`` in the targets' units.
One JSON line per fit, appended as it finishes (a killed run resumes). Data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.factory import make_model  # noqa: E402

PATHS = {"in-memory": {}, "streamed": {"chunk_size": 4096}}


def run(args) -> None:
    torch.set_num_threads(1)
    done = {(r["dataset"], r["kernel"], r["path"]) for r in read_rows(args.out)}
    for dataset in args.datasets:
        data = ac.load_uci(dataset, 0, None)
        for kernel in args.kernels:
            for path, options in PATHS.items():
                if (dataset, kernel, path) in done:
                    continue
                model = make_model(kernel, data.x_train.shape[1], num_samples=256, seed=0).double()
                start = time.process_time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    history = ac.fit(model, data.x_train, data.y_train, seed=0, progress=False, **options)
                seconds = time.process_time() - start
                pred = model.predict(data.x_test)
                row = {"dataset": dataset, "kernel": kernel, "path": path, "cpu_seconds": round(seconds, 1),
                       "held_out_rows": history.held_out_rows, "noise": float(model.likelihood.noise.detach()),
                       **predictive_scores(pred.mean, pred.observed_variance, torch.as_tensor(data.y_test))}
                append_row(args.out, row)
                print(row, flush=True)


def report(args) -> str:
    lines = ["| dataset | kernel | fit | held-out rows | RMSE | NLPD | cov 50% | cov 95% | std/RMSE | CPU s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in read_rows(args.out):
        lines.append(f"| {r['dataset']} | {r['kernel']} | {r['path']} | {r['held_out_rows']} | {r['rmse']:.4f} | "
                     f"{r['nlpd']:.3f} | {r['coverage50']:.3f} | {r['coverage95']:.3f} | "
                     f"{r['std_over_rmse']:.2f} | {r['cpu_seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", default=["kin40k", "protein"])
    parser.add_argument("--kernels", nargs="+", default=["gm"])
    parser.add_argument("--report", action="store_true", help="print the table of OUT instead of running")
    args = parser.parse_args(argv)
    print(report(args)) if args.report else run(args)


if __name__ == "__main__":
    main()
