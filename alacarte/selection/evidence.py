r"""Exact variable selection for a fitted simplex-ARD GP by the marginal likelihood's evidence.

The continuous fit alone does not give exact zeros for every irrelevant input.  With the
simplex size c learnable (or, for :class:`~alacarte.FSARDKernel`, the radii free) the
simplex constraint does not bind: its multiplier is 0 and an irrelevant input's π_j
sits where its own gradient vanishes, which a finite feature map and a finite sample make
a small positive weight for about half of them.  With c fixed above what the likelihood
wants, the multiplier is positive and the surplus *has* to go onto irrelevant inputs.

So each input in use is asked what it is worth: the rise of the total negative log
marginal likelihood, in nats, when its weight is set to 0 (the others' γ kept, nothing
refitted — an upper bound on the cost after a refit).  Twice the gain of an irrelevant
input is about χ²₁, so P(cost > t) ≤ e^{-t}: inputs costing less than
:math:`t = \log(d/\alpha)` are dropped (held at 0 by :meth:`~alacarte.kernels.base.FeatureKernel.drop_inputs_`),
which keeps about α irrelevant inputs in expectation; the GP is refitted and asked again.
Each input is asked with the others in place, so copies of one signal are each worth little
while their siblings stay: the weak inputs go together only where their joint cost is below
the same tail for χ²_k (:func:`joint_threshold`), else the cheapest half of them, and so on.

The χ²₁ count holds for the kernel, not for one finite draw of its features: a weight fitted
on a draw can fit that draw's chance features (an irrelevant input worth 10 nats on the
fitted draw, −7 on fresh ones).  With ``draws`` the cost is measured on fresh draws of the
kernel's random directions, where only the kernel's gain remains, at a point first fitted to
the mean likelihood over those draws: a cost is a rise from an optimum of what it measures,
and the point fitted on one draw is none on others (there a copy of an over-weighted signal
can "cost" −105 nats).  The model itself stays fitted on its own draw.
Where the features' expectation is the RBF/ARD kernel (``rbf_limit``), ``draws="exact"`` asks
that kernel itself, in closed form on up to :data:`EXACT_ROWS` rows: fresh finite draws
under-value an input whose effect needs more features than D (a fast oscillation), the kernel
does not.
"""
from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy import stats

from .._validation import varying_columns
from ..holdout import maximize_band_likelihood, resolve_fraction, split_rows
from ..init import signal_variance_parameter
from ..mll import homoskedastic_noise
from ..training import fit, negative_mll
from ..woodbury import cholesky_with_jitter
from ._over_draws import fit_over_draws

if TYPE_CHECKING:
    from ..models import FeatureGP

__all__ = ["select_inputs", "InputSelection", "ClosedFormEvidence"]


@dataclass
class InputSelection:
    """What :func:`select_inputs` did.

    Attributes:
        selected: indices of the inputs with non-zero weight at the end.
        costs: per input, the nats of total marginal likelihood its weight was worth when last asked
            (0 for inputs out of use then).
        threshold: the cost below which an input was dropped, ``log(d/level)``.
        rounds: refits done.
        entered: indices of the inputs brought back from 0 (kept or not), in the order they came.
    """

    selected: torch.Tensor
    costs: torch.Tensor
    threshold: float
    rounds: int
    entered: list[int]


def simplex_kernel(model: "FeatureGP") -> torch.nn.Module:
    """The model's one simplex-ARD kernel; ``ValueError`` where it has none, several, or a batched one."""
    kernels = [m for m in model.modules() if getattr(m, "simplex", False) and hasattr(m, "drop_inputs_")]
    if len(kernels) != 1 or len(kernels[0].batch_shape):
        raise ValueError(f"select_inputs needs a model with exactly one simplex kernel (simplex=True) without "
                         f"batch_shape, found {len(kernels)}")
    return kernels[0]


@torch.no_grad()
def input_costs(model: "FeatureGP", kernel: torch.nn.Module, draws: Sequence[int] = ()) -> torch.Tensor:
    """Per input, the rise of the total negative log marginal likelihood (nats, on the model's
    training data) when its weight alone is set to 0; 0 for inputs out of use.  With ``draws``
    (seeds), its mean over those fresh draws of the kernel's random features
    (:meth:`~alacarte.kernels.base.FeatureKernel.redrawn`), every learned parameter kept."""
    return _over_draws(kernel, draws, lambda: _costs_on_draw(model, kernel))


def _over_draws(kernel: torch.nn.Module, draws: Sequence[int], on_draw: Callable[[], object]):
    """``on_draw()`` on the fitted draw or, with ``draws`` (seeds), its mean over those fresh draws."""
    if not draws:
        return on_draw()
    total = 0
    for seed in draws:
        with kernel.redrawn(seed):
            total = total + on_draw()
    return total / len(draws)


@contextlib.contextmanager
def _rises(model: "FeatureGP", kernel: torch.nn.Module) -> Iterator[Callable[[torch.Tensor], float]]:
    """Within the block, ``rise(γ)``: the rise of the total negative log marginal likelihood (nats, on the
    model's training data) from its state on entry to the kernel's γ set to ``γ``; π and c restored after."""
    x, y = model.train_inputs[0], model.train_targets
    model.train()
    with model.inference_settings(), _restored_weights(kernel):
        base = float(negative_mll(model, x, y, backward=False))

        def rise(gamma: torch.Tensor) -> float:
            kernel._set_simplex_gamma(gamma)
            return (float(negative_mll(model, x, y, backward=False)) - base) * len(y)

        yield rise


@torch.no_grad()
def joint_cost(model: "FeatureGP", kernel: torch.nn.Module, inputs: Sequence[int], draws: Sequence[int] = ()) -> float:
    """The rise of the total negative log marginal likelihood (nats) when every input of ``inputs`` is set to 0
    at once, the others' γ kept; the mean over the fresh draws ``draws`` as for :func:`input_costs`."""
    trial = kernel.inverse_lengthscale().detach().clone()
    trial[..., list(inputs)] = 0

    def on_draw() -> float:
        with _rises(model, kernel) as rise:
            return rise(trial)

    return _over_draws(kernel, draws, on_draw)


def _costs_on_draw(model: "FeatureGP", kernel: torch.nn.Module) -> torch.Tensor:
    gamma = kernel.inverse_lengthscale().detach().clone()
    costs = torch.zeros(kernel.num_dims, dtype=torch.float64)
    with _rises(model, kernel) as rise:
        for j in torch.nonzero(gamma.reshape(-1) > 0).reshape(-1).tolist():
            trial = gamma.clone()
            trial[..., j] = 0
            # the others keep their γ (their direction, with c fixed); none left is no model
            costs[j] = math.inf if float(trial.sum()) <= 0 else rise(trial)
    return costs


@contextlib.contextmanager
def _restored_weights(kernel: torch.nn.Module) -> Iterator[None]:
    """The simplex kernel's π and c as they were on entry, whatever is tried within."""
    pi, size = kernel.simplex_weights.detach().clone(), kernel.simplex_size.detach().clone()
    try:
        yield
    finally:
        with torch.no_grad():
            kernel.simplex_weights.copy_(pi)
        if kernel.raw_simplex_size.requires_grad:
            kernel.simplex_size = size


#: Rows, at most, on which ``select_inputs(draws="exact")`` asks the kernel in closed form (an m×m
#: Cholesky factorisation per question); a seeded subsample of them beyond.
EXACT_ROWS = 5000


class ClosedFormEvidence:
    """The total negative log marginal likelihood (nats, up to a constant) of up to :data:`EXACT_ROWS`
    of a model's training rows under the kernel its RBF-limit simplex kernel's features approximate,
    σ_f² exp(−½‖γ ⊙ (x − x′)‖²), at the fitted γ, σ_f², σ² and mean, and how it moves when one γ_j does.

    Args:
        model: the :class:`~alacarte.FeatureGP`, with its training rows.
        kernel: its simplex kernel, whose class has ``rbf_limit``.
        seed: seed of the subsample where there are more rows than :data:`EXACT_ROWS`.
        rows: the indices of the training rows to read instead (any number: each question is an
            m×m factorisation).
    """

    def __init__(self, model: "FeatureGP", kernel: torch.nn.Module, seed: int | None = 0,
                 rows: torch.Tensor | None = None):
        x, y = model.train_inputs[0].detach(), model.train_targets.detach()
        if rows is None and len(y) > EXACT_ROWS:
            rng = np.random.default_rng(None if seed is None else [seed, 0xe7ac7])
            rows = torch.as_tensor(np.sort(rng.choice(len(y), EXACT_ROWS, replace=False)))
        if rows is not None:
            rows = torch.as_tensor(rows, device=y.device)
            x, y = x[rows], y[rows]
        with torch.no_grad():
            self.residual = (y - model.mean_module(x)).double()
            self.signal = float(kernel.prior_variance())
            self.noise = float(homoskedastic_noise(model.likelihood))
        self.x = x.double()
        self.gamma = kernel.inverse_lengthscale().detach().reshape(-1).double()
        scaled = self.x * self.gamma
        self.distance = torch.cdist(scaled, scaled, compute_mode="donot_use_mm_for_euclid_dist").square_()
        self.base = self._nll(self.distance)

    def _nll(self, distance: torch.Tensor) -> float:
        covariance = distance.mul(-0.5).exp_().mul_(self.signal)
        covariance.diagonal().add_(self.noise)
        factor = cholesky_with_jitter(covariance)
        weights = torch.cholesky_solve(self.residual[:, None], factor)[:, 0]
        return float(0.5 * self.residual @ weights + factor.diagonal().log().sum())

    @torch.no_grad()
    def rise(self, j: int, value: float) -> float:
        """The rise (nats) of the total negative log marginal likelihood when γ_j becomes ``value``."""
        return self._rise_to({j: value})

    def joint_rise(self, inputs: Sequence[int]) -> float:
        """The rise (nats) of the total negative log marginal likelihood when every γ_j of ``inputs`` becomes 0."""
        return self._rise_to({j: 0.0 for j in inputs})

    @torch.no_grad()
    def _rise_to(self, values: dict[int, float]) -> float:
        distance = self.distance.clone()
        for j, value in values.items():
            column = self.x[:, j]
            distance.add_((column[:, None] - column[None, :]).square_().mul_(value ** 2 - float(self.gamma[j]) ** 2))
        return self._nll(distance.clamp_(min=0)) - self.base

    def costs(self) -> torch.Tensor:
        """Per input, the rise when its γ_j alone is set to 0 (``inf`` for the only one in use; 0 out of use)."""
        active = torch.nonzero(self.gamma > 0).reshape(-1).tolist()
        costs = torch.zeros(len(self.gamma), dtype=torch.float64)
        for j in active:
            costs[j] = math.inf if len(active) == 1 else self.rise(j, 0.0)
        return costs


def fresh_seeds(kernel: torch.nn.Module, draws: int) -> list[int]:
    """The ``draws`` seeds of the fresh feature draws :func:`select_inputs` asks, derived from the kernel's own
    (reproducible)."""
    return [int(s) for s in np.random.SeedSequence(int(getattr(kernel, "seed", 0))).generate_state(draws, np.uint64)]


# Re-entry weights, times the median γ in use: a zero weight is a stationary point of the likelihood
# (the kernel depends on γ_j through γ_j²), so an input the fit zeroed is asked at finite weights.
ENTRY_SCALES = (0.25, 0.5, 1.0)


@torch.no_grad()
def entry_gains(model: "FeatureGP", kernel: torch.nn.Module, inputs: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per input of ``inputs`` (at weight 0): the largest fall of the total negative log marginal
    likelihood (nats) when it alone re-enters at γ_j = q · (median γ in use), q in
    :data:`ENTRY_SCALES`, nothing refitted; and that γ_j.  Shapes ``(len(inputs),)``."""
    gamma = kernel.inverse_lengthscale().detach().clone()
    with _rises(model, kernel) as rise:

        def fall(j: int, value: float) -> float:
            trial = gamma.clone()
            trial[..., j] = value
            return -rise(trial)

        best = _best_entries(fall, gamma, inputs)
    gains = torch.tensor([gain for gain, _ in best], dtype=torch.float64)
    return gains, torch.tensor([value for _, value in best], dtype=torch.float64)


def _best_entries(fall: Callable[[int, float], float], gamma: torch.Tensor,
                  inputs: Sequence[int]) -> list[tuple[float, float]]:
    """Per input of ``inputs``, the largest ``fall(j, q · median γ in use)`` over q in :data:`ENTRY_SCALES`
    (a fall that is not a number counts as −∞) and the γ_j it was at."""
    flat = gamma.reshape(-1)
    reference = float(flat[flat > 0].median())

    def at(j: int, value: float) -> tuple[float, float]:
        gain = fall(j, value)
        return (gain if not math.isnan(gain) else -math.inf), value

    return [max(at(j, q * reference) for q in ENTRY_SCALES) for j in inputs]


def _closed_form_entries(evidence: ClosedFormEvidence, inputs: list[int], threshold: float) -> dict[int, float]:
    """:func:`_entries` asked of the kernel in closed form."""
    best = _best_entries(lambda j, value: -evidence.rise(j, value), evidence.gamma, inputs)
    return {j: value for j, (gain, value) in zip(inputs, best) if gain > threshold}


def _entries(model, kernel, inputs: list[int], seeds: list[int], threshold: float) -> dict[int, float]:
    """The inputs of ``inputs`` worth more than ``threshold`` on re-entry, with the γ_j each re-enters at:
    on the fitted draw or, with ``seeds``, on the mean over those fresh draws.  The fresh draws' mean is
    asked of the inputs that gain anything on the first of them (one draw's questions for every held
    input, as the fitted draw's would be).  The fitted draw is not the screen: its radii and σ² were
    fitted without the held input, so re-entering one can cost there what it gains on other draws."""
    if not seeds:
        gains, values = entry_gains(model, kernel, inputs)
        return {inputs[a]: float(values[a]) for a in range(len(inputs)) if gains[a] > threshold}
    with kernel.redrawn(seeds[0]):
        gains, values = entry_gains(model, kernel, inputs)
    passing = [a for a in range(len(inputs)) if gains[a] > 0]
    if not passing:
        return {}
    candidates = [inputs[a] for a in passing]
    fresh = [gains[passing]]
    for seed in seeds[1:]:
        with kernel.redrawn(seed):
            fresh.append(entry_gains(model, kernel, candidates)[0])
    mean = torch.stack(fresh).mean(0)
    return {inputs[a]: float(values[a]) for a, g in zip(passing, mean) if g > threshold}


@torch.no_grad()
def _reenter(kernel: torch.nn.Module, values: dict[int, float]) -> None:
    index = torch.tensor(list(values), dtype=torch.long)
    kernel.simplex_mask[..., index] = True
    gamma = kernel.inverse_lengthscale().detach().clone()
    gamma[..., index] = torch.tensor(list(values.values()), dtype=gamma.dtype, device=gamma.device)
    kernel._set_simplex_gamma(gamma)


#: Fresh feature draws ``select_inputs(draws="auto")`` asks for a kernel that can redraw its features.
FRESH_DRAWS = 4


def select_inputs(model: "FeatureGP", x, y, *, level: float = 0.05, refit_iter: int = 30, max_rounds: int = 8,
                  draws: int | str = "auto", seed: int | None = 0,
                  validation_fraction: float | str = "auto") -> InputSelection:
    r"""Drop the inputs of a fitted simplex-ARD GP that the marginal likelihood does not need.

    Call after :func:`alacarte.fit` on the same ``x``, ``y``, with its ``seed`` and
    ``validation_fraction``: they say which rows the fit held out.  Each round drops every input
    whose weight is worth less than ``log(d/level)`` nats of total marginal likelihood (never the
    last one) — inputs already at weight 0 among them; where together they are worth more than
    :func:`joint_threshold`, only the cheapest half of them, or quarter, down to one —, holds them at
    exactly 0 and refits the rest with :func:`alacarte.fit` (``restarts=0``, ``refit_iter`` iterations).  When none is
    dropped, each held input is asked once whether it is worth more than the threshold on
    re-entry (:func:`entry_gains`: a zero weight is a stationary point, so the fit cannot
    bring an input back itself); those that are re-enter and the model is refitted.  It ends
    when a round neither drops nor re-enters an input, or after ``max_rounds`` refits.

    Where the fit held rows out, an input's worth is read on the rows the likelihood saw, at the
    likelihood's own σ² and σ_f² there (:func:`~alacarte.holdout.maximize_band_likelihood`; the
    χ²₁ count is the likelihood's at its optimum), and every refit holds the same rows out to set
    the predictive band again (docs/calibration.md).

    Args:
        model: a fitted :class:`~alacarte.FeatureGP` with one simplex kernel.
        x, y: the training data the model was fitted on.
        level: about the expected number of irrelevant inputs kept (χ²₁ tail); in (0, d).
        refit_iter: L-BFGS iterations of each refit.
        max_rounds: the most refits.
        draws: 0 asks the fitted feature draw; k > 0 asks k fresh draws of the kernel's random
            features (:meth:`~alacarte.kernels.base.FeatureKernel.redrawn`) at a point fitted to
            their mean likelihood (:func:`fit_over_draws`, ``refit_iter`` iterations from the
            model's own fit, which the model keeps) and uses the mean cost and the mean re-entry
            gain (of the held inputs that gain on the first fresh draw).  A weight fitted on one
            finite draw can fit that draw's chance features, a gain a fresh draw does not repeat.  ``"exact"``, for a kernel whose
            features approximate the RBF/ARD kernel (``rbf_limit``: Fastfood RBF, random kitchen
            sinks), asks that kernel in closed form (:class:`ClosedFormEvidence`, on up to
            :data:`EXACT_ROWS` rows).  ``"auto"`` (default): :data:`FRESH_DRAWS` where the kernel
            can redraw its features, else 0 (FSGBARD learns them).
        seed: the fit's ``seed``, passed to the refits.
        validation_fraction: the fit's ``validation_fraction``, passed to the refits.

    Returns:
        An :class:`InputSelection`; the model is left refitted with the dropped inputs at 0.

    Raises:
        ValueError: for a model without exactly one simplex kernel, an unfitted model, other rows
            than it was fitted on, or ``level``, ``refit_iter``, ``max_rounds``, ``draws``,
            ``validation_fraction`` out of range, ``draws`` for a kernel whose random state is learned,
            or ``"exact"`` for one without ``rbf_limit``.
    """
    kernel = simplex_kernel(model)
    d = kernel.num_dims
    if not 0 < level < d:
        raise ValueError(f"level must lie in (0, {d}), got {level!r}")
    if draws == "auto":
        draws = FRESH_DRAWS if kernel.redrawable else 0
    exact = draws == "exact"
    if exact and not kernel.rbf_limit:
        raise ValueError(f"draws='exact' needs a kernel whose features approximate the RBF/ARD kernel, "
                         f"not {type(kernel).__name__}")
    if (isinstance(draws, str) and not exact) or int(refit_iter) < 1 or int(max_rounds) < 0 or (
            not exact and int(draws) < 0):
        raise ValueError(f"refit_iter must be ≥ 1, max_rounds ≥ 0 and draws ≥ 0, 'exact' or 'auto', got "
                         f"{refit_iter!r}, {max_rounds!r}, {draws!r}")
    if model.train_inputs is None:
        raise ValueError("select_inputs needs a fitted model: call alacarte.fit(model, x, y) first")
    kept = _kept_rows(model, y, validation_fraction, seed)
    threshold = math.log(d / level)
    seeds = [] if exact else fresh_seeds(kernel, int(draws))
    if seeds:
        kernel._draw_buffers(seeds[0])  # refuses a kernel with a learned random state before any work
    questions = _Questions(seeds, exact, seed, threshold, level, refit_iter,
                           varying_columns(model.train_inputs[0]).reshape(-1).cpu())
    rounds, entered = 0, []
    while True:
        ask = rounds < max_rounds
        undo = _on_kept_rows(model, kept)
        try:
            costs, idle, weak, values = _decide(model, kernel, questions, entered, ask)
        except BaseException:
            undo()
            raise
        if not _apply(kernel, idle, weak, values, entered, ask):
            undo()
            break
        # The refit starts from the likelihood's σ² and σ_f² on the kept rows and sets the band again.
        fit(model, x, y, max_iter=refit_iter, restarts=0, progress=False, seed=seed,
            validation_fraction=validation_fraction)
        rounds += 1
    return InputSelection(kernel.selected().cpu(), costs, threshold, rounds, entered)


@dataclass(frozen=True)
class _Questions:
    """How :func:`select_inputs` asks: on the fresh draws ``seeds`` or the kernel in closed form (``exact``,
    its subsample from ``seed``), against ``threshold`` and the χ² tail ``level``, after ``refit_iter``
    iterations over the draws; ``varying``: the inputs not constant on the rows."""

    seeds: list[int]
    exact: bool
    seed: int | None
    threshold: float
    level: float
    refit_iter: int
    varying: torch.Tensor


def _decide(model: "FeatureGP", kernel: torch.nn.Module, q: _Questions, entered: list[int],
            ask: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[int, float]]:
    """One round's questions: the costs, the idle inputs (at 0, not yet held), the weak ones to drop and,
    with none (and ``ask``), the held inputs not asked before worth re-entry, with their γ_j.  With fresh
    draws all are read at a point fitted to their mean likelihood, where a cost is a rise from an
    optimum; the model is left as it was."""
    state, mask = copy.deepcopy(model.state_dict()), kernel.simplex_mask.clone()
    try:
        if q.seeds:
            fit_over_draws(model, kernel, q.seeds, q.refit_iter)
        evidence = ClosedFormEvidence(model, kernel, q.seed) if q.exact else None
        costs = evidence.costs() if q.exact else input_costs(model, kernel, q.seeds)
        idle, weak = _weak_inputs(kernel, costs, q.threshold)
        if idle.any():
            kernel.drop_inputs_(torch.nonzero(idle).reshape(-1))  # asked as held: worth 0 nats
        joint = evidence.joint_rise if q.exact else (lambda inputs: joint_cost(model, kernel, inputs, q.seeds))
        weak = _jointly_weak(weak, costs, joint, q.level)
        values = {} if weak.any() or not ask else _entries_worth_it(model, kernel, q.varying, entered,
                                                                     q.threshold, q.seeds, evidence)
    finally:
        model.load_state_dict(state)
        kernel.simplex_mask.copy_(mask)
    return costs, idle, weak, values


def _apply(kernel: torch.nn.Module, idle: torch.Tensor, weak: torch.Tensor, values: dict[int, float],
           entered: list[int], ask: bool) -> bool:
    """Hold the idle inputs at 0 (so no refit hands them a chance weight), drop the weak ones, re-enter
    ``values``; whether the model changed (a refit is due).  Without ``ask`` only the idle inputs already
    at 0 in the model are held."""
    pi = kernel.simplex_weights.detach().reshape(-1).cpu()
    changed = ask and bool(weak.any() or values or (idle & (pi > 0)).any())
    drop = (idle | weak) if changed else idle & (pi == 0)
    remaining = kernel.simplex_mask.reshape(-1).cpu() & ~drop
    if drop.any() and not bool((pi[remaining] > 0).any()):
        # The model's own fit put no weight where the draws' point does: start those inputs level.
        with torch.no_grad():
            kernel.simplex_weights[..., remaining.to(kernel.simplex_weights.device)] = 1.0 / int(remaining.sum())
    if drop.any():
        kernel.drop_inputs_(torch.nonzero(drop).reshape(-1))
    if changed and values:
        _reenter(kernel, values)
        entered += list(values)
    return changed


def _entries_worth_it(model: "FeatureGP", kernel: torch.nn.Module, varying: torch.Tensor, entered: list[int],
                      threshold: float, seeds: Sequence[int], evidence: ClosedFormEvidence | None) -> dict[int, float]:
    """The held inputs not in ``entered`` worth more than ``threshold`` on re-entry, with their γ_j."""
    held = ~kernel.simplex_mask.reshape(-1).cpu() & varying
    ask = [j for j in torch.nonzero(held).reshape(-1).tolist() if j not in entered]
    if not ask:
        return {}
    if evidence is not None:
        return _closed_form_entries(evidence, ask, threshold)
    return _entries(model, kernel, ask, seeds, threshold)


def _kept_rows(model: "FeatureGP", y, validation_fraction, seed) -> torch.Tensor | None:
    """The indices of the rows :func:`~alacarte.fit` kept for the likelihood, ``None`` where it held none out."""
    n = model.train_targets.shape[-1]
    if len(y) != n:
        raise ValueError(f"select_inputs needs the rows the model was fitted on: it has {n}, got {len(y)}")
    rows = split_rows(n, resolve_fraction(validation_fraction, model, streamed=False), seed)
    return None if rows is None else rows[0].to(model.train_targets.device)


def _on_kept_rows(model: "FeatureGP", kept: torch.Tensor | None) -> Callable[[], None]:
    """Give the model the kept rows and the marginal likelihood's σ² and σ_f² on them; returns what
    restores the rows and the band it had."""
    if kept is None:
        return lambda: None
    (x,), y = model.train_inputs, model.train_targets
    signal = signal_variance_parameter(model)
    parameters = [model.likelihood.noise_covar.raw_noise] + ([] if signal is None else [signal[0]])
    saved = [p.detach().clone() for p in parameters]
    model.set_train_data(x[kept], y[kept], strict=False)
    maximize_band_likelihood(model)

    def undo() -> None:
        with torch.no_grad():
            for parameter, value in zip(parameters, saved):
                parameter.copy_(value)
        model.set_train_data(x, y, strict=False)

    return undo


def _weak_inputs(kernel: torch.nn.Module, costs: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs at weight 0 not yet held, and the inputs in use worth less than ``threshold`` (never all
    of them)."""
    active = kernel.simplex_weights.detach().reshape(-1).cpu() > 0
    idle = kernel.simplex_mask.reshape(-1).cpu() & ~active
    weak = active & (costs < threshold)
    if bool(weak.any()) and bool(weak.eq(active).all()):  # never the last input
        weak[int(torch.argmax(torch.where(active, costs, torch.full_like(costs, -math.inf))))] = False
    return idle, weak


def joint_threshold(k: int, num_dims: int, level: float) -> float:
    """The cost (nats) below which ``k`` inputs may be dropped together: twice the gain of k irrelevant
    inputs is about χ²_k, held to the single input's tail probability level/d (and never below its
    threshold log(d/level))."""
    return max(math.log(num_dims / level), 0.5 * float(stats.chi2.isf(level / num_dims, k)))


def _jointly_weak(weak: torch.Tensor, costs: torch.Tensor, joint: Callable[[list[int]], float],
                  level: float) -> torch.Tensor:
    """The weak inputs to drop in one round: all of them where their joint cost is below
    :func:`joint_threshold`, else the cheapest half of them, and so on down to the cheapest one.
    Each input is asked with the others in place: copies of one signal are each worth little
    while their siblings stay, and everything together."""
    order = sorted(torch.nonzero(weak).reshape(-1).tolist(), key=lambda j: float(costs[j]))
    k = len(order)
    while k > 1 and joint(order[:k]) >= joint_threshold(k, len(weak), level):
        k //= 2
    kept = torch.zeros_like(weak)
    kept[order[:k]] = True
    return kept
