"""Nodes that build no edgeflow op: Constant (a graph constant), Identity and inference-mode
Dropout (the input itself), and the sequence ops that only rearrange a sequence whose
length is known while converting (a Sequence: a list of tensors)."""
import numpy as np

from edgeflow.errors import ConversionError

from ..context import Sequence, onnx_array
from . import handler, sequence_position, unsupported


@handler({"Identity": None, "Dropout": None})
def _identity(ctx, node):
    if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
        raise unsupported(node, "the mask output of Dropout is not supported (inference only)")
    if node.op_type == "Dropout" and ctx.has(node, 2) and bool(ctx.constant(node, 2, "training_mode")):
        raise unsupported(node, "Dropout in training mode is not supported")
    return ctx.any_input(node, 0)  # Identity passes a sequence on too


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


@handler({"SequenceConstruct": None, "SequenceEmpty": None, "SequenceInsert": None,
          "SequenceErase": None, "SequenceLength": None})
def _sequence(ctx, node):
    from edgeflow.graph.graph import constant
    if node.op_type == "SequenceConstruct":
        items = ctx.inputs(node)
        if len({t.dtype for t in items}) > 1:
            raise ConversionError(f"{node.where()}: the tensors have different dtypes")
        return Sequence(items)
    if node.op_type == "SequenceEmpty":
        return Sequence()
    items = ctx.sequence(node, 0)
    if node.op_type == "SequenceLength":
        return constant(np.int64(len(items)), name=node.outputs[0])
    if node.op_type == "SequenceErase":
        if not items:
            raise ConversionError(f"{node.where()}: erasing from an empty sequence")
        at = sequence_position(ctx, node, 1, len(items), len(items) - 1)
        return Sequence(items[:at] + items[at + 1:])
    tensor = ctx.input(node, 1)
    if items and tensor.dtype != items[0].dtype:
        raise ConversionError(f"{node.where()}: inserting a {tensor.dtype} tensor into a sequence of {items[0].dtype}")
    at = sequence_position(ctx, node, 2, len(items), len(items), extra=1)
    return Sequence(items[:at] + [tensor] + items[at:])
