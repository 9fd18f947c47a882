"""Kernels of edgeflow/ops/image.py. Index tables are built at prepare time; runs only gather."""
from functools import partial

import numpy as np

from ...ops.image import spatial_scales
from . import kernel
from .conv import reshaped, sequence


def _pad_constant(x, out, pads, value):
    """Fill, then copy x in; negative pads crop x."""
    rank = x.ndim
    src, dst = [], []
    for i, n in enumerate(x.shape):
        pb, pe = pads[i], pads[i + rank]
        src.append(slice(max(0, -pb), n - max(0, -pe)))
        dst.append(slice(max(0, pb), out.shape[i] - max(0, pe)))
    inner, target = x[tuple(src)], out[tuple(dst)]
    fill = out.dtype.type(value)

    def run():
        if inner.size != out.size:
            out.fill(fill)
        np.copyto(target, inner)
    return run


def _pad_borders(x, out, pads, mode):
    """Copy x in, then fill each axis's borders from out itself, axis after axis.

    When axis i is filled, the axes before it are complete and the borders of the later
    ones still hold garbage, which lands only in borders that later axes overwrite.
    """
    rank = x.ndim
    inside = out[tuple(slice(pads[i], pads[i] + n) for i, n in enumerate(x.shape))]
    fills = []
    for i, n in enumerate(x.shape):
        pb, pe = pads[i], pads[i + rank]
        if not pb and not pe:
            continue
        source = np.pad(np.arange(n), (pb, pe), mode=mode) + pb  # where each border element comes from
        border = np.r_[0:pb, pb + n:pb + n + pe]
        lead = (slice(None),) * i
        fills.append((lead + (border,), lead + (source[border],)))

    def run():
        np.copyto(inside, x)
        for dst, src in fills:
            out[dst] = out[src]
    return run


@kernel("pad")
def _pad(ins, outs, attrs):
    if attrs["mode"] == "constant":
        return _pad_constant(ins[0], outs[0], attrs["pads"], attrs["value"])
    return _pad_borders(ins[0], outs[0], attrs["pads"], attrs["mode"])


def source_coordinates(n, size, scale, mode):
    """Input coordinate (float32, unclamped) of each of `size` output positions on an axis of `n`."""
    i = np.arange(size, dtype=np.float32)
    scale = np.float32(scale)
    if mode == "asymmetric":
        return i / scale
    if mode == "align_corners":
        return i * np.float32((n - 1) / (size - 1)) if size > 1 else np.zeros(size, np.float32)
    if mode == "pytorch_half_pixel" and size == 1:
        return np.zeros(1, np.float32)
    return (i + np.float32(0.5)) / scale - np.float32(0.5)


_ROUND = {"round_prefer_floor": lambda c: np.ceil(c - np.float32(0.5)),
          "round_prefer_ceil": lambda c: np.floor(c + np.float32(0.5)),
          "floor": np.floor, "ceil": np.ceil}


def _axis_scales(x, out, attrs):
    scales, _ = spatial_scales("resize", attrs, x.ndim)
    if scales is None:  # scale = out / in, as ONNX defines it when sizes are given
        scales = tuple(np.float32(o) / np.float32(n) for o, n in zip(out.shape[2:], x.shape[2:]))
    return scales


@kernel("resize")
def _resize(ins, outs, attrs):
    x, out = ins[0], outs[0]
    scales = _axis_scales(x, out, attrs)
    mode = attrs["coordinate_transformation_mode"]
    coords = [source_coordinates(n, o, s, mode) for n, o, s in zip(x.shape[2:], out.shape[2:], scales)]
    if attrs["mode"] == "nearest":
        return _nearest(x, out, coords, _ROUND[attrs["nearest_mode"]])
    return _bilinear(x, out, coords)


def _nearest(x, out, coords, rounding):
    """One gather: flat H*W index of each output pixel."""
    h, w = x.shape[2:]
    rows, cols = (np.clip(rounding(c), 0, n - 1).astype(np.intp) for c, n in zip(coords, (h, w)))
    flat = (rows[:, None] * w + cols[None, :]).ravel()
    src = reshaped(x, x.shape[:2] + (h * w,))
    dst = reshaped(out, out.shape[:2] + (flat.size,))
    return lambda: np.take(src, flat, axis=2, out=dst, mode="clip")


def _linear_taps(c, n):
    """(low index, high index, weight of high) of each coordinate, clamped to the axis."""
    c = np.clip(c, 0, n - 1)
    low = np.floor(c).astype(np.intp)
    return low, np.minimum(low + 1, n - 1), c - low


def _bilinear(x, out, coords):
    """Interpolate rows (into scratch of shape (N, C, OH, W)), then columns into out."""
    (y0, y1, wy), (x0, x1, wx) = [_linear_taps(c, n) for c, n in zip(coords, x.shape[2:])]
    wy = wy.astype(x.dtype)[:, None]
    wx = wx.astype(x.dtype)
    top, bottom = (np.empty(x.shape[:2] + (len(y0), x.shape[3]), x.dtype) for _ in range(2))
    right = np.empty_like(out)

    def run():
        np.take(x, y0, axis=2, out=top, mode="clip")
        np.take(x, y1, axis=2, out=bottom, mode="clip")
        np.subtract(bottom, top, out=bottom)
        np.multiply(bottom, wy, out=bottom)
        np.add(top, bottom, out=top)  # top + wy * (bottom - top)
        np.take(top, x0, axis=3, out=out, mode="clip")
        np.take(top, x1, axis=3, out=right, mode="clip")
        np.subtract(right, out, out=right)
        np.multiply(right, wx, out=right)
        np.add(out, right, out=out)
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
