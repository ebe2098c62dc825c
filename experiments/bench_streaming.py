"""Peak memory and time per likelihood + gradient evaluation: streamed vs in-memory vs GPyTorch.

SE1-like data (d = 18, x ~ N(0, I), docs/mathematics.md §8), FSARD with M = 1024
frequencies (D = 2048 features) at n = 10⁵, and the streamed path's scaling in
n (10⁵, 10⁶, 2·10⁶) at ``--scaling-samples`` frequencies; float64, one torch
thread per process.  Every configuration runs in a fresh subprocess and reports
its peak resident memory (``resource.getrusage(...).ru_maxrss``, which
includes the interpreter, torch and any memory-mapped pages it touched), and
the wall-clock and CPU seconds (``time.process_time``) of one evaluation.  On
a machine shared with other jobs the CPU seconds of a one-thread process are the
robust measure (the wall-clock time also counts waiting for a core), so the
ratios use them.  ``--parallel k`` runs k configurations at a time.

* ``streamed``: :func:`alacarte.streaming.streamed_negative_mll` over the rows
  of a memory-mapped ``.npy`` file (``memory_budget`` 512 MiB);
* ``in-memory``: ``WoodburyMarginalLogLikelihood`` on all rows as tensors;
* ``gpytorch``: ``ExactGP`` + ``ScaleKernel(RFFKernel(num_samples=1024))`` under
  ``ExactMarginalLogLikelihood``, whose ``LowRankRootAddedDiagLinearOperator``
  takes GPyTorch's low-rank path (Woodbury solve and capacitance-matrix
  Cholesky for the log-determinant);
* ``streamed x2``: the streamed path on 2 gloo processes, each with half the rows.

``--round-robin`` times instead, in one process and round-robin, one
evaluation of each of ``streamed``, ``in-memory``, ``gpytorch`` and the streamed
path with float32 features and float64 statistics, at ``--n`` rows, and writes
their median and min–max with the load average and thread count (``--time-out``);
peak memory needs the fresh processes above.

Configurations that need the n×D feature matrix where it cannot fit in 24 GB
(n·D·8 B ≥ 16 GB, twice that with its gradient) are listed as not run.  Each
finished configuration is appended to ``--raw`` (JSON lines) and the table is
rewritten, so an interrupted run resumes where it stopped.

Usage::

    python experiments/bench_streaming.py [--n 100000] [--scaling-ns 100000 1000000 2000000]
        [--scaling-samples 256] [--parallel 4] [--data /tmp/alacarte_bench]
    python experiments/bench_streaming.py --round-robin [--n 20000] [--repeats 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

NUM_SAMPLES = 1024  # the default of the main comparison
MEMORY_BUDGET = 512 * 2**20
RESULTS = os.path.join(os.path.dirname(__file__), "results")

#: How the rows of the committed raw file (results/streaming_raw.jsonl) were run; rendered under the
#: table of that file only, so that ``--render-only`` rewrites results/streaming.md as committed.
COMMITTED_RUNS = (
    'The rows came from three invocations on the same raw file (`experiments/results/streaming_raw.jsonl`;',
    'a re-run resumes, running only what it lacks): `--parallel 3` with the D = 2048 rows beyond',
    'n = 10⁵ skipped; `--scaling-ns 100000 1000000 --scaling-samples 1024 --parallel 1` for the',
    'n = 10⁶, D = 2048 row; and `--parallel 1` for the n = 2·10⁶, D = 2048 row. They predate the `load`',
    'column; their wall / CPU seconds (1.0× to 33×) show how long each waited. GPyTorch\'s loss',
    'differs from ours because its `RFFKernel` draws its own frequencies. In-memory and GPyTorch rows at',
    "n ≥ 10⁶ are not run because they hold the n×D feature matrix; the streamed path's memory does not",
    'grow with n beyond the touched pages of the memory-mapped input (0.14 GiB per 10⁶ rows of x).',
)
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
    num_samples = args.num_samples
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
                    gpytorch.kernels.RFFKernel(num_samples=num_samples, num_dims=d, ard_num_dims=d)
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
        model = FeatureGP(None, None, FSARDKernel(d, num_samples, ard_num_dims=d, seed=0))
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

    times, cpu_times, loss = [], [], None
    load = [os.getloadavg()[0]]  # 1-minute load average, this process included
    for _ in range(args.repeats):
        if world > 1:
            torch.distributed.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = evaluate()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    load.append(os.getloadavg()[0])
    result = {"config": args.worker, "n": args.n, "M": num_samples, "seconds": float(np.median(times)),
              "all_seconds": times, "cpu_seconds": float(np.median(cpu_times)), "loss": loss,
              "peak_rss": peak_rss_bytes(), "load": load, "rank": rank}
    print("RESULT " + json.dumps(result), flush=True)


# -- round-robin timing, in one process ------------------------------------------------------------
def round_robin(args) -> str:
    """Time the paths' evaluations round-robin in this process; the report's text."""
    import copy

    import gpytorch
    import torch

    from _timing import load_average, sample_times, spread
    from alacarte import FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood
    from alacarte.streaming import ChunkedData, streamed_negative_mll

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    x_path, y_path = data_files(args.data, args.n)
    x_map, y_map = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    x, y = torch.as_tensor(np.array(x_map)), torch.as_tensor(np.array(y_map))
    d, m = x.shape[1], args.num_samples
    streamed = FeatureGP(None, None, FSARDKernel(d, m, ard_num_dims=d, seed=0))
    mixed = copy.deepcopy(streamed).float()
    in_memory = copy.deepcopy(streamed)
    in_memory.set_train_data(x, y, strict=False)
    theirs = gpytorch.models.ExactGP(x, y, gpytorch.likelihoods.GaussianLikelihood())
    theirs.mean_module = gpytorch.means.ConstantMean()
    theirs.covar_module = gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RFFKernel(num_samples=m, num_dims=d, ard_num_dims=d))
    theirs.forward = lambda inputs: gpytorch.distributions.MultivariateNormal(theirs.mean_module(inputs),
                                                                                theirs.covar_module(inputs))

    def on_rows(model, mll):
        def run():
            model.zero_grad()
            (-mll(model(x), y)).backward()
        return run

    def on_chunks(model, data):
        def run():
            model.zero_grad()
            streamed_negative_mll(model, data)
        return run

    paths = [
        ("in-memory", on_rows(in_memory.train(), WoodburyMarginalLogLikelihood(in_memory.likelihood, in_memory))),
        ("streamed", on_chunks(streamed.train(), ChunkedData(x_map, y_map, memory_budget=MEMORY_BUDGET))),
        ("streamed, float32 features + float64 statistics", on_chunks(mixed.train(), ChunkedData(
            x_map, y_map, memory_budget=MEMORY_BUDGET, statistics_dtype=torch.float64))),
        ("gpytorch", on_rows(theirs.train(), gpytorch.mlls.ExactMarginalLogLikelihood(theirs.likelihood, theirs))),
    ]
    before = load_average()
    samples = sample_times([run for _, run in paths], args.repeats)
    after = load_average()
    reference = float(np.median(samples[0]))
    command = "python " + shlex.join(sys.argv)
    lines = [
        "# Streamed Woodbury likelihood: time per evaluation, round-robin in one process",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, 2 cores, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
        f"gpytorch {gpytorch.__version__}; load average (1 min) {before} before the timings, {after} after. "
        f"SE1-like data (d = {d}), n = {args.n:,}, FSARD with M = {m} (D = {2 * m}), float64 unless said otherwise; "
        f"streamed from memory-mapped `.npy` files, memory budget {MEMORY_BUDGET // 2**20} MiB. One evaluation = "
        f"loss + gradient; median and min–max of {args.repeats} evaluations per path, the paths timed round-robin "
        "(peak memory: experiments/results/streaming.md).",
        "",
        "| path | wall s / eval | min–max | vs in-memory |",
        "|---|---:|---:|---:|",
    ]
    for (name, _), ts in zip(paths, samples):
        lines.append(f"| {name} | {np.median(ts):.2f} | {spread(ts, digits=2)} | {np.median(ts) / reference:.2f}× |")
    return "\n".join(lines) + "\n"


# -- the driver -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(args, config: str, n: int, num_samples: int, repeats: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", config, "--n", str(n),
               "--num-samples", str(num_samples), "--repeats", str(repeats), "--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if config == "streamed x2":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
        procs = [subprocess.Popen(command, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True,
                                  start_new_session=True) for r in (0, 1)]
    else:  # its own session, as torchrun starts its workers: scheduled like any other job
        procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{config} n={n} failed (exit {proc.returncode}):\n{out[-2000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    merged = dict(results[0])
    merged["seconds"] = max(r["seconds"] for r in results)  # the step waits for the slowest process
    merged["cpu_seconds"] = max(r["cpu_seconds"] for r in results)
    merged["peak_rss"] = max(r["peak_rss"] for r in results)  # per process
    return merged


def feature_matrix_fits(n: int, num_samples: int, copies: int) -> bool:
    return copies * n * 2 * num_samples * 8 < MEMORY_LIMIT


def plan(args) -> list[tuple[str, int, int, str | None]]:
    """(config, n, M, reason it is not run or None), in the table's order."""
    n, m = args.n, NUM_SAMPLES
    rows = [("streamed", n, m, None)]
    # The in-memory path keeps Φ and its gradient; GPyTorch at least Φ, its gradient and a root copy.
    for config, copies in (("in-memory", 2), ("gpytorch", 3)):
        reason = None if feature_matrix_fits(n, m, copies) else "does not fit in 24 GB"
        rows.append((config, n, m, reason))
    rows.append(("streamed x2", n, m, None))
    for big in sorted(set(args.scaling_ns) - {n}):
        rows.append(("streamed", big, m, args.skip_reason or None))
        for config, copies in (("in-memory", 2), ("gpytorch", 3)):
            if not feature_matrix_fits(big, m, copies):
                rows.append((config, big, m, f"needs ≥ {copies} n×D float64 matrices = "
                                             f"{copies * big * 2 * m * 8 / 2**30:.0f} GiB > 24 GB"))
    if args.scaling_samples != m:
        for big in sorted(set(args.scaling_ns)):
            rows.append(("streamed", big, args.scaling_samples, None))
        rows.append(("in-memory", min(args.scaling_ns), args.scaling_samples, None))
    return rows


def _key(config: str, n: int, num_samples: int) -> str:
    return f"{config}|{n}|{num_samples}"


def load_text(result: dict) -> str:
    """The row's measured load average, start → end (rank 0's for 2 processes)."""
    if "load" not in result:
        return "not recorded"
    start, end = result["load"]
    return f"{start:.1f} → {end:.1f}"


def render(args, done: dict, command: str) -> str:
    import torch

    lines = [
        "# Streamed Woodbury likelihood: memory and time per evaluation",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, 2 cores; `load` = the 1-minute load average at the start and end of "
        "the timed evaluations (it counts the process itself). Where the load exceeds the cores, wall-clock "
        "seconds also count waiting for a core, so the CPU seconds of each one-thread process are the "
        f"comparable measure. torch {torch.__version__}. "
        "SE1-like data (d = 18), FSARD, float64. One evaluation = negative log marginal likelihood + "
        "gradient of every parameter, timed once in a fresh process (no warm-up; at these sizes set-up is "
        f"negligible). Streamed: memory-mapped `.npy` input, memory budget {MEMORY_BUDGET // 2**20} MiB. "
        "Peak RSS: `ru_maxrss` of the process (the larger one for 2 processes), interpreter, torch and "
        "touched pages of the memory map included. GPyTorch: `ExactGP` + `ScaleKernel(RFFKernel)` under "
        "`ExactMarginalLogLikelihood`, whose `LowRankRootAddedDiagLinearOperator` takes the low-rank path "
        "(Woodbury solve, capacitance-matrix Cholesky for the log-determinant).",
        "",
        "| path | n | M (D = 2M) | CPU s / eval | vs in-memory (CPU, same n and M) | wall s / eval | peak RSS (GiB) "
        "| loss per point | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, n, m, reason in plan(args):
        key = _key(config, n, m)
        if reason is not None and key not in done:
            lines.append(f"| {config} | {n:,} | {m} | not run: {reason} | | | | | |")
            continue
        if key not in done:
            lines.append(f"| {config} | {n:,} | {m} | (not finished) | | | | | |")
            continue
        r = done[key]
        reference = done.get(_key("in-memory", n, m))
        ratio = f"{r['cpu_seconds'] / reference['cpu_seconds']:.2f}×" if reference else "–"
        lines.append(f"| {config} | {n:,} | {m} | {r['cpu_seconds']:.1f} | {ratio} | {r['seconds']:.1f} | "
                     f"{r['peak_rss'] / 2**30:.2f} | {r['loss']:.6f} | {load_text(r)} |")
    lines.append("")
    for m_scaling in sorted({args.scaling_samples, NUM_SAMPLES}):
        streamed = sorted((n, done[_key("streamed", n, m_scaling)]["cpu_seconds"])
                          for n in set(args.scaling_ns) | {args.n} if _key("streamed", n, m_scaling) in done)
        if len(streamed) >= 3:
            ns_, ts = np.array([s[0] for s in streamed], float), np.array([s[1] for s in streamed])
            slope, intercept = np.polyfit(ns_, ts, 1)
            log_slope = np.polyfit(np.log(ns_), np.log(ts), 1)[0]
            worst = np.max(np.abs(ts - (intercept + slope * ns_)) / ts)
            lines.append(f"Streamed CPU time vs n (D = {2 * m_scaling}): least-squares line t = {intercept:.2f} s + "
                         f"{slope * 1e6:.1f} s per 10⁶ rows (largest deviation {100 * worst:.1f}%); "
                         f"log-log slope {log_slope:.3f} (1 = linear).")
    n, m = args.n, NUM_SAMPLES
    full = sorted((big, done[_key("streamed", big, m)]["cpu_seconds"]) for big in set(args.scaling_ns) | {n}
                  if _key("streamed", big, m) in done)
    if len(full) >= 2:
        (n0, t0), (n1, t1) = full[0], full[-1]
        lines.append(f"Streamed CPU time at D = {2 * m}: {t1 / t0:.2f}× from n = {n0:,} to n = {n1:,} "
                     f"({n1 / n0:.0f}× the rows).")
    if _key("streamed", n, m) in done and _key("in-memory", n, m) in done:
        ratio = done[_key("streamed", n, m)]["cpu_seconds"] / done[_key("in-memory", n, m)]["cpu_seconds"]
        lines.append(f"Streamed vs in-memory at n = {n:,}, D = {2 * m}: {ratio:.2f}× the CPU time (target ≤ 1.3×).")
    if _key("streamed x2", n, m) in done and _key("streamed", n, m) in done:
        two, one = done[_key("streamed x2", n, m)], done[_key("streamed", n, m)]
        lines.append(f"2 processes vs 1 at n = {n:,}: {two['cpu_seconds'] / one['cpu_seconds']:.2f}× the CPU time "
                     f"per process per evaluation, {two['seconds'] / one['seconds']:.2f}× the wall time (on an "
                     "idle 2-core machine the wall ratio would approach the CPU ratio).")
    for (config, big, mm, reason) in plan(args):
        if config == "streamed" and big == max(args.scaling_ns) and _key(config, big, mm) in done:
            lines.append(f"Streamed peak memory at n = {big:,}, D = {2 * mm}: "
                         f"{done[_key(config, big, mm)]['peak_rss'] / 2**30:.2f} GiB (target < 2 GB).")
    if os.path.abspath(args.raw) == os.path.abspath(os.path.join(RESULTS, "streaming_raw.jsonl")):
        lines += ["", *COMMITTED_RUNS]
    lines += ["", "Times of the paths measured round-robin in one process, with their spread: "
              "`--round-robin` (experiments/results/streaming_time.md)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="rows of the main comparison")
    parser.add_argument("--num-samples", type=int, default=NUM_SAMPLES, help=argparse.SUPPRESS)
    parser.add_argument("--scaling-ns", type=int, nargs="+", default=[100_000, 1_000_000, 2_000_000])
    parser.add_argument("--scaling-samples", type=int, default=256, help="M of the scaling runs")
    parser.add_argument("--skip-reason", default="", help="why the streamed M = 1024 runs beyond --n are not run")
    parser.add_argument("--parallel", type=int, default=1, help="configurations run at a time")
    parser.add_argument("--render-only", action="store_true", help="rewrite the table from --raw, run nothing")
    parser.add_argument("--data", default=os.path.join("/tmp", "alacarte_bench"))
    parser.add_argument("--raw", default=os.path.join(RESULTS, "streaming_raw.jsonl"))
    parser.add_argument("--out", default=os.path.join(RESULTS, "streaming.md"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=1, help="timed evaluations per configuration")
    parser.add_argument("--round-robin", action="store_true", help="time the paths in this process instead")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of --round-robin")
    parser.add_argument("--time-out", default=os.path.join(RESULTS, "streaming_time.md"))
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.round_robin:
        report = round_robin(args)
        print(report)
        with open(args.time_out, "w") as fh:
            fh.write(report)
        return
    if args.render_only and not os.path.isfile(args.raw):  # else a table of nothing would replace --out
        parser.error(f"--render-only: no such raw file {args.raw}")

    command = "python " + shlex.join(arg for arg in sys.argv if arg != "--render-only")
    done = {_key(r["config"], r["n"], r["M"]): r for r in read_rows(args.raw)}
    todo = [(c, n, m) for c, n, m, reason in plan(args) if reason is None and _key(c, n, m) not in done]
    todo.sort(key=lambda item: item[0] == "gpytorch")  # the slowest last
    if args.render_only:
        todo = []
    for _, n, _ in todo:
        data_files(args.data, n)
    lock = threading.Lock()

    def one(item):
        config, n, m = item
        print(f"running {config} n={n} M={m}", flush=True)
        try:
            result = run_config(args, config, n, m, args.repeats)
        except RuntimeError as err:  # logged; the configuration is retried on the next run
            print(err, flush=True)
            return
        with lock:
            done[_key(config, n, m)] = result
            append_row(args.raw, result)
            with open(args.out, "w") as fh:
                fh.write(render(args, done, command))
        print(json.dumps(result), flush=True)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, todo))
    report = render(args, done, command)
    with open(args.out, "w") as fh:
        fh.write(report)
    print(report)


if __name__ == "__main__":
    main()
