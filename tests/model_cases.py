"""The data and models the model tests share: a toy problem, a small FSARD model."""
import torch

from alacarte import FeatureGP, FSARDKernel


def toy_data(n=200, d=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype) * 2 + 5
    y = 10 * torch.sin(x[:, 0]) + x[:, 1] + 0.3 * torch.randn(n, generator=gen, dtype=dtype) + 100
    return x, y


def feature_model(d=3, m=64, seed=0):
    return FeatureGP(None, None, FSARDKernel(d, m, ard_num_dims=d, seed=seed)).double()


def with_value(t, index, value):
    t = t.clone()
    t[index] = value
    return t
