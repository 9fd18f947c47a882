"""OpenCL kernels of edgeflow/ops/backprop.py (backprop.cl): sum_to, slice_grad,
gather_grad, 2-D max/avg pooling gradients and the 2-D conv_input_grad / conv_filter_grad
(direct: one work-item per dx or dw element).

Each work-item computes one output element, gathering the gradient that reaches it rather
than scattering with atomics (OpenCL 1.2 has none for floats): sums run in a fixed order,
and gather_grad is declared unsupported past GATHER_LIMIT indices, where one pass over the
indices per element costs too much.
"""
import numpy as np

from ...ops.array import slice_params
from ...ops.conv import window_geometry, window_params
from ...ops.registry import TensorSpec
from . import cl_kernel
from .conv import constant_ints, launcher, too_large
from .nn import MAX_RANK, contiguous_strides
from .pool import _geometry

GATHER_LIMIT = 4096


def _table(*rows):
    """A device table of int rows, MAX_RANK wide, as backprop.cl reads it."""
    table = np.zeros((len(rows), MAX_RANK), np.int32)
    for r, row in enumerate(rows):
        table[r, :len(row)] = row
    return table


def _float_rank(attrs, ins, outs):
    if any(a.dtype != np.float32 for a in (ins[0], outs[0])):
        return "non-float32 gradients"
    if max(a.ndim for a in list(ins) + list(outs)) > MAX_RANK:
        return f"rank above {MAX_RANK}"
    return too_large(ins, outs)


def _sum_to_table(grad_shape, out_shape):
    """(table, kept dims, reduced dims, elements summed per output element)."""
    lead = len(grad_shape) - len(out_shape)
    strides = contiguous_strides(grad_shape)
    reduced = [d for d in range(len(grad_shape))
               if d < lead or (out_shape[d - lead] == 1 and grad_shape[d] != 1)]
    kept = [d for d in range(len(grad_shape)) if d not in reduced]
    rows = ([grad_shape[d] for d in kept], [strides[d] for d in kept],
            [grad_shape[d] for d in reduced], [strides[d] for d in reduced])
    return _table(*rows), len(kept), len(reduced), int(np.prod(rows[2], dtype=np.int64))


@cl_kernel("sum_to", unsupported=_float_rank)
def _sum_to(rt, ins, outs, attrs):
    grad, out = ins[0], outs[0]
    table, n_kept, n_reduced, count = _sum_to_table(grad.shape, out.shape)
    geo = constant_ints(rt, table)
    total = int(out.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "sum_to"), total, grad.data, out.data,
                    geo.data, np.int32(total), np.int32(n_kept), np.int32(n_reduced), np.int32(count))
    return lambda keep=geo: step()


@cl_kernel("slice_grad", unsupported=_float_rank)
def _slice_grad(rt, ins, outs, attrs):
    grad, out = ins[0], outs[0]
    rank = max(out.ndim, 1)
    shape = out.shape or (1,)
    first, steps, counts = [0] * rank, [1] * rank, list(shape)
    starts, ends, axes, strides = slice_params([TensorSpec(out.shape, out.dtype)], attrs)
    for axis, start, end, step in zip(axes, starts, ends, strides):
        taken = range(*slice(start, end, step).indices(shape[axis]))
        first[axis % rank], steps[axis % rank], counts[axis % rank] = taken.start, taken.step, len(taken)
    geo = constant_ints(rt, _table(shape, first, steps, counts, contiguous_strides(grad.shape or (1,))))
    total = int(out.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "slice_grad"), total, grad.data, out.data,
                    geo.data, np.int32(total), np.int32(rank))
    return lambda keep=geo: step()


def _gather_unsupported(attrs, ins, outs):
    grad, indices = ins[0], ins[1]
    if grad.dtype != np.float32 or outs[0].dtype != np.float32:
        return "non-float32 gradients"
    if indices.size > GATHER_LIMIT:
        return f"more than {GATHER_LIMIT} indices (one pass over them per element)"
    return too_large(ins, outs)


@cl_kernel("gather_grad", unsupported=_gather_unsupported, int_inputs=True)
def _gather_grad(rt, ins, outs, attrs):
    grad, indices, out = ins[0], ins[1], outs[0]
    axis = attrs["axis"] % out.ndim
    n, inner = out.shape[axis], int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    index = "long" if indices.dtype == np.int64 else "int"
    total = int(out.size)
    return launcher(rt, rt.kernel(rt.program("backprop", INDEX=index), "gather_grad"), total, grad.data,
                    indices.data, out.data, np.int32(total), np.int32(n), np.int32(indices.size),
                    np.int32(inner))


def _pool_unsupported(attrs, ins, outs):
    if ins[0].ndim != 4:
        return "1-D and 3-D pooling gradients (only 2-D runs on OpenCL)"
    return too_large(ins, outs)


@cl_kernel("max_pool_grad", unsupported=_pool_unsupported)
def _max_pool_grad(rt, ins, outs, attrs):
    x, dy, dx = ins[0], ins[1], outs[0]
    geo = constant_ints(rt, _geometry("max_pool", attrs, x.shape))
    total = int(dx.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "max_pool_grad"), total,
                    x.data, dy.data, dx.data, geo.data, np.int32(total))
    return lambda keep=geo: step()


@cl_kernel("avg_pool_grad", unsupported=_pool_unsupported)
def _avg_pool_grad(rt, ins, outs, attrs):
    dy, like, dx = ins[0], ins[1], outs[0]
    geo = constant_ints(rt, _geometry("avg_pool", attrs, like.shape))
    total = int(dx.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "avg_pool_grad"), total,
                    dy.data, dx.data, geo.data, np.int32(total), np.int32(attrs["count_include_pad"]))
    return lambda keep=geo: step()


def _conv_grad_unsupported(attrs, ins, outs):
    if outs[0].ndim != 4:
        return "1-D and 3-D convolution gradients (only 2-D runs on OpenCL)"
    if any(a.dtype != np.float32 for a in list(ins[:2]) + list(outs)):
        return "non-float32 gradients"
    return too_large(ins, outs)


def _conv_grad_geometry(rt, attrs, x_shape, w_shape, dy_shape):
    """conv.cl's geometry table of the forward conv x (*) w -> dy, on the device."""
    _, _, h, wd = x_shape
    m, _, kh, kw = w_shape
    strides, dilations, _ = window_params("conv", attrs, 2)
    _, begin, _ = window_geometry("conv", (h, wd), (kh, kw), attrs)
    return constant_ints(rt, (x_shape[1], h, wd, m, dy_shape[2], dy_shape[3], kh, kw, *strides, *dilations,
                              *begin, attrs["group"]))


@cl_kernel("conv_input_grad", unsupported=_conv_grad_unsupported)
def _conv_input_grad(rt, ins, outs, attrs):
    dy, w, dx = ins[0], ins[1], outs[0]
    geo = _conv_grad_geometry(rt, attrs, dx.shape, w.shape, dy.shape)
    total = int(dx.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "conv_input_grad"), total,
                    dy.data, w.data, dx.data, geo.data, np.int32(total))
    return lambda keep=geo: step()


@cl_kernel("conv_filter_grad", unsupported=_conv_grad_unsupported)
def _conv_filter_grad(rt, ins, outs, attrs):
    x, dy, dw = ins[0], ins[1], outs[0]
    geo = _conv_grad_geometry(rt, attrs, x.shape, dw.shape, dy.shape)
    total = int(dw.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "conv_filter_grad"), total,
                    x.data, dy.data, dw.data, geo.data, np.int32(total), np.int32(x.shape[0]))
    return lambda keep=geo: step()
