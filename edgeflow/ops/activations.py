"""Pointwise activation functions, as ONNX defines them (Clip, LeakyRelu, Gelu, Erf, ...)."""
import math

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, define

_F = AttrKind.FLOAT


def _pointwise(op, x, allowed):
    if x.dtype not in allowed:
        raise GraphError(f"{op}: dtype {x.dtype} not supported; expected one of "
                         f"{', '.join(sorted(d.name for d in allowed))}")
    return [TensorSpec(x.shape, x.dtype)]


# name -> (attributes, formula); each takes one float tensor and keeps its shape and dtype.
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
}
GELU_APPROXIMATIONS = ("none", "tanh")


def _float_activation(name, formula):
    def infer(inputs, attrs):
        if name == "gelu" and attrs["approximate"] not in GELU_APPROXIMATIONS:
            raise GraphError(f"gelu: approximate must be one of {GELU_APPROXIMATIONS}, "
                             f"got {attrs['approximate']!r}")
        return _pointwise(name, inputs[0], dtypes.FLOATS)
    infer.__doc__ = f"{name}(x) = {formula}, elementwise."
    return infer


for _name, (_attrs, _formula) in FLOAT_ACTIVATIONS.items():
    define(_name, inputs=1, attrs=_attrs)(_float_activation(_name, _formula))


@define("clip", inputs=1, attrs={"min": Attr(_F, -math.inf), "max": Attr(_F, math.inf)})
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
    return _pointwise("clip", x, dtypes.FLOATS | dtypes.INTEGERS)
