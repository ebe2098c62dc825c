"""alacarte: expressive GP kernels on Fastfood feature maps, with Woodbury likelihoods.

Public surface: the kernels, the models, the marginal likelihood, the training
entry point, the estimators and the dataset loader.  Building blocks live in the submodules
(:mod:`alacarte.ops`, :mod:`alacarte.features`, :mod:`alacarte.woodbury`).
"""
from .kernels import (
    FastfoodRBFKernel,
    FeatureKernel,
    FSARDKernel,
    FSGBARDKernel,
    PiecewiseLinearRadialKernel,
    RandomFourierKernel,
    SpectralMixtureFastfoodKernel,
    SSGPRKernel,
)
from .datasets import list_uci, load_uci
from .mll import WoodburyMarginalLogLikelihood
from .models import ExactRBFGP, FeatureGP
from .regressor import AlaCarteRegressor
from .selection import DerivativeSelector, RFFNetClassifier, RFFNetRegressor, SRFFRegressor
from .training import fit, fit_pilot

__version__ = "0.1.0"

__all__ = [
    "FeatureKernel",
    "FastfoodRBFKernel",
    "FSARDKernel",
    "FSGBARDKernel",
    "RandomFourierKernel",
    "SSGPRKernel",
    "SpectralMixtureFastfoodKernel",
    "PiecewiseLinearRadialKernel",
    "FeatureGP",
    "ExactRBFGP",
    "WoodburyMarginalLogLikelihood",
    "fit",
    "fit_pilot",
    "AlaCarteRegressor",
    "SRFFRegressor",
    "list_uci",
    "load_uci",
    "RFFNetRegressor",
    "RFFNetClassifier",
    "DerivativeSelector",
]
