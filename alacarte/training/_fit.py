"""The training entry point, :func:`fit`, in its stages: the settings are checked, the data
prepared (standardised, streamed or split into held-out rows), the optimisations run
(:mod:`alacarte.training._stages`), and the result checked for what to warn about."""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .._allocator import reuse_freed_memory
from .._checkpoint import FitCheckpoint, checkpoint_path, data_fingerprint, model_fingerprint
from .._validation import (
    check_bool,
    check_learnable_targets,
    check_nonnegative_int,
    check_positive_int,
    check_real,
    check_seed,
)
from ..holdout import HeldOut, resolve_fraction, split_rows
from ..init import check_initializable
from ..models import ExactRBFGP, FeatureGP
from .._simplex_step import SimplexStep
from ..streaming import ChunkedData, as_chunked_data, is_streamed_input
from ..woodbury import collect_jitter
from ._diagnostics import warn_about_jitter, warn_if_float32_loss_is_off, warn_if_noise_at_lower_bound
from ._history import FitHistory
from ._stages import Training

__all__ = ["fit"]


def fit(
    model: FeatureGP | ExactRBFGP,
    x,
    y=None,
    *,
    optimizer: str = "lbfgs",
    max_iter: int = 100,
    restarts: int = 5,
    restart_iter: int = 15,
    lr: float | None = None,
    tolerance: float = 1e-7,
    standardize: bool = True,
    seed: int | None = 0,
    progress: bool = True,
    chunk_size: int | None = None,
    memory_budget: int | None = None,
    statistics_dtype: torch.dtype | None = None,
    checkpoint: str | os.PathLike | None = None,
    validation_fraction: float | str = "auto",
) -> FitHistory:
    """Fit a GP's hyperparameters by maximising its marginal likelihood.

    Inputs are standardised per column and targets to mean 0 / std 1 (stored in
    the model, so :meth:`~alacarte.FeatureGP.predict` answers in original units).
    With ``restarts = k ≥ 1``, k data-driven initialisations (:mod:`alacarte.init`;
    the first at the median pair distance, the others at random quantiles drawn
    from ``seed``) are each optimised for ``restart_iter`` iterations from the
    model's state at the call; the best marginal likelihood is kept and
    optimised for ``max_iter`` more.  ``restarts=0`` trains from the model's
    current hyperparameters as they are.  A kernel's
    :attr:`~alacarte.FeatureKernel.nested_parameters` (FSGBARD's blocks) are held
    where they are during the restarts and learned in the final optimisation.

    **Held-out rows** (by default 20% for a feature GP with rows in memory;
    :func:`~alacarte.holdout.resolve_fraction`).  That share of the rows (at most
    5 000; none below 10 rows) is held out: the marginal likelihood is maximised on
    the others, every iterate is scored by the held-out rows' negative log
    predictive density at its best overall variance scale, each optimisation
    (restart, final, refit) ends at its best-scored iterate and stops after 20
    iterations without a better one, the restarts and the refit are chosen by that
    score, and then σ² and the scale of σ_f² and σ² are set to minimise it (σ² may
    go below the noise constraint's lower bound, which guards the likelihood, not
    the held-out rows; the bound is then lowered with it).  The scale widens the
    band between the rows but no latent variance past the expected squared error of
    the predictive mean under the prior the likelihood fitted, σ_f² before the scale
    plus the mean's distance from the prior mean squared (``model.band_scale``).  The
    posterior is conditioned on all rows.  Learned spectra otherwise over-fit the
    likelihood — they tune the finite feature map until it interpolates the
    training targets — and a finite map's posterior variance between the training
    rows is too small; both make the predictive intervals far too narrow
    (:mod:`alacarte.holdout`; docs/calibration.md).  A simplex-ARD kernel's exact
    zeros are where the likelihood's path ends, so its optimisations run their course
    on the kept rows and the held-out rows only set σ² and the scale.
    ``validation_fraction=0`` fits on all rows by marginal likelihood alone, as the
    À la carte paper did.

    A final optimisation that ends with the noise variance σ² at its lower
    bound is run once more, for ``max_iter`` iterations, from σ² = 0.1 × the
    (standardised) target variance and the other hyperparameters where they
    ended; the lower loss is kept.  Near the bound the constraint's softplus
    flattens the gradient, so the optimiser can stall there although the
    likelihood is better inside (exact ARD on SE1, n = 2000: 1.223 per point
    at the bound, 1.196 with σ² = 0.139).  A noise that is not trained
    (``requires_grad`` off) is left alone.

    **Streamed training** (:class:`~alacarte.FeatureGP` only).  Given a
    memory-mapped array (``np.load(path, mmap_mode="r")``), a re-iterable of
    ``(x, y)`` chunks (a ``DataLoader``; ``y=None``), a
    :class:`~alacarte.streaming.ChunkedData`, or any of ``chunk_size``,
    ``memory_budget``, ``statistics_dtype``, the likelihood and its exact
    gradient are streamed over chunks of rows (:mod:`alacarte.streaming`):
    memory O(chunk·D + D²) whatever n, and neither the rows nor their features
    are held.  Column means and standard deviations are streamed too; restarts
    take their lengthscales from pair distances among the first 10 000 rows and
    the mean, noise and signal variance from all the targets' streamed moments;
    the posterior for prediction is streamed at the end.  For several processes see :mod:`alacarte.distributed`.

    **Resuming a killed fit.**  With ``checkpoint=path`` the fit's progress —
    the model, the optimiser's memory, the restarts' random generator and the stage
    (which restart, the final optimisation, the noise refit) — is written to
    ``path`` at the first iteration of every stage and then every 10 seconds,
    atomically (a kill mid-write leaves the previous checkpoint).  Calling
    ``fit`` again with the same model as built, data, settings and path resumes
    from it and ends bit for bit where the uninterrupted fit would have (run
    with the same torch and thread settings: round-off depends on them); once
    the fit has finished the file holds its result, and the call returns it at
    once.  A checkpoint of another fit (other settings, data, or a model with
    other parameters or random features) is refused with a ``ValueError``:
    delete it to fit from the start.  Chunks must come in the same order to
    resume (a shuffling ``DataLoader`` cannot: its sums round otherwise).  In a distributed fit rank 0 reads and
    writes the file.

    Args:
        model: a :class:`~alacarte.FeatureGP` or :class:`~alacarte.ExactRBFGP`.
        x, y: training data, (n, d) and (n,), tensors or (memory-mapped) arrays;
            or ``x`` a re-iterable of ``(x, y)`` chunks and ``y=None``.
        optimizer: ``"lbfgs"`` (strong-Wolfe line search; the default) or ``"adam"``.
        max_iter: iterations of the final optimisation.
        restarts: number of random initialisations to try (0: none).
        restart_iter: iterations per restart.
        lr: step size (default 1.0 for L-BFGS, 0.05 for Adam).
        tolerance: stop when the loss changes by at most ``tolerance × max(1, |loss|)``
            for three iterations in a row (relative to the loss, absolute where ``|loss| < 1``:
            the loss per point is often near 0).
        standardize: standardise inputs and targets (recommended).
        seed: seeds the restarts, for bit-for-bit reproducible fits (torch's global generator is
            neither used nor reset: a reset would make every kernel built with ``seed=None`` after a fit
            draw the same random features).
        progress: show a progress bar.
        chunk_size: rows per chunk of the streamed likelihood.
        memory_budget: bytes one streamed evaluation may take (default 256 MiB;
            sets the chunk size; give this or ``chunk_size``); the model keeps it as its
            ``memory_budget``, which bounds each chunk of its predictions too.
        statistics_dtype: accumulate ΦᵀΦ, Φᵀr, rᵀr and the loss in this dtype,
            e.g. ``torch.float64`` for a float32 model: float32 features with
            float64 accuracy of the likelihood.
        checkpoint: a file that keeps the fit's progress, so that a killed fit
            resumes (see above); ``None``: none.
        validation_fraction: the share of the rows held out to score iterates and choose σ² (see
            above), in [0, 1); 0: none; ``"auto"``: 0.2 for a feature GP with rows in memory, else 0.

    Returns:
        The :class:`~alacarte.training.FitHistory`; the model is left in eval mode.

    Raises:
        ValueError: bad data (non-finite, wrong shape, fewer than 2 rows, a
            constant target, magnitudes that overflow) or a bad setting.

    Example:
        >>> import torch
        >>> from alacarte import FeatureGP, FSARDKernel, fit
        >>> generator = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 3, generator=generator) * 4 - 2
        >>> y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(200, generator=generator)
        >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
        >>> history = fit(model, x, y, max_iter=30, restarts=2, restart_iter=5)
        >>> len(history.restart_losses), history.loss[-1] < history.loss[0]
        (2, True)
        >>> model.training                           # left in eval mode, ready to predict
        False
    """
    optimizer, max_iter, restarts, restart_iter, lr, tolerance, seed, standardize = _check_settings(
        optimizer, max_iter, restarts, restart_iter, lr, tolerance, seed, standardize)
    if checkpoint is not None:  # before any pass over the data: a bad path must not cost one
        checkpoint = checkpoint_path(checkpoint)
    given_model = model_fingerprint(model) if checkpoint is not None else None
    _check_model(model, restarts)
    data = _prepare_data(model, x, y, restarts=restarts, standardize=standardize, seed=seed,
                         validation_fraction=validation_fraction, chunk_size=chunk_size,
                         memory_budget=memory_budget, statistics_dtype=statistics_dtype)
    store = None
    if checkpoint is not None:
        key = {
            "optimizer": optimizer, "max_iter": max_iter, "restarts": restarts,
            "restart_iter": restart_iter if restarts else None, "lr": lr, "tolerance": float(tolerance),
            "standardize": standardize, "seed": seed, "model": given_model,
            "validation_fraction": data.fraction, **_data_key(model, data),
        }
        store = FitCheckpoint(checkpoint, key, data.chunked)
    total = max_iter + restarts * restart_iter
    with (tqdm(total=total, disable=not progress, desc="fit", leave=False) as bar, collect_jitter() as jitters,
          reuse_freed_memory()):
        history = Training(
            model, *data.fit_rows, data.initial, data.chunked,
            optimizer=optimizer, max_iter=max_iter, restarts=restarts, restart_iter=restart_iter, lr=lr,
            tolerance=tolerance, seed=seed, standardize=standardize, bar=bar, jitters=jitters, checkpoint=store,
            held_out=data.held_out, all_rows=data.all_rows,
        ).run()
    _finish(model, data, jitters, standardize)
    return history


def _check_settings(optimizer, max_iter, restarts, restart_iter, lr, tolerance, seed, standardize) -> tuple:
    """The settings, checked (and those that may come as numpy scalars or strings made plain)."""
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    max_iter = check_positive_int(max_iter, "max_iter")
    restarts = check_nonnegative_int(restarts, "restarts")
    if restarts:
        restart_iter = check_positive_int(restart_iter, "restart_iter")
    if lr is not None:
        lr = check_real(lr, "lr", 0)
    if not (isinstance(tolerance, numbers.Real) and tolerance >= 0):
        raise ValueError(f"tolerance must be a non-negative number, got {tolerance!r}")
    seed = check_seed(seed)
    standardize = check_bool(standardize, "standardize")  # a truthy "no" or "False" would standardise
    return optimizer, max_iter, restarts, restart_iter, lr, tolerance, seed, standardize


def _check_model(model, restarts: int) -> None:
    """Refuse a model :func:`fit` cannot train: every parameter frozen, or a batch of models."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("every parameter of the model is frozen (requires_grad=False): there is nothing to fit; "
                         "unfreeze one, or use the model as it is (model.eval())")
    # The mean's batch_shape, not its .constant: a ZeroMean or LinearMean of the user's has none (fit trains them
    # with restarts=0).  GPyTorch's LinearMean keeps no batch_shape either, and passes as unbatched.
    batched = [name for name, part in (("kernel", model.covar_module.batch_shape),
                                       ("mean", getattr(model.mean_module, "batch_shape", torch.Size())),
                                       ("noise", model.likelihood.noise.shape[:-1])) if len(part)]
    if batched:
        # One loss per member: its restarts, convergence and history are per model, and a batch of losses
        # has no backward ('grad can be implicitly created only for scalar outputs').
        raise ValueError(f"fit trains one model at a time; this one has a batch_shape in its {', '.join(batched)}: "
                         "fit each member, or train the batch with a GPyTorch loop on the summed loss")
    if restarts:
        check_initializable(model)


@dataclass
class _Data:
    """The training data as :func:`fit` prepared it.

    Attributes:
        x, y: all the rows, standardised (``x`` the :class:`~alacarte.streaming.ChunkedData` and ``y``
            ``None`` where they are streamed).
        raw: the rows as given (``None`` where streamed), which the checkpoint's fingerprint reads.
        fit_rows: the rows the likelihood is maximised on (``(x, y)`` but for held-out rows).
        initial: what restarts take their initial values from (``None`` without restarts).
        held_out: the held-out rows' score, or ``None``.
        fraction: the share of the rows held out, as resolved.
    """

    x: torch.Tensor | ChunkedData
    y: torch.Tensor | None
    raw: tuple[torch.Tensor, torch.Tensor] | None
    fit_rows: tuple
    initial: tuple | None
    held_out: HeldOut | None
    fraction: float

    @property
    def chunked(self) -> ChunkedData | None:
        return self.x if isinstance(self.x, ChunkedData) else None

    @property
    def all_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """All the rows where the likelihood sees only some of them, else ``None``."""
        return None if self.held_out is None else (self.x, self.y)


def _prepare_data(model, x, y, *, restarts: int, standardize: bool, seed: int | None, validation_fraction,
                  chunk_size, memory_budget, statistics_dtype) -> _Data:
    """Read and check the data, standardise it, and hold rows out; the model is given its training rows
    (and an unscaled band: σ_f² is the likelihood's until the held-out rows scale it)."""
    streamed = is_streamed_input(x, y, chunk_size, memory_budget, statistics_dtype)
    fraction = resolve_fraction(validation_fraction, model, streamed)  # before any pass over the data
    if streamed:
        data = _chunked_data(model, x, y, chunk_size, memory_budget, statistics_dtype)
    elif y is None:
        raise ValueError("y is required when x is an array; pass y=None only with an iterable of (x, y) chunks")
    else:
        # Data, not variables: an x or y that requires grad would put the standardisation into every
        # loss's graph, whose buffers the first backward frees, so the next backward would fail.
        x, y = (t.detach() for t in model.check_data(x, y))
        check_learnable_targets(x.shape[0], float(y.min()), float(y.max()))
        raw = x, y
    if standardize and streamed:
        model.set_standardization(*data.moments(model))
    elif standardize:
        x, y = model.standardize(x, y)
    else:
        for name in ("input_offset", "target_offset"):
            getattr(model, name).zero_()
        for name in ("input_scale", "target_scale"):
            getattr(model, name).fill_(1.0)
    model.band_scale.fill_(1.0)
    if streamed:
        model.train_inputs, model.train_targets = None, None
        initial = data.sample(model) if restarts else None
        return _Data(data, None, None, (data, None), initial, None, fraction)
    rows = split_rows(x.shape[0], fraction, seed)
    held_out = None if rows is None else HeldOut(model, x[rows[1]], y[rows[1]])
    fit_rows = (x, y) if rows is None else (x[rows[0]], y[rows[0]])
    model.set_train_data(*fit_rows, strict=False)
    return _Data(x, y, raw, fit_rows, fit_rows, held_out, fraction)


def _chunked_data(model, x, y, chunk_size, memory_budget, statistics_dtype) -> ChunkedData:
    """Streamed rows, for a model that can stream its likelihood."""
    if not isinstance(model, FeatureGP):
        raise ValueError(
            f"{type(model).__name__} needs all rows in memory (its likelihood is O(n²) and does not "
            "decompose into sums over rows): streamed input, chunk_size, memory_budget and "
            "statistics_dtype are for FeatureGP"
        )
    if SimplexStep(model):
        raise ValueError(
            "simplex-ARD kernels train by projected gradient on the in-memory likelihood; streamed input "
            "(chunk_size, memory_budget, memory-mapped or chunked data) is not supported for them yet"
        )
    return as_chunked_data(x, y, chunk_size=chunk_size, memory_budget=memory_budget,
                           statistics_dtype=statistics_dtype)


def _data_key(model, data: _Data) -> dict:
    """What of the data a checkpoint must match (a pass over the data)."""
    chunked = data.chunked
    return {
        "chunk_rows": chunked.rows(model) if chunked is not None else None,
        "statistics_dtype": str(chunked.statistics_dtype) if chunked is not None else None,
        "data": data_fingerprint(chunked.chunks(model) if chunked is not None else [data.raw]),
    }


def _finish(model, data: _Data, jitters: list[float], standardize: bool) -> None:
    """Warn about what the fit ended at, and leave the model in eval mode, ready to predict."""
    warn_about_jitter(jitters)
    if isinstance(model, FeatureGP):
        warn_if_float32_loss_is_off(model, data.x, data.y)
    model.eval()
    streamed = data.chunked is not None
    warn_if_noise_at_lower_bound(model, None if streamed else data.x, None if streamed else data.y, standardize)
    if streamed:
        model.cache_posterior(data.chunked)
