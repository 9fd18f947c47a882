"""Kernels of edgeflow/ops/pool.py: reductions over the tap runs of conv.py.

A window's taps are contiguous runs of the padded, phase-split input (see conv.py), so a
pool is a running maximum or sum over one long unit-stride array per tap (running on
across channels), then one pass that crops the result into the output (scaling it, for
the average).
"""
import numpy as np

from ...ops.conv import window_geometry, window_params
from . import kernel
from .conv import reshaped, tap_runs, unload_step


def _runs(x, attrs, fill):
    kernel_shape = attrs["kernel_shape"]
    strides, dilations, _ = window_params("pool", attrs, x.ndim - 2)
    out_shape, begin, _ = window_geometry("pool", x.shape[2:], kernel_shape, attrs, attrs["ceil_mode"])
    return tap_runs(x, kernel_shape, strides, dilations, begin, out_shape, fill)


def _accumulate(runs, ufunc, dtype):
    """(step, outputs): the step folds `ufunc` over the taps' long runs into a buffer whose
    (N, C, *out_shape) part is the view `outputs`."""
    first, *rest = runs.long_runs()
    n, _, c, q = runs.buffers.shape
    acc = np.empty((n, c * q), dtype)
    part = acc[:, :first.shape[1]]

    def run():
        runs.load()
        np.copyto(part, first)
        for r in rest:
            ufunc(part, r, out=part)
    return run, runs.crop(acc)


@kernel("max_pool")
def _max_pool(ins, outs, attrs):
    x, out = ins[0], outs[0]
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min  # padding never wins
    runs = _runs(x, attrs, lowest)
    reduce, crop = _accumulate(runs, np.maximum, x.dtype)

    def run():
        reduce()
        np.copyto(out, crop)
    return run


def _window_counts(sizes, attrs):
    """Elements each window averages over (spatial shape of the output), as ONNX Runtime counts.

    A window's taps count where they fall inside the input, or inside the padded input with
    count_include_pad; never the taps of a ceil_mode window that hang past the end padding.
    """
    kernel_shape = attrs["kernel_shape"]
    out_shape, begin, end = window_geometry("avg_pool", sizes, kernel_shape, attrs, attrs["ceil_mode"])
    strides, dilations, _ = window_params("avg_pool", attrs, len(sizes))
    counts = np.ones(out_shape)
    for axis, (n, k, s, d, o, b, e) in enumerate(zip(sizes, kernel_shape, strides, dilations, out_shape,
                                                     begin, end)):
        taps = (np.arange(o) * s - b)[:, None] + np.arange(k) * d
        low, high = (-b, n + e) if attrs["count_include_pad"] else (0, n)
        along = ((taps >= low) & (taps < high)).sum(1)
        counts = counts * along.reshape((-1,) + (1,) * (len(sizes) - 1 - axis))
    return counts


@kernel("avg_pool")
def _avg_pool(ins, outs, attrs):
    x, out = ins[0], outs[0]
    runs = _runs(x, attrs, 0)
    # float16 sums in float32: a window of large values can overflow where its mean fits.
    wide = np.float32 if x.dtype == np.float16 else x.dtype
    reduce, crop = _accumulate(runs, np.add, wide)
    inverse = (1 / _window_counts(x.shape[2:], attrs)).astype(wide)

    def run():
        reduce()
        np.multiply(crop, inverse, out=out, casting="unsafe")
    return run


def _pool_adjoint(like, dx, attrs, fill):
    """(runs of `like` padded with `fill`, gradient buffers laid out as runs.buffers, per tap
    the long run of those, step copying dx's gradient out of them)."""
    runs = _runs(like, attrs, fill)
    strides, dilations, _ = window_params("pool", attrs, like.ndim - 2)
    _, begin, _ = window_geometry("pool", like.shape[2:], attrs["kernel_shape"], attrs, attrs["ceil_mode"])
    n, phases, c, q = runs.buffers.shape
    grads = np.zeros_like(runs.buffers) if fill else runs.buffers  # zero-padded runs are never loaded
    flat = reshaped(grads, (n, phases, c * q))
    length = c * q - max(s for _, s in runs.taps)
    targets = [flat[:, p, s:s + length] for p, s in runs.taps]
    return runs, grads, targets, unload_step(runs, grads, dx, attrs["kernel_shape"], strides, dilations, begin)


def _long(runs, dtype):
    """(part the long runs cover, (N, C, *out) outputs) of an array (N, C * Q) of zeros."""
    n, _, c, q = runs.buffers.shape
    array = np.zeros((n, c * q), dtype)
    return array[:, :c * q - max(s for _, s in runs.taps)], runs.crop(array)


@kernel("max_pool_grad")
def _max_pool_grad(ins, outs, attrs):
    """Each tap in kernel order takes the gradient of the windows it wins and have not yet
    routed theirs: that is the first maximum on ties, as onnxruntime's and PyTorch's indices."""
    x, dy, dx = ins[0], ins[1], outs[0]
    runs, grads, targets, unload = _pool_adjoint(x, dx, attrs, -np.inf)
    inputs = runs.long_runs()
    peak, _ = _long(runs, x.dtype)
    left, dy_view = _long(runs, dx.dtype)  # per window, the gradient no tap has taken yet
    won, share = np.empty(peak.shape, bool), np.empty_like(left)

    def run():
        runs.load()
        np.copyto(peak, inputs[0])
        for r in inputs[1:]:
            np.maximum(peak, r, out=peak)
        np.copyto(dy_view, dy)
        grads.fill(0)
        for r, target in zip(inputs, targets):
            np.equal(r, peak, out=won)
            np.multiply(won, left, out=share)
            np.add(target, share, out=target)
            np.subtract(left, share, out=left)
        unload()
    return run


@kernel("avg_pool_grad")
def _avg_pool_grad(ins, outs, attrs):
    dy, like, dx = ins[0], ins[1], outs[0]
    runs, grads, targets, unload = _pool_adjoint(like, dx, attrs, 0)
    part, scaled = _long(runs, dx.dtype)
    inverse = (1 / _window_counts(like.shape[2:], attrs)).astype(dx.dtype)

    def run():
        np.multiply(dy, inverse, out=scaled)
        grads.fill(0)
        for target in targets:
            np.add(target, part, out=target)
        unload()
    return run
