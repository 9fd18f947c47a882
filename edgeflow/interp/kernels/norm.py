"""Kernels of edgeflow/ops/norm.py."""
import numpy as np

from . import jit, kernel


def batch_norm_activation(ins, out, attrs, activation=""):
    """A step writing act(x * a + b) to `out` in one pass (jit.bind_scale_shift), a = scale /
    sqrt(var + eps) and b = bias - mean * a as _batch_norm makes them (the same bits): made
    once here where the four are constants, else before each run (variables: a model being
    trained); or None where the loop does not bind. plan.py fuses the relu or relu6 that
    alone reads a batch norm's output into it so (DenseNet's and pre-activation ResNets'
    batch norm, then relu, before each conv)."""
    x, scale, bias, mean, var = ins
    eps = attrs["epsilon"]
    a, b = np.empty(x.shape[1:2], x.dtype), np.empty(x.shape[1:2], x.dtype)

    def factors():
        np.divide(scale, np.sqrt(var + eps), out=a, casting="unsafe")
        np.subtract(bias, mean * a, out=b, casting="unsafe")
    step = jit.bind_scale_shift(x, a, b, out, activation) if x.ndim >= 2 and x.shape[1] == scale.shape[0] else None
    if step is None:
        return None
    if not any(v.flags.writeable for v in ins[1:]):
        factors()
        return step

    def run():
        factors()
        step()
    return run


@kernel("batch_norm")
def _batch_norm(ins, outs, attrs):
    """x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a: one pass where numba
    is loaded (batch_norm_activation), else two numpy passes over x, a and b recomputed per
    run (C elements: the statistics may be variables)."""
    fused = batch_norm_activation(ins, outs[0], attrs)
    if fused is not None:
        return fused
    x, scale, bias, mean, var = ins
    out, eps = outs[0], attrs["epsilon"]
    per_channel = (-1,) + (1,) * (x.ndim - 2)

    def run():
        a = scale / np.sqrt(var + eps)
        np.multiply(x, a.reshape(per_channel), out=out, casting="unsafe")
        np.add(out, (bias - mean * a).reshape(per_channel), out=out, casting="unsafe")
    return run


@kernel("layer_norm")
def _layer_norm(ins, outs, attrs):
    """Statistics over axes [axis, rank); float16 inputs are normalized in float32."""
    x, scale = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    out, eps = outs[0], attrs["epsilon"]
    step = jit.bind_layer_norm(x, scale, bias, out, attrs["axis"], eps)
    if step is not None:
        return step
    axes = tuple(range(attrs["axis"] % x.ndim, x.ndim))
    wide = np.float32 if x.dtype == np.float16 else None
    centered = np.empty(x.shape, wide) if wide else out

    def run():
        np.subtract(x, np.mean(x, axis=axes, keepdims=True, dtype=wide), out=centered)
        var = np.mean(np.square(centered), axis=axes, keepdims=True)
        np.multiply(centered, 1 / np.sqrt(var + eps), out=centered)
        np.multiply(centered, scale, out=out, casting="unsafe")
        if bias is not None:
            np.add(out, bias, out=out)
    return run
