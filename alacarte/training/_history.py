"""What :func:`~alacarte.training.fit` reports: :class:`FitHistory`."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FitHistory"]


@dataclass
class FitHistory:
    """What :func:`~alacarte.fit` did.

    Attributes:
        loss: the negative log marginal likelihood per data point (standardised units, log
            priors included) at the start of every iteration of the final optimisation (and of the noise
            refit, when it was kept); ``iterations`` is its length.
        seconds: wall-clock seconds of the whole fit (a resumed fit counts its earlier runs too).
        converged: whether the optimisation that ends ``loss`` stopped on ``tolerance`` before
            ``max_iter``.
        optimizer: ``"lbfgs"`` or ``"adam"``.
        restart_losses: the score each restart reached (``inf`` where it failed): the held-out
            loss where rows held out score the iterates (:func:`~alacarte.holdout.scores_iterates`),
            else the training loss.
        chosen_restart: the restart training continued from (the lowest score; ``None`` without restarts).
        noise_refit_loss: the score of the refit from a larger noise that :func:`~alacarte.fit`
            runs when the final optimisation ends with σ² at its lower bound — kept when it is
            lower than the score there — and ``None`` when it did not end there (or the noise
            is frozen).
        held_out_rows: the training rows held out of the likelihood to set the band and, but for
            simplex-ARD kernels, to score the iterates (:mod:`alacarte.holdout`); 0 when none were.
        validation_loss: the held-out rows' score (:class:`~alacarte.holdout.HeldOut`) at every
            iterate of the final optimisation (and of the noise refit, when kept) in order, its
            starting point first (empty when no rows score the iterates).
        best_iteration: the index into ``validation_loss`` of the iterate the model was left at
            (``None`` when no rows score the iterates).
        held_out_noise: the noise variance σ² (standardised units) then chosen by the held-out
            rows' score (:meth:`alacarte.holdout.HeldOut.calibrate`); ``None`` when no rows were
            held out or the noise or signal variance is not trained.
        held_out_scale: the factor s* by which that calibration multiplied σ_f² and σ² (``None`` likewise).
        final_loss: the negative log marginal likelihood per point (as ``loss``) of the model as
            :func:`~alacarte.fit` returns it — all the training rows, after the held-out calibration;
            ``None`` in a history read from a file that lacks it.
    """

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    converged: bool = False
    optimizer: str = "lbfgs"
    restart_losses: list[float] = field(default_factory=list)
    chosen_restart: int | None = None
    noise_refit_loss: float | None = None
    held_out_rows: int = 0
    validation_loss: list[float] = field(default_factory=list)
    best_iteration: int | None = None
    held_out_noise: float | None = None
    held_out_scale: float | None = None
    final_loss: float | None = None

    @property
    def iterations(self) -> int:
        """The number of iterations recorded in ``loss``."""
        return len(self.loss)
