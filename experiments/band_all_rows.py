"""The band's scale set on the held-out rows (``fit``'s rule) or on every training row, each left out in turn.

    python experiments/band_all_rows.py gas 3,4,5 [DATA]

GM fitted by ``alacarte.fit`` at its defaults (D = 1 024, four components, 20% of the rows held out, seed = split),
as a calibration cell fits it; its test NLPD and 95% coverage with the band ``fit`` set, then with the overall
scale of σ_f² and σ² set again by ``HeldOut.rescale`` on every training row, each predicted from all the others.
Prints one line per split and band.  Where a few rows sit far off their neighbours' targets, how many of them land
among the held-out rows moves σ² both ways; all rows vote on it with five times the rows.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import alacarte as ac  # noqa: E402
from alacarte.bench import predictive_scores  # noqa: E402
from alacarte.factory import make_model  # noqa: E402
from alacarte.holdout import HeldOut  # noqa: E402


def scores(model, data) -> str:
    prediction = model.predict(data.x_test)
    s = predictive_scores(prediction.mean, prediction.observed_variance, torch.as_tensor(data.y_test))
    noise = float(model.likelihood.noise.detach().min())
    return f"NLPD {s['nlpd']:.3f}, 95% coverage {s['coverage95']:.3f}, σ² {noise:.4g}"


def main(dataset: str, splits: list[int], data_folder: str | None = None) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    for split in splits:
        data = ac.load_uci(dataset, split, data_folder)
        model = make_model("gm", data.x_train.shape[1], seed=split)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ac.fit(model, data.x_train, data.y_train, seed=split, progress=False)
        print(f"{dataset} {split} held-out rows: {scores(model, data)}", flush=True)
        x, y = model.standardize(*model.check_data(data.x_train, data.y_train))
        model.set_train_data(x, y, strict=False)
        HeldOut(model, x, y).rescale(model.training_statistics())
        model.condition_on(model.training_statistics())
        print(f"{dataset} {split} every row:     {scores(model, data)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3] if len(sys.argv) > 3 else None)
