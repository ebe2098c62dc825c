"""The tutorial's numbers are those its script prints, and the script prints what the code gives now."""
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "uci"
FIGURES = ROOT / "docs" / "figures"


def test_the_tutorial_quotes_the_committed_numbers():
    numbers = json.loads((FIGURES / "yacht_gm.json").read_text())
    text = (ROOT / "docs" / "tutorial.md").read_text()
    assert f"test RMSE of **{numbers['rmse']:.3f}**" in text
    inside = round(numbers["within_2_std"] * numbers["n_test"])
    assert f"{inside} of the {numbers['n_test']} test points\n({numbers['within_2_std']:.0%})" in text
    assert f"The NLPD, {numbers['nlpd']:.2f}," in text
    paper = numbers["paper_protocol"]
    assert f"reaches an RMSE of {paper['rmse']:.3f} but an NLPD of {paper['nlpd']:.2f}" in text
    relevance = paper["relevance"]
    assert f"The Froude number carries {relevance['Froude']:.0%} of the relevance" in text
    assert f"B/T {relevance['B/T']:.0%} and L/D {relevance['L/D']:.0%}" in text


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/uci is not present")
def test_the_tutorials_fit_gives_the_committed_numbers():
    from alacarte import AlaCarteRegressor, load_uci

    numbers = json.loads((FIGURES / "yacht_gm.json").read_text())
    data = load_uci("yacht", split=0, data_dir=SHARED)
    reg = AlaCarteRegressor("gm", num_samples=256, num_components=4, random_state=0).fit(data.x_train, data.y_train)
    mean, std = reg.predict(data.x_test, return_std=True)
    # Five draws' L-BFGS paths: the CPU's vector code (AVX2, AVX-512, ATen's default) rounds differently
    # and moved one path's RMSE between 0.260 and 0.264 (the tutorial says so); a change in the code
    # moves it more.
    assert np.sqrt(np.mean((mean - data.y_test) ** 2)) == pytest.approx(numbers["rmse"], rel=0.03)
    assert np.mean(np.abs(data.y_test - mean) <= 2 * std) == numbers["within_2_std"]
    np.testing.assert_allclose(reg.relevance_, list(numbers["relevance"].values()), atol=0.015)
