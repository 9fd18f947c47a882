"""batch_norm and layer_norm against onnxruntime's BatchNormalization and LayerNormalization."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import assert_close
from .onnx_reference import onnx_node


def batch_norm_operands(rng, channels, dtype):
    scale, bias, mean = (rng.standard_normal(channels).astype(dtype) for _ in range(3))
    var = rng.uniform(0.1, 2.0, channels).astype(dtype)
    return scale, bias, mean, var


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (3, 5), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("epsilon", [1e-5, 0.1])
def test_batch_norm(run_op, rng, shape, epsilon):
    x = rng.standard_normal(shape).astype(np.float32)
    params = batch_norm_operands(rng, shape[1], np.float32)
    got = run_op(lambda t: apply("batch_norm", [t, *params], {"epsilon": epsilon}), x)
    expected = onnx_node("BatchNormalization", x, params, {"epsilon": epsilon}, opset=15)
    assert_close(got, expected, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_batch_norm_dtypes(run_op, rng, dtype):
    x = rng.standard_normal((2, 3, 4, 4)).astype(dtype)
    params = batch_norm_operands(rng, 3, dtype)
    got = run_op(lambda t: apply("batch_norm", [t, *params]), x)
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    c = (-1, 1, 1)
    expected = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-5) * scale.reshape(c) + bias.reshape(c)
    assert_close(got, expected, dtype, rtol=4e-3 if dtype == "float16" else 1e-12,
                 atol=1e-2 if dtype == "float16" else 1e-12)


@pytest.mark.parametrize("shape, axis", [((2, 5, 8), -1), ((2, 5, 8), 1), ((3, 4), 0), ((2, 3, 4, 5), 2),
                                         ((2, 3, 4, 5), -3), ((7,), -1)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_layer_norm(run_op, rng, shape, axis, bias):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    normalized = shape[axis % len(shape):]
    params = [rng.standard_normal(normalized).astype(np.float32) for _ in range(2 if bias else 1)]
    got = run_op(lambda t: apply("layer_norm", [t, *params], {"axis": axis, "epsilon": 1e-3}), x)
    expected = onnx_node("LayerNormalization", x, params, {"axis": axis, "epsilon": 1e-3})
    assert_close(got, expected, np.float32, rtol=1e-4, atol=1e-5)


def test_layer_norm_broadcast_scale(run_op, rng):
    """Scale and bias broadcast against the normalized shape (here per last axis only)."""
    x = rng.standard_normal((2, 3, 6)).astype(np.float64)
    scale, bias = rng.standard_normal(6), rng.standard_normal((1, 6))
    got = run_op(lambda t: apply("layer_norm", [t, scale, bias], {"axis": 1}), x)
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(1, 2), keepdims=True)
    assert_close(got, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, np.float64)


def test_layer_norm_float16_large_values(run_op, rng):
    """float16 statistics are taken in float32: squares of these values overflow float16."""
    x = (rng.standard_normal((2, 64)) * 300 + 1000).astype(np.float16)
    scale, bias = np.ones(64, np.float16), np.zeros(64, np.float16)
    got = run_op(lambda t: apply("layer_norm", [t, scale, bias]), x)
    expected = onnx_node("LayerNormalization", x.astype(np.float32), [scale.astype(np.float32),
                                                                     bias.astype(np.float32)], {})
    assert_close(got, expected, np.float16, rtol=4e-3, atol=4e-3)


def test_dynamic_batch(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 3, None), name="x")
    params = batch_norm_operands(rng, 3, np.float32)
    y = apply("batch_norm", [x, *params])
    z = apply("layer_norm", [x, np.ones(1, np.float32)], {"axis": 1})
    assert y.shape == z.shape == (None, 3, None)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for shape in [(1, 3, 4), (4, 3, 9)]:
        v = rng.standard_normal(shape).astype(np.float32)
        got = run(x=v)
        assert_close(got["y"], onnx_node("BatchNormalization", v, params, {}, opset=15), np.float32,
                     rtol=1e-5, atol=1e-5)
        expected = onnx_node("LayerNormalization", v, [np.ones(v.shape[1:], np.float32)], {"axis": 1})
        assert_close(got["z"], expected, np.float32, rtol=1e-4, atol=1e-5)


def test_invalid(graph):
    x = ef.placeholder("float32", (2, 3, 4))
    c3, c4 = np.ones(3, np.float32), np.ones(4, np.float32)
    with pytest.raises(GraphError, match="var"):
        apply("batch_norm", [x, c3, c3, c3, c4])
    with pytest.raises(GraphError, match="float"):
        apply("batch_norm", [x, c3, c3, c3, c3.astype(np.float64)])
    with pytest.raises(GraphError, match=r"\(N, C"):
        apply("batch_norm", [ef.placeholder("float32", (3,)), c3, c3, c3, c3])
    with pytest.raises(GraphError, match="broadcast"):
        apply("layer_norm", [x, c3])
    with pytest.raises(GraphError, match="broadcast"):
        apply("layer_norm", [x, np.ones((2, 3, 4, 1), np.float32)], {"axis": 0})
    with pytest.raises(GraphError, match="axis"):
        apply("layer_norm", [x, c4], {"axis": 3})
    with pytest.raises(GraphError, match="float"):
        apply("layer_norm", [ef.placeholder("int32", (2, 4)), c4.astype(np.int32)])
