"""Nodes whose output sizes depend on values (edgeflow/ops/select.py)."""
from edgeflow.graph.math_ops import apply

from . import handler


@handler("NonZero", op="nonzero")
def _nonzero(ctx, node):
    return apply("nonzero", [ctx.input(node, 0)], name=node.outputs[0])


@handler("Compress", op="compress")
def _compress(ctx, node):
    return apply("compress", [ctx.input(node, 0), ctx.input(node, 1)], {"axis": node.attr("axis")},
                 name=node.outputs[0])


@handler("Unique", op="unique")
def _unique(ctx, node):
    return list(apply("unique", [ctx.input(node, 0)], {"axis": node.attr("axis"), "sorted": bool(node.attr("sorted", 1))},
                      name=node.outputs[0]))
