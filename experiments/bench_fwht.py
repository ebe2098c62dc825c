"""FWHT benchmark: every scheme for p = 1 … 2^16 vs the memory-bandwidth bound.

For each p the rows are 2^23 / p (32 MiB of float32, out of cache).  The copy
bandwidth BW is measured in the same run (``dst.copy_(src)`` into a reused
buffer of the same size).  One pass = read + write of the array:
``2 · rows · p · 4 B / BW``.  The *stage bound* of a scheme is its number of
passes (GEMMs, batched GEMMs and radix-2 stages of :func:`plan_for`) × one pass;
forward+backward is twice that.  ``fwd+bwd/bound`` is the target (≤ 1.5).

    python experiments/bench_fwht.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from alacarte.ops.fwht import SCHEMES, fwht, fwht_scheme, plan_for  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_features import machine  # noqa: E402


def median_time(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def naive(x):
    """One-op-per-stage butterfly with fresh tensors (the original implementation)."""
    p = x.shape[-1]
    y = x.reshape(-1, p).clone()
    h = 1
    while h < p:
        y = y.view(-1, p // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(x.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 repeats, fewer schemes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fwht.md"))
    args = ap.parse_args()
    reps = 3 if args.quick else 7
    total = 1 << 23
    dtype = torch.float32
    src = torch.randn(total, dtype=dtype)
    dst = torch.empty_like(src)
    bw = 2 * total * 4 / median_time(lambda: dst.copy_(src), 2 * reps)
    one_pass = 2 * total * 4 / bw
    schemes = ("radix2", "kron") if args.quick else SCHEMES
    lines = [
        f"Command: `python {' '.join(['experiments/bench_fwht.py'] + sys.argv[1:])}`",
        "",
        f"Machine: {machine()}",
        "",
        f"float32, rows × p = 2^23 elements (32 MiB), median of {reps} repeats, times in ms. "
        f"Copy bandwidth into a reused buffer (same run): {bw / 1e9:.1f} GB/s; one pass (read+write 32 MiB) "
        f"= {one_pass * 1e3:.2f} ms. `passes` = passes of the auto plan (GEMM / batched GEMM / radix-2 stage); "
        "`bound` = passes × one pass (forward), `log2p bound` = log2 p × one pass (a stage-per-bit butterfly). "
        "`fwd+bwd/bound` = (forward+backward time) / (2 × bound) — target ≤ 1.5. "
        "Scheme columns are forward times; `naive` is the old one-op-per-stage butterfly.",
        "",
        "| p | auto plan | passes | " + " | ".join(schemes) + " | naive | auto fwd | auto fwd+bwd | bound | log2p bound | fwd/bound | fwd+bwd/bound | fwd/one pass |",
        "|" + "---|" * (len(schemes) + 11),
    ]
    print("\n".join(lines), flush=True)
    for lp in range(17):
        p = 1 << lp
        x = torch.randn(total // p, p, dtype=dtype)
        cols = []
        for s in schemes:
            if s in ("dense", "blockdiag") and p > 1024:
                cols.append("—")
                continue
            cols.append(f"{median_time(lambda: fwht_scheme(x, s), reps) * 1e3:.1f}")
        t_naive = median_time(lambda: naive(x), max(1, reps // 2))
        t_fwd = median_time(lambda: fwht(x), reps)
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)

        def fb():
            xg.grad = None
            fwht(xg).backward(g)

        t_fb = median_time(fb, reps)
        plan = plan_for(p, dtype)
        passes = max(1, len(plan))
        bound = passes * one_pass
        desc = " ".join(f"{s[0]}{s[1]}" + (f"x{s[2]}" if len(s) > 2 else "") for s in plan) or "copy"
        row = (
            f"| {p} | {desc} | {passes} | " + " | ".join(cols) + f" | {t_naive * 1e3:.1f} | {t_fwd * 1e3:.1f} | {t_fb * 1e3:.1f} | "
            f"{bound * 1e3:.1f} | {max(1, lp) * one_pass * 1e3:.1f} | {t_fwd / bound:.2f} | {t_fb / (2 * bound):.2f} | "
            f"{t_fwd / one_pass:.1f} |"
        )
        lines.append(row)
        print(row, flush=True)
    lines.append(
        "\nPlan notation: `mW` = GEMM with the W×W Hadamard block on the lowest bits (W > p: block-diagonal I ⊗ H_p), "
        "`r2H` = radix-2 stage pairing columns H apart, `bF xT` = H_F as a batched GEMM on the view (·, F, T)."
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
