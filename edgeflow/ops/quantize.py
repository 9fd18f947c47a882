"""Affine quantization, as ONNX's QuantizeLinear and DequantizeLinear define it:
real = scale * (q - zero_point), with one scale (and zero point) for the whole tensor, or
one per index along `axis` (per channel).

quantize_linear:   q = saturate(round_half_to_even(x / scale) + zero_point)
dequantize_linear: x = (q - zero_point) * scale
"""
from .. import dtypes
from ..errors import GraphError
from .dims import fmt, normalize_axis
from .registry import Attr, AttrKind, TensorSpec, Types, define

QUANTIZED = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)


def _per_tensor(t):
    return t.rank == 0 or t.shape == (1,)


def _check_scales(op, x, scale, zero_point, axis):
    """GraphError unless scale (and zero_point, which must match it) is a scalar or a
    vector as long as x's dimension `axis`."""
    if zero_point is not None and zero_point.shape != scale.shape and not (
            _per_tensor(zero_point) and _per_tensor(scale)):
        raise GraphError(f"{op}: zero_point has shape {fmt(zero_point.shape)}, scale {fmt(scale.shape)}; "
                         "they must match")
    if _per_tensor(scale):
        return
    if scale.rank != 1:
        raise GraphError(f"{op}: scale must be a scalar (per tensor) or a vector (per axis), got "
                         f"{fmt(scale.shape)}")
    dim = x.shape[normalize_axis(axis, x.rank, op)]
    if None not in (dim, scale.shape[0]) and dim != scale.shape[0]:
        raise GraphError(f"{op}: {scale.shape[0]} scales for axis {axis} of {fmt(x.shape)}")


@define("quantize_linear", attrs={"axis": Attr(AttrKind.INT, 1), "dtype": Attr(AttrKind.DTYPE, dtypes.uint8)},
        types=Types("x: F, scale: F, zero_point: Q? -> dtype", F=dtypes.FLOATS, Q=QUANTIZED, dtype=QUANTIZED))
def _quantize_linear(inputs, attrs):
    """Float -> int8/uint8/int16/uint16 (`dtype`, which the zero point's dtype must equal)."""
    x, scale, zero_point = (inputs + [None])[:3]
    if zero_point is not None and zero_point.dtype != attrs["dtype"]:
        raise GraphError(f"quantize_linear: zero_point is {zero_point.dtype}, the output {attrs['dtype']}")
    _check_scales("quantize_linear", x, scale, zero_point, attrs["axis"])
    return [TensorSpec(x.shape, attrs["dtype"])]


@define("dequantize_linear", attrs={"axis": Attr(AttrKind.INT, 1)}, fold_at_plan=True,
        types=Types("x: Q, scale: F, zero_point: Q? -> F", Q=QUANTIZED + (dtypes.int32,), F=dtypes.FLOATS))
def _dequantize_linear(inputs, attrs):
    """int8/uint8/int16/int32 -> the scale's float dtype."""
    x, scale, zero_point = (inputs + [None])[:3]
    _check_scales("dequantize_linear", x, scale, zero_point, attrs["axis"])
    return [TensorSpec(x.shape, scale.dtype)]
