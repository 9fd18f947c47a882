"""Activation nodes (edgeflow/ops/activations.py)."""
import math

from edgeflow.graph.math_ops import apply

from . import handler

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
    lo, hi = node.attr("min", -math.inf), node.attr("max", math.inf)
    if ctx.has(node, 1):
        lo = float(ctx.constant(node, 1, "min"))
    if ctx.has(node, 2):
        hi = float(ctx.constant(node, 2, "max"))
    return apply("clip", [x], {"min": lo, "max": hi}, name=node.outputs[0])


@handler("SwiGLU", op="swiglu")
def _swiglu(ctx, node):
    return apply("swiglu", [ctx.input(node, 0), ctx.input(node, 1)], {"alpha": node.attr("alpha", 1.0)},
                 name=node.outputs[0])
