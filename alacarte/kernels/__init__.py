"""GPyTorch kernels backed by explicit random Fourier feature maps."""
from .base import FeatureKernel, MixtureFeatureKernel
from .fastfood import FastfoodRBFKernel, FSARDKernel, FSGBARDKernel
from .piecewise_linear import PiecewiseLinearRadialKernel
from .random_fourier import RandomFourierKernel, SSGPRKernel
from .spectral_mixture import SpectralMixtureFastfoodKernel

__all__ = [
    "FeatureKernel",
    "MixtureFeatureKernel",
    "FastfoodRBFKernel",
    "FSARDKernel",
    "FSGBARDKernel",
    "RandomFourierKernel",
    "SSGPRKernel",
    "SpectralMixtureFastfoodKernel",
    "PiecewiseLinearRadialKernel",
]
