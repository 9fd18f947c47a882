"""Quantization boundaries (edgeflow/ops/quantize.py). Inside the graph a quantized
value is its real value (context.py), so QUANTIZE rounds to the output's grid (which
Context.set does) and DEQUANTIZE passes the value on; DEQUANTIZE of a float16 or int8
constant (MediaPipe's float16 weights) stays a constant."""
import numpy as np

from . import handler


@handler("QUANTIZE", op="quantize_linear")
def _quantize(ctx, op):
    i = op.inputs[0]
    ctx.set(op.outputs[0], ctx.get(i, ctx.perm(i)), ctx.perm(i))


@handler("DEQUANTIZE", op="dequantize_linear")
def _dequantize(ctx, op):
    i = op.inputs[0]
    if ctx.is_constant(i):
        t = ctx.subgraph.tensors[i]
        if t.quantization is None:  # float16 weights: kept exact, stored as float16 again
            ctx.set(op.outputs[0], ctx.arrays[i].astype(np.float32))
        else:  # integer weights stay integers, dequantized when a plan is made
            ctx.alias(op.outputs[0], i)
        return
    ctx.set(op.outputs[0], ctx.get(i, ctx.perm(i)), ctx.perm(i), exact=True)
