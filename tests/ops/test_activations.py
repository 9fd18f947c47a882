"""Activations (clip, leaky_relu, hard_sigmoid, hard_swish, gelu, erf, softplus, elu, selu,
celu, softsign, mish, thresholded_relu, shrink, swish, swiglu) against onnxruntime running the ONNX operator, and against closed forms in float64."""
import math

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .onnx_reference import onnx_reference
from .harness import FLOATS, assert_close, random_array



def activation(name, **attrs):
    return lambda t: apply(name, [t], attrs)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _elu(x, alpha):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


# ONNX's defaults: SELU's constants (1.6732632..., 1.0507009...) rounded to float32.
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _gelu_tanh(x):
    return x / 2 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


HALF_SINGLE = ("float16", "float32")  # what onnxruntime's CPU kernels take for most of these
# (name, attributes (ONNX's have the same names), ONNX op, float64 reference, dtypes onnxruntime runs)
CASES = [
    ("leaky_relu", {}, "LeakyRelu", lambda x: np.where(x >= 0, x, 0.01 * x), FLOATS),
    ("leaky_relu", {"alpha": 0.25}, "LeakyRelu", lambda x: np.where(x >= 0, x, 0.25 * x), FLOATS),
    ("hard_sigmoid", {}, "HardSigmoid", lambda x: np.clip(0.2 * x + 0.5, 0, 1), HALF_SINGLE),
    ("hard_sigmoid", {"alpha": 0.3, "beta": 0.4}, "HardSigmoid", lambda x: np.clip(0.3 * x + 0.4, 0, 1),
     HALF_SINGLE),
    ("hard_swish", {}, "HardSwish", lambda x: x * np.clip(x / 6 + 0.5, 0, 1), HALF_SINGLE),
    ("erf", {}, "Erf", _erf, HALF_SINGLE),
    ("softplus", {}, "Softplus", lambda x: np.log1p(np.exp(-abs(x))) + np.maximum(x, 0), HALF_SINGLE),
    ("elu", {}, "Elu", lambda x: _elu(x, 1.0), HALF_SINGLE),
    ("elu", {"alpha": 0.5}, "Elu", lambda x: _elu(x, 0.5), HALF_SINGLE),
    ("selu", {}, "Selu", lambda x: SELU_GAMMA * _elu(x, SELU_ALPHA), HALF_SINGLE),
    ("selu", {"alpha": 2.0, "gamma": 0.5}, "Selu", lambda x: 0.5 * _elu(x, 2.0), HALF_SINGLE),
    ("gelu", {}, "Gelu", lambda x: x / 2 * (1 + _erf(x / math.sqrt(2))), HALF_SINGLE),
    ("gelu", {"approximate": "tanh"}, "Gelu", _gelu_tanh, HALF_SINGLE),
    ("celu", {}, "Celu", lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), ("float32",)),
    ("celu", {"alpha": 2.0}, "Celu", lambda x: np.where(x > 0, x, 2 * np.expm1(np.minimum(x, 0) / 2)),
     ("float32",)),
    ("softsign", {}, "Softsign", lambda x: x / (1 + abs(x)), HALF_SINGLE),
    ("mish", {}, "Mish", lambda x: x * np.tanh(np.log1p(np.exp(-abs(x))) + np.maximum(x, 0)), FLOATS),
    ("thresholded_relu", {}, "ThresholdedRelu", lambda x: np.where(x > 1, x, 0), HALF_SINGLE),
    ("thresholded_relu", {"alpha": -0.5}, "ThresholdedRelu", lambda x: np.where(x > -0.5, x, 0), HALF_SINGLE),
    ("shrink", {}, "Shrink", lambda x: np.where(x > 0.5, x - 0, np.where(x < -0.5, x + 0, 0)), FLOATS),
    ("shrink", {"lambd": 1.5, "bias": 0.75}, "Shrink",
     lambda x: np.where(x > 1.5, x - 0.75, np.where(x < -1.5, x + 0.75, 0)), FLOATS),
    ("swish", {}, "Swish", lambda x: x / (1 + np.exp(-x)), FLOATS),
    ("swish", {"alpha": 0.5}, "Swish", lambda x: x / (1 + np.exp(-0.5 * x)), FLOATS),
]
NAMES = sorted({case[0] for case in CASES})
OPSET = {"gelu": 20, "mish": 18, "swish": 24}  # the first opset with the op (where later than 17)


def case_id(case):
    return "-".join([case[0], *(f"{k}={v}" for k, v in case[1].items())])


# Relative tolerances: onnxruntime approximates erf, tanh and exp in float32, and holds
# attributes (alpha, ...) as float32 even for float64 inputs.
ORT_RTOL = {np.dtype("float16"): 4e-3, np.dtype("float32"): 2e-6, np.dtype("float64"): 1e-7}


def inputs(rng, dtype, shape=(3, 4, 5)):
    """Values across the interesting range, with 0, the kinks (+-3) and large magnitudes."""
    x = random_array(rng, shape, dtype, -7, 7).ravel()
    x[:8] = [0, -3, 3, -1e-3, 20, -20, 80, -80]
    return x.reshape(shape)


@pytest.mark.parametrize("case,dtype", [(case, dtype) for case in CASES for dtype in case[4]],
                         ids=lambda v: v if isinstance(v, str) else case_id(v))
def test_matches_onnxruntime(run_op, rng, case, dtype):
    name, attrs, op_type, _, _ = case
    x = inputs(rng, dtype)
    expected, = onnx_reference(op_type, [x], [dtype], opset=OPSET.get(name, 17), **attrs)
    tol = ORT_RTOL[np.dtype(dtype)]
    assert_close(run_op(activation(name, **attrs), x), expected, dtype, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_closed_form(run_op, rng, case, dtype):
    name, attrs, _, reference, _ = case
    x = inputs(rng, dtype, (2, 50))
    tol = 1e-13 if dtype == "float64" else None
    expected = reference(x.astype(np.float64))
    assert_close(run_op(activation(name, **attrs), x), expected, dtype, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(run_op, rng, dtype, alpha):
    """a * sigmoid(alpha a) * b in float64, and ONNX's reference evaluator running SwiGLU
    (opset 28; onnxruntime has no kernel for it yet)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    a, b = inputs(rng, dtype), inputs(rng, dtype)
    got = run_op(lambda x, y: apply("swiglu", [x, y], {"alpha": alpha}), a, b)
    wide_a = a.astype(np.float64)
    assert_close(got, wide_a / (1 + np.exp(-alpha * wide_a)) * b, dtype,
                 rtol=1e-13 if dtype == "float64" else None, atol=1e-13 if dtype == "float64" else None)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = helper.make_model(helper.make_graph(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=alpha)], "swiglu",
        [helper.make_tensor_value_info(n, elem, a.shape) for n in "ab"],
        [helper.make_tensor_value_info("y", elem, a.shape)]), opset_imports=[helper.make_opsetid("", 28)])
    with np.errstate(over="ignore"):  # the evaluator's exp(-alpha * a) overflows for large -a
        expected = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
    assert_close(got, expected, dtype,
                 rtol=ORT_RTOL[np.dtype(dtype)], atol=ORT_RTOL[np.dtype(dtype)])


def test_swiglu_takes_operands_of_one_shape(graph):
    a, b = ef.placeholder("float32", (2, 3)), ef.placeholder("float32", (1, 3))
    with pytest.raises(GraphError, match=r"swiglu: a and b must have one shape, got \(2, 3\) and \(1, 3\)"):
        apply("swiglu", [a, b])


def _ulps(actual, expected):
    """|actual - expected| in units of the last place of `expected` (subnormal spacing below)."""
    spacing = np.spacing(np.maximum(np.abs(expected), np.finfo(expected.dtype).tiny))
    return np.abs(actual.astype(np.float64) - expected) / spacing.astype(np.float64)


@pytest.fixture(params=["numpy", "scipy"])
def erf_implementation(request, monkeypatch):
    """Run with the numpy series, and with scipy.special when installed."""
    from edgeflow.interp.kernels import activations as kernels
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "_special", [(kernels.erf, kernels.erfc)])
    else:
        from scipy import special
        monkeypatch.setattr(kernels, "_special", [(special.erf, special.erfc)])
    return request.param


def test_erf_float64_within_a_few_ulps_of_math_erf(run_op, erf_implementation):
    x = np.concatenate([np.linspace(-7, 7, 140001), np.linspace(-30, 30, 6001),
                        np.geomspace(1e-310, 7, 4000), -np.geomspace(1e-300, 7, 1000)])
    assert _ulps(run_op(activation("erf"), x), _erf(x)).max() <= (2 if erf_implementation == "numpy" else 3)


def test_erf_float32_rounds_like_math_erf(run_op, erf_implementation):
    x = np.concatenate([np.linspace(-5, 5, 100001), np.geomspace(1e-40, 5, 3000)]).astype(np.float32)
    expected = _erf(x.astype(np.float64)).astype(np.float32)
    assert _ulps(run_op(activation("erf"), x), expected).max() <= 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_erf_special_values(run_op, dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], dtype)
    out = run_op(activation("erf"), x)
    assert np.isnan(out[0]) and out[1] == 1 and out[2] == -1 and out[3] == 0 and np.signbit(out[4])
    assert_close(out[5:], [math.erf(1), -math.erf(1)], dtype)


def test_exact_gelu_keeps_relative_precision_far_into_the_negative_tail(run_op, erf_implementation):
    # x / 2 * erfc(-x / sqrt 2): tiny but not 0, where 1 + erf(x / sqrt 2) would cancel to 0.
    x = -np.linspace(1, 37, 361)
    expected = [v / 2 * math.erfc(-v / math.sqrt(2)) for v in x]
    assert_close(run_op(activation("gelu"), x), expected, np.float64, rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", ("int8", "int16", "int32", "int64", "uint8"))
def test_shrink_of_integers_truncates_like_onnxruntime(run_op, rng, dtype):
    """ONNX's Shrink takes integers: x -+ bias in float, truncated toward zero."""
    x = random_array(rng, (4, 6), dtype, 0 if dtype == "uint8" else -60, 60)
    attrs = {"lambd": 2.5, "bias": 1.75}
    expected, = onnx_reference("Shrink", [x], [dtype], **attrs)
    assert_close(run_op(activation("shrink", **attrs), x), expected, dtype)
    wide = x.astype(np.float64)
    assert_close(run_op(activation("shrink", **attrs), x),
                 np.trunc(np.where(wide > 2.5, wide - 1.75, np.where(wide < -2.5, wide + 1.75, 0))), dtype)


def test_softplus_does_not_overflow(run_op):
    x = np.array([-1000, -100, 0, 100, 1000], np.float32)
    assert_close(run_op(activation("softplus"), x), [0, math.exp(-100), math.log(2), 100, 1000], np.float32)


CLIP_BOUNDS = [(None, None), (-2.0, None), (None, 3.0), (-2.0, 3.0), (1.0, 1.0), (2.0, -1.0)]


@pytest.mark.parametrize("bounds", CLIP_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS + ("int8", "int32", "int64", "uint8"))
def test_clip_matches_onnxruntime(run_op, rng, dtype, bounds):
    x = random_array(rng, (4, 6), dtype, -6, 7)
    # ONNX's bounds are optional inputs of x's dtype; no uint8 is below 0, so 0 clips as -2 does.
    operands = [None if v is None else np.array(max(v, 0) if dtype == "uint8" else v, dtype) for v in bounds]
    expected, = onnx_reference("Clip", [x, *operands], [dtype])
    attrs = {k: v for k, v in zip(("min", "max"), bounds) if v is not None}
    assert_close(run_op(activation("clip", **attrs), x), expected, dtype)


@pytest.mark.parametrize("bounds", CLIP_BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS + ("int8", "int16", "int32", "int64", "uint8"))
def test_clip_matches_closed_form(run_op, rng, dtype, bounds):
    x = random_array(rng, (4, 6), dtype, -6, 7)
    lo, hi = (-math.inf if bounds[0] is None else bounds[0]), (math.inf if bounds[1] is None else bounds[1])
    expected = [min(max(v, lo), hi) for v in x.ravel().tolist()]
    if np.dtype(dtype).kind in "iu":  # a bound past the dtype's range saturates
        info = np.iinfo(dtype)
        expected = [min(max(v, info.min), info.max) for v in expected]
    attrs = {k: v for k, v in zip(("min", "max"), bounds) if v is not None}
    out = run_op(activation("clip", **attrs), x)
    assert_close(out.ravel(), np.array(expected, np.float64), dtype)


def test_clip_with_min_above_max_gives_max_everywhere(run_op):
    x = np.array([-5, 0, 1.5, 7], np.float32)
    assert_close(run_op(activation("clip", min=2.0, max=-1.0), x), [-1, -1, -1, -1], np.float32)


def test_clip_bounds_past_the_dtype_range(run_op):
    x = np.array([-128, -1, 0, 127], np.int8)
    assert_close(run_op(activation("clip", min=-1e6, max=1e6), x), x, np.int8)
    assert_close(run_op(activation("clip", min=-1.0, max=1e30), x), [-1, -1, 0, 127], np.int8)
    h = np.array([-60000, -1, 60000], np.float16)
    assert_close(run_op(activation("clip", min=-1e5, max=1e5), h), h, np.float16)


def test_nan_passes_through(run_op):
    x = np.array([np.nan, 1.0], np.float32)
    for name in ("clip", "leaky_relu", "hard_sigmoid", "hard_swish", "gelu", "softplus", "elu", "selu"):
        assert np.isnan(run_op(activation(name), x)[0]), name


def test_static_shape_with_unknown_dims(run_op, rng):
    x = random_array(rng, (3, 5), "float32")
    for name in ("clip", *NAMES):
        out = run_op(activation(name), x, shapes=[(None, 5)])  # run_op checks static vs run-time
        assert out.shape == (3, 5)


def test_invalid_attributes_and_dtypes(graph):
    f, i = ef.placeholder("float32", (2,)), ef.placeholder("int32", (2,))
    with pytest.raises(GraphError, match="approximate"):
        apply("gelu", [f], {"approximate": "erf"})
    with pytest.raises(GraphError, match="not an integer"):
        apply("clip", [i], {"min": 0.5})
    with pytest.raises(GraphError, match="NaN"):
        apply("clip", [f], {"max": float("nan")})
    with pytest.raises(GraphError, match="attribute 'alpha'"):
        apply("leaky_relu", [f], {"alpha": "big"})
    with pytest.raises(GraphError, match="unknown attribute"):
        apply("hard_swish", [f], {"alpha": 0.5})
    for name in set(NAMES) - {"shrink"}:  # ONNX's Shrink takes integers
        with pytest.raises(GraphError, match="dtype int32 not supported"):
            apply(name, [i])
    with pytest.raises(GraphError, match="takes 1 inputs"):
        apply("erf", [f, f])
