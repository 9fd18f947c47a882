"""OpenCL kernels of the activations (swish) against the numpy kernels and a float64
reference: each in a one-op model, run with and without the OpenCL delegate."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgeflow.accel

from .harness import run_both


@pytest.fixture(scope="module")
def delegate():
    return edgeflow.accel.OpenCLDelegate()


@settings(max_examples=10)
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=4), alpha=st.sampled_from([1.0, 0.5, 1.7]),
       scale=st.sampled_from([1.0, 30.0]), seed=st.integers(0, 2 ** 16))
def test_swish(delegate, shape, alpha, scale, seed):
    """Values past exp's overflow too (scale 30: x sigmoid(x) of x < -88 is -0, not NaN)."""
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    want, got, _ = run_both(delegate, "swish", [x], {"alpha": alpha})
    x64 = x.astype(np.float64)
    exact = x64 / (1 + np.exp(-np.float64(np.float32(alpha)) * x64))
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-30)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-30)
