"""Elementwise arithmetic, comparisons, selection, casting and matrix products."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import (Attr, AttrKind, TensorSpec, Types, activation_attr, activation_gradient, check_activation,
                       define, dtype_names, gradient)
from .dims import broadcast, fmt

NUMERIC, FLOATS = dtypes.NUMERIC, dtypes.FLOATS
WIDENED = NUMERIC | {dtypes.bfloat16}  # bfloat16 computed in float32 (interp/kernels widen it)


def _elementwise(name, arity, allowed, result=None, attrs=None):
    """Define an op whose output broadcasts its inputs (of one dtype), kept unless `result` is given."""
    def infer(inputs, attrs):
        check_activation(name, attrs)
        return [TensorSpec(broadcast(*(s.shape for s in inputs)), result or inputs[0].dtype)]
    infer.__doc__ = f"{name}: elementwise with numpy broadcasting"
    signature = ", ".join(("x: T", "y: T")[:arity]) + " -> " + (result.name if result else "T")
    define(name, attrs=attrs, types=Types(signature, T=allowed))(infer)


_elementwise("add", 2, WIDENED, attrs={"activation": activation_attr()})
for _name in ("sub", "mul", "div", "maximum", "minimum"):
    _elementwise(_name, 2, WIDENED)
_elementwise("pow", 2, FLOATS)
_elementwise("neg", 1, WIDENED - dtypes.UNSIGNED)
_elementwise("abs", 1, WIDENED)
for _name in ("exp", "log", "sqrt", "sigmoid", "tanh"):
    _elementwise(_name, 1, FLOATS)
# less_equal and greater_equal are ops of their own: "not greater" would hold for NaN.
for _name in ("equal", "less", "greater", "less_equal", "greater_equal"):
    _elementwise(_name, 2, WIDENED | {dtypes.bool_}, result=dtypes.bool_)
# Trigonometric and hyperbolic functions; their gradient rules are the table TRIG_GRADIENTS.
TRIG = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
for _name in TRIG + ("floor", "ceil", "round"):
    _elementwise(_name, 1, FLOATS)
_elementwise("sign", 1, NUMERIC)
for _name in ("logical_and", "logical_or", "logical_xor"):
    _elementwise(_name, 2, {dtypes.bool_})
_elementwise("logical_not", 1, {dtypes.bool_})
for _name in ("is_nan", "is_inf"):
    _elementwise(_name, 1, FLOATS, result=dtypes.bool_,
                 attrs={"detect_positive": Attr(AttrKind.BOOL, True), "detect_negative": Attr(AttrKind.BOOL, True)}
                 if _name == "is_inf" else None)
# mod: the remainder with the divisor's sign (Python's %), or with fmod the dividend's (C's fmod).
_elementwise("mod", 2, NUMERIC, attrs={"fmod": Attr(AttrKind.BOOL, False)})
# bit_shift: a shift by a negative amount or by the width or more gives 0 (-1 for a
# negative value shifted right); signed values shift left as their unsigned bits.
_elementwise("bit_shift", 2, dtypes.INTEGERS, attrs={"left": Attr(AttrKind.BOOL, True)})
# Bitwise operations on integers, signed ones as their two's-complement bits.
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _elementwise(_name, 2, dtypes.INTEGERS)
_elementwise("bitwise_not", 1, dtypes.INTEGERS)


@define("where", types=Types("condition: bool, x: T, y: T -> T", T=dtypes.ANY))
def _where(inputs, attrs):
    """where(condition, x, y): x where condition holds, else y, all broadcast together."""
    cond, x, y = inputs
    return [TensorSpec(broadcast(cond.shape, x.shape, y.shape), x.dtype)]


@define("cast", attrs={"dtype": Attr(AttrKind.DTYPE)}, types=Types("x: any -> dtype"))
def _cast(inputs, attrs):
    """Convert elements to `dtype` (floats to ints truncate toward zero)."""
    return [TensorSpec(inputs[0].shape, attrs["dtype"])]


@define("bitcast", attrs={"dtype": Attr(AttrKind.DTYPE)}, types=Types("x: any -> dtype"))
def _bitcast(inputs, attrs):
    """The bits of each element read as `dtype`, of the same width (ONNX's BitCast)."""
    x, dt = inputs[0], attrs["dtype"]
    if x.dtype.itemsize != dt.itemsize:
        same = {d for d in dtypes.ALL if d.itemsize == dt.itemsize}
        raise GraphError(f"bitcast: x: dtype {dtypes.name(x.dtype)} not supported; expected "
                         f"{dtype_names(same)} (the {8 * dt.itemsize} bits of {dtypes.name(dt)})")
    return [TensorSpec(x.shape, dt)]


def _swap_last(shape, swap):
    return shape[:-2] + (shape[-1], shape[-2]) if swap and len(shape) >= 2 else shape


def _matmul_flops(inputs, outputs, attrs):
    a = inputs[0]
    inner = a.shape[-2] if attrs["transpose_a"] and a.rank >= 2 else a.shape[-1]
    return 2 * inner * int(np.prod(outputs[0].shape, dtype=np.int64))


@define("matmul", types=Types("a: T, b: T -> T", T=WIDENED), flops=_matmul_flops,
        attrs={"transpose_a": Attr(AttrKind.BOOL, False), "transpose_b": Attr(AttrKind.BOOL, False),
               "activation": activation_attr()})
def _matmul(inputs, attrs):
    """Batched matrix product with numpy's matmul rules; transpose_* swap the last two axes."""
    a, b = inputs
    check_activation("matmul", attrs)
    if a.rank == 0 or b.rank == 0:
        raise GraphError(f"matmul: operands must have rank >= 1, got {fmt(a.shape)} and {fmt(b.shape)}")
    sa, sb = _swap_last(a.shape, attrs["transpose_a"]), _swap_last(b.shape, attrs["transpose_b"])
    k_a, k_b = sa[-1], sb[0] if len(sb) == 1 else sb[-2]
    if k_a is not None and k_b is not None and k_a != k_b:
        raise GraphError(f"matmul: inner dimensions differ: a {fmt(sa)} and b {fmt(sb)}")
    rows = sa[-2:-1] if len(sa) > 1 else ()
    cols = sb[-1:] if len(sb) > 1 else ()
    return [TensorSpec(broadcast(sa[:-2], sb[:-2]) + rows + cols, a.dtype)]


@define("det", types=Types("x: T -> T", T=FLOATS))
def _det(inputs, attrs):
    """Determinants of the square matrices in the last two axes (ONNX's Det): (*, M, M) -> (*)."""
    x = inputs[0]
    if x.rank < 2 or (None not in x.shape[-2:] and x.shape[-2] != x.shape[-1]):
        raise GraphError(f"det: input must be (*, M, M), square in its last two axes, got {fmt(x.shape)}")
    return [TensorSpec(x.shape[:-2], x.dtype)]


# -- gradients -----------------------------------------------------------------------------

@gradient("add")
def _add_grad(g, op, grads):
    dy = activation_gradient(g, op, grads[0])
    return [g.sum_to(dy, op.inputs[0]), g.sum_to(dy, op.inputs[1])]


@gradient("sub")
def _sub_grad(g, op, grads):
    return [g.sum_to(grads[0], op.inputs[0]), g.sum_to(g("neg", grads[0]), op.inputs[1])]


@gradient("mul")
def _mul_grad(g, op, grads):
    a, b = op.inputs
    return [g.sum_to(g("mul", grads[0], b), a), g.sum_to(g("mul", grads[0], a), b)]


@gradient("div")
def _div_grad(g, op, grads):
    a, b = op.inputs
    da = g("div", grads[0], b)
    return [g.sum_to(da, a), g.sum_to(g("neg", g("mul", da, op.outputs[0])), b)]


@gradient("pow")
def _pow_grad(g, op, grads):
    (a, b), y, dy = op.inputs, op.outputs[0], grads[0]
    da = g("mul", dy, g("mul", b, g("pow", a, g("sub", b, g.constant(1, b)))))
    # d/db a^b = a^b log a, taken as 0 where a <= 0 (no real logarithm), as TensorFlow does.
    positive = g("greater", a, g.constant(0, a))
    log_a = g("log", g("where", positive, a, g.constant(1, a)))
    db = g("mul", dy, g("mul", y, log_a))
    return [g.sum_to(da, a), g.sum_to(db, b)]


@gradient("neg")
def _neg_grad(g, op, grads):
    return [g("neg", grads[0])]


@gradient("abs")
def _abs_grad(g, op, grads):
    x, dy = op.inputs[0], grads[0]
    zero = g.constant(0, x)
    signed = g("where", g("less", x, zero), g("neg", dy), dy)
    return [g("where", g("equal", x, zero), zero, signed)]


@gradient("exp")
def _exp_grad(g, op, grads):
    return [g("mul", grads[0], op.outputs[0])]


@gradient("log")
def _log_grad(g, op, grads):
    return [g("div", grads[0], op.inputs[0])]


@gradient("sqrt")
def _sqrt_grad(g, op, grads):
    return [g("div", grads[0], g("mul", op.outputs[0], g.constant(2, op.outputs[0])))]


@gradient("sigmoid")
def _sigmoid_grad(g, op, grads):
    y = op.outputs[0]
    return [g("mul", grads[0], g("mul", y, g("sub", g.constant(1, y), y)))]


@gradient("tanh")
def _tanh_grad(g, op, grads):
    y = op.outputs[0]
    return [g("mul", grads[0], g("sub", g.constant(1, y), g("mul", y, y)))]


def _select_grad(g, op, grads, pick_a):
    """maximum/minimum: the gradient goes to the chosen operand (to a on ties)."""
    a, b = op.inputs
    zero = g.constant(0, grads[0])
    return [g.sum_to(g("where", pick_a, grads[0], zero), a),
            g.sum_to(g("where", pick_a, zero, grads[0]), b)]


def _not(g, cond):
    return g("equal", cond, g.constant(False, cond))


@gradient("maximum")
def _maximum_grad(g, op, grads):
    return _select_grad(g, op, grads, _not(g, g("less", *op.inputs)))


@gradient("minimum")
def _minimum_grad(g, op, grads):
    return _select_grad(g, op, grads, _not(g, g("greater", *op.inputs)))


@gradient("where")
def _where_grad(g, op, grads):
    cond, a, b = op.inputs
    zero = g.constant(0, grads[0])
    return [None, g.sum_to(g("where", cond, grads[0], zero), a),
            g.sum_to(g("where", cond, zero, grads[0]), b)]


@gradient("cast")
def _cast_grad(g, op, grads):
    x = op.inputs[0]
    return [g("cast", grads[0], dtype=x.dtype) if x.dtype in dtypes.FLOATS else None]


@gradient("matmul")
def _matmul_grad(g, op, grads):
    (a, b), dy = op.inputs, activation_gradient(g, op, grads[0])
    if a.rank < 2 or b.rank < 2:
        raise GraphError("matmul: gradients need operands of rank >= 2")
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    if not ta and not tb:
        da, db = g("matmul", dy, b, transpose_b=True), g("matmul", a, dy, transpose_a=True)
    elif ta and not tb:
        da, db = g("matmul", b, dy, transpose_b=True), g("matmul", a, dy)
    elif not ta and tb:
        da, db = g("matmul", dy, b), g("matmul", dy, a, transpose_a=True)
    else:
        da = g("matmul", b, dy, transpose_a=True, transpose_b=True)
        db = g("matmul", dy, a, transpose_a=True, transpose_b=True)
    return [g.sum_to(da, a), g.sum_to(db, b)]


# d/dx of each function of TRIG, from x, y = f(x) and dy, with the graph builder g.
TRIG_GRADIENTS = {
    "sin": lambda g, x, y, dy: g("mul", dy, g("cos", x)),
    "cos": lambda g, x, y, dy: g("neg", g("mul", dy, g("sin", x))),
    "tan": lambda g, x, y, dy: g("mul", dy, g("add", g.constant(1, y), g("mul", y, y))),
    "asin": lambda g, x, y, dy: g("div", dy, g("sqrt", g("sub", g.constant(1, x), g("mul", x, x)))),
    "acos": lambda g, x, y, dy: g("neg", g("div", dy, g("sqrt", g("sub", g.constant(1, x), g("mul", x, x))))),
    "atan": lambda g, x, y, dy: g("div", dy, g("add", g.constant(1, x), g("mul", x, x))),
    "sinh": lambda g, x, y, dy: g("mul", dy, g("cosh", x)),
    "cosh": lambda g, x, y, dy: g("mul", dy, g("sinh", x)),
    "asinh": lambda g, x, y, dy: g("div", dy, g("sqrt", g("add", g("mul", x, x), g.constant(1, x)))),
    "acosh": lambda g, x, y, dy: g("div", dy, g("sqrt", g("sub", g("mul", x, x), g.constant(1, x)))),
    "atanh": lambda g, x, y, dy: g("div", dy, g("sub", g.constant(1, x), g("mul", x, x))),
}


def _trig_gradient(name):
    def rule(g, op, grads):
        return [TRIG_GRADIENTS[name](g, op.inputs[0], op.outputs[0], grads[0])]
    return rule


for _name in TRIG:
    gradient(_name)(_trig_gradient(_name))
