"""quantize_linear and dequantize_linear against numpy expressions of ONNX's definitions:
q = saturate(round_half_to_even(x / scale) + zero_point), x = (q - zero_point) * scale."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

rng = np.random.default_rng(0)


def run(op, arrays, **attrs):
    with ef.Graph().as_default() as g:
        feeds = [ef.placeholder(a.dtype, a.shape) for a in arrays]
        y = apply(op, feeds, attrs)
        return ef.Session(g).run(y, dict(zip(feeds, arrays)))


def per_axis(a, axis, rank):
    shape = [1] * rank
    shape[axis] = -1
    return a.reshape(shape)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_quantize_per_tensor_rounds_half_to_even_and_saturates(dtype):
    info = np.iinfo(dtype)
    scale, zero = np.float32(0.5), np.array(3 if dtype != np.int8 else -2, dtype)
    x = np.concatenate([rng.uniform(-400, 400, 50), [0.25, 0.75, 1.25, -0.25, -1.25]]).astype(np.float32)
    want = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)
    np.testing.assert_array_equal(run("quantize_linear", [x, scale, zero], dtype=dtype), want)


def test_quantize_per_axis():
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    scale = np.array([0.01, 0.02, 0.05, 0.1], np.float32)
    zero = np.array([0, 10, -10, 127], np.int8)
    want = np.clip(np.round(x / per_axis(scale, 1, 3)) + per_axis(zero, 1, 3), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(run("quantize_linear", [x, scale, zero], axis=1, dtype=np.int8), want)


def test_quantize_without_a_zero_point_gives_uint8():
    x = np.array([-1.0, 0.2, 100.0, 300.0], np.float32)
    np.testing.assert_array_equal(run("quantize_linear", [x, np.float32(1.0)]),
                                  np.array([0, 0, 100, 255], np.uint8))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_dequantize_per_tensor_and_per_axis(dtype):
    info = np.iinfo(dtype)
    q = rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 5)).astype(dtype)
    zero = np.array(7, dtype)
    np.testing.assert_allclose(run("dequantize_linear", [q, np.float32(0.25), zero]),
                               (q.astype(np.int64) - 7) * np.float32(0.25), rtol=1e-7)
    scale, zeros = rng.uniform(0.01, 1, 5).astype(np.float32), np.arange(5).astype(dtype)
    np.testing.assert_allclose(run("dequantize_linear", [q, scale, zeros], axis=-1),
                               (q.astype(np.int64) - zeros) * scale, rtol=1e-6)


def test_bad_scales_are_refused():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(GraphError, match="3 scales for axis 1"):
        run("quantize_linear", [x, np.ones(3, np.float32)])
    with pytest.raises(GraphError, match="zero_point has shape"):
        run("quantize_linear", [x, np.ones(4, np.float32), np.zeros(3, np.uint8)])
    with pytest.raises(GraphError, match="zero_point is int8, the output uint8"):
        run("quantize_linear", [x, np.float32(1), np.int8(0)], dtype=np.uint8)
