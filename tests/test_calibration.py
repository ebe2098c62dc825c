"""Predictive distributions against a known truth: functions drawn from a GP prior with a known
RBF/ARD kernel and noise, the exact posterior of that kernel as the reference.

Every kernel, fitted with the estimator's defaults, must put 93–97% of fresh test targets inside its
central 95% interval and have a mean NLPD within 0.05 nats of the true posterior's.  Where the
features cannot represent the truth, averaging feature draws must close most of the gap."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alacarte import AlaCarteRegressor
from alacarte.factory import KERNEL_NAMES

LENGTHSCALES = np.array([1.0, 1.5, 3.0])
# Kernels with one lengthscale for every input are given a truth of that form.
ISOTROPIC = {"fastfood-rbf": np.array([1.5, 1.5, 1.5])}
SIGNAL, NOISE = 1.0, 0.05
TEST_POINTS = 2000


def rbf(a: np.ndarray, b: np.ndarray, lengthscales: np.ndarray = LENGTHSCALES) -> np.ndarray:
    diff = (a[:, None, :] - b[None, :, :]) / lengthscales
    return SIGNAL * np.exp(-0.5 * (diff**2).sum(-1))


def draw(n: int, seed: int, lengthscales: np.ndarray = LENGTHSCALES, half_width: float = 2.0):
    """Training and test rows of one function drawn from the prior, with noisy targets."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-half_width, half_width, size=(n + TEST_POINTS, 3))
    cov = rbf(x, x, lengthscales) + 1e-8 * np.eye(len(x))
    f = np.linalg.cholesky(cov) @ rng.standard_normal(len(x))
    y = f + math.sqrt(NOISE) * rng.standard_normal(len(x))
    return x[:n], y[:n], x[n:], y[n:]


def true_posterior(x, y, x_test, lengthscales: np.ndarray = LENGTHSCALES):
    """The exact predictive mean and variance of a new observation under the true kernel and noise."""
    k = rbf(x, x, lengthscales) + NOISE * np.eye(len(x))
    chol = np.linalg.cholesky(k)
    cross = rbf(x_test, x, lengthscales)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    w = np.linalg.solve(chol, cross.T)
    return cross @ alpha, SIGNAL - (w**2).sum(0) + NOISE


def nlpd(mean, variance, y) -> float:
    return float(np.mean(0.5 * (np.log(2 * np.pi * variance) + (y - mean) ** 2 / variance)))


def coverage95(mean, variance, y) -> float:
    return float(np.mean(np.abs(y - mean) <= 1.959963984540054 * np.sqrt(variance)))


FEATURE_KERNELS = [name for name in KERNEL_NAMES if not name.startswith("exact")]


def check_calibrated(kernel: str, n: int, seed: int) -> None:
    lengthscales = ISOTROPIC.get(kernel, LENGTHSCALES)
    x, y, x_test, y_test = draw(n, seed, lengthscales)
    true_mean, true_var = true_posterior(x, y, x_test, lengthscales)
    reg = AlaCarteRegressor(kernel).fit(x, y)
    mean, std = reg.predict(x_test, return_std=True)
    ours, truth = nlpd(mean, std**2, y_test), nlpd(true_mean, true_var, y_test)
    covered = coverage95(mean, std**2, y_test)
    assert 0.93 <= covered <= 0.97, f"{kernel}: 95% intervals cover {covered:.3f} of the test targets"
    assert abs(ours - truth) <= 0.05, f"{kernel}: NLPD {ours:.4f} against the true posterior's {truth:.4f}"


def test_the_true_posterior_is_calibrated():
    """The reference itself: the exact posterior with the true kernel covers 95% (within sampling error)."""
    x, y, x_test, y_test = draw(500, 0)
    mean, var = true_posterior(x, y, x_test)
    assert 0.94 <= coverage95(mean, var, y_test) <= 0.96


# The default kernel in the default run (about two minutes: five draws of D = 1 024 at n = 500); the others
# behind the slow marker.
@pytest.mark.parametrize("kernel", [k if k == "gm" else pytest.param(k, marks=pytest.mark.slow)
                                    for k in FEATURE_KERNELS])
def test_every_kernel_is_calibrated_at_n_500(kernel):
    check_calibrated(kernel, 500, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", FEATURE_KERNELS)
def test_every_kernel_is_calibrated_at_n_5000(kernel):
    check_calibrated(kernel, 5000, seed=2)


@pytest.mark.parametrize("kernel", [pytest.param("fastfood-ard", marks=pytest.mark.slow), "fsard"])
def test_averaging_feature_draws_closes_most_of_a_small_maps_gap(kernel):
    """A rough truth (lengthscales 0.6–2.5 on [−3, 3]³) that D = 128 features cannot represent: one
    draw is 0.2–0.4 nats above the true posterior and covers too little; the mixture of five draws
    closes more than 40% of that gap, and its band errs on the wide side (it carries the spread of
    the draws' means)."""
    lengthscales = np.array([0.6, 1.0, 2.5])
    x, y, x_test, y_test = draw(500, 0, lengthscales, half_width=3.0)
    reference = nlpd(*true_posterior(x, y, x_test, lengthscales), y_test)
    gaps, covers = [], []
    for draws in (1, 5):
        reg = AlaCarteRegressor(kernel, num_samples=64, num_draws=draws, random_state=0).fit(x, y)
        mean, std = reg.predict(x_test, return_std=True)
        gaps.append(nlpd(mean, std**2, y_test) - reference)
        covers.append(coverage95(mean, std**2, y_test))
    assert gaps[0] > 0.2 and covers[0] < 0.95
    assert gaps[1] < 0.6 * gaps[0] and 0.95 <= covers[1] <= 0.99


@pytest.mark.slow
def test_a_simplex_gp_selects_and_is_calibrated_at_the_defaults():
    """The truth above on three inputs, two irrelevant uniform columns appended: a simplex-FSARD GP
    fitted and selected at the defaults (20% of the rows held out for the band) keeps exactly the
    three inputs, covers 93–97% and is within 0.05 nats of the true posterior's NLPD."""
    from alacarte import FeatureGP, FSARDKernel, fit
    from alacarte.selection import select_inputs

    x, y, x_test, y_test = draw(2000, 3)
    rng = np.random.default_rng(3)
    widen = lambda a: np.hstack([a, rng.uniform(-2, 2, size=(len(a), 2))])  # noqa: E731
    x, x_test = widen(x), widen(x_test)
    true_mean, true_var = true_posterior(x[:, :3], y, x_test[:, :3])
    model = FeatureGP(None, None, FSARDKernel(5, 256, ard_num_dims=5, simplex=True, seed=0)).double()
    fit(model, x, y, progress=False)
    assert select_inputs(model, x, y).selected.tolist() == [0, 1, 2]
    prediction = model.predict(torch.as_tensor(x_test))
    mean, variance = prediction.mean.detach().numpy(), prediction.observed_variance.detach().numpy()
    covered = coverage95(mean, variance, y_test)
    gap = nlpd(mean, variance, y_test) - nlpd(true_mean, true_var, y_test)
    assert 0.93 <= covered <= 0.97 and abs(gap) <= 0.05, (covered, gap)
