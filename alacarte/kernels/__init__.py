"""GPyTorch kernels backed by explicit random Fourier feature maps."""
from .base import FeatureKernel
from .fastfood import FastfoodRBFKernel, FSARDKernel, FSGBARDKernel
from .random_fourier import RandomFourierKernel, SSGPRKernel
from .spectral_mixture import SpectralMixtureFastfoodKernel

__all__ = [
    "FeatureKernel",
    "FastfoodRBFKernel",
    "FSARDKernel",
    "FSGBARDKernel",
    "RandomFourierKernel",
    "SSGPRKernel",
    "SpectralMixtureFastfoodKernel",
]
