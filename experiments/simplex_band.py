"""The simplex-ARD GP's predictive band: the marginal likelihood's, or set on rows held out of the fit
(docs/calibration.md).

    python experiments/simplex_band.py OUT.jsonl DATASETS [MODES [DRAWS]]
    e.g. python experiments/simplex_band.py experiments/results/simplex_band.jsonl yacht,autompg,housing all,calibrated 0

Per dataset and UCI split 0–2, FSARD with ``simplex=True`` at ``selection_real.py``'s settings (seed =
split), in each mode: ``all`` — ``fit`` and ``select_inputs`` on all training rows
(``validation_fraction=0``); ``calibrated`` — the same on a seeded 80% of the rows, then σ² and
σ_f² set on the other 20% (:meth:`alacarte.holdout.HeldOut.calibrate`) and the posterior conditioned
on all rows; ``default`` — ``fit`` and ``select_inputs`` at their defaults, which do what
``calibrated`` does by hand (the fit's own split; inputs and targets standardised on all rows);
``loo`` — ``all``'s fit, then σ² and σ_f² set on every training row, each predicted from
all the others (rows the fit saw).  MODES (comma-separated) defaults to ``all,calibrated``; DRAWS is
``select_inputs``'s ``draws`` (default ``auto``; ``simplex_band.jsonl``'s rows are ``0``).  One JSON
line per (dataset, split), appended.  One thread; data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac
from alacarte.bench.scores import predictive_scores
from alacarte.holdout import HeldOut, split_rows
from alacarte.woodbury import sufficient_statistics
from alacarte.selection import select_inputs

from _jsonl_rows import append_row  # noqa: E402  (experiments/, the script's own folder)
from selection_real import gp_settings  # noqa: E402


class _EveryRow(HeldOut):
    """Every training row scored leave-one-out under the posterior of all the others."""

    @torch.no_grad()
    def _all_rows(self):
        phi = self.model.covar_module.features(self.x)
        return sufficient_statistics(phi, self.y - self.model.mean_module(self.x)), phi


def fit_and_score(data, split: int, mode: str, draws) -> dict:
    held_out = mode == "calibrated"
    x, y = data.x_train, data.y_train
    n, d = x.shape
    settings = gp_settings(n, d)
    start = time.time()
    kernel = ac.FSARDKernel(d, settings["num_samples"], ard_num_dims=d, simplex=True, seed=split).double()
    model = ac.FeatureGP(None, None, kernel).double()
    kept, held = split_rows(n, 0.2, split) if held_out else (np.arange(n), None)
    kept = np.asarray(kept)
    fraction = "auto" if mode == "default" else 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ac.fit(model, x[kept], y[kept], max_iter=settings["max_iter"], restarts=settings["restarts"],
               restart_iter=10, progress=False, seed=split, validation_fraction=fraction)
        select_inputs(model, x[kept], y[kept], seed=split, draws=draws, validation_fraction=fraction)
    if held is not None:
        held = np.asarray(held)
        inputs = lambda a: model.internal_query_inputs(torch.as_tensor(a))  # noqa: E731
        targets = lambda a: (torch.as_tensor(a) - model.target_offset) / model.target_scale  # noqa: E731
        model.train()
        HeldOut(model, inputs(x[held]), targets(y[held])).calibrate()
        model.set_train_data(inputs(x), targets(y), strict=False)
    if mode == "loo":
        model.train()
        (inputs,) = model.train_inputs
        _EveryRow(model, inputs, model.train_targets).calibrate()
    pred = model.predict(data.x_test)
    scores = predictive_scores(pred.mean.detach(), pred.observed_variance.detach(), torch.as_tensor(data.y_test))
    scores["selected"] = [int(i) for i in np.flatnonzero(kernel.relevance.detach().numpy().reshape(-1) > 0)]
    scores["seconds"] = round(time.time() - start, 1)
    return scores


def main() -> None:
    out, datasets = sys.argv[1], sys.argv[2].split(",")
    modes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["all", "calibrated"]
    draws = sys.argv[4] if len(sys.argv) > 4 else "auto"
    draws = draws if draws == "auto" else int(draws)
    torch.set_num_threads(1)
    for dataset in datasets:
        for split in range(3):
            data = ac.load_uci(dataset, split, os.environ.get("ALACARTE_DATA"))
            row = {"dataset": dataset, "split": split}
            for mode in modes:
                row[mode] = fit_and_score(data, split, mode, draws)
                print(dataset, split, mode, round(row[mode]["nlpd"], 3), flush=True)
            append_row(out, row)


if __name__ == "__main__":
    main()
