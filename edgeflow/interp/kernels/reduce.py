"""Kernels of edgeflow/ops/reduce.py."""
from functools import partial

import numpy as np

from . import kernel


def _reduction(fn):
    def make(ins, outs, attrs):
        axes = tuple(a % ins[0].ndim for a in attrs["axes"]) if attrs["axes"] else None
        return partial(fn, ins[0], axis=axes, keepdims=attrs["keepdims"], out=outs[0])
    return make


def _mean(x, axis, keepdims, out):
    # Not np.mean(out=out): that sums float16 in float16, and overflows where the mean fits.
    np.copyto(out, np.mean(x, axis=axis, keepdims=keepdims), casting="unsafe")


kernel("reduce_sum")(_reduction(np.sum))
kernel("reduce_mean")(_reduction(_mean))
kernel("reduce_max")(_reduction(np.max))


@kernel("argmax")
def _argmax(ins, outs, attrs):
    return partial(np.argmax, ins[0], axis=attrs["axis"], out=outs[0], keepdims=attrs["keepdims"])
