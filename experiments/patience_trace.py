"""The held-out score and the likelihood at every iterate of a default one-draw fit, with the held-out
early stop's patience (``alacarte.holdout.PATIENCE``) overridden: where a fit stops, and what lies past it.

    python experiments/patience_trace.py OUT.jsonl --dataset parkinsons --method pwl --split 1 --patience 1000

The fit is ``calibration.py run --num-draws 1``'s (the same builder and seeds; ``fit_draws``); one JSON line per
run is appended with the test scores, ``validation`` (the held-out score per iterate of the final optimisation,
its start first) and ``loss`` (the negative log marginal likelihood per kept row, per iteration).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac  # noqa: E402
from alacarte.bench.settings import package_version  # noqa: E402
from alacarte.holdout import RECOMMENDED_FRACTION  # noqa: E402
from alacarte.training import _optimization  # noqa: E402
from _jsonl_rows import append_row  # noqa: E402
from calibration import cell_model, fit_draws  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--patience", type=int, required=True)
    parser.add_argument("--num-samples", type=int, default=512)
    parser.add_argument("--data", default=None, help="the UCI folder (default: $ALACARTE_DATA)")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    _optimization.PATIENCE = args.patience  # read at every iterate by the held-out early stop
    data = ac.load_uci(args.dataset, args.split, args.data)
    start = time.process_time()
    scores, _, (history,) = fit_draws(data, args.split, 1,
                                      lambda seed: cell_model(args.method, data, seed, args.num_samples),
                                      validation_fraction=RECOMMENDED_FRACTION)
    append_row(args.out, {"dataset": args.dataset, "split": args.split, "method": args.method,
                          "patience": args.patience, **scores, "iterations": history.iterations,
                          "best_iteration": history.best_iteration, "restart_scores": history.restart_losses,
                          "chosen_restart": history.chosen_restart, "cpu_s": round(time.process_time() - start, 1),
                          "version": package_version(), "validation": history.validation_loss,
                          "loss": history.loss})


if __name__ == "__main__":
    main()
