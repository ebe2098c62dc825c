"""The UCI runner's report: the paper's values beside ours, one column per protocol, its summaries."""
import numpy as np
import pytest

from alacarte.bench import read_rows
from uci_cases import DEFAULT_PAPER, SHARED, ok_row, result_row, run

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")


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


@pytest.mark.parametrize("ours, printed, matched", [(0.474, "0.47 ≤ 0.47", 1), (0.476, "0.48 > 0.47", 0)])
def test_the_paper_is_also_compared_at_the_decimals_it_prints(tmp_path, ours, printed, matched):
    """Wine's best in the paper is ARD's 0.47, some mean in [0.465, 0.475): 0.474 is above 0.47 as a
    number but not distinguishable from it at the paper's precision; 0.476 is worse either way."""
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    result_row(path, "wine", 0, "pwl", ours)
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
            result_row(path, ds, split, "gm", value)
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
        result_row(small, "wine", split, "gm", a)
        result_row(small, "wine", split, "pwl", a + 0.01)
        result_row(large, "wine", split, "gm", b, num_features=4096)
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
        result_row(short, "wine", split, "gm", a, num_features=4096)
        result_row(short, "wine", split, "pwl", a + 0.01)
        result_row(long, "wine", split, "gm", b, num_features=4096, max_iter=300)
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
        result_row(path, "wine", split, "pwl", a)  # an older row: no noise recorded
        result_row(path, "wine", split, "pwl", b, noise=[2e-8, 0.01][split], noise_floor=1e-8)
        result_row(path, "wine", split, "gm", a + 0.1, noise=[1.5e-4, 0.2][split], noise_floor=1e-4)
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
        result_row(path, "wine", split, "gm", a)
        result_row(path, "wine", split, "gm", b, device="cuda: NVIDIA H200", peak_device_mb=812.0)
    assert main(["bench", "report", "--csv", str(path), "--out", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| dataset | n train | gm | gm cuda | GM (paper) |" in text
    assert ("| wine | 1439 | 0.51 ± 0.01 [2]<br><sub>NLPD 0 · 3 s · 300 MB</sub> | **0.46 ± 0.01 [2]**<br><sub>NLPD 0 · 3 s · "
            "300 MB · 812 MB GPU</sub> |") in text
    assert "| wine | 0.46 (gm cuda) | 0.47 (ARD) | 0.98 | 0.46 ≤ 0.47 | -0.4 | — |" in text


def test_exact_gps_keep_one_column_when_they_ran_as_fastfood_on_the_larger_datasets(tmp_path):
    """``exact-ard`` has no features below n = 2000 and D features above (a Fastfood expansion):
    one protocol, so one column, and the goal table still finds our ARD — counted against the
    exact-ARD goal only where it was exact."""
    from alacarte.cli import main

    path = tmp_path / "rows.csv"
    result_row(path, "wine", 0, "exact-ard", 0.519, num_features=0)
    result_row(path, "gas", 0, "exact-ard", 0.13, num_features=1024, model="fastfood-ard")
    result_row(path, "wine", 0, "gm", 0.48)
    result_row(path, "gas", 0, "gm", 0.15)
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


def test_a_timeout_is_shown_only_in_the_column_of_its_settings(tmp_path):
    """Timeouts counted by method alone would put a gm timeout at D=32 as "timeout" in the gm D=64 column
    of a dataset that column never ran."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    append_row(path, ok_row(split=0, num_features=32))
    append_row(path, {**ok_row(split=1, num_features=32), "status": "timeout", "rmse": "", "n_train": ""})
    append_row(path, ok_row(dataset="concrete", num_features=64))
    # (split 2 timed out in one runner and finished in another, with 'auto' components: rows of two keys)
    append_row(path, ok_row(split=2, num_features=32, rmse=0.14))
    append_row(path, {**ok_row(split=2, num_features=32), "status": "timeout", "rmse": "", "n_train": "",
                      "components": ""})
    append_row(path, {**ok_row(dataset="concrete", method="exact-ard", num_features=""), "status": "timeout",
                      "rmse": "", "n_train": "", "components": ""})  # (an exact GP's D is blank: any column's)
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    header = next(line for line in text.splitlines() if line.startswith("| dataset | n train"))
    assert "| exact-ard | gm D=32 | gm D=64 |" in header
    yacht = next(line for line in text.splitlines() if line.startswith("| yacht |")).split(" | ")
    concrete = next(line for line in text.splitlines() if line.startswith("| concrete |")).split(" | ")
    assert yacht[2] == "—" and yacht[4] == "—"  # gm D=64 never ran yacht
    assert yacht[3].startswith("**0.13 ± 0.01 [2]**") and yacht[3].endswith(" · 1 timed out</sub>")
    assert concrete[2] == "timeout" and concrete[3] == "—"


def test_a_timeout_at_settings_no_cell_finished_at_gets_its_own_column(tmp_path):
    """gm finished split 0 at D=32 and timed out on split 1 at D=64: counted under the one gm column (the
    D=32 cells'), the timeout would read '0.12 ± 0 [1] · 1 timed out', as if D=32 had timed out."""
    import argparse

    from alacarte.bench import append_row, report

    path = tmp_path / "rows.csv"
    append_row(path, ok_row(split=0, num_features=32))
    append_row(path, {**ok_row(split=1, num_features=64), "status": "timeout", "rmse": ""})
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
        append_row(path, ok_row(split=split, restarts=0, components=1, rmse=1.0))
        append_row(path, ok_row(split=split, restarts=2, components=4, rmse=2.0))
    append_row(path, {**ok_row(dataset="concrete", method="pwl"), "status": "timeout", "rmse": "", "n_train": "",
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
        append_row(path, ok_row(dataset=dataset, method="fsard"))
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
        append_row(path, ok_row(split=split, method="exact-ard", rmse=0.2 + split * 0.02, nlpd=-0.5))
        append_row(path, ok_row(split=split, method="gm", rmse=0.15, nlpd=-0.3))
        append_row(path, ok_row(split=split, method="pwl", rmse=0.1 + split * 0.02, nlpd=0.7))
        append_row(path, ok_row(split=split, method="fsard", rmse=0.13, restarts=3))
        append_row(path, ok_row(split=split, method="ssgpr", rmse=0.01))  # not an À la carte kernel
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
    append_row(path, ok_row(method="rks"))
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| dataset | n train"))
    widths = {line.count("|") for line in lines[start:start + 5] if line.startswith("|")}
    assert widths == {4}, lines[start:start + 5]


def test_summary_rows_say_over_how_many_datasets_each_method_counts(tmp_path):
    """'Datasets won' and the mean normalised RMSE averaged each method over the datasets it ran, and an
    exact GP runs on the small ones only: in uci_full.md gm's 1.133 (29 datasets) looked better than
    pwl's 1.351 (26), while on the 18 datasets both ran pwl is 1.072 and gm 1.151. Where the methods ran
    on different datasets, each count says of how many, and a row averages over the ones every method ran."""
    import argparse

    from alacarte.bench import report

    path = tmp_path / "rows.csv"
    # yacht: a 1.0, b 2.0 (b normalised 2); wine: b 1.0 only (a did not run it).
    result_row(path, "yacht", 0, "gm", 1.0)
    result_row(path, "yacht", 0, "pwl", 2.0)
    result_row(path, "wine", 0, "pwl", 1.0)
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    assert "| **datasets won** (ours, of the datasets each ran) | | 1 of 1 | 1 of 2 |" in text, text
    assert "over the datasets each ran, in brackets) | | 1.000 (1) | 1.500 (2) |" in text, text
    assert "| **mean normalised RMSE on the 1 dataset every method ran** | | 1.000 | 2.000 |" in text, text
    result_row(path, "wine", 0, "gm", 0.5)  # both ran both: the plain rows
    text = report(argparse.Namespace(csv=[str(path)], paper=DEFAULT_PAPER, out=None, command=None))
    assert "| **datasets won** (ours) | | 2 | 0 |" in text and "every method ran" not in text, text
    assert "| **mean normalised RMSE** (ours, 1 = best of ours) | | 1.000 | 2.000 |" in text, text
