"""The resumable UCI runner: a stopped-and-resumed run equals an uninterrupted one."""
import contextlib
import csv
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from alacarte._checkpoint import saved_progress
from alacarte.bench import read_rows

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "uci"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")

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


def test_stopped_and_resumed_run_equals_uninterrupted_run(tmp_path):
    whole, resumed = tmp_path / "whole.csv", tmp_path / "resumed.csv"
    yacht = ["--datasets", "yacht"]
    run_script(whole, *yacht)
    assert "0 cells done, 1 to run" in run(resumed, *yacht, "--limit", "1")  # a run killed after one cell
    assert "1 cells done, 1 to run" in run(resumed, *yacht)
    assert "2 cells done, 0 to run" in run(resumed, *yacht)  # nothing left: re-running does no work
    assert len(results(whole)) == 2
    assert results(resumed) == results(whole)
    assert list((tmp_path / "whole.checkpoints").iterdir()) == []  # every cell's checkpoint went with its row
    for row in map(dict, results(whole)):  # how each fit ended is recorded with it, and where
        assert int(row["iterations"]) >= 1 and row["converged"] in ("True", "False")
        assert float(row["noise_floor"]) == 1e-4 and float(row["noise"]) > 1e-4
        assert row["machine"].endswith(f"({torch.backends.cpu.get_cpu_capability()}, 1 thread)")
    text = report(whole)
    assert "| yacht |" in text and "0.13 ± 0.06" in text  # the paper's FSARD value beside ours
    assert "**datasets won** (ours)" in text and "within 10% on" in text
    assert "| **within 5%** |" in text  # each method against the paper's same method
    assert text.count("/1 converged</sub>") == 2  # one fit per cell, each with its ending recorded


def test_held_out_rows_are_recorded_with_the_calibration_and_reported_in_a_column_of_their_own(tmp_path):
    """--validation-fraction reaches the feature methods' fits (exact GPs, the reference, hold none out), every
    row records its share and the test targets' interval coverage, and the report shows NLPD and coverage."""
    path = tmp_path / "held.csv"
    run(path, "--validation-fraction", "0.2", "--datasets", "servo")
    rows = {r["method"]: r for r in read_rows(path)}
    assert float(rows["fsard"]["validation_fraction"]) == 0.2 and float(rows["exact-ard"]["validation_fraction"]) == 0
    for r in rows.values():
        z50, z95 = float(r["coverage50"]), float(r["coverage95"])
        assert 0 <= z50 <= z95 <= 1 and float(r["std_over_rmse"]) > 0
    # Another share is another setting for the feature method, whose cell runs again beside the first;
    # exact ARD's is the same (it holds none out either way).
    assert "1 cells done, 1 to run" in run(path, "--validation-fraction", "0", "--datasets", "servo")
    text = report(path)
    assert "| exact-ard | fsard | fsard held-out 0.2 |" in text
    assert text.count("95% cover ") == 3 and text.count("<sub>NLPD ") == 3


def test_cell_over_its_time_budget_is_stopped_recorded_and_not_retried(tmp_path):
    path, one_cell = tmp_path / "budget.csv", ["--datasets", "servo", "--methods", "exact-ard"]
    out = run(path, *one_cell, "--time-budget", "0.5")  # not even the imports fit in half a second
    assert "0 cells done, 1 to run" in out
    (row,) = read_rows(path)
    assert row["status"] == "timeout" and row["rmse"] == ""
    assert "1 cells done, 0 to run" in run(path, *one_cell)
    assert "1 cells done, 0 to run" in run(path, *one_cell, "--time-budget", "0.4")
    # A longer budget is the operator asking again (a timeout is retried at a longer budget): here it finishes.
    out = run(path, *one_cell, "--time-budget", "300")
    assert "1 timed-out cells run again: this run's --time-budget (300 s) is longer than theirs" in out
    assert "0 cells done, 1 to run" in out
    assert [r["status"] for r in read_rows(path)] == ["timeout", "ok"]
    assert "1 cells done, 0 to run" in run(path, *one_cell, "--time-budget", "600")


def test_a_timeout_at_one_feature_count_does_not_count_as_done_at_another(tmp_path):
    """A timeout row records its D: without it, a later run at another D would take the row for its own
    cell and never run it ("1 cells done, 0 to run")."""
    path, one_cell = tmp_path / "budget.csv", ["--datasets", "servo", "--methods", "fsard"]
    run(path, *one_cell, "--time-budget", "0.5")
    assert "0 cells done, 1 to run" in run(path, *one_cell, "--num-samples", "32")
    assert [(r["status"], r["num_features"]) for r in read_rows(path)] == [("timeout", "32"), ("ok", "64")]  # D = 2M
    assert "1 cells done, 0 to run" in run(path, *one_cell, "--time-budget", "0.5")  # D = 32's timeout stands
    # Likewise the number of GM components, where it is given rather than chosen from the data.
    path, gm = tmp_path / "gm.csv", ["--datasets", "servo", "--methods", "gm"]
    run(path, *gm, "--components", "2", "--time-budget", "0.5")
    assert "0 cells done, 1 to run" in run(path, *gm, "--components", "4", "--time-budget", "0.5")
    # And where they depend on the data: 'auto' components (2 for servo's 151 training points), and an
    # exact GP's D at n ≥ 2000 (gas: a Fastfood expansion of 2M features).  Those rows left them blank,
    # so a run at --components 4, or at another D, skipped the cell as done.
    path = tmp_path / "auto.csv"
    run(path, *gm, "--time-budget", "0.5")
    (row,) = read_rows(path)
    assert (row["status"], row["n_train"], row["components"], row["num_features"]) == ("timeout", "151", "2", "32")
    assert "0 cells done, 1 to run" in run(path, *gm, "--components", "4", "--time-budget", "0.5")
    path, gas = tmp_path / "gas.csv", ["--datasets", "gas", "--methods", "exact-ard"]
    run(path, *gas, "--time-budget", "0.5")
    (row,) = read_rows(path)
    assert (row["status"], row["model"], row["num_features"]) == ("timeout", "fastfood-ard", "32")
    assert "0 cells done, 1 to run" in run(path, *gas, "--num-samples", "32", "--time-budget", "0.5")


def _state_and_parent(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc (None once it is gone)."""
    try:
        state, parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return state, int(parent)


def _workers_of(pid: int) -> list[int]:
    """The cell processes (multiprocessing spawn children) of process ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if (stat := _state_and_parent(entry.name)) is None or stat[1] != pid:
            continue
        try:
            if b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    stat = _state_and_parent(pid)
    return stat is not None and stat[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_a_terminated_runner_stops_its_workers(tmp_path, signal_name):
    """``kill <runner>`` (SIGTERM) must not leave cell processes running: an orphan would fit on for
    minutes or hours beside a resumed run, its result lost.  Nor may ``kill -9`` or the out-of-memory
    killer (SIGKILL), which the runner cannot catch: the workers notice that it is gone."""
    import signal

    stop = getattr(signal, signal_name)

    path = tmp_path / "killed.csv"
    cmd = [sys.executable, str(ROOT / "experiments" / "uci_benchmark.py"), "run", "--datasets", "airfoil",
           "--methods", "gm", "--splits", "0-1", "--num-samples", "2048", "--workers", "2",
           "--data", str(SHARED), "--csv", str(path), "-q"]  # two cells of minutes each
    runner = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(workers := _workers_of(runner.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers) == 2, "the runner never started its two workers"
        checkpoints = tmp_path / "killed.checkpoints"
        while len(list(checkpoints.glob("airfoil-*.ckpt"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        runner.send_signal(stop)
        assert runner.wait(timeout=60) == (128 + stop if stop == signal.SIGTERM else -stop)
    finally:
        runner.kill()
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, workers)), "workers outlived their runner"
    assert not path.exists() or "airfoil" not in path.read_text()  # no cell finished; nothing recorded
    # Each cell's fit had begun and left its checkpoint, from which the next run goes on.
    assert sorted(p.name.split("-")[:2] for p in checkpoints.glob("*.ckpt")) == [["airfoil", "0"], ["airfoil", "1"]]


def test_alacarte_bench_command(tmp_path, capsys):
    from alacarte.bench import FIELDS, append_row
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    for split, rmse in enumerate([0.12, 0.10]):
        append_row(path, {"dataset": "yacht", "split": split, "method": "gm", "model": "gm", "status": "ok",
                          "rmse": rmse, "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 277,
                          "d": 6, "num_features": 1024, "components": 2, "restarts": 5, "max_iter": 100,
                          "seed": split, "version": "0"})
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| yacht | 277 | **0.11 ± 0.01 [2]**" in text  # beats the paper's GM 0.13, so it is the row's best
    assert "0.13 ± 0.08" in text and set(FIELDS) >= {"status", "model"}
    assert main(["bench", "run", "--datasets", "yacht", "--methods", "nope", "--csv", str(path)]) == 2
    assert "unknown method" in capsys.readouterr().err
    # Refused before any cell runs, creating nothing: a missing data folder (not one failure per cell)
    # and a results file in a missing folder (not created, parents and all).
    quick = ["--methods", "gm", "--num-samples", "8", "--max-iter", "1", "--restarts", "0", "-q", "--limit", "1"]
    assert main(["bench", "run", "--datasets", "yacht", "--data", str(tmp_path / "nope"), "--csv", str(path),
                 *quick]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["bench", "run", "--datasets", "yacht", "--csv", str(tmp_path / "new" / "x.csv"), *quick]) == 2
    assert "its folder" in capsys.readouterr().err and not (tmp_path / "new").exists()
    # The report given where the results CSV goes (an easy slip): refused, the file untouched, nothing left beside it.
    report = tmp_path / "r.md"
    before = report.read_bytes()
    assert main(["bench", "run", "--datasets", "yacht", "--csv", str(report), *quick]) == 2
    assert "is not a results CSV of `alacarte bench run`" in capsys.readouterr().err
    assert report.read_bytes() == before and not (tmp_path / "r.md.upgrade").exists()


def test_rows_name_the_commit_that_produced_them(monkeypatch):
    """From a git checkout the version is ``<package version>+g<commit>`` (the commit of
    this checkout), with ``.dirty<hash of the diff>`` for uncommitted changes — two different
    edits are two versions; without git it is the package version alone."""
    import alacarte
    from alacarte.bench import package_version

    root = Path(alacarte.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert package_version().startswith(f"{alacarte.__version__}+g{head.stdout.strip()}")

    def git_with_changes(diff: bytes):
        def run(command, **kwargs):
            out = {"rev-parse": b"abc1234\n", "ls-files": b"alacarte/__init__.py\n"}
            stdout = next((v for k, v in out.items() if k in command), diff)
            return subprocess.CompletedProcess(command, 0, stdout=stdout)
        return run

    versions = []
    for diff in (b"", b"-a = 1\n+a = 2\n", b"-a = 1\n+a = 3\n"):
        monkeypatch.setattr(subprocess, "run", git_with_changes(diff))
        versions.append(package_version())
    clean, *edits = versions
    assert clean == f"{alacarte.__version__}+gabc1234"
    assert all(v.startswith(clean + ".dirty") for v in edits) and edits[0] != edits[1]

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert package_version() == alacarte.__version__


def test_an_installed_copy_inside_another_git_checkout_does_not_take_its_commit(tmp_path):
    """A virtual environment kept in a project's checkout (``.venv/`` ignored) puts the installed
    package in that work tree: its version must not be ``0.1.0+g<the project's commit>``, a commit
    that holds none of this code."""
    import shutil

    import alacarte

    def git(*command):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *command],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    git("add", ".gitignore")
    git("commit", "-q", "-m", "a project")
    site = tmp_path / ".venv" / "site-packages"
    shutil.copytree(Path(alacarte.__file__).parent, site / "alacarte", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", "import alacarte.bench as b; print(b.package_version())"],
                         env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    assert out == [alacarte.__version__]


@pytest.mark.parametrize("ours, verdict, matched", [(0.004, "≤", 1), (0.05, ">", 0)])
def test_a_paper_value_printed_as_zero_is_compared_at_its_precision(tmp_path, ours, verdict, matched):
    """Parkinsons' GM is 0.00 in the paper (two decimals): no ratio exists, and ours matches it
    only when it too is below 0.005 — never a division by zero or an infinite 'ratio'."""
    from alacarte.bench import append_row
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    append_row(path, {"dataset": "parkinsons", "split": 0, "method": "gm", "model": "gm", "status": "ok",
                      "rmse": ours, "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 5287,
                      "d": 20, "num_features": 1024, "components": 4, "restarts": 5, "max_iter": 100,
                      "seed": 0, "version": "0"})
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert f"| {verdict} (paper printed 0.00) |" in text
    assert f"≤ the paper's best on {matched} of 1 datasets; within 10% on {matched} of 1." in text
    # The same-method table gives the same verdict and counts it.
    assert f"| parkinsons | {verdict} (paper printed 0.00) [1] |" in text
    assert f"| **within 5%** | {matched} of 1 |" in text
    # The paper's other 28 datasets have no rows: the report says so rather than count 1 of 1 silently.
    assert "Not run, so in neither count: 28 of the paper's 29 datasets (challenger, fertility," in text


def _result(path, dataset, split, method, rmse, num_features=1024, model=None, max_iter=100, device="cpu",
            peak_device_mb="", noise="", noise_floor=""):
    from alacarte.bench import append_row

    append_row(path, {"dataset": dataset, "split": split, "method": method, "model": model or method, "status": "ok",
                      "rmse": rmse, "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 1439,
                      "d": 11, "num_features": num_features, "components": 4, "restarts": 5, "max_iter": max_iter,
                      "seed": split, "version": "0", "device": device, "peak_device_mb": peak_device_mb,
                      "noise": noise, "noise_floor": noise_floor})


@pytest.mark.parametrize("ours, printed, matched", [(0.474, "0.47 ≤ 0.47", 1), (0.476, "0.48 > 0.47", 0)])
def test_the_paper_is_also_compared_at_the_decimals_it_prints(tmp_path, ours, printed, matched):
    """Wine's best in the paper is ARD's 0.47, some mean in [0.465, 0.475): 0.474 is above 0.47 as a
    number but not distinguishable from it at the paper's precision; 0.476 is worse either way."""
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    _result(path, "wine", 0, "pwl", ours)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert f"| wine | {ours:.3g} (pwl) | 0.47 (ARD) | 1.01 | {printed} | — | — |" in text  # one split: no SE
    assert "≤ the paper's best on 0 of 1 datasets; within 10% on 1 of 1." in text
    assert f"Rounded to the decimals the paper prints, ≤ on {matched} of 1." in text


def test_the_gap_to_the_paper_is_given_in_standard_errors_as_welchs_t_statistic(tmp_path):
    """The goal table's difference / SE is Welch's t statistic of our splits against the paper's mean
    and ± over its 10 splits (scipy's, an independent computation), and the summary counts the
    datasets where ours is behind by how many standard errors."""
    from scipy.stats import ttest_ind_from_stats

    from alacarte.bench import load_paper
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    ours = {"wine": [0.49, 0.47, 0.51], "yacht": [0.20, 0.21, 0.22], "autompg": [2.3, 2.4, 2.5]}
    for ds, values in ours.items():
        for split, value in enumerate(values):
            _result(path, ds, split, "gm", value)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    paper = load_paper()
    for ds, best in (("wine", "ARD"), ("yacht", "PWL"), ("autompg", "GM")):
        theirs = paper[(ds, best)]
        t = ttest_ind_from_stats(np.mean(ours[ds]), np.std(ours[ds], ddof=1), 3,
                                 theirs.mean, theirs.std, 10, equal_var=False).statistic
        row = next(line for line in text.splitlines() if line.startswith(f"| {ds} | ") and f"({best})" in line)
        assert row.split(" | ")[5] == f"{t:+.1f}"
    # wine +0.7 and yacht +3.9 SE behind; autompg ahead (not counted)
    assert "the difference is under one standard error on 1 of 2 and under two on 1." in text


def test_a_report_of_two_protocols_gives_each_feature_count_its_column(tmp_path):
    """Results files run at different D are reported side by side: a method found at two D gets a
    column for each, and the goal table names the one that was best."""
    from alacarte.cli import main

    small, large = tmp_path / "d1024.csv", tmp_path / "d4096.csv"
    for split, (a, b) in enumerate([(0.50, 0.46), (0.52, 0.44)]):
        _result(small, "wine", split, "gm", a)
        _result(small, "wine", split, "pwl", a + 0.01)
        _result(large, "wine", split, "gm", b, num_features=4096)
    assert main(["bench", "report", "--csv", str(small), str(large), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| dataset | n train | gm D=1024 | gm D=4096 | pwl | GM (paper) | PWL (paper) |" in text
    assert "Feature methods use D = 1024 and 4096 features" in text
    assert "| wine | 0.45 (gm D=4096) | 0.47 (ARD) | 0.96 | 0.45 ≤ 0.47 | -0.7 | — |" in text
    assert "| dataset | gm D=1024 | gm D=4096 | pwl |" in text  # each column beside the paper's GM/PWL
    assert "| wine | 0.96 [2] | 0.85 [2] | 1.08 [2] |" in text  # against the paper's GM 0.53, PWL 0.48


def test_a_longer_training_run_gets_its_own_column_and_is_not_averaged_with_the_shorter(tmp_path):
    """The same method and D trained for 100 and for 300 iterations are two protocols: averaging
    their rows would report a mean that neither produced."""
    from alacarte.cli import main

    short, long = tmp_path / "it100.csv", tmp_path / "it300.csv"
    for split, (a, b) in enumerate([(0.50, 0.46), (0.52, 0.44)]):
        _result(short, "wine", split, "gm", a, num_features=4096)
        _result(short, "wine", split, "pwl", a + 0.01)
        _result(long, "wine", split, "gm", b, num_features=4096, max_iter=300)
    assert main(["bench", "report", "--csv", str(short), str(long), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert ("| dataset | n train | gm max_iter=100 | gm max_iter=300 | pwl | GM (paper) | PWL (paper) |"
            in text)
    assert "| wine | 0.45 (gm max_iter=300) | 0.47 (ARD) | 0.96 | 0.45 ≤ 0.47 | -0.7 | — |" in text
    assert "| wine | 0.96 [2] | 0.85 [2] | 1.08 [2] |" in text


def test_a_lower_noise_floor_is_applied_recorded_and_reported_in_a_column_of_its_own(tmp_path):
    """``--noise-floor`` bounds σ² in the fitted model itself (the row reads the bound back from
    it); rows at another floor, older rows without the column counted at GPyTorch's, are another
    protocol, and fits ending at their floor are counted in the report."""
    from gpytorch.likelihoods import GaussianLikelihood

    from alacarte.bench import DEFAULT_NOISE_FLOOR
    from alacarte.cli import main

    assert float(GaussianLikelihood().noise_covar.raw_noise_constraint.lower_bound) == pytest.approx(DEFAULT_NOISE_FLOOR)
    lowered = tmp_path / "lowered.csv"
    run(lowered, "--noise-floor", "1e-7", "--limit", "2")
    for row in read_rows(lowered):
        assert float(row["noise_floor"]) == pytest.approx(1e-7, rel=1e-12) and float(row["noise"]) > 1e-7
    assert main(["bench", "report", "--csv", str(lowered), "--out", str(tmp_path / "lowered.md")]) == 0
    assert "| dataset | n train | exact-ard σ²≥1e-07 | fsard σ²≥1e-07 |" in (tmp_path / "lowered.md").read_text()

    path = tmp_path / "rows.csv"
    for split, (a, b) in enumerate([(0.50, 0.45), (0.52, 0.47)]):
        _result(path, "wine", split, "pwl", a)  # an older row: no noise recorded
        _result(path, "wine", split, "pwl", b, noise=[2e-8, 0.01][split], noise_floor=1e-8)
        _result(path, "wine", split, "gm", a + 0.1, noise=[1.5e-4, 0.2][split], noise_floor=1e-4)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| dataset | n train | gm | pwl σ²≥0.0001 | pwl σ²≥1e-08 | GM (paper) | PWL (paper) |" in text
    assert ("| wine | 1439 | 0.61 ± 0.01 [2]<br><sub>NLPD 0 · 3 s · 300 MB · 1/2 at the noise floor</sub> "
            "| 0.51 ± 0.01 [2]<br><sub>NLPD 0 · 3 s · 300 MB</sub> "
            "| **0.46 ± 0.01 [2]**<br><sub>NLPD 0 · 3 s · 300 MB · 1/2 at the noise floor</sub> |") in text


def test_gpu_rows_get_their_own_column_with_their_gpu_memory(tmp_path):
    """GPU seconds are not CPU seconds: a method's rows fitted on a GPU are a column of their own,
    never averaged with its CPU rows, and still compete for the best of the row."""
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    for split, (a, b) in enumerate([(0.50, 0.45), (0.52, 0.47)]):
        _result(path, "wine", split, "gm", a)
        _result(path, "wine", split, "gm", b, device="cuda: NVIDIA H200", peak_device_mb=812.0)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| dataset | n train | gm | gm cuda | GM (paper) |" in text
    assert ("| wine | 1439 | 0.51 ± 0.01 [2]<br><sub>NLPD 0 · 3 s · 300 MB</sub> | **0.46 ± 0.01 [2]**<br><sub>NLPD 0 · 3 s · "
            "300 MB · 812 MB GPU</sub> |") in text
    assert "| wine | 0.46 (gm cuda) | 0.47 (ARD) | 0.98 | 0.46 ≤ 0.47 | -0.4 | — |" in text


@pytest.mark.parametrize("device, message", [("mps", "must be cpu or cuda"), ("gpu:0", "is not a torch device")]
                         + ([] if torch.cuda.is_available() else [("cuda", "has no CUDA device")]))
def test_a_device_the_cells_cannot_use_is_refused_before_any_cell_runs(tmp_path, capsys, device, message):
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    assert main(["bench", "run", "--datasets", "servo", "--methods", "gm", "--splits", "0", "--csv", str(path),
                 "--data", str(SHARED), "--device", device]) == 2
    assert message in capsys.readouterr().err
    assert not path.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cell_on_the_gpu_matches_the_same_cell_on_the_cpu(tmp_path):
    """Same frequencies (drawn on the CPU, then moved), same data, same optimiser: only float64
    round-off differs, which three iterations cannot amplify visibly (a hundred unconverged ones can:
    three kegg GM cells differ by 3%, docs/benchmarks.md)."""
    from alacarte.bench import METHODS

    cells = ["--datasets", "servo", "--methods", *METHODS]
    run(tmp_path / "cpu.csv", *cells)
    run(tmp_path / "gpu.csv", *cells, "--device", "cuda")
    # whole rows (`results` drops the timing columns, peak_device_mb among them)
    cpu, gpu = (sorted(read_rows(tmp_path / name), key=lambda r: r["method"]) for name in ("cpu.csv", "gpu.csv"))
    assert [r["method"] for r in gpu] == [r["method"] for r in cpu] == sorted(METHODS)  # none failed on either
    for a, b in zip(cpu, gpu):
        assert a["device"] == "cpu" and b["device"].startswith("cuda: ") and float(b["peak_device_mb"]) > 0
        assert float(b["rmse"]) == pytest.approx(float(a["rmse"]), rel=1e-6)
        assert float(b["nlpd"]) == pytest.approx(float(a["nlpd"]), rel=1e-6)


def test_exact_gps_keep_one_column_when_they_ran_as_fastfood_on_the_larger_datasets(tmp_path):
    """``exact-ard`` has no features below n = 2000 and D features above (a Fastfood expansion):
    one protocol, so one column, and the goal table still finds our ARD — counted against the
    exact-ARD goal only where it was exact."""
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    _result(path, "wine", 0, "exact-ard", 0.519, num_features=0)
    _result(path, "gas", 0, "exact-ard", 0.13, num_features=1024, model="fastfood-ard")
    _result(path, "wine", 0, "gm", 0.48)
    _result(path, "gas", 0, "gm", 0.15)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| dataset | n train | exact-ard | gm | ARD (paper) | GM (paper) |" in text
    assert "| wine | 0.48 (gm) | 0.47 (ARD) | 1.02 | 0.48 > 0.47 | — | 1.10 |" in text
    assert "| gas | 0.15 (gm) | 0.12 (ARD) | 1.25 | 0.15 > 0.12 | — | 1.08 ff |" in text
    # The same-method table marks and counts the Fastfood fit apart too (paper's GM: wine 0.53, gas 0.14).
    assert "| wine | 1.10 [1] | 0.91 [1] |" in text
    assert "| gas | 1.08 [1] ff | 1.07 [1] |" in text
    assert "| **within 5%** | 0 of 1, ff: 0 of 1 | 1 of 2 |" in text
    # 0.519 / 0.47 = 1.104 prints as 1.10 in the table: the count says it is outside 10%.
    assert ("Our exact ARD within 10% of the paper's ARD on 0 of 1 (outside: wine 1.104). "
            "Our Fastfood ARD (n ≥ 2000, marked ff) within 10% of the paper's ARD on 1 of 1.") in text


def test_an_older_results_file_gets_the_new_columns_and_no_row_is_misaligned(tmp_path):
    """A CSV written before ``iterations``/``converged`` existed is upgraded in place (old rows
    blank there) before the runner appends; a foreign file is refused, never appended to."""
    from alacarte.bench import FIELDS, append_row, upgrade_csv

    old_fields = FIELDS[: FIELDS.index("version") + 1]
    path = tmp_path / "old.csv"
    old_row = dict(zip(old_fields, ["yacht", "0", "gm", "gm", "ok", "0.1", "0.2", "3.0", "300.0", "277", "6",
                                    "1024", "2", "5", "100", "0", "0.1.0"]))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, old_fields)
        writer.writeheader()
        writer.writerow(old_row)
    with pytest.raises(ValueError, match="upgrades an older results file"):
        append_row(path, {**old_row, "split": "1", "iterations": 7, "converged": True})
    upgrade_csv(path)
    upgrade_csv(path)  # a second upgrade changes nothing
    append_row(path, {**old_row, "split": "1", "iterations": 7, "converged": True})
    first, second = read_rows(path)
    assert list(first) == FIELDS
    assert {k: first[k] for k in old_fields} == old_row and first["iterations"] == first["converged"] == ""
    assert second["split"] == "1" and second["iterations"] == "7" and second["converged"] == "True"

    foreign = tmp_path / "foreign.csv"
    foreign.write_text("dataset,split,score\nyacht,0,1\n")
    with pytest.raises(ValueError, match="does not know: \\['score'\\]"):
        upgrade_csv(foreign)
    assert foreign.read_text() == "dataset,split,score\nyacht,0,1\n"


@pytest.mark.parametrize("setting, message", [
    (["--time-budget", "-1"], "--time-budget must be a finite number in (0, inf)"),
    (["--workers", "0"], "--workers must be a positive integer"),
    (["--num-samples", "0"], "--num-samples must be a positive integer"),
    (["--max-iter", "0"], "--max-iter must be a positive integer"),
    (["--threads", "0"], "--threads must be a positive integer"),
    (["--components", "x"], "--components must be 'auto' or a positive integer"),
    (["--noise-floor", "0"], "--noise-floor must be a finite number in (0, inf)"),
    (["--noise-floor", "nan"], "--noise-floor must be a finite number in (0, inf)"),
    (["--noise-floor", "1"], "--noise-floor must be below 1, the standardised targets' variance"),
    (["--splits", "3-1"], "splits '3-1' is an empty range"),  # (not 'splits must be in 0..9, got '3-1'')
])
def test_settings_no_cell_could_run_with_are_refused_before_any_cell_runs(tmp_path, capsys, setting, message):
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    assert main(["bench", "run", "--datasets", "servo", "--methods", "gm", "--splits", "0", "--csv", str(path),
                 "--data", str(SHARED), *setting]) == 2
    assert message in capsys.readouterr().err
    assert not path.exists()


def test_report_refuses_a_missing_or_foreign_results_file(tmp_path, capsys):
    from alacarte.cli import main

    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    assert main(["bench", "report", "--csv", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such results file" in capsys.readouterr().err
    assert main(["bench", "report", "--csv", str(foreign)]) == 2
    assert "is not a benchmark results file: it lacks the column(s) dataset" in capsys.readouterr().err
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"dataset,split\n\x80\x81\xff")
    assert main(["bench", "report", "--csv", str(binary)]) == 2
    assert "model.bin is not a text CSV file" in capsys.readouterr().err
    garbled = tmp_path / "garbled.csv"
    garbled.write_text("dataset,split,method,status,rmse,train_seconds,peak_rss_mb,max_iter\n"
                       "yacht,0,gm,ok,abc,1.0,100,100\n")
    assert main(["bench", "report", "--csv", str(garbled)]) == 2
    assert "garbled.csv: the row of yacht, split 0, gm has rmse = 'abc', not a number" in capsys.readouterr().err
    # A NaN RMSE would make its column's mean NaN and count it as the dataset's winner.
    garbled.write_text("dataset,split,method,status,rmse,train_seconds,peak_rss_mb,max_iter,n_train\n"
                       "yacht,0,gm,ok,nan,1.0,100,100,277\nyacht,0,pwl,ok,0.3,1.0,100,100,277\n")
    assert main(["bench", "report", "--csv", str(garbled)]) == 2
    assert "garbled.csv: the row of yacht, split 0, gm has rmse = 'nan', not a finite number" in capsys.readouterr().err


def _ok_row(dataset="yacht", split=0, method="gm", rmse=0.12, **settings):
    row = {"dataset": dataset, "split": split, "method": method, "model": method, "status": "ok", "rmse": rmse,
           "nlpd": 0.0, "train_seconds": 3.0, "peak_rss_mb": 300.0, "n_train": 277, "d": 6, "num_features": 32,
           "components": 2, "restarts": 0, "restart_iter": 1, "max_iter": 5, "seed": split, "version": "0",
           "device": "cpu", "noise_floor": 1e-4}
    row.update(settings)
    return row


def _to_run(path, capsys, *extra):
    """What `bench run` says it would do with ``path``; it starts no cell."""
    from unittest import mock

    from alacarte.bench import runner
    from alacarte.cli import main

    with mock.patch.object(runner, "_run_cells", return_value=0):
        assert main(["bench", "run", "--datasets", "yacht", "--methods", "gm", "--splits", "0", "--num-samples",
                     "16", "--restarts", "0", "--restart-iter", "1", "--max-iter", "5", "--data", str(SHARED),
                     "--csv", str(path), "-q", *extra]) == 0
    return capsys.readouterr().out


def test_missing_or_damaged_data_stop_the_run_before_any_cell_starts(tmp_path, monkeypatch, capsys):
    """Checked per cell instead, every cell would start, load nothing and fail alone after its start-up
    (seconds each: an hour for the 29-dataset job before it says so)."""
    import shutil
    from unittest import mock

    from alacarte.bench import runner
    from alacarte.cli import main

    damaged = tmp_path / "uci"
    shutil.copytree(SHARED / "yacht", damaged / "yacht")
    data = damaged / "yacht" / "data.csv.gz"
    data.chmod(0o644)
    data.write_bytes(data.read_bytes()[:-100])
    monkeypatch.delenv("ALACARTE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ALACARTE_UCI_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    for data_dir, message in ((["--data", str(damaged)], "data.csv.gz' is damaged"),
                              ([], "could not be downloaded from http://127.0.0.1:9/yacht/data.csv.gz")):
        with mock.patch.object(runner, "_run_cells", return_value=0) as cells:
            assert main(["bench", "run", "--datasets", "yacht", "--methods", "gm", "--splits", "0",
                         "--csv", str(tmp_path / "rows.csv"), "-q", *data_dir]) == 2
        assert not cells.called and message in capsys.readouterr().err


def test_a_row_cut_off_mid_write_is_dropped_not_counted_or_glued_to_the_next(tmp_path, capsys):
    from alacarte.bench import append_row, read_rows

    path = tmp_path / "rows.csv"
    append_row(path, _ok_row(split=1))
    append_row(path, _ok_row(split=0))
    path.write_bytes(path.read_bytes()[:-40])  # the runner died while writing split 0's row
    out = _to_run(path, capsys)
    assert "dropped an incomplete last line" in out and "1 cells done, 1 to run" in out  # split 1 only
    assert path.read_text().endswith("\n")
    append_row(path, _ok_row(split=0, rmse=0.5))
    assert [(r["split"], r["rmse"]) for r in read_rows(path)] == [("1", "0.12"), ("0", "0.5")]
    # a damaged row that does end its line is an error naming it, not a traceback or a cell done
    with open(path, "a") as fh:
        fh.write("yacht\n")
    with pytest.raises(ValueError, match=r"data row 3 \('yacht'\) is not a complete results row"):
        from alacarte.bench.store import finished_rows
        finished_rows(path)


def test_each_cell_is_run_and_recorded_once(tmp_path, capsys):
    from alacarte.bench import append_row, read_rows
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    assert "0 cells done, 1 to run" in _to_run(path, capsys, "--datasets", "yacht", "Yacht", "--splits", "0,0",
                                               "--methods", "gm", "gm")
    # a second runner on the same file that finishes the same cell second writes nothing
    assert append_row(path, _ok_row()) and not append_row(path, _ok_row(rmse=0.2))
    assert len(read_rows(path)) == 1
    assert append_row(path, _ok_row(max_iter=50))  # the same cell at other settings is another result
    assert main(["bench", "report", "--csv", str(path), str(path)]) == 2
    assert "yacht split 0 gm max_iter=5 appears twice" in capsys.readouterr().err


def test_a_resumed_run_at_other_settings_runs_its_own_cells(tmp_path, capsys):
    from alacarte.bench import append_row

    path = tmp_path / "rows.csv"
    append_row(path, _ok_row())
    assert "1 cells done, 0 to run" in _to_run(path, capsys)
    for setting, value, shown in (("--max-iter", "50", "max_iter=5 (this run: 50)"),
                                  ("--num-samples", "64", "D=32 (this run: 128)"),
                                  ("--restarts", "2", "restarts=0 (this run: 2)"),
                                  ("--restart-iter", "15", "restart_iter=1 (this run: 15)"),
                                  ("--components", "4", "components=2 (this run: 4)"),
                                  ("--noise-floor", "1e-6", "noise_floor=0.0001 (this run: 1e-06)")):
        out = _to_run(path, capsys, setting, value)
        assert "0 cells done, 1 to run" in out and shown in out, (setting, out)


def test_a_timeout_is_shown_only_in_the_column_of_its_settings(tmp_path):
    """Timeouts counted by method alone would put a gm timeout at D=32 as "timeout" in the gm D=64 column
    of a dataset that column never ran."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    append_row(path, _ok_row(split=0, num_features=32))
    append_row(path, {**_ok_row(split=1, num_features=32), "status": "timeout", "rmse": "", "n_train": ""})
    append_row(path, _ok_row(dataset="concrete", num_features=64))
    # (split 2 timed out in one runner and finished in another, with 'auto' components: rows of two keys)
    append_row(path, _ok_row(split=2, num_features=32, rmse=0.14))
    append_row(path, {**_ok_row(split=2, num_features=32), "status": "timeout", "rmse": "", "n_train": "",
                      "components": ""})
    append_row(path, {**_ok_row(dataset="concrete", method="exact-ard", num_features=""), "status": "timeout",
                      "rmse": "", "n_train": "", "components": ""})  # (an exact GP's D is blank: any column's)
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    header = next(line for line in text.splitlines() if line.startswith("| dataset | n train"))
    assert "| exact-ard | gm D=32 | gm D=64 |" in header
    yacht = next(line for line in text.splitlines() if line.startswith("| yacht |")).split(" | ")
    concrete = next(line for line in text.splitlines() if line.startswith("| concrete |")).split(" | ")
    assert yacht[2] == "—" and yacht[4] == "—"  # gm D=64 never ran yacht
    assert yacht[3].startswith("**0.13 ± 0.01 [2]**") and yacht[3].endswith(" · 1 timed out</sub>")
    assert concrete[2] == "timeout" and concrete[3] == "—"


def test_a_result_is_written_beside_another_runners_timeout_of_the_cell(tmp_path):
    """A timeout row of the same cell and settings is no finished cell: taken for one, the result of a
    runner with a longer budget would be dropped ('another runner … finished it first'), and the report
    would say 'timeout'.  A timeout beside a result, or a second timeout, is not written."""
    from alacarte.bench import append_row

    path = tmp_path / "rows.csv"
    timeout = {**_ok_row(split=1), "status": "timeout", "rmse": "", "nlpd": "", "peak_rss_mb": ""}
    assert append_row(path, timeout)
    assert append_row(path, _ok_row(split=1))
    assert not append_row(path, _ok_row(split=1)) and not append_row(path, timeout)

def test_a_timeout_at_settings_no_cell_finished_at_gets_its_own_column(tmp_path):
    """gm finished split 0 at D=32 and timed out on split 1 at D=64: counted under the one gm column (the
    D=32 cells'), the timeout would read '0.12 ± 0 [1] · 1 timed out', as if D=32 had timed out."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    append_row(path, _ok_row(split=0, num_features=32))
    append_row(path, {**_ok_row(split=1, num_features=64), "status": "timeout", "rmse": ""})
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    header = next(line for line in text.splitlines() if line.startswith("| dataset | n train"))
    assert "| gm D=32 | gm D=64 |" in header
    yacht = next(line for line in text.splitlines() if line.startswith("| yacht |")).split(" | ")
    assert yacht[2].endswith("300 MB</sub>") and yacht[3] == "timeout"

def test_the_report_keeps_settings_apart_and_shows_methods_that_only_timed_out(tmp_path):
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    for split in (0, 1):
        append_row(path, _ok_row(split=split, restarts=0, components=1, rmse=1.0))
        append_row(path, _ok_row(split=split, restarts=2, components=4, rmse=2.0))
    append_row(path, {**_ok_row(dataset="concrete", method="pwl"), "status": "timeout", "rmse": "", "n_train": "",
                      "num_features": "", "components": ""})

    def table(**extra):
        args = argparse.Namespace(csv=[str(path)], paper=extra.get("paper", DEFAULT_PAPER), out=None, command=None)
        return report(args)
    text = table()
    header = next(line for line in text.splitlines() if line.startswith("| dataset | n train"))
    assert "gm restarts=0 components=1" in header and "gm restarts=2 components=4" in header and "| pwl |" in header
    assert "1 ± 0 [2]" in text and "2 ± 0 [2]" in text
    assert any(line.startswith("| concrete | — |") and "timeout" in line for line in text.splitlines())
    with pytest.raises(ValueError, match="--paper .*missing.csv: no such file .*the paper's table shipped with alacarte"):
        table(paper=str(tmp_path / "missing.csv"))  # (the default, from an installed copy)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="--paper .*other.csv: not a table of the paper's values"):
        table(paper=str(tmp_path / "other.csv"))


def test_the_report_prints_the_papers_values_as_the_paper_prints_them(tmp_path):
    """Trailing zeros are digits: the paper's FSARD 2.00 ± 0.38 on airfoil must not read "2 ± 0.38",
    its 3.97 ± 2.54 on concreteslump "3.97 ± 2.5", nor parkinsons' best "0 (GM)" in the goal table."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    for dataset in ("airfoil", "concreteslump", "parkinsons"):
        append_row(path, _ok_row(dataset=dataset, method="fsard"))
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    airfoil, slump, parkinsons = (next(line for line in text.splitlines() if line.startswith(f"| {ds} | 277 |"))
                                  for ds in ("airfoil", "concreteslump", "parkinsons"))
    assert "| 2.00 ± 0.38 |" in airfoil and "| 3.97 ± 2.54 |" in slump, (airfoil, slump)
    assert any(line.startswith("| parkinsons | 0.12 (fsard) | 0.00 (GM) |") for line in text.splitlines()), text


def test_the_report_opens_with_a_summary_of_exact_ard_our_best_kernel_and_the_papers_best(tmp_path):
    """Before the table of every configuration: per dataset exact ARD's RMSE (NLPD), the lowest mean RMSE
    among the À la carte kernels' columns (whichever setting), and the paper's best, in five columns."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    for split in (0, 1):
        append_row(path, _ok_row(split=split, method="exact-ard", rmse=0.2 + split * 0.02, nlpd=-0.5))
        append_row(path, _ok_row(split=split, method="gm", rmse=0.15, nlpd=-0.3))
        append_row(path, _ok_row(split=split, method="pwl", rmse=0.1 + split * 0.02, nlpd=0.7))
        append_row(path, _ok_row(split=split, method="fsard", rmse=0.13, restarts=3))
        append_row(path, _ok_row(split=split, method="ssgpr", rmse=0.01))  # not an À la carte kernel
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| dataset"))
    assert lines[start] == ("| dataset (n train) | exact ARD: RMSE (NLPD) | best À la carte kernel | its RMSE (NLPD) "
                            "| paper's best RMSE |")
    assert lines[start + 2] == "| yacht (277) | 0.21 (-0.5) | pwl | 0.11 (0.7) | 0.12 (PWL) |", lines[start + 2]
    assert start < next(i for i, line in enumerate(lines) if line.startswith("| dataset | n train"))


def test_a_report_without_paper_columns_is_a_well_formed_table(tmp_path):
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    append_row(path, _ok_row(method="rks"))
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| dataset | n train"))
    widths = {line.count("|") for line in lines[start:start + 5] if line.startswith("|")}
    assert widths == {4}, lines[start:start + 5]


def test_a_result_delivered_before_its_budget_ran_out_is_recorded_as_a_result(tmp_path, monkeypatch):
    """Two cells whose results are both waiting when the runner next looks, after the budget has
    passed: both are results (not the second killed, written as a timeout, and then its own result
    crashing the runner with a KeyError)."""
    import argparse
    import queue
    import types

    from alacarte.bench import runner

    class Process:
        def __init__(self, target, args, daemon):
            self.exitcode = None

        def start(self):
            pass

        def join(self, timeout=None):
            self.exitcode = 0 if self.exitcode is None else self.exitcode

        def kill(self):
            self.exitcode = -9

    clock = iter([0.0, 0.0] + [100.0] * 100)  # both start at 0; the runner next looks at 100 s
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    path = tmp_path / "rows.csv"
    args = argparse.Namespace(csv=str(path), workers=2, time_budget=20.0, quiet=True)
    cfg = {"restarts": 0, "restart_iter": 1, "max_iter": 5, "version": "0", "device": "cpu", "noise_floor": 1e-4,
           "num_samples": 16, "components": "auto", "checkpoints": str(tmp_path / "rows.checkpoints")}
    results = queue.Queue()
    for index in (0, 1):
        results.put((index, _ok_row(split=index)))
    pending = [(1, ("yacht", 1, "gm", cfg)), (0, ("yacht", 0, "gm", cfg))]
    assert runner._run_cells(args, cfg, types.SimpleNamespace(Process=Process), pending, {}, results) == 0
    assert [(r["split"], r["status"]) for r in read_rows(path)] == [("0", "ok"), ("1", "ok")]


@pytest.mark.parametrize("setting, message", [
    (["--components", "3", "--num-samples", "16"], "--num-samples 16 must be a multiple of the number of GM/PWL components, 3"),
    (["--num-samples", "18"], "--num-samples 18 must be a multiple of the number of GM/PWL components, 4 (each"),
])
def test_feature_counts_the_mixtures_cannot_split_are_refused_before_any_cell_runs(tmp_path, capsys, setting, message):
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    assert main(["bench", "run", "--datasets", "servo", "--methods", "gm", "--splits", "0", "--csv", str(path),
                 "--data", str(SHARED), *setting]) == 2
    assert message in capsys.readouterr().err and not path.exists()


def test_a_cell_killed_mid_fit_resumes_from_its_checkpoint_and_writes_the_uninterrupted_row(tmp_path, monkeypatch):
    """A cell killed during its fit (here: an exception at a likelihood evaluation of the final
    optimisation) goes on from its checkpoint — fewer evaluations than a fit from the start — and
    gives the row the uninterrupted cell gives; the runner picks the same checkpoint up, writes that
    row and deletes the checkpoint."""
    from threadpoolctl import threadpool_limits

    import alacarte.training._optimization as optimization
    import alacarte.training._stages as training_stages
    from alacarte.bench import runner
    from alacarte.bench.settings import cell_settings
    from alacarte.cli import build_parser

    path = tmp_path / "rows.csv"
    args = build_parser().parse_args(["bench", "run", "--datasets", "yacht", "--methods", "gm", "--splits", "0",
                                      "--num-samples", "16", "--restarts", "1", "--restart-iter", "3", "--max-iter",
                                      "12", "--workers", "1", "--data", str(SHARED), "--csv", str(path), "-q"])
    cfg = cell_settings(args)
    evaluate, calls = optimization.negative_mll, [0]

    class Killed(Exception):
        pass

    def counted(*a, **k):
        calls[0] += 1
        if calls[0] == kill_at:
            raise Killed
        return evaluate(*a, **k)

    def cell(settings):
        calls[0] = 0
        return runner._run_cell(("yacht", 0, "gm", settings)), calls[0]

    monkeypatch.setattr(optimization, "negative_mll", counted)
    monkeypatch.setattr(training_stages, "CHECKPOINT_INTERVAL", 0.0)  # save at every iteration
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    (tmp_path / "elsewhere").mkdir()
    try:
        with threadpool_limits(limits=None):  # (the cell sets torch's and BLAS's threads for its process)
            kill_at = None
            whole, evaluations = cell({**cfg, "checkpoints": str(tmp_path / "elsewhere")})
            kill_at = evaluations - 4  # in the final optimisation
            with pytest.raises(Killed):
                cell(cfg)
            (saved,) = Path(cfg["checkpoints"]).iterdir()
            assert saved == runner.cell_checkpoint(cfg, "yacht", 0, "gm")
            assert saved_progress(saved)["stage"][0] == "final"
            kill_at = None
            resumed, resumed_evaluations = cell(cfg)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
    assert 0 < resumed_evaluations < 10 < evaluations
    assert {k: v for k, v in resumed.items() if k not in TIMING} == {k: v for k, v in whole.items() if k not in TIMING}
    assert runner.run(args) == 0  # the checkpoint holds the finished fit: its row, with no training
    (row,) = read_rows(path)
    assert row["rmse"] == repr(resumed["rmse"]) and row["train_seconds"] == repr(resumed["train_seconds"])
    folder = Path(cfg["checkpoints"])
    assert list(folder.iterdir()) == []  # deleted with the row written
    # What a runner stopped between writing a row and deleting its checkpoint leaves, or a cell
    # killed under other settings or code, or a write cut off by a kill: the next run deletes it
    # (a write of the last hour may be another runner's, under way; an unfinished cell's checkpoint stays).
    leftovers = {name: folder / name for name in ("yacht-0-gm-0123456789ab.ckpt", ".yacht-0-gm-x.ckpt.1.tmp")}
    kept = {name: folder / name for name in ("yacht-0-exact-ard-0123456789ab.ckpt", ".yacht-1-gm-x.ckpt.2.tmp")}
    for file in [*leftovers.values(), *kept.values()]:
        file.write_bytes(b"")
    hours_ago = time.time() - 7200
    os.utime(leftovers[".yacht-0-gm-x.ckpt.1.tmp"], (hours_ago, hours_ago))
    assert runner.run(args) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)
    assert len(read_rows(path)) == 1  # (nothing ran again)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the runner's large peak is set up on Linux")
def test_a_cells_peak_memory_is_its_own_not_its_runners(tmp_path):
    """A cell process is spawned (fork, then exec), and ``ru_maxrss`` keeps the larger of the
    runner's and the cell's peak across exec: a runner holding 1.5 GB would give a challenger cell of
    392 MB a peak_rss_mb of 1811."""
    import resource

    from alacarte.cli import main

    ballast = np.ones(1000 * 2**20 // 8)  # 1 GB resident in the runner (this process); its pages take seconds
    runner_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    path = tmp_path / "rows.csv"
    assert main(["bench", "run", "--datasets", "challenger", "--methods", "exact-rbf", "--splits", "0",
                 "--max-iter", "2", "--restarts", "0", "--workers", "1", "--data", str(SHARED),
                 "--csv", str(path), "-q"]) == 0
    del ballast
    (row,) = read_rows(path)
    assert runner_peak > 1000 and 0 < float(row["peak_rss_mb"]) < 800


def test_a_cell_checkpoint_of_another_checkpoint_format_is_not_looked_for(monkeypatch):
    """A cell's checkpoint name tags the run's settings and code version, so that other code fits the
    cell from the start; but an installed copy's version is the release alone ('0.1.0'), which a new
    checkpoint format need not change: without the format in the tag, a cell killed under format 1
    would leave its file at the very path the next run reads, and the cell would fail at every run
    ('of format version 1; this alacarte reads format version 2; pass another path, or delete it'),
    a path no runner's user chooses.  The format is in the tag."""
    from alacarte import _checkpoint
    from alacarte.bench import runner

    cfg = {**{name: 0 for name in runner._FIT_SETTINGS}, "version": "0.1.0", "checkpoints": "rows.checkpoints"}
    path = runner.cell_checkpoint(cfg, "yacht", 0, "gm")
    monkeypatch.setattr(_checkpoint, "FORMAT_VERSION", _checkpoint.FORMAT_VERSION - 1)
    older = runner.cell_checkpoint(cfg, "yacht", 0, "gm")
    assert older != path and runner._TAGGED_CHECKPOINT.fullmatch(older.name).group(1) == "yacht-0-gm"


def test_summary_rows_say_over_how_many_datasets_each_method_counts(tmp_path):
    """'Datasets won' and the mean normalised RMSE averaged each method over the datasets it ran, and an
    exact GP runs on the small ones only: in uci_full.md gm's 1.133 (29 datasets) looked better than
    pwl's 1.351 (26), while on the 18 datasets both ran pwl is 1.072 and gm 1.151. Where the methods ran
    on different datasets, each count says of how many, and a row averages over the ones every method ran."""
    import argparse

    from alacarte.bench import report

    path = tmp_path / "rows.csv"
    # yacht: a 1.0, b 2.0 (b normalised 2); wine: b 1.0 only (a did not run it).
    _result(path, "yacht", 0, "gm", 1.0)
    _result(path, "yacht", 0, "pwl", 2.0)
    _result(path, "wine", 0, "pwl", 1.0)
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    assert "| **datasets won** (ours, of the datasets each ran) | | 1 of 1 | 1 of 2 |" in text, text
    assert "over the datasets each ran, in brackets) | | 1.000 (1) | 1.500 (2) |" in text, text
    assert "| **mean normalised RMSE on the 1 dataset every method ran** | | 1.000 | 2.000 |" in text, text
    _result(path, "wine", 0, "gm", 0.5)  # both ran both: the plain rows
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    assert "| **datasets won** (ours) | | 2 | 0 |" in text and "every method ran" not in text, text
    assert "| **mean normalised RMSE** (ours, 1 = best of ours) | | 1.000 | 2.000 |" in text, text
