"""Convolution nodes (edgeflow/ops/conv.py), NCHW as edgeflow's ops."""
import numpy as np

from edgeflow.graph.math_ops import apply
from edgeflow.ops.conv import same_pads

from . import handler, unsupported


def window_attrs(node):
    """The sliding-window attributes (strides, pads, dilations, auto_pad) of a Conv or pooling node."""
    attrs = {k: tuple(node.attr(k)) for k in ("strides", "pads") if k in node.attrs}
    if "dilations" in node.attrs:
        attrs["dilations"] = tuple(node.attr("dilations"))
    attrs["auto_pad"] = node.attr("auto_pad", "NOTSET") or "NOTSET"
    return attrs


@handler("Conv", op="conv")
def _conv(ctx, node):
    ins = [t for t in ctx.inputs(node) if t is not None]
    return apply("conv", ins, {**window_attrs(node), "group": node.attr("group", 1)}, name=node.outputs[0])


@handler("ConvTranspose", op="conv_transpose")
def _conv_transpose(ctx, node):
    attrs = {**window_attrs(node), "group": node.attr("group", 1)}
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


def integer_conv(ctx, node, x, x_zero, w, w_zero, bias=None):
    """The convolution of the centered int operands (and an int32 bias), in float64, which
    holds their integer sums exactly."""
    from .quantize import centered
    out, f64 = node.outputs[0], np.dtype(np.float64)
    ins = [apply("cast", [centered(ctx, node, i, z, per_row)], {"dtype": f64}, name=f"{out}/f64_{i}")
           for i, z, per_row in ((x, x_zero, False), (w, w_zero, True))]
    if bias is not None and ctx.has(node, bias):
        ins.append(apply("cast", [ctx.input(node, bias)], {"dtype": f64}, name=f"{out}/f64_bias"))
    return apply("conv", ins, {**window_attrs(node), "group": node.attr("group", 1)}, name=f"{out}/conv")


@handler("ConvInteger", op="conv")
def _conv_integer(ctx, node):
    return apply("cast", [integer_conv(ctx, node, 0, 2, 1, 3)], {"dtype": np.dtype(np.int32)},
                 name=node.outputs[0])
