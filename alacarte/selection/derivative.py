"""Derivative-based nonlinear variable selection (Rosasco et al. 2010), docs/mathematics.md §7.

The inputs are first standardised on the training data (each column centred
and divided by its standard deviation; a constant column is only centred), so
selection does not depend on the inputs' units or offsets.  Below, x denotes the
standardised inputs.  Over the RKHS of the Gaussian kernel
k(x, x') = exp(−γ‖x − x'‖²) it minimises

    E(f) + 2τ R(f) + μ‖f‖²_H,
    E(f) = (1/n) Σᵢ (yᵢ − f(xᵢ))²,   R(f) = Σⱼ √((1/n) Σᵢ (∂ⱼf(xᵢ))²),

(y centred, not scaled; the mean is added back in ``predict``).  ∂ⱼf is the derivative with
respect to the standardised input j, i.e. per standard deviation of input j, so
rescaling an input changes neither the objective nor the selection.  The paper's functional
(1) is μ = 0, but then its infimum is 0 for any data: the Gaussian RKHS holds
an f with f(xᵢ) = yᵢ and ∇f(xᵢ) = 0 at every training point (the value and
derivative functionals are linearly independent), so (1) alone only
"works" through early stopping.  The small RKHS ridge μ (the strictly convex
term of the paper's remark after Theorem 1, and of the journal version,
Rosasco et al. JMLR 2013) makes the minimiser unique and well posed; it enters
the forward (gradient) step.  Minimised by the paper's iterative
projection algorithm (Algorithm 1, eq. 14–17): a forward–backward iteration
whose backward step, the projection onto the subdifferential of R at 0, is
itself computed by the inner iteration (17).  With ⟨u, v⟩ₙ = (1/n) Σ uᵢvᵢ,
the sampling operator S, the empirical gradient ∇̂ and f = S*α + ∇̂*β
(α ∈ ℝⁿ, β ∈ ℝⁿᵈ)::

    K = S S*        Kᵢₛ = k(xᵢ, xₛ)/n
    Zⱼ = S D̂ⱼ*      (Zⱼ)ᵢₛ = 2γ (xᵢʲ − xₛʲ) k(xᵢ, xₛ)/n          (D̂ⱼ S* = Zⱼᵀ)
    L = ∇̂ ∇̂*       (Lⱼₗ)ᵢₛ = [2γ δⱼₗ − 4γ² (xᵢʲ − xₛʲ)(xᵢˡ − xₛˡ)] k(xᵢ, xₛ)/n

    α ← (1 − μ/2σ) α − (2σ)⁻¹ (Kα + Zβ − y),   β ← (1 − μ/2σ) β          (14)
    repeat  gʲ = Lⱼ(v − β/r) − Zⱼᵀα / r,
            vʲ ← (vʲ − η gʲ) / (1 + η ‖gʲ‖ₙ)                               (17)
    β ← β − r v̄                                                          (15)

with η = 1/‖L‖, σ = (‖K‖ + μ)/2 (step 1/Lip of the smooth part's gradient)
and projection radius r = τ/(2σ).  The paper prints r = τ/σ; with its own normalisations the fixed
point of that iteration minimises E + 4τR rather than its eq. (1), so we use
the radius that solves (1) exactly (the tests check the result against a
direct convex solve).  Both loops stop with the paper's rule:
‖f_t − f_{t−1}‖_H ≤ tol and ‖∇̂*(v_q − v_{q−1})‖_H ≤ tol, evaluated through
K, Z and L.  The inner loop starts from the previous outer iteration's v̄
instead of 0 (same fixed point, a small fraction of the iterations).  Kα + Zβ,
Zᵀα + Lβ and L v are linear in the iterates and are carried along with them, so
an inner step takes one product with the (nd)² matrix L and an outer step none:
the iterates of the equations as printed, 1.9–3.2× faster at n = 80–400
(experiments/results/derivative_selector.md).

Variables are selected where Σᵢ (∂ⱼf(xᵢ))² exceeds the threshold (τ by
default, as in the paper); with ``refit=True`` (the paper's "GR" variant)
predictions come from kernel ridge regression on the selected (standardised)
variables only.  Hyperparameters chosen for raw inputs of variance v carry
over as γ·v (kernel widths), τ/√v (the derivative per standard deviation is √v
times the raw one) and threshold·v.

The targets are not standardised (the paper's functional is in y's units), so τ,
``threshold`` and ``tol`` are in y's units too, and the selection changes with them:
for targets s·y, the fit with s·τ, s²·threshold and s·tol is s·f with the same
selection, whereas keeping the settings changes it (Rosasco et al.'s f3, n = 60,
τ = 10⁻³, γ = 0.6: inputs {0, 4} selected for y, all six for 1000·y, none for
y/1000).  Scale τ with the spread of y (τ = c·std(y), as
experiments/selection_rffnet.py does).

Memory is O((n d)²) for L: this is a small-data baseline, and it refuses
(ValueError) problems whose matrices would exceed ``max_memory_bytes``.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.spatial.distance import cdist
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.kernel_ridge import KernelRidge
from sklearn.utils.validation import check_is_fitted, validate_data

from .._validation import (
    check_bool,
    check_positive_int,
    check_real,
    column_standardization,
    float64_targets,
    unfitted_on_failure,
    varying_columns,
)

__all__ = ["DerivativeSelector"]


def _gram_blocks(x: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K (n×n), Z = [Z₁ … Z_d] (n×nd) and L (nd×nd), blocks ordered by input j."""
    n, d = x.shape
    diff = x[:, None, :] - x[None, :, :]  # (n, n, d): xᵢ − xₛ
    k = torch.exp(-gamma * diff.square().sum(-1)) / n
    z = (2 * gamma) * diff * k[..., None]  # (i, s, j)
    z = z.permute(0, 2, 1).reshape(n, d * n)  # column j·n + s
    # L[(j,i),(l,s)] = (2γ δⱼₗ − 4γ² Δʲ Δˡ) k
    outer = diff.permute(2, 0, 1)  # (j, i, s)
    big = (-4 * gamma**2) * outer[:, None] * outer[None, :] * k  # (j, l, i, s)
    idx = torch.arange(d)
    big[idx, idx] += 2 * gamma * k
    big = big.permute(0, 2, 1, 3).reshape(d * n, d * n)
    return k, z, big


def _memory_bytes(n: int, d: int) -> int:
    """L and its (j, l, i, s) construction buffer, plus K, Z and the differences."""
    return 8 * (2 * (n * d) ** 2 + 3 * n * n * d + n * n)


def _top_eigenvalue(matrix: torch.Tensor) -> float:
    return float(torch.linalg.eigvalsh(matrix)[-1]) if matrix.shape[0] <= 2000 else _power_norm(matrix)


def _power_norm(matrix: torch.Tensor, iters: int = 500) -> float:
    v = torch.ones(matrix.shape[0], dtype=matrix.dtype)
    value = 0.0
    for _ in range(iters):
        w = matrix @ v
        new = float(torch.linalg.norm(w))
        v = w / new
        if abs(new - value) <= 1e-12 * new:
            break
        value = new
    return new * 1.01  # a safe upper bound for the step size


class DerivativeSelector(RegressorMixin, BaseEstimator):
    """Nonlinear variable selection by penalised partial derivatives
    (Rosasco, Santoro, Mosci, Verri & Villa, AISTATS 2010).

    Args:
        tau: τ, the weight of the derivative penalty, in y's units (see above: not
            standardised).
        mu: μ, the RKHS ridge that makes the problem well posed (see above).
        gamma: Gaussian kernel k = exp(−γ‖x − x'‖²) on the standardised inputs;
            ``None`` → 1/d, d counting the inputs that are not constant.
        threshold: select input j when Σᵢ (∂ⱼf(xᵢ))² exceeds it (derivatives per
            standard deviation of input j, in y's units: it scales with y²); ``None`` → τ.
        refit: predict with kernel ridge regression on the selected inputs
            (the paper's Alg1-GR); ``False`` predicts with the penalised f itself.
        refit_alpha: the ridge of that refit (sklearn ``KernelRidge(alpha=...)``).
        refit_gamma: the refit's kernel parameter (on the standardised selected
            inputs); ``None`` → ``gamma_``.  A kernel on fewer inputs usually
            wants a narrower width.
        tol: the stopping tolerance of both loops (in the RKHS norm, in y's units).
        max_iter, max_inner_iter: iteration caps of the outer and inner loops.
        max_memory_bytes: refuse problems whose (n·d)² matrices need more.
        warm_start: start from the previous fit's coefficients (the paper's
            continuation along a decreasing τ path, same data).

    Fitted attributes: ``x_mean_`` and ``x_scale_`` (the training columns' means
    and standard deviations, 1 for a constant column), ``gamma_``,
    ``dual_coef_`` (α, (n,)), ``derivative_coef_`` (β, (n, d)),
    ``derivative_norms_`` (√((1/n)Σᵢ(∂ⱼf(xᵢ))²) per input, the derivative per
    unit of standard deviation of that input), ``relevance_`` (those scaled to
    [0, 1]; also ``feature_importances_``, which scikit-learn's ``SelectFromModel``
    reads), ``selected_`` (indices), ``n_iter_``, ``converged_``, ``ridge_``
    (the refit KernelRidge on the standardised selected inputs, or ``None``),
    ``refit_`` (whether ``predict`` uses it), ``x_train_`` (the standardised training inputs).

    Example:
        >>> from alacarte import DerivativeSelector
        >>> from alacarte.datasets import make_rosasco
        >>> x, y, relevant = make_rosasco("f3", 80, seed=0)
        >>> model = DerivativeSelector(tau=1e-3, gamma=0.6).fit(x, y)
        >>> model.predict(x[:2]).shape
        (2,)
    """

    def __init__(
        self,
        tau: float = 0.01,
        mu: float = 1e-4,
        gamma: float | None = None,
        threshold: float | None = None,
        refit: bool = True,
        refit_alpha: float = 1e-3,
        refit_gamma: float | None = None,
        tol: float = 1e-6,
        max_iter: int = 5000,
        max_inner_iter: int = 1000,
        max_memory_bytes: int = 2 * 2**30,
        warm_start: bool = False,
    ):
        self.tau = tau
        self.mu = mu
        self.gamma = gamma
        self.threshold = threshold
        self.refit = refit
        self.refit_alpha = refit_alpha
        self.refit_gamma = refit_gamma
        self.tol = tol
        self.max_iter = max_iter
        self.max_inner_iter = max_inner_iter
        self.max_memory_bytes = max_memory_bytes
        self.warm_start = warm_start

    def _check_params(self) -> None:
        for name in ("tau", "tol", "refit_alpha"):
            check_real(getattr(self, name), name, 0)
        check_real(self.mu, "mu", 0, include_low=True)
        for name in ("gamma", "threshold", "refit_gamma"):
            check_real(getattr(self, name), name, 0, allow_none=True)
        for name in ("refit", "warm_start"):
            check_bool(getattr(self, name), name)
        for name in ("max_iter", "max_inner_iter", "max_memory_bytes"):
            check_positive_int(getattr(self, name), name)

    @unfitted_on_failure
    def fit(self, X, y) -> "DerivativeSelector":
        """Solve the derivative-penalised problem for f, select the inputs, and refit if ``refit``.

        Args:
            X: training inputs (n, d), finite.
            y: training targets (n,), finite.

        Returns:
            The fitted estimator itself.

        Raises:
            ValueError: for NaN/inf, non-numeric or mismatched data, a bad setting, or a problem
                whose (n·d)² matrices exceed ``max_memory_bytes``.  A failed fit leaves the
                estimator unfitted.
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        y = float64_targets(y).reshape(-1)
        n, d = X.shape
        self._check_memory(n, d)
        self.x_mean_, self.x_scale_ = column_standardization(X)
        X = self._standardise(X)
        # (a constant column is zeros once standardised and adds nothing to ‖x − x'‖²: counting it in d
        # would narrow the default kernel and change the fit of the other inputs)
        varying = int(np.count_nonzero(varying_columns(X)))
        self.gamma_ = self.gamma if self.gamma is not None else 1.0 / max(varying, 1)
        self.y_mean_ = float(column_standardization(y[:, None], "y")[0][0])
        self.x_train_ = X
        K, Z, L = _gram_blocks(torch.from_numpy(X), self.gamma_)
        alpha, beta = self._solve(K, Z, L, torch.from_numpy(y - self.y_mean_))
        self.dual_coef_ = alpha.numpy().copy()
        self.derivative_coef_ = beta.reshape(d, n).T.numpy().copy()
        if not self.converged_:
            warnings.warn(f"DerivativeSelector did not converge in max_iter={self.max_iter} iterations "
                          f"(tol={self.tol}); raise max_iter or tol", ConvergenceWarning,
                          stacklevel=3)  # the caller of fit (under unfitted_on_failure's frame)
        # D̂ⱼ f = Zⱼᵀα + Lⱼβ: the partial derivatives at the training points, computed afresh rather than
        # taken from the carried values, so that what is reported holds no round-off carried over the iterations
        grads = (Z.T @ alpha + L @ beta).reshape(d, n)
        self.derivative_norms_ = grads.square().mean(1).sqrt().numpy()
        self.fitted_values_ = (K @ alpha + Z @ beta).numpy() + self.y_mean_
        self._select(X, y, n)
        self.n_features_in_ = d
        return self

    def _check_memory(self, n: int, d: int) -> None:
        need = _memory_bytes(n, d)
        if need > self.max_memory_bytes:
            raise ValueError(
                f"DerivativeSelector needs about {need / 2**30:.2f} GiB for n={n}, d={d} (its (n·d)² = "
                f"{(n * d) ** 2:.3g}-entry derivative Gram matrix), above max_memory_bytes="
                f"{self.max_memory_bytes / 2**30:.2f} GiB. It is a small-data baseline: subsample, raise "
                f"max_memory_bytes, or use RFFNetRegressor."
            )

    def _solve(self, K: torch.Tensor, Z: torch.Tensor, L: torch.Tensor, yc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The coefficients (α, β) of f by the proximal iterations (14)–(17), from zero or, with
        ``warm_start``, from the last fit's; sets ``n_iter_``, ``n_inner_iter_`` and ``converged_``."""
        n, d = yc.shape[0], Z.shape[1] // yc.shape[0]
        sigma = (_top_eigenvalue(K) + self.mu) / 2
        shrink = 1 - self.mu / (2 * sigma)
        eta = 1.0 / _top_eigenvalue(L)
        radius = self.tau / (2 * sigma)
        warm = (self.warm_start and getattr(self, "dual_coef_", None) is not None and self.dual_coef_.shape == (n,)
                and self.derivative_coef_.shape == (n, d))
        alpha = torch.from_numpy(self.dual_coef_.copy()) if warm else torch.zeros(n, dtype=torch.float64)
        beta = torch.from_numpy(self.derivative_coef_.T.reshape(-1).copy()) if warm else torch.zeros(n * d, dtype=torch.float64)
        # f's values and derivatives at the data, and L v: carried along (module docstring)
        values, grads = K @ alpha + Z @ beta, Z.T @ alpha + L @ beta
        v = torch.zeros(n * d, dtype=torch.float64)
        lv = torch.zeros(n * d, dtype=torch.float64)
        converged, inner_total = False, 0
        for it in range(1, self.max_iter + 1):
            residual = values - yc
            alpha_new = shrink * alpha - residual / (2 * sigma)  # (14)
            beta_half = shrink * beta
            grads_half = shrink * grads - Z.T @ residual / (2 * sigma)  # Zᵀα_new + Lβ_half
            offset = grads_half / radius  # g = L v − offset
            for _ in range(self.max_inner_iter):  # (17)
                inner_total += 1
                g = (lv - offset).reshape(d, n)
                g_norm = g.square().mean(1).sqrt()  # ‖gʲ‖ₙ
                v_new = ((v.reshape(d, n) - eta * g) / (1 + eta * g_norm)[:, None]).reshape(-1)
                dv = v_new - v
                l_dv = L @ dv
                v, lv = v_new, lv + l_dv
                if math.sqrt(max(float(dv @ l_dv), 0.0) / n) <= self.tol:
                    break
            beta_new = beta_half - radius * v  # (15)
            grads_new = grads_half - radius * lv
            values_new = K @ alpha_new + Z @ beta_new
            # ‖f_t − f_{t−1}‖²_H = δαᵀ(Kδα + Zδβ) + δβᵀ(Zᵀδα + Lδβ), over n
            step = math.sqrt(max(float((alpha_new - alpha) @ (values_new - values)
                                       + (beta_new - beta) @ (grads_new - grads)), 0.0) / n)
            alpha, beta, values, grads = alpha_new, beta_new, values_new, grads_new
            if step <= self.tol:
                converged = True
                break
        self.n_iter_, self.n_inner_iter_, self.converged_ = it, inner_total, converged
        return alpha, beta

    def _select(self, X: np.ndarray, y: np.ndarray, n: int) -> None:
        """The relevances and the inputs whose derivative norm passes the threshold; the ridge refit on
        them if ``refit``."""
        top = self.derivative_norms_.max()
        self.relevance_ = self.feature_importances_ = (self.derivative_norms_ / top if top > 0
                                                      else self.derivative_norms_.copy())
        threshold = self.tau if self.threshold is None else self.threshold
        self.selected_ = np.flatnonzero(n * self.derivative_norms_**2 > threshold)
        self.ridge_ = None
        self.refit_ = bool(self.refit)  # what predict does: set_params(refit=...) alone must not change it
        if self.refit_ and len(self.selected_) > 0:
            refit_gamma = self.gamma_ if self.refit_gamma is None else self.refit_gamma
            self.ridge_ = KernelRidge(alpha=self.refit_alpha, kernel="rbf", gamma=refit_gamma)
            self.ridge_.fit(X[:, self.selected_], y - self.y_mean_)

    def _standardise(self, X: np.ndarray) -> np.ndarray:
        return (X - self.x_mean_) / self.x_scale_

    def predict_penalized(self, X) -> np.ndarray:
        """The penalised f itself (Alg1 without the refit), whatever ``refit`` says."""
        check_is_fitted(self, "dual_coef_")
        X = self._standardise(validate_data(self, X, reset=False, dtype=np.float64))
        x_train, beta, gamma = self.x_train_, self.derivative_coef_, self.gamma_
        k = np.exp(-gamma * cdist(X, x_train, "sqeuclidean"))  # (m, n)
        # f(x) = (1/n) Σₛ k(x, xₛ) [αₛ + 2γ Σⱼ βₛʲ (xʲ − xₛʲ)]
        #      = (1/n) [(k (α − 2γ Σⱼ βʲ ⊙ xʲ))(x) + 2γ Σⱼ xʲ (k βʲ)(x)]:
        # products with k, not the (m, n, d) differences (541 MB at m = 20,000, n = 300, d = 6)
        shifted = self.dual_coef_ - 2 * gamma * np.einsum("sj,sj->s", beta, x_train)
        return (k @ shifted + 2 * gamma * np.einsum("mj,mj->m", X, k @ beta)) / x_train.shape[0] + self.y_mean_

    def predict(self, X) -> np.ndarray:
        """Predictions (m,) at inputs X (m, d), in the targets' units: the refit's on the selected
        inputs (the training mean where none was selected), or with ``refit=False`` the penalised
        f's (:meth:`predict_penalized`)."""
        check_is_fitted(self, "dual_coef_")
        if not self.refit_:
            return self.predict_penalized(X)
        X = self._standardise(validate_data(self, X, reset=False, dtype=np.float64))
        if self.ridge_ is None:  # nothing selected: the mean
            return np.full(X.shape[0], self.y_mean_)
        return self.ridge_.predict(X[:, self.selected_]) + self.y_mean_
