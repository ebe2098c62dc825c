"""What the UCI runner's tests share: tiny runs of `alacarte bench` and rows written by hand."""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

from alacarte.bench import read_rows

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "uci"
TINY = ["--datasets", "servo", "yacht", "--methods", "exact-ard", "fsard", "--splits", "0",
        "--num-samples", "16", "--restarts", "1", "--restart-iter", "2", "--max-iter", "3",
        "--workers", "2", "--data", str(SHARED)]
TIMING = {"train_seconds", "peak_rss_mb", "peak_device_mb"}
DEFAULT_PAPER = None  # the paper's table shipped with the package


def run(csv_path, *extra):
    """``bench run`` in this process (its cells are spawned all the same); returns what it printed."""
    from alacarte.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["bench", "run", *TINY, "--csv", str(csv_path), *extra]) == 0
    return out.getvalue()


def run_script(csv_path, *extra):
    """``bench run`` as a user starts it, from the experiment script in a process of its own."""
    cmd = [sys.executable, str(ROOT / "experiments" / "uci_benchmark.py"), "run", *TINY, "--csv", str(csv_path), *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300).stdout


def report(csv_path):
    from alacarte.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["bench", "report", "--csv", str(csv_path)]) == 0
    return out.getvalue()


def results(csv_path):
    return sorted(tuple((k, v) for k, v in row.items() if k not in TIMING) for row in read_rows(csv_path))


def result_row(path, dataset, split, method, rmse, num_features=1024, model=None, max_iter=100, device="cpu",
            peak_device_mb="", noise="", noise_floor=""):
    from alacarte.bench import append_row

    append_row(path, {"dataset": dataset, "split": split, "method": method, "model": model or method, "status": "ok",
                      "rmse": rmse, "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 1439,
                      "d": 11, "num_features": num_features, "components": 4, "restarts": 5, "max_iter": max_iter,
                      "seed": split, "version": "0", "device": device, "peak_device_mb": peak_device_mb,
                      "noise": noise, "noise_floor": noise_floor})


def ok_row(dataset="yacht", split=0, method="gm", rmse=0.12, **settings):
    row = {"dataset": dataset, "split": split, "method": method, "model": method, "status": "ok", "rmse": rmse,
           "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 277, "d": 6, "num_features": 32,
           "components": 2, "restarts": 0, "restart_iter": 1, "max_iter": 5, "seed": split, "version": "0",
           "device": "cpu", "noise_floor": 1e-4}
    row.update(settings)
    return row
