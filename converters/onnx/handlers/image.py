"""Padding and resizing nodes (edgeflow/ops/image.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported


@handler("Pad", op="pad")
def _pad(ctx, node):
    x = ctx.input(node, 0)
    pads = ctx.ints(node, 1, "pads") if ctx.has(node, 1) else tuple(node.attr("pads", ()))
    value = float(np.asarray(ctx.constant(node, 2, "constant_value")).reshape(-1)[0]) \
        if ctx.has(node, 2) else float(node.attr("value", 0.0))
    if ctx.has(node, 3):  # pads for some axes only (opset 18): spread over all axes
        rank, axes = len(x.shape), [a % len(x.shape) for a in ctx.ints(node, 3, "axes")]
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[rank + a] = pads[k], pads[len(axes) + k]
        pads = tuple(full)
    mode = node.attr("mode", "constant")
    if mode == "wrap":
        raise unsupported(node, "Pad mode 'wrap'")
    return apply("pad", [x], {"pads": pads, "mode": mode, "value": value}, name=node.outputs[0])


@handler("Resize", op="resize")
def _resize(ctx, node):
    x = ctx.input(node, 0)
    rank = len(x.shape)
    attrs = {"mode": node.attr("mode", "nearest"),
             "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
             "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
             "cubic_coeff_a": float(node.attr("cubic_coeff_a", -0.75)),
             "exclude_outside": bool(node.attr("exclude_outside", 0)),
             "antialias": bool(node.attr("antialias", 0)),
             "extrapolation_value": float(node.attr("extrapolation_value", 0.0))}
    axes = [a % rank for a in node.attr("axes", range(rank))]
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        roi = [float(v) for v in np.asarray(ctx.constant(node, 1, "roi")).reshape(-1)]
        full = [0.0] * rank + [1.0] * rank
        for k, a in enumerate(axes):
            full[a], full[rank + a] = roi[k], roi[len(axes) + k]
        attrs["roi"] = tuple(full)
    scales = ctx.value(node, 2) if ctx.has(node, 2) else None
    if ctx.has(node, 3):
        sizes = ctx.ints(node, 3, "sizes")
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            attrs["sizes"], attrs["scales"] = _keep_aspect_ratio(node, x, axes, sizes, policy)
        else:
            attrs["sizes"] = _on_all_axes(node, x, axes, sizes, x.shape)
    elif scales is not None and np.size(scales):
        attrs["scales"] = _on_all_axes(node, x, axes, [float(s) for s in np.asarray(scales).reshape(-1)],
                                       (1.0,) * rank)
    else:
        raise unsupported(node, "Resize needs constant scales or sizes")
    return apply("resize", [x], attrs, name=node.outputs[0])


def _on_all_axes(node, x, axes, values, unchanged):
    """Scales or sizes given for Resize's `axes` (opset 18), spread over all axes."""
    if len(values) != len(axes):
        raise unsupported(node, f"Resize with {len(values)} scales or sizes for {len(axes)} axes")
    full = list(unchanged)
    for axis, v in zip(axes, values):
        full[axis] = v
    if None in full:
        raise unsupported(node, "Resize with axes and sizes on a shape with dynamic dimensions")
    return tuple(full)


def _keep_aspect_ratio(node, x, axes, sizes, policy):
    """(sizes, scales) of keep_aspect_ratio_policy: one scale, the least (not_larger) or
    greatest (not_smaller) of sizes / length over `axes`, and lengths rounded half up."""
    lengths = [x.shape[a] for a in axes]
    if None in lengths:
        raise unsupported(node, "Resize with keep_aspect_ratio_policy on axes of dynamic length")
    if policy not in ("not_larger", "not_smaller"):
        raise unsupported(node, f"Resize keep_aspect_ratio_policy {policy!r}")
    ratios = [np.float32(s) / np.float32(n) for s, n in zip(sizes, lengths)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    full_sizes, full_scales = list(x.shape), [1.0] * len(x.shape)
    for a, n in zip(axes, lengths):
        full_sizes[a], full_scales[a] = int(np.floor(np.float32(n) * scale + np.float32(0.5))), float(scale)
    if None in full_sizes:
        raise unsupported(node, "Resize with keep_aspect_ratio_policy on a shape with dynamic dimensions")
    return tuple(full_sizes), tuple(full_scales)


@handler("GridSample", op="grid_sample")
def _grid_sample(ctx, node):
    """GridSample (opsets 16 to 22): opset 16's bilinear and bicubic are linear and cubic."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"), node.attr("mode", "linear"))
    attrs = {"mode": mode, "padding_mode": node.attr("padding_mode", "zeros"),
             "align_corners": bool(node.attr("align_corners", 0))}
    return apply("grid_sample", [ctx.input(node, 0), ctx.input(node, 1)], attrs, name=node.outputs[0])


@handler("AffineGrid", op="affine_grid")
def _affine_grid(ctx, node):
    return apply("affine_grid", [ctx.input(node, 0)], {"size": ctx.ints(node, 1, "size"),
                 "align_corners": bool(node.attr("align_corners", 0))}, name=node.outputs[0])


@handler("Col2Im", op="col2im")
def _col2im(ctx, node):
    attrs = {"image_shape": ctx.ints(node, 1, "image_shape"), "block_shape": ctx.ints(node, 2, "block_shape")}
    for key in ("strides", "pads", "dilations"):
        attrs[key] = tuple(node.attr(key, ()))
    return apply("col2im", [ctx.input(node, 0)], attrs, name=node.outputs[0])


@handler("CenterCropPad", op="pad")
def _center_crop_pad(ctx, node):
    """Crop or zero-pad each axis to `shape` around its centre: one pad, negative where it
    crops (the extra element of an odd difference goes at the end)."""
    x = ctx.input(node, 0)
    rank, shape = len(x.shape), ctx.ints(node, 1, "shape")
    axes = [a % rank for a in node.attr("axes", range(rank))]
    pads = [0] * (2 * rank)
    for a, s in zip(axes, shape):
        if x.shape[a] is None:
            raise unsupported(node, f"CenterCropPad on axis {a} of dynamic length")
        diff = s - x.shape[a]
        half = diff // 2 if diff >= 0 else -((-diff) // 2)
        pads[a], pads[rank + a] = half, diff - half
    return apply("pad", [x], {"pads": tuple(pads), "mode": "constant", "value": 0.0}, name=node.outputs[0])


@handler("RoiAlign", op="roi_align")
def _roi_align(ctx, node):
    """RoiAlign; before opset 16 it had no coordinate_transformation_mode and did not shift
    by half a pixel."""
    attrs = {"mode": node.attr("mode", "avg"), "output_height": node.attr("output_height", 1),
             "output_width": node.attr("output_width", 1), "sampling_ratio": node.attr("sampling_ratio", 0),
             "spatial_scale": float(node.attr("spatial_scale", 1.0)),
             "coordinate_transformation_mode": node.attr("coordinate_transformation_mode",
                                                         "half_pixel" if node.opset >= 16 else "output_half_pixel")}
    return apply("roi_align", [ctx.input(node, i) for i in range(3)], attrs, name=node.outputs[0])
