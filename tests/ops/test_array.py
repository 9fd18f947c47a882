"""reshape, transpose, concat, squeeze, expand_dims, slice / indexing and gather against numpy."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError

from .harness import FLOATS, INTS, assert_close, random_array, run_op as run_in_memory

ALL_DTYPES = FLOATS + INTS + ("bool",)


@pytest.fixture
def x234(rng):
    """A (2, 3, 4) float32 array whose elements are all different."""
    return rng.permutation(24).reshape(2, 3, 4).astype(np.float32)


# -- reshape -----------------------------------------------------------------------------

@pytest.mark.parametrize("target,expected_shape", [
    ((4, 6), (4, 6)), ((-1,), (24,)), ((2, -1, 2), (2, 6, 2)), ((24, 1), (24, 1)), ((1, 2, 1, 12), (1, 2, 1, 12)),
    ((-1, 4), (6, 4))])
def test_reshape(run_op, x234, target, expected_shape):
    out = run_op(lambda t: ef.reshape(t, target), x234)
    # Row-major order: the flat sequence of elements is unchanged.
    assert_close(out, np.array(x234.ravel().tolist(), np.float32).reshape(expected_shape), np.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reshape_dtypes(run_op, rng, dtype):
    x = random_array(rng, (3, 4), dtype)
    assert_close(run_op(lambda t: ef.reshape(t, (2, 6)), x), x.reshape(2, 6), dtype)


def test_reshape_of_computed_value_and_into_computation(run_op, x234):
    # A reshape's output is a view of its input: check it both as an op's output and input.
    out = run_op(lambda t: ef.reshape(t * 2.0, (6, 4)) + 1.0, x234)
    assert_close(out, (x234 * 2 + 1).reshape(6, 4), np.float32)


def test_reshape_dynamic_batch(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 6), name="x")
    y = ef.reshape(x, (-1, 2, 3))
    assert y.shape == (None, 2, 3)
    run = compile_graph(graph, {"x": x}, {"y": y})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 6), "float32")
        assert_close(run(x=v)["y"], v.reshape(batch, 2, 3), np.float32)


@pytest.mark.parametrize("target", [(5, 5), (-1, -1), (2, -2, 6), (-1, 5), (0, -1)])
def test_reshape_errors(graph, target):
    x = ef.placeholder("float32", (2, 3, 4))
    with pytest.raises(GraphError):
        ef.reshape(x, target)


# -- transpose ---------------------------------------------------------------------------

@pytest.mark.parametrize("perm", [None, (0, 1, 2), (2, 0, 1), (1, 0, 2), (0, 2, 1), (2, 1, 0)])
def test_transpose(run_op, x234, perm):
    out = run_op(lambda t: ef.transpose(t, perm), x234)
    order = perm or (2, 1, 0)
    expected = np.empty(tuple(x234.shape[p] for p in order), np.float32)
    for index in np.ndindex(*expected.shape):
        source = [0, 0, 0]
        for out_axis, in_axis in enumerate(order):
            source[in_axis] = index[out_axis]
        expected[index] = x234[tuple(source)]
    assert_close(out, expected, np.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_transpose_dtypes_and_dynamic_dims(run_op, rng, dtype):
    x = random_array(rng, (3, 2), dtype)
    out = run_op(lambda t: ef.transpose(t, (1, 0)), x, shapes=[(None, 2)])
    assert_close(out, x.T, dtype)


@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=6), data=st.data(),
       dtype=st.sampled_from(["float32", "int8", "float64"]))
def test_transpose_random(shape, data, dtype):
    """Random permutations of 2-6 axes, many short (a depth-to-space's 2s, an NCHW -> NHWC
    of 1-3 channels: the kernel copies those in pieces), against numpy's transpose."""
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    out = run_in_memory(lambda t: ef.transpose(t, perm), x)
    np.testing.assert_array_equal(out, np.transpose(x, perm))


def test_transpose_depth_to_space():
    """pose_detection's depth-to-space (1, 2, 2, C, H, W) by (0, 3, 4, 1, 5, 2)."""
    x = np.random.default_rng(1).standard_normal((1, 2, 2, 24, 28, 28)).astype(np.float32)
    out = run_in_memory(lambda t: ef.transpose(t, (0, 3, 4, 1, 5, 2)), x)
    np.testing.assert_array_equal(out, x.transpose(0, 3, 4, 1, 5, 2))


@pytest.mark.parametrize("perm", [(0, 0, 1), (0, 1), (0, 1, 2, 3), (0, 1, 3), (-1, 0, 1)])
def test_transpose_bad_perm(graph, perm):
    with pytest.raises(GraphError):
        ef.transpose(ef.placeholder("float32", (2, 3, 4)), perm)


# -- concat ------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(run_op, rng, axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    parts = [random_array(rng, s, "float32") for s in shapes]
    out = run_op(lambda *ts: ef.concat(list(ts), axis), *parts)
    assert_close(out, np.concatenate(parts, axis=axis), np.float32)
    # Each part lies in its slot along `axis`.
    bounds = np.cumsum([0] + [p.shape[axis] for p in parts])
    for p, lo, hi in zip(parts, bounds, bounds[1:]):
        assert_close(np.take(out, np.arange(lo, hi), axis=axis), p, np.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_concat_dtypes_and_constants(run_op, rng, dtype):
    x = random_array(rng, (2, 2), dtype)
    c = random_array(rng, (1, 2), dtype)
    out = run_op(lambda t: ef.concat([t, ef.constant(c, dtype), t], 0), x)
    assert_close(out, np.array([*x.tolist(), *c.tolist(), *x.tolist()]), dtype)


def test_concat_dynamic_dims(compile_graph, graph, rng):
    a = ef.placeholder("float32", (None, 2), name="a")
    b = ef.placeholder("float32", (None, 3), name="b")
    y, z = ef.concat([a, b], 1), ef.concat([a, a], 0)
    assert y.shape == (None, 5) and z.shape == (None, 2)
    run = compile_graph(graph, {"a": a, "b": b}, {"y": y, "z": z})
    for batch in (1, 3, 7):
        av, bv = random_array(rng, (batch, 2), "float32"), random_array(rng, (batch, 3), "float32")
        out = run(a=av, b=bv)
        assert_close(out["y"], np.hstack([av, bv]), np.float32)
        assert_close(out["z"], np.vstack([av, av]), np.float32)


def test_concat_errors(graph):
    a = ef.placeholder("float32", (2, 3))
    with pytest.raises(GraphError):
        ef.concat([a, ef.placeholder("float32", (2, 4))], 0)  # dim 1 differs
    with pytest.raises(GraphError):
        ef.concat([a, ef.placeholder("int32", (2, 3))], 0)
    with pytest.raises(GraphError):
        ef.concat([a, ef.placeholder("float32", (2, 3, 1))], 0)
    with pytest.raises(GraphError):
        ef.concat([a, a], 2)
    with pytest.raises(GraphError):
        ef.concat([a, a], -3)


# -- squeeze and expand_dims ----------------------------------------------------------------

@pytest.mark.parametrize("axis,expected_shape", [
    (None, (3, 4)), (0, (3, 1, 4)), (2, (1, 3, 4)), (-2, (1, 3, 4)), ([0, 2], (3, 4)), ((-4, -2), (3, 4))])
def test_squeeze(run_op, rng, axis, expected_shape):
    x = random_array(rng, (1, 3, 1, 4), "float32")
    out = run_op(lambda t: ef.squeeze(t, axis), x)
    assert_close(out, x.reshape(expected_shape), np.float32)


def test_squeeze_dynamic_dim(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 1), name="x")
    y = ef.squeeze(x, 1)
    assert y.shape == (None,)
    run = compile_graph(graph, {"x": x}, {"y": y})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 1), "float32")
        assert_close(run(x=v)["y"], v[:, 0], np.float32)


def test_squeeze_errors(graph):
    x = ef.placeholder("float32", (1, 3, 1))
    with pytest.raises(GraphError):
        ef.squeeze(x, 1)  # not size 1
    with pytest.raises(GraphError):
        ef.squeeze(x, 3)
    with pytest.raises(GraphError):
        ef.squeeze(x, [0, -3])  # the same axis twice


@pytest.mark.parametrize("axis,expected_shape", [(0, (1, 2, 3)), (1, (2, 1, 3)), (2, (2, 3, 1)),
                                                 (-1, (2, 3, 1)), (-3, (1, 2, 3))])
def test_expand_dims(run_op, rng, axis, expected_shape):
    x = random_array(rng, (2, 3), "int32")
    assert_close(run_op(lambda t: ef.expand_dims(t, axis), x), x.reshape(expected_shape), np.int32)


def test_expand_dims_errors(graph):
    x = ef.placeholder("float32", (2, 3))
    for axis in (3, -4):
        with pytest.raises(GraphError):
            ef.expand_dims(x, axis)


# -- slice and indexing --------------------------------------------------------------------

BIG = 2**62
# (starts, ends, axes, steps) on a (5, 6, 7) array, and the same selection as a numpy index.
STRIDED = [
    ((1,), (3,), (0,), (1,), np.s_[1:3]),
    ((-3,), (-1,), (1,), (1,), np.s_[:, -3:-1]),
    ((0, 1), (5, 7), (1, 2), (2, 3), np.s_[:, 0:5:2, 1:7:3]),
    ((4,), (-BIG,), (0,), (-1,), np.s_[::-1]),
    ((-1,), (0,), (2,), (-2,), np.s_[:, :, -1:0:-2]),
    ((5,), (1,), (1,), (-2,), np.s_[:, 5:1:-2]),
    ((2,), (100,), (0,), (1,), np.s_[2:100]),  # end clamps to the length
    ((-100,), (2,), (0,), (1,), np.s_[-100:2]),  # start clamps to 0
    ((10,), (20,), (1,), (1,), np.s_[:, 10:20]),  # empty: start past the end
    ((3,), (1,), (0,), (1,), np.s_[3:1]),  # empty: start after end
    ((100,), (-100,), (2,), (-3,), np.s_[:, :, 100:-100:-3]),  # both clamp, backwards
    ((1, -2, 0), (4, -6, 7), (0, 1, 2), (2, -1, 3), np.s_[1:4:2, -2:-6:-1, 0:7:3]),
    ((1,), (3,), (-1,), (1,), np.s_[..., 1:3]),  # negative axis
]


@pytest.mark.parametrize("starts,ends,axes,steps,index", STRIDED, ids=[str(c[4]) for c in STRIDED])
def test_strided_slice(run_op, rng, starts, ends, axes, steps, index):
    x = random_array(rng, (5, 6, 7), "float32")
    out = run_op(lambda t: ef.strided_slice(t, starts, ends, axes, steps), x)
    assert_close(out, x[index], np.float32)


def test_strided_slice_default_axes_and_steps(run_op, rng):
    x = random_array(rng, (5, 6), "int64")
    assert_close(run_op(lambda t: ef.strided_slice(t, (1, -4), (4, -1)), x), x[1:4, -4:-1], np.int64)


@pytest.mark.parametrize("begin,size,index", [
    ((1, 0), (2, 3), np.s_[1:3, 0:3]), ((0, 2), (-1, -1), np.s_[0:, 2:]), ((4, 5), (1, 1), np.s_[4:5, 5:6]),
    ((2, 1), (0, 2), np.s_[2:2, 1:3])])
def test_tf_slice(run_op, rng, begin, size, index):
    x = random_array(rng, (5, 6), "float32")
    assert_close(run_op(lambda t: ef.slice(t, begin, size), x), x[index], np.float32)


INDEXING = [np.s_[1:3, ::2, 0], np.s_[..., -1], np.s_[::-1], np.s_[-2:], np.s_[5:], np.s_[:, ::-2],
            np.s_[1], np.s_[-1], np.s_[-5, -6, -7], np.s_[4, 5, 6], np.s_[:, 1:-1, ::3], np.s_[..., ::-1, 2],
            np.s_[1, ...], np.s_[::2, ::-3, 1:6:2], np.s_[-100:100, 100:, :-100]]


@pytest.mark.parametrize("index", INDEXING, ids=str)
def test_indexing(run_op, rng, index):
    x = random_array(rng, (5, 6, 7), "float32")
    out = run_op(lambda t: t[index], x)
    assert_close(out, x[index], np.float32)


@given(data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_random_slices(data, shape, seed):
    index = tuple(data.draw(st.one_of(st.slices(n), st.integers(-n, n - 1)), label=f"axis {i}")
                  for i, n in enumerate(shape))
    x = random_array(np.random.default_rng(seed), shape, "float32")
    assert_close(run_in_memory(lambda t: t[index], x), x[index], np.float32)


def test_slicing_dynamic_dims(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 5), name="x")
    y = x[1:, ::-2]
    z = x[-1]
    assert y.shape == (None, 3) and z.shape == (5,)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 5), "float32")
        out = run(x=v)
        assert_close(out["y"], v[1:, ::-2], np.float32)
        assert_close(out["z"], v[-1], np.float32)


def test_index_past_a_dynamic_dim_is_invalid_input(compile_graph, graph):
    x = ef.placeholder("float32", (None,), name="x")
    run = compile_graph(graph, {"x": x}, {"y": x[2]})
    assert_close(run(x=np.arange(3, dtype=np.float32))["y"], 2.0, np.float32)
    with pytest.raises(InvalidInputError):
        run(x=np.arange(2, dtype=np.float32))


def test_slice_errors(graph):
    x = ef.placeholder("float32", (5, 6))
    with pytest.raises(GraphError):
        ef.strided_slice(x, (0,), (2,), (0,), (0,))  # zero step
    with pytest.raises(GraphError):
        ef.strided_slice(x, (0,), (2,), (2,))  # no axis 2
    with pytest.raises(GraphError):
        ef.strided_slice(x, (0, 0), (2, 2), (1, -1))  # the same axis twice
    with pytest.raises(GraphError):
        ef.strided_slice(x, (0, 1), (2,))  # lengths differ
    with pytest.raises(IndexError):
        x[1, 2, 3]
    for bad in (5, -6):
        with pytest.raises(IndexError):
            x[bad]
        with pytest.raises(IndexError):
            x[:, bad + 1 if bad > 0 else bad - 1]
    with pytest.raises(TypeError):
        x[ef.constant([0, 1])]


# -- gather -------------------------------------------------------------------------------

@pytest.mark.parametrize("params_shape,indices,axis", [
    ((5,), [0, 4, 2, 2], 0),
    ((5, 3), [[0, -1], [-5, 2]], 0),  # negative indices count from the end
    ((5, 3), [2, -3, 0], 1),
    ((2, 5, 3), [[1], [0]], 1),
    ((2, 5, 3), [-1, 0, -2], -1),
    ((2, 5, 3), [4], -2),
    ((4, 3), 2, 0),  # a scalar index drops the axis
    ((4, 3), [], 0),
])
@pytest.mark.parametrize("index_dtype", INTS)
def test_gather(run_op, rng, params_shape, indices, axis, index_dtype):
    params = random_array(rng, params_shape, "float32")
    idx = np.array(indices, index_dtype)
    out = run_op(lambda p, i: ef.gather(p, i, axis=axis), params, idx)
    ax = axis % params.ndim
    expected = np.empty(params.shape[:ax] + idx.shape + params.shape[ax + 1:], np.float32)
    for out_index in np.ndindex(*expected.shape):
        i = idx[out_index[ax:ax + idx.ndim]]
        expected[out_index] = params[out_index[:ax] + (i,) + out_index[ax + idx.ndim:]]
    assert_close(out, expected, np.float32)
    assert_close(out, np.take(params, idx, axis=axis), np.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gather_constant_indices_and_dtypes(run_op, rng, dtype):
    params = random_array(rng, (4, 3), dtype)
    assert_close(run_op(lambda p: ef.gather(p, [3, -4, 1], axis=0), params), params[[3, 0, 1]], dtype)


def test_gather_dynamic_batch(compile_graph, graph, rng):
    table = random_array(rng, (10, 4), "float32")
    ids = ef.placeholder("int32", (None,), name="ids")
    y = ef.gather(ef.constant(table), ids)
    assert y.shape == (None, 4)
    run = compile_graph(graph, {"ids": ids}, {"y": y})
    for batch in (1, 3, 7):
        v = rng.integers(-10, 10, size=batch).astype(np.int32)
        assert_close(run(ids=v)["y"], np.take(table, v, axis=0), np.float32)


@pytest.mark.parametrize("bad", [[0, 5], [-6], [1, 2, 100]])
def test_gather_out_of_range_is_invalid_input(compile_graph, graph, bad):
    params = ef.placeholder("float32", (5, 2), name="p")
    ids = ef.placeholder("int64", (None,), name="ids")
    run = compile_graph(graph, {"p": params, "ids": ids}, {"y": ef.gather(params, ids)})
    p = np.arange(10, dtype=np.float32).reshape(5, 2)
    assert_close(run(p=p, ids=np.array([4, -5], np.int64))["y"], p[[4, 0]], np.float32)
    with pytest.raises(InvalidInputError):
        run(p=p, ids=np.array(bad, np.int64))
    # The interpreter is still usable after the error.
    assert_close(run(p=p, ids=np.array([-1], np.int64))["y"], p[[4]], np.float32)


def test_gather_errors(graph):
    params = ef.placeholder("float32", (5, 2))
    with pytest.raises(GraphError, match="int"):
        ef.gather(params, ef.placeholder("float32", (3,)))
    with pytest.raises(GraphError):
        ef.gather(params, [0], axis=2)
    with pytest.raises(GraphError):
        ef.gather(params, [0], axis=-3)
    with pytest.raises(GraphError):
        ef.gather(ef.placeholder("float32", ()), [0])
