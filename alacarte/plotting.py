"""Pictures of a trained kernel: its learned spectral density and its input relevances.

matplotlib is an optional extra (``pip install alacarte[plot]``), imported only
when a picture is drawn.

* GM: the marginal spectral density of every input dimension,
  Σ_q w_q ½[N(ω; μ_qj, σ_qj²) + N(ω; −μ_qj, σ_qj²)] (per unit of the data's column
  given the model's ``input_scale``, as ``alacarte plot`` does);
* PWL: the radial density Σ_c π_c hat_c(r);
* FSARD / FSGBARD / Fastfood RBF: histogram of the radii against the χ_p
  density they were drawn from;
* relevances: ``kernel.relevance`` — π for simplex-ARD kernels, else inverse
  lengthscales (GM: Σ_q w_q σ_qj; SSGPR: RMS frequency per
  input), normalised to sum to one.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from .features.fastfood import padded_dim
from .kernels import (
    FastfoodRBFKernel,
    FeatureKernel,
    PiecewiseLinearRadialKernel,
    SpectralMixtureFastfoodKernel,
)

if TYPE_CHECKING:  # matplotlib is optional (the plot extra): imported only to draw
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["relevance", "shown_inputs", "plot_spectrum", "plot_relevance", "save_kernel_figure", "save_figure"]

_MAX_PANELS = 8


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("pictures need matplotlib: pip install 'alacarte[plot]'") from err
    return plt


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def relevance(kernel: FeatureKernel) -> np.ndarray:
    """Relative importance of each input dimension (non-negative, sums to one): ``kernel.relevance``.

    π for simplex-ARD kernels (exact zeros for dropped inputs)."""
    if len(kernel.batch_shape):
        raise ValueError("relevance supports kernels without batch_shape")
    return _numpy(kernel.relevance)


def shown_inputs(kernel: FeatureKernel) -> np.ndarray:
    """The inputs a per-input picture draws: all of them, or the :data:`_MAX_PANELS` most relevant in
    input order (a panel per input stops being readable beyond that)."""
    if kernel.num_dims <= _MAX_PANELS:
        return np.arange(kernel.num_dims)
    return np.sort(np.argsort(-relevance(kernel), kind="stable")[:_MAX_PANELS])


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG (whatever its suffix) and close it, written or not."""
    plt = _pyplot()
    try:
        fig.tight_layout()
        path = Path(path)
        # Without a suffix matplotlib writes path + ".png", not the file asked for (and returned).
        fig.savefig(path, dpi=100, format=None if path.suffix else "png")
    finally:
        plt.close(fig)
    return path


def _flat_axes(ax, panels: int, what: str) -> np.ndarray:
    """The user's axes (one, a sequence, a grid from ``plt.subplots(2, 2)``) flattened, at least ``panels``."""
    ax = np.atleast_1d(ax).ravel()
    if ax.size < panels:
        raise ValueError(f"{what}: ax must hold {panels} axes, got {ax.size}; or leave ax=None")
    return ax


def _check_names(kernel: FeatureKernel, names: list[str] | None) -> None:
    if names is not None and len(names) != kernel.num_dims:
        raise ValueError(f"names has {len(names)} entries but the kernel has {kernel.num_dims} inputs")


def plot_spectrum(kernel: FeatureKernel, ax: Axes | Sequence[Axes] | None = None, names: list[str] | None = None,
                  input_scale: Tensor | np.ndarray | None = None) -> Axes | np.ndarray:
    """Draw ``kernel``'s spectral density; returns the axes (one per panel for GM, titled ``names``).

    Args:
        kernel: a GM, PWL or Fastfood RBF kernel (FSARD, FSGBARD, Fastfood ARD or isotropic),
            without batch shape.
        ax: where to draw (default: a new figure): one Axes, a sequence or a grid of them.
            GM draws one panel per input — for the 8 most relevant inputs where there are more,
            in input order, the first panel saying how many are left out — and needs that many
            axes; the others draw one panel, in the first.
        names: the inputs' names, one per input (default: ``input 0``, ``input 1``, …).
        input_scale: the units of the data per unit of the kernel's input — a model's
            ``input_scale``, since it standardises x before its kernel sees it. GM's frequencies are
            then drawn per unit of the data's columns (ω / s, density × s); without it, per unit
            of the kernel's input. (The radial pictures are of ARD-scaled inputs, free of units.)

    Returns:
        The axes drawn in (for GM a numpy array of them, one per panel).

    Raises:
        ValueError: for another kernel, a batched one, ``names`` of another length, too few
            axes, or an ``input_scale`` that is not d positive finite numbers.
        ImportError: if matplotlib is not installed (``pip install 'alacarte[plot]'``).
    """
    _check_names(kernel, names)
    plt = _pyplot()
    if len(kernel.batch_shape):
        raise ValueError("plot_spectrum supports kernels without batch_shape")
    if isinstance(kernel, SpectralMixtureFastfoodKernel):
        w, mu, sigma = _numpy(kernel.weights), _numpy(kernel.means), _numpy(kernel.scales)
        scale = np.ones(kernel.num_dims) if input_scale is None else _numpy(torch.as_tensor(input_scale)).reshape(-1)
        if scale.shape != (kernel.num_dims,) or not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"input_scale must hold {kernel.num_dims} positive finite numbers, got {scale.tolist()}")
        shown = shown_inputs(kernel)
        if ax is None:
            _, ax = plt.subplots(1, len(shown), figsize=(3 * len(shown), 2.6), squeeze=False)
            ax = ax[0]
        ax = _flat_axes(ax, len(shown), f"a GM spectrum is drawn in one panel per input (at most {_MAX_PANELS})")
        share = relevance(kernel)
        for panel, j in enumerate(shown):
            span = np.abs(mu[:, j]).max() + 4 * sigma[:, j].max()
            omega = np.linspace(-span, span, 400)
            dens = sum(
                wq * 0.5 * (stats.norm.pdf(omega, m, s) + stats.norm.pdf(omega, -m, s))
                for wq, m, s in zip(w, mu[:, j], sigma[:, j])
            )
            ax[panel].plot(omega / scale[j], dens * scale[j])
            ax[panel].set_title(f"{names[j] if names is not None else f'input {j}'} ({share[j]:.0%} relevance)")
            ax[panel].set_xlabel(f"ω (rad / unit of {names[j]})" if input_scale is not None and names
                                 else "ω (rad / unit)")
        ax[0].set_ylabel("spectral density")
        if len(shown) < kernel.num_dims:
            left = 1 - share[shown].sum()
            ax[0].text(0.02, 0.98, f"{len(shown)} most relevant of {kernel.num_dims} inputs;\n"
                       f"{kernel.num_dims - len(shown)} not drawn hold {left:.0%} of the relevance",
                       transform=ax[0].transAxes, va="top", fontsize=7)
        return ax
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    elif not hasattr(ax, "plot"):  # axes as GM takes them (a list, a grid): AttributeError 'list' … 'plot'
        ax = _flat_axes(ax, 1, "this spectrum is drawn in one panel")[0]
    if isinstance(kernel, PiecewiseLinearRadialKernel):
        a, b, w = _numpy(kernel.modes), _numpy(kernel.half_widths), _numpy(kernel.weights)
        r = np.linspace(0, (a + b).max() * 1.05, 500)
        dens = sum(wc * np.clip(bc - np.abs(r - ac), 0, None) / bc**2 for ac, bc, wc in zip(a, b, w))
        ax.plot(r, dens, label="learned radial density")
        ax.set_xlabel("radius r of ω (ARD-scaled input)")
    elif isinstance(kernel, FastfoodRBFKernel):
        radii = _numpy(kernel.radius).reshape(-1)
        p = padded_dim(kernel.num_dims)
        ax.hist(radii, bins=min(60, max(10, radii.size // 20)), density=True, alpha=0.6, label="radii")
        r = np.linspace(0, radii.max() * 1.05, 400)
        # Fastfood draws s_i ~ χ_p in the padded dimension p, not in d.
        padding = f", {kernel.num_dims} inputs padded to {p}" if p != kernel.num_dims else ""
        ax.plot(r, stats.chi.pdf(r, p), label=f"initial density of s_i (χ_{p}{padding})")
        ax.set_xlabel("radius s_i of ω (ARD-scaled input)")
    else:
        raise ValueError(f"no spectrum picture for {type(kernel).__name__}: pictures exist for GM, PWL and the "
                         "Fastfood RBF kernels (FSARD, FSGBARD, Fastfood ARD and isotropic); plot_relevance "
                         "draws any kernel's input relevances")
    ax.set_ylabel("density")
    ax.legend()
    return ax


def plot_relevance(kernel: FeatureKernel, ax: Axes | None = None, names: list[str] | None = None,
                   draws: np.ndarray | None = None) -> Axes:
    """Bar plot of :func:`relevance` (any feature kernel without batch shape); returns the axes.

    Given ``draws`` — the relevances of K fits on independent feature draws, (K, d), e.g.
    :attr:`~alacarte.AlaCarteRegressor.relevance_draws_` — the bars are their mean and each draw is
    a dot, so an input whose relevance one draw reads differently from the others shows it.

    Args:
        kernel: the kernel (of one draw).
        ax: where to draw (default: a new figure).
        names: the inputs' names, one per input (default: their indices).
        draws: per draw, the relevance of each input (K, d); default: ``kernel``'s alone.
    """
    _check_names(kernel, names)
    plt = _pyplot()
    values = relevance(kernel)
    if draws is not None:
        draws = np.asarray(draws, dtype=float)
        if draws.ndim != 2 or draws.shape[1] != values.size:
            raise ValueError(f"draws must have shape (K, {values.size}), got {draws.shape}")
        values = draws.mean(0)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.35 * values.size + 1), 3))
    labels = names if names is not None else [str(j) for j in range(values.size)]
    ax.bar(range(values.size), values, label=None if draws is None else f"mean of {len(draws)} feature draws")
    if draws is not None:
        ax.scatter(np.tile(np.arange(values.size), len(draws)), draws.reshape(-1), s=9, color="black",
                   zorder=3, label="one draw")
        ax.legend(fontsize="small")
    ax.set_xticks(range(values.size), labels, rotation=90 if values.size > 12 else 0)
    ax.set_ylabel("relevance")
    ax.set_xlabel("input")
    return ax


def save_kernel_figure(kernel: FeatureKernel, path: str | Path, title: str | None = None,
                       names: list[str] | None = None, input_scale: Tensor | np.ndarray | None = None,
                       draws: np.ndarray | None = None) -> Path:
    """One PNG with the spectrum (top) and the relevances (bottom, inputs labelled ``names``) of ``kernel``.

    Args:
        kernel: a kernel :func:`plot_spectrum` draws.
        path: the file to write (PNG, whatever its suffix).
        title: the figure's title (default: the kernel's class name).
        names, input_scale: as for :func:`plot_spectrum`.
        draws: as for :func:`plot_relevance`.

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

    Raises:
        ValueError: as :func:`plot_spectrum`; no file is written and no figure left open.
    """
    plt = _pyplot()
    panels = len(shown_inputs(kernel)) if isinstance(kernel, SpectralMixtureFastfoodKernel) else 1
    fig = plt.figure(figsize=(max(6, 3 * panels), 6.2))
    try:
        grid = fig.add_gridspec(2, panels)
        spectrum_axes = [fig.add_subplot(grid[0, j]) for j in range(panels)]
        plot_spectrum(kernel, ax=spectrum_axes if panels > 1 else spectrum_axes[0], names=names,
                      input_scale=input_scale)
        plot_relevance(kernel, ax=fig.add_subplot(grid[1, :]), names=names, draws=draws)
        fig.suptitle(title or type(kernel).__name__)
    except BaseException:
        plt.close(fig)
        raise
    return save_figure(fig, path)
