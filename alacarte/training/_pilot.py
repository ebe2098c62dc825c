"""Hyperparameters fitted on a pilot — a row subsample, the kernel with fewer features — for a model
that then conditions on every row with all its features (docs/mathematics.md, "Pilot fits")."""
from __future__ import annotations

import copy
import math

import numpy as np
import torch

from .._validation import check_positive_int, check_seed
from ..factory import DEFAULT_SAMPLES, KERNEL_NAMES, widenable
from ..holdout import HeldOut, held_out_count, resolve_fraction
from ..init import signal_variance_parameter
from ..kernels import FeatureKernel
from ..mll import WoodburyMarginalLogLikelihood
from ..models import FeatureGP
from ..streaming import is_streamed_input
from ..woodbury import SufficientStatistics
from ._fit import fit
from ._history import FitHistory

__all__ = ["PILOT_ROWS", "PILOT_SAMPLES", "AUTO_PILOT_ABOVE", "AUTO_PILOT_SAMPLES", "fit_pilot", "resolve_pilot",
           "resolve_samples"]

#: Rows of the pilot fit.  Hyperparameters settle on far fewer rows than the posterior can use:
#: kin40k's GM fitted on 5 000 of 36 000 rows predicts better with every row (experiments/results/large_data_pilot.md).
PILOT_ROWS = 5000
#: Frequencies of the pilot's kernel (D = 1 024, the estimator's default).
PILOT_SAMPLES = 512
#: Training rows above which ``pilot_rows="auto"`` fits on a pilot of :data:`PILOT_ROWS`.  There a whole
#: fit's evaluations cost four times a pilot's and more, and the hyperparameters settle on the pilot's rows;
#: below it the pilot is a third of the rows or more and saves little (docs/calibration.md, "Above 20 000 rows").
AUTO_PILOT_ABOVE = 20_000
#: Frequencies of the model ``num_samples="auto"`` gives where a pilot fits its hyperparameters (D = 4 096):
#: its features cost O(nD²) once, not at every evaluation, and the rows can use them.
AUTO_PILOT_SAMPLES = 2048


def resolve_pilot(pilot_rows: int | str | None, kernel: str | FeatureKernel, n: int, select: bool = False,
                  num_samples: int | str = "auto", name: str = "pilot_rows") -> int | None:
    """The pilot's rows the estimator fits ``kernel`` (a name or a FeatureKernel) on for ``n`` training rows:
    ``pilot_rows`` itself, ``None`` for a fit on every row, or for ``"auto"`` :data:`PILOT_ROWS` where there
    are more than :data:`AUTO_PILOT_ABOVE` rows, the model is wider than the pilot (``num_samples``, the
    model's frequencies, ``"auto"`` or above :data:`PILOT_SAMPLES`), the kernel learns no value per frequency
    and no inputs are selected (:func:`~alacarte.selection.select_inputs` refits on every row), else ``None``.
    A model no wider than its pilot predicts better from a fit on every row (kin40k, GM at D = 1 024: test
    RMSE 0.100 against 0.119; docs/calibration.md, "Above 20 000 rows").

    Raises:
        ValueError: for anything but a positive int, ``None`` or ``"auto"``; a number of rows with
            ``select`` or with a kernel that cannot be widened.
    """
    if pilot_rows is None:
        return None
    if isinstance(pilot_rows, str):
        if pilot_rows != "auto":
            raise ValueError(f"{name} must be a positive integer, None or 'auto', got {pilot_rows!r}")
        wider = num_samples == "auto" or not isinstance(num_samples, str) and num_samples > PILOT_SAMPLES
        return PILOT_ROWS if n > AUTO_PILOT_ABOVE and wider and not select and widenable(kernel) else None
    rows = check_positive_int(pilot_rows, name)
    if select:
        raise ValueError(f"{name} does not combine with selecting inputs: select_inputs refits on every row")
    if not widenable(kernel):
        names = ", ".join(k for k in KERNEL_NAMES if widenable(k))
        raise ValueError(f"{name} needs a kernel that learns no value per frequency ({names}), got {kernel!r}")
    return rows


def resolve_samples(num_samples: int | str, pilot_rows: int | None, name: str = "num_samples") -> int:
    """A named kernel's frequencies: ``num_samples`` itself, or for ``"auto"`` :data:`AUTO_PILOT_SAMPLES` where
    a pilot fits the hyperparameters (``pilot_rows`` not ``None``) and :data:`~alacarte.factory.DEFAULT_SAMPLES`
    where the fit runs on every row.

    Raises:
        ValueError: for anything but a positive int or ``"auto"``.
    """
    if num_samples == "auto":
        return DEFAULT_SAMPLES if pilot_rows is None else AUTO_PILOT_SAMPLES
    if isinstance(num_samples, str):
        raise ValueError(f"{name} must be a positive integer or 'auto', got {num_samples!r}")
    return check_positive_int(num_samples, name)


def fit_pilot(model: FeatureGP, x, y, *, rows: int = PILOT_ROWS, num_samples: int = PILOT_SAMPLES,
              seed: int | None = 0, **options) -> FitHistory:
    """Fit a feature GP's hyperparameters on a pilot, then condition it on every row.

    The pilot is the model's kernel at ``num_samples`` frequencies
    (:meth:`~alacarte.FeatureKernel.widened`), fitted by :func:`fit` on ``rows`` rows drawn from
    ``seed``, standardised as all rows are.  Its hyperparameters carry over to the model, whose kernel
    is the same with its own features (more of them, as a rule: fitting costs O(rows·D_pilot²) per
    evaluation, the model's posterior O(n·D²) once).  The model is then conditioned on every row, and
    the overall scale of σ_f² and σ² — the width of the predictive band — is set on held-out rows
    (``validation_fraction`` of them, as many as :func:`fit` would hold out) drawn from outside the
    pilot where there are enough, each predicted from all other rows
    (:meth:`~alacarte.holdout.HeldOut.rescale`): more features explain more, so the pilot's band
    would be too wide.  ``validation_fraction=0`` keeps the pilot's band.

    Args:
        model: a :class:`~alacarte.FeatureGP` whose kernel learns no value per frequency (GM, PWL,
            Fastfood RBF/ARD, random kitchen sinks; not FSARD, FSGBARD or SSGPR).
        x, y: the training data, in memory.
        rows: the pilot's rows (all of them where there are fewer).
        num_samples: the pilot kernel's frequencies M (D = 2M).
        seed: draws the pilot's rows and the held-out rows, and is the pilot fit's ``seed``.
        **options: the pilot fit's other :func:`fit` settings (``restarts``, ``max_iter``,
            ``validation_fraction`` …), not ``standardize`` (the data are standardised on all rows).

    Returns:
        The pilot fit's :class:`FitHistory`, but for what describes the model: ``final_loss`` (its loss on
        every row), ``held_out_rows``, ``held_out_noise`` and ``held_out_scale`` (its band's).  The model is
        left in eval mode.

    Raises:
        ValueError: for a model other than a FeatureGP, a kernel that learns a value per frequency,
            streamed data, ``rows`` or ``num_samples`` not a positive integer, or ``standardize`` given.

    Example:
        >>> import torch
        >>> from alacarte import fit_pilot
        >>> from alacarte.factory import make_model
        >>> generator = torch.Generator().manual_seed(0)
        >>> x = torch.rand(3000, 2, generator=generator, dtype=torch.float64) * 4 - 2
        >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(3000, generator=generator, dtype=torch.float64)
        >>> model = make_model("gm", num_dims=2, num_samples=256)   # D = 512 on every row
        >>> history = fit_pilot(model, x, y, rows=1000, num_samples=32, max_iter=30, progress=False)
        >>> model.train_targets.shape, model.covar_module.num_features
        (torch.Size([3000]), 512)
    """
    if not isinstance(model, FeatureGP):
        raise ValueError(f"fit_pilot needs a FeatureGP (a kernel with explicit features), got {type(model).__name__}")
    if "standardize" in options:
        raise ValueError("fit_pilot standardises the data on all rows; it takes no standardize")
    if is_streamed_input(x, y, options.get("chunk_size"), options.get("memory_budget"),
                         options.get("statistics_dtype")):
        raise ValueError("fit_pilot needs the rows in memory (it conditions the model on all of them)")
    rows = check_positive_int(rows, "rows")
    pilot_kernel = model.covar_module.widened(num_samples)  # refuses a kernel with per-frequency values first
    seed = check_seed(seed)
    x, y = (t.detach() for t in model.check_data(x, y))
    x, y = model.standardize(x, y)
    order = torch.as_tensor(np.random.default_rng(seed).permutation(x.shape[0]), device=x.device)
    pilot = copy.deepcopy(model)
    pilot.covar_module = pilot_kernel
    picked = order[:rows]
    history = fit(pilot, x[picked], y[picked], standardize=False, seed=seed, **options)
    _take_hyperparameters(model, pilot)
    model.set_train_data(x, y, strict=False)
    held = held_out_count(x.shape[0], resolve_fraction(options.get("validation_fraction", "auto"), model, False))
    statistics, band = _conditioned(model, x[order[-held:]], y[order[-held:]]) if held else (
        model.training_statistics(), None)
    model.condition_on(statistics)
    with torch.no_grad():
        history.final_loss = -float(WoodburyMarginalLogLikelihood(model.likelihood, model).from_statistics(statistics))
    history.held_out_rows = held
    history.held_out_noise, history.held_out_scale = band or (None, None)
    return history


@torch.no_grad()
def _take_hyperparameters(model: FeatureGP, pilot: FeatureGP) -> None:
    """The pilot's learned state into the model: its kernel widened back to the model's own draw, its
    likelihood (σ² and its bound), mean and band scale."""
    kernel = model.covar_module
    model.covar_module.load_state_dict(pilot.covar_module.widened(kernel.num_samples, kernel.seed).state_dict())
    model.likelihood.load_state_dict(pilot.likelihood.state_dict())
    model.mean_module.load_state_dict(pilot.mean_module.state_dict())
    model.band_scale.copy_(pilot.band_scale)  # σ_f² comes scaled by the pilot's band


def _conditioned(model: FeatureGP, x_out: torch.Tensor, y_out: torch.Tensor
                 ) -> tuple[SufficientStatistics, tuple[float, float] | None]:
    """Set the band's scale on the held-out rows ``(x_out, y_out)``, each predicted from every other
    training row: (every row's statistics at the new scale, (σ², s*) or ``None`` where nothing was set).
    One pass over the rows: σ_f² times s multiplies ΦᵀΦ by s and Φᵀr by √s."""
    statistics = model.training_statistics()
    found = signal_variance_parameter(model)
    before = None if found is None else getattr(found[1], found[2]).detach().clone()
    band = HeldOut(model, x_out, y_out).rescale(statistics)
    if band is None:
        return statistics, None
    factor = getattr(found[1], found[2]).detach() / before
    if not torch.allclose(factor, torch.full_like(factor, band[1]), rtol=1e-12):  # held back by a constraint
        return model.training_statistics(), band
    return SufficientStatistics(statistics.gram * band[1], statistics.phi_r * math.sqrt(band[1]), statistics.r_r,
                                statistics.n), band
