"""The resumable UCI runner: a stopped-and-resumed run equals an uninterrupted one."""
import csv
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
from uci_cases import ROOT, SHARED, TIMING, ok_row, report, results, run, run_script

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")


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
    append_row(path, ok_row(split=1))
    append_row(path, ok_row(split=0))
    path.write_bytes(path.read_bytes()[:-40])  # the runner died while writing split 0's row
    out = _to_run(path, capsys)
    assert "dropped an incomplete last line" in out and "1 cells done, 1 to run" in out  # split 1 only
    assert path.read_text().endswith("\n")
    append_row(path, ok_row(split=0, rmse=0.5))
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
    assert append_row(path, ok_row()) and not append_row(path, ok_row(rmse=0.2))
    assert len(read_rows(path)) == 1
    assert append_row(path, ok_row(max_iter=50))  # the same cell at other settings is another result
    assert main(["bench", "report", "--csv", str(path), str(path)]) == 2
    assert "yacht split 0 gm max_iter=5 appears twice" in capsys.readouterr().err


def test_a_resumed_run_at_other_settings_runs_its_own_cells(tmp_path, capsys):
    from alacarte.bench import append_row

    path = tmp_path / "rows.csv"
    append_row(path, ok_row())
    assert "1 cells done, 0 to run" in _to_run(path, capsys)
    for setting, value, shown in (("--max-iter", "50", "max_iter=5 (this run: 50)"),
                                  ("--num-samples", "64", "D=32 (this run: 128)"),
                                  ("--restarts", "2", "restarts=0 (this run: 2)"),
                                  ("--restart-iter", "15", "restart_iter=1 (this run: 15)"),
                                  ("--components", "4", "components=2 (this run: 4)"),
                                  ("--noise-floor", "1e-6", "noise_floor=0.0001 (this run: 1e-06)")):
        out = _to_run(path, capsys, setting, value)
        assert "0 cells done, 1 to run" in out and shown in out, (setting, out)


def test_a_result_is_written_beside_another_runners_timeout_of_the_cell(tmp_path):
    """A timeout row of the same cell and settings is no finished cell: taken for one, the result of a
    runner with a longer budget would be dropped ('another runner … finished it first'), and the report
    would say 'timeout'.  A timeout beside a result, or a second timeout, is not written."""
    from alacarte.bench import append_row

    path = tmp_path / "rows.csv"
    timeout = {**ok_row(split=1), "status": "timeout", "rmse": "", "nlpd": "", "peak_rss_mb": ""}
    assert append_row(path, timeout)
    assert append_row(path, ok_row(split=1))
    assert not append_row(path, ok_row(split=1)) and not append_row(path, timeout)


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
        results.put((index, ok_row(split=index)))
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


