"""What ``fit(checkpoint=path)`` costs: fits of the UCI benchmark's protocol with and without a checkpoint.

For each (dataset, method) — split 0, M = 512 (D = 1024), 5 restarts × 15 L-BFGS
iterations then ``--max-iter``, float64, one thread — the same fit runs

* without a checkpoint (the reference),
* with a checkpoint at the default interval (one write at the start of every
  stage, then one every 10 s: what ``alacarte bench run`` does in every cell),
* with a write at every iteration (the worst case: interval 0),

and the table gives the wall time of each, the writes, the seconds spent in them
(timed around each write), the file's size, and the one-off cost of the key's
SHA-256 fingerprints of the model and the data.  The fitted losses are checked
equal: a checkpoint must not change the fit.

Usage::

    python experiments/bench_checkpoint.py [--data ../shared/uci] [--out PATH]

writes experiments/results/checkpoint.md unless ``--out`` says otherwise (and prints it).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import alacarte.training._stages as stages  # noqa: E402
from alacarte import fit, load_uci  # noqa: E402
from alacarte._checkpoint import FitCheckpoint, data_fingerprint, model_fingerprint  # noqa: E402
from alacarte.bench.settings import mixture_components, model_name, package_version  # noqa: E402
from alacarte.factory import make_model  # noqa: E402

CASES = [("yacht", "gm"), ("energy", "exact-ard"), ("pumadyn32nm", "fsard")]
PROTOCOL = dict(restarts=5, restart_iter=15, seed=0, progress=False)


def build(method: str, n: int, d: int):
    return make_model(model_name(method, n), d, num_samples=512, num_components=mixture_components("auto", n), seed=0)


def timed_fit(data, method: str, max_iter: int, checkpoint: str | None, interval: float | None):
    """(seconds, final loss, writes, seconds writing, bytes of the file)."""
    writes = []
    save = FitCheckpoint.save

    def timed_save(self, progress):
        start = time.perf_counter()
        save(self, progress)
        writes.append(time.perf_counter() - start)

    model = build(method, *data.x_train.shape)
    FitCheckpoint.save = timed_save
    default_interval = stages.CHECKPOINT_INTERVAL
    if interval is not None:
        stages.CHECKPOINT_INTERVAL = interval
    try:
        start = time.perf_counter()
        history = fit(model, data.x_train, data.y_train, max_iter=max_iter, checkpoint=checkpoint, **PROTOCOL)
        seconds = time.perf_counter() - start
    finally:
        FitCheckpoint.save = save
        stages.CHECKPOINT_INTERVAL = default_interval
    size = os.path.getsize(checkpoint) if checkpoint else 0
    return seconds, history.loss[-1], len(writes), sum(writes), size


def fingerprint_seconds(data, method: str) -> float:
    model = build(method, *data.x_train.shape)
    x, y = (torch.as_tensor(a) for a in (data.x_train, data.y_train))
    start = time.perf_counter()
    model_fingerprint(model)
    data_fingerprint([(x, y)])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "checkpoint.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)

    lines = [
        "# What a fit checkpoint costs",
        "",
        f"Command: `{' '.join(['python', 'experiments/bench_checkpoint.py', *sys.argv[1:]])}`",
        "",
        f"alacarte {package_version()}, torch {torch.__version__}, {platform.machine()}, 1 torch thread. Split 0 of each dataset, the UCI "
        f"benchmark's protocol (M = 512, D = 1024; 5 restarts × 15 L-BFGS iterations, then {args.max_iter}), "
        "float64. One fit per row. Wall times of single fits vary from run to run with the machine's load "
        "(measured: under the table), so the seconds writing, timed around each write, are the firm "
        "measure: *writing / fit* is them over the fit without a checkpoint.",
        "",
        "| dataset | n | method | checkpoint | fit s | vs none | writes | s writing | writing / fit | file MB | fingerprints s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    load = [os.getloadavg()[0]]
    # The first fit of a process pays one-off costs (allocator, kernels' first calls) that would
    # otherwise land on the first row's reference.
    warm_up = load_uci(CASES[0][0], 0, args.data)
    timed_fit(warm_up, CASES[0][1], 1, None, None)
    with tempfile.TemporaryDirectory() as tmp:
        for dataset, method in CASES:
            data = load_uci(dataset, 0, args.data)
            n = data.x_train.shape[0]
            reference = timed_fit(data, method, args.max_iter, None, None)
            fingerprints = fingerprint_seconds(data, method)
            variants = [("none", reference)]
            for label, interval in (("every 10 s (default)", None), ("every iteration", 0.0)):
                path = os.path.join(tmp, f"{dataset}-{method}-{interval}.ckpt")
                variants.append((label, timed_fit(data, method, args.max_iter, path, interval)))
            for label, (seconds, loss, writes, writing, size) in variants:
                if loss != reference[1]:
                    raise SystemExit(f"{dataset} {method} ({label}): final loss {loss!r} != {reference[1]!r} "
                                     "without a checkpoint")
                lines.append(
                    f"| {dataset} | {n} | {model_name(method, n)} | {label} | {seconds:.1f} | "
                    f"{seconds / reference[0]:.3f}× | {writes} | {writing:.3f} | {100 * writing / reference[0]:.2f}% | "
                    f"{size / 2**20:.2f} | "
                    f"{'' if label == 'none' else f'{fingerprints:.3f}'} |"
                )
                print(lines[-1], flush=True)
    load.append(os.getloadavg()[0])
    lines += ["", "Final losses are equal with and without a checkpoint in every row (checked by the script). "
              f"1-minute load average: {load[0]:.1f} at the start of the run, {load[1]:.1f} at its end "
              f"({os.cpu_count()} cores)."]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
