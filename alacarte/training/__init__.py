"""The training entry point: maximise the marginal likelihood with L-BFGS or Adam.

:func:`fit` runs its stages (:mod:`alacarte.training._fit`): restarts, the final optimisation
and the refit from a larger noise (:mod:`alacarte.training._stages`), each an optimisation that
can be saved between iterations and resumed (:mod:`alacarte.training._optimization`), and
reports them in a :class:`FitHistory`.
"""
from ._diagnostics import noise_at_bound
from ._fit import fit
from ._history import FitHistory
from ._optimization import current_loss, marginal_log_likelihood, negative_mll
from ._pilot import (AUTO_PILOT_ABOVE, AUTO_PILOT_SAMPLES, PILOT_ROWS, PILOT_SAMPLES, fit_pilot, resolve_pilot,
                     resolve_samples)

__all__ = ["FitHistory", "fit", "fit_pilot", "marginal_log_likelihood", "resolve_pilot", "resolve_samples",
           "PILOT_ROWS", "PILOT_SAMPLES", "AUTO_PILOT_ABOVE", "AUTO_PILOT_SAMPLES"]
