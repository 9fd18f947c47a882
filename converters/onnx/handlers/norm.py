"""Normalization nodes (edgeflow/ops/norm.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported


@handler("BatchNormalization", op="batch_norm")
def _batch_norm(ctx, node):
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        raise unsupported(node, "BatchNormalization in training mode (inference only)")
    return apply("batch_norm", ctx.inputs(node)[:5], {"epsilon": node.attr("epsilon", 1e-5)},
                 name=node.outputs[0])


@handler("LayerNormalization", op="layer_norm")
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
