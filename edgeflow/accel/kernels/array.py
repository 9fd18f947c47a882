"""OpenCL kernels of edgeflow/ops/array.py: transpose, slice, concat and gather move whole
elements (nn.cl); slice_grad and gather_grad (backprop.cl) gather each output element's
gradient.

gather: an index outside [-n, n) gives NaN (float params) or 0 (int32) on the device,
where numpy raises IndexError: indices may be computed on the device, and a kernel
cannot raise. Check indices before feeding them if they can be out of range.

gather_grad gathers rather than scattering with atomics (OpenCL 1.2 has none for
floats), so it is declared unsupported past GATHER_LIMIT indices, where one pass over
the indices per element costs too much.
"""
import numpy as np

from ...ops.array import slice_params
from ...ops.dims import normalize_axis
from . import cl_kernel
from .conv import constant_ints, launcher, too_large
from .layout import (contiguous_strides, float32_supported, geometry, host_table, merge_dims, per_element, word_of,
                     words_supported)

GATHER_LIMIT = 4096


def _strided(rt, x, out, base, strides):
    """out[i] = x[base + offset of out's index i under `strides`]."""
    dims, (merged,) = merge_dims(list(out.shape), list(strides))
    geo = geometry(rt, dims, merged)
    n = int(out.size)
    return per_element(rt, "gather_strided", n, x.data, out.data, np.int32(n), np.int32(base),
                       np.int32(len(dims)), geo.data, keep=geo, word=word_of(x))


@cl_kernel("transpose", unsupported=words_supported, int_inputs=True)
def _transpose(rt, ins, outs, attrs):
    x = ins[0]
    perm = attrs["perm"] or tuple(reversed(range(x.ndim)))
    strides = contiguous_strides(x.shape)
    return _strided(rt, x, outs[0], 0, [strides[p] for p in perm])


def _slice_unsupported(attrs, ins, outs):
    return "starts/ends given as operands (attr form only)" if len(ins) > 1 else words_supported(attrs, ins, outs)


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


@cl_kernel("concat", unsupported=words_supported, int_inputs=True)
def _concat(rt, ins, outs, attrs):
    out = outs[0]
    axis = normalize_axis(attrs["axis"], out.ndim, "concat")
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    rows = int(np.prod(out.shape[:axis], dtype=np.int64))
    pitch = out.shape[axis] * inner
    steps, at = [], 0
    for x in ins:
        cols = x.shape[axis] * inner
        steps.append(per_element(rt, "copy_block", rows * cols, x.data, out.data, np.int32(rows),
                                 np.int32(cols), np.int32(pitch), np.int32(at), word=word_of(out)))
        at += cols

    def run():
        for step in steps:
            step()
    return run


def _gather_unsupported(attrs, ins, outs):
    return words_supported(attrs, ins[:1], outs)


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
    return per_element(rt, name, total, params.data, indices.data, out.data, np.int32(total), np.int32(n),
                       np.int32(max(int(indices.size), 1)), np.int32(max(inner, 1)), fill, word=word_of(params))


@cl_kernel("slice_grad", unsupported=float32_supported)
def _slice_grad(rt, ins, outs, attrs):
    grad, out = ins[0], outs[0]
    rank = max(out.ndim, 1)
    shape = out.shape or (1,)
    first, steps, counts = [0] * rank, [1] * rank, list(shape)
    starts, ends, axes, strides = slice_params(attrs)
    for axis, start, end, step in zip(axes, starts, ends, strides):
        taken = range(*slice(start, end, step).indices(shape[axis]))
        first[axis % rank], steps[axis % rank], counts[axis % rank] = taken.start, taken.step, len(taken)
    geo = constant_ints(rt, host_table(shape, first, steps, counts, contiguous_strides(grad.shape or (1,))))
    total = int(out.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "slice_grad"), total, grad.data, out.data,
                    geo.data, np.int32(total), np.int32(rank))
    return lambda keep=geo: step()


def _gather_grad_unsupported(attrs, ins, outs):
    grad, indices = ins[0], ins[1]
    if grad.dtype != np.float32 or outs[0].dtype != np.float32:
        return "non-float32 gradients"
    if indices.size > GATHER_LIMIT:
        return f"more than {GATHER_LIMIT} indices (one pass over them per element)"
    return too_large(ins, outs)


@cl_kernel("gather_grad", unsupported=_gather_grad_unsupported, int_inputs=True)
def _gather_grad(rt, ins, outs, attrs):
    grad, indices, out = ins[0], ins[1], outs[0]
    axis = attrs["axis"] % out.ndim
    n, inner = out.shape[axis], int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    index = "long" if indices.dtype == np.int64 else "int"
    total = int(out.size)
    return launcher(rt, rt.kernel(rt.program("backprop", INDEX=index), "gather_grad"), total, grad.data,
                    indices.data, out.data, np.int32(total), np.int32(n), np.int32(indices.size),
                    np.int32(inner))
