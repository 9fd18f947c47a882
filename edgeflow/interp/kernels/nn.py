"""Kernels of edgeflow/ops/nn.py."""
from functools import partial

import numpy as np

from . import kernel


@kernel("relu")
def _relu(ins, outs, attrs):
    return partial(np.maximum, ins[0], outs[0].dtype.type(0), out=outs[0])


def _softmax(x, axis, out):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis, out):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))


@kernel("softmax")
def _softmax_kernel(ins, outs, attrs):
    return partial(_softmax, ins[0], attrs["axis"], outs[0])


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
