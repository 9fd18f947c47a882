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
