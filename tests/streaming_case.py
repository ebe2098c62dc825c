"""A small feature-GP problem shared by the streaming and data-parallel tests."""
import torch
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.priors import GammaPrior

from alacarte import FeatureGP, FSARDKernel


def make_case(n: int = 61, num_samples: int = 12, seed: int = 0):
    """(x, y, model) in float64: FSARD with priors on the lengthscales and the noise,
    a non-zero mean, inputs that are not standardised."""
    generator = torch.Generator().manual_seed(1234)
    x = 2.0 * torch.randn(n, 3, generator=generator, dtype=torch.float64) + 1.0
    y = torch.sin(x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=generator, dtype=torch.float64) + 3.0
    kernel = FSARDKernel(3, num_samples, ard_num_dims=3, seed=seed, lengthscale_prior=GammaPrior(2.0, 1.0))
    model = FeatureGP(None, None, kernel, GaussianLikelihood(noise_prior=GammaPrior(1.1, 10.0))).double()
    with torch.no_grad():
        model.likelihood.noise = 0.05
        model.mean_module.constant.fill_(0.2)
        kernel.lengthscale = torch.tensor([1.5, 0.7, 2.0])
        kernel.outputscale = 1.3
    return x, y, model


class AugmentedChunks:
    """Two (x, y) chunks whose targets get fresh noise of ``scale`` on every pass, as random augmentation would."""

    def __init__(self, x, y, scale: float):
        self.x, self.y, self.scale, self.generator = x, y, scale, torch.Generator().manual_seed(0)

    def __iter__(self):
        noisy = self.y + self.scale * torch.randn(self.y.shape, generator=self.generator, dtype=self.y.dtype)
        half = len(self.y) // 2
        return iter([(self.x[:half], noisy[:half]), (self.x[half:], noisy[half:])])
