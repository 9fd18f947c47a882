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


@pytest.mark.parametrize("x_shape, slope_shape", [((1, 8, 5, 5), (8, 1, 1)), ((3, 7), (7,)), ((2, 3, 4), (1,)),
                                                  ((2, 3, 4), (2, 3, 4))])
def test_prelu(delegate, x_shape, slope_shape):
    """x where x >= 0, else slope * x, slope broadcast: exact, NaN and infinities too."""
    rng = np.random.default_rng(len(x_shape) + len(slope_shape))
    x = (rng.standard_normal(x_shape) * 3).astype(np.float32)
    x.flat[:3] = [np.nan, np.inf, -np.inf]
    slope = rng.uniform(-1, 1, slope_shape).astype(np.float32)
    want, got, _ = run_both(delegate, "prelu", [x, slope])
    with np.errstate(invalid="ignore"):
        exact = np.where(x >= 0, x, slope * x)
    np.testing.assert_array_equal(got, exact)
    np.testing.assert_array_equal(want, exact)


@settings(max_examples=10)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), activation=st.sampled_from(["swish", "hard_swish"]),
       row=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_add_with_a_fused_swish(delegate, shape, activation, row, seed):
    """add's fused swish and hard_swish (common.cl's fused_activation), far past exp's
    overflow too, against the float64 formulas of the float32 sum (the kernels' add rounds
    it: near -3, where hard_swish's x + 3 cancels, that rounding alone is 6e-5 of the
    result) and the numpy kernels."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 40).astype(np.float32)
    b = (rng.standard_normal(shape[-1:] if row else shape) * 3).astype(np.float32)
    want, got, _ = run_both(delegate, "add", [a, b], {"activation": activation})
    s = (a + b).astype(np.float64)
    exact = s / (1 + np.exp(-s)) if activation == "swish" else s * np.clip(s + 3, 0, 6) / 6
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
