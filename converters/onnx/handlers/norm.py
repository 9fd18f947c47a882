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


def _per_group(x, groups, epsilon, out):
    """x (N, C, ...) normalized over each group of C / `groups` channels and their
    spatial positions: layer_norm of x seen as (N, groups, everything else)."""
    grouped = apply("reshape", [x, np.array([0, groups, -1], np.int64)], {"copy_zeros": True},
                    name=f"{out}/grouped")
    normalized = apply("layer_norm", [grouped, np.ones((), x.dtype)], {"axis": 2, "epsilon": epsilon},
                       name=f"{out}/normalized")
    return apply("reshape", [normalized, apply("shape", [x], name=f"{out}/shape")], name=f"{out}/ungrouped")


def _affine(y, scale, bias, axis_count, out):
    """y * scale + bias, scale and bias (vectors) along axis 1 of y, whose rank is axis_count + 1."""
    along = {"axes": tuple(range(1, axis_count))}
    if along["axes"]:
        scale = apply("expand_dims", [scale], along, name=f"{out}/scale")
        bias = apply("expand_dims", [bias], along, name=f"{out}/bias")
    return apply("add", [apply("mul", [y, scale], name=f"{out}/scaled"), bias], name=out)


@handler("InstanceNormalization", op="layer_norm")
def _instance_norm(ctx, node):
    """Each channel of each sample normalized over its spatial positions, then scaled."""
    x, scale, bias = ctx.inputs(node)[:3]
    channels, out = x.shape[1], node.outputs[0]
    if channels is None:
        raise unsupported(node, "InstanceNormalization with an unknown channel count")
    y = _per_group(x, channels, node.attr("epsilon", 1e-5), out)
    return _affine(y, scale, bias, x.rank - 1, out)


@handler("GroupNormalization", op="layer_norm")
def _group_norm(ctx, node):
    """Groups of channels normalized together, then scaled per channel (opset 21; ONNX's
    checker refuses the deprecated opset-18 form, which scaled per group)."""
    x, scale, bias = ctx.inputs(node)[:3]
    out = node.outputs[0]
    y = _per_group(x, node.attr("num_groups"), node.attr("epsilon", 1e-5), out)
    return _affine(y, scale, bias, x.rank - 1, out)
