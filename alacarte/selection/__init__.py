"""Variable selection (docs/mathematics.md §5–7): the simplex projection used by simplex-ARD
kernels, and estimators that learn which inputs matter — SRFF, RFFNet and the
derivative-based method of Rosasco et al."""
from .derivative import DerivativeSelector
from .evidence import ClosedFormEvidence, InputSelection, select_inputs
from .frequency import SelectionFrequency, selection_frequency
from .rffnet import RFFNetClassifier, RFFNetRegressor
from .simplex import SimplexStep, project_to_simplex
from .srff import SRFFRegressor

__all__ = ["project_to_simplex", "SimplexStep", "SRFFRegressor", "RFFNetRegressor", "RFFNetClassifier",
           "DerivativeSelector", "select_inputs", "InputSelection", "ClosedFormEvidence", "selection_frequency",
           "SelectionFrequency"]
