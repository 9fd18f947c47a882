"""Padding and resizing nodes (edgeflow/ops/image.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import first_float, handler, ints, unsupported


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
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise unsupported(node, f"Resize mode {mode!r} (nearest and linear are supported)")
    for attr, default in (("antialias", 0), ("exclude_outside", 0)):
        if node.attr(attr, default) != default:
            raise unsupported(node, f"Resize with {attr}={node.attr(attr)}")
    if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise unsupported(node, "Resize with keep_aspect_ratio_policy")
    attrs = {"mode": mode,
             "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
             "nearest_mode": node.attr("nearest_mode", "round_prefer_floor")}
    if attrs["coordinate_transformation_mode"] in ("tf_crop_and_resize", "half_pixel_symmetric"):
        raise unsupported(node, f"Resize with {attrs['coordinate_transformation_mode']}")
    x = ctx.input(node, 0)
    scales = ctx.value(node, 2) if ctx.has(node, 2) else None
    if ctx.has(node, 3):
        attrs["sizes"] = _on_all_axes(node, x, ctx.ints(node, 3, "sizes"), x.shape)
    elif scales is not None and np.size(scales):
        attrs["scales"] = _on_all_axes(node, x, [float(s) for s in np.asarray(scales).reshape(-1)],
                                       (1.0,) * len(x.shape))
    else:
        raise unsupported(node, "Resize needs constant scales or sizes")
    return apply("resize", [x], attrs, name=node.outputs[0])


def _on_all_axes(node, x, values, unchanged):
    """Scales or sizes given for Resize's `axes` (opset 18), spread over all axes."""
    if "axes" not in node.attrs:
        return tuple(values)
    full = list(unchanged)
    for axis, v in zip(node.attr("axes"), values):
        full[axis % len(x.shape)] = v
    if None in full:
        raise unsupported(node, "Resize with axes and sizes on a shape with dynamic dimensions")
    return tuple(full)
