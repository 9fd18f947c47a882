"""cumsum and cumprod (exclusive, reverse) and topk (ties, largest, axis): against onnxruntime and loops."""
import itertools
import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close, random_array, run_op as run_in_memory
from .onnx_reference import onnx_reference

SHAPE = (2, 3, 4)
ALL_NUMERIC = FLOATS + ("int8", "int16", "int32", "int64", "uint8")
FLAGS = list(itertools.product((False, True), repeat=2))  # (exclusive, reverse)


def along(x, axis, line_fn, out_len=None, out_dtype=None):
    """Apply `line_fn` (a list of Python numbers -> a list) to every line of `x` along `axis`."""
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1] if out_len is None else out_len
    out = np.empty(moved.shape[:-1] + (n,), out_dtype or (np.float64 if x.dtype.kind == "f" else np.int64))
    for index in np.ndindex(*moved.shape[:-1]):
        out[index] = line_fn(moved[index].tolist())
    return np.moveaxis(out, -1, axis)


# -- cumsum ------------------------------------------------------------------------------

def running(values, exclusive, reverse, step, start):
    """The running totals of `values` (step(total, v) from `start`), written out by hand."""
    if reverse:
        return running(values[::-1], exclusive, False, step, start)[::-1]
    out, total = [], start
    for v in values:
        if exclusive:
            out.append(total)
        total = step(total, v)
        if not exclusive:
            out.append(total)
    return out


def running_sums(values, exclusive, reverse):
    return running(values, exclusive, reverse, operator.add, 0)


def running_op(name):
    def make(axis, exclusive=False, reverse=False):
        return lambda t: apply(name, [t], {"axis": axis, "exclusive": exclusive, "reverse": reverse})
    return make


cumsum, cumprod = running_op("cumsum"), running_op("cumprod")


@pytest.mark.parametrize("exclusive,reverse", FLAGS)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_cumsum_matches_onnxruntime(run_op, rng, axis, exclusive, reverse):
    x = random_array(rng, SHAPE, "float32")
    expected, = onnx_reference("CumSum", [x, np.array(axis, np.int64)], ["float32"],
                               exclusive=int(exclusive), reverse=int(reverse))
    assert_close(run_op(cumsum(axis, exclusive, reverse), x), expected, np.float32)


@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
def test_cumsum_dtypes_match_onnxruntime(run_op, rng, dtype):
    x = random_array(rng, SHAPE, dtype, -9, 10)
    for exclusive, reverse in FLAGS:
        expected, = onnx_reference("CumSum", [x, np.array(1, np.int64)], [dtype],
                                   exclusive=int(exclusive), reverse=int(reverse))
        assert_close(run_op(cumsum(1, exclusive, reverse), x), expected, dtype)


@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_cumsum_dtypes_match_loops(run_op, rng, dtype):
    x = random_array(rng, SHAPE, dtype, 0, 60)  # sums past 127 wrap in int8, as the dtype does
    for (exclusive, reverse), axis in itertools.product(FLAGS, (0, -1)):
        expected = along(x, axis, lambda line: running_sums(line, exclusive, reverse))
        assert_close(run_op(cumsum(axis, exclusive, reverse), x), expected, dtype)


def test_cumsum_float16_rounds_once_per_sum(run_op):
    x = np.full(2000, 0.1, np.float16)  # summed in float16, the total drifts to 230, not 200
    out = run_op(cumsum(0), x)
    assert_close(out, np.cumsum(x.astype(np.float64)), np.float16)


@pytest.mark.parametrize("exclusive,reverse", FLAGS)
def test_cumsum_short_and_empty_axes(run_op, exclusive, reverse):
    one = np.array([[5.0], [7.0]], np.float32)
    assert_close(run_op(cumsum(1, exclusive, reverse), one), [[0], [0]] if exclusive else one, np.float32)
    empty = np.zeros((3, 0), np.float32)
    assert run_op(cumsum(1, exclusive, reverse), empty).shape == (3, 0)


def test_cumsum_unknown_dims(compile_graph, graph, rng):
    x = ef.placeholder("int32", (None, None), name="x")
    y = cumsum(-1, exclusive=True, reverse=True)(x)
    assert y.shape == (None, None) and y.dtype == np.int32
    run = compile_graph(graph, {"x": x}, {"y": y})
    for shape in [(1, 4), (3, 2)]:
        v = random_array(rng, shape, "int32", -9, 10)
        assert_close(run(x=v)["y"], along(v, 1, lambda line: running_sums(line, True, True)), np.int32)


def test_cumsum_invalid(graph):
    with pytest.raises(GraphError, match="out of range"):
        cumsum(3)(ef.placeholder("float32", SHAPE))
    with pytest.raises(GraphError, match="out of range"):
        cumsum(-4)(ef.placeholder("float32", SHAPE))
    with pytest.raises(GraphError, match="rank"):
        cumsum(0)(ef.placeholder("float32", ()))
    with pytest.raises(GraphError, match="not supported"):
        cumsum(0)(ef.placeholder("bool", (3,)))


# -- cumprod -----------------------------------------------------------------------------

def running_products(values, exclusive, reverse):
    return running(values, exclusive, reverse, operator.mul, 1)


@pytest.mark.parametrize("exclusive,reverse", FLAGS)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_cumprod_matches_onnxruntime(run_op, rng, axis, exclusive, reverse):
    x = random_array(rng, SHAPE, "float32", -2, 2)
    expected, = onnx_reference("CumProd", [x, np.array(axis, np.int64)], ["float32"], opset=26,
                               exclusive=int(exclusive), reverse=int(reverse))
    assert_close(run_op(cumprod(axis, exclusive, reverse), x), expected, np.float32)


@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_cumprod_dtypes_match_loops(run_op, rng, dtype):
    x = random_array(rng, SHAPE, dtype, -3, 4)  # int8 products wrap, as the dtype does
    for (exclusive, reverse), axis in itertools.product(FLAGS, (0, -1)):
        expected = along(x, axis, lambda line: running_products(line, exclusive, reverse))
        if np.dtype(dtype).kind in "iu":
            expected = expected.astype(np.int64).astype(dtype)  # wrapped once at the end, as Python ints do
        assert_close(run_op(cumprod(axis, exclusive, reverse), x), expected, dtype)


def test_cumprod_float16_rounds_once_per_product(run_op):
    x = np.full(300, 1.01, np.float16)  # 1.00977 each; multiplied in float16 the error grows
    assert_close(run_op(cumprod(0), x), np.cumprod(x.astype(np.float64)), np.float16)


@pytest.mark.parametrize("exclusive,reverse", FLAGS)
def test_cumprod_short_and_empty_axes(run_op, exclusive, reverse):
    one = np.array([[5.0], [7.0]], np.float32)
    assert_close(run_op(cumprod(1, exclusive, reverse), one), [[1], [1]] if exclusive else one, np.float32)
    assert run_op(cumprod(1, exclusive, reverse), np.zeros((3, 0), np.float32)).shape == (3, 0)


# -- topk --------------------------------------------------------------------------------

def top(values, k, largest):
    """Indices of the k best of `values`: largest (or smallest) first, lower index first on ties."""
    key = (lambda i: (-values[i], i)) if largest else (lambda i: (values[i], i))
    return sorted(range(len(values)), key=key)[:k]


def topk_by_loops(x, k, axis, largest):
    indices = along(x, axis, lambda line: top(line, k, largest), k, np.int64)
    return np.take_along_axis(x, indices, axis), indices


def topk(k, axis=-1, largest=True, sorted=True):
    return lambda t: apply("topk", [t], {"k": k, "axis": axis, "largest": largest, "sorted": sorted})


def tied(rng, shape, dtype):
    """Values from a small range: most of them tie with others."""
    return random_array(rng, shape, dtype, 0, 4).astype(dtype) if np.dtype(dtype).kind != "f" else \
        np.round(random_array(rng, shape, dtype, -2, 2)).astype(dtype)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis,k", [(-1, 1), (-1, 3), (-1, 6), (0, 2), (1, 3), (1, 4), (-3, 1)])
def test_topk_matches_onnxruntime(run_op, rng, axis, k, largest):
    x = tied(rng, (3, 4, 6), "float32")
    expected = onnx_reference("TopK", [x, np.array([k], np.int64)], ["float32", "int64"],
                              axis=axis, largest=int(largest), sorted=1)
    values, indices = run_op(topk(k, axis, largest), x)
    assert_close(values, expected[0], np.float32)
    assert_close(indices, expected[1], np.int64)


@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_topk_dtypes_match_onnxruntime_and_loops(run_op, rng, dtype):
    x = tied(rng, (4, 7), dtype)
    for largest, axis in itertools.product((True, False), (0, 1)):
        expected = onnx_reference("TopK", [x, np.array([3], np.int64)], [dtype, "int64"],
                                  axis=axis, largest=int(largest))
        values, indices = run_op(topk(3, axis, largest), x)
        assert_close(values, expected[0], dtype)
        assert_close(indices, expected[1], np.int64)
        loops = topk_by_loops(x, 3, axis, largest)
        assert_close(values, loops[0], dtype)
        assert_close(indices, loops[1], np.int64)


@given(data=st.data(), largest=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_topk_random_shapes_with_ties(data, largest, seed):
    shape = data.draw(array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=7), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = data.draw(st.integers(0, shape[axis]), label="k")
    x = tied(np.random.default_rng(seed), shape, "int32")
    values, indices = run_in_memory(topk(k, axis, largest), x)
    expected = topk_by_loops(x, k, axis, largest)
    assert_close(values, expected[0], np.int32)
    assert_close(indices, expected[1], np.int64)


def test_topk_ties_at_the_boundary_go_to_the_lower_index(run_op):
    x = np.array([[1, 5, 3, 5, 3, 3, 0]], np.float32)
    values, indices = run_op(topk(3), x)
    assert_close(values, [[5, 5, 3]], np.float32)
    assert_close(indices, [[1, 3, 2]], np.int64)
    values, indices = run_op(topk(4, largest=False), x)
    assert_close(values, [[0, 1, 3, 3]], np.float32)
    assert_close(indices, [[6, 0, 2, 4]], np.int64)


def test_topk_unsorted_still_comes_best_first(run_op, rng):
    x = random_array(rng, (5, 9), "float64")
    values, indices = run_op(topk(4, sorted=False), x)
    expected = topk_by_loops(x, 4, 1, True)
    assert_close(values, expected[0], np.float64)
    assert_close(indices, expected[1], np.int64)


def test_topk_nan_ranks_above_every_number(run_op):
    x = np.array([[2, np.nan, -np.inf, np.inf, np.nan, 1]], np.float32)
    values, indices = run_op(topk(3), x)
    assert np.isnan(values[0, :2]).all() and values[0, 2] == np.inf
    assert_close(indices, [[1, 4, 3]], np.int64)
    values, indices = run_op(topk(5, largest=False), x)
    assert_close(values[:, :4], [[-np.inf, 1, 2, np.inf]], np.float32)
    assert np.isnan(values[0, 4])
    assert_close(indices, [[2, 5, 0, 3, 1]], np.int64)


def test_topk_k_zero_and_full(run_op, rng):
    x = random_array(rng, (3, 5), "float32")
    values, indices = run_op(topk(0), x)
    assert values.shape == indices.shape == (3, 0)
    values, indices = run_op(topk(5, largest=False), x)
    assert_close(values, np.sort(x, axis=1), np.float32)


def test_topk_unknown_dims(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, None), name="x")
    values, indices = topk(2, axis=1)(x)
    assert values.shape == indices.shape == (None, 2)
    assert values.dtype == np.float32 and indices.dtype == np.int64
    run = compile_graph(graph, {"x": x}, {"v": values, "i": indices})
    for shape in [(1, 2), (4, 9)]:
        v = tied(rng, shape, "float32")
        out, expected = run(x=v), topk_by_loops(v, 2, 1, True)
        assert_close(out["v"], expected[0], np.float32)
        assert_close(out["i"], expected[1], np.int64)
    with pytest.raises(InvalidInputError, match="k must be"):
        run(x=np.zeros((2, 1), np.float32))  # k = 2 > 1 element along the axis


def test_topk_invalid(graph):
    x = ef.placeholder("float32", (3, 4))
    with pytest.raises(GraphError, match="k must be"):
        topk(5)(x)
    with pytest.raises(GraphError, match="k must be"):
        topk(-1)(x)
    with pytest.raises(GraphError, match="out of range"):
        topk(1, axis=2)(x)
    with pytest.raises(GraphError, match="rank"):
        topk(0)(ef.placeholder("float32", ()))
    with pytest.raises(GraphError, match="required"):
        apply("topk", [x])
    with pytest.raises(GraphError, match="not supported"):
        topk(1)(ef.placeholder("bool", (3,)))
