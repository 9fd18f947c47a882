"""Convolution, pooling, padding and resizing nodes (NCHW, as edgeflow's ops)."""
import numpy as np

from edgeflow.graph.math_ops import apply
from edgeflow.ops.conv import same_pads

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
    attrs = {**_window(node), "group": node.attr("group", 1)}
    if "output_padding" in node.attrs:
        attrs["output_padding"] = tuple(node.attr("output_padding"))
    ins = [t for t in ctx.inputs(node) if t is not None]
    if "output_shape" in node.attrs:
        attrs.update(_pads_for_output_shape(node, ins[0].shape[2:], ins[1].shape[2:], attrs))
    return apply("conv_transpose", ins, attrs, name=node.outputs[0])


def _pads_for_output_shape(node, spatial, kernel, attrs):
    """pads and output_padding that give ConvTranspose's `output_shape`, by ONNX's rule:
    the total padding splits in halves, the odd one at the end for SAME_UPPER and at the
    start otherwise; a negative end pad (output larger than the strides give) becomes
    output padding."""
    if None in spatial or None in kernel:
        raise unsupported(node, "ConvTranspose with output_shape and dynamic spatial dimensions")
    n, out_shape = len(spatial), node.attr("output_shape")[-len(spatial):]
    kernel = node.attr("kernel_shape", kernel)
    strides, dilations = attrs.get("strides", (1,) * n), attrs.get("dilations", (1,) * n)
    extra = list(attrs.get("output_padding", (0,) * n))
    begin, end = [], []
    for i in range(n):
        total = strides[i] * (spatial[i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - out_shape[i]
        first, last = same_pads(total, attrs["auto_pad"])
        if first < 0:
            raise unsupported(node, f"ConvTranspose output_shape {out_shape} larger than its input allows")
        extra[i] -= min(last, 0)
        begin.append(first)
        end.append(max(last, 0))
    return {"pads": tuple(begin + end), "output_padding": tuple(extra), "auto_pad": "NOTSET"}


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
    if any(d != 1 for d in node.attr("dilations", ())):
        raise unsupported(node, "AveragePool with dilations (opset 19)")
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
