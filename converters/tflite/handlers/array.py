"""Reshaping, joining, slicing and gathering (edgeflow/ops/array.py). Ops whose meaning
depends on the order of elements work in TFLite's layout; the others map their axes
through the input's layout."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import NCHW, drop_axes, identity, inverse, unsupported
from . import axes_of, handler

BIG = 2 ** 62


def _static(op, shape):
    return tuple(-1 if d is None else int(d) for d in shape)


@handler("RESHAPE", op="reshape")
def _reshape(ctx, op):
    if op.has(1) and ctx.array(op.inputs[1]) is not None:
        shape = [int(d) for d in np.asarray(ctx.array(op.inputs[1])).reshape(-1)]
    elif op.option("new_shape"):
        shape = list(op.option("new_shape"))
    else:
        shape = list(_static(op, op.output_tensor().shape))
    i = op.inputs[0]
    y = apply("reshape", [ctx.get(i)], {"shape": tuple(shape)}, name=f"{op.name}/reshape")
    ctx.set(op.outputs[0], y, exact=ctx.same_grid(i, op.outputs[0]))


@handler("SQUEEZE", op="squeeze")
def _squeeze(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    dims = op.option("squeeze_dims") or [a for a, d in enumerate(ctx.tensor_shape(i)) if d == 1]
    axes = axes_of(dims, rank)
    perm = ctx.perm(i) or identity(rank)
    y = apply("squeeze", [ctx.get(i, perm)], {"axes": tuple(perm.index(a) for a in axes)}, name=f"{op.name}/squeeze")
    ctx.set(op.outputs[0], y, drop_axes(perm, axes), exact=True)


@handler("EXPAND_DIMS", op="expand_dims")
def _expand_dims(ctx, op):
    i = op.inputs[0]
    axis = int(np.asarray(ctx.constant(op, 1, "axis")).reshape(-1)[0])
    axis = axis % (ctx.rank(i) + 1)
    y = apply("expand_dims", [ctx.get(i)], {"axes": (axis,)}, name=f"{op.name}/expand_dims")
    ctx.set(op.outputs[0], y, exact=True)


@handler("CONCATENATION", op="concat")
def _concatenation(ctx, op):
    from . import fused
    perm, rank = ctx.common_layout(op.inputs)
    axis = op.option("axis", 0) % rank
    ins = [ctx.get(i, perm) for i in op.inputs]
    y = fused(op, apply("concat", ins, {"axis": perm.index(axis)}, name=f"{op.name}/concat"))
    ctx.set(op.outputs[0], y, perm, exact=all(ctx.same_grid(i, op.outputs[0]) for i in op.inputs))


@handler("TRANSPOSE", op="transpose")
def _transpose(ctx, op):
    """Only a relabelling: the output is the same edgeflow tensor in another layout."""
    i = op.inputs[0]
    rank = ctx.rank(i)
    order = tuple(int(a) % rank for a in np.asarray(ctx.constant(op, 1, "perm")).reshape(-1))
    if sorted(order) != list(range(rank)):
        raise unsupported(op, f"perm {order} of a rank-{rank} tensor")
    if ctx.is_constant(i):
        ctx.set(op.outputs[0], np.ascontiguousarray(np.transpose(ctx.arrays[i], order)))
        return
    v = ctx.value(i)
    # output TFLite axis j is input axis order[j]; the tensor's axis k holds input axis v.perm[k]
    ctx.set(op.outputs[0], v.tensor, tuple(inverse(order)[p] for p in v.perm), exact=True)


def _masks(op, rank, begin, end, strides):
    """Per TFLite input axis (start, end, step) and the axes shrunk and added, from
    STRIDED_SLICE's masks (ellipsis and new axes expanded)."""
    n = len(begin)
    bits = {k: op.option(f"{k}_mask", 0) for k in ("begin", "end", "ellipsis", "new_axis", "shrink_axis")}
    offset = bool(op.option("offset", False))
    specs, new_axes, shrink = [], [], []
    axis = 0  # input axis
    out_axis = 0
    for k in range(n):
        if bits["ellipsis"] >> k & 1:
            fill = rank - (n - k - 1 - sum(bits["new_axis"] >> j & 1 for j in range(k + 1, n))) - axis
            for _ in range(fill):
                specs.append((0, BIG, 1))
                axis += 1
                out_axis += 1
            continue
        if bits["new_axis"] >> k & 1:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        step = int(strides[k])
        if step == 0:
            raise unsupported(op, "a stride of 0")
        start, stop = int(begin[k]), int(end[k])
        if offset:
            stop = start + stop
        if bits["shrink_axis"] >> k & 1:
            stop = start + 1 if start != -1 else BIG
            step = 1
            shrink.append(axis)
        else:
            if bits["begin"] >> k & 1:
                start = 0 if step > 0 else BIG
            if bits["end"] >> k & 1:
                stop = BIG if step > 0 else -BIG
            out_axis += 1
        specs.append((start, stop, step))
        axis += 1
    while axis < rank:
        specs.append((0, BIG, 1))
        axis += 1
    return specs, new_axes, shrink


@handler({"STRIDED_SLICE": "slice", "SLICE": "slice"})
def _strided_slice(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    begin = ctx.integers(op, 1, "begin")
    if op.opcode == "SLICE":
        size = ctx.integers(op, 2, "size")
        specs = [(int(b), BIG if s == -1 else int(b + s), 1) for b, s in zip(begin, size)]
        new_axes, shrink = [], []
    else:
        end = ctx.integers(op, 2, "end")
        strides = ctx.integers(op, 3, "strides") if op.has(3) else np.ones_like(begin)
        specs, new_axes, shrink = _masks(op, rank, begin, end, strides)
    if len(specs) != rank:
        raise unsupported(op, f"{len(specs)} slice specs for a rank-{rank} input")
    perm = (ctx.perm(i) or identity(rank)) if not new_axes else identity(rank)
    x = ctx.get(i, perm)
    axes = [a for a, s in enumerate(specs) if s != (0, BIG, 1)]
    if axes:
        x = apply("slice", [x], {"starts": tuple(specs[a][0] for a in axes), "ends": tuple(specs[a][1] for a in axes),
                                 "axes": tuple(perm.index(a) for a in axes),
                                 "steps": tuple(specs[a][2] for a in axes)}, name=f"{op.name}/slice")
    if shrink:
        x = apply("squeeze", [x], {"axes": tuple(perm.index(a) for a in shrink)}, name=f"{op.name}/shrink")
        perm = drop_axes(perm, shrink)
    if new_axes:
        x = apply("expand_dims", [x], {"axes": tuple(new_axes)}, name=f"{op.name}/new_axes")
        perm = identity(len(x.shape))
    ctx.set(op.outputs[0], x, perm, exact=True)


@handler("GATHER", op="gather")
def _gather(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    axis = op.option("axis", 0) % rank
    if op.option("batch_dims", 0):
        raise unsupported(op, "batch_dims")
    y = apply("gather", [ctx.get(i), ctx.get(op.inputs[1])], {"axis": axis}, name=f"{op.name}/gather")
    ctx.set(op.outputs[0], y, exact=True)


@handler("REVERSE_V2", op="slice")
def _reverse(ctx, op):
    """x reversed along the given axes (litert-torch writes torch.flip so, as in a backward
    GRU): a slice with step -1 over each, in x's layout."""
    i = op.inputs[0]
    perm = ctx.perm(i) or tuple(range(ctx.rank(i)))
    axes = tuple(sorted(perm.index(a) for a in axes_of(ctx.constant(op, 1, "axis"), len(perm))))
    y = ctx.get(i, perm)
    if axes:
        y = apply("slice", [y], {"starts": (-1,) * len(axes), "ends": (-BIG,) * len(axes), "axes": axes,
                                 "steps": (-1,) * len(axes)}, name=f"{op.name}/reverse")
    ctx.set(op.outputs[0], y, perm, exact=True)


@handler("EMBEDDING_LOOKUP", op="gather")
def _embedding_lookup(ctx, op):
    """EMBEDDING_LOOKUP(ids, table): the table's rows at ids (litert-torch's torch.nn.Embedding),
    GATHER along axis 0 with the operands the other way round."""
    table = op.inputs[1]
    y = apply("gather", [ctx.get(table), ctx.get(op.inputs[0])], {"axis": 0}, name=f"{op.name}/lookup")
    ctx.set(op.outputs[0], y, exact=ctx.same_grid(table, op.outputs[0]))


@handler("GATHER_ND", op="gather_nd")
def _gather_nd(ctx, op):
    y = apply("gather_nd", [ctx.get(op.inputs[0]), ctx.get(op.inputs[1])], name=f"{op.name}/gather_nd")
    ctx.set(op.outputs[0], y, exact=True)


@handler("PACK", op="concat")
def _pack(ctx, op):
    rank = ctx.rank(op.inputs[0]) + 1
    axis = op.option("axis", 0) % rank
    ins = [apply("expand_dims", [ctx.get(i)], {"axes": (axis,)}, name=f"{op.name}/item{k}")
           for k, i in enumerate(op.inputs)]
    ctx.set(op.outputs[0], apply("concat", ins, {"axis": axis}, name=f"{op.name}/pack"),
            exact=all(ctx.same_grid(i, op.outputs[0]) for i in op.inputs))


@handler("UNPACK", op="squeeze")
def _unpack(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    axis = op.option("axis", 0) % rank
    perm = ctx.perm(i) or identity(rank)
    x = ctx.get(i, perm)
    pieces = apply("split", [x], {"axis": perm.index(axis), "num_outputs": len(op.outputs)}, name=f"{op.name}/split")
    pieces = pieces if isinstance(pieces, tuple) else (pieces,)
    for k, (out, piece) in enumerate(zip(op.outputs, pieces)):
        y = apply("squeeze", [piece], {"axes": (perm.index(axis),)}, name=f"{op.name}/{k}")
        ctx.set(out, y, drop_axes(perm, [axis]), exact=True)


def _blocks(ctx, op):
    i = op.inputs[0]
    shape = ctx.tensor_shape(i)
    if len(shape) != 4 or None in shape[1:]:
        raise unsupported(op, f"an input of shape {shape}")
    return i, shape, int(op.option("block_size", 1))


@handler("DEPTH_TO_SPACE", op="reshape")
def _depth_to_space(ctx, op):
    """TensorFlow's NHWC depth_to_space, in NCHW: channel (i * b + j) * C' + c moves to
    pixel (h * b + i, w * b + j) of channel c (ONNX's DCR mode)."""
    i, (_, h, w, c), b = _blocks(ctx, op)
    if c % (b * b):
        raise unsupported(op, f"{c} channels for block size {b}")
    x = ctx.get(i, NCHW)
    y = apply("reshape", [x], {"shape": (-1, b, b, c // (b * b), h, w)}, name=f"{op.name}/blocks")
    y = apply("transpose", [y], {"perm": (0, 3, 4, 1, 5, 2)}, name=f"{op.name}/moved")
    y = apply("reshape", [y], {"shape": (-1, c // (b * b), h * b, w * b)}, name=f"{op.name}/depth_to_space")
    ctx.set(op.outputs[0], y, NCHW, exact=True)


@handler("SPACE_TO_DEPTH", op="reshape")
def _space_to_depth(ctx, op):
    i, (_, h, w, c), b = _blocks(ctx, op)
    if h % b or w % b:
        raise unsupported(op, f"{h}x{w} for block size {b}")
    x = ctx.get(i, NCHW)
    y = apply("reshape", [x], {"shape": (-1, c, h // b, b, w // b, b)}, name=f"{op.name}/blocks")
    y = apply("transpose", [y], {"perm": (0, 3, 5, 1, 2, 4)}, name=f"{op.name}/moved")
    y = apply("reshape", [y], {"shape": (-1, c * b * b, h // b, w // b)}, name=f"{op.name}/space_to_depth")
    ctx.set(op.outputs[0], y, NCHW, exact=True)

