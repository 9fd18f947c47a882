"""Steps running gemm.cl, the matrix product (matmul's launcher is in math.py): batched,
numpy's broadcasting of the batch dimensions, transpose_a/transpose_b and a fused relu/relu6.

A rank-1 operand is a row (a) or a column (b): the output's memory is the same as for
(1, K) @ B or A @ (K, 1), so it takes the same kernel.

Two kernels: `matmul` tiles through local memory (GPUs, where it is on-chip);
`matmul_blocked` keeps a register block per work-item with no local memory and no
barriers (CPU runtimes such as PoCL, which emulate local memory in global memory).
`cpu_path(rt)` picks; `blocked_matmul` is also conv's GEMM (im2col, then this).
"""
import numpy as np


# (TM = TN, TK, RM = RN), best first: a work-group of (TM / RM)^2 work-items, each
# accumulating RM x RN outputs, with 2 * TK * (TM + 1) floats of local memory.
TILES = ((64, 16, 4), (32, 16, 4), (32, 8, 2), (16, 8, 2), (8, 8, 1), (1, 1, 1))


def _fits(device, tm, tk, rm):
    side = tm // rm
    return (side * side <= device.max_work_group_size and side <= min(device.max_work_item_sizes[:2])
            and 2 * tk * (tm + 1) * 4 <= device.local_mem_size)


# The CPU path: None decides by the device (a CPU, or local memory that lives in global
# memory); True/False force it (tests run both on whatever device they have).
CPU_PATH = None
# Register block per work-item (rows BM x columns BN, BN a vector width) and the
# work-group shape (LX x LY blocks) of the CPU path.
BLOCK = {"BM": 8, "BN": 8}
GROUP = (2, 4)


def cpu_path(rt):
    if CPU_PATH is not None:
        return CPU_PATH
    cl = rt.cl
    return bool(rt.device.type & cl.device_type.CPU) or rt.device.local_mem_type == cl.device_local_mem_type.GLOBAL


def blocked_kernel(rt, ta, tb):
    return rt.kernel(rt.program("gemm", TA=int(ta), TB=int(tb), **BLOCK), "matmul_blocked")


def blocked_matmul(rt, a, b, c, m, n, k, table, ta=False, tb=False, bias=None, act=0):
    """A step computing, for each row (a, b, bias offsets) of `table` (int32, 3 columns),
    C[batch] = act(op(A) @ op(B) + bias[row]) with the register-blocked kernel; a, b, c
    and bias are device buffers. The step holds its offsets buffer."""
    import pyopencl.array as cla
    offsets = cla.to_device(rt.queue, np.ascontiguousarray(table, np.int32))
    kernel = blocked_kernel(rt, ta, tb)
    bm, bn = BLOCK["BM"], BLOCK["BN"]
    kernel.set_args(a, b, c, np.int32(m), np.int32(n), np.int32(k), offsets.data,
                    a if bias is None else bias, np.int32(bias is not None), np.int32(act))
    lx, ly = GROUP
    cols, rows = -(-n // bn), -(-m // bm)
    lx, ly = min(lx, cols), min(ly, rows)  # small products: one work-group, not idle items
    grid = (-(-cols // lx) * lx, -(-rows // ly) * ly, len(table))

    def run(keep=offsets):
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, grid, (lx, ly, 1))
    return run


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
