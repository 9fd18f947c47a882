"""Splitting, tiling and shapes (edgeflow/ops/shape.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import identity, unsupported
from . import handler


def _split(ctx, op, x_index, axis, sizes):
    rank = ctx.rank(x_index)
    perm = ctx.perm(x_index) or identity(rank)
    axis = int(axis) % rank
    attrs = {"axis": perm.index(axis)}
    if sizes is None:
        attrs["num_outputs"] = len(op.outputs)
    else:
        attrs["sizes"] = tuple(int(s) for s in sizes)
    pieces = apply("split", [ctx.get(x_index, perm)], attrs, name=f"{op.name}/split")
    pieces = pieces if isinstance(pieces, tuple) else (pieces,)
    for out, piece in zip(op.outputs, pieces):
        ctx.set(out, piece, perm, exact=ctx.same_grid(x_index, out))


@handler("SPLIT", op="split")
def _split_op(ctx, op):
    axis = np.asarray(ctx.constant(op, 0, "axis")).reshape(-1)[0]
    _split(ctx, op, op.inputs[1], axis, None)


@handler("SPLIT_V", op="split")
def _split_v(ctx, op):
    sizes = [int(s) for s in np.asarray(ctx.constant(op, 1, "size_splits")).reshape(-1)]
    axis = int(np.asarray(ctx.constant(op, 2, "axis")).reshape(-1)[0])
    if -1 in sizes:
        dim = ctx.tensor_shape(op.inputs[0])[axis]
        if dim is None:
            raise unsupported(op, "a size of -1 along a dynamic axis")
        sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
    _split(ctx, op, op.inputs[0], axis, sizes)


@handler("TILE", op="tile")
def _tile(ctx, op):
    repeats = np.asarray(ctx.constant(op, 1, "multiples"), np.int64).reshape(-1)
    i = op.inputs[0]
    perm = ctx.perm(i) or identity(ctx.rank(i))
    y = apply("tile", [ctx.get(i, perm), repeats[list(perm)]], name=f"{op.name}/tile")
    ctx.set(op.outputs[0], y, perm, exact=True)


@handler("BROADCAST_TO", op="expand")
def _broadcast_to(ctx, op):
    shape = np.asarray(ctx.constant(op, 1, "shape"), np.int64).reshape(-1)
    y = apply("expand", [ctx.get(op.inputs[0]), shape], name=f"{op.name}/broadcast_to")
    ctx.set(op.outputs[0], y, exact=True)


@handler("SHAPE", op="shape")
def _shape(ctx, op):
    y = apply("shape", [ctx.get(op.inputs[0])], name=f"{op.name}/shape")
    dtype = np.dtype(op.output_tensor().dtype)
    if y.dtype != dtype:
        y = apply("cast", [y], {"dtype": dtype}, name=f"{op.name}/cast")
    ctx.set(op.outputs[0], y)


@handler("RANGE", op="range")
def _range(ctx, op):
    ins = [ctx.get(i) for i in op.inputs[:3]]
    ctx.set(op.outputs[0], apply("range", ins, name=f"{op.name}/range"))


@handler("FILL", op="expand")
def _fill(ctx, op):
    shape = np.asarray(ctx.constant(op, 0, "dims"), np.int64).reshape(-1)
    y = apply("expand", [ctx.get(op.inputs[1]), shape], name=f"{op.name}/fill")
    ctx.set(op.outputs[0], y)
