"""Gradient rules of the core ops against finite differences (float64)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

from .gradcheck import check_gradients

rng = np.random.default_rng(0)


def r(*shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


BINARY = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b), ("maximum", ef.maximum), ("minimum", ef.minimum),
]


@pytest.mark.parametrize("name, fn", BINARY)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), (2, 3))])
def test_binary_with_broadcasting(name, fn, shapes):
    a, b = r(*shapes[0]), (positive(*shapes[1]) if name == "div" else r(*shapes[1]))
    check_gradients(fn, a, b)


def test_pow():
    check_gradients(lambda a, b: a ** b, positive(3, 4), r(4))


@pytest.mark.parametrize("fn, x", [
    (ef.neg, r(3, 4)), (ef.abs, r(3, 4)), (ef.exp, r(3, 4)), (ef.log, positive(3, 4)),
    (ef.sqrt, positive(3, 4)), (ef.sigmoid, r(3, 4)), (ef.tanh, r(3, 4)), (ef.nn.relu, r(3, 4)),
    (lambda x: ef.nn.softmax(x, axis=1), r(3, 5)), (lambda x: ef.nn.log_softmax(x, axis=0), r(3, 5)),
])
def test_unary(fn, x):
    check_gradients(fn, x, rtol=1e-4 if fn is not ef.neg else 1e-5)


@pytest.mark.parametrize("ta, tb, a, b", [
    (False, False, (3, 4), (4, 5)), (True, False, (4, 3), (4, 5)), (False, True, (3, 4), (5, 4)),
    (True, True, (4, 3), (5, 4)), (False, False, (2, 3, 4), (4, 5)), (False, False, (2, 1, 3, 4), (3, 4, 2)),
])
def test_matmul(ta, tb, a, b):
    check_gradients(lambda x, y: ef.matmul(x, y, transpose_a=ta, transpose_b=tb), r(*a), r(*b))


@pytest.mark.parametrize("reduce", [ef.reduce_sum, ef.reduce_mean, ef.reduce_max])
@pytest.mark.parametrize("axis, keepdims", [(None, False), (1, False), ([0, 2], True), (-1, True)])
def test_reductions(reduce, axis, keepdims):
    check_gradients(lambda x: reduce(x, axis=axis, keepdims=keepdims), r(3, 4, 5))


def test_cast_passes_gradients_between_float_types():
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, [3])
        (grad,) = ef.gradients(ef.reduce_sum(ef.cast(p, ef.float32) * 2.0), [p])
        out = ef.Session().run(grad, {p: r(3)})
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [2, 2, 2])


def test_reduce_max_splits_ties():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, [2, 3])
        (grad,) = ef.gradients(ef.reduce_sum(ef.reduce_max(p, axis=1)), [p])
        out = ef.Session().run(grad, {p: x})
    np.testing.assert_array_equal(out, [[0, 0.5, 0.5], [1, 0, 0]])


@pytest.mark.parametrize("fn, shape", [
    (lambda x: ef.reshape(x, [4, -1]), (2, 6)), (lambda x: ef.transpose(x, [2, 0, 1]), (2, 3, 4)),
    (lambda x: ef.squeeze(x, [1]), (3, 1, 2)), (lambda x: ef.expand_dims(x, 1), (3, 2)),
    (lambda x: x[1:, ::2], (4, 5)), (lambda x: x[::-1, 1], (4, 3)),
    (lambda x: ef.gather(x, [2, 0, 2], axis=1), (3, 4)),
    (lambda x: ef.gather(x, np.array([[0, 1], [1, 1]]), axis=0), (3, 2)),
    (lambda x: ef.concat([x, x * 2.0, ef.exp(x)], axis=1), (2, 3)),
    (lambda x: ef.split(x, [1, 3], axis=1)[1], (2, 4)),
    (lambda x: ef.tile(x, [2, 3]), (2, 3)), (lambda x: ef.broadcast_to(x, [4, 3]), (1, 3)),
    (lambda x: ef.where(ef.greater(x, ef.constant(0.0, ef.float64)), x * x, -x), (3, 4)),
])
def test_shape_ops(fn, shape):
    check_gradients(fn, r(*shape))


def test_dynamic_batch_gradients():
    """Gradients built with a None batch dimension run at any batch size."""
    w0 = r(4, 3)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [None, 4])
        w = ef.Variable(w0)
        loss = ef.reduce_mean(ef.nn.relu(x @ w + ef.constant(np.ones(3))))
        (grad,) = ef.gradients(loss, [w])
        sess = ef.Session()
        sess.run(ef.global_variables_initializer())
    for n in (1, 5):
        xv = r(n, 4)
        live = (xv @ w0 + 1) > 0
        expected = xv.T @ (live / (n * 3))
        np.testing.assert_allclose(sess.run(grad, {x: xv}), expected, rtol=1e-10)


def test_gradients_sum_over_paths_and_skip_unrelated():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [3])
        other = ef.placeholder(ef.float64, [3])
        y = ef.reduce_sum(x * x + ef.exp(x))
        gx, gother = ef.gradients(y, [x, other])
        xv = r(3)
        np.testing.assert_allclose(ef.Session().run(gx, {x: xv}), 2 * xv + np.exp(xv))
    assert gother is None


def test_missing_rule_is_named():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [3, 4])
        y = ef.reduce_sum(ef.cast(ef.argmax(x, axis=1), ef.float32) * 1.0)
        assert ef.gradients(y, [x]) == [None]  # argmax is a function of order only: no path
        with pytest.raises(GraphError, match="only float tensors"):
            ef.gradients(ef.argmax(x, axis=1), [x])


# -- indexing ops (issue 12): gradients scatter-add back to where values were read -------------

def _apply(op, attrs, *operands):
    from edgeflow.graph.math_ops import apply
    return apply(op, [o if isinstance(o, ef.Tensor) else ef.constant(np.asarray(o, np.int64)) for o in operands],
                 attrs)


@pytest.mark.parametrize("fn, shapes", [
    # repeated and negative indices: the gradients of the reads add up
    (lambda x: _apply("gather_elements", {"axis": 0}, x, [[0, -1, 1], [0, 0, 2], [2, 1, 0]]), [(3, 3)]),
    (lambda x: _apply("gather_elements", {"axis": -1}, x, [[1, 1, 0, -1]]), [(1, 3)]),
    (lambda x: _apply("gather_nd", {}, x, [[0, 1], [-2, 1], [1, 2]]), [(2, 3)]),
    (lambda x: _apply("gather_nd", {}, x, [[1], [1], [0]]), [(2, 3)]),
    (lambda x, u: _apply("scatter_elements", {"axis": 1, "reduction": "add"}, x, [[0, 0], [2, -1]], u),
     [(2, 3), (2, 2)]),
    (lambda x, u: _apply("scatter_elements", {"axis": 0}, x, [[1, 0, 1]], u), [(2, 3), (1, 3)]),
    (lambda x, u: _apply("scatter_nd", {"reduction": "add"}, x, [[1], [1]], u), [(3, 2), (2, 2)]),
    (lambda x, u: _apply("scatter_nd", {}, x, [[0, 1], [-1, 0]], u), [(3, 2), (2,)]),
    (lambda x: _apply("trilu", {"upper": False, "k": 1}, x), [(3, 4)]),
    (lambda x: _apply("trilu", {}, x, np.array(-1)), [(2, 3, 3)]),
    (lambda x: _apply("reverse_sequence", {}, x, [3, 0, 1]), [(4, 3, 2)]),
    (lambda x: _apply("reverse_sequence", {"batch_axis": 0, "time_axis": 1}, x, [2, 4]), [(2, 4)]),
])
def test_indexing_ops(fn, shapes):
    check_gradients(fn, *(r(*s) for s in shapes))


def test_gather_elements_second_derivative():
    """Through scatter_elements' own gradient: d/dx of sum(w * d/dx(sum(gather(x)^2)))."""
    def fn(x):
        y = _apply("gather_elements", {"axis": 1}, x, [[2, 2, 0], [1, -1, 0]])
        return ef.gradients(ef.reduce_sum(y * y), [x])[0] * x
    check_gradients(fn, r(2, 3))


@pytest.mark.parametrize("op, attrs, operands", [
    ("scatter_elements", {"reduction": "mul"}, [(2, 3), [[0, 1, 0]], (1, 3)]),
    ("scatter_nd", {"reduction": "max"}, [(2, 3), [[0]], (1, 3)]),
    ("gather_nd", {"batch_dims": 1}, [(2, 3), [[0], [2]]]),
])
def test_indexing_gradients_refused(op, attrs, operands):
    with ef.Graph().as_default():
        xs = [ef.placeholder("float64", o) if isinstance(o, tuple) else o for o in operands]
        y = _apply(op, attrs, *xs)
        with pytest.raises(GraphError, match=op):
            ef.gradients(ef.reduce_sum(y), [xs[0]])


@pytest.mark.parametrize("name, low, high", [
    ("sin", -3, 3), ("cos", -3, 3), ("tan", -1.2, 1.2), ("asin", -0.9, 0.9), ("acos", -0.9, 0.9),
    ("atan", -3, 3), ("sinh", -2, 2), ("cosh", -2, 2), ("asinh", -3, 3), ("acosh", 1.2, 3), ("atanh", -0.9, 0.9)])
def test_trigonometric(name, low, high):
    from edgeflow.graph.math_ops import apply
    check_gradients(lambda x: apply(name, [x]), r(3, 4, low=low, high=high), rtol=1e-4)


@pytest.mark.parametrize("name, attrs", [("celu", {"alpha": 0.7}), ("softsign", {}), ("mish", {}),
                                         ("thresholded_relu", {"alpha": 0.3}), ("shrink", {"lambd": 0.4, "bias": 0.2})])
def test_activations(name, attrs):
    """Away from the kinks (|x| near 0.3 and 0.4 is avoided), as finite differences need."""
    from edgeflow.graph.math_ops import apply
    x = r(3, 4)
    x[np.abs(np.abs(x) - 0.35) < 0.1] = 1.0
    check_gradients(lambda t: apply(name, [t], attrs), x, rtol=1e-4)
