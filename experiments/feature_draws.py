"""The predictive averaged over independent feature draws, against one draw (docs/calibration.md).

    python experiments/feature_draws.py OUT.jsonl DATASETS METHODS DRAWS
    e.g. python experiments/feature_draws.py experiments/results/feature_draws.jsonl fertility,challenger gm 5

Per dataset, UCI splits 0–2 and method: DRAWS models from ``make_model`` (D = 1024, the shipped
Q = C = 4 components), each with its own seed (split + 1000·k: its feature draw, restarts and held-out
rows), fitted with ``fit``'s defaults; draw 0 is the calibration table's fit.  Reported: the first
draw's scores, the moment-matched Gaussian of the equal mixture (mean m̄ = avg m_k, variance
avg v_k + avg (m_k − m̄)², :func:`alacarte.regressor.mixture_moments`) and the mixture's exact NLPD.
One JSON line per cell, appended.  One thread; data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac
from alacarte.bench.scores import predictive_scores
from alacarte.factory import make_model
from alacarte.regressor import mixture_moments

from _jsonl_rows import append_row  # noqa: E402  (experiments/, the script's own folder)


def run_cell(dataset: str, split: int, method: str, draws: int) -> dict:
    data = ac.load_uci(dataset, split, os.environ.get("ALACARTE_DATA"))
    d = data.x_train.shape[1]
    y = torch.as_tensor(data.y_test)
    means, variances, start = [], [], time.time()
    for k in range(draws):
        seed = split + 1000 * k
        model = make_model(method, d, num_samples=512, num_components=4, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ac.fit(model, data.x_train, data.y_train, seed=seed, progress=False)
        pred = model.predict(data.x_test)
        means.append(pred.mean.detach())
        variances.append(pred.observed_variance.detach())
    m, v = torch.stack(means), torch.stack(variances)
    log_density = -0.5 * (torch.log(2 * math.pi * v) + (y - m) ** 2 / v)
    return {"dataset": dataset, "split": split, "method": method, "K": draws,
            "single": predictive_scores(m[0], v[0], y),
            "moment_matched": predictive_scores(*mixture_moments(m, v), y),
            "mixture_nlpd": float(-(torch.logsumexp(log_density, 0) - math.log(draws)).mean()),
            "member_nlpd": [predictive_scores(m[k], v[k], y)["nlpd"] for k in range(draws)],
            "seconds": round(time.time() - start, 1)}


def main() -> None:
    out, datasets, methods, draws = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), int(sys.argv[4])
    torch.set_num_threads(1)
    for dataset in datasets:
        for split in range(3):
            for method in methods:
                row = run_cell(dataset, split, method, draws)
                append_row(out, row)
                print(dataset, split, method, round(row["single"]["nlpd"], 3),
                      round(row["moment_matched"]["nlpd"], 3), flush=True)


if __name__ == "__main__":
    main()
