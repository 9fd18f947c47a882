"""Softmax, Hardmax, relu and LRN nodes (edgeflow/ops/nn.py)."""
from edgeflow.graph.math_ops import apply

from . import handler, unsupported


def _softmax_axis(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if node.opset < 13 and axis % len(x.shape) != len(x.shape) - 1:
        raise unsupported(node, f"{node.op_type} before opset 13 flattens from axis {axis}")
    return x, axis


_ALONG_AXIS = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Hardmax": "hardmax"}


@handler(_ALONG_AXIS)
def _along_axis(ctx, node):
    x, axis = _softmax_axis(ctx, node)
    return apply(_ALONG_AXIS[node.op_type], [x], {"axis": axis}, name=node.outputs[0])


@handler("Relu", op="relu")
def _relu(ctx, node):
    return apply("relu", [ctx.input(node, 0)], name=node.outputs[0])


@handler("LRN", op="lrn")
def _lrn(ctx, node):
    return apply("lrn", [ctx.input(node, 0)], {
        "size": node.attr("size"), "alpha": float(node.attr("alpha", 1e-4)),
        "beta": float(node.attr("beta", 0.75)), "bias": float(node.attr("bias", 1.0))}, name=node.outputs[0])
