"""Normalizing functions, reductions and data movement (nn.cl).

softmax, log_softmax, layer_norm and the reductions run one work-group per output row,
reducing through local memory; transpose, slice, concat, gather and where move whole
elements as words of their size (float32 or int32; fp16 mode's half-stored floats as
16-bit words). Shapes reach the device as tables of dims and strides, with adjacent dims
merged first, so one build of nn.cl per word size serves every shape.

gather: an index outside [-n, n) gives NaN (float params) or 0 (int32) on the device,
where numpy raises IndexError: indices may be computed on the device, and a kernel
cannot raise. Check indices before feeding them if they can be out of range.
"""
import numpy as np

from ...ops.dims import normalize_axis
from . import cl_kernel, tensor_dtype
from .elementwise import broadcast_strides

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


def _program(rt, word="uint"):
    return rt.program("nn", MAX_RANK=MAX_RANK, WORD=word)


def _word(array):
    """nn.cl's WORD moving the elements of device array `array`."""
    return WORDS[array.dtype.itemsize]


def _linear(rt, name, n, *args, keep=(), word="uint"):
    """A step running kernel `name` over n work-items, one per element."""
    if n == 0:
        return lambda: None
    kernel = rt.kernel(_program(rt, word), name)
    group = min(rt.max_group(kernel), GROUP)
    kernel.set_args(*args)
    size = (-(-n // group) * group,)

    def run(keep=keep):  # the step owns its geometry buffers
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))
    return run


def _rows(rt, name, shape, red_axes, args, extra=()):
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
    kernel = rt.kernel(_program(rt), name)
    group = 1
    while group * 2 <= min(rt.max_group(kernel), GROUP, max(R, 1)):
        group *= 2
    kernel.set_args(*args(np.int32(R), np.int32(len(kdims)), kept.data, np.int32(len(rdims)), red.data),
                    rt.cl.LocalMemory(4 * group))

    def run(keep=(kept, red)):
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, (rows * group,), (group,))
    return run


def _fits(attrs, ins, outs):
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


def _words(attrs, ins, outs):
    """Data movement: 4-byte elements only."""
    odd = [str(a.dtype) for a in list(ins[:1]) + list(outs) if a.dtype not in ALIGNED]
    return f"dtype {odd[0]} (float32 and int32 only)" if odd else _fits(attrs, ins, outs)


# -- normalizing functions and reductions --------------------------------------------

def _softmax(log_mode):
    def make(rt, ins, outs, attrs):
        x = ins[0]
        axis = normalize_axis(attrs["axis"], x.ndim, "softmax")
        return _rows(rt, "softmax_rows", x.shape, [axis],
                     lambda *geo: (x.data, outs[0].data, *geo, np.int32(log_mode)))
    return make


cl_kernel("softmax", unsupported=_fits)(_softmax(0))
cl_kernel("log_softmax", unsupported=_fits)(_softmax(1))


@cl_kernel("layer_norm", unsupported=_fits)
def _layer_norm(rt, ins, outs, attrs):
    x, scale = ins[:2]
    bias = ins[2] if len(ins) > 2 else scale  # any buffer: not read without has_bias
    axis = normalize_axis(attrs["axis"], x.ndim, "layer_norm")
    normalized = x.shape[axis:]
    extra = [list(broadcast_strides(a.shape, normalized)) for a in (scale, bias)]
    return _rows(rt, "layer_norm_rows", x.shape, list(range(axis, x.ndim)),
                 lambda R, kr, kept, rr, red: (x.data, scale.data, bias.data, outs[0].data, R, kr, kept, rr, red,
                                               np.int32(len(ins) > 2), np.float32(attrs["epsilon"])),
                 extra)


def _reduce(mode):
    def make(rt, ins, outs, attrs):
        x = ins[0]
        axes = sorted({a % x.ndim for a in attrs["axes"]}) if attrs["axes"] else list(range(x.ndim))
        return _rows(rt, "reduce_rows", x.shape, axes, lambda *geo: (x.data, outs[0].data, *geo, np.int32(mode)))
    return make


for _mode, _name in enumerate(("reduce_sum", "reduce_mean", "reduce_max")):
    cl_kernel(_name, unsupported=_fits)(_reduce(_mode))


# -- data movement ---------------------------------------------------------------------

def _strided(rt, x, out, base, strides):
    """out[i] = x[base + offset of out's index i under `strides`]."""
    dims, (merged,) = merge_dims(list(out.shape), list(strides))
    geo = geometry(rt, dims, merged)
    n = int(out.size)
    return _linear(rt, "gather_strided", n, x.data, out.data, np.int32(n), np.int32(base),
                   np.int32(len(dims)), geo.data, keep=geo, word=_word(x))


@cl_kernel("transpose", unsupported=_words, int_inputs=True)
def _transpose(rt, ins, outs, attrs):
    x = ins[0]
    perm = attrs["perm"] or tuple(reversed(range(x.ndim)))
    strides = contiguous_strides(x.shape)
    return _strided(rt, x, outs[0], 0, [strides[p] for p in perm])


def _slice_unsupported(attrs, ins, outs):
    return "starts/ends given as operands (attr form only)" if len(ins) > 1 else _words(attrs, ins, outs)


@cl_kernel("slice", unsupported=_slice_unsupported, int_inputs=True)
def _slice(rt, ins, outs, attrs):
    x = ins[0]
    starts, ends = attrs["starts"], attrs["ends"]
    axes = attrs["axes"] or tuple(range(len(starts)))
    steps = attrs["steps"] or (1,) * len(starts)
    strides = contiguous_strides(x.shape)
    base = 0
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = normalize_axis(axis, x.ndim, "slice")
        first = slice(start, end, step).indices(x.shape[axis])[0]
        base += first * strides[axis]
        strides[axis] *= step
    return _strided(rt, x, outs[0], base, strides)


@cl_kernel("concat", unsupported=_words, int_inputs=True)
def _concat(rt, ins, outs, attrs):
    out = outs[0]
    axis = normalize_axis(attrs["axis"], out.ndim, "concat")
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    rows = int(np.prod(out.shape[:axis], dtype=np.int64))
    pitch = out.shape[axis] * inner
    steps, at = [], 0
    for x in ins:
        cols = x.shape[axis] * inner
        steps.append(_linear(rt, "copy_block", rows * cols, x.data, out.data, np.int32(rows),
                             np.int32(cols), np.int32(pitch), np.int32(at), word=_word(out)))
        at += cols

    def run():
        for step in steps:
            step()
    return run


def _gather_unsupported(attrs, ins, outs):
    return _words(attrs, ins[:1], outs)


@cl_kernel("gather", unsupported=_gather_unsupported, int_inputs=True)
def _gather(rt, ins, outs, attrs):
    params, indices = ins
    out = outs[0]
    axis = normalize_axis(attrs["axis"], params.ndim, "gather")
    n = params.shape[axis]
    inner = int(np.prod(params.shape[axis + 1:], dtype=np.int64))
    bits = np.dtype(f"u{params.dtype.itemsize}")
    fill = np.array(np.nan if params.dtype.kind == "f" else 0, params.dtype).view(bits)[()]
    name = "gather_i64" if indices.dtype == np.int64 else "gather_i32"
    total = int(out.size)
    return _linear(rt, name, total, params.data, indices.data, out.data, np.int32(total), np.int32(n),
                   np.int32(max(int(indices.size), 1)), np.int32(max(inner, 1)), fill, word=_word(params))


def _where_unsupported(attrs, ins, outs):
    return _words(attrs, ins[1:], outs)


@cl_kernel("where", unsupported=_where_unsupported, int_inputs=True)
def _where(rt, ins, outs, attrs):
    out = outs[0]
    shape = out.shape or (1,)
    strides = [list(broadcast_strides(a.shape, shape)) for a in ins]
    dims, merged = merge_dims(list(shape), *strides)
    geo = geometry(rt, dims, *merged)
    n = int(out.size)
    return _linear(rt, "where_select", n, *(a.data for a in ins), out.data, np.int32(n),
                   np.int32(len(dims)), geo.data, keep=geo, word=_word(out))


CASTS = {(np.dtype(np.float32), np.dtype(np.int32)): "cast_to_int",
         (np.dtype(np.int32), np.dtype(np.float32)): "cast_to_float",
         (np.dtype(np.bool_), np.dtype(np.float32)): "bool_to_float"}


def _cast_unsupported(attrs, ins, outs):
    pair = (ins[0].dtype, outs[0].dtype)
    if pair not in CASTS and not (pair[0] == pair[1] and pair[0] in ALIGNED):
        return f"cast {pair[0]} -> {pair[1]} (float32 <-> int32 and bool -> float32 only)"
    return None


@cl_kernel("cast", unsupported=_cast_unsupported, int_inputs=True)
def _cast(rt, ins, outs, attrs):
    x, out = ins[0], outs[0]
    n = int(out.size)
    if x.dtype == out.dtype:
        return _linear(rt, "copy_block", n, x.data, out.data, np.int32(1), np.int32(n), np.int32(n), np.int32(0),
                       word=_word(x))
    return _linear(rt, CASTS[(tensor_dtype(x), tensor_dtype(out))], n, x.data, out.data, np.int32(n))
