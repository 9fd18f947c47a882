"""Nodes that read shapes or make tensors from them (edgeflow/ops/shape.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import Sequence, onnx_dtype
from . import attrs_or_operands, handler, ints, unsupported


@handler("Shape", op="shape")
def _shape(ctx, node):
    attrs = {"start": node.attr("start", 0)}
    if "end" in node.attrs:
        attrs["end"] = node.attr("end")
    return apply("shape", [ctx.input(node, 0)], attrs, name=node.outputs[0])


@handler("Size", op="shape")
def _size(ctx, node):
    shape = apply("shape", [ctx.input(node, 0)], name=f"{node.outputs[0]}/shape")
    return apply("reduce_prod", [shape], {"axes": (), "keepdims": False}, name=node.outputs[0])


@handler("ConstantOfShape", op="constant_of_shape")
def _constant_of_shape(ctx, node):
    from onnx import numpy_helper
    tensor = node.attr("value")
    fill = numpy_helper.to_array(tensor) if tensor is not None else np.zeros(1, np.float32)
    dtype = onnx_dtype(tensor.data_type) if tensor is not None else fill.dtype
    return apply("constant_of_shape", [ctx.input(node, 0)],
                 {"value": float(fill.reshape(-1)[0]), "dtype": dtype}, name=node.outputs[0])


@handler("EyeLike", op="eye_like")
def _eye_like(ctx, node):
    x = ctx.input(node, 0)
    dtype = onnx_dtype(node.attr("dtype")) if "dtype" in node.attrs else x.dtype
    return apply("eye_like", [x], {"k": node.attr("k", 0), "dtype": dtype}, name=node.outputs[0])


@handler("Range", op="range")
def _range(ctx, node):
    return apply("range", ctx.inputs(node), name=node.outputs[0])


@handler("Expand", op="expand")
def _expand(ctx, node):
    return apply("expand", [ctx.input(node, 0), ctx.input(node, 1)], name=node.outputs[0])


@handler("Tile", op="tile")
def _tile(ctx, node):
    return apply("tile", [ctx.input(node, 0), ctx.input(node, 1)], name=node.outputs[0])


@handler("Split", op="split")
def _split(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"sizes": (1, ints)})
    attrs["axis"] = node.attr("axis", 0)
    if "split" in node.attrs:  # before opset 13
        attrs["sizes"] = tuple(node.attr("split"))
    elif "sizes" not in attrs:
        attrs["num_outputs"] = node.attr("num_outputs", len(node.outputs))
    outs = apply("split", [ctx.input(node, 0), *operands], attrs, name=node.outputs[0])
    return list(outs) if isinstance(outs, tuple) else [outs]


@handler("SplitToSequence", op="split")
def _split_to_sequence(ctx, node):
    """A sequence of the pieces: the number of pieces must be known while converting."""
    x = ctx.input(node, 0)
    axis = node.attr("axis", 0)
    axis = axis + x.rank if axis < 0 else axis
    dim = x.shape[axis]
    split = ctx.value(node, 1) if ctx.has(node, 1) else None
    if ctx.has(node, 1) and split is None:
        sizes = ctx.input(node, 1)
        if sizes.rank != 1 or sizes.shape[0] is None:
            raise unsupported(node, "split sizes known only when running, and how many: the length of "
                                    "the sequence must be known while converting")
        pieces = apply("split", [x, sizes], {"axis": axis, "num_outputs": sizes.shape[0]}, name=node.outputs[0])
    else:
        if dim is None and (split is None or np.ndim(split) == 0):
            raise unsupported(node, f"splitting dimension {axis} of {x.shape}, known only when running: "
                                    "the length of the sequence must be known while converting")
        if split is None:
            sizes = (1,) * dim
        elif np.ndim(split) == 0:
            size = int(split)
            sizes = (size,) * (dim // size) + ((dim % size,) if dim % size else ())
        else:
            sizes = ints(split)
        pieces = apply("split", [x], {"axis": axis, "sizes": sizes}, name=node.outputs[0])
    pieces = list(pieces) if isinstance(pieces, tuple) else [pieces]
    if not ctx.has(node, 1) and not node.attr("keepdims", 1):
        pieces = [apply("squeeze", [p], {"axes": (axis,)}) for p in pieces]
    return Sequence(pieces)
