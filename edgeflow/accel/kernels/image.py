"""OpenCL kernels of edgeflow/ops/image.py (image.cl): pad."""
import numpy as np

from . import cl_kernel
from .conv import constant_ints, launcher, too_large

MAX_RANK = 8


def _sources(n, pb, pe, mode):
    """Input index of each output index along one axis (-1: the constant)."""
    if mode == "constant":
        k = np.arange(n + pb + pe) - pb
        return np.where((k >= 0) & (k < n), k, -1)
    return np.pad(np.arange(n), (pb, pe), mode=mode)


def _unsupported(attrs, ins, outs):
    if not 1 <= ins[0].ndim <= MAX_RANK:
        return f"rank {ins[0].ndim} (1 to {MAX_RANK} run on OpenCL)"
    if not (ins[0].size and outs[0].size):
        return "an empty input or output"
    return too_large(ins, outs)


@cl_kernel("pad", unsupported=_unsupported)
def _pad(rt, ins, outs, attrs):
    x, out = ins[0], outs[0]
    pads, rank = attrs["pads"], x.ndim
    tables = [_sources(n, pads[i], pads[i + rank], attrs["mode"]) for i, n in enumerate(x.shape)]
    offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
    strides = [int(np.prod(x.shape[i + 1:])) for i in range(rank)]
    keep = [constant_ints(rt, v) for v in (out.shape, strides, offsets, np.concatenate(tables))]
    total = int(out.size)
    kernel = rt.kernel(rt.program("image"), "pad")
    step = launcher(rt, kernel, total, x.data, out.data, np.int32(total), np.int32(rank),
                    *(k.data for k in keep), np.float32(attrs["value"]))
    return lambda keep=keep: step()
