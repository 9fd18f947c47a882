"""Normalization, softmax, reduction and selection nodes."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported
from .shape import _axes


def _softmax_axis(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis", -1 if node.opset >= 13 else 1)
    if node.opset < 13 and axis % len(x.shape) != len(x.shape) - 1:
        raise unsupported(node, f"{node.op_type} before opset 13 flattens from axis {axis}")
    return x, axis


@handler("Softmax")
def _softmax(ctx, node):
    x, axis = _softmax_axis(ctx, node)
    return apply("softmax", [x], {"axis": axis}, name=node.outputs[0])


@handler("LogSoftmax")
def _log_softmax(ctx, node):
    x, axis = _softmax_axis(ctx, node)
    return apply("log_softmax", [x], {"axis": axis}, name=node.outputs[0])


_REDUCE = {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL2": "reduce_l2"}


@handler(*_REDUCE)
def _reduce(ctx, node):
    x = ctx.input(node, 0)
    axes = _axes(ctx, node)
    if not axes and node.attr("noop_with_empty_axes", 0):
        return x
    return apply(_REDUCE[node.op_type], [x], {"axes": axes, "keepdims": bool(node.attr("keepdims", 1))},
                 name=node.outputs[0])


@handler("ReduceSumSquare")
def _reduce_sum_square(ctx, node):
    x = ctx.input(node, 0)
    square = apply("mul", [x, x], name=f"{node.outputs[0]}/square")
    return apply("reduce_sum", [square], {"axes": _axes(ctx, node),
                                          "keepdims": bool(node.attr("keepdims", 1))}, name=node.outputs[0])


@handler("ArgMax")
def _argmax(ctx, node):
    if node.attr("select_last_index", 0):
        raise unsupported(node, "ArgMax with select_last_index=1")
    return apply("argmax", [ctx.input(node, 0)], {"axis": node.attr("axis", 0),
                                                  "keepdims": bool(node.attr("keepdims", 1))},
                 name=node.outputs[0])


@handler("CumSum")
def _cumsum(ctx, node):
    axis = int(np.asarray(ctx.constant(node, 1, "axis")).reshape(()))
    return apply("cumsum", [ctx.input(node, 0)], {"axis": axis, "exclusive": bool(node.attr("exclusive", 0)),
                                                  "reverse": bool(node.attr("reverse", 0))},
                 name=node.outputs[0])


@handler("TopK")
def _topk(ctx, node):
    k = int(np.asarray(ctx.constant(node, 1, "k")).reshape(-1)[0])
    values, indices = apply("topk", [ctx.input(node, 0)], {
        "k": k, "axis": node.attr("axis", -1), "largest": bool(node.attr("largest", 1)),
        "sorted": bool(node.attr("sorted", 1))}, name=node.outputs[0])
    return [values, indices]


@handler("BatchNormalization")
def _batch_norm(ctx, node):
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        raise unsupported(node, "BatchNormalization in training mode (inference only)")
    return apply("batch_norm", ctx.inputs(node)[:5], {"epsilon": node.attr("epsilon", 1e-5)},
                 name=node.outputs[0])


@handler("LayerNormalization")
def _layer_norm(ctx, node):
    if len([o for o in node.outputs if o]) > 1:
        raise unsupported(node, "LayerNormalization's mean and inv_std_dev outputs")
    ins = [t for t in ctx.inputs(node) if t is not None]
    return apply("layer_norm", ins, {"axis": node.attr("axis", -1), "epsilon": node.attr("epsilon", 1e-5)},
                 name=node.outputs[0])
