"""Shapes as the OpenCL kernels read them, and launches of nn.cl's kernels.

Shapes reach the device as tables of dims and strides (MAX_RANK ints a row), with
adjacent dims merged first, so one build of nn.cl per word size serves every shape.
`linear` runs a kernel with one work-item per element; `rows` one work-group per row,
reducing through local memory. Data movement moves whole elements as words of their size
(float32 or int32; fp16 mode's half-stored floats as 16-bit words).
"""
import numpy as np

from .conv import too_large

MAX_RANK = 8
GROUP = 256  # the largest work-group the kernels ask for
ALIGNED = (np.dtype(np.float32), np.dtype(np.int32))
WORDS = {4: "uint", 2: "ushort"}  # nn.cl's WORD for elements of this many bytes


def contiguous_strides(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


def merge_dims(dims, *strides):
    """(dims, strides...) walking the same elements in the same order with fewer dims:
    size-1 dims dropped, and a dim folded into the next where every operand steps over
    it contiguously."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    out_dims, out_strides = [], [[] for _ in strides]
    for i in keep:
        if out_dims and all(s[-1] == t[i] * dims[i] for s, t in zip(out_strides, strides)):
            out_dims[-1] *= dims[i]
            for s, t in zip(out_strides, strides):
                s[-1] = t[i]
            continue
        out_dims.append(dims[i])
        for s, t in zip(out_strides, strides):
            s.append(t[i])
    if not out_dims:
        return [1], [[0] for _ in strides]
    return out_dims, out_strides


def geometry(rt, dims, *strides):
    """A device table: dims, then each operand's strides, MAX_RANK ints a row."""
    import pyopencl.array as cla
    table = np.zeros((1 + len(strides), MAX_RANK), np.int32)
    table[0, :len(dims)] = dims
    for row, s in enumerate(strides, 1):
        table[row, :len(s)] = s
    return cla.to_device(rt.queue, table)


def nn_program(rt, word="uint"):
    """nn.cl built for elements moved as `word`."""
    return rt.program("nn", MAX_RANK=MAX_RANK, WORD=word)


def word_of(array):
    """nn.cl's WORD moving the elements of device array `array`."""
    return WORDS[array.dtype.itemsize]


def per_element(rt, name, n, *args, keep=(), word="uint"):
    """A step running kernel `name` over n work-items, one per element."""
    if n == 0:
        return lambda: None
    kernel = rt.kernel(nn_program(rt, word), name)
    group = min(rt.max_group(kernel), GROUP)
    kernel.set_args(*args)
    size = (-(-n // group) * group,)

    def run(keep=keep):  # the step owns its geometry buffers
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))
    return run


def per_row(rt, name, shape, red_axes, args, extra=()):
    """A step running row kernel `name`: one work-group per row of `shape` left when
    `red_axes` are taken out; `extra` are further per-element stride sets over red_axes
    (layer_norm's scale and bias). `args(R, kr, kept, rr, red)` -> the kernel's arguments."""
    strides = contiguous_strides(shape)
    kept_axes = [a for a in range(len(shape)) if a not in red_axes]
    kdims, (kstrides,) = merge_dims([shape[a] for a in kept_axes], [strides[a] for a in kept_axes])
    rdims, rsets = merge_dims([shape[a] for a in red_axes], [strides[a] for a in red_axes], *extra)
    rows = int(np.prod([shape[a] for a in kept_axes], dtype=np.int64))
    R = int(np.prod([shape[a] for a in red_axes], dtype=np.int64))
    if rows == 0:
        return lambda: None
    kept, red = geometry(rt, kdims, kstrides), geometry(rt, rdims, *rsets)
    kernel = rt.kernel(nn_program(rt), name)
    group = 1
    while group * 2 <= min(rt.max_group(kernel), GROUP, max(R, 1)):
        group *= 2
    kernel.set_args(*args(np.int32(R), np.int32(len(kdims)), kept.data, np.int32(len(rdims)), red.data),
                    rt.cl.LocalMemory(4 * group))

    def run(keep=(kept, red)):
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, (rows * group,), (group,))
    return run


def shape_supported(attrs, ins, outs):
    arrays = list(ins) + [o for o in outs if o is not None]
    if max(a.ndim for a in arrays) > MAX_RANK:
        return f"rank above {MAX_RANK}"
    return sizes_supported(arrays)


def sizes_supported(arrays):
    """Why not, where a tensor is empty (nothing to compute; a device buffer cannot be
    empty) or too large for the kernels' int indexing; else None."""
    if min(a.size for a in arrays) == 0:
        return "empty tensor"
    if max(a.size for a in arrays) >= 2 ** 31:
        return "more than 2^31 elements"
    return None


def words_supported(attrs, ins, outs):
    """Data movement: 4-byte elements only."""
    odd = [str(a.dtype) for a in list(ins[:1]) + list(outs) if a.dtype not in ALIGNED]
    return f"dtype {odd[0]} (float32 and int32 only)" if odd else shape_supported(attrs, ins, outs)


def host_table(*rows):
    """A table of int rows, MAX_RANK wide, as backprop.cl reads it (host side)."""
    table = np.zeros((len(rows), MAX_RANK), np.int32)
    for r, row in enumerate(rows):
        table[r, :len(row)] = row
    return table


def float32_supported(attrs, ins, outs):
    """Why not, for backprop.cl's float32-only kernels; else None."""
    if any(a.dtype != np.float32 for a in (ins[0], outs[0])):
        return "non-float32 gradients"
    if max(a.ndim for a in list(ins) + list(outs)) > MAX_RANK:
        return f"rank above {MAX_RANK}"
    return too_large(ins, outs)
