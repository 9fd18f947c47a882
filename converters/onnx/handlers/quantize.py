"""ONNX QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (edgeflow/ops/quantize.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import handler, unsupported


def _checked(node):
    if node.attr("block_size", 0):
        raise unsupported(node, "blocked quantization (block_size) is not supported")
    return {"axis": node.attr("axis", 1)}


@handler("QuantizeLinear", op="quantize_linear")
def _quantize_linear(ctx, node):
    from onnx import helper
    attrs = _checked(node)
    zero_point = ctx.input(node, 2)
    if zero_point is not None:
        attrs["dtype"] = zero_point.dtype
    elif node.attr("output_dtype", 0):
        attrs["dtype"] = helper.tensor_dtype_to_np_dtype(node.attr("output_dtype"))
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
