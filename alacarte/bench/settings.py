"""What a benchmark run gives its cells: the methods and their models, the defaults, and the checks made
before any cell starts."""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import subprocess
from pathlib import Path

from .._validation import check_nonnegative_int, check_positive_int, check_real
from ..factory import make_model
from ..holdout import check_fraction, resolve_fraction

__all__ = ["METHODS", "EXACT_LIMIT", "DEFAULT_NOISE_FLOOR", "mixture_components", "model_name",
           "cell_validation_fraction", "parse_splits", "check_settings", "check_device", "package_version",
           "cell_settings", "checkpoint_directory"]

#: The methods a run can be given (``--methods``), in the order of the report's columns.
METHODS = ("exact-rbf", "exact-ard", "fastfood-rbf", "fastfood-ard", "fsard", "fsgbard", "gm", "pwl", "ssgpr", "rks")
#: The paper's exact GPs stop at this many training points; above it the ``exact-*`` methods run as
#: Fastfood expansions of the same kernels.
EXACT_LIMIT = 2000
#: GPyTorch's ``GaussianLikelihood`` bound on σ² (standardised units); older rows ran at it.
DEFAULT_NOISE_FLOOR = 1e-4


def mixture_components(setting: str | int, n_train: int) -> int:
    """Q for GM and C for PWL: a number, or ``"auto"`` — 2 below 600 training points, else 4.

    The paper gives more components to larger datasets; on housing (n = 455)
    four components overfit the marginal likelihood (test RMSE rises as it
    trains), two do not.
    """
    if setting == "auto":
        return 2 if n_train < 600 else 4
    return int(setting)


def model_name(method: str, n_train: int) -> str:
    """The model a method runs as: exact GPs become Fastfood expansions at n ≥ 2000."""
    if method.startswith("exact-") and n_train >= EXACT_LIMIT:
        return method.replace("exact-", "fastfood-")
    return method


def cell_validation_fraction(method: str, fraction: float) -> float:
    """The share of rows a method's fit holds out at the run's ``--validation-fraction``: ``fraction`` for
    the methods whose fit :func:`~alacarte.holdout.resolve_fraction` holds rows out of by default, none
    for the others — the exact GPs, the reference, fitted by the marginal likelihood of all rows (also
    where they run as Fastfood expansions)."""
    return fraction if _holds_out_by_default(method) else 0.0


@functools.cache
def _holds_out_by_default(method: str) -> bool:
    # Asked of the method's model below EXACT_LIMIT (a small one: the rule depends on its kind alone),
    # so that the benchmark and fit() follow one rule.
    model = make_model(method, 1, num_samples=4, num_components=1)
    return resolve_fraction("auto", model, streamed=False) > 0


def parse_splits(text: str) -> list[int]:
    """``"0-9"`` or ``"0,3,5"`` → split indices, each checked to be in 0..9."""
    try:
        if "-" in text:
            lo, hi = text.split("-")
            splits = list(range(int(lo), int(hi) + 1))
        else:
            splits = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"splits must look like '0-9' or '0,3,5', got {text!r}") from None
    if not splits:  # (a range from high to low)
        raise ValueError(f"splits {text!r} is an empty range; write the lower split first, as in '0-9'")
    if any(not 0 <= s <= 9 for s in splits):
        raise ValueError(f"splits must be in 0..9, got {text!r}")
    return splits


def check_settings(args: argparse.Namespace) -> None:
    """Refuse settings every cell would fail on (or a run that could never finish) before any cell starts."""
    for name in ("num_samples", "max_iter", "restart_iter", "workers", "threads"):
        check_positive_int(getattr(args, name), "--" + name.replace("_", "-"))
    check_nonnegative_int(args.restarts, "--restarts")
    if args.limit is not None:
        check_nonnegative_int(args.limit, "--limit")
    if args.time_budget is not None:
        check_real(args.time_budget, "--time-budget", 0)
    check_fraction(args.validation_fraction)
    if check_real(args.noise_floor, "--noise-floor", 0) >= 1:
        raise ValueError(f"--noise-floor must be below 1, the standardised targets' variance, got {args.noise_floor!r}")
    if args.components != "auto":
        try:
            check_positive_int(int(args.components), "--components")
        except ValueError:
            raise ValueError(f"--components must be 'auto' or a positive integer, got {args.components!r}") from None
    if {"gm", "pwl"} & set(args.methods):
        for count in (2, 4) if args.components == "auto" else (int(args.components),):
            if args.num_samples % count:
                raise ValueError(f"--num-samples {args.num_samples} must be a multiple of the number of GM/PWL "
                                 f"components, {count} (each component has M/C frequencies)"
                                 + (" ('auto' uses 2 or 4)" if args.components == "auto" else ""))


def check_device(name: str) -> None:
    """Refuse a device the cells could not use before any cell starts (each would fail alone)."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a torch device ({err})") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:index], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r}: this torch build or machine has no CUDA device")


def package_version() -> str:
    """``alacarte.__version__``, plus ``+g<commit>`` when the package runs from a git checkout, and
    ``.dirty<hash>`` (the first 8 hex digits of the SHA-256 of ``git diff HEAD`` of the package) for
    uncommitted changes: every row names the code that produced it, and two different edits are
    two versions (a cell killed under one does not resume its checkpoint under the other)."""
    import alacarte as ac

    root = Path(ac.__file__).resolve().parent.parent

    def git(*command: str) -> bytes:
        return subprocess.run(["git", "-C", str(root), *command], capture_output=True, timeout=10,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=7", "HEAD").decode()
        # An installed copy (site-packages of a virtual environment kept inside some project's
        # checkout) is in a git work tree too, but not in its commits: that commit is not this code.
        tracked = git("ls-files", "--", "alacarte/__init__.py")
        diff = git("diff", "HEAD", "--binary", "--", "alacarte")
    except (OSError, subprocess.SubprocessError):
        return ac.__version__
    if not commit or not tracked:
        return ac.__version__
    return f"{ac.__version__}+g{commit}" + (f".dirty{hashlib.sha256(diff).hexdigest()[:8]}" if diff else "")


def cell_settings(args: argparse.Namespace) -> dict:
    """What every cell of a run is given, besides its dataset, split and method."""
    return {"data": args.data, "num_samples": args.num_samples, "components": args.components,
            "max_iter": args.max_iter, "restarts": args.restarts, "restart_iter": args.restart_iter,
            "threads": args.threads, "device": args.device, "noise_floor": args.noise_floor,
            "validation_fraction": args.validation_fraction,
            "version": package_version(), "checkpoints": str(checkpoint_directory(args.csv))}


def checkpoint_directory(csv_path: str | os.PathLike) -> Path:
    """Where a results file's cells keep their fits' checkpoints: ``<csv stem>.checkpoints/`` beside it."""
    path = Path(csv_path)
    return path.with_name(path.stem + ".checkpoints")
