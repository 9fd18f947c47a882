"""Kernels of edgeflow/ops/shape.py. Most of these ops are folded while preparing (their
operands are known then); the kernels serve when they are not."""
from functools import partial

import numpy as np

from . import kernel


@kernel("shape")
def _shape(ins, outs, attrs):
    dims = np.array(ins[0].shape[slice(attrs["start"], attrs["end"])], np.int64)
    return partial(np.copyto, outs[0], dims)


@kernel("constant_of_shape")
def _constant_of_shape(ins, outs, attrs):
    return partial(outs[0].fill, attrs["value"])


@kernel("eye_like")
def _eye_like(ins, outs, attrs):
    out = outs[0]
    rows, cols = out.shape
    k = attrs["k"]
    eye = np.eye(rows, cols, k, dtype=out.dtype)
    return partial(np.copyto, out, eye)


@kernel("range")
def _range(ins, outs, attrs):
    def run(start, delta, out):
        np.multiply(np.arange(out.shape[0], dtype=out.dtype), delta.reshape(()), out=out)
        out += start.reshape(())
    return partial(run, ins[0], ins[2], outs[0])


@kernel("expand", bfloat16="bits")
def _expand(ins, outs, attrs):
    return partial(np.copyto, outs[0], ins[0])


@kernel("tile", bfloat16="bits")
def _tile(ins, outs, attrs):
    # View the output as (r0, d0, r1, d1, ...) and broadcast x, shaped (1, d0, 1, d1, ...),
    # into it: no temporary.
    x, out = ins[0], outs[0]
    reps = [int(r) for r in ins[1].reshape(-1)]
    blocks = out.reshape([v for r, d in zip(reps, x.shape) for v in (r, d)])
    return partial(np.copyto, blocks, x.reshape([v for d in x.shape for v in (1, d)]))


@kernel("split", bfloat16="bits")
def _split(ins, outs, attrs):
    x, axis = ins[0], attrs["axis"] % ins[0].ndim
    bounds = np.cumsum([0] + [o.shape[axis] for o in outs])
    pieces = [(o, x[(slice(None),) * axis + (slice(a, b),)]) for o, a, b in zip(outs, bounds, bounds[1:])]

    def run():
        for out, piece in pieces:
            np.copyto(out, piece)
    return run
