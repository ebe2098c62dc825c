"""Feature-map benchmark: Fastfood vs dense random kitchen sinks (RKS).

Times the whole map x -> [cos, sin](x Ωᵀ) (``alacarte.features.fourier.fourier_features``)
for Fastfood (``fastfood_project``: strategies "auto", "fwht", "dense") and for RKS
(``(x/ℓ) @ Wᵀ`` with a dense M×d Gaussian W, then the same cos/sin), forward only
(no autograd), median of several repeats, both measured in the same run.  A second
table sweeps d around the cut-over of ``choose_strategy`` (fwht vs materialise+GEMM).

The reference, scikit-learn-extra's Fastfood (numpy, float64) at d = 1024, M = 4096
and the run's n, is measured in the same run too, with the same thread limit (its
Cython FWHT and element-wise numpy use one thread whatever the limit) and the same
timing (median of the repeats of ``transform`` after an untimed ``fit``: the map
alone, as ff[auto] is timed; its ``n_components`` is our M, and its output the same
2M columns [cos, sin]).  It runs in the interpreter of ``--sklearn-extra-python`` if
given, else in this one if ``sklearn_extra`` imports here; without either the note
says it was not measured.  scikit-learn-extra 0.3.0 does not import with
numpy 2, so it needs a side environment::

    python3 -m venv /tmp/skxv
    /tmp/skxv/bin/pip install "numpy<2" "scikit-learn<1.6" scikit-learn-extra==0.3.0

    python experiments/bench_features.py --sklearn-extra-python /tmp/skxv/bin/python  # full table (~7 min on 2 cores, + ~1 min reference)
    python experiments/bench_features.py --quick    # smaller n, fewer repeats
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # see the note in the table header

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from alacarte.features.fastfood import choose_strategy, draw_fastfood_state, fastfood_project  # noqa: E402
from alacarte.features.fourier import fourier_features  # noqa: E402
from _sklearn_extra_fastfood import transform_seconds  # noqa: E402
from _timing import median_times  # noqa: E402

SKLEARN_EXTRA_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sklearn_extra_fastfood.py")
REFERENCE_D, REFERENCE_M = 1024, 4096  # where scikit-learn-extra is measured


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


def sklearn_extra_reference(n: int, repeats: int, python: str | None) -> tuple[dict | None, str]:
    """scikit-learn-extra's Fastfood ``transform`` time at (n, REFERENCE_D, REFERENCE_M) with
    this run's thread count (:func:`_sklearn_extra_fastfood.transform_seconds`) and where it
    ran, or None and why it did not."""
    threads = torch.get_num_threads()
    if python is None:
        try:
            import sklearn_extra.kernel_approximation  # noqa: F401
        except (ImportError, ValueError) as err:  # ValueError: 0.3.0's Cython under numpy 2 ("dtype size changed")
            return None, (f"scikit-learn-extra does not import in this interpreter ({err}) and "
                          "--sklearn-extra-python was not given")
        return transform_seconds(n, REFERENCE_D, REFERENCE_M, repeats, threads), "this interpreter"
    env = dict(os.environ, **{name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    command = [python, SKLEARN_EXTRA_SCRIPT, "--n", str(n), "--d", str(REFERENCE_D), "--m", str(REFERENCE_M),
               "--repeats", str(repeats), "--threads", str(threads)]
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode:  # the table above is still written
        return None, f"`{python}` failed (exit {run.returncode}): {(run.stderr.strip().splitlines() or [''])[-1]}"
    return json.loads(run.stdout.splitlines()[-1]), f"`{python}`"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 9000, 2 repeats")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "features.md"))
    ap.add_argument("--sklearn-extra-python", metavar="PATH",
                    help="interpreter with scikit-learn-extra that measures the reference (see the docstring)")
    args = ap.parse_args(argv)
    if args.sklearn_extra_python is not None:  # checked now, not after the table's minutes
        try:
            check = subprocess.run([args.sklearn_extra_python, "-c", "import sklearn_extra.kernel_approximation"],
                                   capture_output=True, text=True)
        except OSError as err:
            ap.error(f"--sklearn-extra-python {args.sklearn_extra_python}: {err.strerror}")
        if check.returncode:
            ap.error(f"--sklearn-extra-python {args.sklearn_extra_python} cannot import scikit-learn-extra: "
                     f"{(check.stderr.strip().splitlines() or [''])[-1]}")
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
    reference, where = sklearn_extra_reference(n, reps, args.sklearn_extra_python)
    if reference is None:
        note = f"\nscikit-learn-extra Fastfood reference not measured: {where}."
    else:
        t, t32 = (results[(dtype, REFERENCE_D, REFERENCE_M)][1] for dtype in (torch.float64, torch.float32))
        ref = reference["seconds"]
        note = (
            f"\nscikit-learn-extra {reference['sklearn_extra']} Fastfood (numpy {reference['numpy']}, float64, "
            f"measured in this run in {where}, limited to {torch.get_num_threads()} threads, but its FWHT and "
            f"element-wise numpy run on one), d = {REFERENCE_D}, "
            f"n_components = M = {REFERENCE_M} (its output: {reference['width']} columns, [cos, sin] like ours), "
            f"n = {n}, `transform` after an untimed `fit`, median of {reps}: {ref:.3f} s; ff[auto] here: "
            f"float64 {t:.3f} s ({ref / t:.1f}× faster), float32 {t32:.3f} s ({ref / t32:.1f}× faster). "
            "Target ≥ 5×."
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
