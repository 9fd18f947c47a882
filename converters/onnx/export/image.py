"""Padding, resizing, sampling and cropping (edgeflow/ops/image.py)."""
import numpy as np

from edgeflow import dtypes

from . import exporter, onnx_attrs, unsupported

SAME = {"grid_sample": "GridSample", "roi_align": "RoiAlign"}


@exporter
def pad(g, op):
    ins = [op.inputs[0], g.given(op, "pads", np.int64)]
    if op.attrs["mode"] == "constant" and ("value" in op.operands or op.attrs["value"]):
        ins.append(op.operands.get("value") or g.const(dtypes.array(op.attrs["value"], op.input_specs[0].dtype),
                                                       "value"))
    g.node("Pad", ins, op.outputs, mode=op.attrs["mode"])


@exporter
def resize(g, op):
    """roi, scales, sizes as Resize's inputs: the operands (an empty one stands for an
    absent input), or the attributes (of every axis, or of the last ones: Resize's axes)."""
    attrs = {k: v for k, v in op.attrs.items() if k not in ("roi", "scales", "sizes")}
    if op.operands:
        given = {k: "" if op.value(i) is not None and np.size(op.value(i)) == 0 else name
                 for i, (k, name) in enumerate(op.operands.items(), 1)}
        if given.get("scales") and given.get("sizes"):
            raise unsupported(op, "sizes with the coordinate scales of a keep_aspect_ratio_policy, computed when "
                                  "running: ONNX's Resize takes one of them")
    else:
        given = {"roi": g.const(np.array(op.attrs["roi"], np.float32), "roi") if op.attrs["roi"] else ""}
        given.update(_scales_or_sizes(g, op))
    ins = [op.inputs[0]] + [given.get(k, "") for k in ("roi", "scales", "sizes")]
    while not ins[-1]:
        ins.pop()
    rank, count = op.input_specs[0].rank, len(op.attrs["scales"] or op.attrs["sizes"])
    if not op.operands and count < rank:  # edgeflow's scales or sizes of the last two axes only
        attrs["axes"] = tuple(range(rank - count, rank))
    g.node("Resize", ins, op.outputs, **onnx_attrs(attrs))


def _scales_or_sizes(g, op):
    """{"scales": name} or {"sizes": name}; with both attributes (keep_aspect_ratio_policy), the
    one that gives the same output lengths and coordinate scales."""
    scales, sizes = op.attrs["scales"], op.attrs["sizes"]
    shape = op.input_specs[0].shape[-len(scales or sizes):]
    if scales and sizes:
        if None not in shape and all(int(np.floor(np.float32(n) * np.float32(s))) == m
                                     for n, s, m in zip(shape, scales, sizes)):
            sizes = ()
        elif None not in shape and all(np.float32(m) / np.float32(n) == np.float32(s)
                                       for n, s, m in zip(shape, scales, sizes)):
            scales = ()
        else:
            raise unsupported(op, f"sizes {sizes} with coordinate scales {scales} other than ONNX's (sizes "
                                  "over lengths, or lengths from floor(length * scale))")
    if scales:
        return {"scales": g.const(np.array(scales, np.float32), "scales")}
    return {"sizes": g.const(np.array(sizes, np.int64), "sizes")}


@exporter
def affine_grid(g, op):
    g.node("AffineGrid", [op.inputs[0], g.given(op, "size", np.int64)], op.outputs,
           align_corners=int(op.attrs["align_corners"]))


@exporter
def col2im(g, op):
    attrs = {k: v for k, v in op.attrs.items() if k not in ("image_shape", "block_shape")}
    g.node("Col2Im", [op.inputs[0], g.given(op, "image_shape", np.int64), g.given(op, "block_shape", np.int64)],
           op.outputs, **onnx_attrs(attrs))
