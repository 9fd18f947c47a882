"""Kernels of edgeflow/ops/norm.py."""
import numpy as np

from . import jit, kernel


@kernel("batch_norm")
def _batch_norm(ins, outs, attrs):
    """x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a: two passes over x.

    a and b are recomputed per run (C elements): the statistics may be variables.
    """
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
