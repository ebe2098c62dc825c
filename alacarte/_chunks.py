"""Rows a chunk at a time: how many rows a chunk holds within a memory budget (the one policy of
the streamed likelihood, of prediction and of the command line), which inputs hold chunks, a slice of
an array read into a tensor, and a tally that tells two passes over the same rows from passes over
other rows."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ._validation import as_tensor, check_positive_int

__all__ = [
    "DEFAULT_MEMORY_BUDGET", "RowTally", "check_memory_options", "holds_chunks", "is_array", "read_rows", "rows_within",
]

#: Bytes one pass over a chunk of rows may take when no ``memory_budget`` is given (256 MiB): an
#: evaluation of the streamed likelihood, a chunk of predictions or of posterior draws.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def check_memory_options(chunk_size, memory_budget) -> tuple[int | None, int | None]:
    """``chunk_size`` and ``memory_budget`` checked: each ``None`` or a positive integer, not both given."""
    if chunk_size is not None and memory_budget is not None:
        raise ValueError("give chunk_size or memory_budget, not both")
    return (None if chunk_size is None else check_positive_int(chunk_size, "chunk_size"),
            None if memory_budget is None else check_positive_int(memory_budget, "memory_budget"))


def rows_within(memory_budget: int, row_bytes: int, *, fixed_bytes: int = 0, square_bytes: int = 0,
                what: str = "") -> int:
    """The most rows r of a chunk with ``fixed_bytes + r·row_bytes + r²·square_bytes ≤ memory_budget``.

    The streamed likelihood, the models' predictions, posterior statistics and draws, and the
    command line take their chunk sizes from here, each caller stating its own costs: what a chunk
    takes whatever its rows (``fixed_bytes``), per row, and per pair of rows (an exact GP's
    test–test covariance).  (The Hadamard transform's row blocks are sized to stay in cache, not
    to bound memory: :func:`alacarte.ops.fwht.chunk_rows`.)

    Raises:
        ValueError: if ``memory_budget`` is not a positive integer or is too small for one row
            (the message, with ``what`` the fixed part's name, says how much is enough).
    """
    check_positive_int(memory_budget, "memory_budget")
    one_row = fixed_bytes + row_bytes + square_bytes
    if memory_budget < one_row:
        fixed = f"{what} alone take {fixed_bytes} bytes and each row {row_bytes} more" if fixed_bytes else \
            f"one row takes {one_row} bytes"
        raise ValueError(f"memory_budget={memory_budget} bytes is too small: {fixed}; allow at least "
                         f"{fixed_bytes + 64 * row_bytes + 64 * 64 * square_bytes} bytes")
    room = memory_budget - fixed_bytes
    if not square_bytes:
        return room // row_bytes
    return (math.isqrt(row_bytes**2 + 4 * square_bytes * room) - row_bytes) // (2 * square_bytes)


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
