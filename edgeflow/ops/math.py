"""Elementwise arithmetic, comparisons, selection, casting and matrix products."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, activation_attr, check_activation, define
from .shapes import broadcast, fmt

NUMERIC = dtypes.FLOATS | dtypes.INTEGERS


def _same_dtype(op, specs, allowed):
    dts = {s.dtype for s in specs}
    if len(dts) != 1:
        raise GraphError(f"{op}: inputs must share one dtype, got {', '.join(str(s.dtype) for s in specs)}")
    dt = dts.pop()
    if dt not in allowed:
        raise GraphError(f"{op}: dtype {dt} not supported; expected one of "
                         f"{', '.join(sorted(d.name for d in allowed))}")
    return dt


def _elementwise(name, arity, allowed, result=None, attrs=None):
    """Define an op whose output broadcasts its inputs; dtype kept unless `result` is given."""
    def infer(inputs, attrs):
        dt = _same_dtype(name, inputs, allowed)
        check_activation(name, attrs)
        return [TensorSpec(broadcast(*(s.shape for s in inputs)), result or dt)]
    infer.__doc__ = f"{name}: elementwise with numpy broadcasting"
    define(name, inputs=arity, attrs=attrs)(infer)


_elementwise("add", 2, NUMERIC, attrs={"activation": activation_attr()})
for _name in ("sub", "mul", "div", "maximum", "minimum"):
    _elementwise(_name, 2, NUMERIC)
_elementwise("pow", 2, dtypes.FLOATS)
for _name in ("neg", "abs"):
    _elementwise(_name, 1, NUMERIC - {dtypes.uint8} if _name == "neg" else NUMERIC)
for _name in ("exp", "log", "sqrt", "sigmoid", "tanh"):
    _elementwise(_name, 1, dtypes.FLOATS)
for _name in ("equal", "less", "greater"):
    _elementwise(_name, 2, NUMERIC | {dtypes.bool_}, result=dtypes.bool_)


@define("where", inputs=3)
def _where(inputs, attrs):
    """where(condition, x, y): x where condition holds, else y, all broadcast together."""
    cond, x, y = inputs
    if cond.dtype != dtypes.bool_:
        raise GraphError(f"where: condition must be bool, got {cond.dtype}")
    dt = _same_dtype("where", [x, y], NUMERIC | {dtypes.bool_})
    return [TensorSpec(broadcast(cond.shape, x.shape, y.shape), dt)]


@define("cast", inputs=1, attrs={"dtype": Attr(AttrKind.DTYPE)})
def _cast(inputs, attrs):
    """Convert elements to `dtype` (floats to ints truncate toward zero)."""
    return [TensorSpec(inputs[0].shape, attrs["dtype"])]


def _swap_last(shape, swap):
    return shape[:-2] + (shape[-1], shape[-2]) if swap and len(shape) >= 2 else shape


def _matmul_flops(inputs, outputs, attrs):
    a = inputs[0]
    inner = a.shape[-2] if attrs["transpose_a"] and a.rank >= 2 else a.shape[-1]
    return 2 * inner * int(np.prod(outputs[0].shape, dtype=np.int64))


@define("matmul", inputs=2, attrs={"transpose_a": Attr(AttrKind.BOOL, False),
                                    "transpose_b": Attr(AttrKind.BOOL, False),
                                    "activation": activation_attr()}, flops=_matmul_flops)
def _matmul(inputs, attrs):
    """Batched matrix product with numpy's matmul rules; transpose_* swap the last two axes."""
    a, b = inputs
    dt = _same_dtype("matmul", inputs, NUMERIC)
    check_activation("matmul", attrs)
    if a.rank == 0 or b.rank == 0:
        raise GraphError(f"matmul: operands must have rank >= 1, got {fmt(a.shape)} and {fmt(b.shape)}")
    sa, sb = _swap_last(a.shape, attrs["transpose_a"]), _swap_last(b.shape, attrs["transpose_b"])
    k_a, k_b = sa[-1], sb[0] if len(sb) == 1 else sb[-2]
    if k_a is not None and k_b is not None and k_a != k_b:
        raise GraphError(f"matmul: inner dimensions differ: a {fmt(sa)} and b {fmt(sb)}")
    rows = sa[-2:-1] if len(sa) > 1 else ()
    cols = sb[-1:] if len(sb) > 1 else ()
    return [TensorSpec(broadcast(sa[:-2], sb[:-2]) + rows + cols, dt)]
