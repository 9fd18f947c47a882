"""Softmax and relu nodes (edgeflow/ops/nn.py)."""
from edgeflow.graph.math_ops import apply

from . import handler, unsupported


def _softmax_axis(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if node.opset < 13 and axis % len(x.shape) != len(x.shape) - 1:
        raise unsupported(node, f"{node.op_type} before opset 13 flattens from axis {axis}")
    return x, axis


@handler("Softmax", op="softmax")
def _softmax(ctx, node):
    x, axis = _softmax_axis(ctx, node)
    return apply("softmax", [x], {"axis": axis}, name=node.outputs[0])


@handler("LogSoftmax", op="log_softmax")
def _log_softmax(ctx, node):
    x, axis = _softmax_axis(ctx, node)
    return apply("log_softmax", [x], {"axis": axis}, name=node.outputs[0])


@handler("Relu", op="relu")
def _relu(ctx, node):
    return apply("relu", [ctx.input(node, 0)], name=node.outputs[0])
