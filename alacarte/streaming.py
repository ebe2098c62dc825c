"""The Woodbury marginal likelihood streamed over chunks of rows, with exact gradients (docs/mathematics.md §4).

The likelihood of a :class:`~alacarte.FeatureGP` depends on the data only
through the sums over rows ΦᵀΦ, Φᵀr, rᵀr and n.  One evaluation of loss and
gradient makes two passes over the rows and never holds more than one chunk's
features (memory O(chunk·D + D²) whatever n):

1. **statistics** — for every chunk, Φ_c = φ(x_c) and r_c = y_c − μ(x_c) without
   autograd; add Φ_cᵀΦ_c, Φ_cᵀr_c, r_cᵀr_c to running sums (all-reduced across
   processes in data-parallel training);
2. **loss** — from leaf copies of the summed statistics, so one backward gives
   their adjoints Ā = ∂L/∂(ΦᵀΦ), b̄ = ∂L/∂(Φᵀr), c̄ = ∂L/∂(rᵀr) and the direct
   gradients of the noise (and of any priors);
3. **gradients** — for every chunk, recompute Φ_c and r_c under autograd and
   back-propagate ∂L/∂Φ_c = Φ_c(Ā + Āᵀ) + r_c b̄ᵀ and ∂L/∂r_c = 2c̄ r_c + Φ_c b̄
   (:func:`~alacarte.woodbury.statistics_adjoint`).  The gradient is a sum over
   chunks, so it is exact, not a stochastic estimate.

A float32 model may keep its statistics in float64 (``statistics_dtype=torch.float64``,
:mod:`alacarte._mixed_precision`): at σ² ≥ 1e-3 (standardised units) ΦᵀΦ is formed by
float32 products over blocks of 256 rows whose results are summed in float64, Φᵀr and
rᵀr in float64 (below, each chunk's features are widened first, float64 throughout); the
Cholesky factor, the loss and the adjoints are float64; the backward's n×D×D
product runs in float32.  The products run at float32 speed (kin40k, D = 1024:
0.48× the time of a float64 evaluation), and the error left is that of float32
features and of float32 sums of ≤ 256 products in ΦᵀΦ, which the loss amplifies
by ~σ⁻²: within 1e-6 relative of float64 on SE1 and energy, 1.1e-6 on fitted
kin40k, 2e-5 on yacht (σ² ~ 2e-3, n < D); gradients within 1e-6–5e-4
(experiments/results/mixed_precision.md).  Float32 statistics, with their float32
Cholesky, are up to 600× further at small σ².

Example:
    >>> import numpy as np
    >>> import torch
    >>> import alacarte
    >>> from alacarte import FeatureGP, FSARDKernel, WoodburyMarginalLogLikelihood
    >>> from alacarte.streaming import ChunkedData, streamed_negative_mll
    >>> rng = np.random.default_rng(0)
    >>> x = rng.uniform(-2, 2, (1000, 3)); y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(1000)
    >>> np.save("x.npy", x); np.save("y.npy", y)
    >>> x_memmap, y_memmap = np.load("x.npy", mmap_mode="r"), np.load("y.npy", mmap_mode="r")
    >>> data = ChunkedData(x_memmap, y_memmap, chunk_size=256)   # or memory_budget=, or a DataLoader of (x, y)
    >>> model = FeatureGP(x, y, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0)).double()
    >>> loss = streamed_negative_mll(model, data)   # per point; sets .grad on the parameters
    >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    >>> torch.allclose(loss, -mll(model(*model.train_inputs), model.train_targets))   # all rows at once
    True
    >>> model = FeatureGP(None, None, FSARDKernel(num_dims=3, num_samples=64, ard_num_dims=3, seed=0))
    >>> history = alacarte.fit(model, x_memmap, y_memmap, memory_budget=2**20, max_iter=20, restarts=0)
    >>> model.predict(x[:5]).mean.shape   # the same inside fit, a chunk of rows in memory at a time
    torch.Size([5])
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from . import _chunks
from ._chunks import RowTally, check_memory_options, holds_chunks, is_array, read_rows, rows_within
from ._mixed_precision import chunk_adjoint, chunk_statistics
from ._validation import as_tensor, check_inputs, check_learnable_targets, check_targets
from .mll import WoodburyMarginalLogLikelihood
from .woodbury import SufficientStatistics

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "ChunkedData",
    "as_chunked_data",
    "rows_per_chunk",
    "streamed_statistics",
    "streamed_negative_mll",
]

#: Bytes one evaluation of a streamed fit may use for features when neither ``chunk_size`` nor
#: ``memory_budget`` is given (256 MiB): the package's one default, also that of prediction.
DEFAULT_MEMORY_BUDGET = _chunks.DEFAULT_MEMORY_BUDGET
# Rows gathered from the first chunks for the data-driven initialisation of restarts.
_INIT_ROWS = 10_000


def rows_per_chunk(num_features: int, num_dims: int, itemsize: int, memory_budget: int, statistics_itemsize: int = 8) -> int:
    """Rows per chunk so that one evaluation stays within ``memory_budget`` bytes.

    The D×D part (statistics, their adjoints, A and its Cholesky factor, ~5 D²
    numbers) is fixed; each row of a chunk costs its features and their
    gradient plus the feature map's intermediates (~6 D numbers) and its input.

    Args:
        num_features: the number of features D.
        num_dims: the input dimension d.
        itemsize: bytes per number of the model's dtype (4 or 8).
        memory_budget: bytes one evaluation may use.
        statistics_itemsize: bytes per number of the statistics' dtype.

    Returns:
        The rows per chunk, at least 1.

    Raises:
        ValueError: if ``memory_budget`` is not a positive integer or too small for the D×D
            part and one row (the message says how much is enough).
    """
    return rows_within(
        memory_budget,
        6 * num_features * max(itemsize, statistics_itemsize) + 4 * num_dims * itemsize,
        fixed_bytes=5 * num_features**2 * statistics_itemsize,
        what=f"the D×D statistics of D = {num_features} features",
    )


class ChunkedData:
    """Training rows (x, y) read a chunk at a time, in original units.

    Sources:

    * arrays — ``x`` (n, d) and ``y`` (n,) as tensors, numpy arrays or
      memory-mapped arrays (``np.load(path, mmap_mode="r")``, ``np.memmap``):
      only one chunk is read into memory at a time;
    * chunks — ``x`` a re-iterable of ``(x_c, y_c)`` pairs (a list, a
      ``torch.utils.data.DataLoader``) and ``y=None``; it is iterated twice per
      evaluation, so a one-shot generator is refused, and must yield the same
      rows on every pass, in any order and batching (``shuffle=True`` is fine;
      ``drop_last=True`` with shuffling, random augmentation or a sampler with
      replacement are not: the gradient would be another loss's). A second pass
      of an evaluation that reads other rows than its first (another row count
      or column sums) is a ``ValueError``.
      Chunks longer than the chunk size are split.

    Args:
        x, y: the data, as above.
        chunk_size: rows per chunk; default from ``memory_budget``.
        memory_budget: bytes one evaluation may use for features (default 256 MiB;
            see :func:`~alacarte.streaming.rows_per_chunk`).  Give at most one of the two.
        statistics_dtype: dtype in which ΦᵀΦ, Φᵀr, rᵀr and the loss are
            accumulated (default: the model's; float64 for a float32 model: float32
            products summed in float64, above).
        group: a ``torch.distributed`` process group over whose processes the
            rows are sharded (set by :func:`alacarte.distributed.fit`; ``None``
            with ``distributed=False`` means this process holds all rows).
        distributed: sum the statistics and gradients over ``group`` (the
            default group if ``group`` is ``None``).
    """

    def __init__(
        self,
        x,
        y=None,
        *,
        chunk_size: int | None = None,
        memory_budget: int | None = None,
        statistics_dtype: torch.dtype | None = None,
        group=None,
        distributed: bool = False,
    ):
        self.chunk_size, memory_budget = check_memory_options(chunk_size, memory_budget)
        self.memory_budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget
        if statistics_dtype is not None and statistics_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"statistics_dtype must be torch.float32 or torch.float64, got {statistics_dtype!r}")
        self.statistics_dtype = statistics_dtype
        self.last_pass: RowTally | None = None
        self.group = group
        self.distributed = distributed or group is not None
        if y is None:
            if is_array(x):
                raise ValueError("y is required when x is an array; pass y=None only with an iterable of (x, y) chunks")
            if not isinstance(x, Iterable):
                raise ValueError(f"x must be an array or a re-iterable of (x, y) chunks, got {type(x).__name__}")
            if iter(x) is x:
                raise ValueError(
                    "x is a one-shot iterator (e.g. a generator): the streamed likelihood reads the data "
                    "twice per evaluation; pass a re-iterable (a list, a DataLoader, a memory-mapped array)"
                )
            self._x, self._y = x, None
        else:
            if holds_chunks(x):
                raise ValueError("x holds (x, y) chunks, which carry the targets: pass y=None")
            if not is_array(x):
                x = as_tensor(x, "x")
            if not is_array(y):
                y = as_tensor(y, "y")
            for name, value in (("x", x), ("y", y)):
                if isinstance(value, np.ndarray) and not np.issubdtype(value.dtype, np.number):
                    raise ValueError(f"{name} must be numeric, got an array of dtype {value.dtype}")
            if x.ndim not in (1, 2) or y.ndim not in (1, 2) or (y.ndim == 2 and y.shape[1] != 1):
                raise ValueError(f"x must have shape (n, d) and y (n,), got {tuple(x.shape)} and {tuple(y.shape)}")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"y has {y.shape[0]} values but x has {x.shape[0]} rows")
            if x.shape[0] == 0:
                raise ValueError("x is empty (0 rows)")
            self._x, self._y = x, y

    # -- reading --------------------------------------------------------------------------
    def rows(self, model) -> int:
        """Rows per chunk for ``model``'s feature dimension and dtype."""
        if self.chunk_size is not None:
            return self.chunk_size
        dtype = model.input_offset.dtype
        stats_dtype = self.statistics_dtype or dtype
        return rows_per_chunk(
            model.covar_module.num_features,
            model.num_dims,
            torch.finfo(dtype).bits // 8,
            self.memory_budget,
            torch.finfo(stats_dtype).bits // 8,
        )

    def _raw_chunks(self) -> Iterator[tuple[object, object, int]]:
        if self._y is not None:
            yield self._x, self._y, 0
            return
        start = 0
        for index, item in enumerate(self._x):
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(f"each chunk must be an (x, y) pair, got {type(item).__name__} (y=None means x "
                                 "holds (x, y) chunks; for x given as rows, pass y too)")
            x_c, y_c = item
            for name, part in (("x", x_c), ("y", y_c)):
                if getattr(part, "ndim", 1) == 0 or not hasattr(part, "__len__"):
                    raise ValueError(f"{name} of chunk {index} is a scalar, not a batch of rows (a DataLoader "
                                     "must batch its samples: batch_size ≥ 1)")
            yield x_c, y_c, start
            start += len(x_c)

    def chunks(self, model) -> Iterator[tuple[Tensor, Tensor]]:
        """(x_c, y_c) in original units, validated, in the model's dtype and device.

        A complete pass over a source of (x, y) chunks leaves its :class:`RowTally`
        in ``last_pass`` (arrays are read the same way every time: ``None``)."""
        rows = self.rows(model)
        dtype, device = model.input_offset.dtype, model.input_offset.device
        seen = 0
        tally = RowTally(model.num_dims, device) if self._y is None else None
        for x_src, y_src, offset in self._raw_chunks():
            for start in range(0, len(x_src), rows):
                stop = min(start + rows, len(x_src))
                where = f"rows {offset + start}–{offset + stop - 1}"
                x_c = check_inputs(read_rows(x_src, start, stop, "x", dtype, device), f"x ({where})", model.num_dims)
                y_c = check_targets(read_rows(y_src, start, stop, "y", dtype, device), x_c.shape[0], f"y ({where})")
                seen += x_c.shape[0]
                if tally is not None:
                    tally.add(x_c, y_c)
                yield x_c, y_c
        if seen == 0:
            raise ValueError("the data yielded no rows")
        self.last_pass = tally

    def other_rows_since(self, earlier: RowTally | None) -> bool:
        """Whether the last complete pass read other rows than the one that left ``earlier``."""
        return earlier is not None and not earlier.matches(self.last_pass)

    def check_same_rows(self, changed) -> None:
        """Raise if ``changed`` — the number of processes whose second pass of an evaluation read
        other rows than the first (summed by the caller's all-reduce, so that all raise or none)."""
        count = int(changed)
        if count:
            where = f" on {count} process{'es' if count > 1 else ''}" if self.distributed else ""
            raise ValueError(
                f"the chunks yielded other rows on a second pass than on the first{where} (row count or column "
                "sums differ): each evaluation reads the data twice and needs the same rows both times, in "
                "any order — shuffling is fine, but not drop_last=True with shuffling, random augmentation "
                "or sampling with replacement"
            )

    def sample(self, model, num_rows: int = _INIT_ROWS) -> tuple[Tensor, Tensor]:
        """The first ``num_rows`` rows, in the model's internal (standardised) units; over several
        processes, the first of all their rows in rank order (every process gets the same rows)."""
        xs, ys, count = [], [], 0
        for x_c, y_c in self.chunks(model):
            xs.append(x_c[: num_rows - count])
            ys.append(y_c[: num_rows - count])
            count += xs[-1].shape[0]
            if count >= num_rows:
                break
        x, y = torch.cat(xs), torch.cat(ys)
        if self.distributed:
            x, y = self._first_rows_of_all(x, y, num_rows)
        return model.internal_inputs(x), (y - model.target_offset) / model.target_scale

    @torch.no_grad()
    def _first_rows_of_all(self, x: Tensor, y: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
        """The first ``num_rows`` of the processes' first rows ``x``, ``y``, in rank order: the rows one
        process holding them all would take.  Rank 0's alone, the restarts of a fit over P processes
        started elsewhere than those of the same fit on one (when rank 0 holds fewer than ``num_rows``)."""
        import torch.distributed as dist

        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        counts = torch.zeros(world, dtype=torch.int64, device=x.device)
        counts[rank] = x.shape[0]
        before = self.all_reduce_(counts).cumsum(0) - counts
        taken = (num_rows - before).clamp(min=0).minimum(counts).tolist()
        rows = torch.cat([x, y.unsqueeze(-1)], -1)
        parts = []
        for source, size in enumerate(taken):  # (rank 0 alone, once it holds num_rows)
            if size:
                parts.append(rows[:size] if source == rank else rows.new_empty(size, rows.shape[1]))
                self.broadcast_(parts[-1:], source)
        rows = torch.cat(parts)
        return rows[:, :-1], rows[:, -1]

    # -- collectives (no-ops on one process) ------------------------------------------------
    def all_reduce_(self, tensor: Tensor, maximum: bool = False) -> Tensor:
        """Sum (or take the maximum of) ``tensor`` in place over the processes."""
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.MAX if maximum else dist.ReduceOp.SUM, group=self.group)
        return tensor

    @torch.no_grad()
    def broadcast_(self, tensors, source: int = 0) -> None:
        """Overwrite every process's ``tensors`` in place with those of rank ``source`` (in the group)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        src = dist.get_global_rank(self.group, source) if self.group is not None else source
        for tensor in tensors:
            dist.broadcast(tensor, src=src, group=self.group)

    def broadcast_state_(self, model) -> None:
        """Copy rank 0's parameters and buffers to every process (after a data-driven initialisation)."""
        self.broadcast_([t for t in model.state_dict().values() if isinstance(t, Tensor)])

    # -- column moments ---------------------------------------------------------------------
    @torch.no_grad()
    def moments(self, model) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Column means and standard deviations (n − 1) of x and y over all rows
        and processes, in two passes (sum, then squared deviations) in float64.

        A constant column (max = min) gets std 0, i.e. scale 1 in
        ``set_standardization``: its computed std would be round-off."""
        x_sum = torch.zeros(model.num_dims + 2, dtype=torch.float64, device=model.input_offset.device)
        # max of every column of [x, y] and max of its negation: max = min ⇔ peaks sum to 0
        peaks = torch.full((2, model.num_dims + 1), -math.inf, dtype=torch.float64, device=x_sum.device)
        for x_c, y_c in self.chunks(model):
            x_sum[:-2] += x_c.sum(0, dtype=torch.float64)
            x_sum[-2] += y_c.sum(dtype=torch.float64)
            x_sum[-1] += x_c.shape[0]
            if x_c.shape[0]:
                columns = torch.cat([x_c, y_c.unsqueeze(-1)], -1).to(torch.float64)
                torch.maximum(peaks, torch.stack([columns.amax(0), (-columns).amax(0)]), out=peaks)
        self.all_reduce_(x_sum)
        self.all_reduce_(peaks, maximum=True)
        n = x_sum[-1]
        check_learnable_targets(int(n), -float(peaks[1, -1]), float(peaks[0, -1]))
        mean = x_sum[:-1] / n
        # Deviations are summed in units of the column's range, so that squares neither overflow nor underflow.
        spread = peaks[0] + peaks[1]
        unit = torch.where(spread > 0, spread, torch.ones_like(spread))
        first_pass = self.last_pass
        # The second pass also sums the deviations, to correct the mean (the corrected two-pass algorithm): a plain
        # sum of sixty 1e50s over n is 9.999999999999999e49, a constant column's deviations from it are then 1e34.
        squares = torch.zeros_like(x_sum)  # the last entry counts processes whose second pass read other rows
        deviations = torch.zeros_like(x_sum[:-1])
        for x_c, y_c in self.chunks(model):
            columns = (torch.cat([x_c, y_c.unsqueeze(-1)], -1).to(torch.float64) - mean) / unit
            squares[:-1] += columns.square().sum(0)
            deviations += columns.sum(0)
        squares[-1] = float(self.other_rows_since(first_pass))
        self.all_reduce_(squares)
        self.all_reduce_(deviations)
        self.check_same_rows(squares[-1])
        shift = deviations / n
        std = ((squares[:-1] / n - shift.square()).clamp_min(0) * (n / (n - 1))).sqrt() * unit
        std = std.masked_fill(spread == 0, 0.0)
        # A constant column's mean is its value (max = −(max of the negation)), exactly.
        mean = torch.where(spread == 0, peaks[0], mean + shift * unit)
        dtype = model.input_offset.dtype
        return mean[:-1].to(dtype), std[:-1].to(dtype), mean[-1].to(dtype), std[-1].to(dtype)


def _model_terms(model, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Φ(x) and r = y − μ(x) for a chunk in original units (the model's standardisation applied)."""
    inner = model.internal_inputs(x)
    target = (y - model.target_offset) / model.target_scale
    return model.covar_module.features(inner), target - model.mean_module(inner)


def _smallest_noise(model) -> float:
    """σ² (its least over a batch), which decides the arithmetic of float64 statistics of float32 features."""
    return float(model.likelihood.noise.detach().min())


def _check_model(model) -> None:
    if not hasattr(model.covar_module, "features") or getattr(model.covar_module, "batch_shape", ()) != torch.Size():
        raise ValueError(
            "the streamed likelihood needs a FeatureGP with a non-batched alacarte FeatureKernel, "
            f"got {type(model).__name__} with {type(model.covar_module).__name__}"
        )


# n travels in the statistics' buffer as three base-2¹² digits: each process's are below 2¹² (the
# top one while it holds under 2³⁶ rows), so their sums over up to 4096 processes stay exact in float32.
_N_DIGIT = 2**12
_N_DIGITS = 3


def _pack_rows(buffer: Tensor, rows: int) -> None:
    """Write ``rows`` into the last entries of a statistics buffer (see :func:`_unpack`)."""
    for place in range(1, _N_DIGITS):
        rows, buffer[-place] = divmod(rows, _N_DIGIT)
    buffer[-_N_DIGITS] = rows


def _unpack(buffer: Tensor, num_features: int) -> SufficientStatistics:
    """Views of a flat buffer [ΦᵀΦ, Φᵀr, rᵀr, n's digits] as statistics."""
    d2 = num_features * num_features
    gram = buffer[:d2].view(num_features, num_features)
    n = 0
    for digit in buffer[-_N_DIGITS:].tolist():
        n = n * _N_DIGIT + int(round(digit))
    return SufficientStatistics(gram, buffer[d2 : d2 + num_features], buffer[d2 + num_features], n)


@torch.no_grad()
def streamed_statistics(model, data: ChunkedData) -> SufficientStatistics:
    """ΦᵀΦ, Φᵀr, rᵀr and n summed over all chunks (and processes), in ``data.statistics_dtype``.

    Pass 1 of the streamed likelihood, and the data a
    :class:`~alacarte.woodbury.WoodburyPosterior` needs: memory O(chunk·D + D²).

    Args:
        model: a :class:`~alacarte.FeatureGP` with a non-batched kernel; its standardisation
            and mean are applied to every chunk.
        data: the rows (original units).

    Returns:
        The summed :class:`~alacarte.woodbury.SufficientStatistics` (internal units).

    Raises:
        ValueError: for another model, or a chunk that ``data`` refuses (NaN/inf, wrong shape).
    """
    _check_model(model)
    dtype = data.statistics_dtype or model.input_offset.dtype
    num_features = model.covar_module.num_features
    # One flat buffer, so that the processes exchange everything in one all-reduce.
    size = num_features * num_features + num_features + 1 + _N_DIGITS
    buffer = torch.zeros(size, dtype=dtype, device=model.input_offset.device)
    acc = _unpack(buffer, num_features)
    rows = 0
    noise = _smallest_noise(model)
    for x_c, y_c in data.chunks(model):
        chunk = chunk_statistics(*_model_terms(model, x_c, y_c), dtype, noise)
        acc.gram += chunk.gram
        acc.phi_r += chunk.phi_r
        acc.r_r += chunk.r_r
        rows += chunk.n
    _pack_rows(buffer, rows)
    data.all_reduce_(buffer)
    return _unpack(buffer, num_features)


def streamed_negative_mll(model, data: ChunkedData, *, backward: bool = True) -> Tensor:
    """Negative log marginal likelihood per point (log priors included), streamed.

    The same value as ``-WoodburyMarginalLogLikelihood(likelihood, model)(model(x), y)``
    on all rows at once, to round-off.  With ``backward=True`` the exact
    gradient is accumulated into ``.grad`` of the model's parameters, as
    ``loss.backward()`` would (so it can serve as an L-BFGS closure after
    ``zero_grad``); the returned loss is detached.

    Cost: two passes over the rows (features computed twice, ΦᵀΦ once as a
    rank-k update, the adjoint once as a GEMM) plus one D×D
    Cholesky; memory O(chunk·D + D²).  In data-parallel training the
    statistics are summed with one all-reduce and the parameter gradients with
    another; rank 0's parameters are broadcast before, its loss and gradient after.

    Args:
        model: a :class:`~alacarte.FeatureGP` with a non-batched kernel.
        data: the rows (original units).
        backward: also accumulate the gradient (``False``: the loss alone, one pass).

    Returns:
        The loss, a 0-d tensor in the statistics' dtype, without autograd history.

    Raises:
        ValueError: for another model, a chunk that ``data`` refuses, or chunks that read other
            rows on the second pass than on the first.
        NotPositiveDefiniteError: if A = ΦᵀΦ + σ²I cannot be factorised.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    # Processes on other CPUs (or BLAS code paths) round differently: left alone, their optimisers
    # would part ways and their collectives stop matching. So every evaluation is at rank 0's
    # parameters, and rank 0's loss and gradient are everyone's.
    data.broadcast_([p.data for p in params])
    stats = streamed_statistics(model, data)
    first_pass = data.last_pass
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    if not backward:
        with torch.no_grad():
            loss = -mll.from_statistics(stats)
        data.broadcast_([loss])
        return loss
    leaves = [t.detach().clone().requires_grad_() for t in (stats.gram, stats.phi_r, stats.r_r)]
    loss = -mll.from_statistics(SufficientStatistics(*leaves, stats.n))
    grads = torch.autograd.grad(loss, leaves + params, allow_unused=True)
    grad_gram, grad_phi_r, grad_r_r = grads[:3]
    direct = grads[3:]  # the noise's and the priors': already complete on every process

    # Pass 2: back-propagate the adjoints chunk by chunk.
    through_data = [torch.zeros_like(p) for p in params]
    adjoint = chunk_adjoint(model.input_offset.dtype, _smallest_noise(model), grad_gram, grad_phi_r, grad_r_r)
    for x_c, y_c in data.chunks(model):
        phi, r = _model_terms(model, x_c, y_c)
        grad_phi, grad_r = adjoint(phi, r)
        outputs, adjoints = [], []
        for out, adj in ((phi, grad_phi), (r, grad_r)):
            if out.requires_grad and adj is not None:
                outputs.append(out)
                adjoints.append(adj.to(out.dtype))
        if not outputs:
            continue
        chunk_grads = torch.autograd.grad(outputs, params, adjoints, allow_unused=True)
        for total, g in zip(through_data, chunk_grads):
            if g is not None:
                total += g
    changed = data.other_rows_since(first_pass)
    if data.distributed:
        # The verdict travels with the gradients, so that every process raises, or none.
        # Summed in float64: neither the statistics' nor the parameters' dtype rounds the other's.
        flag = torch.tensor([float(changed)], dtype=torch.float64, device=stats.gram.device)
        flat = data.all_reduce_(torch.cat([g.reshape(-1).double() for g in through_data] + [flag]))
        changed = flat[-1]
        through_data = [part.view_as(p).to(p.dtype)
                        for part, p in zip(flat[:-1].split([p.numel() for p in params]), params)]
    data.check_same_rows(changed)
    gradients = [g_data if g_direct is None else g_data + g_direct for g_data, g_direct in zip(through_data, direct)]
    loss = loss.detach()
    if data.distributed:
        # float64 carries float32 and float64 values alike, unrounded.
        flat = torch.cat([loss.reshape(1).double()] + [g.reshape(-1).double() for g in gradients])
        data.broadcast_([flat])
        loss = flat[0].to(loss.dtype)
        gradients = [part.view_as(p).to(p.dtype) for part, p in zip(flat[1:].split([p.numel() for p in params]), params)]
    for p, g in zip(params, gradients):
        p.grad = g if p.grad is None else p.grad + g
    return loss


def as_chunked_data(x, y=None, *, chunk_size: int | None = None, memory_budget: int | None = None,
                    statistics_dtype: torch.dtype | None = None) -> ChunkedData:
    """``x`` itself when it is a :class:`ChunkedData` (then the options belong on it: giving them
    here is an error, not silently ignored), else a new one over (``x``, ``y``).

    Args:
        x, y, chunk_size, memory_budget, statistics_dtype: as for :class:`ChunkedData`.

    Raises:
        ValueError: if ``x`` is a ``ChunkedData`` and any other argument is given, or
            :class:`ChunkedData` refuses the arguments.
    """
    if isinstance(x, ChunkedData):
        if any(option is not None for option in (y, chunk_size, memory_budget, statistics_dtype)):
            raise ValueError("x is a ChunkedData: set y, chunk_size, memory_budget and statistics_dtype on it")
        return x
    return ChunkedData(x, y, chunk_size=chunk_size, memory_budget=memory_budget, statistics_dtype=statistics_dtype)


def is_streamed_input(x, y, *options) -> bool:
    """Whether :func:`alacarte.fit` should stream: chunked/memory-mapped input, or a streaming option given."""
    if isinstance(x, ChunkedData) or isinstance(x, np.memmap) or isinstance(y, np.memmap):
        return True
    if any(option is not None for option in options) or holds_chunks(x):  # (chunks and a y: refused there)
        return True
    return y is None and not is_array(x) and not isinstance(x, numbers.Number)
