"""Einsum nodes (edgeflow/ops/einsum.py)."""
from edgeflow.graph.math_ops import apply

from . import handler


@handler("Einsum", op="einsum")
def _einsum(ctx, node):
    return apply("einsum", ctx.inputs(node), {"equation": node.attr("equation")}, name=node.outputs[0])
