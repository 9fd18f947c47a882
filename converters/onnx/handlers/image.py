"""Padding and resizing nodes (edgeflow/ops/image.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import attrs_or_operands, first_float, handler, ints, unsupported


@handler("Pad", op="pad")
def _pad(ctx, node):
    x, out = ctx.input(node, 0), node.outputs[0]
    attrs = {"mode": node.attr("mode", "constant")}
    if not ctx.has(node, 1):  # pads and value as attributes (before opset 11)
        return apply("pad", [x], {**attrs, "pads": tuple(node.attr("pads", ())),
                                  "value": float(node.attr("value", 0.0))}, name=out)
    pads = _pads_on_all_axes(ctx, node, x) if ctx.has(node, 3) else ctx.input(node, 1)
    value = ctx.input(node, 2)
    if pads.spec.value is not None and (value is None or value.spec.value is not None):
        attrs["pads"] = ints(pads.spec.value)
        if value is not None:
            attrs["value"] = first_float(value.spec.value)
        return apply("pad", [x], attrs, name=out)
    return apply("pad", [x, pads] + ([value] if value is not None else []), attrs, name=out)


def _pads_on_all_axes(ctx, node, x):
    """Pads given for some axes only (opset 18) spread over all axes, zeros elsewhere:
    scattered to (axes mod rank) and (that + rank); folded while converting when the pads
    and axes are constants."""
    rank, out = len(x.shape), node.outputs[0]
    axes = apply("cast", [ctx.input(node, 3)], {"dtype": np.dtype(np.int64)}, name=f"{out}/axes")
    axes = apply("mod", [axes, np.int64(rank)], name=f"{out}/axes_mod_rank")
    where = apply("concat", [axes, apply("add", [axes, np.int64(rank)], name=f"{out}/end_axes")], {"axis": 0},
                  name=f"{out}/where")
    return apply("scatter_elements", [np.zeros(2 * rank, np.int64), where, ctx.input(node, 1)], {"axis": 0},
                 name=f"{out}/all_pads")


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
    fed = [i for i in (1, 2, 3) if ctx.has(node, i) and ctx.value(node, i) is None
           and (i != 1 or attrs["coordinate_transformation_mode"] == "tf_crop_and_resize")]
    if fed:  # known only when running
        return _resize_fed(ctx, node, x, attrs)
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


def _resize_fed(ctx, node, x, attrs):
    """Resize whose roi, scales or sizes are known only when running: operands, in the op's
    order (empty constants stand for absent ones), spread from `axes` over all axes and
    fitted to keep_aspect_ratio_policy by ops that run when their values are known."""
    out, rank = node.outputs[0], len(x.shape)
    axes = np.array([a % rank for a in node.attr("axes", range(rank))], np.int64)
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise unsupported(node, f"Resize keep_aspect_ratio_policy {policy!r}")

    def on_all_axes(given, unchanged, what):
        return apply("scatter_elements", [unchanged, axes, given], {"axis": 0}, name=f"{out}/{what}")

    roi = scales = sizes = None
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" and ctx.has(node, 1):
        roi = apply("scatter_elements", [np.array([0.0] * rank + [1.0] * rank, np.float32),
                                         np.concatenate([axes, axes + rank]),
                                         apply("cast", [ctx.input(node, 1)], {"dtype": np.dtype(np.float32)},
                                               name=f"{out}/roi_f")], {"axis": 0},
                    name=f"{out}/roi")
    if ctx.has(node, 2) and not (ctx.value(node, 2) is not None and not np.size(ctx.value(node, 2))):
        scales = on_all_axes(ctx.input(node, 2), np.ones(rank, np.float32), "scales")
    if ctx.has(node, 3):
        shape = apply("shape", [x], name=f"{out}/shape")
        given = ctx.input(node, 3)
        if policy != "stretch":  # one scale for all axes: the least or greatest ratio
            lengths = apply("cast", [apply("gather", [shape, axes], name=f"{out}/lengths")],
                            {"dtype": np.dtype(np.float32)}, name=f"{out}/lengths_f")
            ratios = apply("div", [apply("cast", [given], {"dtype": np.dtype(np.float32)}, name=f"{out}/given_f"),
                                   lengths], name=f"{out}/ratios")
            scale = apply("reduce_min" if policy == "not_larger" else "reduce_max", [ratios],
                          {"axes": (0,), "keepdims": True}, name=f"{out}/scale")
            per_axis = apply("mul", [scale, np.ones(len(axes), np.float32)], name=f"{out}/per_axis")
            scales = on_all_axes(per_axis, np.ones(rank, np.float32), "scales")
            rounded = apply("floor", [apply("add", [apply("mul", [lengths, scale], name=f"{out}/scaled"),
                                                    np.float32(0.5)], name=f"{out}/half_up")], name=f"{out}/rounded")
            given = apply("cast", [rounded], {"dtype": np.dtype(np.int64)}, name=f"{out}/fitted")
        sizes = on_all_axes(given, shape, "sizes")
    operands = [np.zeros(0, np.float32) if roi is None else roi,
                np.zeros(0, np.float32) if scales is None else scales] + ([] if sizes is None else [sizes])
    return apply("resize", [x, *operands], attrs, name=out)


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
    attrs, operands = attrs_or_operands(ctx, node, {"size": (1, ints)})
    return apply("affine_grid", [ctx.input(node, 0), *operands],
                 {**attrs, "align_corners": bool(node.attr("align_corners", 0))}, name=node.outputs[0])


@handler("Col2Im", op="col2im")
def _col2im(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"image_shape": (1, ints), "block_shape": (2, ints)})
    for key in ("strides", "pads", "dilations"):
        attrs[key] = tuple(node.attr(key, ()))
    return apply("col2im", [ctx.input(node, 0), *operands], attrs, name=node.outputs[0])


@handler("CenterCropPad", op="pad")
def _center_crop_pad(ctx, node):
    """Crop or zero-pad each axis to `shape` around its centre: one pad per side, negative
    where it crops, the extra element of an odd difference at the end. Computed by ops, so
    it folds while converting when the shapes are known, and runs when they are not."""
    x, out = ctx.input(node, 0), node.outputs[0]
    rank = len(x.shape)
    axes = np.array([a % rank for a in node.attr("axes", range(rank))], np.int64)
    shape = apply("shape", [x], name=f"{out}/shape")
    target = apply("scatter_elements", [shape, axes, apply("cast", [ctx.input(node, 1)], {"dtype": np.dtype(np.int64)},
                                                           name=f"{out}/given")], {"axis": 0}, name=f"{out}/target")
    diff = apply("sub", [target, shape], name=f"{out}/diff")
    half = apply("div", [apply("abs", [diff], name=f"{out}/abs"), np.int64(2)], name=f"{out}/half")
    begin = apply("mul", [apply("sign", [diff], name=f"{out}/sign"), half], name=f"{out}/begin")
    pads = apply("concat", [begin, apply("sub", [diff, begin], name=f"{out}/end")], {"axis": 0}, name=f"{out}/pads")
    if pads.spec.value is not None:
        return apply("pad", [x], {"pads": ints(pads.spec.value), "mode": "constant", "value": 0.0}, name=out)
    return apply("pad", [x, pads], {"mode": "constant"}, name=out)


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
