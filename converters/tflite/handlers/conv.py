"""Convolutions (edgeflow/ops/conv.py): TFLite's NHWC convolutions as edgeflow's NCHW
ones, filters transposed once while converting."""
import struct

from edgeflow.graph.math_ops import apply

from ..context import NCHW, unsupported
from . import fused, handler, padding

OHWI_TO_OIHW = (0, 3, 1, 2)     # CONV_2D and TRANSPOSE_CONV filters
DEPTHWISE_TO_OIHW = (3, 0, 1, 2)  # [1, KH, KW, C*M] -> [C*M, 1, KH, KW]


def _window(op):
    return {"strides": (op.option("stride_h", 1), op.option("stride_w", 1)),
            "dilations": (op.option("dilation_h_factor", 1), op.option("dilation_w_factor", 1)),
            "auto_pad": padding(op)}


def _bias(ctx, op, k):
    return [ctx.get(op.inputs[k])] if op.has(k) else []


@handler("CONV_2D", op="conv")
def _conv_2d(ctx, op):
    x, w = ctx.get(op.inputs[0], NCHW), ctx.get(op.inputs[1], OHWI_TO_OIHW)
    channels, per_group = x.shape[1], w.shape[1]
    if channels is None or channels % per_group:
        raise unsupported(op, f"{channels} input channels for filters of {per_group}")
    y = apply("conv", [x, w, *_bias(ctx, op, 2)], {**_window(op), "group": channels // per_group},
              name=f"{op.name}/conv")
    ctx.set(op.outputs[0], fused(op, y), NCHW)


@handler("DEPTHWISE_CONV_2D", op="conv")
def _depthwise_conv_2d(ctx, op):
    x, w = ctx.get(op.inputs[0], NCHW), ctx.get(op.inputs[1], DEPTHWISE_TO_OIHW)
    channels = x.shape[1]
    if channels is None or w.shape[0] % channels:
        raise unsupported(op, f"{w.shape[0]} depthwise filters for {channels} channels")
    y = apply("conv", [x, w, *_bias(ctx, op, 2)], {**_window(op), "group": channels}, name=f"{op.name}/conv")
    ctx.set(op.outputs[0], fused(op, y), NCHW)


def _transpose_conv(ctx, op, x_index, w_index, bias_index, out_shape, strides, auto_pad):
    """TFLite's transpose convolution: the output's spatial size is given (out_shape, NHWC),
    the padding split as TFLite splits it: half before, the odd one after."""
    x = ctx.get(op.inputs[x_index], NCHW)
    # TFLite's filter [O, KH, KW, I]; edgeflow's conv_transpose takes (I, O, KH, KW)
    w = ctx.get(op.inputs[w_index], (3, 0, 1, 2))
    spatial, kernel = x.shape[2:], w.shape[2:]
    if None in spatial:
        raise unsupported(op, "dynamic spatial dimensions")
    pads, extra = [], []
    for i in range(2):
        full = strides[i] * (spatial[i] - 1) + kernel[i]
        total = full - out_shape[i] if auto_pad == "SAME_UPPER" else 0
        target = out_shape[i]
        begin = max(total, 0) // 2
        end = full - begin - target
        if end < 0:  # the output is larger than the strides give: extra rows at the end
            extra.append(-end)
            end = 0
        else:
            extra.append(0)
        pads.append((begin, end))
    attrs = {"strides": tuple(strides), "pads": (pads[0][0], pads[1][0], pads[0][1], pads[1][1])}
    if any(extra):
        attrs["output_padding"] = tuple(extra)
    ins = [x, w] + ([ctx.get(op.inputs[bias_index])] if bias_index is not None and op.has(bias_index) else [])
    y = apply("conv_transpose", ins, attrs, name=f"{op.name}/conv_transpose")
    ctx.set(op.outputs[0], fused(op, y), NCHW)


@handler("TRANSPOSE_CONV", op="conv_transpose")
def _transpose_conv_op(ctx, op):
    shape = [int(d) for d in ctx.constant(op, 0, "output_shape")]
    _transpose_conv(ctx, op, 2, 1, 3, shape[1:3], (op.option("stride_h", 1), op.option("stride_w", 1)),
                    padding(op))


@handler("CUSTOM:Convolution2DTransposeBias", op="conv_transpose")
def _convolution_2d_transpose_bias(ctx, op):
    """MediaPipe's transpose convolution with bias: its options are TfLiteTransposeConvParams
    (padding, stride_width, stride_height as int32); the output is input * stride (SAME)."""
    raw = op.op.custom_options
    if len(raw) < 12:
        raise unsupported(op, f"custom options of {len(raw)} bytes; expected 12 (padding, strides)")
    pad, stride_w, stride_h = struct.unpack_from("<3i", raw)
    if pad not in (1, 2) or stride_w < 1 or stride_h < 1:
        raise unsupported(op, f"padding {pad}, strides {stride_h}x{stride_w}")
    x = ctx.tensor_shape(op.inputs[0])
    kernel = ctx.subgraph.tensors[op.inputs[1]].shape[1:3]
    if pad == 1:
        out = [x[1] * stride_h, x[2] * stride_w]
    else:
        out = [(x[1] - 1) * stride_h + kernel[0], (x[2] - 1) * stride_w + kernel[1]]
    _transpose_conv(ctx, op, 0, 1, 2, out, (stride_h, stride_w), "SAME_UPPER" if pad == 1 else "VALID")

