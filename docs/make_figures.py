"""Draw the tutorial's pictures: a GM kernel fitted on UCI yacht, split 0.

Needs the UCI data (``$ALACARTE_DATA``) and about 45 seconds; the PNGs and the
numbers quoted in ``tutorial.md`` are committed, so building the documentation
needs neither::

    ALACARTE_DATA=/path/to/uci python docs/make_figures.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's alacarte

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from alacarte import AlaCarteRegressor, load_uci  # noqa: E402
from alacarte.plotting import save_kernel_figure  # noqa: E402

HERE = Path(__file__).parent / "figures"
# Yacht hydrodynamics: hull geometry and the Froude number → residuary resistance.
COLUMNS = ["LCB", "Cp", "L/D", "B/T", "L/B", "Froude"]


def scores(reg, data) -> dict:
    """Test RMSE, NLPD, the share inside ±2σ and the input relevances of a fitted estimator."""
    mean, std = reg.predict(data.x_test, return_std=True)
    rmse = float(np.sqrt(np.mean((mean - data.y_test) ** 2)))
    nlpd = float(np.mean(0.5 * ((data.y_test - mean) / std) ** 2 + np.log(std) + 0.5 * np.log(2 * np.pi)))
    inside = float(np.mean(np.abs(data.y_test - mean) <= 2 * std))
    return {"rmse": rmse, "nlpd": nlpd, "within_2_std": inside,
            "relevance": dict(zip(COLUMNS, np.round(reg.relevance_, 3).tolist()))}


def main() -> None:
    torch.set_num_threads(1)
    HERE.mkdir(exist_ok=True)
    data = load_uci("yacht", split=0)
    # The paper's protocol (one draw, the marginal likelihood of all rows), for the comparison the tutorial makes.
    paper = AlaCarteRegressor("gm", num_samples=256, num_components=4, random_state=0, validation_fraction=0,
                              num_draws=1)
    paper.fit(data.x_train, data.y_train)
    reg = AlaCarteRegressor("gm", num_samples=256, num_components=4, random_state=0)
    reg.fit(data.x_train, data.y_train)
    numbers = {"n_train": len(data.y_train), "n_test": len(data.y_test), **scores(reg, data),
               "log_marginal_likelihood": reg.log_marginal_likelihood_,
               "paper_protocol": scores(paper, data)}
    (HERE / "yacht_gm.json").write_text(json.dumps(numbers, indent=2) + "\n")
    print(json.dumps(numbers, indent=2))

    # The spectrum of the fit run to the likelihood's optimum: an early-stopped one has not yet concentrated it.
    save_kernel_figure(paper.model_.covar_module, HERE / "yacht_gm_spectrum.png",
                       title="GM kernel learned on yacht (split 0, all rows, validation_fraction=0)", names=COLUMNS)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    # Left: a slice through the Froude number, hull geometry at the training median,
    # reaching past the training range on both sides, where the bands open up.
    lo, hi = data.x_train[:, 5].min(), data.x_train[:, 5].max()
    froude = np.linspace(lo - 0.5 * (hi - lo), hi + 0.5 * (hi - lo), 400)
    grid = np.tile(np.median(data.x_train, axis=0), (len(froude), 1))
    grid[:, 5] = froude
    mu, sd_f = reg.predict(grid, return_std=True, include_noise=False)
    _, sd_y = reg.predict(grid, return_std=True)
    draws = reg.sample_y(grid, n_samples=3, random_state=1)
    left.axvspan(lo, hi, color="0.92", label="training range")
    left.fill_between(froude, mu - 2 * sd_y, mu + 2 * sd_y, color="C0", alpha=0.15, label="±2σ, new observation")
    left.fill_between(froude, mu - 2 * sd_f, mu + 2 * sd_f, color="C0", alpha=0.35, label="±2σ, latent f")
    left.plot(froude, mu, color="C0", label="predictive mean")
    left.plot(froude, draws, color="C1", lw=0.8, alpha=0.9)
    left.plot([], [], color="C1", lw=0.8, label="posterior draws (sample_y)")
    left.set_xlabel("Froude number (other inputs at their training median)")
    left.set_ylabel("residuary resistance (dataset units)")
    left.set_title("a slice of the fitted function")
    left.legend(fontsize=8, loc="upper left")
    # Right: every test residual with its ±2σ predictive interval, ordered by the prediction.
    mean, std = reg.predict(data.x_test, return_std=True)
    order = np.argsort(mean)
    idx = np.arange(len(order))
    right.axhline(0, color="0.6", lw=0.8)
    right.errorbar(idx, np.zeros(len(idx)), yerr=2 * std[order], fmt="none", ecolor="C0", elinewidth=3,
                   alpha=0.4, label="±2σ predictive interval")
    right.plot(idx, data.y_test[order] - mean[order], "x", color="C3", label="observed − predicted")
    right.set_xlabel("test point (sorted by prediction)")
    right.set_ylabel("residual")
    right.set_title(f"test split: RMSE {numbers['rmse']:.3f}, {100 * numbers['within_2_std']:.0f}% inside ±2σ")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "yacht_gm_bands.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
