"""Standardisation of columns of any magnitude: a constant column standardises to exactly 0 whatever its
value, in memory and streamed, and a nearly constant one to mean 0 and std 1."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import alacarte as ac
from alacarte import AlaCarteRegressor
from alacarte.factory import make_model


def data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 3))
    return x, np.sin(2 * x[:, 0]) + x[:, 1] + 0.1 * rng.standard_normal(n)


@pytest.mark.parametrize("value", [1e50, -1e300, 1e300, 1e-300, 1e30])
def test_a_constant_column_of_any_magnitude_predicts_as_a_constant_5_does(value):
    x, y = data()
    predictions = []
    for constant in (5.0, value):
        xc = x.copy()
        xc[:, 2] = constant
        reg = AlaCarteRegressor("fsard", num_samples=32, max_iter=10, restarts=1).fit(xc[:150], y[:150])
        predictions.append(reg.predict(xc[150:]))
    np.testing.assert_allclose(predictions[1], predictions[0], rtol=1e-9, atol=0)


@pytest.mark.parametrize("value", [1e50, -1e300, 1e30])
def test_a_constant_column_streams_to_exactly_0(value):
    x, y = data()
    x[:, 2] = value
    model = make_model("fsard", 3, num_samples=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ac.fit(model, x, y, max_iter=2, restarts=0, chunk_size=37, progress=False)
    assert float(model.input_offset[2]) == value and float(model.input_scale[2]) == 1.0
    assert model.internal_inputs(torch.as_tensor(x))[:, 2].abs().max() == 0


@pytest.mark.parametrize("streamed", [False, True])
def test_a_nearly_constant_column_standardises_to_mean_0_and_std_1(streamed):
    """1e30 plus a variation of about 700 ulps (1e17): summed plainly, the mean is off by more than half an ulp."""
    x, y = data()
    x[:, 2] = 1e30 + 1e17 * np.random.default_rng(1).standard_normal(len(x))
    model = make_model("fsard", 3, num_samples=16)
    if streamed:
        from alacarte.streaming import as_chunked_data
        model.set_standardization(*as_chunked_data(x, y, chunk_size=37).moments(model))
    else:
        model.standardize(torch.as_tensor(x), torch.as_tensor(y))
    column = model.internal_inputs(torch.as_tensor(x))[:, 2]
    # The offset is a float: within half an ulp of 1e30 (7e13) of the mean, which is 7e-4 of the spread.
    scale = float(model.input_scale[2])
    assert abs(float(column.mean())) <= 0.5 * np.spacing(1e30) / scale and float(column.std()) == pytest.approx(1.0, rel=1e-6)
