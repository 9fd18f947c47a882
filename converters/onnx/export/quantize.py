"""QuantizeLinear and DequantizeLinear (edgeflow/ops/quantize.py). Weights that the format
stores quantized are a DequantizeLinear of their integers too (Graph._value)."""
import numpy as np

from . import elem_type, exporter

SAME = {"dequantize_linear": "DequantizeLinear"}


@exporter
def quantize_linear(g, op):
    """The output type is the zero point's: without one (uint8 is ONNX's default), zeros of
    the output type (onnxruntime refuses output_dtype other than uint8 without a zero point)."""
    inputs, dtype, attrs = list(op.inputs), op.attrs["dtype"], {"axis": op.attrs["axis"]}
    if len(inputs) < 3 and dtype != np.uint8:
        scale = op.input_specs[1].shape
        if None in scale:
            attrs["output_dtype"] = elem_type(dtype)
        else:
            inputs.append(g.const(np.zeros(scale, dtype), "zero_point"))
    g.node("QuantizeLinear", inputs, op.outputs, **attrs)
