"""ef.nn: relu, softmax and log_softmax (any axis, stable for large logits); hardmax."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

from .harness import FLOATS, INTS, assert_close, random_array


def softmax_reference(x, axis):
    """exp(x) / sum(exp(x)), shifted by the max for stability, in float64."""
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_reference(x, axis):
    """x - logsumexp(x), with logsumexp = m + log(sum(exp(x - m))), in float64."""
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_relu(run_op, rng, dtype):
    x = random_array(rng, (3, 5), dtype)
    x.flat[:2] = 0
    assert_close(run_op(ef.nn.relu, x), np.where(x > 0, x, 0), dtype)


def test_relu_of_dynamic_batch(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 3), name="x")
    y = ef.nn.relu(x - 1.0)
    assert y.shape == (None, 3)
    run = compile_graph(graph, {"x": x}, {"y": y})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 3), "float32")
        assert_close(run(x=v)["y"], np.where(v > 1, v - 1, 0), np.float32)


SOFTMAXES = {"softmax": (ef.nn.softmax, softmax_reference),
             "log_softmax": (ef.nn.log_softmax, log_softmax_reference)}


@pytest.mark.parametrize("axis", [None, -1, 0, 1, 2, -3])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_axes_and_dtypes(run_op, rng, name, dtype, axis):
    fn, reference = SOFTMAXES[name]
    x = random_array(rng, (3, 4, 5), dtype, -4, 4)
    out = run_op((lambda t: fn(t)) if axis is None else (lambda t: fn(t, axis=axis)), x)
    assert_close(out, reference(x, -1 if axis is None else axis), dtype)


def test_softmax_properties(run_op, rng):
    x = random_array(rng, (4, 6), "float64", -10, 10)
    y = run_op(ef.nn.softmax, x)
    assert np.all(y > 0)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-12)
    # Shift invariance, and order: larger logits get larger probabilities.
    np.testing.assert_allclose(run_op(lambda t: ef.nn.softmax(t + 100.0), x), y, rtol=1e-10)
    assert np.array_equal(np.argsort(y, axis=-1), np.argsort(x, axis=-1))
    np.testing.assert_allclose(run_op(ef.nn.log_softmax, x), np.log(y), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_large_logits_are_stable(run_op, dtype):
    big = 1e4
    x = np.array([[big, 0.0, -big], [big, big, big], [-big, -big, 0.0], [big, big - 8, big - 16]],
                 np.float64).astype(dtype)
    y, logy = run_op(lambda t: (ef.nn.softmax(t), ef.nn.log_softmax(t)), x)
    assert not np.isnan(y).any() and not np.isnan(logy).any() and not np.isinf(logy[3]).any()
    assert_close(y, softmax_reference(x, -1), dtype)
    assert_close(y[:3], [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0, 0, 1]], dtype)
    assert_close(logy, log_softmax_reference(x, -1), dtype)
    assert_close(logy[:, 0], [0, -np.log(3), -big, log_softmax_reference(x[3:], -1)[0, 0]], dtype)


def test_softmax_dynamic_batch(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 4), name="x")
    y, z = ef.nn.softmax(x), ef.nn.softmax(x, axis=0)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 4), "float32")
        out = run(x=v)
        assert_close(out["y"], softmax_reference(v, -1), np.float32)
        assert_close(out["z"], softmax_reference(v, 0), np.float32)


@pytest.mark.parametrize("fn", [ef.nn.softmax, ef.nn.log_softmax])
def test_softmax_errors(graph, fn):
    with pytest.raises(GraphError):
        fn(ef.placeholder("int32", (2, 3)))
    with pytest.raises(GraphError):
        fn(ef.placeholder("float32", (2, 3)), axis=2)
    with pytest.raises(GraphError):
        fn(ef.placeholder("float32", (2, 3)), axis=-3)


def test_relu_rejects_bool(graph):
    with pytest.raises(GraphError):
        ef.nn.relu(ef.placeholder("bool", (2,)))


def hardmax_reference(x, axis):
    """1 at the first largest element of each slice along `axis` (Python's max/index), else 0."""
    moved = np.moveaxis(x, axis, -1)
    out = np.zeros(moved.shape, x.dtype)
    for index in np.ndindex(moved.shape[:-1]):
        row = moved[index].tolist()
        out[index + (row.index(max(row)),)] = 1
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_hardmax_marks_the_first_maximum(run_op, rng, dtype, axis):
    from edgeflow.graph.math_ops import apply
    x = np.round(random_array(rng, (3, 4, 5), dtype, -2, 2))  # ties: the first one wins
    y = run_op(lambda t: apply("hardmax", [t], {"axis": axis}), x)
    assert_close(y, hardmax_reference(x, axis), dtype)
    if dtype != "float64":  # what onnxruntime's Hardmax takes
        from .onnx_reference import onnx_reference
        expected, = onnx_reference("Hardmax", [x], [dtype], opset=13, axis=axis)
        assert_close(y, expected, dtype)


def test_hardmax_axis_out_of_range(graph):
    from edgeflow.graph.math_ops import apply
    with pytest.raises(GraphError, match="axis"):
        apply("hardmax", [ef.placeholder("float32", (2, 3))], {"axis": 2})


# -- lrn --------------------------------------------------------------------------------------

def lrn_reference(x, size, alpha, beta, bias):
    """ONNX's LRN formula channel by channel in float64."""
    x = x.astype(np.float64)
    c, out = x.shape[1], np.empty(x.shape)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + size // 2)
        square_sum = (x[:, lo:hi + 1] ** 2).sum(1)
        out[:, ch] = x[:, ch] / (bias + alpha / size * square_sum) ** beta
    return out


@pytest.mark.parametrize("shape, size", [((2, 5, 3, 4), 3), ((1, 6, 4, 2), 4), ((2, 3, 2, 2, 2), 5),
                                         ((1, 2, 3, 3), 7), ((1, 4, 3), 1)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_lrn(shape, size, dtype):
    from edgeflow.graph.math_ops import apply
    from .harness import run_op
    from .onnx_reference import onnx_node
    rng = np.random.default_rng(0)
    x = random_array(rng, shape, dtype, -3, 3)
    attrs = {"size": size, "alpha": 0.3, "beta": 0.6, "bias": 1.5}
    got = run_op(lambda t: apply("lrn", [t], attrs), x)
    assert_close(got, lrn_reference(x, **attrs), dtype)
    # onnxruntime's LRN takes 4-D float32 and float16 and odd sizes. (ONNX's reference
    # evaluator loops over the batch axis where it means channels: it is no reference here.)
    if x.ndim == 4 and dtype != "float64" and size % 2:
        assert_close(got, onnx_node("LRN", x, (), attrs, opset=13), dtype)


def test_lrn_invalid(graph):
    from edgeflow.graph.math_ops import apply
    with pytest.raises(GraphError, match="size"):
        apply("lrn", [ef.placeholder("float32", (1, 3, 4))], {"size": 0})
    with pytest.raises(GraphError, match="spatial"):
        apply("lrn", [ef.placeholder("float32", (3, 4))], {"size": 3})
    with pytest.raises(GraphError, match="dtype"):
        apply("lrn", [ef.placeholder("int32", (1, 3, 4))], {"size": 3})
