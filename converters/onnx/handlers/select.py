"""Nodes whose output sizes depend on values (edgeflow/ops/select.py)."""
from edgeflow.graph.math_ops import apply

from . import attrs_or_operands, first_float, first_int, handler


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


@handler("NonMaxSuppression", op="non_max_suppression")
def _non_max_suppression(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"max_output_boxes_per_class": (2, first_int),
                                                    "iou_threshold": (3, first_float),
                                                    "score_threshold": (4, first_float)})
    return apply("non_max_suppression", [ctx.input(node, 0), ctx.input(node, 1), *operands],
                 {**attrs, "center_point_box": node.attr("center_point_box", 0)}, name=node.outputs[0])
