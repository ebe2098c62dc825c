"""Constraint and prior plumbing, written once for every kernel parameter.

GPyTorch stores a constrained parameter ``foo`` as ``raw_foo`` plus
``raw_foo_constraint`` (and optionally ``foo_prior``) and exposes ``foo`` as a
property.  :class:`ConstrainedParameter` is that property, and
:func:`register_constrained_parameter` does the registration, so kernels
declare ``radius = ConstrainedParameter()`` and call the function once.
"""
from __future__ import annotations

import functools

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.priors import Prior
from torch import Tensor


class ConstrainedParameter:
    """Class attribute that reads and writes ``raw_<name>`` through its constraint."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, module, owner=None):
        if module is None:
            return self
        raw = getattr(module, f"raw_{self.name}")
        return getattr(module, f"raw_{self.name}_constraint").transform(raw)

    def __set__(self, module, value) -> None:
        _set_constrained(self.name, module, value)


def log_positive() -> Positive:
    """The default constraint of a lengthscale: positive, optimised as its logarithm.

    An input the data do not use wants ℓ → ∞. Under GPyTorch's softplus the raw value is ℓ there and
    its gradient falls as ℓ⁻³, so a fit's iteration budget can end with such inputs still weighted;
    on the log scale a step multiplies ℓ (docs/mathematics.md §3).
    """
    return Positive(transform=torch.exp, inv_transform=torch.log)


def _get_constrained(name: str, module) -> Tensor:
    return getattr(module, name)


def checked_value(name: str, value, constraint: Interval, raw: Tensor) -> Tensor:
    """``value`` shaped as ``raw``, checked to lie strictly inside ``constraint``: on its bounds the
    raw parameter would be ±∞ (a positive parameter set to 0 gives raw −∞ and NaN gradients)."""
    value = torch.as_tensor(value, dtype=raw.dtype, device=raw.device)
    lower = constraint.lower_bound.to(value)
    upper = constraint.upper_bound.to(value)
    if not bool((torch.isfinite(value) & (value > lower) & (value < upper)).all()):
        shown = value.tolist() if value.numel() <= 8 else f"a tensor of shape {tuple(value.shape)}"
        raise ValueError(f"{name} must be finite and strictly inside ({lower.min().item():g}, "
                         f"{upper.max().item():g}), got {shown}")
    return shaped_like(name, value, raw)


def shaped_like(name: str, value: Tensor, target: Tensor) -> Tensor:
    """``value`` in ``target``'s shape: the same values up to singleton dimensions (d values for a
    (1, d) lengthscale), else broadcast.  Reshaping any value of the right size would scramble,
    e.g., a transposed (d, b) for (b, 1, d)."""
    if value.numel() == target.numel() and value.squeeze().shape == target.squeeze().shape:
        return value.reshape(target.shape)
    try:
        return value.expand_as(target)
    except RuntimeError:
        raise ValueError(f"{name} has shape {tuple(target.shape)}: a value of shape {tuple(value.shape)} "
                         "does not broadcast to it") from None


def _set_named(name: str, module, value) -> None:
    setattr(module, name, value)  # through the class attribute, which may keep more state than raw_<name>


def _set_constrained(name: str, module, value) -> None:
    raw = getattr(module, f"raw_{name}")
    constraint = getattr(module, f"raw_{name}_constraint")
    value = checked_value(name, value, constraint, raw)
    module.initialize(**{f"raw_{name}": constraint.inverse_transform(value)})


def register_constrained_parameter(
    module,
    name: str,
    value: Tensor,
    constraint: Interval,
    prior: Prior | None = None,
) -> None:
    """Register ``raw_<name>`` (initialised so that ``module.<name> == value``), its
    constraint and, if given, ``<name>_prior``.  The class must declare
    ``<name> = ConstrainedParameter()``."""
    try:  # outside the constraint the raw value would be NaN: every feature NaN, silently
        value = checked_value(name, value, constraint, value)
    except ValueError as err:
        raise ValueError(f"the constraint {constraint} excludes the starting value of {name} ({err}); "
                         "widen the constraint") from None
    module.register_parameter(f"raw_{name}", torch.nn.Parameter(constraint.inverse_transform(value)))
    module.register_constraint(f"raw_{name}", constraint)
    if prior is not None:
        # partials of module-level functions rather than lambdas: kernels must stay picklable, and
        # GPyTorch inspects the closures' signatures (which operator.attrgetter does not have).
        module.register_prior(
            f"{name}_prior", prior, functools.partial(_get_constrained, name), functools.partial(_set_named, name)
        )
