"""The command line end to end in a temporary directory: fit → predict → plot, and bad CSV files."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from alacarte.cli import main
from alacarte.io import load_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SMALL = ["--num-samples", "16", "--num-components", "2", "--max-iter", "5", "--restarts", "1",
         "--restart-iter", "2", "-q"]


def write_csv(path, names, rows):
    with open(path, "w") as fh:
        fh.write(",".join(names) + "\n")
        for row in rows:
            fh.write(",".join(str(v) for v in row) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A model fitted through the CLI on a small CSV: (directory, model path, new inputs, fit JSON)."""
    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(60, 3))
    y = np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] + 0.05 * rng.normal(size=60)
    data = write_csv(tmp / "data.csv", ["a", "b", "c", "y"], np.column_stack([x, y]))
    model = str(tmp / "model.alacarte")
    capture = _Capture()
    with capture:
        assert main(["fit", data, "--target", "y", "--kernel", "gm", "--out", model, "--json", *SMALL]) == 0
    x_new = rng.uniform(-2, 2, size=(9, 3))
    # columns in another order, plus an ignored one: matched by name
    new = write_csv(tmp / "new.csv", ["c", "extra", "a", "b"], np.column_stack([x_new[:, 2], x_new[:, 0],
                                                                                 x_new[:, 0], x_new[:, 1]]))
    return tmp, model, new, x_new, json.loads(capture.out)


class _Capture:
    """Capture stdout in a module-scoped fixture (capsys is function-scoped)."""

    def __enter__(self):
        import io

        self._old, sys.stdout = sys.stdout, io.StringIO()

    def __exit__(self, *exc):
        self.out, sys.stdout = sys.stdout.getvalue(), self._old


def test_fit_writes_a_model_and_reports_json(fitted):
    _, model, _, _, report = fitted
    assert report["model"] == model and report["rows"] == 60 and report["inputs"] == ["a", "b", "c"]
    assert report["train_rmse"] < 0.5 and np.isfinite(report["log_marginal_likelihood"])
    assert set(report["relevance"]) == {"a", "b", "c"} and abs(sum(report["relevance"].values()) - 1) < 1e-9
    assert load_model(model).n_features_in_ == 3


def test_predict_prints_mean_and_std_columns_exactly(fitted, capsys):
    _, model, new, x_new, _ = fitted
    assert main(["predict", model, new, "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mean,std" and len(lines) == 10
    values = np.array([[float(v) for v in line.split(",")] for line in lines[1:]])
    mean, std = load_model(model).predict(x_new, return_std=True)
    assert np.array_equal(values[:, 0], mean) and np.array_equal(values[:, 1], std)  # 17 digits round-trip
    assert main(["predict", model, new, "--json", "--latent", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    _, latent = load_model(model).predict(x_new, return_std=True, include_noise=False)
    assert report["mean"] == mean.tolist() and report["std"] == latent.tolist() and report["std_of"] == "f"


def test_predict_to_a_file_in_a_fresh_process_is_bit_identical(fitted):
    tmp, model, new, x_new, _ = fitted
    out = tmp / "pred.csv"
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "alacarte.cli", "predict", model, new, "--out", str(out), "-q"],
                          capture_output=True, text=True, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    values = np.loadtxt(out, delimiter=",", skiprows=1)
    mean, std = load_model(model).predict(x_new, return_std=True)
    assert np.array_equal(values[:, 0], mean) and np.array_equal(values[:, 1], std)


def test_plot_writes_a_png(fitted, capsys):
    tmp, model, _, _, _ = fitted
    pytest.importorskip("matplotlib")
    assert main(["plot", model, "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out) == {"figure": str(tmp / "model.png")}
    data = (tmp / "model.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@pytest.mark.parametrize("content, message", [
    ("a,b,y\n1,2,3\n4,5,6\n", r"has no target column 'target' \(columns: a, b, y\)"),
    ("a,b,target\n1,2,3\n4,abc,6\n", r"line 3, column 'b': 'abc' is not a number"),
    ("a,b,target\n1,2,3\n4,nan,6\n", r"line 3, column 'b': nan is not allowed"),
    ("a,b,target\n1,2,3\n4,inf,6\n", r"line 3, column 'b': inf is not allowed"),
    # not '1e400 is not allowed (every value must be finite)': it is finite, float64 cannot hold it
    ("a,b,target\n1,2,3\n4,-1e400,6\n", r"line 3, column 'b': -1e400 is beyond the range of float64"),
    ("a,b,target\n1,,3\n", r"line 2, column 'b': empty cell"),
    ("a,b,target\n1,2,3\n4,5\n", r"line 3: 2 fields, but the header has 3"),
    ("", r"is empty"),
    ("a,b,target\n", r"has a header but no data rows"),
    ("a,a,target\n1,2,3\n", r"column names must be unique"),
    ("target\n1\n2\n", r"no input columns besides the target"),
    # '#' is no comment marker: a row that starts with it, or a cell that holds it, is an error, not dropped
    ("a,b,target\n1,2,3\n#4,5,6\n", r"line 3, column 'a': '#4' is not a number"),
    ("a,b,target\n1,2,3\n4,5,6 # note\n", r"line 3, column 'target': '6 # note' is not a number"),
    ("a,b,target\n1,2,3\n   \n4,5,6\n", r"line 3: 1 fields, but the header has 3"),
    ("a,b,target\n1_000,2,3\n", r"line 2, column 'a': '1_000' is not a number"),
])
def test_bad_csv_files_fail_with_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    code = main(["fit", str(path), "--target", "target", *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("alacarte: error: ") and err.count("\n") == 1, err
    assert __import__("re").search(message, err), err


@pytest.mark.parametrize("kernel, message", [
    ("exact-rbf", "exact GP (exact-rbf): it has no learned spectrum to draw (`alacarte fit --json` reports"),
    # not 'no spectrum picture for RandomFourierKernel' alone, naming neither the file, its kernel nor what plot draws
    ("rks", "model.alacarte (rks): no spectrum picture for RandomFourierKernel: pictures exist for GM, PWL and"),
])
def test_plot_of_a_model_without_a_spectrum_picture_is_a_clear_error(kernel, message, tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", ["a", "y"], [[0, 1], [1, 2], [2, 1.5], [3, 0.5]])
    model = str(tmp_path / "model.alacarte")
    assert main(["fit", data, "--target", "y", "--kernel", kernel, "--out", model, *SMALL]) == 0
    capsys.readouterr()
    assert main(["plot", model]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_predict_reads_only_the_models_columns(fitted, tmp_path, capsys):
    """Other columns are ignored, whatever they hold (an id or a name column must not stop predict)."""
    _, model, new, _, _ = fitted
    assert main(["predict", model, new, "-q"]) == 0
    expected = capsys.readouterr().out
    names, *rows = [line.split(",") for line in open(new).read().splitlines()]
    with_text = tmp_path / "with_text.csv"
    with_text.write_text("\n".join(",".join(["name", *names]) if i == 0 else ",".join([f"row {i}", *row])
                                    for i, row in enumerate([names, *rows])) + "\n")
    assert main(["predict", model, str(with_text), "-q"]) == 0
    assert capsys.readouterr().out == expected
    rows[1][2] = "oops"  # column a of line 3
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(",".join(row) for row in [names, *rows]) + "\n")
    assert main(["predict", model, str(bad), "-q"]) == 2
    assert "line 3, column 'a': 'oops' is not a number" in capsys.readouterr().err
    rows[1][2] = rows[1][2].replace("oops", "1") + ",7"  # a field too many, past the columns used
    bad.write_text("\n".join(",".join(row) for row in [names, *rows]) + "\n")
    assert main(["predict", model, str(bad), "-q"]) == 2
    assert "line 3: 5 fields, but the header has 4" in capsys.readouterr().err


def test_predict_ignores_an_unnamed_column_it_does_not_read(fitted, tmp_path, capsys):
    """pandas' DataFrame.to_csv writes its index under an empty name: predict refused the file
    ('column names must be unique and non-empty') though it reads only the model's columns."""
    _, model, new, _, _ = fitted
    assert main(["predict", model, new, "-q"]) == 0
    expected = capsys.readouterr().out
    names, *rows = [line.split(",") for line in open(new).read().splitlines()]
    for first, message in (("", None), ("a", "column names must be unique")):  # a second 'a' is ambiguous
        path = tmp_path / "with_index.csv"
        path.write_text("\n".join(",".join([first if i == 0 else str(i - 1), *row])
                                   for i, row in enumerate([names, *rows])) + "\n")
        if message is None:
            assert main(["predict", model, str(path), "-q"]) == 0
            assert capsys.readouterr().out == expected
        else:
            assert main(["predict", model, str(path), "-q"]) == 2
            assert message in capsys.readouterr().err


def test_fit_refuses_a_row_with_a_field_too_many(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", ["a", "y"], [[0, 1], [1, 2], [2, 1.5], [3, 0.5]])
    with open(data, "a") as fh:
        fh.write("7,4,1\n")
    assert main(["fit", data, "--target", "y", *SMALL]) == 2
    assert "line 6: 3 fields, but the header has 2" in capsys.readouterr().err


def test_a_regressor_saved_from_python_with_its_columns_predicts(fitted, tmp_path, capsys):
    from alacarte import AlaCarteRegressor
    from alacarte.io import save_model

    _, _, new, x_new, _ = fitted
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, size=(40, 3))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=40)
    reg = AlaCarteRegressor("fsard", num_samples=8, max_iter=2, restarts=0, progress=False).fit(x, y)
    save_model(reg, tmp_path / "bare.alacarte")
    assert main(["predict", str(tmp_path / "bare.alacarte"), new]) == 2
    assert "metadata={'columns'" in capsys.readouterr().err
    save_model(reg, tmp_path / "abc.alacarte", metadata={"columns": "abc"})
    assert main(["predict", str(tmp_path / "abc.alacarte"), new]) == 2
    assert "must be a list of the model's 3 input names, got 'abc'" in capsys.readouterr().err
    save_model(reg, tmp_path / "named.alacarte", metadata={"columns": ["a", "b", "c"]})
    assert main(["predict", str(tmp_path / "named.alacarte"), new, "--json", "-q"]) == 0
    assert np.allclose(json.loads(capsys.readouterr().out)["mean"], reg.predict(x_new), rtol=1e-12, atol=1e-12)


def test_demo_names_a_bad_seed(capsys):
    assert main(["demo", "--seed", "-1", "-q"]) == 2
    assert "--seed must be None or an integer in [0, 2**64), got -1" in capsys.readouterr().err


def test_bad_model_and_missing_columns_fail_with_one_line(fitted, tmp_path, capsys):
    _, model, _, _, _ = fitted
    no_b = write_csv(tmp_path / "no_b.csv", ["a", "c"], [[1, 2]])
    assert main(["predict", model, no_b]) == 2
    assert "lacks the input column(s) 'b'" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing.alacarte"), no_b]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["plot", no_b]) == 2
    err = capsys.readouterr().err
    assert "not an alacarte model file" in err and err.count("\n") == 1


def test_fit_reports_the_training_rmse_of_targets_in_any_units(tmp_path, capsys):
    """Squares of targets in units of 1e300 overflowed: training RMSE inf, and 'Infinity' (not JSON)
    in --json; in units of 1e-300 they underflowed to an RMSE of 0."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, size=(30, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=30)
    rmse = {}
    for unit in (1.0, 1e300, 1e-300):
        data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.column_stack([x, y * unit]))
        assert main(["fit", data, "--target", "y", "--kernel", "fsard", "--json", *SMALL]) == 0
        rmse[unit] = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)["train_rmse"] / unit
    assert 0 < rmse[1.0] < 1
    assert rmse[1e300] == pytest.approx(rmse[1.0], rel=1e-6) and rmse[1e-300] == pytest.approx(rmse[1.0], rel=1e-6)


def test_predict_refuses_a_row_whose_prediction_overflows(fitted, tmp_path, capsys):
    """A finite 1.7e308 overflows ω·x: an error, not a prediction written as 'nan,nan' with exit status 0."""
    _, model, _, _, _ = fitted
    far = write_csv(tmp_path / "far.csv", ["a", "b", "c"], [[0.5, 0.5, 0.5], [1.7e308, 0, 0]])
    assert main(["predict", model, far, "-q"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "x rows [1] (first 5 shown) give NaN predictions" in captured.err


def test_num_draws_fits_and_saves_every_draw(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, size=(40, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=40)
    data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.column_stack([x, y]))
    assert main(["fit", data, "--target", "y", "--kernel", "fsard", "--num-draws", "2", *SMALL]) == 0
    reg = load_model(tmp_path / "d.alacarte")
    assert reg.num_draws == 2 and len(reg.models_) == 2
    assert main(["predict", str(tmp_path / "d.alacarte"), data, "-q"]) == 0
    pytest.importorskip("matplotlib")
    drawn = {}

    def save(kernel, path, **options):  # what the picture is given: both draws' relevances
        drawn.update(options)
        return path

    monkeypatch.setattr("alacarte.plotting.save_kernel_figure", save)
    assert main(["plot", str(tmp_path / "d.alacarte"), "-q"]) == 0
    assert np.array_equal(drawn["draws"], reg.relevance_draws_) and drawn["draws"].shape == (2, 2)
    assert main(["fit", data, "--target", "y", "--kernel", "fsard", *SMALL]) == 0  # 40 rows, D = 32: auto is 5
    reg = load_model(tmp_path / "d.alacarte")
    assert reg.num_draws == "auto" and len(reg.models_) == 5


def test_select_reports_and_saves_what_the_estimator_selects(tmp_path, capsys):
    """--select: the estimator with select=True on the named kernel; the JSON names the kept columns and
    each column's share of the draws that kept it, and the model file reloads with them."""
    from alacarte import AlaCarteRegressor

    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, size=(60, 3))
    y = np.sin(2 * x[:, 1]) + 0.05 * rng.normal(size=60)
    data = write_csv(tmp_path / "d.csv", ["a", "b", "c", "y"], np.column_stack([x, y]))
    assert main(["fit", data, "--target", "y", "--kernel", "fsard", "--select", "--num-draws", "2", *SMALL,
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    reg = AlaCarteRegressor("fsard", select=True, num_draws=2, num_samples=16, max_iter=5, restarts=1,
                            restart_iter=2).fit(x, y)
    assert result["selected"] == [["a", "b", "c"][j] for j in reg.selected_] and "b" in result["selected"]
    assert result["selection_frequency"] == dict(zip("abc", reg.selection_frequency_.tolist()))
    saved = load_model(tmp_path / "d.alacarte")
    assert saved.select and np.array_equal(saved.selected_, reg.selected_)
    assert np.array_equal(saved.predict(x), reg.predict(x))


def test_pilot_rows_fit_the_estimator_with_a_pilot(tmp_path, capsys):
    """--pilot-rows N is the estimator's pilot_rows=N: the saved model predicts as the estimator does, and
    the summary says so; ``all`` is pilot_rows=None."""
    from alacarte import AlaCarteRegressor

    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, size=(80, 2))
    y = np.sin(2 * x[:, 0]) + 0.05 * rng.normal(size=80)
    data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.column_stack([x, y]))
    assert main(["fit", data, "--target", "y", "--pilot-rows", "30", "--num-draws", "1", *SMALL]) == 0
    reg = AlaCarteRegressor(pilot_rows=30, num_draws=1, num_samples=16, num_components=2, max_iter=5, restarts=1,
                            restart_iter=2).fit(x, y)
    saved = load_model(tmp_path / "d.alacarte")
    assert saved.pilot_rows == 30 and np.array_equal(saved.predict(x), reg.predict(x))
    assert saved.pilot_rows_ == 30 and "pilot of 30 rows" in capsys.readouterr().out
    assert main(["fit", data, "--target", "y", "--pilot-rows", "all", "--num-draws", "1", *SMALL]) == 0
    saved = load_model(tmp_path / "d.alacarte")
    assert saved.pilot_rows is None and saved.pilot_rows_ is None and "pilot of" not in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [(["--pilot-rows", "0"], "--pilot-rows"),
                                            (["--kernel", "fsard", "--select", "--pilot-rows", "30"], "selecting inputs"),
                                            (["--kernel", "fsard", "--pilot-rows", "30"], "per frequency"),
                                            (["--num-samples", "0"], "--num-samples")])
def test_bad_pilot_rows_are_refused_before_the_data_are_read(tmp_path, capsys, flags, message):
    assert main(["fit", str(tmp_path / "missing.csv"), "--target", "y", *flags, "-q"]) == 2
    assert message in capsys.readouterr().err


def test_select_with_a_kernel_without_ard_lengthscales_is_refused_before_the_fit(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", ["a", "y"], [[0, 1], [1, 2], [2, 1.5], [3, 0.5]])
    assert main(["fit", data, "--target", "y", "--kernel", "gm", "--select", "-q"]) == 2
    assert "--select needs an ARD kernel to put on the simplex" in capsys.readouterr().err
    assert not (tmp_path / "d.alacarte").exists()


def test_num_components_auto_fits_both_and_saves_the_choice(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, size=(2000, 2))  # 400 rows held out: auto chooses
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=2000)
    data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.column_stack([x, y]))
    assert main(["fit", data, "--target", "y", "--kernel", "gm", *SMALL, "--num-components", "auto",
                 "--num-draws", "1"]) == 0
    reg = load_model(tmp_path / "d.alacarte")
    assert reg.num_components == "auto" and set(reg.component_scores_) == {1, 4}
    assert reg.num_components_ == min(reg.component_scores_, key=reg.component_scores_.get)


@pytest.mark.parametrize("flag, value, message", [
    ("--num-samples", "0", "--num-samples must be a positive integer, got 0"),
    ("--num-components", "-1", "--num-components must be a positive integer, got -1"),
    ("--num-draws", "0", "--num-draws must be a positive integer, got 0"),
    ("--max-iter", "0", "--max-iter must be a positive integer, got 0"),
    ("--restarts", "-1", "--restarts must be a non-negative integer, got -1"),
    ("--restart-iter", "0", "--restart-iter must be a positive integer, got 0"),
    ("--seed", "-1", "--seed must be None or an integer in [0, 2**64), got -1"),
])
def test_fit_names_a_bad_setting_by_its_flag(flag, value, message, tmp_path, capsys):
    """The estimator's messages named its parameters (num_samples, random_state), not the flags."""
    data = write_csv(tmp_path / "d.csv", ["a", "y"], [[0, 1], [1, 2], [2, 1.5], [3, 0.5]])
    assert main(["fit", data, "--target", "y", flag, value, "-q"]) == 2
    assert f"alacarte: error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "d.alacarte").exists()


@pytest.mark.parametrize("flag", ["--n", "--n-test"])
def test_demo_refuses_sizes_that_are_not_positive(flag, capsys):
    assert main(["demo", flag, "-5", "-q"]) == 2
    assert f"{flag} must be a positive integer, got -5" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_with_one_line(fitted, monkeypatch, capsys):
    _, model, _, _, _ = fitted
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    assert main(["plot", model, "-q"]) == 2
    err = capsys.readouterr().err
    assert err == "alacarte: error: pictures need matplotlib: pip install 'alacarte[plot]'\n"


def test_python_dash_m_runs_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "alacarte", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: alacarte")


def test_every_option_is_documented_in_docs_command_line():
    """docs/command_line.md named neither the demo command nor its --n / --n-test, nor bench's
    --data, --time-budget, --limit, --paper and --command."""
    import argparse

    from alacarte.cli import build_parser

    def options(parser):  # each option as its spellings, e.g. ("-q", "--quiet")
        for action in parser._actions:
            if action.option_strings and "--help" not in action.option_strings:
                yield tuple(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from options(sub)

    with open(os.path.join(ROOT, "docs", "command_line.md")) as f:
        text = f.read()
    assert "alacarte demo" in text
    undocumented = {spellings for spellings in options(build_parser())
                    if not any(f"`{o}`" in text or f"{o} " in text for o in spellings)}
    assert not sorted(undocumented)


@pytest.mark.parametrize("out", ["missing/m.alacarte", ".", "read-only/m.alacarte"])
def test_fit_refuses_an_unwritable_out_before_it_fits(out, tmp_path, capsys, monkeypatch):
    """--out in a missing directory (or naming a directory, or in one the user may not write to) is
    refused before the fit: refused by save_model after it, the fit (50 s on 300 rows here) is lost."""
    import tempfile

    from alacarte.regressor import AlaCarteRegressor

    def no_fit(self, x, y):
        raise AssertionError("fitted before checking --out")

    monkeypatch.setattr(AlaCarteRegressor, "fit", no_fit)
    data = write_csv(tmp_path / "data.csv", ["a", "y"], [[1, 2], [2, 3], [3, 5]])
    if out.startswith("read-only"):
        (tmp_path / "read-only").mkdir()
        real_mkstemp = tempfile.mkstemp

        def refuse(*args, dir=None, **kwargs):  # (simulated: the tests may run as root)
            if str(dir).endswith("read-only"):
                raise PermissionError(13, "Permission denied")
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["fit", data, "--target", "y", "--out", str(tmp_path / out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err or "is a directory" in err or "Permission denied" in err


def test_fit_of_a_missing_data_file_names_the_data_not_the_model(tmp_path, capsys):
    """The data are read before --out is checked: else a missing data/x.csv would be reported as
    'cannot write data/x.alacarte' (its default model path)."""
    assert main(["fit", str(tmp_path / "data" / "x.csv"), "--target", "y", "-q"]) == 2
    assert "x.csv: no such file" in capsys.readouterr().err


def test_an_output_that_names_an_input_file_is_refused(fitted, tmp_path, capsys):
    """'fit data.csv --out data.csv' replaced the data with the model file, and 'predict model data
    --out model' the model with the predictions."""
    _, model, new, _, _ = fitted
    data = write_csv(tmp_path / "data.csv", ["a", "y"], [[1, 2], [2, 3], [3, 5]])
    before = open(data, "rb").read()
    assert main(["fit", data, "--target", "y", "--out", data, *SMALL]) == 2
    assert "is the input file" in capsys.readouterr().err and open(data, "rb").read() == before
    saved = open(model, "rb").read()
    for out in (model, new):
        kept = open(out, "rb").read()
        assert main(["predict", model, new, "--out", out, "-q"]) == 2
        assert "is the input file" in capsys.readouterr().err and open(out, "rb").read() == kept
    assert main(["plot", model, "--out", model, "-q"]) == 2
    assert "is the input file" in capsys.readouterr().err and open(model, "rb").read() == saved


@pytest.mark.parametrize("out", ["missing/p.csv", ".", "read-only/p.csv"])
def test_predict_and_plot_refuse_an_unwritable_out_before_the_work(fitted, out, tmp_path, capsys, monkeypatch):
    """'predict --out missing_dir/p.csv' is refused before any prediction is computed, not after."""
    import tempfile

    from alacarte.regressor import AlaCarteRegressor

    _, model, new, _, _ = fitted

    def no_predict(*args, **kwargs):
        raise AssertionError("predicted before checking --out")

    monkeypatch.setattr(AlaCarteRegressor, "predict", no_predict)
    monkeypatch.setattr("alacarte.plotting.save_kernel_figure", no_predict)
    if out.startswith("read-only"):
        (tmp_path / "read-only").mkdir()
        real_mkstemp = tempfile.mkstemp

        def refuse(*args, dir=None, **kwargs):  # (simulated: the tests may run as root)
            if str(dir).endswith("read-only"):
                raise PermissionError(13, "Permission denied")
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    for command in (["predict", model, new], ["plot", model]):
        assert main([*command, "--out", str(tmp_path / out), "-q"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("alacarte: error: ") and err.count("\n") == 1
        assert "does not exist" in err or "is a directory" in err or "Permission denied" in err


def test_an_exact_gp_on_many_rows_says_what_it_costs_before_it_starts(tmp_path, capsys, monkeypatch):
    import alacarte.cli as cli

    monkeypatch.setattr(cli, "EXACT_GP_ROWS", 30)
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(40, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=40)
    data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.column_stack([x, y]))
    assert main(["fit", data, "--target", "y", "--kernel", "exact-ard", "--out", str(tmp_path / "m.alacarte"),
                 *SMALL]) == 0
    err = capsys.readouterr().err
    assert "alacarte: note: an exact GP on 40 rows holds 40×40 matrices (0.0 GB each in float64)" in err
    assert "O(n³) per iteration" in err
    main(["fit", data, "--target", "y", "--kernel", "fsard", "--out", str(tmp_path / "f.alacarte"), *SMALL])
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. "
                                                               "DefaultCPUAllocator: can't allocate memory: you "
                                                               "tried to allocate 1800000000 bytes.\nError code 12")])
def test_running_out_of_memory_is_a_one_line_error(error, fitted, capsys, monkeypatch):
    from alacarte.regressor import AlaCarteRegressor

    def fail(self, x, y):
        raise error

    monkeypatch.setattr(AlaCarteRegressor, "fit", fail)
    tmp, _, _, _, _ = fitted
    assert main(["fit", str(tmp / "data.csv"), "--target", "y", "--out", str(tmp / "oom.alacarte"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alacarte: error: out of memory (") and err.count("\n") == 1
    assert "use fewer rows or features, or a feature kernel" in err


def test_another_runtime_error_keeps_its_traceback(fitted, monkeypatch):
    from alacarte.regressor import AlaCarteRegressor

    def fail(self, x, y):
        raise RuntimeError("a bug")

    monkeypatch.setattr(AlaCarteRegressor, "fit", fail)
    tmp, _, _, _, _ = fitted
    with pytest.raises(RuntimeError, match="a bug"):
        main(["fit", str(tmp / "data.csv"), "--target", "y", "--out", str(tmp / "bug.alacarte"), *SMALL])


def test_fit_takes_its_defaults_from_the_estimator():
    import inspect

    from alacarte import AlaCarteRegressor
    from alacarte.cli import build_parser

    args = build_parser().parse_args(["fit", "data.csv", "--target", "y"])
    estimator = {name: p.default for name, p in inspect.signature(AlaCarteRegressor).parameters.items()}
    flags = {"kernel": "kernel", "num_samples": "num_samples", "num_components": "num_components",
             "max_iter": "max_iter", "restarts": "restarts", "restart_iter": "restart_iter", "seed": "random_state",
             "validation_fraction": "validation_fraction"}
    assert {flag: getattr(args, flag) for flag in flags} == {flag: estimator[name] for flag, name in flags.items()}


def test_the_estimator_and_bench_run_take_their_defaults_from_make_model_and_fit():
    import inspect

    from alacarte import AlaCarteRegressor, fit
    from alacarte.cli import build_parser
    from alacarte.factory import component_candidates, make_model
    from alacarte.training import resolve_samples

    def defaults(function):
        return {name: p.default for name, p in inspect.signature(function).parameters.items()}

    estimator, model, fitting = defaults(AlaCarteRegressor), defaults(make_model), defaults(fit)
    # "auto" is make_model's number wherever no pilot fits the hyperparameters.
    assert estimator["num_samples"] == "auto" and resolve_samples("auto", None) == model["num_samples"]
    # "auto" is make_model's number wherever it does not choose between several (docs/calibration.md).
    assert estimator["num_components"] == "auto"
    assert component_candidates("auto", "gm", model["num_samples"]) == (model["num_components"],)
    shared = ("max_iter", "restarts", "restart_iter", "optimizer", "validation_fraction")
    assert {name: estimator[name] for name in shared} == {name: fitting[name] for name in shared}
    assert estimator["random_state"] == fitting["seed"]
    args = build_parser().parse_args(["bench", "run", "--datasets", "yacht", "--csv", "out.csv"])
    assert (args.max_iter, args.restarts, args.restart_iter) == \
        (fitting["max_iter"], fitting["restarts"], fitting["restart_iter"])
