"""The simplex projection and its optimisers, under the names the selection estimators document.

They live below the kernels (:mod:`alacarte.ops.simplex`, and the π-step of :func:`alacarte.fit`),
which use them too; this module keeps ``alacarte.selection.simplex`` importable.
"""
from .._simplex_step import SimplexStep
from ..ops.simplex import MonotoneFISTA, project_to_simplex

__all__ = ["project_to_simplex", "MonotoneFISTA", "SimplexStep"]
