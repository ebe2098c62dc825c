"""RFFNet (Otto & Izbicki), docs/mathematics.md §6: random Fourier features of an ARD
Gaussian kernel, with the relevances learnt jointly with the linear weights.

The model is

    f(x) = βᵀ z(λ ⊙ x) + b₀,     z(u) = √(2/s) cos(Ω u + b),

with Ω (s×d) standard normal and b uniform on [0, 2π): the plain RBF random
Fourier map of unit lengthscale, so that z(λ⊙x)ᵀz(λ⊙x') is an unbiased
estimate of exp(−½ Σⱼ λⱼ²(xⱼ − x'ⱼ)²).  Training minimises

    (1/n) Σᵢ ℓ(yᵢ, f(xᵢ)) + μ ‖β‖²

(squared loss for regression, logistic loss for binary labels; the intercept
b₀ is not penalised) by block stochastic gradient: on every mini-batch one
Adam step on (β, b₀) with λ fixed, then one Adam step on λ at the new β
(the paper's Algorithm 1).  A fraction of the data is held out; training stops
when the validation loss has not improved for ``patience`` epochs, and the
parameters of the best epoch are restored (a copy, not a view of the live
weights).  Relevances are ``|λ|`` scaled to [0, 1].

Departures from the public implementation, each for a reason:

* λ starts at 1/√d (not 0): at λ = 0 every feature is constant in x and the
  λ-gradient is tiny, so relevances barely move in a realistic budget.
* Inputs are standardised and regression targets centred and scaled (both
  undone in ``predict``), so the defaults work whatever the units are and the
  relevances of different inputs are comparable.
* The gradients are written out by hand (checked against autograd in the
  tests): one pass over each mini-batch serves both block updates.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, check_random_state, validate_data
from torch import Tensor

from .._chunks import DEFAULT_MEMORY_BUDGET, rows_within
from .._validation import check_positive_int, check_real, column_standardization, float64_targets, unfitted_on_failure, varying_columns

__all__ = ["RFFNetRegressor", "RFFNetClassifier"]


def prediction_rows(num_features: int, itemsize: int = 8) -> int:
    """Rows per block at prediction: an m×s projection and its cosine within the package's one budget."""
    return rows_within(DEFAULT_MEMORY_BUDGET, 2 * num_features * itemsize)


def default_num_features(n: int) -> int:
    """The paper's default number of random features, ⌊√n log n⌋ (at least 1)."""
    return max(1, int(math.floor(math.sqrt(n) * math.log(n)))) if n > 1 else 1


class _RFFNetParameters:
    """The trainable state (β, b₀, λ) and the fixed random map (Ω, b)."""

    def __init__(self, omega: Tensor, phase: Tensor, relevance: Tensor):
        s = omega.shape[0]
        self.omega, self.phase = omega, phase
        self.scale = math.sqrt(2.0 / s)
        self.beta = torch.zeros(s, dtype=omega.dtype)
        self.intercept = torch.zeros(1, dtype=omega.dtype)
        self.relevance = relevance

    def projections(self, x: Tensor) -> Tensor:
        """P = (λ⊙x) Ωᵀ + b, shape (m, s)."""
        return torch.addmm(self.phase, x * self.relevance, self.omega.T)

    def decision(self, x: Tensor) -> Tensor:
        """f(x), evaluated in blocks of rows."""
        out = torch.empty(x.shape[0], dtype=x.dtype)
        rows = prediction_rows(self.omega.shape[0], x.element_size())
        for start in range(0, x.shape[0], rows):
            block = x[start:start + rows]
            out[start:start + rows] = torch.cos(self.projections(block)) @ self.beta * self.scale + self.intercept
        return out

    def snapshot(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.beta.clone(), self.intercept.clone(), self.relevance.clone()

    def restore(self, state: tuple[Tensor, Tensor, Tensor]) -> None:
        # copy_ into the live tensors: the optimiser and the snapshot never share storage
        for live, saved in zip((self.beta, self.intercept, self.relevance), state):
            live.copy_(saved)


def _loss(f: Tensor, y: Tensor, kind: str) -> Tensor:
    """Mean loss: squared error, or logistic loss for y in {0, 1}."""
    if kind == "squared":
        return torch.mean((f - y) ** 2)
    return torch.mean(torch.nn.functional.softplus(f) - y * f)


def _loss_derivative(f: Tensor, y: Tensor, kind: str) -> Tensor:
    """∂ℓ(y, f)/∂f per point (not yet divided by the batch size)."""
    if kind == "squared":
        return 2.0 * (f - y)
    return torch.sigmoid(f) - y


def objective(params: _RFFNetParameters, x: Tensor, y: Tensor, alpha: float, kind: str) -> Tensor:
    """The training objective (1/n) Σ ℓ(yᵢ, f(xᵢ)) + μ‖β‖² on (x, y)."""
    return _loss(params.decision(x), y, kind) + alpha * params.beta.square().sum()


def block_gradients(
    params: _RFFNetParameters, x: Tensor, y: Tensor, alpha: float, kind: str, beta_step=None
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the mini-batch objective for the two blocks.

    Returns (∂/∂β, ∂/∂b₀) at the current parameters and ∂/∂λ at the
    parameters after ``beta_step`` (a callable that updates β and b₀ in place
    given their gradients; ``None`` leaves them unchanged).  The projections
    are computed once: λ does not change between the two blocks.

    With r = ℓ'(y, f)/m and P the projections,
        ∂/∂β = √(2/s) cos(P)ᵀ r + 2μβ,   ∂/∂b₀ = Σ r,
        ∂/∂λⱼ = −√(2/s) Σᵢ xᵢⱼ [(r ⊗ β) ⊙ sin(P) Ω]ᵢⱼ.
    """
    m = x.shape[0]
    proj = params.projections(x)
    features = torch.cos(proj).mul_(params.scale)
    r = _loss_derivative(features @ params.beta + params.intercept, y, kind).div_(m)
    grad_beta = torch.addmv(params.beta, features.T, r, beta=2.0 * alpha)
    grad_intercept = r.sum().reshape(1)
    if beta_step is not None:
        beta_step(grad_beta, grad_intercept)
        r = _loss_derivative(features @ params.beta + params.intercept, y, kind).div_(m)
    weighted = torch.sin(proj).mul_(r[:, None] * params.beta).mul_(-params.scale)
    grad_relevance = ((weighted @ params.omega) * x).sum(0)
    return grad_beta, grad_intercept, grad_relevance


class _Adam:
    """Adam on one block of tensors (Kingma & Ba), updating them in place."""

    def __init__(self, tensors: list[Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.tensors, self.lr, self.betas, self.eps = tensors, lr, betas, eps
        self.m = [torch.zeros_like(t) for t in tensors]
        self.v = [torch.zeros_like(t) for t in tensors]
        self.t = 0

    def step(self, grads: list[Tensor]) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for t, g, m, v in zip(self.tensors, grads, self.m, self.v):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            t.addcdiv_(m, v.div(c2).sqrt_().add_(self.eps), value=-self.lr / c1)


class _RFFNetBase(BaseEstimator):
    _loss_kind: str = "squared"

    def __init__(
        self,
        n_random_features: int | None = None,
        alpha: float = 1e-4,
        learning_rate: float = 1e-2,
        batch_size: int = 32,
        max_epochs: int = 100,
        patience: int = 10,
        validation_fraction: float = 0.1,
        selection_threshold: float = 0.1,
        random_state: int | np.random.RandomState | None = None,
    ):
        self.n_random_features = n_random_features
        self.alpha = alpha
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.validation_fraction = validation_fraction
        self.selection_threshold = selection_threshold
        self.random_state = random_state

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        for name in ("batch_size", "max_epochs", "patience"):
            check_positive_int(getattr(self, name), name)
        if self.n_random_features is not None:
            check_positive_int(self.n_random_features, "n_random_features")
        check_real(self.alpha, "alpha", 0, include_low=True)
        check_real(self.learning_rate, "learning_rate", 0)
        check_real(self.validation_fraction, "validation_fraction", 0, 1, include_low=True)
        check_real(self.selection_threshold, "selection_threshold", 0, 1, include_low=True)

    # ---------------------------------------------------------------- training
    def _fit_targets(self, X: np.ndarray, targets: np.ndarray):
        """Train on float targets (standardised regression targets or 0/1 labels)."""
        n, d = X.shape
        n_val = int(math.ceil(self.validation_fraction * n)) if self.validation_fraction > 0 else 0
        if n - n_val < 1 or (n_val > 0 and n < 2):
            raise ValueError(
                f"RFFNet needs at least one training and one validation point; got {n} sample(s) "
                f"with validation_fraction={self.validation_fraction}"
            )
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        gen = torch.Generator().manual_seed(int(seed))

        self.x_mean_, self.x_scale_ = column_standardization(X)
        x = torch.from_numpy((X - self.x_mean_) / self.x_scale_)
        y = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float64))

        order = torch.randperm(n, generator=gen)
        self.validation_indices_ = order[:n_val].numpy()
        train_idx = order[n_val:]
        x_train, y_train = x[train_idx], y[train_idx]
        x_val, y_val = x[order[:n_val]], y[order[:n_val]]
        n_train = x_train.shape[0]

        s = self.n_random_features or default_num_features(n_train)
        omega = torch.randn(s, d, generator=gen, dtype=torch.float64)
        phase = torch.rand(s, generator=gen, dtype=torch.float64) * (2 * math.pi)
        # A constant column is all zeros once centred: its λ_j gets no gradient and would keep its start.
        start = np.where(varying_columns(X), 1.0 / math.sqrt(d), 0.0)
        params = _RFFNetParameters(omega, phase, torch.from_numpy(start))
        history, best_epoch = self._train(params, (x_train, y_train), (x_val, y_val), gen)
        self.network_ = params
        self.n_features_in_ = d
        self.n_random_features_ = s
        self.validation_loss_ = np.array(history)
        self.best_epoch_ = best_epoch
        self.n_epochs_ = len(history)
        self.output_weights_ = params.beta.numpy().copy()
        self.intercept_ = float(params.intercept)
        magnitude = params.relevance.abs().numpy()
        self.input_scales_ = magnitude / self.x_scale_
        top = magnitude.max()
        self.relevance_ = self.feature_importances_ = magnitude / top if top > 0 else magnitude
        self.selected_ = np.flatnonzero(self.relevance_ > self.selection_threshold)
        return self

    def _train(self, params: _RFFNetParameters, train, val, gen: torch.Generator) -> tuple[list[float], int]:
        """Alternate Adam steps on β and on λ over mini-batches of the ``train`` rows (x, y), epoch after
        epoch, until ``patience`` epochs pass without a lower loss on the ``val`` rows (none: every epoch
        counts, to ``max_epochs``); leaves ``params`` at the best epoch's.  Returns (the loss of every
        epoch, the best epoch)."""
        (x_train, y_train), (x_val, y_val) = train, val
        n_train, n_val = x_train.shape[0], x_val.shape[0]
        opt_beta = _Adam([params.beta, params.intercept], self.learning_rate)
        opt_relevance = _Adam([params.relevance], self.learning_rate)

        def beta_step(g_beta, g_intercept):
            opt_beta.step([g_beta, g_intercept])

        kind = self._loss_kind
        history: list[float] = []
        best_loss, best_epoch, best_state, stale = math.inf, -1, params.snapshot(), 0
        for epoch in range(self.max_epochs):
            perm = torch.randperm(n_train, generator=gen)
            for start in range(0, n_train, self.batch_size):
                idx = perm[start:start + self.batch_size]
                _, _, g_rel = block_gradients(params, x_train[idx], y_train[idx], self.alpha, kind, beta_step)
                opt_relevance.step([g_rel])
            if n_val == 0:
                history.append(float(_loss(params.decision(x_train), y_train, kind)))
                best_epoch, best_state = epoch, params.snapshot()
                continue
            val_loss = float(_loss(params.decision(x_val), y_val, kind))
            history.append(val_loss)
            if val_loss < best_loss:
                best_loss, best_epoch, best_state, stale = val_loss, epoch, params.snapshot(), 0
            else:
                stale += 1
                if stale >= self.patience:
                    break
        if not all(map(math.isfinite, history)):
            raise ValueError("RFFNet training diverged (non-finite loss); lower learning_rate")
        params.restore(best_state)
        return history, best_epoch

    def _decision(self, X) -> np.ndarray:
        check_is_fitted(self, "network_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        x = torch.from_numpy((X - self.x_mean_) / self.x_scale_)
        return self.network_.decision(x).numpy()


class RFFNetRegressor(RegressorMixin, _RFFNetBase):
    """RFFNet regression: squared loss on an ARD random-Fourier-feature model.

    Args:
        n_random_features: s, the number of random features (default ⌊√n log n⌋
            for n training points).
        alpha: μ, the ridge penalty on β (standardised units).
        learning_rate: Adam's step size, for both blocks.
        batch_size: mini-batch size.
        max_epochs: epochs at most.
        patience: stop after this many epochs without a better validation loss.
        validation_fraction: fraction of the data held out for early stopping
            (0: no early stopping, the last epoch is kept).
        selection_threshold: inputs whose scaled relevance exceeds it are in
            ``selected_``.
        random_state: seed for the split, the random map and the mini-batches.

    Fitted attributes: ``relevance_`` (``|λ|`` scaled to [0, 1], per input; also
    ``feature_importances_``, which scikit-learn's ``SelectFromModel`` and ``RFE`` read),
    ``selected_`` (indices of inputs with relevance above the threshold),
    ``input_scales_`` (``|λ|`` in the input's own units: an inverse lengthscale),
    ``output_weights_``/``intercept_`` (β, b₀; not ``coef_``, which those read as
    one weight per input), ``validation_loss_`` (per epoch; with
    ``validation_fraction=0`` the training loss, there being no validation rows),
    ``best_epoch_`` (the epoch restored), ``n_epochs_`` (epochs run), ``n_random_features_``.

    Example:
        >>> from alacarte import RFFNetRegressor
        >>> from alacarte.datasets import make_se1
        >>> x, y, relevant = make_se1(2000, seed=0)
        >>> model = RFFNetRegressor(max_epochs=20, random_state=0).fit(x, y)
        >>> model.predict(x[:3]).shape
        (3,)
    """

    @unfitted_on_failure
    def fit(self, X, y) -> "RFFNetRegressor":
        """Fit β and the relevances λ by alternating Adam steps on mini-batches.

        Args:
            X: training inputs (n, d), finite.
            y: training targets (n,), finite.

        Returns:
            The fitted estimator itself.

        Raises:
            ValueError: for NaN/inf, non-numeric or mismatched data, a bad setting, too few
                rows for the validation split, or a diverged training.  A failed fit leaves the
                estimator unfitted.
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        y = float64_targets(y).reshape(-1)
        y_mean, y_scale = column_standardization(y[:, None], "y")  # a constant y is only centred
        self.y_mean_, self.y_scale_ = float(y_mean[0]), float(y_scale[0])
        return self._fit_targets(X, (y - self.y_mean_) / self.y_scale_)

    def predict(self, X) -> np.ndarray:
        """Predictions f(x) (m,) at inputs X (m, d), in the targets' units."""
        return self._decision(X) * self.y_scale_ + self.y_mean_


class RFFNetClassifier(ClassifierMixin, _RFFNetBase):
    """RFFNet binary classification: logistic loss on an ARD random-Fourier-feature
    model, P(y = classes_[1] | x) = sigmoid(f(x)).

    Same arguments and fitted attributes as :class:`RFFNetRegressor`, plus
    ``classes_``.  Only two classes are supported.

    Example:
        >>> import numpy as np
        >>> from alacarte import RFFNetClassifier
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((500, 5)); labels = np.where(x[:, 0] * x[:, 1] > 0, "a", "b")
        >>> clf = RFFNetClassifier(max_epochs=30, random_state=0).fit(x, labels)
        >>> clf.predict_proba(x[:2]).shape
        (2, 2)
    """

    _loss_kind = "logistic"

    @unfitted_on_failure
    def fit(self, X, y) -> "RFFNetClassifier":
        """Fit β and the relevances λ to labels of two classes (any labels: ``classes_`` keeps them).

        Args:
            X: training inputs (n, d), finite.
            y: training labels (n,), exactly two distinct values.

        Returns:
            The fitted estimator itself.

        Raises:
            ValueError: as for :meth:`RFFNetRegressor.fit`, or for labels of another number
                of classes than two.
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if len(self.classes_) != 2:
            raise ValueError(
                f"Only binary classification is supported: RFFNetClassifier needs exactly 2 classes, "
                f"y has {len(self.classes_)} class(es): {self.classes_.tolist()[:10]}"
            )
        return self._fit_targets(X, encoded.astype(np.float64))

    def decision_function(self, X) -> np.ndarray:
        """The logit f(x) (m,) of P(y = classes_[1] | x) at inputs X (m, d)."""
        return self._decision(X)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities (m, 2), columns in the order of ``classes_``, at inputs X (m, d)."""
        p = expit(self._decision(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X) -> np.ndarray:
        """The more probable class (m,) at inputs X (m, d) (``classes_[1]`` where f(x) > 0)."""
        positive = self._decision(X) > 0
        return self.classes_[positive.astype(int)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags
