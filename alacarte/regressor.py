"""A scikit-learn regressor over every alacarte kernel."""
from __future__ import annotations

import copy
import inspect
import math

import gpytorch
import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from ._validation import (
    as_tensor,
    check_bool,
    check_positive_int,
    check_seed,
    float64_targets,
    unfitted_on_failure,
    varying_columns,
)
from .factory import KERNEL_NAMES, check_simplex_name, component_candidates, make_model, resolve_draws
from .holdout import held_out_count, resolve_fraction
from .kernels import FeatureKernel
from ._standardized import Prediction
from .models import FeatureGP
from .replicates import Replicates
from .selection.evidence import select_inputs, simplex_kernel
from .selection.frequency import SelectionFrequency
from .training import FitHistory, current_loss, fit, fit_pilot, resolve_pilot, resolve_samples

__all__ = ["AlaCarteRegressor", "kernel_relevance", "mixture_moments", "held_out_score", "choose_components",
           "lowest_score"]


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


# The estimator's fit settings default to those of the function it calls, stated once there.
_FIT = _defaults(fit)


def _as_seed(random_state) -> int:
    """An int seed: ints are used as they are, anything else draws one (sklearn style)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return check_seed(random_state, "random_state")
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def kernel_relevance(model) -> np.ndarray:
    """Normalised relevance of each input dimension of a fitted model.

    A feature kernel's :attr:`~alacarte.FeatureKernel.relevance` (π for
    simplex-ARD kernels — exact zeros for unused inputs —, normalised inverse
    lengthscales otherwise; GM: Σ_q w_q σ_qj; SSGPR: RMS frequency per input);
    for an exact GP its normalised inverse RBF/ARD lengthscales.  Lengthscales
    act on standardised inputs, so relevances compare inputs independently of
    their units.  An input that is constant on the training rows (all zeros once centred) has no
    effect on the model whatever its lengthscale, which keeps its initial value: it gets relevance 0.
    """
    kernel = model.covar_module
    if isinstance(kernel, FeatureKernel):
        values = kernel.relevance.cpu().double().numpy().reshape(-1)
    else:  # ExactRBFGP: ScaleKernel(RBFKernel)
        inverse = 1.0 / kernel.base_kernel.lengthscale.detach().cpu().double().numpy().reshape(-1)
        values = np.broadcast_to(inverse, (model.num_dims,)).copy()
    inputs = getattr(model, "train_inputs", None)
    if inputs is not None and inputs[0].shape[-1] == values.size:
        constant = ~varying_columns(inputs[0]).cpu().numpy()
        if not constant.all():
            values = np.where(constant, 0.0, values)
    return values / values.sum()


class AlaCarteRegressor(RegressorMixin, BaseEstimator):
    r"""Gaussian-process regression with an À la carte kernel, as a scikit-learn estimator.

    Fits a :class:`~alacarte.FeatureGP` (or, for ``"exact-*"``, an
    :class:`~alacarte.ExactRBFGP`) by maximising the marginal likelihood with
    :func:`alacarte.fit` — standardised inputs and targets, data-driven
    initialisation, seeded restarts — and predicts in the targets' original
    units.  Works in float64.

    Args:
        kernel: a name — ``"gm"``, ``"pwl"``, ``"fsard"``, ``"fsgbard"``,
            ``"fastfood-ard"``, ``"fastfood-rbf"``, ``"ssgpr"``, ``"rks"``,
            ``"exact-ard"``, ``"exact-rbf"`` (see :func:`alacarte.factory.make_model`) —
            or an alacarte :class:`~alacarte.FeatureKernel` object, which is
            copied, never modified: the first draw fits it as it is, every further draw
            a copy whose random features are drawn from that draw's seed
            (:meth:`~alacarte.FeatureKernel.redraw_`; FSGBARD and SSGPR learn their random
            state, and every draw starts from the object's).
        num_samples: frequencies M of a named feature kernel (D = 2M features), or ``"auto"``: 512
            (D = 1 024, the D the calibration was measured at: docs/calibration.md), and 2 048 (D = 4 096)
            where a pilot fits the hyperparameters (``pilot_rows``; :func:`alacarte.training.resolve_samples`).
        num_components: mixture components of ``"gm"`` / ``"pwl"`` (must divide ``num_samples``), or
            ``"auto"``: 4, and where the fit holds out at least
            :data:`~alacarte.factory.AUTO_COMPONENT_ROWS` (400) rows, every draw fitted with 1 and with 4,
            keeping the number whose held-out rows score lower (:func:`held_out_score`), at twice the
            cost (:func:`alacarte.factory.component_candidates`; docs/calibration.md).
        num_draws: independent fits, each with its own feature draw, restarts and held-out rows
            (seeds ``random_state + 1000·k``), whose predictive distributions are averaged: the
            mean of their means, the variance of their equal mixture (docs/calibration.md).  A
            finite feature map's error between the training rows is one draw's; averaging draws
            shrinks it at ``num_draws`` times the fitting cost.  ``"auto"``: 5 for a feature GP
            with at most twice as many training rows as features, else 1 (:func:`alacarte.factory.resolve_draws`).
        max_iter: iterations of the final optimisation.
        restarts: data-driven random initialisations tried first (0: none).
        restart_iter: iterations per restart.
        optimizer: ``"lbfgs"`` or ``"adam"``.
        validation_fraction: the share of the training rows held out to stop the fit before it
            over-fits and to calibrate the predictive variance (see :func:`alacarte.fit`);
            ``"auto"``: 0.2 for feature kernels, 0 for the exact GPs (docs/calibration.md); 0: the
            marginal likelihood of all rows alone, as in the À la carte paper.
        replicates: where training inputs repeat, predict at them with a term per distinct input
            (:mod:`alacarte.replicates`): a new row at a training input is predicted from that
            input's own targets as well as from the function; ``False``: the fitted model alone.
            Changes nothing where no input repeats or at new inputs.
        select: after each draw's fit, hold at exactly 0 the inputs the marginal likelihood does not
            need (:func:`alacarte.selection.select_inputs` at its defaults, given the fit's seed and
            ``validation_fraction``): a named ARD kernel (``"fsard"``, ``"fsgbard"``, ``"fastfood-ard"``,
            ``"pwl"``, ``"rks"``) is built with its inverse lengthscales on the simplex; a kernel object
            must have been built with ``simplex=True``.
        pilot_rows: fit the hyperparameters on a pilot of this many rows with D = 1 024 features and
            condition the model, with its ``num_samples`` frequencies, on every row
            (:func:`alacarte.fit_pilot`; docs/mathematics.md, "Pilot fits"): for large n, with many
            features (kin40k, GM at D = 4 096: 0.07 test RMSE in 131 CPU s, against 0.14 in 154 s for
            a whole fit at D = 512).  ``"auto"`` (default): a pilot of 5 000 rows above 20 000 training
            rows, where the model is wider than the pilot (``num_samples`` ``"auto"`` or above 512), the
            kernel allows it and ``select`` is off (:func:`alacarte.training.resolve_pilot`);
            ``None``: fit on every row.  A number of rows is refused with ``select`` and for kernels that
            learn a value per frequency (FSARD, FSGBARD, SSGPR) or the exact GPs.
        random_state: seed of the kernel's random state and of the restarts
            (an int, ``None`` or a ``numpy.random.RandomState``).
        progress: show a progress bar while fitting.

    Attributes:
        model_: the fitted :class:`~alacarte.FeatureGP` / :class:`~alacarte.ExactRBFGP` (the first draw's).
        models_: every draw's fitted model, ``model_`` first (as many as ``num_draws`` resolves to).
        history_: the :class:`~alacarte.training.FitHistory` of the first draw's fit (as are
            ``n_iter_`` and ``log_marginal_likelihood_``).
        n_iter_: iterations of the final optimisation (after the restarts), plus
            those of the noise refit when it was kept (see :class:`~alacarte.training.FitHistory`);
            at most 2·``max_iter``.
        log_marginal_likelihood_: :math:`\log p(y \mid X, \hat\theta)` of the training
            targets in their original units (summed over the n points; log priors included).
        n_features_in_: number of input dimensions.
        relevance_: relevance of each input, non-negative and summing to one
            (in standardised input units; see :func:`~alacarte.regressor.kernel_relevance`),
            averaged over the draws.
        relevance_draws_: each draw's relevances, ``(len(models_), n_features_in_)``: how far one
            feature draw's reading of an input can be trusted (docs/variable_selection.md).
        pilot_rows_: the pilot's rows (``pilot_rows`` resolved), or ``None`` where the fit used every row.
        num_samples_: the frequencies M of a named kernel (``num_samples`` resolved; a kernel object's own).
        num_components_: the number of components the kept fits have (``num_components`` itself unless "auto").
        component_scores_: each number of components' held-out score (:func:`held_out_score`) where
            ``num_components="auto"`` chose between several; empty otherwise.
        selection_frequency_: with ``select``, the share of the draws that kept each input.
        selected_: with ``select``, the inputs kept by at least 4 in 5 of the draws (every draw's,
            for one draw): :meth:`~alacarte.selection.SelectionFrequency.stable`.
        replicates_: the training inputs' :class:`~alacarte.replicates.Replicates` where some input
            repeats and ``replicates`` is on, else ``None``.
        replicate_shares_: with ``replicates_``, each draw's σ²/ν: the share of its noise variance ν
            that is a row's scatter about its input's mean response
            (:meth:`~alacarte.replicates.Replicates.choose_share`); 1 where the repeats show no term per input.

    **Predictive spread.** ``predict(X, return_std=True)`` returns the standard
    deviation of a new *observation* :math:`y_* = f_* + \varepsilon` by default —
    what :class:`sklearn.gaussian_process.GaussianProcessRegressor` returns when
    the noise is modelled by a ``WhiteKernel``, and what the noise-learning GP
    here calls the predictive distribution; ``include_noise=False`` gives that of
    the latent function :math:`f_*` — at a repeated training input, of the mean
    response there, :math:`f_* + h_*` (``replicates``); with ``return_cov`` the
    rows at training inputs keep the model's correlations.  :meth:`sample_y` draws latent functions
    :math:`f` (without the per-input terms);
    ``score(X, y)`` is the coefficient of determination R² of the mean.

    Check-estimator exceptions: none — every check of
    :func:`sklearn.utils.estimator_checks.check_estimator` passes.

    Example:
        >>> import numpy as np
        >>> from alacarte import AlaCarteRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-2, 2, (200, 3)); y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(200)
        >>> X_train, X_test, y_train, y_test = X[:150], X[150:], y[:150], y[150:]
        >>> reg = AlaCarteRegressor("gm", num_samples=32, num_components=2, max_iter=30, restarts=2,
        ...                         restart_iter=5).fit(X_train, y_train)
        >>> mean, std = reg.predict(X_test, return_std=True)
        >>> mean.shape, std.shape, bool(reg.score(X_test, y_test) > 0.9)
        ((50,), (50,), True)
        >>> int(reg.relevance_.argmax())             # y depends on the first input only
        0
    """

    def __init__(
        self,
        kernel: str | FeatureKernel = "gm",
        *,
        num_samples: int | str = "auto",
        num_components: int | str = "auto",
        num_draws: int | str = "auto",
        max_iter: int = _FIT["max_iter"],
        restarts: int = _FIT["restarts"],
        restart_iter: int = _FIT["restart_iter"],
        optimizer: str = _FIT["optimizer"],
        validation_fraction: float | str = _FIT["validation_fraction"],
        replicates: bool = True,
        select: bool = False,
        pilot_rows: int | str | None = "auto",
        random_state: int | np.random.RandomState | None = _FIT["seed"],
        progress: bool = False,
    ):
        self.kernel = kernel
        self.num_samples = num_samples
        self.num_components = num_components
        self.num_draws = num_draws
        self.max_iter = max_iter
        self.restarts = restarts
        self.restart_iter = restart_iter
        self.optimizer = optimizer
        self.validation_fraction = validation_fraction
        self.replicates = replicates
        self.select = select
        self.pilot_rows = pilot_rows
        self.random_state = random_state
        self.progress = progress

    # -- fitting ------------------------------------------------------------------------
    def _build_model(self, num_dims: int, seed: int, num_components: int, redraw: bool = False):
        """The model of a draw from ``seed``; a kernel object is copied, and with ``redraw`` its random
        buffers are those ``seed`` draws (a learned random state, FSGBARD's or SSGPR's, stays the object's)."""
        kernel = self.kernel
        if isinstance(kernel, FeatureKernel):
            kernel = copy.deepcopy(kernel)
            if redraw and kernel.redrawable:
                kernel.redraw_(seed)
        elif not isinstance(kernel, str) or kernel not in KERNEL_NAMES:
            raise ValueError(
                f"kernel must be one of {', '.join(KERNEL_NAMES)} or an alacarte FeatureKernel, got {kernel!r}"
            )
        model = make_model(kernel, num_dims, num_samples=self.num_samples_, num_components=num_components,
                           seed=seed, simplex=self.select and isinstance(kernel, str))
        return model.double()

    @unfitted_on_failure
    def fit(self, X, y) -> "AlaCarteRegressor":
        """Fit the GP's hyperparameters to (X, y) by maximising the marginal likelihood.

        Args:
            X: training inputs (n, d), n ≥ 2, finite.
            y: training targets (n,), finite and not all equal.

        Returns:
            The fitted estimator itself.

        Raises:
            ValueError: for NaN/inf, non-numeric or mismatched data, fewer than 2 rows, constant
                targets, or an impossible setting (unknown ``kernel`` or ``optimizer``,
                ``num_samples`` not a multiple of ``num_components``, …).  A failed fit leaves
                the estimator unfitted.
        """
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64)
        y = float64_targets(y)
        seed = _as_seed(self.random_state)
        select = check_bool(self.select, "select")
        replicates = check_bool(self.replicates, "replicates")
        if select and isinstance(self.kernel, str):
            check_simplex_name(self.kernel, True, "select=True")
        samples = self.kernel.num_samples if isinstance(self.kernel, FeatureKernel) else self.num_samples
        self.pilot_rows_ = resolve_pilot(self.pilot_rows, self.kernel, X.shape[0], select, samples)
        self.num_samples_ = resolve_samples(samples, self.pilot_rows_)
        x_t, y_t = as_tensor(X, "X", torch.float64), as_tensor(y, "y", torch.float64)
        one_fit = component_candidates(self.num_components, self.kernel, self.num_samples_)
        first = self._build_model(X.shape[1], seed, one_fit[0])
        if select:
            try:
                simplex_kernel(first)
            except ValueError as error:
                raise ValueError("select=True needs one simplex-ARD kernel: a name such as 'fsard', or e.g. "
                                 "FSARDKernel(d, M, ard_num_dims=d, simplex=True) as kernel") from error
        held_out = held_out_count(X.shape[0], resolve_fraction(self.validation_fraction, first, streamed=False))
        candidates = component_candidates(self.num_components, self.kernel, self.num_samples_, held_out)
        draws = resolve_draws(self.num_draws, first, X.shape[0])
        seeds = [(seed + 1000 * draw) % 2**64 for draw in range(draws)]
        models, histories = self._fit_components(x_t, y_t, seeds, candidates, select)
        model, self.history_ = models[0], histories[0]
        # −loss is log p(y_std)/n (+ log priors); the standardisation y = s·y_std + c has Jacobian sⁿ.
        n = X.shape[0]
        loss = self.history_.final_loss
        if select:
            self.selection_frequency_, self.selected_ = selection_of(models)
            loss = current_loss(model, model.train_inputs[0], model.train_targets)  # of the selected model
            model.eval()
        self.log_marginal_likelihood_ = float(-loss * n - n * math.log(float(model.target_scale)))
        self.n_iter_ = self.history_.iterations
        self.model_, self.models_ = model, models
        reps = self.replicates_ = Replicates.of(X, y) if replicates else None
        self.replicate_shares_ = None if reps is None else [
            reps.choose_share(X, y, m.predict(reps.inputs[reps.repeated])) for m in models]
        return self

    def _fit_components(self, x: torch.Tensor, y: torch.Tensor, seeds: list[int], candidates: tuple[int, ...],
                        select: bool) -> tuple[list, list[FitHistory]]:
        """The draws fitted with each number of components in ``candidates``; those of the number whose
        held-out score is lowest are kept (``num_components_``, ``component_scores_``) and returned."""
        runs = {q: self._fit_draws(x, y, seeds, q, select) for q in candidates}
        self.num_components_, self.component_scores_ = choose_components({q: run[1] for q, run in runs.items()})
        return runs[self.num_components_]

    def _fit_draws(self, x: torch.Tensor, y: torch.Tensor, seeds: list[int], num_components: int,
                   select: bool) -> tuple[list, list[FitHistory]]:
        """One fit per seed (its own feature draw, restarts and held-out rows), inputs selected after each
        with ``select``: the models and their histories."""
        models, histories = [], []
        for k, draw_seed in enumerate(seeds):
            models.append(self._build_model(x.shape[1], draw_seed, num_components, redraw=k > 0))
            settings = dict(optimizer=self.optimizer, max_iter=self.max_iter, restarts=self.restarts,
                            restart_iter=self.restart_iter, seed=draw_seed, progress=self.progress,
                            validation_fraction=self.validation_fraction)
            if self.pilot_rows_ is None:
                histories.append(fit(models[-1], x, y, **settings))
            else:
                histories.append(fit_pilot(models[-1], x, y, rows=self.pilot_rows_, **settings))
            if select:
                select_inputs(models[-1], x, y, seed=draw_seed, validation_fraction=self.validation_fraction)
        return models, histories

    # -- prediction ---------------------------------------------------------------------
    def _test_inputs(self, X) -> torch.Tensor:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return as_tensor(X, "X", torch.float64)

    def predict(self, X, return_std: bool = False, return_cov: bool = False, *,
                include_noise: bool = True) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean at X, optionally with its standard deviation or covariance.

        Args:
            X: test inputs (m, d).
            return_std: also return the predictive standard deviations (m,).
            return_cov: also return the predictive covariance (m, m) — O(m²) memory.
            include_noise: spread of a new observation y* (default) or, if
                ``False``, of the latent function f*.

        Returns:
            ``mean`` or ``(mean, std)`` or ``(mean, cov)``, numpy arrays in the targets' units.

        Raises:
            RuntimeError: if both ``return_std`` and ``return_cov`` are set (as
                scikit-learn's ``GaussianProcessRegressor``).
            ValueError: if ``X`` has NaN/inf or another number of columns than the training inputs.
        """
        if return_std and return_cov:
            raise RuntimeError("At most one of return_std or return_cov can be requested.")
        x = self._test_inputs(X)
        if return_cov:
            return self._mean_and_covariance(x, include_noise)
        at = self._at_training_inputs(x)
        means, variances = [], []
        for k, model in enumerate(self.models_):
            pred = self._prediction(k, x, at, mean_only=not return_std)
            means.append(pred.mean)
            if return_std:
                variances.append((pred.observed_variance if include_noise else pred.variance).clamp_min(0))
        means = torch.stack(means)
        if not return_std:
            return means.mean(0).numpy()
        mean, variance = mixture_moments(means, torch.stack(variances))
        return mean.numpy(), variance.sqrt().numpy()

    def _at_training_inputs(self, x: torch.Tensor) -> torch.Tensor | None:
        """The rows of x at a repeated-input model's training inputs (a mask), or ``None`` for none."""
        reps = getattr(self, "replicates_", None)
        if reps is None:
            return None
        at = reps.match(x) >= 0
        return at if bool(at.any()) else None

    def _prediction(self, k: int, x: torch.Tensor, at: torch.Tensor | None, mean_only: bool) -> Prediction:
        """Draw k's prediction at x, the rows ``at`` training inputs by the model with replicates."""
        model = self.models_[k]
        pred = model.predict(x, mean_only=mean_only)
        if at is None:
            return pred
        share = self.replicate_shares_[k]
        if not mean_only:
            return self.replicates_.predictive(x, pred, share)
        # Those rows need their variances even for the mean alone.
        mean = pred.mean.clone()
        mean[at] = self.replicates_.predictive(x[at], model.predict(x[at]), share).mean
        return pred._replace(mean=mean)

    def _mean_and_covariance(self, x: torch.Tensor, include_noise: bool) -> tuple[np.ndarray, np.ndarray]:
        """The predictive mean and covariance at x, of the draws' equal mixture."""
        at = self._at_training_inputs(x)
        pairs = [self._model_mean_and_covariance(k, x, at, include_noise) for k in range(len(self.models_))]
        means = torch.stack([m for m, _ in pairs])
        mean = means.mean(0)
        centred = means - mean
        cov = torch.stack([c for _, c in pairs]).mean(0) + centred.transpose(0, 1) @ centred / len(pairs)
        return mean.numpy(), cov.numpy()

    def _model_mean_and_covariance(self, k: int, x: torch.Tensor, at: torch.Tensor | None,
                                   include_noise: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw k's mean and covariance at x; the rows ``at`` training inputs take the model with
        replicates' mean and variances and keep the model's correlations."""
        model = self.models_[k]
        mean, cov = _latent_mean_and_covariance(model, x)
        observed = torch.full_like(mean, float(model.likelihood.noise.detach().reshape(()) * model.target_scale**2))
        if at is not None:
            latent = cov.diagonal().clone()
            there = self.replicates_.predictive(x[at], Prediction(mean[at], latent[at], latent[at] + observed[at]),
                                                self.replicate_shares_[k])
            ratio = torch.ones_like(mean)
            ratio[at] = (there.variance / latent[at].clamp_min(torch.finfo(mean.dtype).tiny)).sqrt()
            mean, cov = mean.clone(), cov * ratio.unsqueeze(0) * ratio.unsqueeze(1)
            mean[at] = there.mean
            cov.diagonal()[at] = there.variance
            observed[at] = there.observed_variance - there.variance
        if include_noise:
            cov = cov + torch.diag(observed)
        return mean, cov

    def sample_y(self, X, n_samples: int = 1, random_state: int | np.random.RandomState | None = 0) -> np.ndarray:
        """Posterior draws of the latent function f at X, shape (m, n_samples).

        Feature models draw exact weight-space functions
        (:meth:`~alacarte.FeatureGP.sample_functions`, O(D) per point and draw);
        exact GPs draw from the joint posterior over X (O(m³)).

        Args:
            X: inputs (m, d).
            n_samples: number of draws, a positive integer.
            random_state: seed of the draws (an int, ``None`` or a ``numpy.random.RandomState``);
                the same int gives the same draws.

        Returns:
            The draws, in the targets' units.
        """
        x = self._test_inputs(X)
        check_positive_int(n_samples, "n_samples")
        seed = _as_seed(random_state)
        # Draw j comes from draw j mod K's posterior: an equal mixture, stratified over the draws.
        columns = [_posterior_draws(model, x, len(range(k, n_samples, len(self.models_))), seed + k)
                   for k, model in enumerate(self.models_)]
        draws = np.empty((x.shape[0], n_samples))
        for k, block in enumerate(columns):
            draws[:, k::len(self.models_)] = block
        return draws

    @property
    def relevance_(self) -> np.ndarray:
        """Relevance of each input dimension (non-negative, sums to one), averaged over the draws."""
        return self.relevance_draws_.mean(0)

    @property
    def relevance_draws_(self) -> np.ndarray:
        """Each draw's relevances, ``(len(models_), n_features_in_)``, each row non-negative and summing to one."""
        check_is_fitted(self)
        return np.stack([kernel_relevance(model) for model in self.models_])


def selection_of(models: list) -> tuple[np.ndarray, np.ndarray]:
    """``selection_frequency_`` and ``selected_`` of the draws' simplex kernels, each holding its selection's
    zeros (:meth:`~alacarte.selection.SelectionFrequency.stable`)."""
    kernels = [simplex_kernel(model) for model in models]
    found = SelectionFrequency.of([k.selected().cpu() for k in kernels], [], kernels[0].num_dims)
    return found.frequency.numpy(), found.stable().numpy()


def held_out_score(histories: list[FitHistory]) -> float:
    """The mean over fits of the best score their held-out rows gave an iterate (standardised units): what
    ``num_components="auto"`` compares.

    Raises:
        ValueError: where a fit's held-out rows scored no iterate.
    """
    if not all(h.validation_loss for h in histories):
        raise ValueError("a fit without held-out rows scoring its iterates has no held-out score")
    return sum(min(h.validation_loss) for h in histories) / len(histories)


def choose_components(histories: dict[int, list[FitHistory]]) -> tuple[int, dict[int, float]]:
    """Of fits with several numbers of components (``{number: its draws' histories}``), the number whose
    :func:`held_out_score` is lowest (the first on a tie) and each number's score; a single number is
    chosen unscored (``{}``)."""
    if len(histories) == 1:
        return next(iter(histories)), {}
    scores = {q: held_out_score(runs) for q, runs in histories.items()}
    return lowest_score(scores), scores


def lowest_score(scores: dict[int, float]) -> int:
    """The number of components with the lowest held-out score, the first in order on a tie: the one rule
    :func:`choose_components` and the experiments' re-scoring of stored fits apply."""
    return min(scores, key=scores.__getitem__)


def mixture_moments(means: torch.Tensor, variances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and variance of the equal mixture of the Gaussians N(means[k], variances[k]), k along
    the first dimension: the moment-matched Gaussian that :meth:`~alacarte.AlaCarteRegressor.predict` returns."""
    mean = means.mean(0)
    return mean, variances.mean(0) + (means - mean).square().mean(0)


@torch.no_grad()
def _latent_mean_and_covariance(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One model's posterior mean and covariance of the latent function at x, in the targets' units."""
    model.eval()
    # debug off: GPyTorch warns when test inputs equal the training inputs, a legitimate query here.
    with model.inference_settings(), gpytorch.settings.debug(False):
        posterior = model(model.internal_query_inputs(x))
        mean = posterior.mean * model.target_scale + model.target_offset
        cov = posterior.covariance_matrix * model.target_scale**2
    model.refuse_overflowed_rows(mean)
    model.refuse_overflowed_rows(cov.diagonal(dim1=-2, dim2=-1))
    return mean, cov


def _posterior_draws(model, x: torch.Tensor, count: int, seed: int) -> np.ndarray:
    """``count`` posterior draws of one model's latent function at x, (m, count)."""
    if count == 0:
        return np.empty((x.shape[0], 0))
    seed %= 2**64
    if isinstance(model, FeatureGP):
        return model.sample_functions(count, seed=seed)(x).T.numpy()
    mean, cov = (t.numpy() for t in _latent_mean_and_covariance(model, x))
    # Drawn in the standardised units: numpy's positive-semidefinite check has an absolute
    # tolerance (1e-8), which round-off in a covariance of targets in large units exceeds.
    scale = float(model.target_scale)
    draws = np.random.default_rng(seed).multivariate_normal(np.zeros_like(mean), cov / scale / scale, count)
    return (mean + scale * draws).T
