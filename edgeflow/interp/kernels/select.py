"""Kernels of edgeflow/ops/select.py. Their outputs were allocated for the sizes the values
give (the plan ran inference on the same values), so each kernel fills them exactly."""
import numpy as np

from ...ops import select
from ...ops.select import non_max_suppression
from . import jit, kernel

select.group_pass = jit.nms_group


@kernel("nonzero")
def _nonzero(ins, outs, attrs):
    x, out = ins[0], outs[0]

    def run():
        if x.ndim:
            np.stack(np.nonzero(x), out=out)
    return run


@kernel("compress")
def _compress(ins, outs, attrs):
    x, condition, out = ins[0], ins[1], outs[0]
    return lambda: np.compress(condition, x, axis=attrs["axis"], out=out)


@kernel("unique")
def _unique(ins, outs, attrs):
    x, (y, first, inverse, counts) = ins[0], outs
    axis = attrs["axis"]

    def run():
        flat = x.reshape(-1) if axis is None else x
        values, index, back, count = np.unique(flat, return_index=True, return_inverse=True,
                                               return_counts=True, axis=None if axis is None else axis % x.ndim)
        if not attrs["sorted"]:  # in order of first occurrence
            order = np.argsort(index, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            values = np.take(values, order, axis=0 if axis is None else axis % x.ndim)
            index, count, back = index[order], count[order], rank[back.reshape(-1)]
        np.copyto(y, values)
        np.copyto(first, index)
        np.copyto(inverse, back.reshape(-1))
        np.copyto(counts, count)
    return run


@kernel("non_max_suppression")
def _non_max_suppression(ins, outs, attrs):
    boxes, scores, out = ins[0], ins[1], outs[0]
    return lambda: np.copyto(out, non_max_suppression(boxes, scores, attrs))
