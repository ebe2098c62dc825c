"""Sparse random Fourier features (SRFF; Gregorová et al. 2018), docs/mathematics.md §5."""
from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data
from torch import Tensor

from .._validation import check_positive_int, check_real, column_standardization, float64_targets, unfitted_on_failure, varying_columns
from .rffnet import prediction_rows
from ..ops.simplex import MonotoneFISTA

__all__ = ["SRFFRegressor"]

# Query points used to estimate the median 20-nearest-neighbour distance.
_NEIGHBOUR_QUERIES = 1000
# Smallest grid value relative to the largest (the ridge penalty at which Z a ≈ 0).
_GRID_RANGE = 1e-7


class _SRFFProblem:
    r"""The SRFF objective on one training set, with a fixed draw (ε, b).

    .. math::
        z(x) = \sqrt{2/D}\,\cos(\varepsilon^\top(\gamma\odot x) + b),\qquad
        J(a, \gamma) = \tfrac1n\|y - Za\|^2 + \tfrac{\lambda}{n}\|a\|^2

    (the paper's objective divided by n: same minimisers, step sizes of order one).
    Each evaluation of ``J`` costs one n×d×D GEMM; its γ-gradient one more.
    """

    def __init__(self, x: Tensor, y: Tensor, eps: Tensor, offset: Tensor):
        self.x, self.y, self.eps, self.offset = x, y, eps, offset
        self.n = x.shape[0]
        self.scale = math.sqrt(2.0 / eps.shape[0])

    def phases(self, gamma: Tensor, x: Tensor | None = None) -> Tensor:
        return torch.addmm(self.offset, (self.x if x is None else x) * gamma, self.eps.T)

    def features(self, gamma: Tensor, x: Tensor | None = None) -> Tensor:
        """Z(γ) of the problem's rows, or of the rows ``x``."""
        return self.scale * torch.cos(self.phases(gamma, x))

    def ridge(self, gamma: Tensor, alpha: float) -> Tensor:
        """a = argmin ‖y − Za‖² + λ‖a‖² (Cholesky of ZᵀZ + λI, D×D)."""
        z = self.features(gamma)
        gram = z.T @ z
        gram.diagonal().add_(alpha)
        factor = torch.linalg.cholesky(gram)
        return torch.cholesky_solve((z.T @ self.y).unsqueeze(-1), factor).squeeze(-1)

    def loss(self, gamma: Tensor, coef: Tensor) -> float:
        """‖y − Z(γ)a‖² / n."""
        residual = self.y - self.features(gamma) @ coef
        return float(residual @ residual) / self.n

    def loss_and_grad(self, gamma: Tensor, coef: Tensor) -> tuple[float, Tensor]:
        r"""‖y − Za‖²/n and its γ-gradient (paper eq. 11):
        ∂/∂γ_s = (2/n)·√(2/D) Σ_i x_is Σ_j r_i a_j sin(p_ij) ε_js."""
        phases = self.phases(gamma)
        residual = self.y - (self.scale * torch.cos(phases)) @ coef
        weights = torch.sin(phases).mul_(residual.unsqueeze(-1) * ((2.0 * self.scale / self.n) * coef))
        grad = ((weights @ self.eps) * self.x).sum(0)
        return float(residual @ residual) / self.n, grad


def monotone_fista(
    problem: _SRFFProblem,
    gamma: Tensor,
    coef: Tensor,
    size: float,
    step_size: float,
    max_iter: int,
    tol: float,
) -> tuple[Tensor, float, float, list[float]]:
    r"""min over γ ∈ cΔ of ‖y − Z(γ)a‖²/n by monotone FISTA with backtracking
    (:class:`~alacarte.ops.simplex.MonotoneFISTA`), from a first trial step ``step_size``.

    Stops after ``max_iter`` steps, or when a step moved γ by at most ``tol·c`` and
    the objective by at most ``tol`` relative.

    Returns (γ, its objective, the last step size, the objective after every iteration).
    """
    fista = MonotoneFISTA(size=size, step_size=step_size)

    def value(point: list[Tensor]) -> float:
        return problem.loss(point[0], coef)

    def value_and_grad(point: list[Tensor]) -> tuple[float, list[Tensor] | None]:
        f, grad = problem.loss_and_grad(point[0], coef)
        if not math.isfinite(f) or not bool(torch.isfinite(grad).all()):
            return math.nan, None
        return f, [grad]

    current = value([gamma])
    history = [current]
    stalled = False
    for _ in range(max_iter):
        (new_gamma,), new_value, moved = fista.step([gamma], value, value_and_grad, current)
        change = float((new_gamma - gamma).norm())
        previous = current
        gamma, current = new_gamma, new_value
        history.append(current)
        if moved and change <= tol * size and previous - current <= tol * max(previous, 1e-300):
            break
        # A step without momentum that cannot move (it follows a restart) is at a fixed point.
        if not moved and stalled:
            break
        stalled = not moved
    return gamma, current, fista.step_size, history


def _median_neighbour_distance(x: Tensor, k: int, rng: np.random.Generator) -> float:
    """Median distance from (up to 1000 random) points to their k nearest other training points.

    Querying a random subset against *all* training points estimates the same
    median as the paper's all-points computation, at O(1000·n·d) instead of O(n²d)."""
    n = x.shape[0]
    k = min(k, n - 1)
    if k < 1:
        return 1.0
    queries = rng.choice(n, size=min(n, _NEIGHBOUR_QUERIES), replace=False)
    sq_norms = (x * x).sum(1)
    dists = []
    for chunk in np.array_split(queries, max(1, len(queries) // 250)):
        idx = torch.as_tensor(chunk)
        d2 = sq_norms[idx, None] + sq_norms[None, :] - 2.0 * x[idx] @ x.T
        d2[torch.arange(len(chunk)), idx] = math.inf  # not its own neighbour
        dists.append(d2.topk(k, dim=1, largest=False).values.clamp_min(0).sqrt())
    median = float(torch.cat(dists).median())
    return median if median > 0 else 1.0


class SRFFRegressor(RegressorMixin, BaseEstimator):
    r"""Nonlinear regression with variable selection by sparse random Fourier features.

    The SRFF algorithm of Gregorová et al. (2018), docs/mathematics.md §5: Gaussian-kernel
    random features whose inverse lengthscales γ lie on the simplex cΔ,

    .. math::
        f(x) = z(x)^\top a,\qquad
        z(x) = \sqrt{2/D}\,\cos\!\big(\varepsilon^\top(\gamma\odot x) + b\big),\quad
        \varepsilon_j \sim N(0, I),\ b_j \sim U[0, 2\pi],

    fitted by alternating (1) the ridge solve
    :math:`a \leftarrow \arg\min_a \|y - Za\|^2 + \lambda\|a\|^2` and (2)
    :math:`\gamma \leftarrow \arg\min_{\gamma\in c\Delta}\|y - Za\|^2` by monotone
    FISTA with backtracking and exact simplex projection, until the objective
    converges.  The projection gives exact zeros: inputs with γ_j = 0 do not
    enter the model.  γ starts uniform on the simplex with
    :math:`c = d/\sigma_{med}`, :math:`\sigma_{med}` the median distance among
    20 nearest neighbours; λ is chosen from a data-dependent grid of 50 values
    (geometric, from the largest eigenvalue of :math:`Z^\top Z` at the initial γ
    down to 10⁻⁷ of it) by the mean squared error on a validation split.  Every
    λ is fitted from the uniform γ, as in the paper; the grid is walked from the
    largest λ down and, with ``path_patience = k``, the walk stops once the
    validation error has dropped below that of the most regularised model (≈ the
    mean) and then k consecutive values have not improved on the best (the curve
    is flat, then dips, then rises as the features overfit; ``None`` fits the
    whole grid).

    Inputs and the target are standardised before fitting (so γ is in units of
    standardised inputs, and the fit does not depend on the target's units);
    ``output_weights_`` and predictions are in original units.  A constant input column
    gets γ_j = 0 (its features would not change with it) and ``c`` counts the
    other columns.

    Args:
        n_components: number of random features ``D`` (paper: 300).
        alpha: the ridge penalty λ; ``None`` (default) chooses it on the grid.
        n_alphas: size of the λ grid (paper: 50).
        validation_fraction: share of the rows held out to choose λ (only when
            ``alpha`` is None); the final model is the one trained without them.
            Too few rows to hold one out (and keep two) is a ``ValueError``.
        simplex_size: ``c``; ``None`` uses ``d/σ_med``.
        n_neighbors: neighbours in the σ_med rule (paper: 20).
        max_iter: alternations (ridge solve + γ step) per λ.
        fista_iter: FISTA iterations per γ step.
        tol: relative change of the objective at which the alternation stops.
        path_patience: stop walking the λ grid after this many values without a
            better validation error (``None``: fit all of them).
        random_state: seeds ε, b, the validation split and the neighbour queries.

    Attributes:
        output_weights_: ridge weights ``a`` of the D random features (D,), in the target's
            units.  Not ``coef_``: scikit-learn's ``SelectFromModel`` and ``RFE`` read ``coef_``
            as one weight per input.
        intercept_: the target mean.
        gamma_: inverse lengthscales γ (d,), on the simplex ``c·Δ``.
        relevance_: γ / c, non-negative, summing to one (exact zeros: unused inputs);
            ``feature_importances_`` is the same array (what ``SelectFromModel`` reads).
        selected_: indices of the inputs with γ_j > 0.
        alpha_: the λ used.
        alphas_: the λ tried (the grid up to where ``path_patience`` stopped the walk).
        validation_mse_: their validation scores, in the target's units squared (``None`` when
            none was chosen: ``alpha`` given, or ``n_alphas=1``).
        simplex_size_: ``c``.
        n_iter_: alternations of the final fit.

    Example:
        >>> import numpy as np
        >>> from alacarte import SRFFRegressor
        >>> rng = np.random.default_rng(2)
        >>> x = rng.uniform(-2, 2, (200, 5)); y = np.sin(2 * x[:, 0]) * x[:, 2] + 0.1 * rng.standard_normal(200)
        >>> model = SRFFRegressor(n_components=50, random_state=0).fit(x, y)
        >>> sorted(np.argsort(model.relevance_)[-2:].tolist())   # the two inputs y depends on
        [0, 2]
        >>> model.predict(x[:5]).shape, bool(model.score(x, y) > 0.9)
        ((5,), True)
    """

    def __init__(
        self,
        n_components: int = 300,
        *,
        alpha: float | None = None,
        n_alphas: int = 50,
        validation_fraction: float = 0.2,
        simplex_size: float | None = None,
        n_neighbors: int = 20,
        max_iter: int = 30,
        fista_iter: int = 20,
        tol: float = 1e-4,
        path_patience: int | None = 5,
        random_state: int | np.random.RandomState | None = None,
    ):
        self.n_components = n_components
        self.alpha = alpha
        self.n_alphas = n_alphas
        self.validation_fraction = validation_fraction
        self.simplex_size = simplex_size
        self.n_neighbors = n_neighbors
        self.max_iter = max_iter
        self.fista_iter = fista_iter
        self.tol = tol
        self.path_patience = path_patience
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags

    # -- checks -------------------------------------------------------------------------
    def _check_params(self) -> None:
        for name in ("n_components", "n_alphas", "n_neighbors", "max_iter", "fista_iter"):
            check_positive_int(getattr(self, name), name)
        for name in ("alpha", "simplex_size"):
            check_real(getattr(self, name), name, 0, allow_none=True)
        check_real(self.validation_fraction, "validation_fraction", 0, 1)
        if self.path_patience is not None:
            check_positive_int(self.path_patience, "path_patience")
        check_real(self.tol, "tol", 0, include_low=True)

    # -- fitting ------------------------------------------------------------------------
    @unfitted_on_failure
    def fit(self, X, y) -> SRFFRegressor:
        """Fit the model (and choose λ on a validation split when ``alpha`` is None).

        Args:
            X: training inputs (n, d), finite.
            y: training targets (n,), finite.

        Returns:
            The fitted estimator itself.

        Raises:
            ValueError: for NaN/inf, non-numeric or mismatched data, a bad setting, or too few
                rows for the validation split that chooses ``alpha``.  A failed fit leaves the
                estimator unfitted.
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        y = float64_targets(y)
        n, d = X.shape
        rng = check_random_state(self.random_state)
        seeds = rng.randint(0, 2**31 - 1, size=3)

        self.x_mean_, self.x_scale_ = column_standardization(X)
        y_mean, y_scale = column_standardization(y[:, None], "y")  # a constant y is only centred
        self.intercept_, y_scale = float(y_mean[0]), float(y_scale[0])
        # Constant columns are all zeros once centred: no gradient would ever move their γ_j off its start.
        varying = np.flatnonzero(varying_columns(X))
        xs = torch.tensor((X - self.x_mean_) / self.x_scale_)[:, varying]
        ys = torch.tensor((y - self.intercept_) / y_scale)

        draw = np.random.default_rng(seeds[0])
        self.random_weights_ = draw.standard_normal((self.n_components, d))
        self.random_offset_ = draw.uniform(0.0, 2 * np.pi, self.n_components)
        eps, offset = torch.tensor(self.random_weights_[:, varying]), torch.tensor(self.random_offset_)

        choose = self.alpha is None and self.n_alphas > 1
        train, val = self._split_rows(n, choose, seeds[1])
        problem = _SRFFProblem(xs[train], ys[train], eps, offset)

        sigma = _median_neighbour_distance(problem.x, self.n_neighbors, np.random.default_rng(seeds[2]))
        self.simplex_size_ = float(self.simplex_size) if self.simplex_size is not None else max(len(varying), 1) / sigma
        gamma0 = torch.full((len(varying),), self.simplex_size_ / max(len(varying), 1), dtype=torch.float64)
        self.alphas_ = self._alpha_grid(problem, gamma0)
        if not choose:
            gamma, coef, self.n_iter_ = self._fit_one(problem, gamma0, float(self.alphas_[-1]))
            self.alpha_, self.validation_mse_ = float(self.alphas_[-1]), None
        else:
            gamma, coef, scores = self._walk_path(problem, gamma0, xs[val], ys[val])
            # (numpy, not Python floats: y_scale**2 overflows for targets above ~1e154, where the MSE in
            # the target's units is inf but the standardised fit is fine)
            with np.errstate(over="ignore"):
                self.validation_mse_ = np.array(scores) * np.float64(y_scale) ** 2
            self.alphas_ = self.alphas_[: len(scores)]  # the λ walked: the path may stop early
        self.gamma_ = np.zeros(d)
        self.gamma_[varying] = gamma.numpy()
        self.output_weights_ = coef.numpy() * y_scale
        self.relevance_ = self.feature_importances_ = self.gamma_ / self.simplex_size_
        self.selected_ = np.flatnonzero(self.gamma_ > 0)
        return self

    def _split_rows(self, n: int, choose: bool, seed) -> tuple[Tensor, Tensor | None]:
        """(training rows, validation rows): a seeded split where λ is chosen, else every row and ``None``."""
        if not choose:
            return torch.arange(n), None
        n_val = int(round(self.validation_fraction * n))
        if n_val < 1 or n - n_val < 2:
            raise ValueError(
                f"choosing alpha needs at least 1 validation row and 2 training rows; n_samples = {n} with "
                f"validation_fraction = {self.validation_fraction} holds out {n_val}: pass alpha=..., "
                "or a larger validation_fraction"
            )
        order = np.random.default_rng(seed).permutation(n)
        return torch.as_tensor(order[n_val:]), torch.as_tensor(order[:n_val])

    def _alpha_grid(self, problem: _SRFFProblem, gamma0: Tensor) -> np.ndarray:
        """``alpha`` alone, or ``n_alphas`` values down from the top eigenvalue of ZᵀZ at γ₀."""
        if self.alpha is not None:
            return np.array([float(self.alpha)])
        z0 = problem.features(gamma0)
        top = float(torch.linalg.eigvalsh(z0.T @ z0)[-1])
        return np.geomspace(top, top * _GRID_RANGE, self.n_alphas)

    def _walk_path(self, problem: _SRFFProblem, gamma0: Tensor, x_val: Tensor, y_val: Tensor):
        """Fit at each λ of :attr:`alphas_` from γ₀, scored on the validation rows, until ``path_patience``
        λ pass without a better score; sets ``alpha_`` and ``n_iter_`` of the best.  Returns (γ, a) of the
        best λ and the scores of the λ walked."""
        scores, best, since_best = [], None, 0
        for alpha in self.alphas_:
            gamma, coef, iters = self._fit_one(problem, gamma0, float(alpha))
            pred = problem.features(gamma, x_val) @ coef
            scores.append(float(((y_val - pred) ** 2).mean()))
            if best is None or scores[-1] < best[0]:
                best, since_best = (scores[-1], gamma, coef, float(alpha), iters), 0
            elif best[0] < 0.99 * scores[0]:  # patience counts only past the flat start
                since_best += 1
                if self.path_patience is not None and since_best >= self.path_patience:
                    break
        _, gamma, coef, self.alpha_, self.n_iter_ = best
        return gamma, coef, scores

    def _fit_one(self, problem: _SRFFProblem, gamma: Tensor, alpha: float) -> tuple[Tensor, Tensor, int]:
        """Alternate ridge and γ steps at one λ from ``gamma``; returns (γ, a, iterations)."""
        if gamma.numel() == 0:  # every input constant: only the ridge weights to fit
            return gamma, problem.ridge(gamma, alpha), 0
        step_size = 1.0
        previous = math.inf
        iters = 0
        for iters in range(1, self.max_iter + 1):
            coef = problem.ridge(gamma, alpha)
            objective = problem.loss(gamma, coef) + alpha * float(coef @ coef) / problem.n
            if previous - objective <= self.tol * abs(objective):
                break
            previous = objective
            gamma, _, step_size, _ = monotone_fista(
                problem, gamma, coef, self.simplex_size_, step_size, self.fista_iter, self.tol
            )
        coef = problem.ridge(gamma, alpha)
        return gamma, coef, iters

    # -- prediction ---------------------------------------------------------------------
    def transform_features(self, X) -> np.ndarray:
        """The fitted random features z(x) (n, D)."""
        check_is_fitted(self, "output_weights_")
        return self._features(validate_data(self, X, dtype=np.float64, reset=False))

    def _features(self, X: np.ndarray) -> np.ndarray:
        xs = (X - self.x_mean_) / self.x_scale_
        phases = (xs * self.gamma_) @ self.random_weights_.T + self.random_offset_
        return math.sqrt(2.0 / self.n_components) * np.cos(phases)

    def predict(self, X) -> np.ndarray:
        """f(x) = z(x)ᵀa + intercept, in the target's units."""
        check_is_fitted(self, "output_weights_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        # In blocks of rows, as RFFNet predicts: the features of all m rows at once are m×D (at m = 160 000
        # and D = 300 the peak memory grew by 743 MB, more than fitting on 40 000 rows took).
        out = np.empty(X.shape[0])
        rows = prediction_rows(len(self.output_weights_))
        for start in range(0, X.shape[0], rows):
            out[start : start + rows] = self._features(X[start : start + rows]) @ self.output_weights_
        return out + self.intercept_
