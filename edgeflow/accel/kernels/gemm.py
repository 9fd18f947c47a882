"""Matrix product (gemm.cl): batched, numpy's broadcasting of the batch dimensions,
transpose_a/transpose_b and a fused relu/relu6.

A rank-1 operand is a row (a) or a column (b): the output's memory is the same as for
(1, K) @ B or A @ (K, 1), so it takes the same kernel.
"""
import numpy as np

from . import cl_kernel
from .elementwise import ACTIVATIONS

# (TM = TN, TK, RM = RN), best first: a work-group of (TM / RM)^2 work-items, each
# accumulating RM x RN outputs, with 2 * TK * (TM + 1) floats of local memory.
TILES = ((64, 16, 4), (32, 16, 4), (32, 8, 2), (16, 8, 2), (8, 8, 1), (1, 1, 1))


def _fits(device, tm, tk, rm):
    side = tm // rm
    return (side * side <= device.max_work_group_size and side <= min(device.max_work_item_sizes[:2])
            and 2 * tk * (tm + 1) * 4 <= device.local_mem_size)


def matmul_kernel(rt):
    """(kernel, TM, RM): the largest tiling this device builds and launches."""
    for tm, tk, rm in TILES:
        if not _fits(rt.device, tm, tk, rm):
            continue
        kernel = rt.kernel(rt.program("gemm", TM=tm, TN=tm, TK=tk, RM=rm, RN=rm), "matmul")
        if rt.max_group(kernel) >= (tm // rm) ** 2:
            return kernel, tm, rm
    raise AssertionError(f"{rt.device.name}: no matmul tiling fits")


def batch_offsets(a_shape, b_shape, batch_shape, a_size, b_size):
    """Element offsets (a, b) of each output batch, numpy's batch broadcasting applied."""
    count = int(np.prod(batch_shape, dtype=np.int64))

    def offsets(shape, size):
        index = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
        return np.broadcast_to(index, batch_shape).reshape(count) * size
    return np.stack([offsets(a_shape, a_size), offsets(b_shape, b_size)], 1).astype(np.int32)


def _unsupported(attrs, ins, outs):
    if any(a.ndim == 0 for a in ins):
        return "scalar operand"
    from .nn import sizes_supported
    return sizes_supported(list(ins) + list(outs))


@cl_kernel("matmul", unsupported=_unsupported)
def _matmul(rt, ins, outs, attrs):
    a, b = ins
    out = outs[0]
    ta = bool(attrs["transpose_a"]) and a.ndim >= 2
    tb = bool(attrs["transpose_b"]) and b.ndim >= 2
    sa = a.shape if a.ndim >= 2 else (1,) + a.shape
    sb = b.shape if b.ndim >= 2 else b.shape + (1,)
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    batch_shape = np.broadcast_shapes(sa[:-2], sb[:-2])
    table = batch_offsets(sa[:-2], sb[:-2], batch_shape, m * k, k * n)
    batches = len(table)
    if 0 in (m, n, batches):
        return lambda: None
    import pyopencl.array as cla
    offsets = cla.to_device(rt.queue, table)
    kernel, tile, per_item = matmul_kernel(rt)
    side = tile // per_item
    kernel.set_args(a.data, b.data, out.data, np.int32(m), np.int32(n), np.int32(k), offsets.data,
                    np.int32(ta), np.int32(tb), np.int32(ACTIVATIONS[attrs.get("activation", "")]))
    grid = (-(-n // tile) * side, -(-m // tile) * side, batches)

    def run(keep=offsets):  # the step owns the offsets buffer
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, grid, (side, side, 1))
    return run
