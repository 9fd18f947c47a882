"""Kernels of edgeflow/ops/array.py (reshape, squeeze and expand_dims are views: no kernel)."""
from functools import partial

import numpy as np

from ...ops.array import slice_params
from ...ops.registry import TensorSpec
from . import kernel


@kernel("transpose")
def _transpose(ins, outs, attrs):
    return partial(np.copyto, outs[0], ins[0].transpose(attrs["perm"] or None))


@kernel("concat")
def _concat(ins, outs, attrs):
    return partial(np.concatenate, ins, attrs["axis"], outs[0])


@kernel("slice")
def _slice(ins, outs, attrs):
    x = ins[0]
    index = [np.s_[:]] * x.ndim
    specs = [TensorSpec(a.shape, a.dtype, a) for a in ins]
    for axis, start, end, step in zip(*_reorder(slice_params(specs, attrs))):
        index[axis] = slice(start, end, step)
    return partial(np.copyto, outs[0], x[tuple(index)])


def _reorder(params):
    starts, ends, axes, steps = params
    return axes, starts, ends, steps


def _gather(params, indices, axis, out):
    n = params.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"gather: an index is out of range [-{n}, {n}) for axis {axis}")
    np.take(params, indices, axis=axis, out=out)


@kernel("gather")
def _gather_kernel(ins, outs, attrs):
    return partial(_gather, ins[0], ins[1], attrs["axis"] % ins[0].ndim, outs[0])


@kernel("slice_grad")
def _slice_grad(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    index = [np.s_[:]] * out.ndim
    starts, ends, axes, steps = slice_params([TensorSpec(out.shape, out.dtype)], attrs)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        index[axis] = slice(start, end, step)
    window = out[tuple(index)]

    def run():
        out.fill(0)
        np.copyto(window, grad)
    return run


@kernel("gather_grad")
def _gather_grad(ins, outs, attrs):
    grad, indices, out = ins[0], ins[1], outs[0]
    axis = attrs["axis"] % out.ndim
    n = out.shape[axis]
    flat = indices.reshape(-1)
    rows = np.moveaxis(grad.reshape(out.shape[:axis] + flat.shape + out.shape[axis + 1:]), axis, 0)
    target = np.moveaxis(out, axis, 0)  # views: scatter along the first axis

    def run():
        out.fill(0)
        np.add.at(target, flat % n, rows)
    return run
