"""Rows read a chunk at a time for :class:`~alacarte.streaming.ChunkedData`: which inputs hold
chunks, a slice of an array read into a tensor, and a tally that tells two passes over the same
rows from passes over other rows."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ._validation import as_tensor

__all__ = ["RowTally", "holds_chunks", "is_array", "read_rows"]


def is_array(value) -> bool:
    """Whether ``value`` is a tensor or a (memory-mapped) array: rows rather than chunks."""
    return isinstance(value, (Tensor, np.ndarray))


def holds_chunks(x) -> bool:
    """Whether ``x`` is (x, y) chunks — a DataLoader or a list of array pairs — rather than rows.

    A chunk's parts hold rows (ndim ≥ 1); a pair of 0-d tensors is a row of two columns
    (``list(zip(a, b))`` of 1-D tensors), which fit takes as ordinary in-memory x."""
    return isinstance(x, torch.utils.data.DataLoader) or (
        isinstance(x, (list, tuple)) and len(x) > 0 and isinstance(x[0], (tuple, list)) and len(x[0]) == 2
        and all(is_array(part) and part.ndim > 0 for part in x[0])
    )


class RowTally:
    """Row count and float64 column sums (and sums of magnitudes) of [x, y] over one pass:
    the same for the same rows in any order and batching, to round-off."""

    # The same rows summed in another order agree to ~(number of additions)·ε·Σ|v|; 1e-10 leaves
    # room for a million chunks and still sees a row changed by more than 1e-10 of its column's Σ|v|.
    TOLERANCE = 1e-10

    def __init__(self, num_dims: int, device):
        self.rows = 0
        self.sums = torch.zeros(2, num_dims + 1, dtype=torch.float64, device=device)

    def add(self, x: Tensor, y: Tensor) -> None:
        columns = torch.cat([x, y.unsqueeze(-1)], -1).to(torch.float64)
        self.rows += columns.shape[0]
        self.sums[0] += columns.sum(0)
        self.sums[1] += columns.abs().sum(0)

    def matches(self, other: RowTally | None) -> bool:
        if other is None or other.rows != self.rows:
            return False
        scale = torch.maximum(self.sums[1], other.sums[1])
        # equal sums match also where they overflowed (inf, or NaN from +inf and −inf)
        same = (self.sums == other.sums) | (self.sums.isnan() & other.sums.isnan())
        return bool((same | ((self.sums - other.sums).abs() <= self.TOLERANCE * scale)).all())


def read_rows(source, start: int, stop: int, name: str, dtype: torch.dtype, device) -> Tensor:
    """Rows start:stop of a tensor or (memory-mapped) array, copied into a tensor."""
    if isinstance(source, Tensor):
        part = source[start:stop]
    elif isinstance(source, np.ndarray):
        part = source[start:stop]  # a memmap reads only these rows
        if not part.flags.writeable:  # read-only maps: torch wants memory it may write
            part = np.array(part)
    else:
        part = source if (start, stop) == (0, len(source)) else source[start:stop]
    return as_tensor(part, name, dtype, device)
