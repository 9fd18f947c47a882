"""Elementwise arithmetic, comparison, selection and cast ops, against numpy expressions."""
import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, INTS, assert_close, random_array, run_op as run_in_memory
from .onnx_reference import onnx_node

NUMERIC = FLOATS + INTS


def _truncated_quotient(a, b):
    # Integer division rounds toward zero: |a| // |b| with the sign of a * b.
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))


def _divide(a, b):
    return a / b if a.dtype.kind == "f" else _truncated_quotient(a, b)


# name -> (builder, Python operator or None, reference on float64/int64 arrays, dtypes)
BINARY = {
    "add": (ef.add, operator.add, lambda a, b: a + b, NUMERIC),
    "sub": (ef.subtract, operator.sub, lambda a, b: a - b, NUMERIC),
    "mul": (ef.multiply, operator.mul, lambda a, b: a * b, NUMERIC),
    "div": (ef.divide, operator.truediv, _divide, NUMERIC),
    "pow": (ef.pow, operator.pow, lambda a, b: np.exp(b * np.log(a)), FLOATS),
    "maximum": (ef.maximum, None, lambda a, b: np.where(a >= b, a, b), NUMERIC),
    "minimum": (ef.minimum, None, lambda a, b: np.where(a <= b, a, b), NUMERIC),
    "equal": (ef.equal, None, lambda a, b: a == b, NUMERIC + ("bool",)),
    "less": (ef.less, operator.lt, lambda a, b: a < b, NUMERIC + ("bool",)),
    "greater": (ef.greater, operator.gt, lambda a, b: a > b, NUMERIC + ("bool",)),
}
COMPARISONS = ("equal", "less", "greater")


def binary_inputs(rng, name, shape_a, shape_b, dtype):
    """Operands inside the op's domain: positive bases for pow, no zero divisors,
    small integers (in floats too) so comparisons see ties."""
    if name == "pow":
        return (random_array(rng, shape_a, dtype, 0.2, 3.0), random_array(rng, shape_b, dtype, -2.0, 2.0))
    a = random_array(rng, shape_a, dtype, -6, 7)
    b = random_array(rng, shape_b, dtype, -6, 7)
    if name in COMPARISONS and np.dtype(dtype).kind == "f":
        a, b = np.round(a), np.round(b)
    if name == "div":
        b = np.where(b == 0, np.asarray(3, dtype), b).astype(dtype)
    return a, b


def reference(name, a, b):
    wide = (lambda v: v.astype(np.float64)) if a.dtype.kind == "f" else (lambda v: v.astype(np.int64))
    return BINARY[name][2](wide(a), wide(b))


def result_dtype(name, dtype):
    return np.bool_ if name in COMPARISONS else dtype


def check_binary(run, name, a, b, shapes=None, fn=None):
    out = run(fn or BINARY[name][0], a, b, shapes=shapes)
    assert_close(out, reference(name, a, b), result_dtype(name, a.dtype))


# -- broadcasting ----------------------------------------------------------------------

BROADCAST_CASES = [((), (2, 3)), ((2, 3), ()), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)),
                   ((2, 1, 4), (3, 1)), ((1,), (5,))]


@pytest.mark.parametrize("shape_a,shape_b", BROADCAST_CASES, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts(run_op, rng, name, shape_a, shape_b):
    for dtype in ("float32", "int32") if "int32" in BINARY[name][3] else ("float32",):
        a, b = binary_inputs(rng, name, shape_a, shape_b, dtype)
        check_binary(run_op, name, a, b)


@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts_dynamic_dims(run_op, rng, name):
    a, b = binary_inputs(rng, name, (2, 3, 4), (3, 1), "float32")
    out = run_op(BINARY[name][0], a, b, shapes=[(None, 3, None), (None, 1)])
    assert_close(out, reference(name, a, b), result_dtype(name, a.dtype))


@pytest.mark.parametrize("name", BINARY)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4),
       dynamic=st.booleans(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_binary_random_broadcastable_shapes(name, shapes, dynamic, seed, data):
    dtype = data.draw(st.sampled_from(BINARY[name][3]), label="dtype")
    a, b = binary_inputs(np.random.default_rng(seed), name, *shapes.input_shapes, dtype)
    holders = [tuple([None] * len(s)) for s in shapes.input_shapes] if dynamic else None
    graph = ef.Graph()
    with graph.as_default():
        static = BINARY[name][0](ef.placeholder(dtype, holders[0] if dynamic else a.shape),
                                 ef.placeholder(dtype, holders[1] if dynamic else b.shape))
    if not dynamic:
        assert static.shape == shapes.result_shape
    check_binary(run_in_memory, name, a, b, shapes=holders)


# -- dtypes ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,dtype", [(n, d) for n, spec in BINARY.items() for d in spec[3]])
def test_binary_dtypes(run_op, rng, name, dtype):
    a, b = binary_inputs(rng, name, (3, 4), (4,), dtype)
    check_binary(run_op, name, a, b)


@pytest.mark.parametrize("dtype", INTS)
def test_integer_division_truncates_toward_zero(run_op, dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1, 2], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, -3, 4, 4, -4], dtype)
    assert_close(run_op(ef.divide, a, b), [3, -3, -3, 3, 2, -2, 0, 0, 0, 0], dtype)
    assert_close(run_op(lambda x: x / -2, a), [-3, 3, -3, 3, -3, 3, 0, 0, 0, -1], dtype)


def test_float_division_is_true_division(run_op):
    a = np.array([7, -7, 1], np.float32)
    assert_close(run_op(lambda x: x / 2, a), [3.5, -3.5, 0.5], np.float32)


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_of_bools(run_op, name):
    a = np.array([[False], [True]])
    b = np.array([False, True])
    assert_close(run_op(BINARY[name][0], a, b), BINARY[name][2](a, b), np.bool_)


# -- Python scalars and operators ---------------------------------------------------------

OPERATOR_NAMES = [n for n, spec in BINARY.items() if spec[1] is not None]


@pytest.mark.parametrize("name,dtype", [(n, d) for n in OPERATOR_NAMES for d in NUMERIC if d in BINARY[n][3]])
def test_operator_with_python_scalar_takes_tensor_dtype(run_op, rng, name, dtype):
    op = BINARY[name][1]
    scalar = 2.0 if np.dtype(dtype).kind == "f" else 2
    x = binary_inputs(rng, name, (2, 3), (), dtype)[0]
    if name == "div":
        x = np.where(x == 0, np.asarray(1, dtype), x).astype(dtype)
    s = np.asarray(scalar, dtype)
    assert_close(run_op(lambda t: op(t, scalar), x), reference(name, x, s), result_dtype(name, dtype))
    if name != "pow":  # scalar ** tensor is covered below, where the base is positive
        assert_close(run_op(lambda t: op(scalar, t), x), reference(name, s, x), result_dtype(name, dtype))


@pytest.mark.parametrize("dtype,scalar,expected", [
    ("int32", 1.0, [1, 2, 3]), ("int64", 1.0, [1, 2, 3]), ("float16", 1, [1, 2, 3]),
    ("float64", 0.1, [0.1, 1.1, 2.1])])
def test_python_float_scalar_takes_tensor_dtype(run_op, dtype, scalar, expected):
    x = np.arange(3).astype(dtype)
    assert_close(run_op(lambda t: t + scalar, x), expected, dtype)


def test_scalar_base_pow(run_op):
    x = np.array([-2.0, 0.0, 0.5, 3.0], np.float32)
    assert_close(run_op(lambda t: 2.0 ** t, x), 2.0 ** x.astype(np.float64), np.float32)
    assert_close(run_op(lambda t: t ** 2, x), x.astype(np.float64) * x, np.float32)


def test_builder_functions_take_scalars(run_op):
    x = np.array([-1.5, 0.0, 2.5], np.float32)
    assert_close(run_op(lambda t: ef.maximum(t, 0.0), x), [0.0, 0.0, 2.5], np.float32)
    assert_close(run_op(lambda t: ef.minimum(1.0, t), x), [-1.5, 0.0, 1.0], np.float32)
    assert_close(run_op(lambda t: ef.equal(t, 0), x), [False, True, False], np.bool_)


def test_ndarray_operand_on_the_left(run_op):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    c = np.array([10.0, 20.0, 30.0], np.float32)
    assert_close(run_op(lambda t: c - t, x), [9.0, 18.0, 27.0], np.float32)


# -- unary ops ---------------------------------------------------------------------------

# name -> (builder, reference on float64/int64, dtypes, (low, high) of the inputs)
UNARY = {
    "neg": (ef.negative, lambda x: 0 - x, NUMERIC, (-5, 5)),
    "abs": (ef.abs, lambda x: np.where(x < 0, -x, x), NUMERIC, (-5, 5)),
    "exp": (ef.exp, lambda x: np.e ** x, FLOATS, (-5, 5)),
    "log": (ef.log, lambda x: np.log2(x) / np.log2(np.e), FLOATS, (0.01, 10)),
    "sqrt": (ef.sqrt, lambda x: x ** 0.5, FLOATS, (0, 10)),
    "sigmoid": (ef.sigmoid, lambda x: 1 / (1 + np.exp(-x)), FLOATS, (-8, 8)),
    "tanh": (ef.tanh, lambda x: (1 - np.exp(-2 * x)) / (1 + np.exp(-2 * x)), FLOATS, (-5, 5)),
}


@pytest.mark.parametrize("name,dtype", [(n, d) for n, spec in UNARY.items() for d in spec[2]])
def test_unary(run_op, rng, name, dtype):
    fn, ref, _, (low, high) = UNARY[name]
    x = random_array(rng, (3, 5), dtype, low, high)
    wide = x.astype(np.float64 if x.dtype.kind == "f" else np.int64)
    assert_close(run_op(fn, x), ref(wide), dtype)


@pytest.mark.parametrize("fn,name", [(operator.neg, "neg"), (abs, "abs"), (ef.neg, "neg"),
                                     (ef.nn.sigmoid, "sigmoid"), (ef.nn.tanh, "tanh")])
def test_unary_aliases_and_operators(run_op, rng, fn, name):
    x = random_array(rng, (4,), "float32", -3, 3)
    assert_close(run_op(fn, x), UNARY[name][1](x.astype(np.float64)), np.float32)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sigmoid_and_tanh_saturate_without_nan(run_op, dtype):
    x = np.array([-1e4, -100, -30, 0, 30, 100, 1e4], np.float64).astype(dtype)
    assert_close(run_op(ef.sigmoid, x), [0, 0, 0, 0.5, 1, 1, 1], dtype, atol=1e-12 if dtype == "float64" else 1e-6)
    assert_close(run_op(ef.tanh, x), [-1, -1, -1, 0, 1, 1, 1], dtype)


# -- where -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC + ("bool",))
def test_where_broadcasts(run_op, rng, dtype):
    cond = random_array(rng, (3, 1), "bool")
    x = random_array(rng, (1, 4), dtype)
    y = random_array(rng, (2, 3, 4), dtype)
    expected = np.array([[[x[0, j] if cond[i, 0] else y[k, i, j] for j in range(4)] for i in range(3)]
                         for k in range(2)])
    assert_close(run_op(ef.where, cond, x, y), expected, dtype)


def test_where_with_scalar_branches(run_op):
    x = np.array([-2.0, -0.5, 0.0, 1.5], np.float32)
    assert_close(run_op(lambda t: ef.where(t > 0, t, 0.0), x), [0, 0, 0, 1.5], np.float32)
    assert_close(run_op(lambda t: ef.where(t < 0, -1.0, t), x), [-1, -1, 0, 1.5], np.float32)


def test_where_with_only_scalar_branches_takes_their_dtype(run_op):
    cond = np.array([True, False, True])
    assert_close(run_op(lambda c: ef.where(c, 1.0, 0.0), cond), [1.0, 0.0, 1.0], np.float32)
    assert_close(run_op(lambda c: ef.where(c, 2, -2), cond), [2, -2, 2], np.int32)


def test_where_with_a_plain_condition(run_op):
    x = np.array([1.0, 2.0], np.float64)
    assert_close(run_op(lambda t: ef.where([True, False], t, -t), x), [1.0, -2.0], np.float64)


def test_where_from_comparison_selects_branches(run_op):
    a = np.array([[1, 5], [7, 2]], np.int64)
    b = np.array([4, 4], np.int64)
    assert_close(run_op(lambda s, t: ef.where(s > t, s, t), a, b), [[4, 5], [7, 4]], np.int64)


# -- cast --------------------------------------------------------------------------------

CAST_DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
CAST_SOURCES = {
    "float": [-2.75, -1.5, -0.5, 0.0, 0.25, 1.5, 2.75, 100.0],
    "int": [-7, -1, 0, 1, 2, 100],
    "bool": [True, False, True],
}


def cast_reference(x, to):
    to = np.dtype(to)
    if to == np.bool_:
        return x != 0
    if x.dtype == np.bool_:
        return np.where(x, 1, 0)
    if x.dtype.kind == "f" and to.kind == "i":
        return np.trunc(x.astype(np.float64))  # toward zero
    return x.astype(np.float64)


@pytest.mark.parametrize("to", CAST_DTYPES)
@pytest.mark.parametrize("src", CAST_DTYPES)
def test_cast(run_op, src, to):
    kind = "bool" if src == "bool" else "float" if src.startswith("float") else "int"
    x = np.array(CAST_SOURCES[kind], src)
    assert_close(run_op(lambda t: ef.cast(t, to), x), cast_reference(x, to), to)


def test_cast_accepts_dtype_spellings(run_op):
    x = np.array([1.9, -1.9], np.float32)
    for dtype in (ef.int32, np.int32, "int32"):
        assert_close(run_op(lambda t: ef.cast(t, dtype), x), [1, -1], np.int32)


# -- build-time and run-time errors -------------------------------------------------------

def test_mismatched_broadcast_is_a_graph_error(graph):
    a, b = ef.placeholder("float32", (2, 3)), ef.placeholder("float32", (4,))
    for fn in (ef.add, ef.subtract, ef.multiply, ef.divide, ef.pow, ef.maximum, ef.minimum,
               ef.equal, ef.less, ef.greater):
        with pytest.raises(GraphError, match="broadcast"):
            fn(a, b)
    with pytest.raises(GraphError):
        ef.placeholder("float32", (3, 2)) + ef.placeholder("float32", (2, 3))


def test_mixed_dtypes_are_a_graph_error(graph):
    f, i = ef.placeholder("float32", (3,)), ef.placeholder("int32", (3,))
    for fn in (ef.add, ef.subtract, ef.multiply, ef.divide, ef.maximum, ef.equal, ef.less):
        with pytest.raises(GraphError, match="dtype"):
            fn(f, i)
    with pytest.raises(GraphError):
        f + ef.placeholder("float64", (3,))


@pytest.mark.parametrize("fn,dtype", [
    (ef.pow, "int32"), (ef.add, "bool"), (ef.subtract, "bool"), (ef.divide, "bool")])
def test_binary_op_rejects_dtype(graph, fn, dtype):
    with pytest.raises(GraphError):
        fn(ef.placeholder(dtype, (2,)), ef.placeholder(dtype, (2,)))


@pytest.mark.parametrize("fn,dtype", [
    (ef.exp, "int32"), (ef.log, "int64"), (ef.sqrt, "int32"), (ef.sigmoid, "int32"), (ef.tanh, "bool"),
    (ef.negative, "bool"), (ef.negative, "uint8"), (ef.abs, "bool")])
def test_unary_op_rejects_dtype(graph, fn, dtype):
    with pytest.raises(GraphError):
        fn(ef.placeholder(dtype, (2,)))


def test_where_errors(graph):
    x = ef.placeholder("float32", (3,))
    with pytest.raises(GraphError, match="bool"):
        ef.where(x, x, x)
    cond = ef.placeholder("bool", (3,))
    with pytest.raises(GraphError):
        ef.where(cond, x, ef.placeholder("int32", (3,)))
    with pytest.raises(GraphError):
        ef.where(ef.placeholder("bool", (2,)), x, x)


def test_run_time_broadcast_mismatch_is_invalid_input(compile_graph, graph):
    x = ef.placeholder("float32", (None,), name="x")
    y = x + ef.constant(np.arange(3, dtype=np.float32))
    assert y.shape == (3,)
    run = compile_graph(graph, {"x": x}, {"y": y})
    assert_close(run(x=np.ones(1, np.float32))["y"], [1, 2, 3], np.float32)
    assert_close(run(x=np.ones(3, np.float32))["y"], [1, 2, 3], np.float32)
    with pytest.raises(InvalidInputError):
        run(x=np.ones(4, np.float32))


@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pow_by_a_constant_exponent(run_op, rng, exponent, dtype):
    """x ** e for a constant e: 2 and 3 as products (as onnxruntime's Pow computes them),
    others numpy's power; large enough to split over workers, special values among them
    (zeros of both signs, infinities, NaN, an overflow); against onnxruntime, float16
    against float64."""
    x = (rng.standard_normal((3, 300, 400)) * 3).astype(dtype)
    x.flat[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30 if dtype != np.float16 else 6e4, -2.0]
    e = np.array(exponent, dtype)
    got = run_op(lambda t: apply("pow", [t, e]), x)
    if dtype == np.float16:
        with np.errstate(all="ignore"):
            want = np.power(x.astype(np.float64), exponent).astype(np.float16)
        assert_close(got, want, dtype)
    else:
        assert_close(got, onnx_node("Pow", x, [e]), dtype)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(np.signbit(got[0, 0, :2]), np.signbit(np.power(x[0, 0, :2], exponent)))
