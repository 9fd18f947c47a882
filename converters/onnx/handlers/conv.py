"""Convolution, pooling, padding and resizing nodes (NCHW, as edgeflow's ops)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported


def _window(node, dilations=True):
    attrs = {k: tuple(node.attr(k)) for k in ("strides", "pads") if k in node.attrs}
    if dilations and "dilations" in node.attrs:
        attrs["dilations"] = tuple(node.attr("dilations"))
    attrs["auto_pad"] = node.attr("auto_pad", "NOTSET") or "NOTSET"
    return attrs


@handler("Conv")
def _conv(ctx, node):
    ins = [t for t in ctx.inputs(node) if t is not None]
    return apply("conv", ins, {**_window(node), "group": node.attr("group", 1)}, name=node.outputs[0])


@handler("ConvTranspose")
def _conv_transpose(ctx, node):
    if "output_shape" in node.attrs:
        raise unsupported(node, "ConvTranspose with output_shape (give pads and output_padding)")
    attrs = {**_window(node), "group": node.attr("group", 1)}
    if "output_padding" in node.attrs:
        attrs["output_padding"] = tuple(node.attr("output_padding"))
    ins = [t for t in ctx.inputs(node) if t is not None]
    return apply("conv_transpose", ins, attrs, name=node.outputs[0])


@handler("MaxPool")
def _max_pool(ctx, node):
    if len([o for o in node.outputs if o]) > 1:
        raise unsupported(node, "MaxPool's Indices output")
    if node.attr("storage_order", 0):
        raise unsupported(node, "MaxPool with storage_order=1")
    return apply("max_pool", [ctx.input(node, 0)], {
        **_window(node), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0))}, name=node.outputs[0])


@handler("AveragePool")
def _avg_pool(ctx, node):
    return apply("avg_pool", [ctx.input(node, 0)], {
        **_window(node, dilations=False), "kernel_shape": tuple(node.attr("kernel_shape")),
        "ceil_mode": bool(node.attr("ceil_mode", 0)),
        "count_include_pad": bool(node.attr("count_include_pad", 0))}, name=node.outputs[0])


@handler("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, node):
    x = ctx.input(node, 0)
    op = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return apply(op, [x], {"axes": tuple(range(2, len(x.shape))), "keepdims": True}, name=node.outputs[0])


@handler("Pad")
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


@handler("Resize")
def _resize(ctx, node):
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise unsupported(node, f"Resize mode {mode!r} (nearest and linear are supported)")
    for attr, default in (("antialias", 0), ("exclude_outside", 0)):
        if node.attr(attr, default) != default:
            raise unsupported(node, f"Resize with {attr}={node.attr(attr)}")
    if "axes" in node.attrs or node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise unsupported(node, "Resize with axes or keep_aspect_ratio_policy")
    attrs = {"mode": mode,
             "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
             "nearest_mode": node.attr("nearest_mode", "round_prefer_floor")}
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        raise unsupported(node, "Resize with tf_crop_and_resize")
    scales = ctx.value(node, 2) if ctx.has(node, 2) else None
    if ctx.has(node, 3):
        attrs["sizes"] = ctx.ints(node, 3, "sizes")
    elif scales is not None and np.size(scales):
        attrs["scales"] = tuple(float(s) for s in np.asarray(scales).reshape(-1))
    else:
        raise unsupported(node, "Resize needs constant scales or sizes")
    return apply("resize", [ctx.input(node, 0)], attrs, name=node.outputs[0])
