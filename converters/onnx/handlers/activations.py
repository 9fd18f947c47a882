"""Activation nodes (edgeflow/ops/activations.py)."""
import math

import numpy as np

from edgeflow.graph.math_ops import apply
from edgeflow.graph.nn import prelu

from . import attrs_or_operands, first_float, handler

_UNARY = {"Erf": "erf", "Softplus": "softplus", "HardSwish": "hard_swish", "Softsign": "softsign", "Mish": "mish"}
# ONNX attribute -> edgeflow attribute, for activations that take parameters.
_PARAMETRIC = {"LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
               "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
               "Elu": ("elu", {"alpha": 1.0}),
               "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
               "Gelu": ("gelu", {"approximate": "none"}),
               "Celu": ("celu", {"alpha": 1.0}),
               "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
               "Shrink": ("shrink", {"lambd": 0.5, "bias": 0.0}),
               "Swish": ("swish", {"alpha": 1.0})}
_PARAMETRIC_OPS = {onnx: op for onnx, (op, _) in _PARAMETRIC.items()}


@handler(_UNARY)
def _unary(ctx, node):
    return apply(_UNARY[node.op_type], [ctx.input(node, 0)], name=node.outputs[0])


@handler(_PARAMETRIC_OPS)
def _parametric(ctx, node):
    op, defaults = _PARAMETRIC[node.op_type]
    attrs = {k: node.attr(k, v) for k, v in defaults.items()}
    return apply(op, [ctx.input(node, 0)], attrs, name=node.outputs[0])


@handler("Clip", op="clip")
def _clip(ctx, node):
    x = ctx.input(node, 0)
    if ctx.has(node, 2) and not ctx.has(node, 1) and ctx.value(node, 2) is None:
        # max known only when running, no min: the operands go in order, so min is the lowest value
        lowest = np.array(-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min, x.dtype)
        return apply("clip", [x, lowest, ctx.input(node, 2)], name=node.outputs[0])
    attrs, operands = attrs_or_operands(ctx, node, {"min": (1, first_float), "max": (2, first_float)})
    if not (attrs or operands):  # bounds as attributes (before opset 11)
        attrs = {"min": node.attr("min", -math.inf), "max": node.attr("max", math.inf)}
    return apply("clip", [x, *operands], attrs, name=node.outputs[0])


@handler("SwiGLU", op="swiglu")
def _swiglu(ctx, node):
    return apply("swiglu", [ctx.input(node, 0), ctx.input(node, 1)], {"alpha": node.attr("alpha", 1.0)},
                 name=node.outputs[0])


@handler("PRelu", op="prelu")
def _prelu(ctx, node):
    """x where x >= 0, slope * x elsewhere (slope broadcast to x, as ONNX's function body):
    ef.nn.prelu."""
    return prelu(ctx.input(node, 0), ctx.input(node, 1), name=node.outputs[0])
