"""How well a Gaussian prediction fits the test targets: the scores every benchmark row records."""
from __future__ import annotations

import math

__all__ = ["predictive_scores"]

# Two-sided standard-normal quantiles of the central 50% and 95% intervals.
_Z50, _Z95 = 0.6744897501960817, 1.959963984540054


def predictive_scores(mean, variance, y) -> dict:
    """Test RMSE, mean NLPD, the coverage of the central 50% and 95% predictive intervals, and the mean
    predictive standard deviation over the RMSE (1 where the spread matches the errors; below 1: over-confident)."""
    z = (y - mean) / variance.sqrt()
    rmse = float((y - mean).pow(2).mean().sqrt())
    return {"rmse": rmse, "nlpd": float((0.5 * (z**2 + variance.log() + math.log(2 * math.pi))).mean()),
            "coverage50": float((z.abs() <= _Z50).double().mean()),
            "coverage95": float((z.abs() <= _Z95).double().mean()),
            "std_over_rmse": float(variance.sqrt().mean()) / rmse}
