"""The public model API on a CUDA device, against the same model on the CPU.

Skipped without CUDA.  Each model is built on the CPU (so both copies hold the
same random frequencies) and one copy is moved; only float64 round-off then
separates the two, which a few optimiser iterations cannot amplify visibly.
``compare_devices`` takes the device as an argument so the checks themselves
can be exercised on a CPU-only machine (``compare_devices(name, "cpu")``).
"""
import copy

import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte.factory import KERNEL_NAMES, make_model
from alacarte.io import load_model, save_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FIT = dict(max_iter=5, restarts=2, restart_iter=2, progress=False)


def data(n=300, d=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.sin(2 * x[:, 0]) + x[:, 1] ** 2 / 2 + 0.1 * rng.normal(size=n)


def assert_same(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=rtol, atol=rtol * float(b.abs().max()))


def compare_devices(name: str, device: str, tmp_path) -> None:
    x, y = data()
    x_test = data(n=50, seed=1)[0]
    cpu = make_model(name, x.shape[1], num_samples=32, num_components=2, seed=0)
    gpu = copy.deepcopy(cpu).to(device)

    losses = [ac.fit(m, x, y, **FIT).loss for m in (cpu, gpu)]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    want, got = cpu.predict(x_test), gpu.predict(x_test)
    assert got.mean.device.type == torch.device(device).type
    for a, b in zip(got, want):
        assert_same(a, b)

    # a model saved from the device reloads on the CPU and answers as the device did
    save_model(gpu, tmp_path / "gpu.alacarte")
    reloaded = load_model(tmp_path / "gpu.alacarte")
    assert reloaded.input_offset.device.type == "cpu"
    for a, b in zip(reloaded.predict(x_test), got):
        assert_same(a, b, rtol=1e-10)

    if name.startswith("exact"):
        return
    # streamed conditioning and posterior draws read host arrays onto the model's device
    for model in (cpu, gpu):
        model.cache_posterior(x, y, chunk_size=64)
    for a, b in zip(gpu.predict(x_test), want):
        assert_same(a, b)
    draws = [m.sample_functions(3, seed=0)(x_test) for m in (cpu, gpu)]
    assert_same(draws[1], draws[0], rtol=1e-5)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_a_model_on_the_gpu_fits_predicts_streams_and_saves_as_on_the_cpu(name, tmp_path):
    compare_devices(name, "cuda", tmp_path)


def test_a_streamed_fit_on_the_gpu_matches_the_in_memory_fit():
    x, y = data(n=500)
    models = [make_model("fsgbard", x.shape[1], num_samples=32, seed=0).to("cuda") for _ in range(2)]
    in_memory = ac.fit(models[0], x, y, **FIT).loss
    streamed = ac.fit(models[1], x, y, chunk_size=128, **FIT).loss
    np.testing.assert_allclose(streamed, in_memory, rtol=1e-8)
    assert_same(models[1].predict(x).mean, models[0].predict(x).mean, rtol=1e-8)
