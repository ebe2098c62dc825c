"""Peak memory and time per likelihood + gradient evaluation: streamed vs in-memory vs GPyTorch.

SE1-like data (d = 18, x ~ N(0, I), MATH.md §8) with n = 10⁵, 10⁶, 2·10⁶ rows,
FSARD with M = 1024 frequencies (D = 2048 features), float64, one torch
thread per process.  Every configuration runs in a fresh subprocess and reports
its peak resident memory (``resource.getrusage(...).ru_maxrss``, which
includes the interpreter, torch and any memory-mapped pages it touched):

* ``streamed``: :func:`alacarte.streaming.streamed_negative_mll` over the rows
  of a memory-mapped ``.npy`` file (``memory_budget`` 512 MiB);
* ``in-memory``: ``WoodburyMarginalLogLikelihood`` on all rows as tensors;
* ``gpytorch``: ``ExactGP`` + ``ScaleKernel(RFFKernel(num_samples=1024))`` under
  ``ExactMarginalLogLikelihood``, whose ``LowRankRootAddedDiagLinearOperator``
  takes GPyTorch's low-rank path (Woodbury solve and capacitance-matrix
  Cholesky for the log-determinant);
* ``streamed x2``: the streamed path on 2 gloo processes, each with half the rows.

Configurations that need the n×D feature matrix where it cannot fit in 24 GB
(n·D·8 B ≥ 16 GB, twice that with its gradient) are listed as not run.  Each
finished configuration is appended to ``--raw`` (JSON lines) and the table is
rewritten, so an interrupted run resumes where it stopped.

Usage::

    python experiments/bench_streaming.py [--ns 100000 1000000 2000000] [--data /tmp/alacarte_bench]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

NUM_SAMPLES = 1024
MEMORY_BUDGET = 512 * 2**20
RESULTS = os.path.join(os.path.dirname(__file__), "results")
MEMORY_LIMIT = 24 * 2**30


def data_files(directory: str, n: int) -> tuple[str, str]:
    """SE1 training data as .npy files (written once, outside the repository)."""
    from alacarte.datasets import make_se1

    os.makedirs(directory, exist_ok=True)
    x_path, y_path = (os.path.join(directory, f"se1_{n}_{part}.npy") for part in ("x", "y"))
    if not (os.path.exists(x_path) and os.path.exists(y_path)):
        x, y, _ = make_se1(n, seed=0)
        np.save(x_path + ".tmp.npy", x)
        np.save(y_path + ".tmp.npy", y)
        os.replace(x_path + ".tmp.npy", x_path)
        os.replace(y_path + ".tmp.npy", y_path)
    return x_path, y_path


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# -- one configuration, in its own process --------------------------------------------------
def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from alacarte import FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood
    from alacarte.streaming import ChunkedData, streamed_negative_mll

    x_path, y_path = data_files(args.data, args.n)
    x_map, y_map = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    d = x_map.shape[1]
    rank, world = 0, 1
    if args.worker == "streamed x2":
        import torch.distributed as dist

        import alacarte.distributed as ad

        ad.init(timeout=3600)
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = ad.shard(args.n)
        x_map, y_map = x_map[rows], y_map[rows]

    if args.worker == "gpytorch":
        import gpytorch

        x, y = torch.as_tensor(np.array(x_map)), torch.as_tensor(np.array(y_map))

        class RFFGP(gpytorch.models.ExactGP):
            def __init__(self):
                super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
                self.mean_module = gpytorch.means.ConstantMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.RFFKernel(num_samples=NUM_SAMPLES, num_dims=d, ard_num_dims=d)
                )

            def forward(self, inputs):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

        model = RFFGP()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

        def evaluate():
            model.zero_grad()
            loss = -mll(model(x), y)
            loss.backward()
            return float(loss.detach())
    else:
        model = FeatureGP(None, None, FSARDKernel(d, NUM_SAMPLES, ard_num_dims=d, seed=0))
        if args.worker == "in-memory":
            x, y = torch.as_tensor(np.array(x_map)), torch.as_tensor(np.array(y_map))
            model.set_train_data(x, y, strict=False)
            mll = WoodburyMarginalLogLikelihood(model.likelihood, model)

            def evaluate():
                model.zero_grad()
                loss = -mll(model(x), y)
                loss.backward()
                return float(loss.detach())
        else:
            data = ChunkedData(x_map, y_map, memory_budget=MEMORY_BUDGET, distributed=world > 1)

            def evaluate():
                model.zero_grad()
                return float(streamed_negative_mll(model, data))
    model.train()

    times, loss = [], None
    for _ in range(args.repeats):
        if world > 1:
            torch.distributed.barrier()
        start = time.perf_counter()
        loss = evaluate()
        times.append(time.perf_counter() - start)
    result = {"config": args.worker, "n": args.n, "seconds": float(np.median(times)), "all_seconds": times,
              "loss": loss, "peak_rss": peak_rss_bytes(), "rank": rank}
    print("RESULT " + json.dumps(result), flush=True)


# -- the driver -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(args, config: str, n: int, repeats: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", config, "--n", str(n),
               "--repeats", str(repeats), "--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if config == "streamed x2":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
        procs = [subprocess.Popen(command, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    else:
        procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{config} n={n} failed (exit {proc.returncode}):\n{out[-2000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    merged = dict(results[0])
    merged["seconds"] = max(r["seconds"] for r in results)  # the step waits for the slowest process
    merged["peak_rss"] = max(r["peak_rss"] for r in results)  # per process
    return merged


def feature_matrix_fits(n: int, copies: int) -> bool:
    return copies * n * 2 * NUM_SAMPLES * 8 < MEMORY_LIMIT


def plan(ns: list[int]) -> list[tuple[str, int, str | None]]:
    """(config, n, reason it is not run or None)."""
    rows = []
    for n in ns:
        rows.append(("streamed", n, None))
        # The in-memory path keeps Φ and its gradient; GPyTorch at least Φ, its gradient and a root copy.
        for config, copies in (("in-memory", 2), ("gpytorch", 3)):
            reason = None if feature_matrix_fits(n, copies) else (
                f"needs ≥ {copies} n×D float64 matrices = {copies * n * 2 * NUM_SAMPLES * 8 / 2**30:.0f} GiB > 24 GB")
            rows.append((config, n, reason))
    rows.append(("streamed x2", min(ns), None))
    return rows


def render(args, done: dict, command: str) -> str:
    import torch

    lines = [
        "# Streamed Woodbury likelihood: memory and time per evaluation",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, 2 cores **shared with four other agents' jobs during the run** "
        f"(load average 5–6), torch {torch.__version__}, one torch thread per process. SE1-like data "
        f"(d = 18), FSARD with M = {NUM_SAMPLES} (D = {2 * NUM_SAMPLES}), float64. One evaluation = "
        "negative log marginal likelihood + gradient of every parameter. Streamed: memory-mapped `.npy` "
        f"input, memory budget {MEMORY_BUDGET // 2**20} MiB. Seconds: median of the timed evaluations "
        "(`repeats`); peak RSS: `ru_maxrss` of the process (of the larger one for 2 processes).",
        "",
        "| path | n | seconds / eval | vs in-memory (same n) | peak RSS (GiB) | repeats | loss per point |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for config, n, reason in plan(args.ns):
        key = f"{config}|{n}"
        if reason is not None:
            lines.append(f"| {config} | {n:,} | not run: {reason} | | | | |")
            continue
        if key not in done:
            lines.append(f"| {config} | {n:,} | (not finished) | | | | |")
            continue
        r = done[key]
        reference = done.get(f"in-memory|{n}")
        ratio = f"{r['seconds'] / reference['seconds']:.2f}×" if reference else "–"
        lines.append(f"| {config} | {n:,} | {r['seconds']:.1f} | {ratio} | {r['peak_rss'] / 2**30:.2f} | "
                     f"{len(r['all_seconds'])} | {r['loss']:.6f} |")
    streamed = sorted((n, done[f"streamed|{n}"]["seconds"]) for n in args.ns if f"streamed|{n}" in done)
    lines.append("")
    if len(streamed) >= 2:
        ns_, ts = np.array([s[0] for s in streamed], float), np.array([s[1] for s in streamed])
        slope, intercept = np.polyfit(ns_, ts, 1)
        log_slope = np.polyfit(np.log(ns_), np.log(ts), 1)[0]
        lines.append(f"Streamed time vs n: least-squares line t = {intercept:.2f} s + {slope * 1e6:.1f} s per 10⁶ rows; "
                     f"log-log slope {log_slope:.3f} (1 = linear).")
    small = min(args.ns)
    if f"streamed|{small}" in done and f"in-memory|{small}" in done:
        ratio = done[f"streamed|{small}"]["seconds"] / done[f"in-memory|{small}"]["seconds"]
        lines.append(f"Streamed vs in-memory at n = {small:,}: {ratio:.2f}× (target ≤ 1.3×).")
    if f"streamed x2|{small}" in done and f"streamed|{small}" in done:
        ratio = done[f"streamed x2|{small}"]["seconds"] / done[f"streamed|{small}"]["seconds"]
        lines.append(f"2 processes vs 1 at n = {small:,}: {ratio:.2f}× the time per evaluation.")
    big = max(args.ns)
    if f"streamed|{big}" in done:
        lines.append(f"Streamed peak memory at n = {big:,}: {done[f'streamed|{big}']['peak_rss'] / 2**30:.2f} GiB "
                     "(target < 2 GB).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[100_000, 1_000_000, 2_000_000])
    parser.add_argument("--data", default=os.path.join("/tmp", "alacarte_bench"))
    parser.add_argument("--raw", default=os.path.join(RESULTS, "streaming_raw.jsonl"))
    parser.add_argument("--out", default=os.path.join(RESULTS, "streaming.md"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed evaluations per configuration (default 2 for n ≤ 10⁵, else 1)")
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    command = "python " + " ".join(sys.argv)
    done = {}
    if os.path.exists(args.raw):
        with open(args.raw) as fh:
            for line in fh:
                r = json.loads(line)
                done[f"{r['config']}|{r['n']}"] = r
    # The table's order is by n; the run's puts the targets first and GPyTorch last.
    priority = {"streamed": 0, "in-memory": 0, "streamed x2": 1, "gpytorch": 3}
    order = sorted(plan(args.ns), key=lambda row: (priority[row[0]] + (row[1] > min(args.ns)) * 2 * (row[0] == "streamed"), row[1]))
    for config, n, reason in order:
        if reason is not None or f"{config}|{n}" in done:
            continue
        data_files(args.data, n)
        repeats = args.repeats or (2 if n <= 100_000 else 1)
        print(f"running {config} n={n} ({repeats} evaluations)", flush=True)
        result = run_config(args, config, n, repeats)
        done[f"{config}|{n}"] = result
        with open(args.raw, "a") as fh:
            fh.write(json.dumps(result) + "\n")
        with open(args.out, "w") as fh:
            fh.write(render(args, done, command))
        print(json.dumps(result), flush=True)
    report = render(args, done, command)
    with open(args.out, "w") as fh:
        fh.write(report)
    print(report)


if __name__ == "__main__":
    main()
