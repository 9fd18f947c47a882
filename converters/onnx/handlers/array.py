"""Nodes that move, select or reinterpret elements (edgeflow/ops/array.py). Operands that ONNX
passes as tensors (a target shape, slice bounds, axes) become attributes when they are
constants, and stay operands when they are computed from shapes at run time."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, node_axes, unsupported


@handler("Reshape", op="reshape")
def _reshape(ctx, node):
    x, copy_zeros = ctx.input(node, 0), not node.attr("allowzero", 0)
    shape = ctx.value(node, 1)
    if shape is not None:
        return apply("reshape", [x], {"shape": tuple(int(d) for d in shape), "copy_zeros": copy_zeros},
                     name=node.outputs[0])
    return apply("reshape", [x, ctx.input(node, 1)], {"copy_zeros": copy_zeros}, name=node.outputs[0])


@handler("Flatten", op="reshape")
def _flatten(ctx, node):
    x = ctx.input(node, 0)
    axis = node.attr("axis", 1) % max(len(x.shape), 1) if x.shape else 0
    head, tail = x.shape[:axis], x.shape[axis:]
    if None not in tail:
        shape = (-1, int(np.prod(tail, dtype=np.int64)))
    elif None not in head:
        shape = (int(np.prod(head, dtype=np.int64)), -1)
    else:
        raise unsupported(node, f"Flatten of a shape with unknown dimensions on both sides of "
                                f"axis {axis}: {x.shape}")
    return apply("reshape", [x], {"shape": shape}, name=node.outputs[0])


@handler("Transpose", op="transpose")
def _transpose(ctx, node):
    return apply("transpose", [ctx.input(node, 0)], {"perm": tuple(node.attr("perm", ()))},
                 name=node.outputs[0])


@handler("Concat", op="concat")
def _concat(ctx, node):
    return apply("concat", [t for t in ctx.inputs(node) if t is not None],
                 {"axis": node.attr("axis")}, name=node.outputs[0])


@handler("Squeeze", op="squeeze")
def _squeeze(ctx, node):
    return apply("squeeze", [ctx.input(node, 0)], {"axes": node_axes(ctx, node)}, name=node.outputs[0])


@handler("Unsqueeze", op="expand_dims")
def _unsqueeze(ctx, node):
    return apply("expand_dims", [ctx.input(node, 0)], {"axes": node_axes(ctx, node)}, name=node.outputs[0])


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
        attrs = {n: tuple(int(v) for v in np.asarray(val).reshape(-1)) for n, val in zip(names, values)}
        return apply("slice", [x], attrs, name=node.outputs[0])
    return apply("slice", [x, *operands], name=node.outputs[0])


@handler("Gather", op="gather")
def _gather(ctx, node):
    return apply("gather", [ctx.input(node, 0), ctx.input(node, 1)], {"axis": node.attr("axis", 0)},
                 name=node.outputs[0])
