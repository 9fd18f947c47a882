"""Pooling nodes (edgeflow/ops/pool.py); global pooling is a reduction (reduce.py). MaxPool's
Indices output is a max_pool_indices op beside max_pool."""
from edgeflow.graph.math_ops import apply

from . import attrs_or_operands, handler, ints
from .conv import window_attrs


@handler("MaxPool", op="max_pool")
def _max_pool(ctx, node):
    x = ctx.input(node, 0)
    attrs = {**window_attrs(node), "kernel_shape": tuple(node.attr("kernel_shape")),
             "ceil_mode": bool(node.attr("ceil_mode", 0))}
    y = apply("max_pool", [x], attrs, name=node.outputs[0] or f"{node.name}/Y")
    if len(node.outputs) < 2 or not node.outputs[1]:
        return y
    indices = apply("max_pool_indices", [x], {**attrs, "storage_order": bool(node.attr("storage_order", 0))},
                    name=node.outputs[1])
    return [y, indices]


@handler("AveragePool", op="avg_pool")
def _avg_pool(ctx, node):
    return apply("avg_pool", [ctx.input(node, 0)], {
        **window_attrs(node), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0)),
        "count_include_pad": bool(node.attr("count_include_pad", 0))}, name=node.outputs[0])


@handler("LpPool", op="lp_pool")
def _lp_pool(ctx, node):
    return apply("lp_pool", [ctx.input(node, 0)], {
        **window_attrs(node), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0)), "p": node.attr("p", 2)}, name=node.outputs[0])


@handler("MaxUnpool", op="max_unpool")
def _max_unpool(ctx, node):
    attrs = {k: tuple(node.attr(k)) for k in ("strides", "pads") if k in node.attrs}
    known, operands = attrs_or_operands(ctx, node, {"output_shape": (2, ints)})
    attrs.update(known)
    return apply("max_unpool", [ctx.input(node, 0), ctx.input(node, 1), *operands],
                 {**attrs, "kernel_shape": tuple(node.attr("kernel_shape"))}, name=node.outputs[0])
