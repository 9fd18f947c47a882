"""ONNX QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and QLinearMatMul and
QLinearConv: the integer product of the centered operands (int32 for matmul, float64 sums
for conv, exact for these integers), requantized by quantize_linear."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import onnx_dtype
from . import handler, unsupported


def _checked(node):
    if node.attr("block_size", 0):
        raise unsupported(node, "blocked quantization (block_size) is not supported")
    return {"axis": node.attr("axis", 1)}


@handler("QuantizeLinear", op="quantize_linear")
def _quantize_linear(ctx, node):
    attrs = _checked(node)
    zero_point = ctx.input(node, 2)
    if zero_point is not None:
        attrs["dtype"] = zero_point.dtype
    elif node.attr("output_dtype", 0):
        attrs["dtype"] = onnx_dtype(node.attr("output_dtype"))
    inputs = [t for t in ctx.inputs(node) if t is not None]
    return apply("quantize_linear", inputs, attrs, name=node.outputs[0])


@handler("DequantizeLinear", op="dequantize_linear")
def _dequantize_linear(ctx, node):
    inputs = [t for t in ctx.inputs(node) if t is not None]
    return apply("dequantize_linear", inputs, _checked(node), name=node.outputs[0])


@handler("DynamicQuantizeLinear", op="quantize_linear")
def _dynamic_quantize_linear(ctx, node):
    """uint8 with the scale and zero point of x's range widened to include 0, as ONNX
    defines it: scale = (max(x, 0) - min(x, 0)) / 255, zero point = saturate(round(-min / scale))."""
    x, (y, scale_name, zero_name) = ctx.input(node, 0), node.outputs
    zero = np.zeros((), x.dtype)
    low = apply("minimum", [apply("reduce_min", [x], name=f"{y}/min"), zero], name=f"{y}/low")
    high = apply("maximum", [apply("reduce_max", [x], name=f"{y}/max"), zero], name=f"{y}/high")
    scale = apply("div", [apply("sub", [high, low], name=f"{y}/range"), np.array(255, x.dtype)],
                  name=scale_name)
    zero_point = apply("quantize_linear", [apply("neg", [low], name=f"{y}/neg_low"), scale], name=zero_name)
    return [apply("quantize_linear", [x, scale, zero_point], name=y), scale, zero_point]


def centered(ctx, node, value, zero_point, per_row):
    """Input `value` as int32 less its zero point (input `zero_point`, if given); with
    `per_row`, a vector zero point applies along axis 0 (A's rows, a filter's output
    channels)."""
    out = node.outputs[0]
    x = apply("cast", [ctx.input(node, value)], {"dtype": np.dtype(np.int32)}, name=f"{out}/int{value}")
    if not ctx.has(node, zero_point):
        return x
    zero = apply("cast", [ctx.input(node, zero_point)], {"dtype": np.dtype(np.int32)}, name=f"{out}/zero{value}")
    rank = ctx.input(node, value).rank
    if per_row and zero.rank == 1 and rank > 1:
        zero = apply("expand_dims", [zero], {"axes": tuple(range(1, rank))}, name=f"{out}/rows{value}")
    return apply("sub", [x, zero], name=f"{out}/centered{value}")


@handler("QLinearMatMul", op="quantize_linear")
def _qlinear_matmul(ctx, node):
    """The int32 product of the centered operands, scaled by a_scale * b_scale / y_scale and
    requantized to y's zero point, in the order ONNX's reference evaluator computes it."""
    out = node.outputs[0]
    product = apply("matmul", [centered(ctx, node, 0, 2, False), centered(ctx, node, 3, 5, False)],
                    name=f"{out}/int32")
    a_scale, b_scale, y_scale = (ctx.input(node, i) for i in (1, 4, 6))
    multiplier = apply("div", [apply("mul", [a_scale, b_scale], name=f"{out}/ab_scale"), y_scale],
                       name=f"{out}/multiplier")
    scaled = apply("mul", [apply("cast", [product], {"dtype": multiplier.dtype}, name=f"{out}/float"),
                           multiplier], name=f"{out}/scaled")
    zero = ctx.input(node, 7)
    dtype = zero.dtype if zero is not None else ctx.input(node, 0).dtype
    inputs = [scaled, np.ones((), multiplier.dtype)] + ([zero] if zero is not None else [])
    return apply("quantize_linear", inputs, {"dtype": dtype}, name=out)


@handler("QLinearConv", op="quantize_linear")
def _qlinear_conv(ctx, node):
    """As QLinearMatMul: the exact convolution (bias included) scaled by
    x_scale * w_scale / y_scale, w_scale per output channel, then requantized."""
    out = node.outputs[0]
    from .conv import integer_conv
    product = integer_conv(ctx, node, 0, 2, 3, 5, bias=8)
    x_scale, w_scale, y_scale = (ctx.input(node, i) for i in (1, 4, 6))
    if w_scale.rank == 1 and w_scale.shape != (1,):  # per output channel: along axis 1 of y
        w_scale = apply("expand_dims", [w_scale], {"axes": tuple(range(1, product.rank - 1))},
                        name=f"{out}/channels")
    multiplier = apply("div", [apply("mul", [x_scale, w_scale], name=f"{out}/xw_scale"), y_scale],
                       name=f"{out}/multiplier")
    scaled = apply("mul", [product, apply("cast", [multiplier], {"dtype": product.dtype}, name=f"{out}/m64")],
                   name=f"{out}/scaled")
    zero = ctx.input(node, 7)
    dtype = zero.dtype if zero is not None else ctx.input(node, 0).dtype
    inputs = [scaled, np.ones((), product.dtype)] + ([zero] if zero is not None else [])
    return apply("quantize_linear", inputs, {"dtype": dtype}, name=out)
