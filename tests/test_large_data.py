"""experiments/large_data.py's shared scoring, its units and its CPU-time budget."""
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import large_data  # noqa: E402


def test_scores_are_the_gaussian_nlpd_coverage_and_spread():
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=200), rng.uniform(0.5, 2.0, 200)
    y = mean + std * rng.standard_normal(200)
    s = large_data.scores(y, mean, std**2)
    rmse = math.sqrt(np.mean((y - mean) ** 2))
    assert math.isclose(s["rmse"], rmse, rel_tol=1e-12)
    assert math.isclose(s["nlpd"], -stats.norm.logpdf(y, mean, std).mean(), rel_tol=1e-12)
    for level in (50, 95):
        half = stats.norm.ppf(0.5 + level / 200) * std
        assert s[f"coverage{level}"] == np.mean(np.abs(y - mean) <= half)
    assert math.isclose(s["std_over_rmse"], std.mean() / rmse, rel_tol=1e-12)
    point = large_data.scores(y, mean, None)  # a point predictor: RMSE only
    assert point["rmse"] == s["rmse"] and math.isnan(point["nlpd"]) and math.isnan(point["coverage95"])


def test_a_standardised_prediction_is_scored_in_the_targets_units():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 2)), 300.0 + 40.0 * rng.normal(size=50)
    st = large_data.Standardiser(x, y, torch.float64)
    z = st.y(y)
    mean, variance = st.back(z + 0.1, torch.full_like(z, 0.25))
    assert np.allclose(mean, y + 0.1 * y.std()) and np.allclose(variance, 0.25 * y.var())
    # The density of y is that of the standardised target over the scale: NLPD grows by log(sd(y)).
    standardised = -stats.norm.logpdf(z.numpy(), z.numpy() + 0.1, 0.5).mean()
    assert math.isclose(large_data.scores(y, mean, variance)["nlpd"], standardised + math.log(y.std()),
                        rel_tol=1e-10)


def test_training_stops_at_the_step_that_reaches_the_cpu_budget():
    def step():  # about 1 ms of CPU
        start = time.process_time()
        while time.process_time() - start < 1e-3:
            pass

    start = time.process_time()
    steps = large_data.train_for(0.05, step)
    spent = time.process_time() - start
    assert steps >= 1 and 0.05 <= spent < 0.05 + 0.02
