"""Datasets: the synthetic problems of the variable-selection papers (MATH.md §8)."""
from .synthetic import make_se1, make_se2, make_se3

__all__ = ["make_se1", "make_se2", "make_se3"]
