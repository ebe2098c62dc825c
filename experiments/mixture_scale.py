"""Five feature draws sharing one held-out split, and one variance scale for their mixture.

    python experiments/mixture_scale.py OUT.jsonl pendulum:fsard pendulum:gm yacht:fsard ...

Each ``dataset:method`` on UCI splits 0–2: five draws (``make_model`` seeds split + 1000·k, as
``AlaCarteRegressor`` draws them) fitted at ``fit``'s defaults but all with ``seed=split``, so that
they hold out the *same* rows (and start their restarts from the same points).  Each draw's held-out
rows are then predicted from all other rows (``HeldOut.calibration_predictive``, the draw already
calibrated as ``fit`` calibrates it), and the mixture's moments there, mean m̄, mean variance v̄ and
spread of the means, give two candidate scales: *inner*, the s minimising the held-out NLPD of
N(m̄, s·v̄ + spread) (a bounded search on log s), and *whole*, the closed-form s of N(m̄, s·(v̄ + spread)).
The test rows are scored under the plain mixture (s = 1, what the estimator predicts, here with the
shared split) and under both scales.  One JSON line per (dataset, method, split), appended.

Why: each draw's held-out rows already widen its band for its own error, and the mixture's
moment-matched variance adds the spread of the draws' means on top (docs/calibration.md).
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

import torch
from scipy.optimize import minimize_scalar

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.scores import predictive_scores  # noqa: E402
from alacarte.factory import make_model  # noqa: E402
from alacarte.holdout import HeldOut, split_rows  # noqa: E402
from _jsonl_rows import append_row  # noqa: E402


def fit_draws(data, method: str, split: int, kept, held):
    """Per draw: the held-out rows' leave-one-out predictive (standardised) and the test predictive."""
    d = data.x_train.shape[1]
    hm, hv, tm, tv = [], [], [], []
    for k in range(5):
        model = make_model(method, d, num_samples=512, seed=split + 1000 * k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ac.fit(model, data.x_train, data.y_train, seed=split, progress=False)
        xs, ys = model.standardize(torch.as_tensor(data.x_train), torch.as_tensor(data.y_train))
        model.set_train_data(xs[kept], ys[kept], strict=False)
        m, v = HeldOut(model, xs[held], ys[held]).calibration_predictive()
        model.set_train_data(xs, ys, strict=False)
        hm.append(m), hv.append(v)
        p = model.predict(data.x_test)
        tm.append(p.mean.detach()), tv.append(p.observed_variance.detach())
    return ys[held], *map(torch.stack, (hm, hv, tm, tv))


def moments(means, variances):
    """The mixture's mean, mean variance and spread of the means."""
    mean = means.mean(0)
    return mean, variances.mean(0), ((means - mean) ** 2).mean(0)


def scales(y_held, hm, hv) -> tuple[float, float]:
    """(inner, whole): the held-out rows' best s for s·v̄ + spread, and for s·(v̄ + spread)."""
    mbar, vbar, spread = moments(hm, hv)

    def nlpd(s: float) -> float:
        var = s * vbar + spread
        return float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (y_held - mbar) ** 2 / var).mean())

    inner = math.exp(minimize_scalar(lambda t: nlpd(math.exp(t)), bounds=(-5, 5), method="bounded").x)
    whole = float(((y_held - mbar) ** 2 / (vbar + spread)).mean())
    return inner, whole


def run_cell(dataset: str, method: str, split: int) -> dict:
    data = ac.load_uci(dataset, split, os.environ.get("ALACARTE_DATA"))
    kept, held = split_rows(data.x_train.shape[0], 0.2, seed=split)
    y_held, hm, hv, tm, tv = fit_draws(data, method, split, kept, held)
    inner, whole = scales(y_held, hm, hv)
    y = torch.as_tensor(data.y_test)
    mean, vbar, spread = moments(tm, tv)
    return {"dataset": dataset, "method": method, "split": split, "s_inner": inner, "s_whole": whole,
            "plain": predictive_scores(mean, vbar + spread, y),
            "inner": predictive_scores(mean, inner * vbar + spread, y),
            "whole": predictive_scores(mean, whole * (vbar + spread), y),
            "per_draw_nlpd": [predictive_scores(tm[k], tv[k], y)["nlpd"] for k in range(5)]}


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    out, cells = argv[0], [c.split(":") for c in argv[1:]]
    for dataset, method in cells:
        for split in range(3):
            row = run_cell(dataset, method, split)
            append_row(out, row)
            print(dataset, method, split, "plain %.3f inner %.3f (s %.2f) whole %.3f (s %.2f)" % (
                row["plain"]["nlpd"], row["inner"]["nlpd"], row["s_inner"], row["whole"]["nlpd"],
                row["s_whole"]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
