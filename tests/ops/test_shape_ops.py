"""shape, fill (constant_of_shape), range, broadcast_to (expand), tile, split vs numpy."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError


def _run(g, feeds, outputs):
    from edgeflow.format import writer
    inputs = {n: t for n, (t, _) in feeds.items()}
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (inputs, outputs)}))) \
        .get_signature_runner("infer")
    return runner(**{n: v for n, (_, v) in feeds.items()})


@pytest.mark.parametrize("shape, target", [((3,), (2, 3)), ((2, 1), (2, 4)), ((1, 3, 1), (2, 1, 1, 5)),
                                           ((4,), (1,))])
def test_broadcast_to(shape, target):
    xv = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, shape, name="x")
        y = ef.broadcast_to(x, list(target), name="y")
    expected = xv * np.ones(target, np.float32)  # ONNX Expand broadcasts both ways
    assert y.shape == expected.shape
    np.testing.assert_array_equal(_run(g, {"x": (x, xv)}, {"y": y})["y"], expected)


@pytest.mark.parametrize("shape, reps", [((3,), (2,)), ((2, 3), (1, 2)), ((2, 1, 3), (3, 2, 1)), ((2, 2), (0, 1))])
def test_tile(shape, reps):
    xv = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.int32, [None] * len(shape), name="x")
        y = ef.tile(x, list(reps), name="y")
    np.testing.assert_array_equal(_run(g, {"x": (x, xv)}, {"y": y})["y"], np.tile(xv, reps))


@pytest.mark.parametrize("split, axis, expected_sizes", [
    (3, 1, (3, 3, 3)), ((2, 5, 2), 1, (2, 5, 2)), (4, 1, (3, 3, 3, 0)), (2, 0, (2, 2)), (4, -1, (3, 3, 3, 0))])
def test_split(split, axis, expected_sizes):
    xv = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 9], name="x")
        pieces = ef.split(x, split, axis=axis)
    out = _run(g, {"x": (x, xv)}, {f"p{i}": p for i, p in enumerate(pieces)})
    bounds = np.cumsum((0,) + expected_sizes)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        np.testing.assert_array_equal(out[f"p{i}"], np.take(xv, range(a, b), axis=axis))


@pytest.mark.parametrize("args, expected", [((5,), np.arange(5)), ((2, 11, 3), np.arange(2, 11, 3)),
                                            ((10, 0, -4), np.arange(10, 0, -4)), ((3, 3), np.arange(3, 3)),
                                            ((0.5, 2.0, 0.25), np.arange(0.5, 2.0, 0.25))])
def test_range(args, expected):
    g = ef.Graph()
    with g.as_default():
        y = ef.range(*args, name="y")
        x = ef.placeholder(ef.float32, [1], name="x")
    out = _run(g, {"x": (x, np.zeros(1, np.float32))}, {"y": y})["y"]
    np.testing.assert_allclose(out, expected.astype(out.dtype))
    assert out.dtype == (np.float32 if isinstance(args[0], float) else np.int32)


def test_shape_and_fill():
    xv = np.zeros((2, 5, 3), np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, None, 3], name="x")
        s = ef.shape(x, name="s")
        f = ef.fill(s, 7, dtype=ef.int64, name="f")
    assert s.shape == (3,) and f.shape == (None, None, None)
    out = _run(g, {"x": (x, xv)}, {"s": s, "f": f})
    np.testing.assert_array_equal(out["s"], [2, 5, 3])
    np.testing.assert_array_equal(out["f"], np.full((2, 5, 3), 7, np.int64))


def test_static_shape_values_are_known_while_building():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2, 6], name="x")
        y = ef.reshape(x, ef.shape(ef.placeholder(ef.float32, [3, 4])))
    assert y.shape == (3, 4)


def test_bad_operands_raise_graph_error():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2, 3])
        with pytest.raises(GraphError, match="repeats"):
            ef.tile(x, [1, 2, 3])
        with pytest.raises(GraphError, match="do not add up"):
            ef.split(x, [1, 1], axis=1)
        with pytest.raises(GraphError, match="delta must not be 0"):
            ef.range(0, 5, 0)
        with pytest.raises(GraphError, match="broadcast"):
            ef.broadcast_to(x, [4, 3])
