"""Kernels of edgeflow/ops/backprop.py."""
from functools import partial

import numpy as np

from ...ops.array import slice_params
from ...ops.registry import TensorSpec
from . import kernel


@kernel("sum_to")
def _sum_to(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    lead = grad.ndim - out.ndim
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(out.shape)
                                      if d == 1 and grad.shape[lead + i] != 1)
    # keepdims: the sum's shape is out's with `lead` leading 1s, a view of out.
    return partial(np.sum, grad, axis=axes, keepdims=True, out=out.reshape((1,) * lead + out.shape))


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
