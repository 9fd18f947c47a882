"""Padding and resizing (edgeflow/ops/image.py), in the input's layout."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import unsupported
from . import handler

# (align_corners, half_pixel_centers) -> edgeflow's coordinate_transformation_mode
_BILINEAR = {(False, False): "asymmetric", (True, False): "align_corners", (False, True): "half_pixel"}
# nearest: floor(out * scale); round(out * (in-1)/(out-1)) with ties up; floor((out + 1/2) * scale)
_NEAREST = {(False, False): ("asymmetric", "floor"), (True, False): ("align_corners", "round_prefer_ceil"),
            (False, True): ("half_pixel", "round_prefer_ceil")}


def _pads(ctx, op, perm, rank):
    pads = np.asarray(ctx.constant(op, 1, "paddings"), np.int64)
    if pads.shape != (rank, 2):
        raise unsupported(op, f"paddings of shape {pads.shape} for rank {rank}")
    return tuple(int(pads[a, 0]) for a in perm) + tuple(int(pads[a, 1]) for a in perm)


@handler({"PAD": "pad", "PADV2": "pad"})
def _pad(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i) or tuple(range(ctx.rank(i)))
    attrs = {"pads": _pads(ctx, op, perm, len(perm))}
    if op.opcode == "PADV2" and op.has(2):
        # a real value (a quantized one too); PAD fills quantized tensors with their zero point: 0
        attrs["value"] = float(np.asarray(ctx.constant(op, 2, "constant_values")).reshape(-1)[0])
    y = apply("pad", [ctx.get(i, perm)], attrs, name=f"{op.name}/pad")
    ctx.set(op.outputs[0], y, perm, exact=ctx.same_grid(i, op.outputs[0]))


@handler("MIRROR_PAD", op="pad")
def _mirror_pad(ctx, op):
    """REFLECT leaves the edge out of the mirror (edgeflow's reflect); SYMMETRIC repeats it,
    built from reversed slices joined along each padded axis."""
    i = op.inputs[0]
    perm = ctx.perm(i) or tuple(range(ctx.rank(i)))
    pads = _pads(ctx, op, perm, len(perm))
    x = ctx.get(i, perm)
    if op.option("mode", 0) == 0:
        y = apply("pad", [x], {"pads": pads, "mode": "reflect"}, name=f"{op.name}/pad")
    else:
        y, rank = x, len(perm)
        for axis in range(rank):
            begin, end = pads[axis], pads[rank + axis]
            n = y.shape[axis]
            if not begin and not end:
                continue
            if n is None or begin > n or end > n:
                raise unsupported(op, f"SYMMETRIC padding {begin}, {end} of an axis of {n}")
            parts = []
            if begin:
                parts.append(apply("slice", [y], {"starts": (begin - 1,), "ends": (-n - 1,), "axes": (axis,),
                                                  "steps": (-1,)}, name=f"{op.name}/before{axis}"))
            parts.append(y)
            if end:
                parts.append(apply("slice", [y], {"starts": (n - 1,), "ends": (n - end - 1,), "axes": (axis,),
                                                  "steps": (-1,)}, name=f"{op.name}/after{axis}"))
            y = apply("concat", parts, {"axis": axis}, name=f"{op.name}/mirror{axis}")
    ctx.set(op.outputs[0], y, perm, exact=ctx.same_grid(i, op.outputs[0]))


@handler({"RESIZE_BILINEAR": "resize", "RESIZE_NEAREST_NEIGHBOR": "resize"})
def _resize(ctx, op):
    """TFLite resizes axes 1 and 2 (H, W) of an NHWC image to `size`."""
    i = op.inputs[0]
    if ctx.rank(i) != 4:
        raise unsupported(op, f"a rank-{ctx.rank(i)} input")
    perm = ctx.perm(i) or (0, 3, 1, 2)
    size = [int(v) for v in np.asarray(ctx.constant(op, 1, "size")).reshape(-1)]
    shape = list(ctx.tensor_shape(i))
    if len(size) != 2 or None in (shape[0], shape[3]):
        raise unsupported(op, f"size {size} of an input {shape}")
    shape[1:3] = size
    flags = (bool(op.option("align_corners", False)), bool(op.option("half_pixel_centers", False)))
    if flags == (True, True):
        raise unsupported(op, "align_corners together with half_pixel_centers")
    attrs = {"sizes": tuple(shape[a] for a in perm)}
    if op.opcode == "RESIZE_BILINEAR":
        attrs.update(mode="linear", coordinate_transformation_mode=_BILINEAR[flags])
    else:
        mode, nearest = _NEAREST[flags]
        attrs.update(mode="nearest", coordinate_transformation_mode=mode, nearest_mode=nearest)
    y = apply("resize", [ctx.get(i, perm)], attrs, name=f"{op.name}/resize")
    ctx.set(op.outputs[0], y, perm, exact=op.opcode != "RESIZE_BILINEAR" and ctx.same_grid(i, op.outputs[0]))
