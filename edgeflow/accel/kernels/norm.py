"""OpenCL kernels of edgeflow/ops/norm.py: batch_norm (norm.cl), layer_norm (nn.cl, one
work-group per row)."""
import math

import numpy as np

from ...ops.dims import normalize_axis
from . import cl_kernel
from .conv import too_large
from .elementwise import broadcast_strides
from .layout import per_row, shape_supported


@cl_kernel("batch_norm", unsupported=lambda attrs, ins, outs: too_large(ins, outs))
def _batch_norm(rt, ins, outs, attrs):
    x, out = ins[0], outs[0]
    n, c = x.shape[:2]
    inner = math.prod(x.shape[2:])
    kernel = rt.kernel(rt.program("norm"), "batch_norm")
    group = min(rt.max_group(kernel), 128, max(inner, 1))
    kernel.set_args(*(a.data for a in ins), out.data, np.int32(inner), np.int32(c), np.float32(attrs["epsilon"]))
    size = (-(-inner // group) * group, n * c)
    if not out.size:
        return lambda: None
    return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group, 1))


@cl_kernel("layer_norm", unsupported=shape_supported)
def _layer_norm(rt, ins, outs, attrs):
    x, scale = ins[:2]
    bias = ins[2] if len(ins) > 2 else scale  # any buffer: not read without has_bias
    axis = normalize_axis(attrs["axis"], x.ndim, "layer_norm")
    normalized = x.shape[axis:]
    extra = [list(broadcast_strides(a.shape, normalized)) for a in (scale, bias)]
    return per_row(rt, "layer_norm_rows", x.shape, list(range(axis, x.ndim)),
                   lambda R, kr, kept, rr, red: (x.data, scale.data, bias.data, outs[0].data, R, kr, kept, rr, red,
                                                 np.int32(len(ins) > 2), np.float32(attrs["epsilon"])),
                   extra)
