"""Kernels of edgeflow/ops/nn.py."""
from functools import partial

import numpy as np

from .. import threads
from . import jit, kernel


@kernel("relu")
def _relu(ins, outs, attrs):
    zero = outs[0].dtype.type(0)
    return threads.elementwise(np.maximum, [ins[0], zero], outs[0]) or partial(np.maximum, ins[0], zero, out=outs[0])


def _relu_grad_numpy(dy, x, out):
    out.fill(0)
    np.copyto(out, dy, where=x > 0)


@kernel("relu_grad")
def _relu_grad(ins, outs, attrs):
    """numba's one pass where it takes the operands, else zeros, then dy where x > 0."""
    dy, x = ins
    return jit.bind_relu_grad(dy, x, outs[0]) or partial(_relu_grad_numpy, dy, x, outs[0])


def _softmax(x, axis, out):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis, out):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))


@kernel("softmax")
def _softmax_kernel(ins, outs, attrs):
    return jit.bind_softmax(ins[0], outs[0], attrs["axis"]) or partial(_softmax, ins[0], attrs["axis"], outs[0])


@kernel("log_softmax")
def _log_softmax_kernel(ins, outs, attrs):
    return partial(_log_softmax, ins[0], attrs["axis"], outs[0])


def _hardmax(x, axis, out):
    out[...] = 0
    # argmax gives the first maximum (or the first NaN, as ONNX's reference does).
    np.put_along_axis(out, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)


@kernel("hardmax")
def _hardmax_kernel(ins, outs, attrs):
    return partial(_hardmax, ins[0], attrs["axis"], outs[0])


@kernel("lrn")
def _lrn(ins, outs, attrs):
    """The channel window's sum of squares as `size` shifted adds (size is small), in float32
    at least."""
    x, out, size = ins[0], outs[0], attrs["size"]
    wide = np.result_type(x.dtype, np.float32)
    c, before = x.shape[1], (size - 1) // 2
    squares, total = np.empty(x.shape, wide), np.empty(x.shape, wide)
    shifts = [(slice(max(0, -k), c - max(0, k)), slice(max(0, k), c - max(0, -k)))
              for k in range(-before, size - before) if abs(k) < c]  # (into, from): channel c + k into c
    scale, bias, beta = wide.type(attrs["alpha"] / size), wide.type(attrs["bias"]), wide.type(attrs["beta"])

    def run():
        np.square(x, out=squares)
        total.fill(0)
        for into, source in shifts:
            total[:, into] += squares[:, source]
        np.multiply(total, scale, out=total)
        np.add(total, bias, out=total)
        np.power(total, -beta, out=total)
        np.multiply(x, total, out=out, casting="unsafe")
    return run
