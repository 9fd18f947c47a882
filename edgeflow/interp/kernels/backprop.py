"""Kernels of edgeflow/ops/backprop.py."""
import itertools
import math
from functools import partial

import numpy as np

from ...ops.array import slice_params
from ...ops.conv import window_geometry, window_params
from ...ops.registry import TensorSpec
from . import kernel
from .conv import reshaped, sequence, tap_runs
from .image import _ROUND, _axis_scales, _linear_taps, source_coordinates
from .pool import _runs, _window_counts


@kernel("sum_to")
def _sum_to(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    lead = grad.ndim - out.ndim
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(out.shape)
                                      if d == 1 and grad.shape[lead + i] != 1)
    # keepdims: the sum's shape is out's with `lead` leading 1s, a view of out.
    return partial(np.sum, grad, axis=axes, keepdims=True, out=out.reshape((1,) * lead + out.shape))


@kernel("slice_grad")
def _slice_grad(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    index = [np.s_[:]] * out.ndim
    starts, ends, axes, steps = slice_params([TensorSpec(out.shape, out.dtype)], attrs)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        index[axis] = slice(start, end, step)
    window = out[tuple(index)]

    def run():
        out.fill(0)
        np.copyto(window, grad)
    return run


@kernel("gather_grad")
def _gather_grad(ins, outs, attrs):
    grad, indices, out = ins[0], ins[1], outs[0]
    axis = attrs["axis"] % out.ndim
    n = out.shape[axis]
    flat = indices.reshape(-1)
    rows = np.moveaxis(grad.reshape(out.shape[:axis] + flat.shape + out.shape[axis + 1:]), axis, 0)
    target = np.moveaxis(out, axis, 0)  # views: scatter along the first axis

    def run():
        out.fill(0)
        np.add.at(target, flat % n, rows)
    return run


# Window ops run backwards over the tap runs of conv.py: each tap's run of the padded,
# phase-split input is where that tap's share of the gradient goes, so the gradients are
# added run by run (long and unit-stride, as the forward reads them) into zeroed buffers
# laid out as the runs, and the input's part of those is copied out at the end.

def _unload(runs, grads, x, kernel_shape, strides, dilations, begin):
    """Step copying x's elements out of `grads` (laid out as runs.buffers): load, undone."""
    widths = (grads.shape[-1] // math.prod(runs.wide[1:]),) + runs.wide[1:]
    grid = reshaped(grads, grads.shape[:3] + widths)
    taps = itertools.product(*map(range, kernel_shape))
    used = sorted({tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides)) for tap in taps})
    copies = []
    for p, phase in enumerate(used):  # as tap_runs placed them
        src, dst = [], []
        for a, s, b, m in zip(phase, strides, begin, x.shape[2:]):
            first = (a - b) % s
            start = (first + b) // s
            dst.append(slice(first, m, s))
            src.append(slice(start, start + len(range(first, m, s))))
        copies.append((x[(Ellipsis,) + tuple(dst)], grid[(slice(None), p, slice(None)) + tuple(src)]))
    unread = len(used) < math.prod(strides)  # phases no tap reads get no gradient

    def run():
        if unread:
            x.fill(0)
        for dst, src in copies:
            np.copyto(dst, src)
    return run


def _widened(runs, dy, shape):
    """(array, step): dy copied into a zeroed array of `shape` ending in the wide layout
    (N, M, *wide), or dy itself with no step where that layout is dy's own."""
    if runs.wide == runs.out_shape and shape == dy.shape and dy.flags.c_contiguous:
        return dy, None
    wide = np.zeros(shape, dy.dtype)  # the columns past the outputs stay zero
    crop = wide[(Ellipsis,) + tuple(slice(0, o) for o in runs.out_shape)]
    return wide, partial(np.copyto, crop, dy)


def _conv_geometry(x, kernel_shape, attrs):
    strides, dilations, _ = window_params("conv", attrs, x.ndim - 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    pointwise = math.prod(kernel_shape) == 1 and set(strides) == {1} and not any(begin + end)
    return strides, dilations, out_shape, begin, pointwise


@kernel("conv_input_grad")
def _conv_input_grad(ins, outs, attrs):
    """Columns w^T @ dy (N, C, taps, L), each tap's added into its run, then unloaded."""
    dy, w, dx = ins[0], ins[1], outs[0]
    (n, c), m, group, kernel_shape = dx.shape[:2], w.shape[0], attrs["group"], w.shape[2:]
    strides, dilations, out_shape, begin, pointwise = _conv_geometry(dx, kernel_shape, attrs)
    ws = np.swapaxes(reshaped(w, (group, m // group, -1)), 1, 2)
    if pointwise:
        result = reshaped(dx, (n, group, c // group, -1))
        return partial(np.matmul, ws, reshaped(dy, (n, group, m // group, -1)), out=result)
    runs = tap_runs(dx, kernel_shape, strides, dilations, begin, out_shape)  # never loaded
    wide, widen = _widened(runs, dy, (n, m) + runs.wide)
    sources = runs.runs()
    taps, length = len(sources), sources[0].shape[-1]
    dys = reshaped(wide, (n, group, m // group, length))
    targets = [reshaped(run, (n, group, c // group, length)) for run in sources]
    if m == group:  # one output channel per group (depthwise): the product is an outer one, slow in BLAS
        part = np.empty((n, group, c // group, length), dx.dtype)
        w_taps = reshaped(w, (group, c // group, taps))[..., None]
        parts = [(partial(np.multiply, dys, w_taps[:, :, t], out=part), part) for t in range(taps)]
    else:
        cols = np.empty((n, group, c // group, taps, length), dx.dtype)
        product = partial(np.matmul, ws, dys, out=reshaped(cols, (n, group, -1, length)))
        parts = [(product if t == 0 else None, cols[:, :, :, t]) for t in range(taps)]
    unload = _unload(runs, runs.buffers, dx, kernel_shape, strides, dilations, begin)

    def run():
        runs.buffers.fill(0)
        for (make, part), target in zip(parts, targets):
            if make is not None:
                make()
            np.add(target, part, out=target)
        unload()
    return sequence(widen, run)


@kernel("conv_filter_grad")
def _conv_filter_grad(ins, outs, attrs):
    """One product per group over the whole batch: dy (M/g, N * L) @ columns (N * L, C/g * taps)."""
    x, dy, dw = ins[0], ins[1], outs[0]
    (n, c), m, group, kernel_shape = x.shape[:2], dw.shape[0], attrs["group"], dw.shape[2:]
    strides, dilations, out_shape, begin, pointwise = _conv_geometry(x, kernel_shape, attrs)
    result = reshaped(dw, (group, m // group, -1))
    if pointwise:  # per image (M/g, P) @ (P, C/g), then the sum over images
        per_image = np.empty((n,) + result.shape, dw.dtype)
        xs = np.swapaxes(reshaped(x, (n, group, c // group, -1)), 2, 3)
        dys = reshaped(dy, (n, group, m // group, -1))
        return sequence(partial(np.matmul, dys, xs, out=per_image),
                        partial(np.sum, per_image, axis=0, out=result))
    runs = tap_runs(x, kernel_shape, strides, dilations, begin, out_shape)
    wide, widen = _widened(runs, np.swapaxes(dy, 0, 1), (m, n) + runs.wide)
    sources = runs.runs()
    cols = np.empty((c, len(sources)) + sources[0].shape[::2], x.dtype)  # (C, taps, N, L)
    gathers = [(cols[:, t], np.swapaxes(run, 0, 1)) for t, run in enumerate(sources)]
    product = partial(np.matmul, reshaped(wide, (group, m // group, -1)),
                      np.swapaxes(reshaped(cols, (group, -1, n * cols.shape[-1])), 1, 2), out=result)

    def gather():
        runs.load()
        for dst, src in gathers:
            np.copyto(dst, src)
    return sequence(gather, widen, product)


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
    return runs, grads, targets, _unload(runs, grads, dx, attrs["kernel_shape"], strides, dilations, begin)


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


def _add_grouped(dst, put, src, take, starts, axis):
    """Step: dst[put] += src[take] summed along `axis` over the groups beginning at `starts`."""
    def run():
        dst[put] += np.add.reduceat(src[take], starts, axis=axis)
    return run


@kernel("pad_grad")
def _pad_grad(ins, outs, attrs):
    """pad's borders undone axis by axis, last axis first: each border element's gradient is
    added to its source's (grouped by source, so repeated sources sum), then the inside kept."""
    dy, dx, pads, rank = ins[0], outs[0], attrs["pads"], outs[0].ndim
    acc = np.empty_like(dy)
    folds, inside = [], [slice(pads[i], pads[i] + n) for i, n in enumerate(dx.shape)]
    for i in reversed(range(rank)):
        n, pb, pe = dx.shape[i], pads[i], pads[i + rank]
        if not pb and not pe:
            continue
        source = np.pad(np.arange(n), (pb, pe), mode=attrs["mode"]) + pb  # as the pad kernel fills
        border = np.r_[0:pb, pb + n:pb + n + pe]
        border = border[np.argsort(source[border], kind="stable")]
        put, starts = np.unique(source[border], return_index=True)
        lead, trail = (slice(None),) * i, tuple(inside[i + 1:])  # later axes are folded already
        folds.append(_add_grouped(acc, lead + (put,) + trail, acc, lead + (border,) + trail, starts, i))
    return sequence(partial(np.copyto, acc, dy), *folds, partial(np.copyto, dx, acc[tuple(inside)]))


def _transposed(terms, n):
    """Rounds (index, weight or None) with sum over rounds of weight * g[index] = the gradient
    over n positions of out = sum over terms (index, weight or None) of weight * x[index].

    Round r holds, per position, its r-th contribution (weight 0 where it has fewer).
    """
    source = np.concatenate([np.arange(len(i)) for i, _ in terms])
    target = np.concatenate([i for i, _ in terms])
    weight = np.concatenate([np.ones(len(i)) if w is None else w for i, w in terms])
    keep = weight != 0
    source, target, weight = source[keep], target[keep], weight[keep]
    order = np.argsort(target, kind="stable")
    source, target, weight = source[order], target[order], weight[order]
    counts = np.bincount(target, minlength=n)
    rank = np.arange(len(target)) - np.repeat(np.cumsum(counts) - counts, counts)
    index, scale = np.zeros((counts.max(initial=0), n), np.intp), np.zeros((counts.max(initial=0), n))
    index[rank, target], scale[rank, target] = source, weight
    return [(i, None if np.all(w == 1) else w) for i, w in zip(index, scale)]


def _gather_axis(src, dst, axis, rounds):
    """Step: dst = the sum over rounds (index, weight or None) of src gathered at index along
    `axis`, times weight."""
    shape, scratch = (-1,) + (1,) * (dst.ndim - 1 - axis), np.empty_like(dst) if len(rounds) > 1 else None
    steps = [] if rounds else [partial(dst.fill, 0)]
    for r, (index, weight) in enumerate(rounds):
        target = dst if r == 0 else scratch
        steps.append(partial(np.take, src, index, axis=axis, out=target, mode="clip"))
        if weight is not None:
            steps.append(partial(np.multiply, target, weight.astype(dst.dtype).reshape(shape), out=target))
        if r:
            steps.append(partial(np.add, dst, scratch, out=dst))
    return sequence(*steps)


@kernel("resize_grad")
def _resize_grad(ins, outs, attrs):
    """resize undone along W (into scratch (N, C, OH, W)), then along H: each input pixel
    gathers the gradients of the output pixels that read it, with the weights they read it
    with (rounds of gathers rather than scattered adds: numpy gathers fast)."""
    dy, dx = ins[0], outs[0]
    scales = _axis_scales(dx, dy, attrs)
    mode = attrs["coordinate_transformation_mode"]
    coords = [source_coordinates(n, o, s, mode) for n, o, s in zip(dx.shape[2:], dy.shape[2:], scales)]
    rounds = []
    for c, n in zip(coords, dx.shape[2:]):
        if attrs["mode"] == "nearest":
            terms = [(np.clip(_ROUND[attrs["nearest_mode"]](c), 0, n - 1).astype(np.intp), None)]
        else:
            low, high, weight = _linear_taps(c, n)
            weight = weight.astype(np.float64)  # exactly as the forward pass weighs
            terms = [(low, 1 - weight), (high, weight)]
        rounds.append(_transposed(terms, n))
    rows = np.empty(dy.shape[:3] + dx.shape[3:], dx.dtype)
    return sequence(_gather_axis(dy, rows, 3, rounds[1]), _gather_axis(rows, dx, 2, rounds[0]))
