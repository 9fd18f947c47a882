"""Kernels of edgeflow/ops/array.py (reshape, squeeze and expand_dims are views: no kernel)."""
from functools import partial

import numpy as np

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
    steps = attrs["steps"] or (1,) * len(attrs["starts"])
    axes = attrs["axes"] or range(len(attrs["starts"]))
    for axis, start, end, step in zip(axes, attrs["starts"], attrs["ends"], steps):
        index[axis] = slice(start, end, step)
    return partial(np.copyto, outs[0], x[tuple(index)])


def _gather(params, indices, axis, out):
    n = params.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"gather: an index is out of range [-{n}, {n}) for axis {axis}")
    np.take(params, indices, axis=axis, out=out)


@kernel("gather")
def _gather_kernel(ins, outs, attrs):
    return partial(_gather, ins[0], ins[1], attrs["axis"] % ins[0].ndim, outs[0])
