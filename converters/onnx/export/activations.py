"""Activation functions (edgeflow/ops/activations.py)."""
import math

import numpy as np

from . import exporter

SAME = {"leaky_relu": "LeakyRelu", "hard_sigmoid": "HardSigmoid", "hard_swish": "HardSwish", "gelu": "Gelu",
        "erf": "Erf", "softplus": "Softplus", "elu": "Elu", "selu": "Selu", "celu": "Celu", "softsign": "Softsign",
        "mish": "Mish", "thresholded_relu": "ThresholdedRelu", "shrink": "Shrink", "swish": "Swish",
        "prelu": "PRelu"}


@exporter
def swiglu(g, op):
    """SwiGLU is opset 28: Swish(a) * b, as its definition."""
    a, b = op.inputs
    g.node("Mul", [g.node("Swish", [a], alpha=op.attrs["alpha"]), b], op.outputs)


def _bound(g, value, dtype, name):
    """A bound of Clip as a constant of x's dtype; "" (no bound) where it clips nothing."""
    if math.isinf(value):
        return ""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            return ""
    return g.const(np.array(value, dtype), name)


@exporter
def clip(g, op):
    dtype = op.input_specs[0].dtype
    bounds = [op.operands.get(key) or _bound(g, op.attrs[key], dtype, key) for key in ("min", "max")]
    while bounds and not bounds[-1]:
        bounds.pop()
    g.node("Clip", op.inputs[:1] + bounds, op.outputs)
