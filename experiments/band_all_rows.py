"""The band's scale set on the held-out rows alone, on every training row, or on every row with the held-out rows'
correction (``fit``'s rule from ``TAIL_ROWS`` held-out rows).

    python experiments/band_all_rows.py OUT.csv --datasets gas sml --splits 0-9 [--data DATA]

GM fitted by ``alacarte.fit`` at its defaults (D = 1 024, four components, 20% of the rows held out, seed = split)
with the scale set on the held-out rows alone (``TAIL_ROWS`` lifted), as a calibration cell fitted it before the
rule.  Every training row is then predicted from all the others (``HeldOut``'s leave-one-out formula), giving each
row's z² = (y − m₋ᵢ)²/v₋ᵢ, and the test predictive variance is multiplied by

- ``held-out``: 1 (the fit's band);
- ``every-row``: (Σ z² + ν)/(n + ν) over every row;
- ``median-corrected``: (Σ_H z² + c Σ_T z² + ν)/(n + ν), c the held-out rows' median z² over the kept rows'
  (``HeldOut.every_row_scale``, ``fit``'s rule).

One CSV row per fit and band, appended as each fit ends; a (dataset, split) already in ``OUT.csv`` is skipped, so a
stopped run resumes.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import warnings
from pathlib import Path

import torch

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import alacarte as ac  # noqa: E402
import alacarte.holdout as holdout  # noqa: E402
from alacarte.bench import predictive_scores  # noqa: E402
from alacarte.bench.settings import parse_splits  # noqa: E402
from alacarte.factory import make_model  # noqa: E402

FIELDS = ["dataset", "split", "band", "n_train", "scale", "correction", "rmse", "nlpd", "coverage95", "seconds"]


def squares(model, x, y) -> torch.Tensor:
    """Every row's z² = (y − m₋ᵢ)²/v₋ᵢ, predicted from all the other rows (``x, y``: all of them, standardised)."""
    model.set_train_data(x, y, strict=False)
    scorer = holdout.HeldOut(model, x, y)
    with torch.no_grad():
        model.eval()
        mean, variance = scorer._leave_one_out(model.training_statistics(), model.covar_module.features(x))
        model.train()
    return (y - mean) ** 2 / variance


def bands(dataset: str, split: int, data_folder: str | None) -> list[dict]:
    """The GM cell's fit scored under each band."""
    data = ac.load_uci(dataset, split, data_folder)
    model = make_model("gm", data.x_train.shape[1], seed=split)
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ac.fit(model, data.x_train, data.y_train, seed=split, progress=False)
    seconds = time.process_time() - start
    prediction = model.predict(data.x_test)
    x, y = model.standardize(*model.check_data(data.x_train, data.y_train))
    z2 = squares(model, x, y)
    kept, held = holdout.split_rows(len(y), holdout.RECOMMENDED_FRACTION, split)
    correction = float(z2[held].median() / z2[kept].median())
    prior, n = holdout.SCALE_PRIOR_ROWS, len(y)
    scales = {"held-out": 1.0, "every-row": (float(z2.sum()) + prior) / (n + prior),
              "median-corrected": (float(z2[held].sum()) + correction * float(z2[kept].sum()) + prior) / (n + prior)}
    rows = []
    for band, scale in scales.items():
        scores = predictive_scores(prediction.mean, prediction.observed_variance * scale, torch.as_tensor(data.y_test))
        rows.append({"dataset": dataset, "split": split, "band": band, "n_train": n, "scale": scale,
                     "correction": correction, "rmse": scores["rmse"], "nlpd": scores["nlpd"],
                     "coverage95": scores["coverage95"], "seconds": seconds})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--splits", default="0-2")
    parser.add_argument("--data", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    holdout.TAIL_ROWS = math.inf  # the fit's band from its held-out rows alone: the rule is scored below
    done = set()
    if args.csv.exists():
        with args.csv.open() as f:
            done = {(row["dataset"], int(row["split"])) for row in csv.DictReader(f)}
    for dataset in args.datasets:
        for split in parse_splits(args.splits):
            if (dataset, split) in done:
                continue
            rows = bands(dataset, split, args.data)
            new = not args.csv.exists()
            with args.csv.open("a", newline="") as f:
                writer = csv.DictWriter(f, FIELDS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
            print(f"{dataset} {split}: " + " | ".join(f"{r['band']} NLPD {r['nlpd']:.3f} cov95 {r['coverage95']:.3f}"
                                                     for r in rows), flush=True)


if __name__ == "__main__":
    main()
