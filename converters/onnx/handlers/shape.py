"""Nodes that reshape, select or make tensors. Operands that ONNX passes as tensors
(a target shape, slice bounds, axes) become attributes when they are constants, and
stay operands when they are computed from shapes at run time."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported


@handler("Reshape")
def _reshape(ctx, node):
    x, copy_zeros = ctx.input(node, 0), not node.attr("allowzero", 0)
    shape = ctx.value(node, 1)
    if shape is not None:
        return apply("reshape", [x], {"shape": tuple(int(d) for d in shape), "copy_zeros": copy_zeros},
                     name=node.outputs[0])
    return apply("reshape", [x, ctx.input(node, 1)], {"copy_zeros": copy_zeros}, name=node.outputs[0])


@handler("Flatten")
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


@handler("Transpose")
def _transpose(ctx, node):
    return apply("transpose", [ctx.input(node, 0)], {"perm": tuple(node.attr("perm", ()))},
                 name=node.outputs[0])


@handler("Concat")
def _concat(ctx, node):
    return apply("concat", [t for t in ctx.inputs(node) if t is not None],
                 {"axis": node.attr("axis")}, name=node.outputs[0])


def _axes(ctx, node, index=1):
    """Axes given as an attribute (older opsets) or as constant input `index`."""
    if ctx.has(node, index):
        return ctx.ints(node, index, "axes")
    return tuple(node.attr("axes", ()))


@handler("Squeeze")
def _squeeze(ctx, node):
    return apply("squeeze", [ctx.input(node, 0)], {"axes": _axes(ctx, node)}, name=node.outputs[0])


@handler("Unsqueeze")
def _unsqueeze(ctx, node):
    return apply("expand_dims", [ctx.input(node, 0)], {"axes": _axes(ctx, node)}, name=node.outputs[0])


@handler("Slice")
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


@handler("Gather")
def _gather(ctx, node):
    return apply("gather", [ctx.input(node, 0), ctx.input(node, 1)], {"axis": node.attr("axis", 0)},
                 name=node.outputs[0])


@handler("Shape")
def _shape(ctx, node):
    attrs = {"start": node.attr("start", 0)}
    if "end" in node.attrs:
        attrs["end"] = node.attr("end")
    return apply("shape", [ctx.input(node, 0)], attrs, name=node.outputs[0])


@handler("Size")
def _size(ctx, node):
    shape = apply("shape", [ctx.input(node, 0)], name=f"{node.outputs[0]}/shape")
    return apply("reduce_prod", [shape], {"axes": (), "keepdims": False}, name=node.outputs[0])


@handler("ConstantOfShape")
def _constant_of_shape(ctx, node):
    from onnx import numpy_helper
    fill = numpy_helper.to_array(node.attr("value")) if "value" in node.attrs else np.zeros(1, np.float32)
    return apply("constant_of_shape", [ctx.input(node, 0)],
                 {"value": float(fill.reshape(-1)[0]), "dtype": fill.dtype}, name=node.outputs[0])


@handler("Range")
def _range(ctx, node):
    return apply("range", ctx.inputs(node), name=node.outputs[0])


@handler("Expand")
def _expand(ctx, node):
    return apply("expand", [ctx.input(node, 0), ctx.input(node, 1)], name=node.outputs[0])


@handler("Tile")
def _tile(ctx, node):
    return apply("tile", [ctx.input(node, 0), ctx.input(node, 1)], name=node.outputs[0])


@handler("Split")
def _split(ctx, node):
    attrs = {"axis": node.attr("axis", 0)}
    if ctx.has(node, 1):
        attrs["sizes"] = ctx.ints(node, 1, "split")
    elif "split" in node.attrs:
        attrs["sizes"] = tuple(node.attr("split"))
    else:
        attrs["num_outputs"] = node.attr("num_outputs", len(node.outputs))
    outs = apply("split", [ctx.input(node, 0)], attrs, name=node.outputs[0])
    return list(outs) if isinstance(outs, tuple) else [outs]
