"""Normalization: batch norm in its inference form, and layer norm."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, define
from .shapes import fmt, normalize_axis


def _float_operands(op, specs):
    dts = {s.dtype for s in specs}
    if len(dts) != 1 or next(iter(dts)) not in dtypes.FLOATS:
        raise GraphError(f"{op}: inputs must share one float dtype, got "
                         f"{', '.join(str(s.dtype) for s in specs)}")
    return dts.pop()


@define("batch_norm", inputs=5, attrs={"epsilon": Attr(AttrKind.FLOAT, 1e-5)})
def _batch_norm(inputs, attrs):
    """(x - mean) / sqrt(var + epsilon) * scale + bias, per channel (axis 1) of x (N, C, ...)."""
    x = inputs[0]
    dt = _float_operands("batch_norm", inputs)
    if x.rank < 2:
        raise GraphError(f"batch_norm: x must be (N, C, ...), got {fmt(x.shape)}")
    for name, s in zip(("scale", "bias", "mean", "var"), inputs[1:]):
        if s.rank != 1 or None not in (s.shape[0], x.shape[1]) and s.shape[0] != x.shape[1]:
            raise GraphError(f"batch_norm: {name} must have one element per channel of x "
                             f"{fmt(x.shape)}, got {fmt(s.shape)}")
    return [TensorSpec(x.shape, dt)]


@define("layer_norm", inputs=(2, 3), attrs={"axis": Attr(AttrKind.INT, -1),
                                             "epsilon": Attr(AttrKind.FLOAT, 1e-5)})
def _layer_norm(inputs, attrs):
    """(x - mean) / sqrt(var + epsilon) * scale + bias, statistics over axes [axis, rank).

    scale and bias broadcast against x.shape[axis:].
    """
    x = inputs[0]
    dt = _float_operands("layer_norm", inputs)
    if x.rank == 0:
        raise GraphError("layer_norm: x must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "layer_norm")
    normalized = x.shape[axis:]
    for name, s in zip(("scale", "bias"), inputs[1:]):
        fits = s.rank <= len(normalized) and all(
            d in (1, None) or n in (d, None) for d, n in zip(s.shape[::-1], normalized[::-1]))
        if not fits:
            raise GraphError(f"layer_norm: {name} {fmt(s.shape)} does not broadcast to the "
                             f"normalized shape {fmt(normalized)}")
    return [TensorSpec(x.shape, dt)]
