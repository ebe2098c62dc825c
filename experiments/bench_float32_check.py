"""What ``fit``'s float32 check measures and costs, and what the streamed row tally costs.

1. **Float32 check.** ``fit`` evaluates a float32 FeatureGP's final loss once more in
   float64 arithmetic and warns when the two differ by more than 0.01 per point
   (``alacarte.training._diagnostics.FLOAT32_LOSS_TOLERANCE``).  For each fit below (split 0;
   D = 1024 features and the benchmark's protocol, 5 restarts × 15 L-BFGS iterations
   then 100, except a last PWL fit with one lengthscale (``pwl-iso``, the kernel's
   default; ``"pwl"`` is ARD), D = 256 and 2 × 5 then 50, which in float32 follows
   round-off), a float32 and a float64 model from the same seed are fitted;
   the row gives the float32 fit's loss per point in float32 and in float64
   arithmetic (their gap is what the check compares with 0.01), whether it warned,
   the check's seconds against the fit's, and both fits' test RMSE.
2. **Row tally.** A streamed fit over a source of ``(x, y)`` chunks sums each
   pass's rows (``RowTally``) to check that the statistics and gradient passes
   read the same rows.  Its seconds per pass against one streamed loss + gradient
   evaluation, FSARD D = 1024 on SE1 rows, float64.

One torch thread.  Finished rows are appended to ``--csv`` and skipped on a re-run,
so a killed run resumes; the markdown table is written at the end.

    python experiments/bench_float32_check.py --csv experiments/results/float32_check.csv \
        --out experiments/results/float32_check.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import alacarte as ac  # noqa: E402
from alacarte.bench import package_version  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)

BENCHMARK_PROTOCOL = (512, 100, 5, 15)  # frequencies (D = 1024 features), max_iter, restarts, restart_iter
# (dataset, kernel, protocol)
FITS = [("energy", "pwl", BENCHMARK_PROTOCOL), ("energy", "gm", BENCHMARK_PROTOCOL),
        ("energy", "fsard", BENCHMARK_PROTOCOL), ("yacht", "gm", BENCHMARK_PROTOCOL),
        ("concrete", "gm", BENCHMARK_PROTOCOL), ("se1", "fsard", BENCHMARK_PROTOCOL),
        ("energy", "pwl-iso", (128, 50, 2, 5))]
FIELDS = ["dataset", "kernel", "num_features", "protocol", "n_train", "loss32", "loss64_at_fit32", "gap", "warned", "noise32",
          "fit32_seconds", "check_seconds", "rmse32", "rmse64", "version"]
TALLY_FIELDS = ["n", "d", "chunks", "evaluation_seconds", "tally_seconds", "version"]


def _data(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if name == "se1":
        x, y, _ = ac.datasets.make_se1(5000, seed=0)
        return x[:4000], y[:4000], x[4000:], y[4000:]
    data = ac.load_uci(name, 0)
    return data.x_train, data.y_train, data.x_test, data.y_test


def _protocol_text(protocol: tuple[int, int, int, int]) -> str:
    _, max_iter, restarts, restart_iter = protocol
    return f"{restarts} × {restart_iter} + {max_iter}"


def _fit(kind: str, protocol: tuple[int, int, int, int], x, y, dtype):
    from alacarte.factory import make_model

    num_samples, max_iter, restarts, restart_iter = protocol
    if kind == "pwl-iso":
        kernel = ac.PiecewiseLinearRadialKernel(x.shape[1], num_samples, num_components=4, seed=0).to(dtype)
        model = make_model(kernel, x.shape[1])
    else:
        model = make_model(kind, x.shape[1], num_samples=num_samples, seed=0, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # numpy float64 data, as users pass them (fit standardises in float64, then converts)
        history = ac.fit(model, x, y, max_iter=max_iter, restarts=restarts, restart_iter=restart_iter, seed=0,
                         progress=False)
    warned = any("float64 arithmetic" in str(w.message) for w in caught)
    return model, history, warned


def _rmse(model, x, y) -> float:
    import torch

    mean = model.predict(torch.as_tensor(x, dtype=model.input_offset.dtype)).mean.double()
    return float((mean - torch.as_tensor(y)).pow(2).mean().sqrt())


def _float32_row(dataset: str, kind: str, protocol: tuple[int, int, int, int]) -> dict:
    import torch

    from alacarte.training._diagnostics import own_and_float64_losses, warn_if_float32_loss_is_off

    x, y, x_test, y_test = _data(dataset)
    model, history, warned = _fit(kind, protocol, x, y, torch.float32)
    x32, y32 = model.train_inputs[0], model.train_targets  # standardised, as fit's check sees them

    loss32, loss64 = own_and_float64_losses(model, x32, y32)  # what fit's check compares, per point
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warn_if_float32_loss_is_off(model, x32, y32)
    check_seconds = time.perf_counter() - start
    model.eval()
    model64, _, _ = _fit(kind, protocol, x, y, torch.float64)
    return {"dataset": dataset, "kernel": kind, "num_features": 2 * protocol[0], "protocol": _protocol_text(protocol),
            "n_train": len(x), "loss32": f"{loss32:.5f}",
            "loss64_at_fit32": f"{loss64:.5f}", "gap": f"{abs(loss32 - loss64):.2e}", "warned": warned,
            "noise32": f"{float(model.likelihood.noise.detach().min()):.3g}",
            "fit32_seconds": round(history.seconds, 1), "check_seconds": round(check_seconds, 2),
            "rmse32": f"{_rmse(model, x_test, y_test):.4g}", "rmse64": f"{_rmse(model64, x_test, y_test):.4g}"}


def _tally_row(n: int, chunk_rows: int) -> dict:
    import torch

    from alacarte.factory import make_model
    from alacarte._chunks import RowTally
    from alacarte.streaming import ChunkedData, streamed_negative_mll

    x, y, _ = ac.datasets.make_se1(n, seed=0)
    chunks = [(torch.as_tensor(x[i:i + chunk_rows]), torch.as_tensor(y[i:i + chunk_rows]))
              for i in range(0, n, chunk_rows)]
    model = make_model("fsard", x.shape[1], num_samples=BENCHMARK_PROTOCOL[0], seed=0)
    data = ChunkedData(chunks)
    streamed_negative_mll(model, data)  # warm-up (the Hadamard plans, the allocator)
    start = time.perf_counter()
    streamed_negative_mll(model, data)
    evaluation = time.perf_counter() - start
    tally = RowTally(x.shape[1], "cpu")
    start = time.perf_counter()
    for xs, ys in chunks:
        tally.add(xs, ys)
    return {"n": n, "d": x.shape[1], "chunks": len(chunks), "evaluation_seconds": round(evaluation, 3),
            "tally_seconds": f"{time.perf_counter() - start:.2e}"}


def render(fits: list[dict], tallies: list[dict], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "**Float32 check.** Split 0, one thread; D features, protocol = restarts × their L-BFGS iterations "
             "+ the final iterations (the benchmark's: 5 × 15 + 100); `pwl-iso` is PWL with one lengthscale (the kernel's "
             "default; `pwl`, as the benchmark runs it, is ARD). loss = negative log marginal likelihood per point (standardised targets) at "
             "the float32 fit's hyperparameters, in float32 and in float64 arithmetic; `fit` warns when the gap "
             "exceeds 0.01. σ² = the float32 fit's noise variance (standardised units). check s = the check's "
             "cost, fit s = the float32 fit's. RMSE: test RMSE of the float32 fit and of a float64 fit from the "
             "same seed.", "",
             "| dataset | kernel | D | protocol | n | loss float32 | loss float64 | gap | warned | σ² | fit s | check s "
             "| RMSE float32 | RMSE float64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fits:
        lines.append(f"| {r['dataset']} | {r['kernel']} | {r['num_features']} | {r['protocol']} | {r['n_train']} | {r['loss32']} | {r['loss64_at_fit32']} "
                     f"| {r['gap']} | {r['warned']} | {r['noise32']} | {r['fit32_seconds']} | {r['check_seconds']} "
                     f"| {r['rmse32']} | {r['rmse64']} |")
    lines += ["", "**Row tally.** SE1 rows as a list of (x, y) tensor chunks, FSARD D = 1024, float64: one streamed "
              "loss + gradient evaluation (two passes, each tallied) against one pass of the tally alone.", "",
              "| n | d | chunks | evaluation s | tally s (one pass) | tally / evaluation |", "|---|---|---|---|---|---|"]
    for r in tallies:
        share = float(r["tally_seconds"]) / float(r["evaluation_seconds"])
        lines.append(f"| {r['n']} | {r['d']} | {r['chunks']} | {r['evaluation_seconds']} | {r['tally_seconds']} "
                     f"| {share:.2%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, required=True, help="float32 rows; the tally's go beside it (_tally.csv)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tally-n", type=int, nargs="+", default=[50_000])
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    threadpool_limits(1)  # scipy's BLAS has a thread pool of its own
    torch.set_default_dtype(torch.float64)
    version = package_version()
    tally_csv = args.csv.with_name(args.csv.stem + "_tally.csv")
    done = {(r["dataset"], r["kernel"], int(r["num_features"]), r["protocol"]) for r in read_rows(args.csv)}
    for dataset, kind, protocol in FITS:
        if (dataset, kind, 2 * protocol[0], _protocol_text(protocol)) not in done:
            row = _float32_row(dataset, kind, protocol)
            append_row(args.csv, FIELDS, {**row, "version": version})
            print(f"{dataset} {kind}: gap {row['gap']}, RMSE {row['rmse32']} / {row['rmse64']}", flush=True)
    tallied = {int(r["n"]) for r in read_rows(tally_csv)}
    for n in args.tally_n:
        if n not in tallied:
            append_row(tally_csv, TALLY_FIELDS, {**_tally_row(n, chunk_rows=4096), "version": version})
    command = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    args.out.write_text(render(read_rows(args.csv), read_rows(tally_csv), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
