"""Nodes that move, select or reinterpret elements (edgeflow/ops/array.py). Operands that ONNX
passes as tensors (a target shape, slice bounds, axes) become attributes when they are
constants, and stay operands when they are computed from shapes at run time."""
import numpy as np

from edgeflow.graph.graph import constant
from edgeflow.graph.math_ops import apply

from edgeflow.errors import ConversionError

from . import attrs_or_operands, first_int, handler, ints, sequence_position, unsupported


@handler("Reshape", op="reshape")
def _reshape(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"shape": (1, ints)})
    return apply("reshape", [ctx.input(node, 0), *operands],
                 {**attrs, "copy_zeros": not node.attr("allowzero", 0)}, name=node.outputs[0])


@handler("Flatten", op="reshape")
def _flatten(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis", 1)
    axis = axis + len(x.shape) if axis < 0 else axis  # in [-r, r]: axis r flattens all to (n, 1)
    head, tail = x.shape[:axis], x.shape[axis:]
    if None not in tail:
        shape = (-1, int(np.prod(tail, dtype=np.int64)))
    elif None not in head:
        shape = (int(np.prod(head, dtype=np.int64)), -1)
    else:  # (product of the leading dimensions, -1), worked out when a plan is made
        head = apply("slice", [apply("shape", [x])], {"starts": (0,), "ends": (axis,), "axes": (0,)})
        size = apply("reduce_prod", [head], {"axes": (0,), "keepdims": True})
        target = apply("concat", [size, constant(np.array([-1], np.int64))], {"axis": 0})
        return apply("reshape", [x, target], name=node.outputs[0])
    return apply("reshape", [x], {"shape": shape}, name=node.outputs[0])


@handler("Transpose", op="transpose")
def _transpose(ctx, node):
    return apply("transpose", [ctx.input(node, 0)], {"perm": tuple(node.attr("perm", ()))},
                 name=node.outputs[0])


@handler("Concat", op="concat")
def _concat(ctx, node):
    return apply("concat", [t for t in ctx.inputs(node) if t is not None],
                 {"axis": node.attr("axis")}, name=node.outputs[0])


@handler({"Squeeze": "squeeze", "Unsqueeze": "expand_dims"})
def _squeeze_unsqueeze(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"axes": (1, ints)})
    if not (attrs or operands):  # axes as an attribute (before opset 13), or none
        attrs = {"axes": tuple(node.attr("axes", ()))}
    op = "squeeze" if node.op_type == "Squeeze" else "expand_dims"
    return apply(op, [ctx.input(node, 0), *operands], attrs, name=node.outputs[0])


@handler("Slice", op="slice")
def _slice(ctx, node):
    x = ctx.input(node, 0)
    if not (ctx.has(node, 1) and ctx.has(node, 2)):
        raise unsupported(node, "Slice needs starts and ends inputs (opset >= 10)")
    starts, ends, axes, steps = (ctx.input(node, i) for i in range(1, 5))
    if axes is None and steps is not None:
        axes = apply("range", [np.int64(0), apply("shape", [starts]), np.int64(1)],
                     name=f"{node.outputs[0]}/axes")
    operands = [t for t in (starts, ends, axes, steps) if t is not None]
    values = [t.spec.value for t in operands]
    if all(v is not None for v in values):
        names = ("starts", "ends", "axes", "steps")
        attrs = {n: ints(val) for n, val in zip(names, values)}
        return apply("slice", [x], attrs, name=node.outputs[0])
    return apply("slice", [x, *operands], name=node.outputs[0])


@handler("Gather", op="gather")
def _gather(ctx, node):
    return apply("gather", [ctx.input(node, 0), ctx.input(node, 1)], {"axis": node.attr("axis", 0)},
                 name=node.outputs[0])


@handler("SequenceAt", op="gather")
def _sequence_at(ctx, node):
    """The tensor at a constant position; at a position known only when running, a gather
    from the tensors stacked (they must have one shape)."""
    items = ctx.sequence(node, 0)
    if ctx.value(node, 1) is not None:
        return items[sequence_position(ctx, node, 1, len(items), None)]
    if not items or len({t.shape for t in items}) > 1 or None in items[0].shape:
        raise unsupported(node, "a position known only when running, in a sequence whose tensors do not "
                                "all have one known shape: edgeflow has no sequence values")
    stacked = apply("concat", [apply("expand_dims", [t], {"axes": (0,)}) for t in items], {"axis": 0})
    return apply("gather", [stacked, apply("reshape", [ctx.input(node, 1)], {"shape": ()})], {"axis": 0},
                 name=node.outputs[0])


@handler("ConcatFromSequence", op="concat")
def _concat_from_sequence(ctx, node):
    """concat (new_axis 0) or stack (new_axis 1) of a sequence's tensors."""
    items = ctx.sequence(node, 0)
    if not items:
        raise ConversionError(f"{node.where()}: concatenating an empty sequence")
    axis = node.attr("axis")
    if node.attr("new_axis", 0):
        axis = axis + items[0].rank + 1 if axis < 0 else axis
        items = [apply("expand_dims", [t], {"axes": (axis,)}) for t in items]
    return apply("concat", list(items), {"axis": axis}, name=node.outputs[0])


@handler("GatherElements", op="gather_elements")
def _gather_elements(ctx, node):
    return apply("gather_elements", [ctx.input(node, 0), ctx.input(node, 1)], {"axis": node.attr("axis", 0)},
                 name=node.outputs[0])


@handler("GatherND", op="gather_nd")
def _gather_nd(ctx, node):
    return apply("gather_nd", [ctx.input(node, 0), ctx.input(node, 1)],
                 {"batch_dims": node.attr("batch_dims", 0)}, name=node.outputs[0])


# Scatter (opsets 9-10) is ScatterElements without a reduction.
@handler({"ScatterElements": "scatter_elements", "Scatter": "scatter_elements"})
def _scatter_elements(ctx, node):
    return apply("scatter_elements", ctx.inputs(node)[:3],
                 {"axis": node.attr("axis", 0), "reduction": node.attr("reduction", "none")}, name=node.outputs[0])


@handler("ScatterND", op="scatter_nd")
def _scatter_nd(ctx, node):
    return apply("scatter_nd", ctx.inputs(node)[:3], {"reduction": node.attr("reduction", "none")},
                 name=node.outputs[0])


@handler("OneHot", op="one_hot")
def _one_hot(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"depth": (1, first_int)})
    return apply("one_hot", [ctx.input(node, 0), ctx.input(node, 2), *operands],
                 {**attrs, "axis": node.attr("axis", -1)}, name=node.outputs[0])


@handler("Trilu", op="trilu")
def _trilu(ctx, node):
    upper, k = bool(node.attr("upper", 1)), ctx.value(node, 1)
    if k is not None:
        return apply("trilu", [ctx.input(node, 0)], {"upper": upper, "k": int(np.asarray(k).reshape(()))},
                     name=node.outputs[0])
    return apply("trilu", [t for t in ctx.inputs(node)[:2] if t is not None], {"upper": upper},
                 name=node.outputs[0])


@handler("ReverseSequence", op="reverse_sequence")
def _reverse_sequence(ctx, node):
    return apply("reverse_sequence", [ctx.input(node, 0), ctx.input(node, 1)],
                 {"batch_axis": node.attr("batch_axis", 1), "time_axis": node.attr("time_axis", 0)},
                 name=node.outputs[0])


def _blocks(node, x):
    """(N, C, H, W) of DepthToSpace's or SpaceToDepth's input, with C, H and W known."""
    if len(x.shape) != 4 or None in x.shape[1:]:
        raise unsupported(node, f"{node.op_type} needs a 4-D input with known C, H and W, got {x.shape}")
    return x.shape


# DepthToSpace and SpaceToDepth are reshape, transpose, reshape (ONNX's own definition).
@handler("DepthToSpace", op="reshape")
def _depth_to_space(ctx, node):
    x, b, out = ctx.input(node, 0), node.attr("blocksize"), node.outputs[0]
    _, c, h, w = _blocks(node, x)
    if c % (b * b):
        raise unsupported(node, f"DepthToSpace: {c} channels are not a multiple of blocksize {b} squared")
    if node.attr("mode", "DCR") == "DCR":
        split, perm = (0, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    else:  # CRD
        split, perm = (0, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    y = apply("reshape", [x], {"shape": split, "copy_zeros": True}, name=f"{out}/blocks")
    y = apply("transpose", [y], {"perm": perm}, name=f"{out}/moved")
    return apply("reshape", [y], {"shape": (0, c // (b * b), h * b, w * b), "copy_zeros": True}, name=out)


@handler("SpaceToDepth", op="reshape")
def _space_to_depth(ctx, node):
    x, b, out = ctx.input(node, 0), node.attr("blocksize"), node.outputs[0]
    _, c, h, w = _blocks(node, x)
    if h % b or w % b:
        raise unsupported(node, f"SpaceToDepth: {h}x{w} is not a multiple of blocksize {b}")
    y = apply("reshape", [x], {"shape": (0, c, h // b, b, w // b, b), "copy_zeros": True}, name=f"{out}/blocks")
    perm = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)  # CRD: opset 28
    y = apply("transpose", [y], {"perm": perm}, name=f"{out}/moved")
    return apply("reshape", [y], {"shape": (0, c * b * b, h // b, w // b), "copy_zeros": True}, name=out)
