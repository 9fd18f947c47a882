"""OpenCL kernels of edgeflow/ops/activations.py: swish (elementwise.cl), which the
optimizer makes of ONNX's Sigmoid then Mul, prelu (MediaPipe's models hold dozens) and
clip_grad (ReLU6's gradient in a MobileNet's train step): without them a model's OpenCL
partition would end at each one."""
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


@cl_kernel("clip_grad", unsupported=elementwise.rank_supported)
def _clip_grad(rt, ins, outs, attrs):
    """dy where min <= x <= max, else 0: a binary op of elementwise.cl, its bounds built in."""
    return elementwise.binary(rt, "clip_grad", ins, outs[0], LOW=elementwise.float_literal(attrs["min"]),
                              HIGH=elementwise.float_literal(attrs["max"]))
