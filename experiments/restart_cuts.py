"""Would cutting restarts short choose the same restart? Per-iteration held-out scores of `fit`'s restarts.

    python experiments/restart_cuts.py run --out OUT.jsonl --datasets yacht concrete --kernels gm fsard --splits 0 1 2
    python experiments/restart_cuts.py report OUT.jsonl

`alacarte.fit`'s defaults (5 restarts × 15 iterations, then 100; 20% of the rows held out), D = 512,
UCI split s with seed s; each restart's held-out score after every iteration is recorded. A successive-
halving schedule (every restart for k iterations, the best m of them on to 15) leaves the fit exactly as
it is wherever the restart the fit chooses is among those m at iteration k: the survivors' optimisations
are the same ones, continued. The report counts, for several (k, m), how often that holds, and by how
much the chosen restart's score is worse where it does not. One JSON line per fit, appended as it
finishes (a killed run resumes). Data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

import alacarte as ac  # noqa: E402
from alacarte.factory import make_model  # noqa: E402
from alacarte.training import _fit, _stages  # noqa: E402

RESTART_ITER = 15


class _Recording(_stages.Training):
    """fit's stages, keeping each restart's per-iteration held-out scores."""

    traces: list[list[float]] = []

    def _restart(self, restart: int) -> None:
        super()._restart(restart)
        _Recording.traces.append(list(self.validation))


def run(args) -> None:
    torch.set_num_threads(1)
    done = {(r["dataset"], r["kernel"], r["split"]) for r in read_rows(args.out)}
    _fit.Training = _Recording  # the class fit builds its stages from
    for dataset in args.datasets:
        for split in args.splits:
            data = ac.load_uci(dataset, split, None)
            for kernel in args.kernels:
                if (dataset, kernel, split) in done:
                    continue
                _Recording.traces = []
                model = make_model(kernel, data.x_train.shape[1], num_samples=256, seed=split).double()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    history = ac.fit(model, data.x_train, data.y_train, seed=split, progress=False)
                append_row(args.out, {"dataset": dataset, "kernel": kernel, "split": split,
                                      "traces": _Recording.traces, "chosen": history.chosen_restart})
                print(dataset, kernel, split, history.chosen_restart, flush=True)


def _best(trace: list[float], iterations: int) -> float:
    """The best score within the first ``iterations`` iterations (index 0 is the start)."""
    finite = [v for v in trace[: iterations + 1] if v is not None and math.isfinite(v)]
    return min(finite) if finite else math.inf


def report(args) -> str:
    rows = [r for r in read_rows(args.out) if len(r["traces"]) > 1]
    lines = [f"{len(rows)} fits. Cut at k iterations, keep the best m restarts on to {RESTART_ITER}:", "",
             "| k | m | restart iterations | chosen restart survives | score lost where not: median, max |",
             "|---:|---:|---:|---:|---|"]
    for k in (3, 5, 8):
        for m in (1, 2, 3):
            kept, lost = 0, []
            for r in rows:
                traces = r["traces"]
                full = [_best(t, RESTART_ITER) for t in traces]
                winner = min(range(len(traces)), key=full.__getitem__)
                early = sorted(range(len(traces)), key=lambda i: _best(traces[i], k))[:m]
                if winner in early:
                    kept += 1
                else:
                    lost.append(min(full[i] for i in early) - full[winner])
            lost.sort()
            spent = len(rows[0]["traces"]) * k + m * (RESTART_ITER - k)
            where = f"{lost[len(lost) // 2]:.3f}, {lost[-1]:.3f}" if lost else "–"
            lines.append(f"| {k} | {m} | {spent} of {len(rows[0]['traces']) * RESTART_ITER} | {kept} of {len(rows)} "
                         f"({100 * kept / len(rows):.0f}%) | {where} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--datasets", nargs="+", required=True)
    r.add_argument("--kernels", nargs="+", default=["gm", "fsard", "fsgbard", "pwl"])
    r.add_argument("--splits", nargs="+", type=int, default=[0, 1, 2])
    p = sub.add_parser("report")
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
