"""What :func:`~alacarte.fit` warns about once it has finished: a float32 loss that float64 arithmetic
puts elsewhere, jitter its factorisations needed, σ² ended at its lower bound."""
from __future__ import annotations

import copy
import warnings

import torch

from ..models import FeatureGP
from ..streaming import ChunkedData, streamed_negative_mll
from ._optimization import marginal_log_likelihood

__all__ = [
    "FLOAT32_LOSS_TOLERANCE",
    "noise_at_bound",
    "noise_at_lower_bound",
    "own_and_float64_losses",
    "warn_about_jitter",
    "warn_if_float32_loss_is_off",
    "warn_if_noise_at_lower_bound",
]


def warn_about_jitter(jitters: list[float]) -> None:
    """One warning for the jitter every factorisation of the fit needed, not one per iteration."""
    if jitters:
        warnings.warn(
            f"ΦᵀΦ + σ²I (ΦΦᵀ + σ²I when n < D) was not numerically positive definite in {len(jitters)} "
            f"factorisations during training; jitter up to {max(jitters):.1e}×its mean diagonal was "
            "added to its diagonal. "
            "Consider a larger noise lower bound or float64.",
            RuntimeWarning,
            stacklevel=4,  # this function, finish, fit, the caller
        )


# Float32 and float64 losses of the fits we measured agreed to ≤ 1.2e-3 per point (GM, FSARD, PWL
# on UCI energy, yacht, concrete, SE1); a float32 PWL fit on energy that followed round-off was 0.81 off
# (experiments/results/float32_check.md).
FLOAT32_LOSS_TOLERANCE = 0.01


def warn_if_float32_loss_is_off(model: FeatureGP, x: torch.Tensor | ChunkedData, y: torch.Tensor | None) -> None:
    """Warn when a model fitted in less than float64 has, at its fitted hyperparameters, a loss
    that float64 arithmetic puts more than :data:`FLOAT32_LOSS_TOLERANCE` per point away.

    Then ΦᵀΦ + σ²I was too ill-conditioned for the dtype (small σ², jitter added), and the
    optimiser may have followed round-off to a point that is no optimum at all (energy, PWL:
    test RMSE 2.26 in float32, 0.43 in float64).  Costs one float64 evaluation (streamed: two
    passes, the second with float64 statistics of the same features)."""
    streamed = isinstance(x, ChunkedData)
    dtype = (x.statistics_dtype or model.input_offset.dtype) if streamed else x.dtype
    if dtype == torch.float64:
        return
    loss, wide_loss = own_and_float64_losses(model, x, y)
    if not abs(loss - wide_loss) <= FLOAT32_LOSS_TOLERANCE:
        remedy = ("model.double(), or keep float32 features with statistics_dtype=torch.float64" if streamed
                  else "model.double()")
        name = str(dtype).removeprefix("torch.")
        warnings.warn(
            f"the {name} loss at the fitted hyperparameters is {loss:.4f} per point, but {wide_loss:.4f} in "
            f"float64 arithmetic: ΦᵀΦ + σ²I is too ill-conditioned for {name} at "
            f"σ² = {float(model.likelihood.noise.detach().min()):.2g}, and the optimiser may have followed its "
            f"round-off away from any optimum. Fit in float64: {remedy}.",
            RuntimeWarning,
            stacklevel=4,  # this function, finish, fit, the caller
        )


def own_and_float64_losses(model: FeatureGP, x: torch.Tensor | ChunkedData, y: torch.Tensor | None
                            ) -> tuple[float, float]:
    """The loss per point at the model's hyperparameters in its own arithmetic and in float64 (what
    :func:`warn_if_float32_loss_is_off` compares); streamed, the second from float64 statistics of
    the same features.  A diagnosis, not one of the fit's evaluations (the checkpoint counts those)."""
    if isinstance(x, ChunkedData):
        wide_data = copy.copy(x)
        wide_data.statistics_dtype = torch.float64

        def losses() -> tuple[float, float]:
            return (float(streamed_negative_mll(model, x, backward=False)),
                    float(streamed_negative_mll(model, wide_data, backward=False)))
    else:
        wide = copy.deepcopy(model).double()
        wide.set_train_data(x.double(), y.double(), strict=False)

        def loss_of(gp, inputs, targets) -> float:
            gp.train()
            with torch.no_grad(), gp.inference_settings():
                return float(-marginal_log_likelihood(gp)(gp(inputs), targets))

        def losses() -> tuple[float, float]:
            return loss_of(model, x, y), loss_of(wide, x.double(), y.double())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fit has said what jitter its factorisations needed
        return losses()


def noise_at_bound(noise: float, bound: float) -> bool:
    """Whether σ² = ``noise`` has ended at its lower ``bound``: within twice it (where :func:`~alacarte.fit` refits and warns)."""
    return bound > 0 and noise <= 2 * bound


def noise_at_lower_bound(model) -> tuple[float, float] | None:
    """(σ², its lower bound) when σ² is at the bound (:func:`noise_at_bound`), else ``None``."""
    bound = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound)
    noise = float(model.likelihood.noise.detach().min())
    return (noise, bound) if noise_at_bound(noise, bound) else None


def warn_if_noise_at_lower_bound(model, x: torch.Tensor | None, y: torch.Tensor | None,
                                  standardized: bool) -> None:
    """Warn when σ² ended at its constraint's lower bound.

    There the fit interpolates the training targets.  On real data that is
    rarely the best model even when it has the best marginal likelihood:
    repeated rows are the usual cause (the likelihood takes copies for
    independent observations that agree, so σ² → 0 pays); docs/benchmarks.md
    shows it on UCI wine.  Targets that truly have no noise are the other
    case: there the bound (GPyTorch's default 1e-4 in standardised units) is
    what stops the fit, as on UCI parkinsons.  When σ² is trained, :func:`~alacarte.fit`
    has already refitted from a larger noise (the optimiser can stall at the
    bound) when this warns.
    """
    at_bound = noise_at_lower_bound(model)
    if at_bound is None:
        return
    noise, bound = at_bound
    units = "in standardised units" if standardized else "in the targets' units"
    variance = None if y is None or y.numel() < 2 else float(y.var())
    if not standardized and variance is not None and bound >= variance:
        # Not interpolation but its opposite: every target is taken for noise.
        warnings.warn(
            f"the noise variance's lower bound ({bound:.1e} {units}, standardize=False) is not below the targets' "
            f"variance ({variance:.3g}): the model takes the targets for noise and predicts about their mean. "
            "Fit with standardize=True, or lower the bound: GaussianLikelihood(noise_constraint=GreaterThan(...)).",
            RuntimeWarning,
            stacklevel=4,  # this function, finish, fit, the caller
        )
        return
    trained = model.likelihood.noise_covar.raw_noise.requires_grad  # else set there by the user, and not refitted
    repeated = ""
    if x is not None and x.dim() == 2:
        copies = x.shape[0] - torch.unique(x, dim=0).shape[0]
        if copies:
            repeated = f" The training inputs repeat {copies} rows; repeated rows are the usual cause."
    warnings.warn(
        f"the noise variance {'ended' if trained else 'is fixed (not trained)'} at its lower bound ({noise:.3g} ≤ "
        f"2×{bound:.1e} {units}): the model interpolates its training targets, which generalises "
        f"worse unless they are noise-free.{repeated} "
        + ("A refit from a larger noise did not leave the bound with a better likelihood. " if trained else "")
        + "Drop repeated rows, or raise the bound; for targets without noise, lower it (docs/benchmarks.md, "
        "Parkinsons): GaussianLikelihood(noise_constraint=GreaterThan(...)).",
        RuntimeWarning,
        stacklevel=4,  # this function, finish, fit, the caller
    )
