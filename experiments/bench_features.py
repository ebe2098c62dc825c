"""Feature-map benchmark: Fastfood vs dense random kitchen sinks (RKS).

Times the whole map x -> [cos, sin](x Ωᵀ) (``alacarte.features.fourier.fourier_features``)
for Fastfood (``fastfood_project``: strategies "auto", "fwht", "dense") and for RKS
(``(x/ℓ) @ Wᵀ`` with a dense M×d Gaussian W, then the same cos/sin), forward only
(no autograd), median of several repeats, both measured in the same run.  A second
table sweeps d around the cut-over of ``choose_strategy`` (fwht vs materialise+GEMM).

    python experiments/bench_features.py            # full table (~7 min on 2 cores)
    python experiments/bench_features.py --quick    # smaller n, fewer repeats
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # see the note in the table header

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from alacarte.features.fastfood import choose_strategy, draw_fastfood_state, fastfood_project  # noqa: E402
from alacarte.features.fourier import fourier_features  # noqa: E402

SKLEARN_EXTRA_S = 17.7  # scikit-learn-extra Fastfood, d=1024, M=4096, n=36000, float64 numpy, this machine


def median_time(fn, repeats: int) -> float:
    """Median of ``repeats`` timed calls after one warm-up; a warm-up slower than
    1 s counts as the first sample (the big GEMMs need no warming)."""
    return median_times([fn], repeats)[0]


def median_times(fns, repeats: int) -> list[float]:
    """Like :func:`median_time` for several functions, timed round-robin so that
    they all see the same machine load (the 2 cores may be shared)."""
    samples = [[] for _ in fns]
    for fn, ts in zip(fns, samples):
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        if first > 1.0:
            ts.append(first)
    for _ in range(repeats):
        for fn, ts in zip(fns, samples):
            if len(ts) < repeats:
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in samples]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}"
    )


def setup(n, d, m, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    ell = torch.rand(d, generator=gen, dtype=dtype) + 0.5
    w = torch.randn(m, d, generator=gen, dtype=dtype)
    st = draw_fastfood_state(d, m, (), seed)
    state = [torch.as_tensor(a, dtype=dtype) for a in (st.sign, st.perm, st.gauss, st.radius)]
    state[1] = torch.as_tensor(st.perm)
    scale = torch.full((1,), 1.0 / m**0.5, dtype=dtype)
    return x, ell, w, state, scale


def rks(x, ell, w, scale):
    return fourier_features((x / ell) @ w.T, scale)


def fastfood(x, ell, state, scale, strategy):
    sign, perm, gauss, radius = state
    return fourier_features(fastfood_project(x / ell, sign, perm, gauss, radius, strategy), scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 9000, 2 repeats")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "features.md"))
    args = ap.parse_args()
    n = args.n or (9000 if args.quick else 36000)
    reps = args.repeats or (2 if args.quick else 3)
    lines = [
        f"Command: `python {' '.join(['experiments/bench_features.py'] + sys.argv[1:])}`",
        "",
        f"Machine: {machine()}",
        "",
        f"Feature map x -> [cos, sin](x Ωᵀ), n = {n}, forward only (no autograd), median of {reps} repeats "
        "(seconds), methods timed round-robin. RKS = dense random kitchen sinks `(x/ℓ) @ Wᵀ` + the same cos/sin. "
        "ff[auto] is what the kernels run; its strategy is in column `auto`. "
        "`ff/RKS` = ff[auto] / RKS (target: ≤ 1.1 for d ≤ 512; ≤ 0.5 at d = 1024; ≤ 0.25 at d = 4096, "
        "float32, M = 4096). Dense-strategy timings for d > 512 are skipped (= RKS cost plus materialisation).",
        "",
        "| dtype | d | M | RKS s | ff[dense] s | ff[fwht] s | auto | ff[auto] s | ff/RKS | RKS/ff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    results = {}
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            for d in (8, 32, 128, 385, 1024, 4096):
                for m in (1024, 4096):
                    x, ell, w, state, scale = setup(n, d, m, dtype)
                    fns = [lambda: rks(x, ell, w, scale), lambda: fastfood(x, ell, state, scale, "fwht")]
                    if d <= 512:
                        fns.append(lambda: fastfood(x, ell, state, scale, "dense"))
                    t_rks, t_fw, t_de = (median_times(fns, reps) + [float("nan")])[:3]
                    auto = choose_strategy(d)
                    t_auto = t_de if auto == "dense" else t_fw
                    results[(dtype, d, m)] = (t_rks, t_auto)
                    row = (
                        f"| {str(dtype)[6:]} | {d} | {m} | {t_rks:.3f} | {t_de:.3f} | {t_fw:.3f} | {auto} | "
                        f"{t_auto:.3f} | {t_auto / t_rks:.2f} | {t_rks / t_auto:.1f} |"
                    )
                    lines.append(row)
                    print(row, flush=True)
                    del x, w, state
    if n == 36000:
        t = results[(torch.float64, 1024, 4096)][1]
        t32 = results[(torch.float32, 1024, 4096)][1]
        note = (
            f"\nscikit-learn-extra Fastfood (numpy, float64), d = 1024, M = 4096, n = 36000, measured earlier on "
            f"this machine: {SKLEARN_EXTRA_S} s; ff[auto] here: float64 {t:.3f} s "
            f"({SKLEARN_EXTRA_S / t:.1f}× faster), float32 {t32:.3f} s ({SKLEARN_EXTRA_S / t32:.1f}× faster). Target ≥ 5×."
        )
        lines.append(note)
        print(note, flush=True)
    # cut-over sweep
    n2 = max(1000, n // 4)
    head = [
        "",
        f"Cut-over sweep (choose_strategy): Fastfood projection only, n = {n2}, M = 4096, median of {reps} "
        "repeats (seconds); `dense` = materialise V (d×M) + one GEMM.",
        "",
        "| dtype | d | ff[dense] s | ff[fwht] s | dense/fwht | auto |",
        "|---|---|---|---|---|---|",
    ]
    lines += head
    print("\n".join(head), flush=True)
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            for d in (128, 256, 385, 512, 640, 768, 1024):
                x, ell, w, state, scale = setup(n2, d, 4096, dtype)
                sign, perm, gauss, radius = state
                t_de, t_fw = median_times(
                    [
                        lambda: fastfood_project(x, sign, perm, gauss, radius, "dense"),
                        lambda: fastfood_project(x, sign, perm, gauss, radius, "fwht"),
                    ],
                    reps,
                )
                row = f"| {str(dtype)[6:]} | {d} | {t_de:.4f} | {t_fw:.4f} | {t_de / t_fw:.2f} | {choose_strategy(d)} |"
                lines.append(row)
                print(row, flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
