"""Pooling nodes (edgeflow/ops/pool.py); global pooling is a reduction (reduce.py)."""
from edgeflow.graph.math_ops import apply

from . import handler, unsupported
from .conv import window_attrs


@handler("MaxPool", op="max_pool")
def _max_pool(ctx, node):
    if len([o for o in node.outputs if o]) > 1:
        raise unsupported(node, "MaxPool's Indices output")
    if node.attr("storage_order", 0):
        raise unsupported(node, "MaxPool with storage_order=1")
    return apply("max_pool", [ctx.input(node, 0)], {
        **window_attrs(node), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0))}, name=node.outputs[0])


@handler("AveragePool", op="avg_pool")
def _avg_pool(ctx, node):
    return apply("avg_pool", [ctx.input(node, 0)], {
        **window_attrs(node), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0)),
        "count_include_pad": bool(node.attr("count_include_pad", 0))}, name=node.outputs[0])
