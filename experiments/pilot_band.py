"""A pilot fit's band, three ways: the pilot's own, its overall scale set again, or σ² searched as well.

    python experiments/pilot_band.py kin40k 5000 1024,2048

GM hyperparameters fitted by ``alacarte.fit`` (its defaults) on ``rows`` random rows of UCI split 0 at D = 1 024,
then a GM model of each listed ``num_samples`` (D = 2M) given them and conditioned on every row, with the band
(σ², σ_f²) left as the pilot's, rescaled by ``HeldOut.rescale`` (what ``alacarte.fit_pilot`` does) or chosen by
``HeldOut.calibrate`` (the search over σ² that ``alacarte.fit`` ends with), on 5 000 held-out rows outside the
pilot, each predicted from all other rows.  Test RMSE, NLPD and 95% coverage in the targets' units; CPU seconds
(one thread) since the start and added by each band.  Prints one line per model.
"""
from __future__ import annotations

import sys
import time
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


def main(dataset: str, rows: int, sizes: list[int], data_folder: str | None = None) -> None:
    torch.set_num_threads(1)
    data = ac.load_uci(dataset, 0, data_folder)
    mx, sx = data.x_train.mean(0), data.x_train.std(0) + 1e-12
    my, sy = data.y_train.mean(), data.y_train.std()
    x, y = torch.as_tensor((data.x_train - mx) / sx), torch.as_tensor((data.y_train - my) / sy)
    xt, yt = torch.as_tensor((data.x_test - mx) / sx), torch.as_tensor(data.y_test)
    order = torch.as_tensor(np.random.default_rng(0).permutation(len(x)))
    pilot_rows, held, kept = order[:rows], order[rows:rows + 5000], torch.cat([order[:rows], order[rows + 5000:]])
    start = time.process_time()

    def report(model, tag):
        with torch.no_grad():
            p = model.predict(xt)
        s = predictive_scores(p.mean * sy + my, p.observed_variance * sy**2, yt)
        print(f"{tag}: rmse {s['rmse']:.4f} nlpd {s['nlpd']:.3f} cov95 {s['coverage95']:.3f} "
              f"cpu {time.process_time() - start:.0f} s", flush=True)

    pilot = make_model("gm", x.shape[1], num_samples=512, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ac.fit(pilot, x[pilot_rows], y[pilot_rows], standardize=False, progress=False, seed=0)
    report(pilot, f"pilot, {rows} rows, D = 1024")
    for size in sizes:
        for band in ("pilot", "rescale", "calibrate"):
            begun = time.process_time()
            model = make_model("gm", x.shape[1], num_samples=size, seed=1)
            model.covar_module.load_state_dict(pilot.covar_module.widened(size, 1).state_dict())
            model.likelihood.load_state_dict(pilot.likelihood.state_dict())
            model.mean_module.load_state_dict(pilot.mean_module.state_dict())
            if band != "pilot":
                model.set_train_data(x[kept], y[kept], strict=False)
                model.train()
                scorer = HeldOut(model, x[held], y[held])
                scorer.rescale() if band == "rescale" else scorer.calibrate()
            model.set_train_data(x, y, strict=False)
            report(model, f"  D = {2 * size}, band {band} (+{time.process_time() - begun:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [int(v) for v in sys.argv[3].split(",")],
         sys.argv[4] if len(sys.argv) > 4 else None)
