"""Kernels of edgeflow/ops/pool.py: reductions over the tap runs of conv.py.

A window's taps are contiguous runs of the padded, phase-split input (see conv.py), so a
pool is a running maximum or sum over one long unit-stride array per tap (running on
across channels), then one pass that crops the result into the output (scaling it, for
the average).
"""
import math

import numpy as np

from ...ops.conv import window_geometry, window_params
from .. import threads
from ..arena import scratch
from . import jit, kernel
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
    """numba's one-pass loop where it is there (2-D float pools), else numpy's maximum over
    the tap runs."""
    x, out = ins[0], outs[0]
    if x.ndim == 4:
        strides, dilations, _ = window_params("pool", attrs, 2)
        _, begin, _ = window_geometry("pool", x.shape[2:], attrs["kernel_shape"], attrs, attrs["ceil_mode"])
        step = jit.bind_max_pool(x, out, attrs["kernel_shape"], strides, dilations, begin)
        workers, planes = threads.current(), x.shape[0] * x.shape[1]
        if step is not None and workers is not None and planes >= workers.n \
                and out.size * math.prod(attrs["kernel_shape"]) >= threads.MIN_ELEMENTS:  # planes apart
            parts = [jit.bind_max_pool(x, out, attrs["kernel_shape"], strides, dilations, begin, piece)
                     for piece in threads.pieces(planes, workers.n)]
            if None not in parts:
                return workers.split(parts)
        if step is not None:
            return step
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
    # Zeroed by the step on each run; zero-padded runs are never loaded: their buffers serve.
    grads = scratch(runs.buffers.shape, runs.buffers.dtype) if fill else runs.buffers
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
    if x.ndim == 4:
        strides, dilations, _ = window_params("pool", attrs, 2)
        _, begin, _ = window_geometry("pool", x.shape[2:], attrs["kernel_shape"], attrs, attrs["ceil_mode"])
        workers, n = threads.current(), x.shape[0]
        spans = threads.pieces(n, workers.n) if workers is not None and n >= workers.n \
            and x.size >= threads.MIN_ELEMENTS else [(0, n)]  # images apart on the plan's workers
        parts = [jit.bind_max_pool_grad(x[a:b], dy[a:b], dx[a:b], attrs["kernel_shape"], strides, dilations,
                                        begin) for a, b in spans]
        if None not in parts:
            return (lambda: workers.run(parts)) if len(parts) > 1 else parts[0]
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


@kernel("lp_pool")
def _lp_pool(ins, outs, attrs):
    """|x|^p into a buffer, the tap runs' sum over it, then the 1/p-th power."""
    x, out, p = ins[0], outs[0], attrs["p"]
    wide = np.float32 if x.dtype == np.float16 else x.dtype
    powered = np.empty(x.shape, wide)
    reduce, crop = _accumulate(_runs(powered, attrs, 0), np.add, wide)

    def run():
        np.abs(x, out=powered)
        if p != 1:
            np.power(powered, p, out=powered)
        reduce()
        np.power(crop, 1 / p, out=out, casting="unsafe")
    return run


def _window_taps(sizes, attrs):
    """(taps, positions): per output position (row-major) and kernel tap, the row-major flat
    spatial index the tap reads (prod(sizes) where it reads padding), and that index as
    storage_order counts it."""
    kernel_shape = attrs["kernel_shape"]
    strides, dilations, _ = window_params("max_pool", attrs, len(sizes))
    out_shape, begin, _ = window_geometry("max_pool", sizes, kernel_shape, attrs, attrs["ceil_mode"])
    d = len(sizes)
    grid = np.ix_(*[np.arange(o) for o in out_shape], *[np.arange(k) for k in kernel_shape])
    coords = np.broadcast_arrays(*(grid[a] * s - b + grid[d + a] * dil  # (*out_shape, *kernel_shape)
                                   for a, (s, dil, b) in enumerate(zip(strides, dilations, begin))))
    inside = np.logical_and.reduce([(c >= 0) & (c < n) for c, n in zip(coords, sizes)])
    clipped = [np.clip(c, 0, n - 1) for c, n in zip(coords, sizes)]
    total, windows = int(np.prod(sizes)), int(np.prod(out_shape))
    order = "F" if attrs["storage_order"] else "C"
    taps = np.where(inside, np.ravel_multi_index(clipped, sizes), total).reshape(windows, -1)
    positions = np.ravel_multi_index(clipped, sizes, order=order).reshape(windows, -1)
    return taps, positions


@kernel("max_pool_indices")
def _max_pool_indices(ins, outs, attrs):
    """Each window's taps gathered (padding reads -inf), the first maximum's position looked up."""
    x, out = ins[0], outs[0]
    n, c, *sizes = x.shape
    taps, positions = _window_taps(sizes, attrs)
    total = int(np.prod(sizes))
    values = np.full((n, c, total + 1), -np.inf)  # float64 holds every max_pool dtype exactly
    planes = (np.arange(n * c, dtype=np.int64) * total).reshape(n, c, 1)
    rows = np.arange(taps.shape[0])
    flat = reshaped(out, (n, c, taps.shape[0]))

    def run():
        values[:, :, :total] = x.reshape(n, c, total)
        best = values[:, :, taps].argmax(-1)
        np.add(positions[rows, best], planes, out=flat)
    return run


@kernel("max_unpool")
def _max_unpool(ins, outs, attrs):
    x, indices, out = ins[0], ins[1], outs[0]
    flat = reshaped(out, (out.size,))

    def run():
        if indices.size and (indices.min() < 0 or indices.max() >= flat.size):
            raise IndexError(f"max_unpool: an index is out of range [0, {flat.size}) for output "
                             f"{out.shape}")
        flat.fill(0)
        flat[indices.reshape(-1)] = x.reshape(-1)
    return run
