"""``alacarte demo``: its table, its JSON, its picture, and that its numbers are what the models give."""
import json
import sys

import pytest
import torch

from alacarte import fit
from alacarte.bench import predictive_scores
from alacarte.cli import main
from alacarte.demo import FIT_SETTINGS, NOISE, demo_data
from alacarte.factory import make_model

SMALL = ["--n", "300", "--n-test", "80", "--n-exact", "120", "--num-samples", "16", "--max-iter", "5",
         "--seed", "3", "-q"]
COLUMNS = ["model", "rows", "fit s", "RMSE", "RMSE f", "NLPD", "95% cover"]


def _table(out: str) -> dict:
    """The printed table's rows by model name: (rows, fit s, RMSE, RMSE f, NLPD, 95% cover) as strings."""
    lines = out.splitlines()
    header = lines[2]
    assert [header[header.index(c):header.index(c) + len(c)] for c in COLUMNS] == COLUMNS
    rows = {}
    for line in lines[3:7]:
        name, cells = line[:34].rstrip(), line[34:].split()
        assert len(cells) == 6, line
        rows[name] = cells
    return rows


def _refit(kind: str, rows: int, data: dict) -> dict:
    """The demo's model fitted again through the public API, scored on the demo's test rows."""
    model = make_model(kind, 3, num_samples=16, seed=3)
    fit(model, data["x"][:rows], data["y"][:rows], max_iter=5, seed=3, progress=False, **FIT_SETTINGS)
    pred = model.predict(data["x_test"])
    return predictive_scores(pred.mean, pred.observed_variance, data["y_test"])


def test_demo_prints_a_table_of_the_models_numbers(tmp_path, capsys):
    picture = tmp_path / "demo.png"
    assert main(["demo", *SMALL, "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == "300 training rows, 80 test rows, seed 3"
    rows = _table(out)
    assert list(rows) == ["predict the training mean", f"the true f, noise sd {NOISE}", "exact ARD GP",
                          "FSARD feature GP (D = 32)"]
    assert [r[0] for r in rows.values()] == ["300", "—", "120", "300"]
    data = demo_data(300, 80, seed=3)
    for name, kind, n in (("exact ARD GP", "exact-ard", 120), ("FSARD feature GP (D = 32)", "fsard", 300)):
        scores = _refit(kind, n, data)
        printed = rows[name]
        assert [float(printed[2]), float(printed[4]), float(printed[5])] == [
            round(scores["rmse"], 3), round(scores["nlpd"], 3), round(scores["coverage95"], 3)]
    mean = float(data["y"].mean())
    assert float(rows["predict the training mean"][2]) == round(float((data["y_test"] - mean).pow(2).mean().sqrt()), 3)
    assert float(rows[f"the true f, noise sd {NOISE}"][3]) == 0
    assert out.splitlines()[-1] == f"picture: {picture}" and picture.stat().st_size > 0


def test_demo_json_is_deterministic_and_matches_the_table(tmp_path, capsys):
    runs = []
    for _ in range(2):
        assert main(["demo", *SMALL, "--json", "--plot", str(tmp_path / "d.png")]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    for run in runs:
        for row in run["results"]:
            row.pop("fit_seconds")
    assert runs[0] == runs[1]
    result = runs[0]
    assert (result["n_train"], result["n_test"], result["n_exact"], result["seed"]) == (300, 80, 120, 3)
    assert result["figure"] == str(tmp_path / "d.png")
    assert main(["demo", *SMALL, "--plot", str(tmp_path / "d.png")]) == 0
    rows = _table(capsys.readouterr().out)
    for row in result["results"]:
        assert float(rows[row["model"]][2]) == round(row["rmse"], 3)
        assert float(rows[row["model"]][4]) == round(row["nlpd"], 3)


def test_demo_without_matplotlib_says_how_to_get_the_picture(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    assert main(["demo", *SMALL, "--plot", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "picture skipped: matplotlib is not installed (pip install 'alacarte[plot]')"
    assert not (tmp_path / "d.png").exists()


@pytest.mark.parametrize("flags, message", [
    (["--n-exact", "400"], "--n-exact (400) is a subsample of the training rows: at most --n (300)"),
    (["--n-exact", "1"], "--n-exact must be at least 2"),
    (["--num-samples", "0"], "--num-samples must be a positive integer, got 0"),
    (["--max-iter", "-1"], "--max-iter must be a positive integer, got -1"),
])
def test_demo_names_a_bad_setting_in_one_line(flags, message, capsys):
    assert main(["demo", *SMALL, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"alacarte: error: {message}") and err.count("\n") == 1


@pytest.mark.slow
def test_the_full_demo_shows_the_feature_gp_ahead_of_the_exact_gp(tmp_path, capsys):
    """The defaults, as `alacarte demo` runs them: FSARD on all rows ahead in RMSE and NLPD, intervals calibrated."""
    assert main(["demo", "-q", "--json", "--plot", str(tmp_path / "d.png")]) == 0
    mean, truth, exact, feature = json.loads(capsys.readouterr().out)["results"]
    assert feature["rmse"] < exact["rmse"] < mean["rmse"] and feature["nlpd"] < exact["nlpd"] < mean["nlpd"]
    assert feature["rmse_f"] < 0.5 * exact["rmse_f"]
    assert 0.92 < feature["coverage95"] < 0.98 and 0.92 < exact["coverage95"] < 0.98
    assert feature["rmse"] < 1.05 * truth["rmse"]
    torch.testing.assert_close(torch.tensor(truth["rmse"]), torch.tensor(NOISE), atol=0.01, rtol=0)
