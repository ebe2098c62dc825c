"""FWHT benchmark: every scheme for p = 1 … 2^16 vs the memory-bandwidth bound.

For each p the rows are 2^23 / p (32 MiB of float32, out of cache).  The copy
time is measured with every row, round-robin with its contestants
(``dst.copy_(src)`` into a reused buffer of the same size): one pass = read +
write of the array.  The *stage bound* of a scheme is its number of
passes (GEMMs, batched GEMMs and radix-2 stages of :func:`plan_for`) × one pass;
forward+backward is twice that.  ``fwd+bwd/bound`` is the target (≤ 1.5).

    python experiments/bench_fwht.py [--quick] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from alacarte.ops.fwht import SCHEMES, fwht, fwht_scheme, plan_for  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import load_average, sample_times, spread  # noqa: E402
from bench_features import machine  # noqa: E402


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
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fwht.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = 3 if args.quick else 7
    total = 1 << 23
    dtype = torch.float32
    src = torch.randn(total, dtype=dtype)
    dst = torch.empty_like(src)
    load_before = load_average()
    schemes = ("radix2", "kron") if args.quick else SCHEMES
    lines = [
        f"Command: `python {' '.join(['experiments/bench_fwht.py'] + sys.argv[1:])}`",
        "",
        f"Machine: {machine()}",
        "",
        f"float32, rows × p = 2^23 elements (32 MiB), median of {reps} repeats, times in ms; each row's "
        "contestants and its copy are timed round-robin. `one pass` = the row's median time to copy 32 MiB into "
        "a reused buffer (read+write), measured with it; `fwd+bwd min–max` = the spread of the auto "
        "forward+backward samples. `passes` = passes of the auto plan (GEMM / batched GEMM / radix-2 stage); "
        "`bound` = passes × one pass (forward), `log2p bound` = log2 p × one pass (a stage-per-bit butterfly). "
        "`fwd+bwd/bound` = (forward+backward time) / (2 × bound) — target ≤ 1.5. "
        "Scheme columns are forward times; `naive` is the old one-op-per-stage butterfly.",
        "",
        "| p | auto plan | passes | " + " | ".join(schemes) + " | naive | auto fwd | auto fwd+bwd | fwd+bwd min–max "
        "| one pass | bound | log2p bound | fwd/bound | fwd+bwd/bound | fwd/one pass |",
        "|" + "---|" * (len(schemes) + 13),
    ]
    print("\n".join(lines), flush=True)
    for lp in range(17):
        p = 1 << lp
        x = torch.randn(total // p, p, dtype=dtype)
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)

        def fb():
            xg.grad = None
            fwht(xg).backward(g)

        timed = [s for s in schemes if not (s in ("dense", "blockdiag") and p > 1024)]
        fns = [lambda s=s: fwht_scheme(x, s) for s in timed]
        fns += [lambda: naive(x), lambda: fwht(x), fb, lambda: dst.copy_(src)]
        samples = sample_times(fns, reps)
        medians = dict(zip(timed + ["naive", "fwd", "fb", "copy"], map(statistics.median, samples)))
        cols = [f"{medians[s] * 1e3:.1f}" if s in medians else "—" for s in schemes]
        t_naive, t_fwd, t_fb, one_pass = medians["naive"], medians["fwd"], medians["fb"], medians["copy"]
        plan = plan_for(p, dtype)
        passes = max(1, len(plan))
        bound = passes * one_pass
        desc = " ".join(f"{s[0]}{s[1]}" + (f"x{s[2]}" if len(s) > 2 else "") for s in plan) or "copy"
        row = (
            f"| {p} | {desc} | {passes} | " + " | ".join(cols) + f" | {t_naive * 1e3:.1f} | {t_fwd * 1e3:.1f} | {t_fb * 1e3:.1f} | "
            f"{spread(samples[-2], 1e3, 1)} | {one_pass * 1e3:.2f} | {bound * 1e3:.1f} | {max(1, lp) * one_pass * 1e3:.1f} | {t_fwd / bound:.2f} | {t_fb / (2 * bound):.2f} | "
            f"{t_fwd / one_pass:.1f} |"
        )
        lines.append(row)
        print(row, flush=True)
    lines.append(f"\nLoad average (1 min): {load_before} before the timings, {load_average()} after.")
    lines.append(
        "\nPlan notation: `mW` = GEMM with the W×W Hadamard block on the lowest bits (W > p: block-diagonal I ⊗ H_p), "
        "`r2H` = radix-2 stage pairing columns H apart, `bF xT` = H_F as a batched GEMM on the view (·, F, T)."
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
