"""The main job, ``alacarte demo``: a feature GP on all the rows against an exact GP on the rows it affords.

The problem (:func:`make_waves`) has three inputs and a target with oscillations
in two directions, too much detail for a thousand rows to pin down through noise
of standard deviation 0.2.  An exact ARD GP costs O(n³) a step, so in the time the
FSARD feature GP (:class:`~alacarte.FSARDKernel`, D = 192 features, O(nD²)) takes
on all 8 000 rows it fits about 1 000 of them.  Both are scored on the same test
rows by RMSE, NLPD and 95% interval coverage, beside two yardsticks: predicting
the training mean, and the true function with the true noise (the best any model
can do).

Example:
    >>> from alacarte.demo import format_table, run_demo
    >>> result = run_demo(n=200, n_test=50, n_exact=50, num_samples=8, max_iter=2, progress=False)
    >>> print(format_table(result))  # doctest: +ELLIPSIS
    y = sin(2πx₁)·cos(πx₂) + ...
    200 training rows, 50 test rows, seed 0
    model ... rows   fit s    RMSE  RMSE f    NLPD 95% cover
    predict the training mean ... 200 ...
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ._validation import check_positive_int, check_seed
from .bench.scores import predictive_scores
from .factory import make_model
from .training import fit

__all__ = ["NOISE", "FIT_SETTINGS", "make_waves", "demo_data", "run_demo", "format_table", "save_demo_figure", "add_arguments",
           "command"]

#: Standard deviation of the noise on :func:`make_waves`'s targets.
NOISE = 0.2
#: What :func:`run_demo` passes to :func:`~alacarte.fit` for both models besides ``max_iter`` and ``seed``:
#: one data-driven start, so that both fits fit the demo's minute.
FIT_SETTINGS = {"restarts": 1, "restart_iter": 10}
PROBLEM = "y = sin(2πx₁)·cos(πx₂) + ½·sin(π(x₁ + 2x₃)) + 0.3·x₂ + noise (sd 0.2), x uniform in [−1, 1]³"


def make_waves(n: int, seed: int | None = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The demo's problem: y = sin(2πx₁)·cos(πx₂) + ½·sin(π(x₁ + 2x₃)) + 0.3·x₂ + N(0, 0.2²), x ~ U[−1, 1]³.

    Args:
        n: number of rows, a positive integer.
        seed: seed of the draws (numpy's PCG64), an integer in [0, 2⁶⁴) or ``None``.

    Returns:
        ``(x, y, f)``: inputs (n, 3), noisy targets (n,) and the noise-free function f(x) (n,).

    Example:
        >>> from alacarte.demo import make_waves
        >>> x, y, f = make_waves(4, seed=0)
        >>> x.shape, y.shape, f.shape
        ((4, 3), (4,), (4,))
    """
    check_positive_int(n, "n")
    rng = np.random.default_rng(check_seed(seed))
    x = rng.uniform(-1.0, 1.0, size=(n, 3))
    f = (np.sin(2 * np.pi * x[:, 0]) * np.cos(np.pi * x[:, 1]) + 0.5 * np.sin(np.pi * (x[:, 0] + 2 * x[:, 2]))
         + 0.3 * x[:, 1])
    return x, f + NOISE * rng.standard_normal(n), f


def _scores(mean: torch.Tensor, variance: torch.Tensor, data: dict) -> dict:
    """RMSE, NLPD and 95% coverage against the noisy test targets, and the RMSE against the noise-free f."""
    scores = predictive_scores(mean, variance, data["y_test"])
    return {"rmse": scores["rmse"], "rmse_f": float((mean - data["f_test"]).pow(2).mean().sqrt()),
            "nlpd": scores["nlpd"], "coverage95": scores["coverage95"]}


def _fit_and_score(name: str, model, rows: int, data: dict, max_iter: int, seed, progress: bool) -> dict:
    """Fit ``model`` on the first ``rows`` training rows (the rows are i.i.d.: a random subsample)
    and score it on the test rows."""
    history = fit(model, data["x"][:rows], data["y"][:rows], max_iter=max_iter, seed=seed, progress=progress,
                  **FIT_SETTINGS)
    pred = model.predict(data["x_test"])
    return {"model": name, "rows": rows, "fit_seconds": history.seconds, "iterations": history.iterations,
            **_scores(pred.mean, pred.observed_variance, data)}


def _yardsticks(data: dict) -> list[dict]:
    """Predicting the training mean (with the training variance), and the truth: f with the noise's variance."""
    y, y_test = data["y"], data["y_test"]
    mean_row = {"model": "predict the training mean", "rows": len(y), "fit_seconds": 0.0, "iterations": 0,
                **_scores(torch.full_like(y_test, float(y.mean())), torch.full_like(y_test, float(y.var())), data)}
    truth_row = {"model": f"the true f, noise sd {NOISE}", "rows": None, "fit_seconds": None, "iterations": None,
                 **_scores(data["f_test"], torch.full_like(y_test, NOISE**2), data)}
    return [mean_row, truth_row]


def demo_data(n: int, n_test: int, seed: int | None = 0) -> dict:
    """:func:`run_demo`'s rows: training and test rows of :func:`make_waves` from two streams of ``seed``,
    so that the test rows do not depend on ``n``.

    Returns:
        Tensors (float64): ``x`` (n, 3), ``y`` (n,), ``x_test`` (n_test, 3), ``y_test`` and ``f_test`` (n_test,).

    Example:
        >>> from alacarte.demo import demo_data
        >>> demo_data(5, 3)["x_test"].shape
        torch.Size([3, 3])
    """
    train_seed, test_seed = np.random.SeedSequence(seed).spawn(2)
    x, y, _ = make_waves(n, seed=train_seed.generate_state(1)[0])
    x_test, y_test, f_test = make_waves(n_test, seed=test_seed.generate_state(1)[0])
    return {k: torch.as_tensor(v) for k, v in
            {"x": x, "y": y, "x_test": x_test, "y_test": y_test, "f_test": f_test}.items()}


def _check_sizes(n: int, n_test: int, n_exact: int, num_samples: int, max_iter: int) -> None:
    for value, flag in ((n, "--n"), (n_test, "--n-test"), (n_exact, "--n-exact"), (num_samples, "--num-samples"),
                        (max_iter, "--max-iter")):
        check_positive_int(value, flag)
    if n_exact > n:
        raise ValueError(f"--n-exact ({n_exact}) is a subsample of the training rows: at most --n ({n})")
    if n_exact < 2:
        raise ValueError(f"--n-exact must be at least 2 (a GP needs two rows to fit), got {n_exact}")


def run_demo(n: int = 8_000, n_test: int = 2_000, n_exact: int = 1_000, num_samples: int = 96,
             max_iter: int = 40, seed: int = 0, progress: bool = True) -> dict:
    """Fit an exact ARD GP on ``n_exact`` rows and an FSARD feature GP on all ``n`` rows of :func:`make_waves`.

    The rows are :func:`demo_data`'s.  Same seed, same numbers (the seconds aside).

    Args:
        n: training rows, all of them given to the feature GP.
        n_test: test rows.
        n_exact: the first ``n_exact`` training rows, given to the exact GP (at most ``n``).
        num_samples: frequencies M of the FSARD kernel (D = 2M features).
        max_iter: L-BFGS iterations of each model's final optimisation.
        seed: seed of the rows, the random features and the restarts.
        progress: show the fits' progress bars.

    Returns:
        ``{"problem", "n_train", "n_test", "n_exact", "seed", "results", "models", "data"}``; ``results``
        holds one dict per row of the table (model, rows, fit_seconds, iterations, rmse, rmse_f, nlpd,
        coverage95), the yardsticks first; ``models`` the fitted exact and feature GPs, ``data`` the
        tensors (x, y, x_test, y_test, f_test).

    Raises:
        ValueError: for sizes that are not positive integers, ``n_exact`` over ``n``, or a bad seed.

    Example:
        >>> from alacarte.demo import run_demo
        >>> result = run_demo(n=200, n_test=50, n_exact=50, num_samples=8, max_iter=2, progress=False)
        >>> [(row["model"], row["rows"]) for row in result["results"]]  # doctest: +NORMALIZE_WHITESPACE
        [('predict the training mean', 200), ('the true f, noise sd 0.2', None), ('exact ARD GP', 50),
         ('FSARD feature GP (D = 16)', 200)]
    """
    _check_sizes(n, n_test, n_exact, num_samples, max_iter)
    data = demo_data(n, n_test, check_seed(seed, "--seed"))
    exact = make_model("exact-ard", 3)
    feature = make_model("fsard", 3, num_samples=num_samples, seed=seed)
    rows = _yardsticks(data)
    rows.append(_fit_and_score("exact ARD GP", exact, n_exact, data, max_iter, seed, progress))
    rows.append(_fit_and_score(f"FSARD feature GP (D = {2 * num_samples})", feature, n, data, max_iter, seed,
                               progress))
    return {"problem": PROBLEM, "n_train": n, "n_test": n_test, "n_exact": n_exact, "seed": seed,
            "results": rows, "models": {"exact": exact, "feature": feature}, "data": data}


def _cell(value, spec: str, width: int) -> str:
    return f"{'—':>{width}}" if value is None else f"{value:>{width}{spec}}"


def format_table(result: dict) -> str:
    """The demo's printed report: the problem, one table row per model, and the comparison in words
    (an example: the module's docstring)."""
    lines = [result["problem"],
             f"{result['n_train']} training rows, {result['n_test']} test rows, seed {result['seed']}",
             f"{'model':<34} {'rows':>6} {'fit s':>7} {'RMSE':>7} {'RMSE f':>7} {'NLPD':>7} {'95% cover':>9}"]
    for r in result["results"]:
        lines.append(f"{r['model']:<34} {_cell(r['rows'], 'd', 6)} {_cell(r['fit_seconds'], '.1f', 7)} "
                     f"{r['rmse']:>7.3f} {r['rmse_f']:>7.3f} {r['nlpd']:>7.3f} {r['coverage95']:>9.3f}")
    exact, feature = result["results"][-2:]
    lines.append("RMSE: against the noisy test targets; RMSE f: against the noise-free function.")
    lines.append(f"{feature['model']} on all {feature['rows']} rows vs {exact['model']} on {exact['rows']}: "
                 f"RMSE {feature['rmse']:.3f} vs {exact['rmse']:.3f}, NLPD {feature['nlpd']:.3f} vs {exact['nlpd']:.3f}.")
    return "\n".join(lines)


def _pyplot_or_none():
    """matplotlib's pyplot (non-interactive backend), or ``None`` where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _slice_panel(ax, result: dict) -> None:
    """Both models' predictive means and 95% bands of f along x₁, at x₂ = x₃ = 0, beside the truth."""
    grid = torch.zeros(300, 3, dtype=torch.float64)
    grid[:, 0] = torch.linspace(-1, 1, 300, dtype=torch.float64)
    truth = np.sin(2 * np.pi * grid[:, 0].numpy()) + 0.5 * np.sin(np.pi * grid[:, 0].numpy())
    ax.plot(grid[:, 0], truth, color="black", lw=1.5, label="true f")
    models = (result["models"]["exact"], result["models"]["feature"])
    for row, model, colour in zip(result["results"][-2:], models, ("tab:orange", "tab:blue")):
        pred = model.predict(grid)
        mean, half = pred.mean.numpy(), 1.96 * pred.variance.sqrt().numpy()
        ax.plot(grid[:, 0], mean, color=colour, label=f"{row['model']} ({row['rows']} rows)")
        ax.fill_between(grid[:, 0], mean - half, mean + half, color=colour, alpha=0.25)
    ax.set_xlabel("x₁ (x₂ = x₃ = 0)")
    ax.set_ylabel("f")
    ax.set_title("predictive mean and 95% band of f")
    ax.legend(fontsize=8)


def save_demo_figure(result: dict, path: str | Path) -> Path | None:
    """A PNG of the predictive bands along a slice and the FSARD kernel's learned spectrum.

    Args:
        result: what :func:`run_demo` returned.
        path: the file to write (PNG).

    Returns:
        ``path``, or ``None`` where matplotlib is not installed (nothing is written).

    Example:
        >>> from alacarte.demo import run_demo, save_demo_figure
        >>> result = run_demo(n=200, n_test=50, n_exact=50, num_samples=8, max_iter=2, progress=False)
        >>> save_demo_figure(result, "demo.png")
        PosixPath('demo.png')
    """
    from .plotting import plot_spectrum, save_figure

    plt = _pyplot_or_none()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    try:
        _slice_panel(axes[0], result)
        plot_spectrum(result["models"]["feature"].covar_module, ax=axes[1])
        axes[1].set_title("FSARD: learned spectral radii")
    except BaseException:
        plt.close(fig)
        raise
    return save_figure(fig, path)



def add_arguments(parser) -> None:
    """The ``alacarte demo`` options, added to its ``argparse`` parser."""
    parser.add_argument("--n", type=int, default=8_000, help="training rows, all given to the FSARD GP "
                                                             "(default 8000)")
    parser.add_argument("--n-test", type=int, default=2_000, help="test rows (default 2000)")
    parser.add_argument("--n-exact", type=int, default=1_000,
                        help="training rows given to the exact ARD GP (default 1000: about the FSARD fit's time)")
    parser.add_argument("--num-samples", type=int, default=96,
                        help="frequencies M of the FSARD kernel (D = 2M features; default 96)")
    parser.add_argument("--max-iter", type=int, default=40,
                        help="L-BFGS iterations of each model's final optimisation (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rows, features and restarts (default 0)")
    parser.add_argument("--plot", default="alacarte-demo.png", metavar="PATH",
                        help="picture to write (default alacarte-demo.png; skipped without matplotlib)")


def command(args) -> int:
    """``alacarte demo``: run the demo, print its table (or JSON) and write its picture.

    It runs on one torch thread unless ``OMP_NUM_THREADS`` says otherwise: its matrices are small
    (8 000 × 192, 1 000 × 1 000), and on 2 cores shared with other jobs two threads waited on each
    other at every parallel step — the demo took 105–119 s with two, 39 s with one."""
    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    try:
        result = run_demo(args.n, args.n_test, args.n_exact, args.num_samples, args.max_iter, args.seed,
                          progress=not args.quiet)
        figure = save_demo_figure(result, args.plot)
    finally:
        torch.set_num_threads(threads)
    if args.json:
        report = {k: v for k, v in result.items() if k not in ("models", "data")}
        print(json.dumps({**report, "figure": None if figure is None else str(figure)}))
        return 0
    print(format_table(result))
    print(f"picture: {figure}" if figure is not None else
          "picture skipped: matplotlib is not installed (pip install 'alacarte[plot]')")
    return 0
