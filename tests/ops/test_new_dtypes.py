"""uint16, uint32, uint64 and bfloat16 in the kernels.

Every op whose declaration admits one of them computes on it what it computes on a wider
dtype the op also takes (int64/int32/int16 for the unsigned ones, float32 for bfloat16),
cast afterwards (integers wrap modulo 2**bits on both sides; bfloat16 rounds to nearest
even, as ml_dtypes does); Cast between every pair of edgeflow dtypes matches numpy and
ml_dtypes, and onnxruntime for the pairs it converts.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest

from edgeflow import dtypes, ops
from edgeflow.interp.kernels import KERNELS, evaluate
from edgeflow.ops import TensorSpec

from .harness import run_op
from .test_dtype_constraints import D, EXAMPLES, NARROWER

NEW = (dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.bfloat16)
WIDER = {dtypes.bfloat16: (dtypes.float32,)}
WIDER.update({dt: (dtypes.int64, dtypes.int32, dtypes.int16) for dt in NEW[:3]})


def as_ml(a):
    """An edgeflow bfloat16 array as ml_dtypes' (bit for bit); others as they are."""
    return a.view(ml_dtypes.bfloat16) if a.dtype == dtypes.bfloat16 else a


def cast_to(a, dt):
    """`a` converted to `dt` by numpy, or by ml_dtypes for bfloat16."""
    a = np.asarray(a)
    if dt == dtypes.bfloat16:
        return np.asarray(a.astype(ml_dtypes.bfloat16)).view(dtypes.bfloat16)
    return a.astype(dt)


def _cases():
    for name, (inputs, attrs) in sorted(EXAMPLES.items()):
        opdef = ops.get(name)
        if name not in KERNELS or opdef.remote or name in NARROWER:  # bitcast: ONNX's tests
            continue
        allowed = opdef.types.input_dtypes(len(inputs), opdef.check_attrs(attrs))
        varied = [a for a, s in zip(allowed, inputs) if s.dtype is D]
        for dt in NEW:
            if varied and all(dt in a for a in varied):
                yield pytest.param(name, dt, id=f"{name}-{dtypes.name(dt)}")


def _values(inputs, dt, rng):
    """Values for an example's inputs: distinct small integers (exact in bfloat16) for
    those under test, zeros for indices, fair bools, given values where the op reads them."""
    out = []
    for s in inputs:
        n = int(np.prod(s.shape, dtype=np.int64))
        if s.value is not None:
            out.append(np.array(s.value))
        elif s.dtype is D:
            out.append(rng.permutation(200)[:n].reshape(s.shape))
        elif s.dtype == "bool":
            out.append(rng.random(s.shape) < 0.5)
        elif s.dtype.startswith("float"):
            out.append(np.ones(s.shape))
        else:
            out.append(np.zeros(s.shape, np.int64))
    return out


def _run(name, inputs, attrs, values, dt):
    """(inputs after, outputs) of the kernel of `name`, on `values` with the inputs under test as `dt`."""
    opdef = ops.get(name)
    attrs = opdef.check_attrs(attrs)
    arrays = [cast_to(v, dt) if s.dtype is D else cast_to(v, dtypes.as_dtype(s.dtype))
              for s, v in zip(inputs, values)]
    specs = [TensorSpec(a.shape, a.dtype, a if s.value is not None else None) for s, a in zip(inputs, arrays)]
    outs = opdef.infer_specs(specs, attrs)
    if any(d is None for o in outs for d in o.shape):  # its shape depends on the values: give them
        outs = opdef.infer_specs([TensorSpec(a.shape, a.dtype, a) for a in arrays], attrs)
    return arrays, evaluate(name, attrs, arrays, [TensorSpec(o.shape, o.dtype) for o in outs])


@pytest.mark.parametrize("name,dt", list(_cases()))
def test_every_op_computes_the_new_dtypes_as_a_wider_one(name, dt):
    inputs, attrs = EXAMPLES[name]
    allowed = ops.get(name).types.input_dtypes(len(inputs), ops.get(name).check_attrs(attrs))
    varied = [a for a, s in zip(allowed, inputs) if s.dtype is D]
    wide = next(w for w in WIDER[dt] if all(w in a for a in varied))
    values = _values(inputs, dt, np.random.default_rng(0))
    got_ins, got = _run(name, inputs, attrs, values, dt)
    want_ins, want = _run(name, inputs, attrs, values, wide)
    for g, w in zip(got_ins + list(got), want_ins + list(want)):
        expected = cast_to(w, dt) if g.dtype == dt and w.dtype == wide else w
        assert g.dtype == expected.dtype and g.shape == expected.shape
        np.testing.assert_array_equal(as_ml(g).astype(np.float64) if dt == dtypes.bfloat16 else g,
                                      as_ml(expected).astype(np.float64) if dt == dtypes.bfloat16 else expected)


def test_bfloat16_ops_are_declared_where_expected():
    """bfloat16 is declared by the moves (every dtype) and the ops listed here, computed in float32."""
    takes = {name for name in EXAMPLES if name in KERNELS and any(
        dtypes.bfloat16 in a for a in ops.get(name).types.input_dtypes(len(EXAMPLES[name][0]),
                                                                       ops.get(name).check_attrs(EXAMPLES[name][1])))}
    assert {"cast", "add", "sub", "mul", "div", "matmul", "einsum", "celu", "range", "transpose", "concat",
            "gather", "slice", "split", "where", "one_hot", "softmax", "reduce_max", "attention"} <= takes
    assert not {"conv", "exp", "lstm"} & takes


def test_bfloat16_is_a_dtype_of_its_own():
    bf16 = dtypes.bfloat16
    assert bf16 != dtypes.uint16 and bf16.itemsize == 2 and dtypes.as_dtype("bfloat16") == bf16
    assert {bf16: 1, dtypes.uint16: 2}[bf16] == 1 and dtypes.name(bf16) == "bfloat16"
    with pytest.raises(TypeError):
        np.add(dtypes.array([1.0], bf16), dtypes.array([1.0], bf16))  # no arithmetic on its bits by mistake
    np.testing.assert_array_equal(dtypes.widen(dtypes.array([1, 2.5, -3], bf16)), [1, 2.5, -3])
    bits = np.array([1.0, -2.0], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(dtypes.widen(bits.view(bf16)), [1.0, -2.0])  # ml_dtypes' bits, as they are


# -- cast --------------------------------------------------------------------------------

def _source(dt, rng):
    """Values every dtype holds: 0..99 (floats with fractions, truncated toward zero by
    integer casts), and -0.0, inf and NaN where the dtype has them."""
    if dt == dtypes.bool_:
        return np.array([True, False, True, True])
    whole = rng.integers(0, 100, 12)
    if dt == dtypes.bfloat16 or dt.kind == "f":
        x = whole + rng.random(12)
        return cast_to(x, dt), x
    return whole.astype(dt), whole


def _expected(x, src, dst):
    """`x` (float64 or integer values of `src`) in `dst`, element by element in Python."""
    values = [float(v) for v in np.asarray(x).reshape(-1)]
    if src == dtypes.bfloat16:  # what the bfloat16 elements hold
        values = [float(ml_dtypes.bfloat16(v)) for v in values]
    elif src.kind == "f":
        values = [float(src.type(v)) for v in values]
    if dst == dtypes.bool_:
        return np.array([v != 0 for v in values])
    if dst == dtypes.bfloat16:
        return np.array([ml_dtypes.bfloat16(v) for v in values], ml_dtypes.bfloat16).view(dtypes.bfloat16)
    if dst.kind in "iu":
        return np.array([int(v) for v in values], dst)  # truncated toward zero
    return np.array(values, dst)


@pytest.mark.parametrize("src,dst", list(itertools.product(dtypes.ALL, dtypes.ALL)),
                         ids=lambda d: dtypes.name(d))
def test_cast_between_every_pair(src, dst):
    from edgeflow.graph.math_ops import cast
    rng = np.random.default_rng(dtypes.to_code(src))
    a, x = _source(src, rng) if src != dtypes.bool_ else (_source(src, rng),) * 2
    got = run_op(lambda t: cast(t, dst), a)
    want = _expected(x, src, dst)
    assert got.dtype == dst
    np.testing.assert_array_equal(as_ml(got), as_ml(want))


def test_cast_to_bfloat16_rounds_to_nearest_even():
    """float32 values around every kind of tie, and specials, against ml_dtypes."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    bits[:4096] = (bits[:4096] & 0xFFFF0000) | 0x8000  # exact ties, even and odd
    bits[4096:8192] = (bits[4096:8192] & 0xFFFF0000) | rng.choice([0x7FFF, 0x8001], 4096)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.3961776e38, -3.3961776e38, 1e-45, 1.17549435e-38],
                       np.float32)
    x = np.concatenate([bits.view(np.float32), special])
    got = dtypes.narrow(x)
    with np.errstate(invalid="ignore"):  # NaN
        want = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got["bfloat16"][~nan], want.view(np.uint16)[~nan])
    assert np.isnan(dtypes.widen(got[nan])).all()
    np.testing.assert_array_equal(dtypes.widen(got)[~nan], want.astype(np.float32)[~nan])  # widening is exact


def test_float64_rounds_once_to_bfloat16():
    """Near a tie, float64 rounds to the nearer bfloat16 (rounding through float32 first
    could land on the tie and go the wrong way)."""
    below_tie = np.nextafter(np.float64(1 + 2 ** -8), 0)  # 1 + half a bfloat16 ulp, less a float64 ulp
    above_tie = np.nextafter(np.float64(1 + 3 * 2 ** -8), 3)  # above the tie that would round to even 1 + 2**-6
    got = dtypes.widen(dtypes.narrow(np.array([below_tie, above_tie, -below_tie])))
    np.testing.assert_array_equal(got, np.array([1.0, 1 + 2 ** -6, -1.0], np.float32))
    rng = np.random.default_rng(2)
    x = rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)
    lower = dtypes.widen(dtypes.narrow(x)).astype(np.float64)
    # the nearest bfloat16: no other bfloat16 (one ulp away on either side) is nearer
    ulp = np.exp2(np.floor(np.log2(np.abs(lower))) - 7)
    for other in (lower - ulp, lower + ulp):
        assert (np.abs(x - lower) <= np.abs(x - other)).all()


ORT_TYPES = {dtypes.float32: 1, dtypes.uint8: 2, dtypes.int8: 3, dtypes.uint16: 4, dtypes.int16: 5,
             dtypes.int32: 6, dtypes.int64: 7, dtypes.bool_: 9, dtypes.float16: 10, dtypes.float64: 11,
             dtypes.uint32: 12, dtypes.uint64: 13, dtypes.bfloat16: 16}


def test_cast_matches_onnxruntime_where_it_converts():
    """onnxruntime's Python API cannot feed or fetch bfloat16, so the source is an
    initializer and a bfloat16 result is widened to float32 (exactly) by a second Cast."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    from edgeflow import Interpreter
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.format import writer
    assert set(ORT_TYPES) == set(dtypes.ALL)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no folding: the kernel casts
    compared = []
    for src, dst in itertools.product(dtypes.ALL, dtypes.ALL):
        a = _source(src, np.random.default_rng(7))
        a = a[0] if isinstance(a, tuple) else a
        nodes = [helper.make_node("Cast", ["x"], ["y"], to=ORT_TYPES[dst])]
        out = dtypes.float32 if dst == dtypes.bfloat16 else dst
        if dst == dtypes.bfloat16:
            nodes.append(helper.make_node("Cast", ["y"], ["z"], to=ORT_TYPES[out]))
        graph = helper.make_graph(nodes, "cast", [], [helper.make_tensor_value_info(nodes[-1].output[0],
                                                                                     ORT_TYPES[out], a.shape)],
                                  initializer=[numpy_helper.from_array(as_ml(a), "x")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        try:
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            want = session.run(None, {})[0]
        except Exception:  # a pair onnxruntime does not convert
            continue
        runner = Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")
        got = runner()[nodes[-1].output[0]]
        assert got.dtype == out
        np.testing.assert_array_equal(got, want, err_msg=f"{dtypes.name(src)} -> {dtypes.name(dst)}")
        compared.append((src, dst))
    missing = sorted(f"{dtypes.name(s)}->{dtypes.name(d)}" for s, d in itertools.product(dtypes.ALL, dtypes.ALL)
                     if (s, d) not in compared)
    assert len(compared) >= 169, missing
