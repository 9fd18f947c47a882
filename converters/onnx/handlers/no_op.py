"""Nodes that build no edgeflow op: Constant (a graph constant), Identity and inference-mode
Dropout (the input itself)."""
import numpy as np

from ..context import onnx_array
from . import handler, unsupported


@handler({"Identity": None, "Dropout": None})
def _identity(ctx, node):
    if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
        raise unsupported(node, "the mask output of Dropout is not supported (inference only)")
    if node.op_type == "Dropout" and ctx.has(node, 2) and bool(ctx.constant(node, 2, "training_mode")):
        raise unsupported(node, "Dropout in training mode is not supported")
    return ctx.input(node, 0)


_CONSTANT_KINDS = {"value_float": np.float32, "value_int": np.int64,
                   "value_floats": np.float32, "value_ints": np.int64}


@handler("Constant", op=None)
def _constant(ctx, node):
    from edgeflow.graph.graph import constant
    (attr,) = node.proto.attribute
    if attr.name == "value":
        value = onnx_array(attr.t)
    elif attr.name in _CONSTANT_KINDS:
        value = np.array(node.attr(attr.name), _CONSTANT_KINDS[attr.name])
    else:
        raise unsupported(node, f"Constant given as {attr.name} is not supported")
    return constant(value, name=node.outputs[0])
