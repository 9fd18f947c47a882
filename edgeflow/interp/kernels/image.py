"""Kernels of edgeflow/ops/image.py. Index tables are built at prepare time; runs only gather."""
import math
from functools import partial

import numpy as np

from ...ops.image import col2im_geometry, resize_axes
from ..arena import outside, scratch
from . import jit, kernel
from .conv import reshaped, sequence


def _pad_constant(x, out, pads, value):
    """Fill the borders (every run: the arena's tensors are shared), then copy x in;
    negative pads crop x."""
    rank = x.ndim
    src, dst = [], []
    for i, n in enumerate(x.shape):
        pb, pe = pads[i], pads[i + rank]
        src.append(slice(max(0, -pb), n - max(0, -pe)))
        dst.append(slice(max(0, pb), out.shape[i] - max(0, pe)))
    inner, target = x[tuple(src)], out[tuple(dst)]
    borders = outside(out, tuple(dst))
    fill = out.dtype.type(value)

    def run():
        for border in borders:
            border.fill(fill)
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


def source_coordinates(n, size, scale, mode, roi=(0.0, 1.0)):
    """Input coordinate (float32, unclamped) of each of `size` output positions on an axis of `n`."""
    i = np.arange(size, dtype=np.float32)
    scale, half = np.float32(scale), np.float32(0.5)
    if mode == "asymmetric":
        return i / scale
    if mode == "align_corners":
        return i * np.float32((n - 1) / (size - 1)) if size > 1 else np.zeros(size, np.float32)
    if mode == "tf_crop_and_resize":
        start, end = np.float32(roi[0]), np.float32(roi[1])
        if size == 1:
            return np.full(1, half * (start + end) * np.float32(n - 1), np.float32)
        return start * np.float32(n - 1) + i * ((end - start) * np.float32(n - 1) / np.float32(size - 1))
    if mode == "pytorch_half_pixel" and size == 1:
        return np.zeros(1, np.float32)
    c = (i + half) / scale - half
    if mode == "half_pixel_symmetric":  # centre the (fractional) resized extent on the input's
        c += np.float32(n / 2 * (1 - size / (float(scale) * n)))
    return c


_ROUND = {"round_prefer_floor": lambda c: np.ceil(c - np.float32(0.5)),
          "round_prefer_ceil": lambda c: np.floor(c + np.float32(0.5)),
          "floor": np.floor, "ceil": np.ceil}


def _cubic(a):
    """Keys' cubic convolution kernel with coefficient a."""
    def w(t):
        t = np.abs(t)
        near = ((a + 2) * t - (a + 3)) * t * t + 1
        far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))
    return w


def _triangle(t):
    return np.maximum(0.0, 1 - np.abs(t))


def axis_taps(c, n, scale, attrs):
    """(index (size, k), weight (size, k) float64 or None) reading an axis of `n` at coordinates c.

    Nearest reads one tap. Linear and cubic read taps base + j around base = ceil(c) - 1
    (c - base in (0, 1]), weighted by the kernel at (j - (c - base)) * s, where s is the
    scale when antialias shrinks (the filter widens by 1 / scale) and 1 otherwise.
    Taps outside the axis read its edge, or get no weight with exclude_outside.
    """
    if attrs["mode"] == "nearest":
        return np.clip(_ROUND[attrs["nearest_mode"]](c), 0, n - 1).astype(np.intp)[:, None], None
    kernel, reach = (_triangle, 1) if attrs["mode"] == "linear" else (_cubic(attrs["cubic_coeff_a"]), 2)
    s = min(float(scale), 1.0) if attrs["antialias"] else 1.0
    first = int(np.floor(-reach / s)) + 1
    c = c.astype(np.float64)
    base = np.ceil(c) - 1
    j = np.arange(first, 1 - first + 1)
    index = base[:, None].astype(np.intp) + j
    weight = kernel((j - (c - base)[:, None]) * s)
    if attrs["antialias"]:
        weight /= weight.sum(axis=1, keepdims=True)
    if attrs["exclude_outside"]:
        weight[(index < 0) | (index >= n)] = 0
        total = weight.sum(axis=1, keepdims=True)
        weight /= np.where(total == 0, 1, total)
    return np.clip(index, 0, n - 1), weight


def resize_plan(in_shape, out_shape, attrs):
    """(axis, index, weight, outside) for each axis resize changes, in order: `outside` marks
    the output positions that tf_crop_and_resize fills with extrapolation_value (or None)."""
    _, scales = resize_axes("resize", attrs, in_shape)
    mode, rank, roi = attrs["coordinate_transformation_mode"], len(in_shape), attrs["roi"]
    plan = []
    for axis, (n, size, scale) in enumerate(zip(in_shape, out_shape, scales)):
        if scale is None:  # scale = out / in, as ONNX defines it when sizes are given
            scale = np.float32(size) / np.float32(n)
        box = (roi[axis], roi[axis + rank]) if mode == "tf_crop_and_resize" else (0.0, 1.0)
        if size == n and np.float32(scale) == 1 and box == (0.0, 1.0):
            continue  # every mode maps each position to itself
        c = source_coordinates(n, size, scale, mode, box)
        outside = (c < 0) | (c > n - 1) if mode == "tf_crop_and_resize" else None
        index, weight = axis_taps(c, n, scale, attrs)
        plan.append((axis, index, weight, outside if outside is not None and outside.any() else None))
    return plan


def _interpolate_axis(src, dst, axis, index, weight):
    """Step: dst = the sum over taps j of src gathered at index[:, j] along `axis`, times weight[:, j]."""
    if weight is None:
        return partial(np.take, src, index[:, 0], axis=axis, out=dst, mode="clip")
    used = [j for j in range(index.shape[1]) if weight[:, j].any()]
    step = jit.bind_interpolate(src, dst, axis, index[:, used], weight[:, used])  # one pass, where numba is
    if step is not None:
        return step
    shape = (-1,) + (1,) * (dst.ndim - 1 - axis)
    taps = [(index[:, j], weight[:, j].astype(dst.dtype).reshape(shape)) for j in used]
    scratch = np.empty_like(dst) if len(taps) > 1 else None

    def run():
        for j, (i, w) in enumerate(taps):
            target = dst if j == 0 else scratch
            np.take(src, i, axis=axis, out=target, mode="clip")
            np.multiply(target, w, out=target)
            if j:
                np.add(dst, scratch, out=dst)
    return run


@kernel("resize")
def _resize(ins, outs, attrs):
    """One axis after another, each a few gathers (one per tap) weighted and summed; float16
    is interpolated in float32."""
    x, out = ins[0], outs[0]
    plan = resize_plan(x.shape, out.shape, attrs)
    if len(plan) > 1 and plan[-1][0] == x.ndim - 1 and len(plan[-1][1]) > x.shape[-1]:
        # Upsampling the last axis, whose pass gathers each output's taps one by one: first,
        # while the array is smallest (a 2x bilinear (1152, 7, 7) -> 14x14: half the gathers).
        plan = plan[-1:] + plan[:-1]
    work = np.dtype(np.float32) if x.dtype == np.float16 and attrs["mode"] != "nearest" else x.dtype
    steps, src, shape = [], x, list(x.shape)
    if plan and work != x.dtype:
        src = np.empty(x.shape, work)
        steps.append(partial(np.copyto, src, x))
    for k, (axis, index, weight, _) in enumerate(plan):
        shape[axis] = len(index)
        dst = out if k == len(plan) - 1 and work == out.dtype else np.empty(shape, work)
        steps.append(_interpolate_axis(src, dst, axis, index, weight))
        src = dst
    if src is not out:
        steps.append(partial(np.copyto, out, src, casting="unsafe"))
    fill = out.dtype.type(attrs["extrapolation_value"])
    for axis, _, _, outside in plan:
        if outside is not None:
            steps.append(partial(out.__setitem__, (slice(None),) * axis + (outside,), fill))
    return sequence(*steps)


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
    """resize undone axis by axis, last resized axis first: each input element gathers the
    gradients of the output elements that read it, with the weights they read it with
    (rounds of gathers rather than scattered adds: numpy gathers fast). Outputs filled
    with extrapolation_value read nothing."""
    dy, dx = ins[0], outs[0]
    plan = resize_plan(dx.shape, dy.shape, attrs)
    steps, src, shape = [], dy, list(dy.shape)
    for k, (axis, index, weight, outside) in enumerate(reversed(plan)):
        n = dx.shape[axis]
        weight = np.ones(index.shape) if weight is None else weight.copy()
        if outside is not None:
            weight[outside] = 0
        rounds = _transposed([(index[:, j], weight[:, j]) for j in range(index.shape[1])], n)
        shape[axis] = n
        dst = dx if k == len(plan) - 1 else np.empty(shape, dx.dtype)
        steps.append(_gather_axis(src, dst, axis, rounds))
        src = dst
    if src is not dx:
        steps.append(partial(np.copyto, dx, src))
    return sequence(*steps)


def _reflect(c, low, high):
    """c reflected by the borders low and high until it lies between them."""
    span = high - low
    if span <= 0:
        return np.full_like(c, low)
    below = c < low
    d = np.where(below, low - c, c - high)
    flips = np.floor(d / span)
    rest = d - flips * span
    even = flips % 2 == 0
    inside = np.where(below == even, low + rest, high - rest)
    return np.where((c < low) | (c > high), inside, c)


def _grid_taps(c, d, attrs):
    """[(index (intp), weight or None)] of one spatial axis of length d at the denormalized
    coordinates c, with padding_mode resolved: taps outside read 0 (weight 0) for zeros,
    the edge for border, their reflection for reflection."""
    padding, mode = attrs["padding_mode"], attrs["mode"]
    low, high = (0.0, d - 1.0) if attrs["align_corners"] else (-0.5, d - 0.5)
    if mode == "nearest":
        c = np.rint(c)
    if padding == "border" and mode != "cubic":  # cubic's taps read the edge: PyTorch's and onnxruntime's
        c = np.clip(c, 0, d - 1)
    elif padding == "reflection":
        c = _reflect(c, low, high)
    if mode == "nearest":
        taps = [(c, None)]
    else:
        base = np.floor(c)
        t = c - base
        if mode == "linear":
            taps = [(base, 1 - t), (base + 1, t)]
        else:
            taps = [(base + j, w) for j, w in zip(range(-1, 3), _cubic(-0.75)(np.stack([t + 1, t, 1 - t, 2 - t])))]
    resolved = []
    for i, w in taps:
        if padding == "zeros":  # (border: the clip below)
            inside = (i >= 0) & (i < d)
            w = inside.astype(c.dtype) if w is None else np.where(inside, w, 0)
        elif padding == "reflection":
            i = _reflect(i, low, high)
        resolved.append((np.clip(i, 0, d - 1).astype(np.intp), w))
    return resolved


@kernel("grid_sample")
def _grid_sample(ins, outs, attrs):
    """Each output element is the sum over the taps' combinations (1, 2 or 4 per axis) of
    x gathered at their flat index times their weights' product; float16 in float32."""
    x, grid, out = ins[0], ins[1], outs[0]
    n, ch, spatial = x.shape[0], x.shape[1], x.shape[2:]
    work = np.float32 if x.dtype == np.float16 and attrs["mode"] != "nearest" else x.dtype
    coord = np.float64 if grid.dtype == np.float64 else np.float32
    dst = reshaped(out, (n, ch, -1))

    def run():
        src = x.reshape(n, ch, -1)
        g = grid.astype(coord).reshape(n, -1, len(spatial))
        combos = [(np.zeros(g.shape[:2], np.intp), None)]
        for axis, d in enumerate(spatial):
            u = g[..., len(spatial) - 1 - axis]
            c = (u + 1) / 2 * (d - 1) if attrs["align_corners"] else ((u + 1) * d - 1) / 2
            taps = _grid_taps(c, d, attrs)
            combos = [(i * d + j, v if w is None else w if v is None else v * w)
                      for i, v in combos for j, w in taps]
        acc = np.zeros(dst.shape, work)
        for index, weight in combos:
            picked = np.take_along_axis(src, index[:, None, :], axis=2)
            if weight is None:
                acc += picked
            else:
                acc += picked * weight[:, None, :].astype(work)
        np.copyto(dst, acc, casting="unsafe")
    return run


def affine_base(spatial, align_corners):
    """(prod(spatial), r + 1): each position's normalized (w, h, d..., 1), w varying fastest."""
    axes = [np.linspace(-1, 1, n) if align_corners else (2 * np.arange(n) + 1) / n - 1 for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in reversed(mesh)] + [np.ones(mesh[0].size)], axis=1)


@kernel("affine_grid")
def _affine_grid(ins, outs, attrs):
    theta, out = ins[0], outs[0]
    base = affine_base(attrs["size"][2:], attrs["align_corners"]).astype(np.promote_types(theta.dtype, np.float32))
    dst = reshaped(out, (out.shape[0], -1, out.shape[-1]))
    return lambda: np.copyto(dst, np.matmul(base, theta.transpose(0, 2, 1)), casting="unsafe")


@kernel("col2im")
def _col2im(ins, outs, attrs):
    """For each block offset (a small loop), the L blocks land on distinct pixels: one
    fancy-indexed add each into the padded image, which is then cropped."""
    x, out = ins[0], outs[0]
    image, block = attrs["image_shape"], attrs["block_shape"]
    strides, pads, dilations = col2im_geometry("col2im", attrs)
    r = len(image)
    padded = [n + pads[i] + pads[i + r] for i, n in enumerate(image)]
    counts = [(padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
    starts = np.stack([m.ravel() for m in np.meshgrid(*[np.arange(c) * s for c, s in zip(counts, strides)],
                                                      indexing="ij")])  # (r, L)
    offsets = np.stack([m.ravel() for m in np.meshgrid(*[np.arange(b) * d for b, d in zip(block, dilations)],
                                                       indexing="ij")])  # (r, K)
    places = [np.ravel_multi_index(tuple(starts + offsets[:, k:k + 1]), padded) for k in range(offsets.shape[1])]
    n, c = out.shape[:2]
    canvas = scratch((n, c, math.prod(padded)), out.dtype)  # bounded; run() zeroes it
    cols = x.reshape(n, c, len(places), -1)
    inside = canvas.reshape((n, c) + tuple(padded))[(slice(None),) * 2 + tuple(
        slice(pads[i], pads[i] + image[i]) for i in range(r))]

    def run():
        canvas.fill(0)
        for k, place in enumerate(places):
            canvas[:, :, place] += cols[:, :, k]
        np.copyto(out, inside)
    return run


def _roi_axis(start, length, bins, grid, n, count):
    """Samples of the boxes along one axis: (low index, high index, weight of low, weight of
    high, in use), each (R, bins, grid): `count` (R,) of the `grid` slots are in use; samples
    beyond [-1, n] are not in use (they read nothing)."""
    size = length / bins
    slot = np.arange(grid)
    c = (start[:, None, None] + np.arange(bins)[None, :, None] * size[:, None, None]
         + (slot + 0.5)[None, None, :] * (size / count)[:, None, None])
    use = (slot[None, None, :] < count[:, None, None]) & (c >= -1) & (c <= n)
    c = np.maximum(c, 0)
    low = np.floor(c).astype(np.intp)
    edge = low >= n - 1
    low = np.where(edge, n - 1, low)
    high = np.where(edge, n - 1, low + 1)
    frac = np.where(edge, 0.0, c - low)
    return low, high, 1 - frac, frac, use


@kernel("roi_align")
def _roi_align(ins, outs, attrs):
    """Each bin's samples' four corners are rows of x's pixels, all channels (x laid out
    channels last once a run), weighted in x's precision (float32 as onnxruntime's; the
    weights made in float64, rounded once); the sums in (R, OH, OW, C), then transposed into
    out. Where numba is loaded, jit.roi_align_loop, a bin at a time, its row of sums in
    cache; else numpy's steps (_roi_align_numpy), a sampling slot at a time over all the
    boxes' bins, the same bits. Faster R-CNN's 150 boxes of 256 channels, 7x7 bins of 2x2
    samples: 406 ms gathering each channel's element by a (R, C, OH, OW) index array apiece,
    the products in float64; by numpy's steps (16 gathers of 7.5 MB and their passes)
    108-144 ms in the model, by the loop 9 (the model at one thread 371 -> 272 ms, the same
    outputs; onnxruntime 313)."""
    x, rois, batch, out = ins[0], ins[1], ins[2], outs[0]
    oh, ow, ratio = attrs["output_height"], attrs["output_width"], attrs["sampling_ratio"]
    half = attrs["coordinate_transformation_mode"] == "half_pixel"
    n, ch, h, w = x.shape
    work = np.promote_types(x.dtype, np.float32)

    def run():
        if not out.size:
            return
        box = rois.astype(np.float64) * attrs["spatial_scale"] - (0.5 if half else 0.0)
        width, height = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
        if not half:
            width, height = np.maximum(width, 1), np.maximum(height, 1)
        gh = np.full(len(box), ratio) if ratio > 0 else np.ceil(height / oh).astype(np.intp)
        gw = np.full(len(box), ratio) if ratio > 0 else np.ceil(width / ow).astype(np.intp)
        ys = _roi_axis(box[:, 1], height, oh, max(int(gh.max()), 1), h, gh)
        xs = _roi_axis(box[:, 0], width, ow, max(int(gw.max()), 1), w, gw)
        pixels = np.ascontiguousarray(x.reshape(n, ch, h * w).transpose(0, 2, 1), work).reshape(-1, ch)
        image = batch.astype(np.intp)[:, None, None] * (h * w)  # (R, 1, 1): the image's first row of pixels
        avg = attrs["mode"] == "avg"
        shape = (len(box), oh, ow, ch)
        acc = np.empty(shape, work)
        if not jit.roi_align(pixels, image[:, 0, 0], w, ys, xs, gh, gw, avg, acc):
            _roi_align_numpy(pixels, image, w, ys, xs, gh, gw, avg, acc)
        np.copyto(out, acc.transpose(0, 3, 1, 2), casting="unsafe")
    return run


def _roi_align_numpy(pixels, image, w, ys, xs, gh, gw, avg, acc):
    """jit.roi_align_loop's values by numpy's steps: a loop over the sampling grid's slots,
    each slot's four corners for all the boxes' bins at once."""
    shape, work = acc.shape, acc.dtype
    acc[...] = 0 if avg else -np.inf
    value, term = (np.empty(shape, work), np.empty(shape, work)) if avg else (None, None)  # avg's buffers
    for iy in range(ys[0].shape[2]):
        ylo, yhi, wylo, wyhi, yuse = (a[:, :, iy, None] for a in ys)  # (R, oh, 1)
        for ix in range(xs[0].shape[2]):
            xlo, xhi, wxlo, wxhi, xuse = (a[:, None, :, ix] for a in xs)  # (R, 1, ow)
            use = yuse & xuse
            in_grid = (iy < gh)[:, None, None, None] & (ix < gw)[:, None, None, None]
            if not (use.any() if avg else in_grid.any()):
                continue
            corners = [((wy * wx * use).astype(work)[..., None], image + yi * w + xi)
                       for yi, wy in ((ylo, wylo), (yhi, wyhi)) for xi, wx in ((xlo, wxlo), (xhi, wxhi))]
            if avg:  # the four weighted corners summed, then added to the bins' sums
                for k, (weight, rows) in enumerate(corners):
                    np.take(pixels, rows, axis=0, out=value)
                    np.multiply(value, weight, out=value if k else term)
                    if k:
                        term += value
                acc += term
            else:
                terms = [weight * pixels[rows] for weight, rows in corners]
                # onnxruntime's max: of the four weighted corners, then over the samples
                sample = np.maximum(np.maximum(terms[0], terms[1]), np.maximum(terms[2], terms[3]))
                np.maximum(acc, np.where(in_grid, sample, -np.inf), out=acc)
    if avg:
        acc /= np.maximum(gh * gw, 1)[:, None, None, None]
    else:
        acc[np.isneginf(acc)] = 0
