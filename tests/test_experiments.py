"""The experiment scripts' own machinery: resumable result files, and settings that would run nothing."""
import argparse
import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import selection_benchmark  # noqa: E402
from _csv_rows import append_row, read_rows  # noqa: E402


def refusal(main, args, capsys) -> tuple[int, str]:
    """The exit status and stderr of a script's ``main(args)`` that argparse stops."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    return stop.value.code, capsys.readouterr().err


def test_a_row_cut_short_by_a_killed_run_is_not_done_and_does_not_swallow_the_next(tmp_path):
    path = tmp_path / "selection.csv"
    row = dict(problem="se3", n=1000, method="ridge", replication=0, rmse="1.234567", selected="0 1 2",
               relevance=" ".join(["0.001"] * 1000), train_seconds="1.00", seed=1, version="x")
    append_row(path, selection_benchmark.COLUMNS, row)
    append_row(path, selection_benchmark.COLUMNS, {**row, "replication": 1})
    text = path.read_bytes()
    path.write_bytes(text[:-3000])  # killed while writing replication 1's row
    assert selection_benchmark.done_cells(path) == {("se3", 1000, "ridge", 0)}
    append_row(path, selection_benchmark.COLUMNS, {**row, "replication": 2})
    rows = read_rows(path)
    assert [(r["replication"], r["rmse"], r["version"]) for r in rows] == [("0", "1.234567", "x"), ("2", "1.234567", "x")]
    assert path.read_bytes().count(b"\n") == 3


def test_the_streaming_benchmark_resumes_a_raw_file_whose_last_row_was_cut_short(tmp_path):
    committed = (ROOT / "experiments/results/streaming_raw.jsonl").read_text()
    raw = tmp_path / "raw.jsonl"
    raw.write_text(committed + committed.splitlines()[-1][:60])  # killed while writing a row
    tables = []
    for source in (raw, ROOT / "experiments/results/streaming_raw.jsonl"):
        out = tmp_path / "streaming.md"
        subprocess.run([sys.executable, str(ROOT / "experiments/bench_streaming.py"), "--render-only", "--raw",
                        str(source), "--out", str(out)], check=True, capture_output=True, timeout=120)
        tables.append([line for line in out.read_text().splitlines() if "|" in line])
    assert tables[0] == tables[1] and len(tables[0]) > 2


def test_a_rosasco_replication_killed_after_its_first_rows_gets_the_others_on_resume(tmp_path, monkeypatch):
    import selection_rffnet

    path = tmp_path / "selection_rffnet.csv"
    monkeypatch.setattr(selection_rffnet, "CSV_PATH", str(path))
    for method in ("alg1", "alg1_gr"):  # the rows written before the kill
        append_row(path, selection_rffnet.COLUMNS, selection_rffnet.row("f1", 80, method, 0, 1.0, [0], [1.0], 1.0, 0))
    selection_rffnet.run_rosasco(1, ["f1"])
    rows = read_rows(path)
    assert [r["method"] for r in rows] == ["alg1", "alg1_gr", "g_ridge", "l1"]
    assert rows[0]["rmse"] == "1"  # not run again
    committed = {r["method"]: r for r in read_rows(ROOT / "experiments/results/selection_rffnet.csv")
                 if r["problem"] == "f1" and r["replication"] == "0"}
    for r in rows[2:]:
        assert (r["rmse"], r["selected"], r["relevance"]) == tuple(committed[r["method"]][k] for k in ("rmse", "selected", "relevance"))


@pytest.mark.parametrize("args, message", [
    (["--part", "se", "--problems", "f1"], "--part se runs the problems se1 se2 se3; got --problems f1"),
    (["--part", "se", "--problems", "se3", "--sizes", "5000"], "runs se3 at the training sizes 1000 50000"),
    (["--part", "rosasco", "--replications", "0"], "--replications must be at least 1"),
    (["--part", "se", "--half-width", "1"], "--half-width is the domain of --part rosasco"),
    (["--part", "rosasco", "--half-width", "0"], "--half-width must be positive"),
])
def test_selection_rffnet_refuses_settings_that_would_run_nothing(args, message, capsys):
    import selection_rffnet

    status, err = refusal(selection_rffnet.main, args, capsys)
    assert status == 2 and message in err


def test_the_wine_diagnostic_does_not_count_a_row_cut_short_as_done(tmp_path):
    import wine_duplicates

    path = tmp_path / "wine.csv"
    for split in (0, 1):
        append_row(path, wine_duplicates.FIELDS, {"split": split, "rows": "all", "rmse": "0.5", "version": "x"})
    path.write_bytes(path.read_bytes()[:-4])  # killed while writing split 1's row
    assert wine_duplicates._done(path) == {(0, "all")}


def test_the_selection_report_leaves_out_a_row_a_running_benchmark_is_still_writing(tmp_path, monkeypatch):
    import selection_report

    monkeypatch.setattr(selection_report, "RESULTS", tmp_path)
    path = tmp_path / "selection_srff.csv"
    row = dict(problem="se2", n=1000, method="srff", replication=0, rmse="1.5", selected="10", relevance="1",
               train_seconds="100.00", seed=1, version="x")
    append_row(path, selection_benchmark.COLUMNS, row)
    append_row(path, selection_benchmark.COLUMNS, {**row, "replication": 1, "rmse": "1.2"})
    path.write_bytes(path.read_bytes()[:-10])  # cut inside train_seconds (100.00 read as 10)
    assert [r["rmse"] for r in selection_report.load_rows()] == ["1.5"]


def test_the_calibration_summary_compares_a_kernel_with_exact_ard_on_the_splits_both_have(tmp_path):
    import calibration

    path = tmp_path / "cells.csv"
    scores = dict(rmse=1.0, coverage50=0.5, coverage95=0.95, std_over_rmse=1.0)
    for split, nlpd in enumerate([0.0, 3.0, 3.0]):  # exact ARD: 0 on split 0, 2 over splits 0-2
        append_row(path, calibration.FIELDS, dict(dataset="ds", split=split, method="exact-ard",
                                                  validation_fraction=0.0, num_features=1024, nlpd=nlpd, **scores))
    append_row(path, calibration.FIELDS, dict(dataset="ds", split=0, method="gm", validation_fraction=0.2, num_features=1024,
                                              nlpd=0.05, **scores))
    args = argparse.Namespace(csv=[path], protocol="0.2", num_samples=512, pilot_rows="auto", paper_protocol=None, num_draws=1,
                              feature_draws=None, splits=None)
    text = calibration.report(args)
    assert "| gm | 1/1 (+0.05) | — | 0/0 | 0/0 | 0/1 |" in text  # against split 0's 0.0, not the three splits' mean
    assert "| ds [3] | 2.00 | 0.05 [1] |" in text


def test_the_calibration_report_reads_the_feature_kernels_at_one_d_against_exact_ard_at_any(tmp_path):
    """A later run at D = 512 must not replace the D = 1024 cells it shares splits with: each D is its own
    report (--num-samples), and exact ARD (exact, or its D = 1024 expansion on large data) is every D's reference."""
    import calibration

    path = tmp_path / "cells.csv"
    scores = dict(rmse=1.0, coverage50=0.5, coverage95=0.95, std_over_rmse=1.0)
    cells = [("exact-ard", 0.0, 0, 0, [1.0, 1.0]), ("exact-ard", 0.0, 1024, 1, [3.0]),
             ("gm", 0.2, 1024, 0, [1.5, 1.5]), ("gm", 0.2, 512, 0, [1.2]), ("gm", 0.2, 1024, 1, [3.5])]
    for method, fraction, features, dataset, values in cells:
        for split, nlpd in enumerate(values):
            append_row(path, calibration.FIELDS, dict(dataset=f"ds{dataset}", split=split, method=method, nlpd=nlpd,
                                                      num_features=features, validation_fraction=fraction, **scores))
    args = argparse.Namespace(csv=[path], protocol="0.2", num_samples=512, pilot_rows="auto", paper_protocol=None, num_draws=1,
                              feature_draws=None, splits=None)
    text = calibration.report(args)
    assert "| ds0 [2] | 1.00 | 1.50 |" in text and "| gm | 0/2 (+0.50) |" in text
    args.num_samples = 256
    text = calibration.report(args)
    assert "| ds0 [2] | 1.00 | 1.20 [1] |" in text and "| ds1 [1] | 3.00 | — |" in text
    assert "| gm | 0/1 (+0.20) |" in text
    args.num_samples, args.splits = 512, "1"  # D = 1 024 on split 1 alone
    text = calibration.report(args)
    assert "| ds0 [1] | 1.00 | 1.50 |" in text and "| ds1 [" not in text


def test_the_calibration_report_lists_the_cells_above_a_tenth_with_their_standard_error(tmp_path):
    import calibration

    path = tmp_path / "cells.csv"
    scores = dict(rmse=1.0, coverage50=0.5, coverage95=0.95, std_over_rmse=1.0)
    for method, fraction, values in [("exact-ard", 0.0, [0.0, 1.0, 2.0]), ("gm", 0.2, [0.1, 1.3, 2.5]),
                                     ("pwl", 0.2, [0.05, 1.05, 2.05])]:
        for split, nlpd in enumerate(values):
            append_row(path, calibration.FIELDS, dict(dataset="ds", split=split, method=method, num_features=1024,
                                                      validation_fraction=fraction, nlpd=nlpd, **scores))
    args = argparse.Namespace(csv=[path], protocol="0.2", num_samples=512, pilot_rows="auto", paper_protocol=None, num_draws=1,
                              feature_draws=None, splits=None)
    text = calibration.report(args)
    # differences 0.1, 0.3, 0.5: mean 0.3, standard deviation 0.2, over √3
    assert "| ds | gm | 3 | +0.30 | 0.12 |" in text
    assert "| ds | pwl |" not in text


def test_the_calibration_report_takes_a_csv_rerun_over_a_feature_draw_line_of_the_same_cell(tmp_path):
    import calibration

    path, lines = tmp_path / "cells.csv", tmp_path / "draws.jsonl"
    scores = dict(rmse=1.0, coverage50=0.5, coverage95=0.95, std_over_rmse=1.0)
    append_row(path, calibration.FIELDS, dict(dataset="ds", split=0, method="exact-ard", validation_fraction=0.0,
                                              num_features=0, n_train=100, nlpd=0.0, num_draws=1, **scores))
    append_row(path, calibration.FIELDS, dict(dataset="ds", split=0, method="gm", validation_fraction=0.2,
                                              num_features=1024, n_train=100, nlpd=0.25, num_draws=5, **scores))
    lines.write_text(json.dumps(dict(dataset="ds", split=0, method="gm", K=5,
                                     moment_matched=dict(nlpd=0.75, **scores))) + "\n")
    args = argparse.Namespace(csv=[path], protocol="0.2", num_samples=512, pilot_rows="auto", paper_protocol=None, num_draws="auto",
                              feature_draws=[lines], splits=None)
    assert "| ds [1] | 0.00 | 0.25 |" in calibration.report(args)


def test_the_calibration_comparison_pairs_each_rerun_cell_with_its_latest_earlier_row(tmp_path):
    import calibration

    before, after = tmp_path / "before.csv", tmp_path / "after.csv"
    cell = dict(dataset="ds", method="gm", validation_fraction=0.2, num_features=1024, n_train=100, num_draws=1,
                coverage50=0.5, std_over_rmse=1.0)
    for path, split, nlpd, rmse, cov in [(before, 0, 9.0, 9.0, 0.5), (before, 0, 1.0, 2.0, 0.99),
                                         (before, 1, 0.5, 1.0, 0.95), (after, 0, 0.5, 1.0, 0.95),
                                         (after, 2, 0.0, 1.0, 0.95)]:  # split 2 has no earlier row
        append_row(path, calibration.FIELDS, dict(cell, split=split, nlpd=nlpd, rmse=rmse, coverage95=cov))
    text = calibration.compare(argparse.Namespace(before=[before], after=after, num_draws=1, protocol="0.2"))
    assert "| ds | 0 | gm | 1.000 → 0.500 | 2 → 1 | 0.99 → 0.95 |" in text
    assert "| ds | 1 | gm |" not in text and "| ds | 2 | gm |" not in text
    assert "| ds | gm | 1 | 1.000 → 0.500 | 0.500 | 0.990 → 0.950 |" in text


def test_the_calibration_mixture_of_draws_is_what_the_estimator_predicts(tmp_path):
    import calibration
    import numpy as np
    import torch
    from alacarte import AlaCarteRegressor
    from alacarte.bench.scores import predictive_scores

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (80, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(80)
    # Ten training rows repeated, and five test rows at training inputs: the replicates' predictions too.
    x_train, y_train = np.vstack([x[:60], x[:10]]), np.r_[y[:60], y[:10] + 0.01 * rng.standard_normal(10)]
    x_test, y_test = np.vstack([x[60:], x[:5]]), np.r_[y[60:], y[:5] + 0.01 * rng.standard_normal(5)]
    data = argparse.Namespace(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    args = argparse.Namespace(num_samples=16, pilot_rows="auto", num_components="4", validation_fraction=0.2,
                              num_draws="auto", replicates=True, alone_csv=str(tmp_path / "alone.csv"))
    row = calibration.run_cell(data, "toy", 1, "gm", 2, args)
    reg = AlaCarteRegressor("gm", num_samples=16, num_draws=2, random_state=1, max_iter=100).fit(x_train, y_train)
    mean, std = reg.predict(x_test, return_std=True)
    expected = predictive_scores(torch.as_tensor(mean), torch.as_tensor(std**2), torch.as_tensor(y_test))
    alone = reg.set_params(replicates=False).fit(x_train, y_train).predict(x_test, return_std=True)
    (alone_row,) = calibration.read_rows(args.alone_csv)
    assert float(alone_row["nlpd"]) == pytest.approx(predictive_scores(
        torch.as_tensor(alone[0]), torch.as_tensor(alone[1] ** 2), torch.as_tensor(y_test))["nlpd"], rel=1e-9)
    assert float(alone_row["nlpd"]) > row["nlpd"] + 0.1  # the repeated inputs' own targets help
    assert row["num_draws"] == 2
    assert row["nlpd"] == pytest.approx(expected["nlpd"], rel=1e-9)
    assert row["rmse"] == pytest.approx(expected["rmse"], rel=1e-9)
    single = calibration.run_cell(data, "toy", 1, "gm", 1, args)
    assert single["nlpd"] != pytest.approx(row["nlpd"], rel=1e-3)  # the second draw changes the prediction


def test_a_calibration_cell_on_a_pilot_is_what_the_estimator_with_that_pilot_predicts(tmp_path):
    """``--pilot-rows`` fits GM as ``AlaCarteRegressor(pilot_rows=…)`` does; exact ARD, the reference, fits every row."""
    import calibration
    import numpy as np
    import torch
    from alacarte import AlaCarteRegressor
    from alacarte.bench.scores import predictive_scores

    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (100, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(100)
    data = argparse.Namespace(x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    args = argparse.Namespace(num_samples=16, pilot_rows=30, num_components="4", validation_fraction=0.2,
                              num_draws=1, replicates=True, alone_csv=None)
    row = calibration.run_cell(data, "toy", 2, "gm", 1, args)
    reg = AlaCarteRegressor("gm", num_samples=16, num_draws=1, pilot_rows=30, random_state=2).fit(x[:80], y[:80])
    mean, std = reg.predict(x[80:], return_std=True)
    expected = predictive_scores(torch.as_tensor(mean), torch.as_tensor(std**2), torch.as_tensor(y[80:]))
    assert row["nlpd"] == pytest.approx(expected["nlpd"], rel=1e-9) and row["num_features"] == 32
    assert calibration.cell_size("exact-ard", 10**6, "auto", 30) == (512, None)
    assert calibration.cell_size("gm", 10**6, "auto", "auto") == (2048, 5000)


def test_compare_runs_refuses_a_results_file_that_does_not_exist(tmp_path, capsys):
    import compare_runs

    with pytest.raises(SystemExit) as stop:
        compare_runs.main(["--a", str(tmp_path / "typo.csv"), "--b", str(ROOT / "experiments/results/uci_cuda.csv"),
                           "--out", str(tmp_path / "out.md")])
    assert stop.value.code == 2 and "no such results file: " + str(tmp_path / "typo.csv") in capsys.readouterr().err
    assert not (tmp_path / "out.md").exists()


def test_the_streaming_benchmark_refuses_to_render_a_raw_file_that_does_not_exist(tmp_path, capsys):
    import bench_streaming

    out = tmp_path / "streaming.md"
    status, err = refusal(bench_streaming.main, ["--render-only", "--raw", str(tmp_path / "typo.jsonl"), "--out",
                                                 str(out)], capsys)
    assert status == 2 and "--render-only: no such raw file" in err and not out.exists()


@pytest.mark.parametrize("script", ["bench_derivative", "bench_features", "bench_fwht"])
def test_a_benchmark_sets_transparent_huge_pages_before_torch_is_imported(script):
    # the Machine line reports THP_MEM_ALLOC_ENABLE=1; torch reads it at its first allocation, made on import
    code = ("import os, sys\n"
            "seen = []\n"
            "sys.addaudithook(lambda event, args: seen.append(os.environ.get('THP_MEM_ALLOC_ENABLE'))\n"
            "                 if event == 'import' and args[0] == 'torch' and not seen else None)\n"
            f"sys.path[:0] = [{str(ROOT / 'experiments')!r}, {str(ROOT / 'tests')!r}]\n"
            f"import {script}\n"
            "print(seen[0])\n")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.strip() == "1", result.stderr


@pytest.mark.parametrize("args, message", [
    (["--problems", "se3", "--n", "2000"], "se3 runs at n = 1000 or 5000 or 10000 or 50000 only; got --n 2000"),
    (["--reps", "0"], "--reps and --n must be at least 1"),
    (["--n", "0", "--methods", "mean", "--reps", "1"], "--reps and --n must be at least 1"),  # wrote rmse = nan
])
def test_selection_benchmark_refuses_settings_that_would_run_nothing_or_nonsense(args, message, tmp_path, capsys):
    out = tmp_path / "rows.csv"
    status, err = refusal(selection_benchmark.main, [*args, "--out", str(out)], capsys)
    assert status == 2 and message in err and not out.exists()


def test_the_streamed_fit_report_names_the_training_size_and_the_load_it_ran_at(tmp_path):
    out = tmp_path / "streaming_fit.md"
    subprocess.run([sys.executable, str(ROOT / "experiments/train_distributed.py"), "--n-train", "2000", "--n-test", "100",
                    "--num-samples", "8", "--max-iter", "2", "--data", str(tmp_path), "--out", str(out)],
                   check=True, capture_output=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert out.read_text().splitlines()[0] == "# Full streamed fit of FSARD on 2,000 SE1 points"
    # the load it measured, not "2 cores shared with four other agents' jobs during the run"
    machine = next(line for line in out.read_text().splitlines() if line.startswith("Machine: "))
    assert re.match(rf"Machine: \S+, {os.cpu_count()} cores, 1-minute load average \d+\.\d at the start of the fit "
                    r"and \d+\.\d at its end, 1 torch thread\(s\) per process", machine), machine


def test_a_row_is_not_appended_under_the_columns_of_another_schema(tmp_path):
    path = tmp_path / "rows.csv"
    append_row(path, ["split", "rmse", "version"], {"split": 0, "rmse": "0.5", "version": "x"})
    with pytest.raises(ValueError, match=r"has the columns \['split', 'rmse', 'version'\]; this script writes "
                                         r"\['split', 'rmse', 'noise', 'version'\]"):
        append_row(path, ["split", "rmse", "noise", "version"], {"split": 1, "rmse": "0.4", "noise": "0.1", "version": "x"})
    assert len(read_rows(path)) == 1
    append_row(path, ["split", "rmse", "version"], {"split": 1, "rmse": "0.4", "version": "x"})
    assert [r["split"] for r in read_rows(path)] == ["0", "1"]


def test_the_appended_columns_report_averages_over_splits_and_reads_older_rows_as_split_0(tmp_path, capsys):
    import selection_real

    old, new = tmp_path / "old.csv", tmp_path / "new.csv"

    def row(split, columns, selected, rmse):
        values = {"dataset": "yacht", "split": split, "columns": columns, "seed": 0, "draw": 0, "n_train": 278,
                  "d": 2, "selected": selected, "rmse": rmse, "nlpd": rmse, "coverage95": 0.9, "seconds": 1,
                  "threads": 1, "version": "x"}
        return values

    older = [f for f in selection_real.FIELDS if f != "split"]
    append_row(old, older, {k: v for k, v in row(0, "original", "0 1", 1.0).items() if k != "split"})
    append_row(old, older, {k: v for k, v in row(0, "widened", "0 1 3", 1.2).items() if k != "split"})
    append_row(new, selection_real.FIELDS, row(1, "original", "1", 2.0))
    append_row(new, selection_real.FIELDS, row(1, "widened", "1", 2.1))
    selection_real.main(["report", str(old), str(new)])
    text = capsys.readouterr().out
    # d = 2: one of two appended columns kept on split 0; RMSE (1.2 + 2.1) / (1.0 + 2.0)
    assert "| yacht (278, 2) | 2 | 50% | 0 / 1 | none · 0 | none · 0 | 1.100 | 1.500 → 1.650 | 0.90 | 1.0 |" in text
    assert "zeroed on every dataset — 0/1; RMSE within 3% of the original columns' — 0/1." in text


def test_the_rffnet_report_re_renders_the_committed_table_elsewhere(tmp_path):
    out = tmp_path / "selection_rffnet.md"
    subprocess.run([sys.executable, str(ROOT / "experiments/selection_rffnet.py"), "--report", "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_text() == (ROOT / "experiments/results/selection_rffnet.md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("sklearn_extra") is not None, reason="the reference would be measured")
def test_the_feature_benchmark_without_scikit_learn_extra_says_its_reference_was_not_measured(tmp_path):
    # it printed a hard-coded 17.7 s "measured earlier" as the reference, and at n ≠ 36000 nothing
    out = tmp_path / "features.md"
    subprocess.run([sys.executable, str(ROOT / "experiments/bench_features.py"), "--n", "16", "--repeats", "1",
                    "--out", str(out)], check=True, capture_output=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    notes = [line for line in out.read_text().splitlines() if "scikit-learn-extra" in line]
    assert len(notes) == 1 and notes[0].startswith("scikit-learn-extra Fastfood reference not measured: ")
    assert "--sklearn-extra-python was not given" in notes[0]


def test_the_feature_benchmark_takes_a_scikit_learn_extra_that_fails_to_import_as_not_measured(tmp_path, monkeypatch):
    # scikit-learn-extra 0.3.0 installed beside numpy 2 raises ValueError on import, which ended the run
    # after the table's minutes without writing it
    import bench_features

    package = tmp_path / "sklearn_extra"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernel_approximation.py").write_text(
        "raise ValueError('numpy.dtype size changed, may indicate binary incompatibility.')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        reference, why = bench_features.sklearn_extra_reference(16, 1, None)
    finally:  # the stub package itself imported: do not leave it to the other tests
        sys.modules.pop("sklearn_extra", None)
    assert reference is None and "numpy.dtype size changed" in why and "--sklearn-extra-python was not given" in why


@pytest.mark.parametrize("python, message", [
    ("/nonexistent/python", "--sklearn-extra-python /nonexistent/python: No such file or directory"),
    (sys.executable, f"--sklearn-extra-python {sys.executable} cannot import scikit-learn-extra: "),
])
def test_the_feature_benchmark_refuses_an_interpreter_that_cannot_measure_its_reference(python, message, tmp_path,
                                                                                         capsys):
    if python == sys.executable and importlib.util.find_spec("sklearn_extra") is not None:
        pytest.skip("sklearn_extra imports here")
    import bench_features

    out = tmp_path / "features.md"
    status, err = refusal(bench_features.main, ["--sklearn-extra-python", python, "--out", str(out)], capsys)
    assert status == 2 and message in err and not out.exists()


@pytest.mark.skipif(not os.environ.get("ALACARTE_SKLEARN_EXTRA_PYTHON"),
                    reason="set ALACARTE_SKLEARN_EXTRA_PYTHON to an interpreter with scikit-learn-extra")
def test_the_feature_benchmark_measures_scikit_learn_extra_in_another_interpreter():
    import bench_features

    reference, where = bench_features.sklearn_extra_reference(64, 1, os.environ["ALACARTE_SKLEARN_EXTRA_PYTHON"])
    assert reference is not None, where
    assert reference["width"] == 2 * bench_features.REFERENCE_M and reference["seconds"] > 0  # [cos, sin] of M


def test_the_streaming_benchmark_reports_the_load_it_measured_instead_of_a_fixed_one(tmp_path):
    # its Machine line said "load average 4–20 on 2 cores" whatever the load of the run
    script = str(ROOT / "experiments/bench_streaming.py")
    worker = subprocess.run([sys.executable, script, "--worker", "streamed", "--n", "200", "--data", str(tmp_path)],
                            check=True, capture_output=True, text=True, timeout=300)
    row = json.loads(worker.stdout.splitlines()[-1][len("RESULT "):])
    assert len(row["load"]) == 2 and min(row["load"]) >= 0  # 1-minute load average, start and end
    raw, out = tmp_path / "raw.jsonl", tmp_path / "streaming.md"
    raw.write_text(json.dumps(row) + "\n")
    subprocess.run([sys.executable, script, "--render-only", "--raw", str(raw), "--out", str(out), "--n", "200",
                    "--scaling-ns", "200", "--scaling-samples", "1024"], check=True, capture_output=True, timeout=120)
    text = out.read_text()
    assert "4–20" not in text
    streamed = next(line for line in text.splitlines() if line.startswith("| streamed | 200 |"))
    assert streamed.endswith(f"| {row['load'][0]:.1f} → {row['load'][1]:.1f} |")


def test_the_checkpoint_benchmark_reports_the_load_it_measured_instead_of_a_fixed_claim(tmp_path):
    # its header said "on a shared 2-core machine vary by as much as 20%", measured by no run; the fits and
    # the data are stubbed (in a subprocess: main sets torch's default dtype and threads)
    out = tmp_path / "checkpoint.md"
    code = ("import sys, types, numpy as np\n"
            f"sys.path.insert(0, {str(ROOT / 'experiments')!r})\n"
            "import bench_checkpoint as b\n"
            "data = types.SimpleNamespace(x_train=np.zeros((10, 2)), y_train=np.zeros(10))\n"
            "b.load_uci = lambda *args: data\n"
            "b.timed_fit = lambda *args: (1.0, 0.5, 0, 0.0, 0)\n"
            "b.fingerprint_seconds = lambda *args: 0.0\n"
            "b.os.getloadavg = iter([(0.3, 0, 0), (3.5, 0, 0)]).__next__\n"
            f"sys.argv = ['bench_checkpoint.py', '--out', {str(out)!r}]\n"
            "b.main()\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    text = out.read_text()
    assert "20%" not in text and "shared 2-core" not in text
    assert f"1-minute load average: 0.3 at the start of the run, 3.5 at its end ({os.cpu_count()} cores)." in text


def test_calibration_truth_resumes_at_the_draws_the_estimators_default_resolves_to(tmp_path, monkeypatch):
    import calibration_truth

    path = tmp_path / "truth.csv"
    rows = [dict(kernel="fsard", n=500, seed=1, num_draws=5), dict(kernel="fsard", n=5000, seed=1, num_draws=1)]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, calibration_truth.FIELDS)
        writer.writeheader()
        writer.writerows(rows)

    def refit(*args):
        raise AssertionError(f"refitted a cell the file holds: {args[1:]}")

    monkeypatch.setattr(calibration_truth, "measure", refit)
    calibration_truth.run(path, ["fsard"], [500, 5000], [1])  # "auto": 5 draws at n = 500, 1 at 5 000
    with pytest.raises(AssertionError, match="refitted"):
        calibration_truth.run(path, ["fsard"], [500], [1], num_draws=1)


def test_mixture_rules_rows_are_what_the_estimator_predicts(tmp_path, monkeypatch):
    """The saved cell's shipped rule, written as a calibration row, scores the estimator's own
    prediction; the leave-one-out predictive it saves is every draw's, over every training row."""
    import mixture_rules
    import numpy as np
    import torch
    from alacarte import AlaCarteRegressor
    from alacarte.bench.scores import predictive_scores

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (80, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(80)
    data = argparse.Namespace(x_train=x[:60], y_train=y[:60], x_test=x[60:], y_test=y[60:])
    monkeypatch.setattr(mixture_rules.ac, "load_uci", lambda *a, **k: data)
    out, table = tmp_path / "cells", tmp_path / "rows.csv"
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    try:  # the script sets both for its process
        mixture_rules.main(["run", str(out), "--datasets", "toy", "--methods", "gm", "--splits", "1",
                            "--num-features", "32"])
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
    cell = np.load(out / "toy-gm-1.npz")
    assert cell["loo_mean"].shape == (5, 60) and cell["held"].sum(1).tolist() == [12] * 5
    mixture_rules.main(["rows", str(out), "--csv", str(table), "--num-features", "32", "--version", "test"])
    (row,) = read_rows(table)
    reg = AlaCarteRegressor("gm", num_samples=16, random_state=1).fit(x[:60], y[:60])
    assert len(reg.models_) == 5
    mean, std = reg.predict(x[60:], return_std=True)
    expected = predictive_scores(torch.as_tensor(mean), torch.as_tensor(std**2), torch.as_tensor(y[60:]))
    for name in ("rmse", "nlpd", "coverage95"):
        assert float(row[name]) == pytest.approx(expected[name], rel=1e-9), name


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "experiments").glob("[!_]*.py")))
def test_an_experiment_imports_the_library_of_its_own_checkout(script):
    """Run from a snapshot (git worktree, archive), a script must import the snapshot's alacarte, not the
    editable install of the checkout being edited: its checkout's root goes on sys.path before the first
    import that reaches alacarte (directly or through the experiments' row helpers)."""
    import ast

    reaches = {"alacarte", "_csv_rows", "_draws", "_jsonl_rows"}
    root_first = False
    for node in ast.parse((ROOT / "experiments" / script).read_text()).body:
        text = ast.unparse(node)
        if "sys.path" in text and re.search(r"parents\[1\]\)?\)(?!\s*/)|'\.\.'|\bROOT\b(?!\s*/)", text):
            root_first = True
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(name.split(".")[0] in reaches for name in names):
            assert root_first, f"{script} imports {names} before putting its checkout's root on sys.path"
            return


def test_stored_gm_component_fits_are_chosen_by_the_estimators_rule():
    """gm_components re-scores stored Q = 1 / Q = 4 fits: its choice is choose_components' on the same held-out
    scores, ties to the first candidate included."""
    import gm_components
    from alacarte.regressor import choose_components
    from alacarte.training import FitHistory

    for scores in ({1: 0.30, 4: 0.25}, {1: 0.20, 4: 0.25}, {1: 0.25, 4: 0.25}):
        rows = {q: {"held_out": s, "nlpd": 10.0 * q} for q, s in scores.items()}
        histories = {q: [FitHistory(validation_loss=[s + 1.0, s])] for q, s in scores.items()}
        assert gm_components.estimators_choice(rows, (1, 4)) == rows[choose_components(histories)[0]]


def test_repeated_inputs_counts_repeats_and_their_targets():
    """Four training rows at two repeated inputs (one pair agreeing, one not), one unique row; three test rows,
    two of them at repeated inputs, one with a training target at its input."""
    import numpy as np
    from repeated_inputs import repeats

    x_train = np.array([[0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0], [5.0, 5.0]])
    y_train = np.array([1.0, 1.0, 0.0, 2.0, 7.0])
    x_test = np.array([[0.0, 1.0], [2.0, 3.0], [9.0, 9.0]])
    shares = repeats(x_train, y_train, x_test, np.array([1.0, 5.0, 0.0]))
    within = ((0.0 + 0.0) + (1.0 + 1.0)) / 2 / y_train.var()  # squared deviations from each input's mean, 2 dof
    assert shares == pytest.approx({"train_repeated": 0.8, "test_repeating": 2 / 3, "same_target": 0.5,
                                    "within": within})
    unique = repeats(x_train[2:], np.array([0.0, 0.0, 1.0]), x_test[2:], np.array([0.0]))
    assert unique["within"] == 0  # the repeated pair agrees
    assert unique["test_repeating"] == 0 and np.isnan(unique["same_target"])


def test_the_replicate_noise_probe_pins_repeated_test_rows_to_their_group_mean():
    """Distinct inputs with their mean targets and counts, σ² the pooled within-group variance (floored); a test
    row at a training input gets ȳ_g and σ²(1 + 1/m_g), any other the fit's mean and variance plus σ²."""
    import numpy as np
    from replicate_noise import FLOOR, distinct_inputs, replicate_predictive

    x = np.array([[0.0, 1.0], [2.0, 3.0], [0.0, 1.0], [0.0, 1.0], [5.0, 5.0]])
    y = np.array([1.0, 4.0, 2.0, 3.0, 7.0])
    index, x_g, y_g, m, sigma2 = distinct_inputs(x, y)
    assert x_g.tolist() == [[0.0, 1.0], [2.0, 3.0], [5.0, 5.0]] and y_g.tolist() == [2.0, 4.0, 7.0]
    assert m.tolist() == [3, 1, 1] and sigma2 == pytest.approx(2.0 / 2)  # (1 + 0 + 1) over 2 dof
    assert distinct_inputs(x[:2], y[:2])[4] == pytest.approx(FLOOR * y[:2].var())  # no repeats: the floor
    x_test = np.array([[5.0, 5.0], [9.0, 9.0], [0.0, 1.0]])
    mean, var, repeat = replicate_predictive([0.5, 0.6, 0.7], [0.1, 0.2, 0.3], x_test, index, y_g, m, sigma2)
    assert repeat.tolist() == [True, False, True]
    assert mean.tolist() == [7.0, 0.6, 2.0]
    assert var == pytest.approx([sigma2 * 2, 0.2 + sigma2, sigma2 * (1 + 1 / 3)])


def test_the_selection_benchmark_scores_what_the_estimator_with_select_predicts(monkeypatch):
    import numpy as np

    import alacarte as ac

    monkeypatch.setattr(selection_benchmark, "ESTIMATOR_SAMPLES", 8)
    (train, val, test), _, seed = selection_benchmark.split("se1", 60, 0)
    mean, selected, relevance, variance = selection_benchmark.run_method("gp-simplex-estimator", train, val, test, seed)
    d = train[0].shape[1]
    reg = ac.AlaCarteRegressor(ac.FSARDKernel(d, 8, ard_num_dims=d, simplex=True, seed=seed), select=True,
                               random_state=seed).fit(*train)
    expected_mean, expected_std = reg.predict(test[0], return_std=True)
    np.testing.assert_array_equal(mean, expected_mean)
    np.testing.assert_array_equal(variance, expected_std ** 2)
    np.testing.assert_array_equal(selected, reg.selected_)
    np.testing.assert_array_equal(relevance, reg.relevance_)


def test_the_line_search_without_extrapolation_takes_the_first_step_with_sufficient_decrease():
    import evaluations_per_iteration

    def along(x, t, d):  # f(x) = x² on the line x + t·d
        point = x + t * d
        return float(point @ point), 2 * point

    x, d = torch.tensor([1.0]), torch.tensor([-4.0])  # t = 1 overshoots to −3 (f = 9 > 1)
    gtd = float(2 * x @ d)
    f_new, g_new, t, evaluations = evaluations_per_iteration.first_sufficient_decrease(along, x, 1.0, d, 1.0, 2 * x, gtd)
    # The quadratic through f(0), f'(0) and f(1) is f itself: its minimiser t = 1/4 lands on x = 0.
    assert (t, evaluations, f_new) == (0.25, 2, 0.0)
    # At t = 0.01 the slope is still 0.96 of f'(0): strong Wolfe (c2 = 0.9) would extrapolate; this search stops.
    f_new, _, t, evaluations = evaluations_per_iteration.first_sufficient_decrease(along, x, 0.01, d, 1.0, 2 * x, gtd)
    assert (t, evaluations) == (0.01, 1) and f_new < 1.0


def test_far_from_data_shell_points_lie_at_their_distance_outside_the_box():
    """Each shell point's sup-norm distance from the training box, measured by clipping it into the box,
    is the shell's, and the shells' true posterior variance rises towards the prior's."""
    import numpy as np

    import far_from_data

    rng = np.random.default_rng(0)
    for distance in far_from_data.SHELLS:
        z = far_from_data.shell_points(rng, 200, distance, 2.0, 3)
        assert np.allclose(np.abs(z - np.clip(z, -2.0, 2.0)).max(1), distance)
    truth = far_from_data._truth_module()
    x, y, x_test, _ = far_from_data.draw(truth, 200, 1, np.array([0.5, 0.5, 0.5]))
    assert np.abs(x).max() <= 2.0 and len(x_test) == far_from_data.PER_SHELL * (1 + len(far_from_data.SHELLS))
    _, variance = truth.true_posterior(x, y, x_test, np.array([0.5, 0.5, 0.5]))
    medians = [np.median(variance[k * far_from_data.PER_SHELL:(k + 1) * far_from_data.PER_SHELL])
               for k in range(1 + len(far_from_data.SHELLS))]
    assert medians == sorted(medians) and medians[-1] == pytest.approx(truth.SIGNAL + truth.NOISE, rel=1e-3)
