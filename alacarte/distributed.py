"""Data-parallel training of a :class:`~alacarte.FeatureGP` on ``torch.distributed``.

Every process holds a shard of the rows.  The marginal likelihood is a function
of sums over rows (ΦᵀΦ, Φᵀr, rᵀr, n; docs/mathematics.md §4), so each evaluation costs two
all-reduces: one packed buffer of statistics (D² + D + 3 numbers) after each
process has streamed its own rows, and one of the parameter gradients after
each has back-propagated the adjoints through its own rows.  Processes whose
CPUs or BLAS round differently would still part ways (and their collectives
stop matching), so each evaluation also broadcasts rank 0's parameters before
and its loss and gradient after (a few numbers per parameter): every process
takes rank 0's steps, bit for bit, to round-off equal to a single-process run
on all rows.  Every process must
draw the same random Fastfood state, i.e. build its kernel with the same
``seed``: :func:`check_identical_state` asserts that at start-up.

Launch one process per core/GPU with ``torchrun``:

* one machine, 2 processes (gloo on CPU, nccl when CUDA is available)::

    torchrun --standalone --nproc_per_node=2 experiments/train_distributed.py --n-train 1000000

* several machines (run on each; node ranks 0..N−1, ``HOST0`` reachable by all)::

    torchrun --nnodes=N --node_rank=$NODE_RANK --nproc_per_node=8 \\
        --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 --rdzv_id=alacarte \\
        experiments/train_distributed.py --n-train 100000000

In the script::

    alacarte.distributed.init(timeout=300)             # errors after 300 s instead of hanging
    rows = alacarte.distributed.shard(len(x))           # this process's contiguous block of rows
    model = FeatureGP(None, None, FSARDKernel(d, 1024, ard_num_dims=d, seed=0))   # same seed everywhere
    alacarte.distributed.fit(model, x[rows], y[rows], memory_budget=2**30, restarts=0)

A process that dies makes the others fail in their next collective (gloo
reports the closed connection; otherwise the ``timeout`` expires); a world
whose processes do not all arrive fails at start-up after ``timeout``.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ._checkpoint import checkpoint_path
from ._validation import check_nonnegative_int, check_positive_int, check_real
from .models import FeatureGP
from .streaming import ChunkedData, as_chunked_data
from .training import FitHistory
from .training import fit as _fit

__all__ = ["init", "shard", "check_identical_state", "fit"]

# Standardisation buffers are set by fit from all processes' rows: not part of the start-up check.
_SET_BY_FIT = ("input_offset", "input_scale", "target_offset", "target_scale")
# fit's settings that every process must share (chunk sizes and the progress bar may differ): another lr on one
# process would take its own step after rank 0's last evaluation, and the processes would end with different
# models without a word; another max_iter, tolerance or standardize ends its loop elsewhere, and the collectives
# mismatch (gloo: a timeout or an abort).  Of the checkpoint, only whether there is one (rank 0 alone writes it).
_SHARED_SETTINGS = ("optimizer", "max_iter", "restarts", "restart_iter", "lr", "tolerance", "standardize", "seed",
                    "checkpoint")


def init(timeout: float = 300.0, backend: str | None = None) -> None:
    """Join the process group described by ``torchrun``'s environment variables.

    Args:
        timeout: seconds after which a collective (or the start-up rendezvous)
            that some process never joins raises instead of hanging.
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available
            (each process then uses GPU ``LOCAL_RANK``), else gloo.
    """
    if not dist.is_available():
        raise ValueError("this torch build has no torch.distributed support")
    # torch takes 0 or a negative timeout for one, and every process then fails to connect "after -5000ms"
    timeout = check_real(timeout, "timeout", 0)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))


def shard(num_rows: int, rank: int | None = None, world_size: int | None = None) -> slice:
    """The contiguous block of ``num_rows`` rows that process ``rank`` of ``world_size`` holds
    (defaults: this process in the default group); sizes differ by at most one, and none is empty.

    Args:
        num_rows: the number of rows of the whole dataset.
        rank: the process's rank (default: ``torch.distributed.get_rank()``).
        world_size: the number of processes (default: ``torch.distributed.get_world_size()``).

    Returns:
        The slice of this process's rows, e.g. ``x[shard(len(x))]``.

    Raises:
        ValueError: if ``rank`` is not in ``0 … world_size − 1`` or there are fewer rows than processes.
    """
    rank = dist.get_rank() if rank is None else rank
    world_size = dist.get_world_size() if world_size is None else world_size
    check_nonnegative_int(num_rows, "num_rows")
    check_positive_int(world_size, "world_size")
    if check_nonnegative_int(rank, "rank") >= world_size:
        raise ValueError(f"rank must be below world_size = {world_size}, got {rank}")
    if num_rows < world_size:  # every rank raises alike, rather than one failing inside a collective
        raise ValueError(f"{num_rows} rows cannot be sharded over {world_size} processes: each needs at least one")
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def _checksum(tensor: Tensor) -> int:
    digest = hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def _floating_dtype(state: dict[str, Tensor]) -> str:
    """The floating dtypes of a state dict's tensors, for a message ('torch.float64')."""
    return " and ".join(sorted({str(t.dtype) for t in state.values() if t.is_floating_point()})) or "not floating"


def _collective_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather_int(value: int, group) -> list[int]:
    """Every process's ``value``, by rank."""
    device = _collective_device(group)
    gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, torch.tensor([int(value)], dtype=torch.int64, device=device), group=group)
    return [int(g) for g in gathered]


def check_identical_state(model, group=None, timeout: float | None = None) -> None:
    """Raise unless every process's model has the same random Fastfood state and parameters.

    Compares the kernel's ``seed``, which parameters are trained
    (``requires_grad``), the tensors' dtypes and a SHA-256 checksum of every parameter and buffer
    (bar the standardisation, which :func:`fit` sets from all rows).  With
    gloo, a monitored barrier first names any process that does not arrive
    within ``timeout`` seconds.

    Args:
        model: the model every process is about to train.
        group: the ``torch.distributed`` process group (default: the default group).
        timeout: seconds the gloo barrier waits (default: the group's timeout).

    Raises:
        ValueError: if ``torch.distributed`` is not initialised, or the processes' models
            differ (seed, which parameters are trained, dtypes, number or values of parameters
            and buffers); every process raises.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("torch.distributed is not initialised: call alacarte.distributed.init() first")
    timeout = check_real(timeout, "timeout", 0, allow_none=True)
    device = _collective_device(group)
    if dist.get_backend(group) == "gloo":
        kwargs = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
        dist.monitored_barrier(group=group, wait_all_ranks=True, **kwargs)
    names = [name for name in model.state_dict() if name.split(".")[-1] not in _SET_BY_FIT]
    seed = getattr(model.covar_module, "seed", -1)
    seed = seed - 2**64 if seed >= 2**63 else seed  # seeds go up to 2⁶⁴ − 1; the tensor is int64
    # Which parameters are trained decides what every evaluation broadcasts and sums: frozen otherwise on one
    # process, the collectives mismatch (gloo aborts that process) or, where their sizes agree, pair other
    # parameters (rank 1's noise takes rank 0's mean constant), and the processes end with different models.
    trained = _checksum(torch.tensor([p.requires_grad for p in model.parameters()]))
    state = model.state_dict()
    # (A model in another dtype differs in every tensor's checksum; named as such, not as every tensor.)
    dtypes = int.from_bytes(hashlib.sha256(" ".join(str(state[n].dtype) for n in names).encode()).digest()[:8],
                            "little", signed=True)
    mine = torch.tensor([seed, trained, dtypes, len(names)] + [_checksum(state[n]) for n in names],
                        dtype=torch.int64, device=device)
    sizes = _gather_int(mine.numel(), group)
    if len(set(sizes)) != 1:
        raise ValueError(
            "the processes hold different models (different numbers of parameters and buffers: "
            f"{[s - 4 for s in sizes]}); build the same model on every process"
        )
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    reference = gathered[0].cpu()
    problems = []
    for rank, other in enumerate(gathered[1:], start=1):
        other = other.cpu()
        if int(other[0]) != int(reference[0]):
            problems.append(f"rank {rank} has kernel seed {int(other[0]) % 2**64}, "
                            f"rank 0 has {int(reference[0]) % 2**64}")
        if int(other[1]) != int(reference[1]):
            problems.append(f"rank {rank} trains other parameters than rank 0 (requires_grad differs)")
        if int(other[2]) != int(reference[2]):
            problems.append(f"rank {rank} holds its parameters and buffers in other dtypes than rank 0 (this "
                            f"process's model is {_floating_dtype(state)}; convert the model alike everywhere)")
            continue
        differing = [name for name, a, b in zip(names, reference[4:], other[4:]) if int(a) != int(b)]
        if differing:
            problems.append(f"rank {rank} differs from rank 0 in {', '.join(differing)}")
    if problems:
        raise ValueError(
            "data-parallel training needs the same random Fastfood state and initial parameters on every "
            "process (build the kernel with the same seed= everywhere, and freeze the same parameters): "
            + "; ".join(problems)
        )


def _agree_on_inputs(problem: ValueError | None, group) -> None:
    """Every process raises when any refused its rows (else the others would fail inside their first
    collective with a closed connection, or wait for the timeout)."""
    failed = [rank for rank, flag in enumerate(_gather_int(problem is not None, group)) if flag]
    if problem is not None:
        raise ValueError(f"this process (rank {dist.get_rank(group)}) cannot train on its rows: {problem}") from problem
    if failed:
        raise ValueError(f"rank(s) {', '.join(map(str, failed))} cannot train on their rows (see their error); "
                         "every process needs valid, non-empty rows")


def _agree_on_settings(fit_kwargs: dict, statistics_dtype: torch.dtype, group) -> None:
    """Raise on every process unless all pass :func:`alacarte.fit` the same :data:`_SHARED_SETTINGS` and
    accumulate the statistics in the same dtype (else their all-reduce mismatched)."""
    settings = inspect.signature(_fit).bind_partial(**fit_kwargs)
    settings.apply_defaults()
    mine = {name: settings.arguments[name] for name in _SHARED_SETTINGS}
    mine["checkpoint"] = mine["checkpoint"] is not None
    mine["statistics_dtype"] = statistics_dtype
    mine = {name: repr(value.item() if isinstance(value, np.generic) else value) for name, value in mine.items()}
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    problems = [f"rank {rank} has {name}={value} (rank 0: {gathered[0][name]})"
                for rank, other in enumerate(gathered[1:], start=1)
                for name, value in other.items() if value != gathered[0][name]]
    if problems:
        raise ValueError("every process must call fit with the same settings: " + "; ".join(problems))


def fit(
    model,
    x,
    y=None,
    *,
    group=None,
    chunk_size: int | None = None,
    memory_budget: int | None = None,
    statistics_dtype: torch.dtype | None = None,
    **fit_kwargs,
) -> FitHistory:
    """:func:`alacarte.fit` with the rows sharded over the processes of ``group``.

    Each process passes its own rows (tensors, memory-mapped arrays, a
    re-iterable of (x, y) chunks or a :class:`~alacarte.streaming.ChunkedData`,
    streamed as in :func:`alacarte.fit`).  After
    :func:`check_identical_state`, statistics and gradients are summed over
    the processes, so every process takes the same steps and ends with the
    same parameters and posterior (over all rows).  Restarts take their
    lengthscales from the first rows of all processes in rank order, as one
    process holding them all would, and the mean, noise and signal variance
    from all the processes' targets.  The progress bar shows on rank 0 only.  Every process
    first reads its rows once, so that bad rows on any process (non-finite
    values, another column count, none at all) make every process raise a
    ``ValueError``; so do other settings on one process (``lr``, ``max_iter``,
    ``statistics_dtype``, …: all but the chunk size, the progress bar and the
    checkpoint's path).

    Args:
        model: a :class:`~alacarte.FeatureGP`, built alike (same ``seed``) on every process.
        x, y: this process's rows, as for :func:`alacarte.fit`.
        group: the ``torch.distributed`` process group (default: the default group).
        chunk_size, memory_budget, statistics_dtype: as for :class:`~alacarte.streaming.ChunkedData`.
        **fit_kwargs: the other options of :func:`alacarte.fit` (``max_iter``, ``restarts``,
            ``checkpoint`` …); ``progress`` defaults to rank 0 only.

    Returns:
        The :class:`~alacarte.training.FitHistory`, the same on every process.

    Raises:
        ValueError: on every process, if the models differ, any process's rows are refused
            (non-finite values, another column count, none at all), or :func:`alacarte.fit`
            refuses an option.

    Example (inside a ``torchrun`` script, see the module docstring)::

        alacarte.distributed.init()
        rows = alacarte.distributed.shard(len(x))
        history = alacarte.distributed.fit(model, x[rows], y[rows], restarts=0, max_iter=200)
    """
    check_identical_state(model, group)
    problem = None
    try:
        # Before the pass over the rows (as alacarte.fit does: a bad path must not cost one), and inside the
        # agreement: refused on one process alone, the others would fail on a closed connection.
        if fit_kwargs.get("checkpoint") is not None:
            checkpoint_path(fit_kwargs["checkpoint"])
        if isinstance(x, ChunkedData):  # as alacarte.fit takes it, summed over the group
            data = copy.copy(as_chunked_data(x, y, chunk_size=chunk_size, memory_budget=memory_budget,
                                             statistics_dtype=statistics_dtype))
            data.group, data.distributed = group, True
        else:
            data = ChunkedData(
                x, y, chunk_size=chunk_size, memory_budget=memory_budget, statistics_dtype=statistics_dtype,
                group=group, distributed=True,
            )
        if isinstance(model, FeatureGP):  # (fit refuses other models on every process alike)
            # Rows are validated as they are read: read them all once here, so that a bad row on one
            # process (NaN, another column count, a chunk source with no rows) makes every process
            # raise below. Found in the first pass of training instead, it would stop that process alone,
            # and the others would fail on a closed connection (RuntimeError) or wait for the timeout.
            for _ in data.chunks(model):
                pass
    except ValueError as err:
        problem = err
    _agree_on_inputs(problem, group)
    model_dtype = model.input_offset.dtype if isinstance(model, FeatureGP) else None  # (fit refuses the others)
    _agree_on_settings(fit_kwargs, data.statistics_dtype or model_dtype, group)
    fit_kwargs.setdefault("progress", dist.get_rank(group) == 0)
    return _fit(model, data, **fit_kwargs)
