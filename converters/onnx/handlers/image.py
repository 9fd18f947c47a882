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
    return apply("pad", [x], {"pads": pads, "mode": node.attr("mode", "constant"), "value": value}, name=node.outputs[0])


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
