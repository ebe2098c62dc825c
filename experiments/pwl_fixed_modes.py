"""PWL with its hats' modes held at their initial knots, against the calibration table's learned modes.

    python experiments/pwl_fixed_modes.py OUT.jsonl DATASET:SPLITS [DATASET:SPLITS ...]
    e.g. python experiments/pwl_fixed_modes.py experiments/results/pwl_fixed_modes.jsonl pumadyn32nm:0-2 yacht:0-2

The PWL kernel k(τ) = Σ_c π_c E_{r∼hat_c} Ω_p(r‖τ/ℓ‖) depends on the modes a_c and the ARD
lengthscales ℓ only through r/ℓ: one common scale of the two is not identified.  Here the modes stay
at the constructor's knots √p·(0.5 … 1.5) (``raw_modes.requires_grad_(False)``; ``fit``'s
initialisation keeps frozen parameters), as the À la carte paper's fixed-knot piecewise-linear density
has them; widths, weights and lengthscales are learned.  Otherwise the calibration table's cell:
``make_model("pwl")`` at D = 1024, C = 4, seed = split, ``fit``'s defaults (20% held out), one draw.
One JSON line per fit (appended; a rerun skips the cells it holds); data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

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
from alacarte.bench.settings import parse_splits
from alacarte.factory import make_model

from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)


def run_cell(dataset: str, split: int) -> dict:
    data = ac.load_uci(dataset, split, os.environ.get("ALACARTE_DATA"))
    model = make_model("pwl", data.x_train.shape[1], num_samples=512, num_components=4, seed=split)
    kernel = model.covar_module
    kernel.raw_modes.requires_grad_(False)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = ac.fit(model, data.x_train, data.y_train, seed=split, progress=False)
    pred = model.predict(data.x_test)
    scores = predictive_scores(pred.mean, pred.observed_variance, torch.as_tensor(data.y_test))
    return {"dataset": dataset, "split": split, "method": "pwl", "modes": "fixed", **scores,
            "final_loss": float(history.final_loss), "iterations": history.iterations,
            "modes_after": kernel.modes.detach().reshape(-1).tolist(),
            "weights_after": kernel.weights.detach().reshape(-1).tolist(),
            "seconds": round(time.perf_counter() - start, 1)}


def main(out: str, cells: list[str]) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    done = {(r["dataset"], r["split"]) for r in read_rows(out)}
    for cell in cells:
        dataset, splits = cell.split(":")
        for split in parse_splits(splits):
            if (dataset, split) in done:
                continue
            row = run_cell(dataset, split)
            append_row(out, row)
            print(f"{dataset} {split}: rmse {row['rmse']:.4g} nlpd {row['nlpd']:.3f} cov95 {row['coverage95']:.2f} "
                  f"({row['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
