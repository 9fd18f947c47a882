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
    attrs, out = {"axes": axes, "keepdims": bool(node.attr("keepdims", 1))}, node.outputs[0]
    if x.dtype == np.bool_ and node.op_type in ("ReduceMax", "ReduceMin"):
        # Any and all (opset 20): edgeflow's reductions are numeric, so reduce 0s and 1s.
        ints = apply("cast", [x], {"dtype": np.dtype(np.uint8)}, name=f"{out}/uint8")
        reduced = apply(_REDUCE[node.op_type], [ints], attrs, name=f"{out}/reduced")
        return apply("cast", [reduced], {"dtype": np.dtype(np.bool_)}, name=out)
    return apply(_REDUCE[node.op_type], [x], attrs, name=out)


@handler("ReduceSumSquare")
def _reduce_sum_square(ctx, node):
    x = ctx.input(node, 0)
    square = apply("mul", [x, x], name=f"{node.outputs[0]}/square")
    return apply("reduce_sum", [square], {"axes": _axes(ctx, node),
                                          "keepdims": bool(node.attr("keepdims", 1))}, name=node.outputs[0])


@handler("ArgMax")
def _argmax(ctx, node):
    attrs = {"axis": node.attr("axis", 0), "keepdims": bool(node.attr("keepdims", 1)),
             "select_last_index": bool(node.attr("select_last_index", 0))}
    return apply("argmax", [ctx.input(node, 0)], attrs, name=node.outputs[0])


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
    ins = [t for t in ctx.inputs(node) if t is not None]
    axis, epsilon = node.attr("axis", -1), node.attr("epsilon", 1e-5)
    y = apply("layer_norm", ins, {"axis": axis, "epsilon": epsilon}, name=node.outputs[0])
    if len([o for o in node.outputs if o]) == 1:
        return y
    return [y, *_layer_norm_statistics(node, ins[0], axis, epsilon)]


def _layer_norm_statistics(node, x, axis, epsilon):
    """LayerNormalization's optional Mean and InvStdDev outputs (kept dims, as ONNX)."""
    names = node.outputs + [""] * (3 - len(node.outputs))
    mean_name, inv_name = names[1] or f"{node.name}/mean", names[2] or f"{node.name}/inv_std_dev"
    reduce = {"axes": tuple(range(axis % len(x.shape), len(x.shape))), "keepdims": True}
    mean = apply("reduce_mean", [x], reduce, name=mean_name)
    centered = apply("sub", [x, mean], name=f"{inv_name}/centered")
    variance = apply("reduce_mean", [apply("mul", [centered, centered], name=f"{inv_name}/square")],
                     reduce, name=f"{inv_name}/variance")
    std = apply("sqrt", [apply("add", [variance, np.array(epsilon, x.dtype)], name=f"{inv_name}/eps")],
                name=f"{inv_name}/std")
    return [mean, apply("div", [np.array(1, x.dtype), std], name=inv_name)]
