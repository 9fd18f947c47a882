"""ONNX QuantizeLinear and DequantizeLinear (edgeflow/ops/quantize.py)."""
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
