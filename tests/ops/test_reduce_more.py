"""reduce_l2, reduce_log_sum_exp, reduce_prod and reduce_min: against onnxruntime and element-by-element loops."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close, random_array, run_op as run_in_memory
from .onnx_reference import onnx_reference
from .test_reduce import reduce_by_loops

SHAPE = (2, 3, 4)
AXES = [(), (0,), (1,), (2,), (-1,), (-3,), (0, 2), (-1, 0), (0, 1, 2)]
ALL_NUMERIC = FLOATS + ("int8", "int16", "int32", "int64", "uint8")

# name -> (ONNX op, combine over a list of Python numbers, dtypes, dtypes onnxruntime runs)
REDUCTIONS = {
    "reduce_l2": ("ReduceL2", lambda vs: math.sqrt(sum(v * v for v in vs)), FLOATS, FLOATS),
    "reduce_prod": ("ReduceProd", math.prod, ALL_NUMERIC, FLOATS + ("int32", "int64")),
    "reduce_min": ("ReduceMin", min, ALL_NUMERIC, FLOATS + ("int8", "int32", "int64", "uint8")),
    "reduce_log_sum_exp": ("ReduceLogSumExp", lambda vs: math.log(math.fsum(math.exp(v) for v in vs)), FLOATS,
                           FLOATS),
}


def reduction(name, axes=(), keepdims=False):
    return lambda t: apply(name, [t], {"axes": axes, "keepdims": keepdims})


def operand(rng, name, dtype, shape=SHAPE):
    # Products of 24 factors in [-2, 2] stay inside int32 and float16.
    low, high = (-2, 3) if name == "reduce_prod" else (-9, 10)
    return random_array(rng, shape, dtype, low, high)


def by_loops(name, x, axes, keepdims):
    combine = REDUCTIONS[name][1]
    return reduce_by_loops(x, list(axes) or None, keepdims, lambda vs: combine([v.item() for v in vs]))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_axes_match_onnxruntime(run_op, rng, name, axes, keepdims):
    x = operand(rng, name, "float32")
    attrs = {"axes": list(axes)} if axes else {}
    expected, = onnx_reference(REDUCTIONS[name][0], [x], ["float32"], keepdims=int(keepdims), **attrs)
    assert_close(run_op(reduction(name, axes, keepdims), x), expected, np.float32)


@pytest.mark.parametrize("name,dtype", [(n, d) for n, r in REDUCTIONS.items() for d in r[3]])
def test_dtypes_match_onnxruntime(run_op, rng, name, dtype):
    x = operand(rng, name, dtype)
    for axes in [(), (1,), (0, 2)]:
        attrs = {"axes": list(axes)} if axes else {}
        expected, = onnx_reference(REDUCTIONS[name][0], [x], [dtype], keepdims=0, **attrs)
        assert_close(run_op(reduction(name, axes), x), expected, dtype)


@pytest.mark.parametrize("name,dtype", [(n, d) for n, r in REDUCTIONS.items() for d in r[2]])
def test_dtypes_match_loops(run_op, rng, name, dtype):
    x = operand(rng, name, dtype)
    for axes in [(), (1,), (-1, 0)]:
        assert_close(run_op(reduction(name, axes), x), by_loops(name, x, axes, False), dtype)


@given(data=st.data(), name=st.sampled_from(sorted(REDUCTIONS)), keepdims=st.booleans())
def test_random_shapes_and_axes(data, name, keepdims):
    shape = data.draw(array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), label="shape")
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                              unique_by=lambda a: a % len(shape)), label="axes")
    x = operand(np.random.default_rng(len(shape)), name, "float64", shape)
    out = run_in_memory(reduction(name, tuple(axes), keepdims), x)
    assert_close(out, by_loops(name, x, axes, keepdims), np.float64)


def test_float16_l2_where_float16_squares_overflow(run_op):
    x = np.full((2, 8), 300, np.float16)  # 300 ** 2 = 90000 > 65504, the norm is 848.5
    assert_close(run_op(reduction("reduce_l2", (1,)), x), [math.sqrt(8) * 300] * 2, np.float16)


def test_integer_product_wraps_as_the_dtype_does(run_op):
    x = np.array([[100, 100, 7]], np.int32)
    assert_close(run_op(reduction("reduce_prod"), x), np.int64(70000).astype(np.int32), np.int32)
    y = np.array([16, 16, 3], np.int8)  # 768 wraps to 0 in int8
    assert_close(run_op(reduction("reduce_prod"), y), 0, np.int8)


def test_min_and_l2_special_values(run_op):
    x = np.array([[3.0, -np.inf, 1.0], [np.nan, 0.0, -1.0]], np.float32)
    out = run_op(reduction("reduce_min", (1,)), x)
    assert out[0] == -np.inf and np.isnan(out[1])
    y = np.array([[3, 4], [0, 0]], np.float32)
    assert_close(run_op(reduction("reduce_l2", (1,)), y), [5, 0], np.float32)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_static_shape_with_unknown_batch(compile_graph, graph, rng, name):
    x = ef.placeholder("float32", (None, 3, 4), name="x")
    rows, kept = apply(name, [x], {"axes": (1, 2)}), apply(name, [x], {"axes": (0,), "keepdims": True})
    assert rows.shape == (None,) and kept.shape == (1, 3, 4)
    run = compile_graph(graph, {"x": x}, {"rows": rows, "kept": kept})
    for batch in (1, 5):
        v = operand(rng, name, "float32", (batch, 3, 4))
        out = run(x=v)
        assert_close(out["rows"], by_loops(name, v, (1, 2), False), np.float32)
        assert_close(out["kept"], by_loops(name, v, (0,), True), np.float32)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_invalid_inputs(graph, name):
    x = ef.placeholder("float32", SHAPE)
    for axes in [(3,), (-4,), (0, 0), (1, -2)]:
        with pytest.raises(GraphError):
            apply(name, [x], {"axes": axes})
    with pytest.raises(GraphError, match="not supported"):
        apply(name, [ef.placeholder("bool", SHAPE)])
    with pytest.raises(GraphError, match="must be BOOL"):
        apply(name, [x], {"keepdims": "yes"})


@pytest.mark.parametrize("name", ["reduce_l2", "reduce_log_sum_exp"])
def test_float_only_reductions_reject_integers(graph, name):
    with pytest.raises(GraphError, match="dtype int32 not supported"):
        apply(name, [ef.placeholder("int32", SHAPE)])


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_sum_exp_does_not_overflow(run_op, dtype):
    """Past exp's range (float64 to 709, float16 to 11) and at -inf, inf and NaN; -inf over
    an empty set."""
    top = {"float16": 60000.0, "float32": 1e30, "float64": 1e300}[dtype]
    x = np.array([[top, top, -np.inf], [-np.inf, -np.inf, -np.inf], [1000, 1000 + np.log(3), -1000],
                  [np.inf, 1, 2], [np.nan, 1, 2]], dtype)
    with np.errstate(over="ignore"):
        a, b = float(x[2, 0]), float(x[2, 1])  # as rounded to dtype
        expected = [float(x[0, 0]) + math.log(2), -math.inf, b + math.log1p(math.exp(a - b)), math.inf, math.nan]
    assert_close(run_op(reduction("reduce_log_sum_exp", (1,)), x), expected, dtype)
    empty = run_op(reduction("reduce_log_sum_exp", (1,), True), np.zeros((2, 0, 3), dtype))
    assert_close(empty, np.full((2, 1, 3), -np.inf), dtype)
    assert_close(run_op(reduction("reduce_log_sum_exp"), np.array(-np.inf, dtype)), -np.inf, dtype)
