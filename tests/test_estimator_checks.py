"""scikit-learn's own estimator contract (:mod:`sklearn.utils.estimator_checks`) for every estimator,
one test per check, so that a regression shows up by name: clone and get/set_params round trips,
fit returning self, refit idempotence, n_features_in_ and feature names, NotFittedError before fit,
dtypes, sample-order invariance, pickling, classes_ and predict_proba, ...

Every check applies and passes: no estimator has an expected failure.  sklearn itself skips
check_array_api_input without SCIPY_ARRAY_API, and its pandas checks without pandas (a test
dependency).  Settings are the smallest that still fit, so that all of them run in about half a minute.
"""
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_dataframe_column_names_consistency, parametrize_with_checks

from alacarte import AlaCarteRegressor, DerivativeSelector, RFFNetClassifier, RFFNetRegressor, SRFFRegressor

ESTIMATORS = [
    AlaCarteRegressor(num_samples=16, num_components=2, max_iter=10, restarts=1, restart_iter=3),
    SRFFRegressor(n_components=20, n_alphas=4, max_iter=5, fista_iter=5, random_state=0),
    RFFNetRegressor(max_epochs=30, learning_rate=0.02, random_state=0),
    RFFNetClassifier(max_epochs=30, learning_rate=0.02, random_state=0),
    # (30 iterations do not converge: the checks test the contract, not the optimiser)
    DerivativeSelector(tau=1e-6, tol=1e-5, max_iter=30, max_inner_iter=30),
]


@pytest.mark.filterwarnings("ignore", category=ConvergenceWarning)
@parametrize_with_checks(ESTIMATORS)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# Not among the checks above (scikit-learn runs it from its own test suite): a DataFrame's column names
# are kept in feature_names_in_, and predicting on other or reordered columns is a ValueError, not a
# silently wrong prediction.
@pytest.mark.filterwarnings("ignore", category=ConvergenceWarning)
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda estimator: type(estimator).__name__)
def test_dataframe_column_names_are_kept_and_checked(estimator):
    check_dataframe_column_names_consistency(type(estimator).__name__, clone(estimator))
