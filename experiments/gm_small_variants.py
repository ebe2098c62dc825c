"""GM on the small UCI datasets: the number of mixture components and a prior on the means (docs/calibration.md).

    python experiments/gm_small_variants.py OUT.jsonl base,q1,mprior,exact \
        fertility,challenger,concreteslump,breastcancer,housing,pendulum 0,1,2

Variants: ``base`` — GM with the benchmark runner's components (2 below 600 training rows);
``qK`` — K components; ``mprior`` — ``base`` with a N(0, 1) prior on every μ_qj/σ_qj (the mean of a
component within its own bandwidth of 0); ``exact`` — exact ARD.  D = 1024, ``fit``'s defaults (held-out
rows for the GM variants, none for exact ARD), seed = split.  One JSON line per fit; a rerun skips the
cells already there.  Data from ``$ALACARTE_DATA``.
"""
from __future__ import annotations

import re
import sys
import time
import warnings
from pathlib import Path

import torch
from gpytorch.priors import NormalPrior

# This checkout's library before an installed one: a run from a snapshot runs the snapshot's code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import alacarte as ac
from alacarte.bench.scores import predictive_scores
from alacarte.bench.settings import mixture_components
from alacarte.factory import make_model

from _jsonl_rows import append_row, read_rows  # noqa: E402  (experiments/, the script's own folder)


def build(variant: str, d: int, n: int, split: int):
    if variant == "exact":
        return make_model("exact-ard", d, seed=split), 0.0
    q = mixture_components("auto", n)
    match = re.match(r"q(\d+)$", variant)
    if match:
        q = int(match.group(1))
    model = make_model("gm", d, num_samples=512, num_components=q, seed=split)
    if variant == "mprior":
        model.covar_module.register_prior("means_prior", NormalPrior(0.0, 1.0), lambda k: k.means / k.scales)
    return model, "auto"


def main(out: str, variants: str, datasets: str, splits: str) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    done = {(r["dataset"], r["split"], r["variant"]) for r in read_rows(out)}
    for split in map(int, splits.split(",")):
        for dataset in datasets.split(","):
            data = ac.load_uci(dataset, split)
            n, d = data.x_train.shape
            for variant in variants.split(","):
                if (dataset, split, variant) in done:
                    continue
                model, fraction = build(variant, d, n, split)
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    history = ac.fit(model, data.x_train, data.y_train, seed=split, progress=False,
                                     validation_fraction=fraction)
                pred = model.predict(data.x_test)
                scores = predictive_scores(pred.mean, pred.observed_variance, torch.as_tensor(data.y_test))
                row = dict(dataset=dataset, split=split, variant=variant, n=n, seconds=round(time.perf_counter() - start, 2),
                           noise=float(model.likelihood.noise.detach().min()), iters=history.iterations, **scores)
                append_row(out, row)
                print(dataset, split, variant, f"rmse {scores['rmse']:.4g} nlpd {scores['nlpd']:.3f}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
