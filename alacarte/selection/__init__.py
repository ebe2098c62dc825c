"""Variable selection: the simplex projection and the SRFF estimator."""
from .simplex import SimplexStep, project_to_simplex
from .srff import SRFFRegressor

__all__ = ["project_to_simplex", "SimplexStep", "SRFFRegressor"]
