"""The builder end to end: static shapes with unknown dims, dynamic batches, chains of ops,
several outputs, and both packaging routes (file and bytes)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

from .harness import assert_close, compile_graph as compile_in_memory, random_array


def _r(*shape, dtype="float32"):
    return random_array(np.random.default_rng(sum(shape) + len(shape)), shape, dtype)


# (label, fn, input arrays, placeholder shapes, static output shape expected at build time)
STATIC_SHAPES = [
    ("add-rows", lambda a, b: a + b, [_r(5, 3), _r(3)], [(None, 3), (3,)], (None, 3)),
    ("mul-outer", lambda a, b: a * b, [_r(5, 1), _r(1, 4)], [(None, 1), (1, 4)], (None, 4)),
    ("add-unknown", lambda a, b: a + b, [_r(2, 3), _r(3)], [(None, None), (None,)], (None, None)),
    ("less-unknown-vs-1", ef.less, [_r(2, 3), _r(1, 3)], [(2, None), (1, None)], (2, None)),
    ("matmul-batch", ef.matmul, [_r(4, 2, 3), _r(3, 5)], [(None, 2, 3), (3, 5)], (None, 2, 5)),
    ("matmul-vector", ef.matmul, [_r(4, 3), _r(3)], [(None, 3), (3,)], (None,)),
    ("reshape", lambda a: ef.reshape(a, (-1, 3)), [_r(4, 6)], [(None, 6)], (None, 3)),
    ("transpose", lambda a: ef.transpose(a), [_r(4, 3)], [(None, 3)], (3, None)),
    ("concat-1", lambda a, b: ef.concat([a, b], 1), [_r(2, 2), _r(2, 3)], [(None, 2), (None, 3)], (None, 5)),
    ("concat-0", lambda a, b: ef.concat([a, b], 0), [_r(2, 3), _r(4, 3)], [(2, 3), (None, 3)], (None, 3)),
    ("reduce-0", lambda a: ef.reduce_sum(a, axis=0), [_r(5, 4)], [(None, 4)], (4,)),
    ("reduce-keep", lambda a: ef.reduce_max(a, axis=-1, keepdims=True), [_r(5, 4)], [(None, 4)], (None, 1)),
    ("gather", lambda a: ef.gather(a, [0, -1]), [_r(5, 4)], [(None, 4)], (2, 4)),
    ("gather-1", lambda a: ef.gather(a, [[0], [2]], axis=1), [_r(5, 4)], [(None, 4)], (None, 2, 1)),
    ("slice", lambda a: a[1:3, ::2], [_r(5, 5)], [(None, 5)], (None, 3)),
    ("index", lambda a: a[:, -1], [_r(5, 5)], [(None, 5)], (None,)),
    ("expand", lambda a: ef.expand_dims(a, 0), [_r(3)], [(None,)], (1, None)),
    ("squeeze", lambda a: ef.squeeze(a), [_r(1, 3, 1)], [(1, None, 1)], (None,)),
    ("softmax", ef.nn.softmax, [_r(5, 4)], [(None, 4)], (None, 4)),
    ("argmax", lambda a: ef.argmax(a, axis=1), [_r(5, 4)], [(None, 4)], (None,)),
    ("where", lambda c, a: ef.where(c, a, 0.0), [_r(4, 1, dtype="bool"), _r(3)], [(None, 1), (3,)], (None, 3)),
    ("cast", lambda a: ef.cast(a, "int32"), [_r(5, 4)], [(None, None)], (None, None)),
]


@pytest.mark.parametrize("fn,arrays,shapes,expected", [c[1:] for c in STATIC_SHAPES],
                         ids=[c[0] for c in STATIC_SHAPES])
def test_static_shape_at_build_time(run_op, fn, arrays, shapes, expected):
    built = []

    def build(*ts):
        built.append(fn(*ts))
        return built[-1]

    run_op(build, *arrays, shapes=shapes)  # checks the static shape against the run's
    assert built[0].shape == expected


def test_mlp_dynamic_batch_same_interpreter(compile_graph, graph, rng):
    w1, b1 = random_array(rng, (4, 8), "float32", -1, 1), random_array(rng, (8,), "float32", -1, 1)
    w2, b2 = random_array(rng, (8, 3), "float32", -1, 1), random_array(rng, (3,), "float32", -1, 1)
    x = ef.placeholder("float32", (None, 4), name="x")
    h = ef.nn.relu(x @ ef.constant(w1) + ef.constant(b1))
    logits = ef.matmul(h, ef.constant(w2)) + b2
    probs, label = ef.nn.softmax(logits), ef.argmax(logits, axis=1)
    assert probs.shape == (None, 3) and label.shape == (None,)
    run = compile_graph(graph, {"x": x}, {"probs": probs, "label": label})
    for batch in (1, 3, 7, 3, 1):  # back to a shape seen before: a cached plan
        v = random_array(rng, (batch, 4), "float32")
        hidden = np.maximum(v.astype(np.float64) @ w1 + b1, 0)
        z = hidden @ w2 + b2
        out = run(x=v)
        assert_close(out["probs"], np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), np.float32)
        np.testing.assert_array_equal(out["label"], [int(np.argmax(row)) for row in z])


def test_chain_of_ops_reusing_arena_memory(run_op, rng):
    # Many intermediates with short lives: the arena reuses their bytes, which must not
    # corrupt a value that is still needed (x is used at the start and at the end).
    x = random_array(rng, (6, 5), "float32", 0.5, 2)

    def chain(t):
        a = ef.exp(t * 0.5)
        b = ef.sqrt(a) - 1.0
        c = ef.reduce_sum(b * b, axis=1, keepdims=True)
        d = ef.transpose(t / (c + 1.0))
        return ef.log(ef.transpose(d) + 1.0) + t

    x64 = x.astype(np.float64)
    b = np.sqrt(np.exp(x64 * 0.5)) - 1.0
    c = (b * b).sum(axis=1, keepdims=True)
    assert_close(run_op(chain, x), np.log(x64 / (c + 1.0) + 1.0) + x64, np.float32)


def test_integer_chain(run_op):
    x = np.array([-9, -4, -1, 0, 3, 8], np.int32)
    y = np.array([2, -3, 4, 5, -2, 3], np.int32)
    # ((x * 3 - y) / y) with truncating division, then the max with x.
    q = (x * 3 - y).astype(np.int64)
    expected = np.maximum(np.sign(q) * np.sign(y) * (np.abs(q) // np.abs(y)), x)
    assert_close(run_op(lambda a, b: ef.maximum((a * 3 - b) / b, a), x, y), expected, np.int32)


def test_several_outputs_and_an_intermediate_output(compile_graph, graph):
    x = ef.placeholder("float32", (3,), name="x")
    doubled = x * 2.0
    outs = {"doubled": doubled, "sum": ef.reduce_sum(doubled), "neg": -doubled}
    v = np.array([1.0, -2.0, 3.5], np.float32)
    out = compile_graph(graph, {"x": x}, outs)(x=v)
    assert_close(out["doubled"], [2.0, -4.0, 7.0], np.float32)
    assert_close(out["sum"], 5.0, np.float32)
    assert_close(out["neg"], [-2.0, 4.0, -7.0], np.float32)


def test_file_and_bytes_give_the_same_results(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 3), name="x")
    y = ef.nn.log_softmax(ef.tanh(x) * 3.0)
    v = random_array(rng, (4, 3), "float32")
    from_file = compile_graph(graph, {"x": x}, {"y": y})(x=v)["y"]
    from_bytes = compile_in_memory(graph, {"x": x}, {"y": y})(x=v)["y"]
    np.testing.assert_array_equal(from_file, from_bytes)
    t = np.tanh(v.astype(np.float64)) * 3.0
    assert_close(from_file, t - np.log(np.exp(t).sum(axis=1, keepdims=True)), np.float32)


def test_inputs_from_two_graphs_are_a_graph_error():
    g1, g2 = ef.Graph(), ef.Graph()
    with g1.as_default():
        a = ef.placeholder("float32", (2,))
    with g2.as_default():
        b = ef.placeholder("float32", (2,))
    with pytest.raises(GraphError, match="another graph"):
        a + b


def test_ops_join_the_graph_of_their_inputs():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder("float32", (2,))
    y = x * 3.0 + 1.0  # built outside the `with`: still in g
    assert y.graph is g and y.node in g.nodes


# -- conversions of Python values and arrays, as in TensorFlow

@pytest.mark.parametrize("build", [lambda x: x < 0.5, lambda x: x + 1.5, lambda x: x * 1e12])
def test_lossy_python_scalar_is_rejected(graph, build):
    x = ef.placeholder("int32", (2,))
    with pytest.raises(GraphError, match="does not convert to int32 exactly"):
        build(x)


def test_exact_python_scalar_takes_the_tensor_dtype(run_op):
    x = np.array([1, 2], np.int8)
    assert_close(run_op(lambda t: t * 2.0 + 1, x), [3, 5], np.int8)


def test_float64_ndarray_operand_keeps_float64(run_op):
    x = np.array([1.0, 2.0], np.float64)
    assert_close(run_op(lambda t: t + np.array([0.5, 0.25]), x), [1.5, 2.25], np.float64)


def test_reducing_over_no_axis_is_the_identity(graph):
    x = ef.placeholder(ef.float32, (2, 3))
    assert ef.reduce_sum(x, axis=[]) is x and ef.reduce_max(x, axis=()) is x


def test_tf_slice_rejects_negative_begin(graph):
    x = ef.placeholder(ef.float32, (4,))
    with pytest.raises(GraphError, match="begin must be >= 0"):
        ef.slice(x, [-1], [1])
