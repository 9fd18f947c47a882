"""OpenCL kernels of edgeflow/ops/activations.py: swish (elementwise.cl), which the
optimizer makes of ONNX's Sigmoid then Mul, and prelu (MediaPipe's models hold dozens):
without them a model's OpenCL partition would end at each one."""
import math

from . import cl_kernel, elementwise


def _swish_unsupported(attrs, ins, outs):
    return None if math.isfinite(attrs["alpha"]) else f"alpha {attrs['alpha']}"


@cl_kernel("swish", unsupported=_swish_unsupported)
def _swish(rt, ins, outs, attrs):
    return elementwise.unary(rt, "swish", ins[0], outs[0], ALPHA=f"{float(attrs['alpha'])!r}f")


@cl_kernel("prelu", unsupported=elementwise.rank_supported)
def _prelu(rt, ins, outs, attrs):
    """x where x >= 0, else slope * x: a binary op of elementwise.cl, the slope broadcast."""
    return elementwise.binary(rt, "prelu", ins, outs[0])
