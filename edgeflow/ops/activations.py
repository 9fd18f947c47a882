"""Pointwise activation functions, as ONNX defines them (Clip, LeakyRelu, Gelu, Erf, ...)."""
import math

from .. import dtypes
from ..errors import GraphError
from .dims import broadcast, fmt, one_shape
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient

_F = AttrKind.FLOAT


# name -> (attributes, formula); each takes one float tensor (or those of _TAKES) and keeps
# its shape and dtype.
FLOAT_ACTIVATIONS = {
    "leaky_relu": ({"alpha": Attr(_F, 0.01)}, "x if x >= 0 else alpha * x"),
    "hard_sigmoid": ({"alpha": Attr(_F, 0.2), "beta": Attr(_F, 0.5)},
                     "max(0, min(1, alpha * x + beta))"),
    "hard_swish": ({}, "x * max(0, min(1, x / 6 + 1 / 2))"),
    "gelu": ({"approximate": Attr(AttrKind.STRING, "none")},
             "x / 2 * (1 + erf(x / sqrt(2))); approximate='tanh': "
             "x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))"),
    "erf": ({}, "the error function, 2 / sqrt(pi) * integral of exp(-t ** 2) from 0 to x"),
    "softplus": ({}, "log(1 + exp(x))"),
    "elu": ({"alpha": Attr(_F, 1.0)}, "x if x > 0 else alpha * (exp(x) - 1)"),
    # ONNX's defaults: the float32 roundings of SELU's self-normalizing constants.
    "selu": ({"alpha": Attr(_F, 1.67326319217681884765625), "gamma": Attr(_F, 1.05070102214813232421875)},
             "gamma * (x if x > 0 else alpha * (exp(x) - 1))"),
    "celu": ({"alpha": Attr(_F, 1.0)}, "max(0, x) + min(0, alpha * (exp(x / alpha) - 1))"),
    "softsign": ({}, "x / (1 + |x|)"),
    "mish": ({}, "x * tanh(softplus(x))"),
    "thresholded_relu": ({"alpha": Attr(_F, 1.0)}, "x if x > alpha else 0"),
    "shrink": ({"lambd": Attr(_F, 0.5), "bias": Attr(_F, 0.0)},
               "x - bias if x > lambd, x + bias if x < -lambd, else 0"),
    "swish": ({"alpha": Attr(_F, 1.0)}, "x * sigmoid(alpha * x)"),
}
GELU_APPROXIMATIONS = ("none", "tanh")


def _float_activation(name, formula):
    def infer(inputs, attrs):
        if name == "gelu" and attrs["approximate"] not in GELU_APPROXIMATIONS:
            raise GraphError(f"gelu: approximate must be one of {GELU_APPROXIMATIONS}, "
                             f"got {attrs['approximate']!r}")
        return [TensorSpec(inputs[0].shape, inputs[0].dtype)]
    infer.__doc__ = f"{name}(x) = {formula}, elementwise."
    return infer


# ONNX's Shrink takes integers too (computed in float64, truncated back as ONNX's reference does);
# all take bfloat16 (computed in float32).
_TAKES = {"shrink": dtypes.NUMERIC}
for _name, (_attrs, _formula) in FLOAT_ACTIVATIONS.items():
    define(_name, attrs=_attrs, types=Types("x: T -> T", T=_TAKES.get(_name, dtypes.FLOATS) | {dtypes.bfloat16}))(
        _float_activation(_name, _formula))


@define("prelu", types=Types("x: T, slope: T -> T", T=dtypes.FLOATS | {dtypes.bfloat16}))
def _prelu(inputs, attrs):
    """x if x >= 0 else slope * x, elementwise; slope broadcasts to x's shape (ONNX's PRelu,
    TFLite's PRELU): a per-channel slope is (C, 1, 1) in NCHW."""
    x, slope = inputs
    if len(slope.shape) > len(x.shape) or broadcast(x.shape, slope.shape) != tuple(x.shape):
        raise GraphError(f"prelu: the slope {fmt(slope.shape)} must broadcast to x {fmt(x.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


@gradient("prelu")
def _prelu_grad(g, op, grads):
    """dx = dy where x >= 0, slope * dy elsewhere; dslope = the sum of dy * min(x, 0) over
    the dimensions the slope broadcast along."""
    (x, slope), dy = op.inputs, grads[0]
    negative = g("less", x, g.constant(0, x))
    return [g("where", negative, g("mul", dy, slope), dy),
            g.sum_to(g("mul", dy, g("minimum", x, g.constant(0, x))), slope)]


@define("swiglu", attrs={"alpha": Attr(_F, 1.0)}, types=Types("a: T, b: T -> T", T=dtypes.FLOATS))
def _swiglu(inputs, attrs):
    """swish(a) * b = a * sigmoid(alpha * a) * b, elementwise (ONNX's SwiGLU: a and b of one
    shape, no broadcasting)."""
    a, b = inputs
    return [TensorSpec(one_shape("swiglu", a, b, ("a", "b")), a.dtype)]


@define("clip", attrs={"min": Attr(_F, -math.inf), "max": Attr(_F, math.inf)},
        types=Types("x: T, min: T?, max: T? -> T", T=dtypes.NUMERIC), operands=("min", "max"),
        unknown=lambda own, attrs, operands: [TensorSpec(own[0].shape, own[0].dtype)])
def _clip(inputs, attrs):
    """min(max(x, min), max), elementwise; all elements become `max` if min > max.

    Integer inputs need integer (or infinite) bounds; bounds past the dtype's range
    clip nothing there.
    """
    x = inputs[0]
    for key in ("min", "max"):
        bound = attrs[key]
        if math.isnan(bound):
            raise GraphError(f"clip: {key} is NaN")
        if x.dtype in dtypes.INTEGERS and math.isfinite(bound) and bound != int(bound):
            raise GraphError(f"clip: {key} {bound} is not an integer, but the input is {x.dtype}")
    return [TensorSpec(x.shape, x.dtype)]


# -- gradients -----------------------------------------------------------------------------

@gradient("clip")
def _clip_grad(g, op, grads):
    """dy inside [min, max] (bounds included), 0 outside; 0 everywhere if min > max."""
    x, dy = op.inputs[0], grads[0]
    low, high = op.attrs["min"], op.attrs["max"]
    if low > high:
        return [g.zeros_like(x)]
    if low == -math.inf and high == math.inf:
        return [dy]
    return [g("clip_grad", dy, x, min=low, max=high)]


@define("clip_grad", attrs={"min": Attr(_F, -math.inf), "max": Attr(_F, math.inf)},
        types=Types("dy: T, x: T -> T", T=dtypes.FLOATS))
def _clip_grad_op(inputs, attrs):
    """clip's gradient, one pass (ReLU6's in a train step, as TensorFlow's Relu6Grad): dy
    where min <= x <= max, 0 where x is outside (a NaN x passes dy, as clip passes NaN)."""
    dy, x = inputs
    return [TensorSpec(one_shape("clip_grad", dy, x, ("dy", "x")), dy.dtype)]


@gradient("clip_grad")
def _clip_grad_grad(g, op, grads):
    """Linear in dy, with the same mask; x's gradient is 0 wherever it exists."""
    return [g("clip_grad", grads[0], op.inputs[1], min=op.attrs["min"], max=op.attrs["max"]), None]


@gradient("leaky_relu")
def _leaky_relu_grad(g, op, grads):
    x, dy = op.inputs[0], grads[0]
    negative = g("less", x, g.constant(0, x))
    return [g("where", negative, g("mul", dy, g.constant(op.attrs["alpha"], x)), dy)]


@gradient("hard_sigmoid")
def _hard_sigmoid_grad(g, op, grads):
    """alpha * dy where the output is strictly inside (0, 1)."""
    y, dy = op.outputs[0], grads[0]
    zero = g.constant(0, y)
    slope = g("mul", dy, g.constant(op.attrs["alpha"], y))
    slope = g("where", g("greater", y, zero), slope, zero)
    return [g("where", g("less", y, g.constant(1, y)), slope, zero)]


@gradient("hard_swish")
def _hard_swish_grad(g, op, grads):
    """x / 3 + 1 / 2 on (-3, 3), 0 below, 1 above."""
    x, dy = op.inputs[0], grads[0]
    slope = g("add", g("div", x, g.constant(3, x)), g.constant(0.5, x))
    slope = g("where", g("greater", x, g.constant(3, x)), g.constant(1, x), slope)
    slope = g("where", g("less", x, g.constant(-3, x)), g.constant(0, x), slope)
    return [g("mul", dy, slope)]


def _gaussian(g, x, scale):
    """scale * exp(-x ** 2 / 2)."""
    return g("mul", g("exp", g("mul", g("mul", x, x), g.constant(-0.5, x))), g.constant(scale, x))


@gradient("gelu")
def _gelu_grad(g, op, grads):
    x, dy = op.inputs[0], grads[0]
    half, one = g.constant(0.5, x), g.constant(1, x)
    if op.attrs["approximate"] == "tanh":
        # d/dx x/2 (1 + tanh u) = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) u', u = c (x + a x^3)
        c, a = math.sqrt(2 / math.pi), 0.044715
        x2 = g("mul", x, x)
        u = g("mul", g("add", x, g("mul", g("mul", x2, x), g.constant(a, x))), g.constant(c, x))
        du = g("mul", g("add", one, g("mul", x2, g.constant(3 * a, x))), g.constant(c, x))
        t = g("tanh", u)
        outer = g("mul", g("add", one, t), half)
        inner = g("mul", g("mul", g("mul", x, half), g("sub", one, g("mul", t, t))), du)
        return [g("mul", dy, g("add", outer, inner))]
    # Phi(x) + x phi(x): the normal distribution function and density.
    cdf = g("mul", g("add", one, g("erf", g("mul", x, g.constant(math.sqrt(0.5), x)))), half)
    return [g("mul", dy, g("add", cdf, g("mul", x, _gaussian(g, x, 1 / math.sqrt(2 * math.pi)))))]


@gradient("erf")
def _erf_grad(g, op, grads):
    x = op.inputs[0]
    return [g("mul", grads[0], _gaussian(g, g("mul", x, g.constant(math.sqrt(2), x)), 2 / math.sqrt(math.pi)))]


@gradient("softplus")
def _softplus_grad(g, op, grads):
    return [g("mul", grads[0], g("sigmoid", op.inputs[0]))]


def _exponential_grad(g, op, dy, gamma):
    """gamma * dy for x > 0, else dy * (y + gamma * alpha) = dy * gamma * alpha * exp(x)."""
    x, y = op.inputs[0], op.outputs[0]
    below = g("mul", dy, g("add", y, g.constant(gamma * op.attrs["alpha"], y)))
    above = dy if gamma == 1 else g("mul", dy, g.constant(gamma, y))
    return [g("where", g("greater", x, g.constant(0, x)), above, below)]


@gradient("elu")
def _elu_grad(g, op, grads):
    return _exponential_grad(g, op, grads[0], 1.0)


@gradient("selu")
def _selu_grad(g, op, grads):
    return _exponential_grad(g, op, grads[0], op.attrs["gamma"])


def _where_x(g, op, dy, test, threshold):
    """dy where `test`(x, threshold) holds, else 0: the gradient of a piecewise-linear
    function of slope 1 or 0."""
    x = op.inputs[0]
    return [g("where", test(x, g.constant(threshold, x)), dy, g.constant(0, x))]


@gradient("thresholded_relu")
def _thresholded_relu_grad(g, op, grads):
    return _where_x(g, op, grads[0], lambda x, t: g("greater", x, t), op.attrs["alpha"])


@gradient("shrink")
def _shrink_grad(g, op, grads):
    return _where_x(g, op, grads[0], lambda x, t: g("greater", g("abs", x), t), op.attrs["lambd"])


@gradient("celu")
def _celu_grad(g, op, grads):
    """dy for x > 0, else dy * exp(x / alpha)."""
    x, dy = op.inputs[0], grads[0]
    below = g("mul", dy, g("exp", g("div", x, g.constant(op.attrs["alpha"], x))))
    return [g("where", g("greater", x, g.constant(0, x)), dy, below)]


@gradient("softsign")
def _softsign_grad(g, op, grads):
    """dy / (1 + |x|)^2."""
    x = op.inputs[0]
    d = g("add", g.constant(1, x), g("abs", x))
    return [g("div", grads[0], g("mul", d, d))]


def _swish_slope(g, x, alpha):
    """d/dx x * sigmoid(alpha x) = s + alpha x s (1 - s), s = sigmoid(alpha x); and swish(x)."""
    s = g("sigmoid", g("mul", x, g.constant(alpha, x)))
    ax = g("mul", x, g.constant(alpha, x))
    slope = g("add", s, g("mul", g("mul", ax, s), g("sub", g.constant(1, x), s)))
    return slope, g("mul", x, s)


@gradient("swish")
def _swish_grad(g, op, grads):
    return [g("mul", grads[0], _swish_slope(g, op.inputs[0], op.attrs["alpha"])[0])]


@gradient("swiglu")
def _swiglu_grad(g, op, grads):
    a, b = op.inputs
    slope, swish = _swish_slope(g, a, op.attrs["alpha"])
    return [g("mul", g("mul", grads[0], b), slope), g("mul", grads[0], swish)]


@gradient("mish")
def _mish_grad(g, op, grads):
    """tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x), sp = softplus(x)."""
    x = op.inputs[0]
    t = g("tanh", g("softplus", x))
    slope = g("mul", g("mul", x, g("sub", g.constant(1, x), g("mul", t, t))), g("sigmoid", x))
    return [g("mul", grads[0], g("add", t, slope))]
