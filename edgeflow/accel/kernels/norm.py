"""OpenCL kernels of edgeflow/ops/norm.py (norm.cl): batch_norm."""
import math

import numpy as np

from . import cl_kernel
from .conv import too_large


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
