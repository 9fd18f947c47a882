"""Kernels of edgeflow/ops/conv.py, and the window layout the pooling kernels share.

Layout ("tap runs"): x is copied, padded, into one buffer per stride phase, each with its
spatial axes flattened. Output o along an axis reads padded input o*s + t*dl for tap t,
which is element o + (t*dl)//s of phase (t*dl) % s; so over all outputs, tap t reads one
contiguous run of the flattened phase, from a fixed offset. The results are "wide":
shaped (O1, Q2, ..., Qd) with Qk the phase widths, and the columns past Ok are dropped
when copying to the output. Every inner loop is then long and unit-stride, which is
what makes numpy fast: a strided window view of x would give loops of one row.

A conv is then one batched BLAS product: the runs are gathered into columns
(C/g * taps, L) and multiplied by w viewed as (g, M/g, C/g * taps). A 1x1 stride-1 conv
needs no gather (w @ x). A depthwise conv takes the same path, a product per channel of
(M/C, taps) @ (taps, L): measured, that beats a multiply-accumulate of the runs (two
passes per tap, one of them a slow broadcast) by 1 to 2x.
"""
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ...ops.conv import transposed_geometry, window_geometry, window_params
from . import kernel
from .fused import with_activation


def reshaped(a, shape):
    """a.reshape(shape), which must be a view: a step bound to a copy would read stale data."""
    r = a.reshape(shape)
    if r.size and not np.may_share_memory(r, a):
        raise AssertionError(f"reshaping an array of strides {a.strides} to {shape} copies it")
    return r


def sequence(*steps):
    """One step running `steps` (None entries skipped) in order."""
    steps = [s for s in steps if s is not None]
    if len(steps) == 1:
        return steps[0]

    def run():
        for step in steps:
            step()
    return run


@dataclass
class TapRuns:
    """x laid out so that each kernel tap reads one contiguous run (see the module doc)."""

    buffers: np.ndarray  # (N, phases, C, Q1 * ... * Qd); padding written once, at prepare
    taps: list  # per tap, in kernel order: (phase, start of its run)
    load: object  # step copying x into the buffers
    wide: tuple  # spatial shape (O1, Q2, ..., Qd) of a result computed over the runs
    out_shape: tuple  # (O1, ..., Od)

    def runs(self):
        """Per tap, a view (N, C, L) of the buffers, L = O1 * Q2 * ... * Qd."""
        length = math.prod(self.wide)
        return [self.buffers[:, p, :, s:s + length] for p, s in self.taps]

    def long_runs(self):
        """Per tap, a view (N, C * Q - span) running on across channels: one loop per image.

        A result over these is "long": channel c's wide outputs start at c * Q.
        """
        n, phases, c, q = self.buffers.shape
        flat = reshaped(self.buffers, (n, phases, c * q))
        span = max(s for _, s in self.taps)
        return [flat[:, p, s:s + c * q - span] for p, s in self.taps]

    def crop(self, acc):
        """The (N, C, O1, ..., Od) outputs in acc, shaped (N, C, *wide) or long (N, C * Q)."""
        if acc.ndim == 2:
            n, _, c, q = self.buffers.shape
            acc = reshaped(reshaped(acc, (n, c, q))[:, :, :math.prod(self.wide)], (n, c) + self.wide)
        return acc[(Ellipsis,) + tuple(slice(0, o) for o in self.out_shape)]


def tap_runs(x, kernel_shape, strides, dilations, begin, out_shape, fill=0):
    """TapRuns of x padded by `begin` (and `fill` past its end) for these windows."""
    sizes, (n, c) = x.shape[2:], x.shape[:2]
    taps = list(itertools.product(*map(range, kernel_shape)))
    # Phase widths: room for every tap's reach and for all of x.
    widths = [max(o + (k - 1) * dl // s, -(-(b + m) // s)) for o, k, s, dl, b, m in
              zip(out_shape, kernel_shape, strides, dilations, begin, sizes)]
    widths[0] += 1  # a run starting past column 0 spills into one more row
    used = sorted({tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides)) for tap in taps})
    buffers = np.full((n, len(used), c, math.prod(widths)), fill, x.dtype)
    grid = reshaped(buffers, (n, len(used), c) + tuple(widths))
    copies = []
    for p, phase in enumerate(used):
        src, dst = [], []
        for a, s, b, m in zip(phase, strides, begin, sizes):
            first = (a - b) % s  # first input index that lands in this phase
            count = len(range(first, m, s))
            src.append(slice(first, m, s))
            dst.append(slice((first + b) // s, (first + b) // s + count))
        copies.append((grid[(slice(None), p, slice(None)) + tuple(dst)], x[(Ellipsis,) + tuple(src)]))
    starts = [(used.index(tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides))),
               int(np.ravel_multi_index([t * dl // s for t, dl, s in zip(tap, dilations, strides)], widths)))
              for tap in taps]

    def load():
        for dst, src in copies:
            np.copyto(dst, src)
    return TapRuns(buffers, starts, load, (out_shape[0],) + tuple(widths[1:]), tuple(out_shape))


def _finish(acc, runs, bias, out):
    """Copy the result (wide unless acc is out) to out, adding the bias on the way."""
    column = None if bias is None else bias.reshape((-1,) + (1,) * (out.ndim - 2))
    if acc is out:
        return None if column is None else (lambda: np.add(out, column, out=out))
    crop = runs.crop(acc)
    if column is None:
        return lambda: np.copyto(out, crop)
    return lambda: np.add(crop, column, out=out)


def _pointwise(x, w, group, out):
    """1x1, stride 1, no padding: out (N, g, M/g, P) = w (g, M/g, C/g) @ x (N, g, C/g, P)."""
    n, c = x.shape[:2]
    m = w.shape[0]
    xs = reshaped(x, (n, group, c // group, -1))
    ws = reshaped(w, (group, m // group, c // group))
    result = reshaped(out, (n, group, m // group, -1))
    return lambda: np.matmul(ws, xs, out=result)


def _im2col(runs, w, group, acc):
    """Gather the runs into columns (N, g, C/g * taps, L), then one batched product with w."""
    sources = runs.runs()
    n, c, length = sources[0].shape
    m = w.shape[0]
    cols = np.empty((n, c, len(sources), length), w.dtype)
    gathers = [(cols[:, :, t], run) for t, run in enumerate(sources)]
    flat = reshaped(cols, (n, group, -1, cols.shape[-1]))
    ws = reshaped(w, (group, m // group, -1))
    result = reshaped(acc, (n, group, m // group, -1))

    def run():
        for dst, src in gathers:
            np.copyto(dst, src)
        np.matmul(ws, flat, out=result)
    return run


@kernel("conv")
def _conv(ins, outs, attrs):
    x, w = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    out, group = outs[0], attrs["group"]
    kernel_shape = w.shape[2:]
    strides, dilations, _ = window_params("conv", attrs, x.ndim - 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    if math.prod(kernel_shape) == 1 and set(strides) == {1} and not any(begin + end):
        step, runs, acc = _pointwise(x, w, group, out), None, out
    else:
        runs = tap_runs(x, kernel_shape, strides, dilations, begin, out_shape)
        acc = out if runs.wide == out_shape else np.empty(out.shape[:2] + runs.wide, out.dtype)
        step = sequence(runs.load, _im2col(runs, w, group, acc))
    return with_activation(sequence(step, _finish(acc, runs, bias, out)), attrs["activation"], out)


@kernel("conv_transpose")
def _conv_transpose(ins, outs, attrs):
    """Columns w^T @ x (N, M, *taps, *in), then each tap's column added into its strided place."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    out, group = outs[0], attrs["group"]
    n, c = x.shape[:2]
    sizes, kernel_shape, d = x.shape[2:], w.shape[2:], x.ndim - 2
    m = out.shape[1]
    strides, dilations, _ = window_params("conv_transpose", attrs, d)
    out_shape, begin, _ = transposed_geometry("conv_transpose", sizes, kernel_shape, attrs)
    # The full result spans every tap's reach; output_padding may reach past it (zeros there).
    full_shape = tuple(max(s * (i - 1) + (k - 1) * dl + 1, b + o) for i, k, s, dl, b, o in
                       zip(sizes, kernel_shape, strides, dilations, begin, out_shape))
    direct = full_shape == out_shape and not any(begin)
    full = out if direct else np.empty((n, m) + full_shape, out.dtype)
    crop = full[(Ellipsis,) + tuple(slice(b, b + o) for b, o in zip(begin, out_shape))]
    cols = np.empty((n, group, (m // group) * math.prod(kernel_shape), math.prod(sizes)), x.dtype)
    ws = np.swapaxes(reshaped(w, (group, c // group, -1)), 1, 2)
    xs = reshaped(x, (n, group, c // group, -1))
    tap_cols = cols.reshape((n, m) + kernel_shape + sizes)
    adds = []
    for tap in itertools.product(*map(range, kernel_shape)):
        place = tuple(slice(t * dl, t * dl + s * (i - 1) + 1, s)
                      for t, dl, s, i in zip(tap, dilations, strides, sizes))
        adds.append((full[(Ellipsis,) + place], tap_cols[(slice(None), slice(None)) + tap]))
    column = None if bias is None else bias.reshape((-1,) + (1,) * d)

    def run():
        np.matmul(ws, xs, out=cols)
        full.fill(0)
        for target, col in adds:
            np.add(target, col, out=target)
        if column is not None:
            np.add(crop, column, out=out)
        elif not direct:
            np.copyto(out, crop)
    return with_activation(run, attrs["activation"], out)
