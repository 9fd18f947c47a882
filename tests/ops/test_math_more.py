"""The elementwise ops of ONNX's wider set (trigonometric, rounding, sign, NaN/inf tests,
logic, mod, bit shifts, comparisons on every dtype), against Python's math module and
Python integers applied element by element."""
import math
import operator

import numpy as np
import pytest

from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close, random_array

INTEGERS = ("int8", "int16", "int32", "int64", "uint8")
EVERY = FLOATS + INTEGERS + ("bool",)


def op(name, **attrs):
    return lambda *ts: apply(name, list(ts), attrs)


def elementwise(fn, *arrays, otype=np.float64):
    """fn applied to Python scalars (floats, ints, bools) element by element, arrays broadcast."""
    scalars = [np.array(a.tolist(), dtype=object) for a in np.broadcast_arrays(*arrays)]
    return np.vectorize(fn, otypes=[otype])(*scalars)


def _half_even(v):
    return float(round(v)) if math.isfinite(v) else v  # Python's round() ties to even


# name -> (reference on a Python float, (low, high) of the inputs)
UNARY_FLOAT = {
    "sin": (math.sin, (-6, 6)), "cos": (math.cos, (-6, 6)), "tan": (math.tan, (-1.4, 1.4)),
    "asin": (math.asin, (-1, 1)), "acos": (math.acos, (-1, 1)), "atan": (math.atan, (-20, 20)),
    "sinh": (math.sinh, (-4, 4)), "cosh": (math.cosh, (-4, 4)), "asinh": (math.asinh, (-20, 20)),
    "acosh": (math.acosh, (1, 20)), "atanh": (math.atanh, (-0.99, 0.99)),
    "floor": (math.floor, (-4, 4)), "ceil": (math.ceil, (-4, 4)), "round": (_half_even, (-4, 4)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY_FLOAT)
def test_unary_float(run_op, rng, name, dtype):
    reference, (low, high) = UNARY_FLOAT[name]
    x = random_array(rng, (3, 7), dtype, low, high)
    assert_close(run_op(op(name), x), elementwise(reference, x.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rounding_ties_and_specials(run_op, dtype):
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.2, np.inf, -np.inf, np.nan], dtype)
    assert_close(run_op(op("round"), x), [-2, -2, -0, 0, 2, 2, 4, -0, np.inf, -np.inf, np.nan], dtype)
    assert_close(run_op(op("floor"), x), [-3, -2, -1, 0, 1, 2, 3, -1, np.inf, -np.inf, np.nan], dtype)
    assert_close(run_op(op("ceil"), x), [-2, -1, -0, 1, 2, 3, 4, -0, np.inf, -np.inf, np.nan], dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
def test_sign(run_op, rng, dtype):
    x = random_array(rng, (4, 5), dtype, 0 if dtype == "uint8" else -3, 3)
    x.flat[0] = 0
    assert_close(run_op(op("sign"), x), elementwise(lambda v: (v > 0) - (v < 0), x, otype=np.int64), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("positive, negative", [(True, True), (True, False), (False, True), (False, False)])
def test_is_nan_and_is_inf(run_op, dtype, positive, negative):
    x = np.array([0, -1.5, np.inf, -np.inf, np.nan, 7], dtype)
    assert_close(run_op(op("is_nan"), x), elementwise(math.isnan, x, otype=bool), "bool")
    expected = elementwise(lambda v: math.isinf(v) and (positive if v > 0 else negative), x, otype=bool)
    assert_close(run_op(op("is_inf", detect_positive=positive, detect_negative=negative), x), expected, "bool")


@pytest.mark.parametrize("name, reference", [("logical_and", operator.and_), ("logical_or", operator.or_),
                                             ("logical_xor", operator.xor)])
def test_logical_binary_broadcasts(run_op, name, reference):
    a = np.array([[False], [True]])
    b = np.array([False, True, True])
    assert_close(run_op(op(name), a, b), elementwise(reference, a, b, otype=bool), "bool")


def test_logical_not(run_op):
    x = np.array([[True, False], [False, False]])
    assert_close(run_op(op("logical_not"), x), elementwise(operator.not_, x, otype=bool), "bool")


# -- mod ---------------------------------------------------------------------------------

def _c_remainder(a, b):
    """C's fmod on Python ints: the remainder of truncating division, with a's sign."""
    return int(math.copysign(abs(a) % abs(b), a))


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("fmod", [False, True])
def test_integer_mod(run_op, rng, dtype, fmod):
    signed = dtype != "uint8"
    a = random_array(rng, (4, 6), dtype, -100 if signed else 0, 100)
    b = random_array(rng, (6,), dtype, -9 if signed else 1, 9)
    b[b == 0] = 7
    reference = _c_remainder if fmod else operator.mod  # Python's % takes the divisor's sign
    assert_close(run_op(op("mod", fmod=fmod), a, b), elementwise(reference, a, b, otype=np.int64), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fmod", [False, True])
def test_float_mod(run_op, rng, dtype, fmod):
    a = random_array(rng, (4, 6), dtype, -10, 10)
    b = random_array(rng, (6,), dtype, 0.5, 4) * np.where(np.arange(6) % 2, 1, -1).astype(dtype)
    reference = math.fmod if fmod else operator.mod
    expected = elementwise(reference, a.astype(np.float64), b.astype(np.float64))
    # float16 rounds a / b before flooring: an ulp of a can move the result by |b|'s.
    assert_close(run_op(op("mod", fmod=fmod), a, b), expected, dtype, atol=4e-2 if dtype == "float16" else None)


# -- bit_shift ---------------------------------------------------------------------------

def _shift(bits, signed, left):
    """ONNX's BitShift on Python ints (shifts past the width give 0, or -1 for a negative
    value shifted right); a signed value shifts left as its unsigned bits."""
    def shift(a, b):
        if not 0 <= b < bits:
            return -1 if a < 0 and not left else 0
        if not left:
            return a >> b
        v = (a << b) % (1 << bits)
        return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v
    return shift


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("left", [True, False])
def test_bit_shift(run_op, rng, dtype, left):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, info.bits + 4), endpoint=True).astype(dtype)
    b = (np.arange(info.bits + 4) - (2 if info.min < 0 else 0)).astype(dtype)
    expected = elementwise(_shift(info.bits, info.min < 0, left), a, b, otype=np.int64)
    assert_close(run_op(op("bit_shift", left=left), a, b), expected, dtype)


# -- comparisons on every dtype ----------------------------------------------------------

COMPARE = {"equal": operator.eq, "less": operator.lt, "greater": operator.gt,
           "less_equal": operator.le, "greater_equal": operator.ge}


@pytest.mark.parametrize("dtype", EVERY)
@pytest.mark.parametrize("name", COMPARE)
def test_comparisons(run_op, rng, name, dtype):
    a = random_array(rng, (4, 5), dtype, 0, 4)
    b = random_array(rng, (5,), dtype, 0, 4)
    if np.dtype(dtype).kind == "f":
        a, b = np.round(a), np.round(b)  # ties
        a.flat[:3], b[:2] = np.nan, [np.nan, np.inf]
    with np.errstate(invalid="ignore"):  # C's ordered comparisons of NaN raise the invalid flag
        expected = elementwise(COMPARE[name], a, b, otype=bool)
    assert_close(run_op(op(name), a, b), expected, "bool")


def test_type_errors_name_the_op(graph):
    import edgeflow as ef
    f, i = ef.placeholder("float32", (2,)), ef.placeholder("int32", (2,))
    for name, inputs in (("logical_not", [f]), ("bit_shift", [f, f]), ("floor", [i]), ("is_nan", [i])):
        with pytest.raises(GraphError, match=rf"\b{name}: .*dtype \w+ not supported"):
            apply(name, inputs)


# -- bitwise operations and bit casts -----------------------------------------------------

BITWISE = {"bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor}


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("name", BITWISE)
def test_bitwise_binary(run_op, rng, name, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, 5), endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, size=(5,), endpoint=True).astype(dtype)
    b[:2] = [info.min, info.max]
    # Python's ints are two's complement of infinite width: & | ^ of in-range values stay in range.
    assert_close(run_op(op(name), a, b), elementwise(BITWISE[name], a, b, otype=np.int64), dtype)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitwise_not(run_op, rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=(4, 6), endpoint=True).astype(dtype)
    x.flat[:3] = [info.min, info.max, 0]
    unsigned = info.min == 0
    expected = elementwise(lambda v: info.max - v if unsigned else ~v, x, otype=np.int64)
    assert_close(run_op(op("bitwise_not"), x), expected, dtype)


# Same-width pairs, and the struct format of each dtype.
_STRUCT = {"float16": "e", "float32": "f", "float64": "d", "int8": "b", "int16": "h", "int32": "i",
           "int64": "q", "uint8": "B", "bool": "?"}
BITCASTS = [(a, b) for a in _STRUCT for b in _STRUCT if a != b and np.dtype(a).itemsize == np.dtype(b).itemsize
            and b != "bool"]


@pytest.mark.parametrize("src,dst", BITCASTS, ids=[f"{a}-{b}" for a, b in BITCASTS])
def test_bitcast(run_op, rng, src, dst):
    import struct
    x = random_array(rng, (2, 5), src, -100, 100)
    packed = [struct.pack("<" + _STRUCT[src], v) for v in x.reshape(-1).tolist()]
    expected = np.array([struct.unpack("<" + _STRUCT[dst], p)[0] for p in packed], dst).reshape(x.shape)
    actual = run_op(op("bitcast", dtype=dst), x)
    assert actual.dtype == np.dtype(dst) and actual.shape == x.shape
    np.testing.assert_array_equal(actual, expected)  # NaN where the bits spell one


def test_bitcast_needs_the_same_width(graph):
    import edgeflow as ef
    x = ef.placeholder("float64", (2,))
    with pytest.raises(GraphError, match=r"bitcast: x: dtype float64 not supported; expected float32, int32 or uint32 \(the 32 bits of int32\)$"):
        apply("bitcast", [x], {"dtype": "int32"})
