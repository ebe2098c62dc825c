"""Fit FSARD on SE1 data-parallel over torchrun processes (or in one plain process) and report test RMSE.

Every process generates the same SE1 draw (seed), keeps its contiguous shard of
the training rows, writes it to a memory-mapped ``.npy`` file and trains on
that file (so the rows are read from disk chunk by chunk, as they would be for
data that does not fit in memory).  Statistics and gradients are summed over
the processes (:mod:`alacarte.distributed`); rank 0 reports.

Usage::

    # one machine, two processes (gloo on CPU; nccl when CUDA is available)
    torchrun --standalone --nproc_per_node=2 experiments/train_distributed.py --n-train 1000000
    # several machines: on each, with node ranks 0..N-1 and HOST0 reachable by all
    torchrun --nnodes=N --node_rank=$NODE_RANK --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST0:29400 --rdzv_id=alacarte experiments/train_distributed.py --n-train 100000000
    # one process, no torch.distributed
    python experiments/train_distributed.py --n-train 1000000 --num-samples 128 --out experiments/results/streaming_fit.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import alacarte  # noqa: E402
import alacarte.distributed as ad  # noqa: E402
from alacarte import FeatureGP, FSARDKernel  # noqa: E402
from alacarte.datasets import make_se1  # noqa: E402


class _Log:
    """Progress lines with wall-clock time, flushed (the run may be long)."""

    def __init__(self, enabled: bool):
        self.enabled, self.start = enabled, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.perf_counter() - self.start:8.1f} s] {message}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", dest="n", type=int, default=1_000_000, help="training rows")
    parser.add_argument("--n-test", type=int, default=10_000)
    parser.add_argument("--num-samples", type=int, default=128, help="frequencies M (D = 2M features)")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--memory-budget", type=int, default=256 * 2**20, help="bytes per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a missing peer is an error")
    parser.add_argument("--data", default=os.path.join("/tmp", "alacarte_train"))
    parser.add_argument("--out", default=None, help="write a markdown report here (rank 0)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    distributed = "RANK" in os.environ
    if distributed:
        ad.init(timeout=args.timeout)
    rank = torch.distributed.get_rank() if distributed else 0
    world = torch.distributed.get_world_size() if distributed else 1
    log = _Log(rank == 0)

    x, y, _ = make_se1(args.n + args.n_test, seed=args.seed)
    x_test, y_test = x[args.n :], y[args.n :]
    rows = ad.shard(args.n, rank, world)
    os.makedirs(args.data, exist_ok=True)
    paths = [os.path.join(args.data, f"se1_{args.n}_{args.seed}_{rank}of{world}_{part}.npy") for part in "xy"]
    np.save(paths[0], x[rows])
    np.save(paths[1], y[rows])
    del x, y
    x_train, y_train = (np.load(path, mmap_mode="r") for path in paths)
    log(f"{world} process(es); rank 0 holds rows {rows.start}–{rows.stop - 1} of {args.n}")

    d = x_test.shape[1]
    model = FeatureGP(None, None, FSARDKernel(d, args.num_samples, ard_num_dims=d, seed=args.seed))
    if distributed and torch.distributed.get_backend() == "nccl":
        model = model.cuda()  # ad.init chose GPU LOCAL_RANK; chunks are moved there as they are read
    fit_kwargs = dict(max_iter=args.max_iter, restarts=1, restart_iter=5, tolerance=args.tolerance,
                      memory_budget=args.memory_budget, seed=args.seed, progress=rank == 0)
    load = [os.getloadavg()[0]]  # 1-minute load average, measured for the report
    start = time.perf_counter()
    if distributed:
        history = ad.fit(model, x_train, y_train, **fit_kwargs)
    else:
        history = alacarte.fit(model, x_train, y_train, **fit_kwargs)
    seconds = time.perf_counter() - start
    load.append(os.getloadavg()[0])
    pred = model.predict(x_test)
    pred = type(pred)(*(t.cpu() for t in pred))
    rmse = float((pred.mean - torch.as_tensor(y_test)).pow(2).mean().sqrt())
    nlpd = float((0.5 * ((torch.as_tensor(y_test) - pred.mean) ** 2 / pred.observed_variance
                         + pred.observed_variance.log() + np.log(2 * np.pi))).mean())
    result = {
        "n": args.n, "n_test": args.n_test, "processes": world, "M": args.num_samples, "D": 2 * args.num_samples,
        "iterations": history.iterations, "converged": history.converged, "fit_seconds": seconds, "load": load,
        "final_loss": history.loss[-1], "test_rmse": rmse, "test_nlpd": nlpd,
        "noise_std": float(model.likelihood.noise.detach().sqrt() * model.target_scale),
        "relevance": (1 / model.covar_module.lengthscale.detach().reshape(-1)).tolist(),
    }
    log(json.dumps(result))
    if rank == 0 and args.out:
        relevance = np.array(result["relevance"])
        top = np.argsort(-relevance)[:6]
        launcher = f"torchrun --standalone --nproc_per_node={world} " if distributed else "python "
        lines = [
            f"# Full streamed fit of FSARD on {args.n:,} SE1 points",
            "",
            f"Command: `{launcher}{' '.join(sys.argv)}`",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, 1-minute load average {load[0]:.1f} at the "
            f"start of the fit and {load[1]:.1f} at its end, {args.threads} torch thread(s) per process, float64. "
            f"Training rows read from a memory-mapped `.npy` file, memory budget {args.memory_budget // 2**20} MiB; one data-driven restart (5 iterations) "
            f"then L-BFGS until the loss changes by < {args.tolerance:g} (relative) three times in a row "
            f"or {args.max_iter} iterations.",
            "",
            "| n train | n test | processes | D | iterations | converged | fit time (min) | test RMSE | test NLPD | noise std |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
            f"| {args.n:,} | {args.n_test:,} | {world} | {result['D']} | {result['iterations']} | "
            f"{result['converged']} | {seconds / 60:.1f} | {rmse:.4f} | {nlpd:.4f} | {result['noise_std']:.4f} |",
            "",
            "The targets' noise std is 0.1 (the RMSE floor). Largest learned relevances 1/ℓ: "
            + ", ".join(f"x{i + 1}: {relevance[i]:.2f}" for i in top)
            + " (SE1 depends on x1, x3, x7, x8, x9).",
        ]
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
