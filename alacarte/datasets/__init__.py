"""Datasets: the UCI regression benchmark (standard splits) and the synthetic
problems of the variable-selection papers (docs/mathematics.md §8)."""
from .synthetic import make_rosasco, make_se1, make_se2, make_se3, rosasco_split
from .uci import UCISplit, list_uci, load_uci

__all__ = ["load_uci", "list_uci", "UCISplit", "make_se1", "make_se2", "make_se3", "make_rosasco", "rosasco_split"]
