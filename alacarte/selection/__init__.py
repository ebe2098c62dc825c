"""Variable selection: estimators that learn which inputs matter (MATH.md §5–7)."""
from .derivative import DerivativeSelector
from .rffnet import RFFNetClassifier, RFFNetRegressor

__all__ = ["RFFNetRegressor", "RFFNetClassifier", "DerivativeSelector"]
