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
needs no gather (w @ x); windows that tile x without overlap or padding (kernel ==
strides) are copied into the columns at once, from a strided view of x. Without numba, a
depthwise conv takes the same path, a product per channel of (M/C, taps) @ (taps, L):
measured, that beats numpy's multiply-accumulate of the runs (two passes per tap, one of
them a slow broadcast) by 1 to 2x. With numba,
depthwise convs and stems (1-4 input channels) run jit.py's one-pass loops, or the
compiled kernels of native_depthwise.py and native_small_conv.py where native_gemm runs.

3x3 stride-1 convs of enough channels and outputs take winograd.py's path instead.
"""
import itertools
import math
import os
from dataclasses import dataclass
from functools import partial

import numpy as np

from ...ops.conv import transposed_geometry, window_geometry, window_params
from .. import threads
from ..arena import outside, scratch
from . import jit, kernel, native_gemm, native_small_conv, per_constant, winograd
from .fused import with_activation


def reshaped(a, shape):
    """a.reshape(shape), which must be a view: a step bound to a copy would read stale data."""
    r = a.reshape(shape)
    if r.size and not np.may_share_memory(r, a):
        raise AssertionError(f"reshaping an array of strides {a.strides} to {shape} copies it")
    return r


def sequence(*steps):
    """One step running `steps` (None entries skipped) in order: threads.chain's."""
    steps = [s for s in steps if s is not None]
    return steps[0] if len(steps) == 1 else threads.chain(*steps)


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
    """TapRuns of x padded by `begin` (and `fill` past its end) for these windows.

    The buffers are scratch (arena.scratch): `load` writes them whole, x's elements and
    the padding around them, on every run."""
    sizes, (n, c) = x.shape[2:], x.shape[:2]
    taps = list(itertools.product(*map(range, kernel_shape)))
    # Phase widths: room for every tap's reach and for all of x.
    widths = [max(o + (k - 1) * dl // s, -(-(b + m) // s)) for o, k, s, dl, b, m in
              zip(out_shape, kernel_shape, strides, dilations, begin, sizes)]
    widths[0] += 1  # a run starting past column 0 spills into one more row
    used = sorted({tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides)) for tap in taps})
    buffers = scratch((n, len(used), c, math.prod(widths)), x.dtype)
    grid = reshaped(buffers, (n, len(used), c) + tuple(widths))
    copies, borders = [], []
    for p, phase in enumerate(used):
        src, dst = [], []
        for a, s, b, m in zip(phase, strides, begin, sizes):
            first = (a - b) % s  # first input index that lands in this phase
            count = len(range(first, m, s))
            src.append(slice(first, m, s))
            dst.append(slice((first + b) // s, (first + b) // s + count))
        copies.append((grid[(slice(None), p, slice(None)) + tuple(dst)], x[(Ellipsis,) + tuple(src)]))
        borders += outside(grid[:, p], (slice(None), slice(None)) + tuple(dst))
    phase_of = {phase: p for p, phase in enumerate(used)}
    # Each tap's flat offset in its phase's grid (C order over `widths`), by arithmetic: numpy's
    # ravel_multi_index took 20 us a tap, 1 ms of a 7x7 stem's bind.
    places = [math.prod(widths[k + 1:]) for k in range(len(widths))]
    starts = [(phase_of[tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides))],
               sum(t * dl // s * place for t, dl, s, place in zip(tap, dilations, strides, places)))
              for tap in taps]
    fill = x.dtype.type(fill)

    def load():
        for border in borders:
            border.fill(fill)
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
    return _split(lambda g, p: partial(np.matmul, ws[g], xs[:, g, :, p], out=result[:, g, :, p]),
                  group, result, xs.shape[2], lambda r: partial(np.matmul, ws[:, r], xs, out=result[:, :, r]),
                  lambda b: partial(np.matmul, ws, xs[b], out=result[b])) \
        or (lambda: np.matmul(ws, xs, out=result))


def conv_epilogue(ins, out, attrs, residual=None, slope=None, activation=None, scale=None):
    """_epilogue's step for the conv less the taps that read only padding (`reaching`)."""
    w, attrs = reaching(ins[0], ins[1], attrs)
    return _epilogue([ins[0], w, *ins[2:]], out, attrs, residual, slope, activation, scale)


def _epilogue(ins, out, attrs, residual=None, slope=None, activation=None, scale=None):
    """A step for a one-group 2-D conv (operands `ins`) that the direct path would run as a
    product (a 1x1 stride-1 conv: w @ x; windows tiling x: _patches' columns; others:
    jit.py's im2col columns, gathered and multiplied a block at a time: _blocked_gather),
    writing prelu(act(conv + bias + residual), slope) to `out` in the product's own pass
    (native_gemm.py; over the plan's workers, images apart where there are as many, else
    im2col's output rows, else output channels where there are few columns, else columns in
    strips of native_gemm.NR), or None where that product does
    not run: numba not loaded (a plan keeping its first
    run short; the columns' loops are numba's too), weights, bias or slope that may change
    between runs (variables: packed once here), convs that jit.py's loops or winograd.py
    take (but for a Winograd conv's residual add, which its output transform's loop applies:
    winograd.conv), or shapes native_gemm leaves to BLAS. `activation` (default: the conv's own) comes
    after the residual; plan.py passes the add's where the conv has none. residual: out's
    shape; slope: a PReLU's, constant along all but the channel axis; scale: (N or 1, C, 1,
    1), each image's factor for each channel of x, applied as the product packs x (a
    squeeze-excitation's multiply before a 1x1 conv; the conv then reads x unscaled)."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    activation = attrs["activation"] if activation is None else activation
    if not jit.loaded() or attrs["group"] != 1 or x.ndim != 4 \
            or (x.shape[1] <= jit.SMALL_CONV_CHANNELS and math.prod(w.shape[2:]) <= jit.SMALL_CONV_TAPS) \
            or activation not in native_gemm.ACTIVATIONS \
            or w.flags.writeable or (bias is not None and bias.flags.writeable) \
            or x.dtype != np.float32 or out.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    if np.may_share_memory(out, x):
        return None  # the plan placed the fused chain's output over x, which the pass still reads
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    kernel_shape, p = w.shape[2:], math.prod(out.shape[2:])
    depth = c * math.prod(kernel_shape)
    strides, dilations, _ = window_params("conv", attrs, 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    algo = winograd.choose(x, w, 1, strides, dilations, out_shape, winograd.rule)
    if algo != "direct":  # the residual added by the output transform's loop, as it stores each row
        return None if residual is None or slope is not None or scale is not None \
            else winograd.conv(x, w, bias, begin, out, algo, activation, residual)
    if not native_gemm.suits(m, depth, p) or not native_gemm.available():
        return None
    if slope is not None:
        if slope.flags.writeable or slope.ndim > out.ndim:
            return None
        spread = np.broadcast_to(slope, out.shape)
        if any(st for axis, st in enumerate(spread.strides) if axis != 1):
            return None  # not one value a channel
        slope = spread[0, :, 0, 0]
    results = [reshaped(a, (n, m, p)) for a in (out,) + ((residual,) if residual is not None else ())]
    if scale is not None:
        if scale.ndim != 4 or scale.shape[1:] != (c, 1, 1) or scale.shape[0] not in (1, n) \
                or scale.dtype != np.float32:
            return None
        scale = scale.reshape(scale.shape[0], c)
    by_rows = False  # im2col_loop's gather: by blocks of output rows (_blocked_gather)
    if depth == c and set(strides) == {1} and not any(begin + end):  # 1x1: x is the columns
        copy, cols = None, reshaped(x, (n, c, p))
    elif scale is not None:
        return None
    elif _tiles_without_overlap(x, kernel_shape, 1, strides, dilations, begin, end, out_shape):
        cols = scratch((n, depth, p), x.dtype)  # rewritten whole every run

        def copy(a, b):  # images a:b's columns
            return jit.bind_patches(x, cols, kernel_shape, out_shape, a, b)
    else:
        by_rows, cols = True, None  # cols: where a split gathers them whole (below)

        def copy(a, b, rows=None, into=None):  # images a:b's columns at output rows `rows`, into their block
            return jit.bind_im2col(x, cols if into is None else into, kernel_shape, strides, dilations, begin,
                                   out_shape, a, b, rows, into is not None)
    everything = slice(None)

    def product(images, columns, rows=everything, source=None):  # source: the columns (default cols')
        packed = native_gemm.pack_constant(w, bias, *rows.indices(m)[:2])
        return native_gemm.bind(packed, cols[images, :, columns] if source is None else source,
                                results[0][images, rows, columns], activation,
                                results[1][images, rows, columns] if residual is not None else None,
                                None if slope is None else slope[rows],
                                None if scale is None else scale[images] if scale.shape[0] == n else scale)

    def gathered(images):  # images' columns gathered whole, then their product
        gather = copy and copy(*images.indices(n)[:2])
        step = product(images, everything)
        return None if (copy and gather is None) or step is None else sequence(gather, step)

    def blocked(a, b, rows):  # images a:b's output rows `rows` (a range) by blocks whose columns stay in cache
        return _blocked_gather(a, b, rows, depth, out_shape, x.dtype, copy, product)
    workers = threads.current()
    oh, ow = out_shape
    if workers is None or 2 * n * m * depth * p < threads.MIN_FLOPS:
        parts = [blocked(0, n, (0, oh)) if by_rows else gathered(everything)]
    elif n >= workers.n:  # each worker gathers its images' columns, then multiplies them
        parts = [blocked(a, b, (0, oh)) if by_rows else gathered(slice(a, b)) for a, b in threads.pieces(n, workers.n)]
    elif by_rows and p >= threads.MIN_COLUMNS * workers.n and oh >= workers.n:
        # columns apart by output rows: each worker gathers its rows' columns, then multiplies them
        parts = [blocked(0, n, piece) for piece in threads.pieces(oh, workers.n)]
    else:  # the gather first, then output channels apart (few columns) or columns in whole strips
        if cols is None:
            cols = scratch((n, depth, p), x.dtype)  # rewritten whole every run
        if p < threads.MIN_COLUMNS * workers.n and m >= 8 * workers.n:
            parts = [product(everything, everything, slice(a, b)) for a, b in threads.pieces(m, workers.n, 8)]
        else:
            strips = -(-p // native_gemm.NR)
            parts = [product(everything, slice(a * native_gemm.NR, min(b * native_gemm.NR, p)))
                     for a, b in threads.pieces(strips, workers.n)]
        gather = copy and copy(0, n)
        if None in parts or (copy and gather is None):
            return None
        return sequence(gather, parts[0] if len(parts) == 1 else workers.split(parts))
    if None in parts:
        return None
    return parts[0] if len(parts) == 1 else workers.split(parts)


def pointwise_depthwise(pw_ins, t, dw_ins, out, pw_attrs, dw_attrs):
    """One step for a 1x1 conv (operands `pw_ins`, output t) whose output only a depthwise
    conv reads (operands t and `dw_ins`, output `out`): MobileNet's and EfficientNet's
    expansion and the depthwise conv after it, over the plan's workers, where there are fewer
    images than workers: each runs the 1x1 conv's product (native_gemm's, its bias and
    activation in its pass) for its output channels, then the depthwise conv of the same
    channels (jit.bind_depthwise), which reads only what that worker wrote: no meeting of
    the workers between the two (the 1x1 conv alone splits its columns), and the depthwise
    conv reads t from the cache of the core that wrote it. None where there are no workers,
    as many images as workers (each conv splits them), too little work, or either conv is
    not one this takes (the two then bind apart). Alone, against the two split apart, 2
    workers, batch 1: MobileNetV2's 64 -> 384 at 14x14 152 -> 135 us, 32 -> 192 at 28x28 161 -> 147 (its
    stride-2 depthwise 118 -> 98), 96 -> 576 at 14x14 184 -> 171, 160 -> 960 at 7x7 128 -> 121,
    24 -> 144 at 56x56 the same."""
    workers = threads.current()
    x, w = pw_ins[:2]
    bias = pw_ins[2] if len(pw_ins) > 2 else None
    w2 = dw_ins[0]
    bias2 = dw_ins[1] if len(dw_ins) > 1 else None
    if workers is None or not jit.loaded() or x.ndim != 4 or x.dtype != np.float32 or t.dtype != np.float32 \
            or not (x.flags.c_contiguous and t.flags.c_contiguous and out.flags.c_contiguous) \
            or pw_attrs["group"] != 1 or w.shape[2:] != (1, 1) or any(a.flags.writeable for a in pw_ins[1:]) \
            or pw_attrs["activation"] not in native_gemm.ACTIVATIONS or dw_attrs["group"] != t.shape[1] \
            or w2.shape[:2] != (t.shape[1], 1) or np.may_share_memory(out, x) or np.may_share_memory(out, t):
        return None
    strides, _, _ = window_params("conv", pw_attrs, 2)
    shape, begin, end = window_geometry("conv", x.shape[2:], (1, 1), pw_attrs)
    n, c, m, p = x.shape[0], x.shape[1], w.shape[0], math.prod(t.shape[2:])
    if set(strides) != {1} or any(begin + end) or tuple(shape) != t.shape[2:] \
            or not native_gemm.suits(m, c, p) or not native_gemm.available() \
            or 2 * n * m * c * p < threads.MIN_FLOPS or n >= workers.n:
        return None  # images apart, each conv splits so already
    dw_strides, dilations, _ = window_params("conv", dw_attrs, 2)
    _, dw_begin, _ = window_geometry("conv", t.shape[2:], w2.shape[2:], dw_attrs)
    xs, ts = reshaped(x, (n, c, p)), reshaped(t, (n, m, p))

    def part(images, channels):
        a, b = channels
        product = native_gemm.bind(native_gemm.pack_constant(w, bias, a, b), xs[images], ts[images, a:b],
                                   pw_attrs["activation"])
        depthwise = jit.bind_depthwise(t[images, a:b], w2[a:b], None if bias2 is None else bias2[a:b],
                                       out[images, a:b], dw_strides, dilations, dw_begin, dw_attrs["activation"])
        return None if product is None or depthwise is None else threads.chain(product, depthwise)
    parts = [part(slice(None), piece) for piece in threads.pieces(m, workers.n, 8)]  # whole vectors of 8
    if len(parts) < 2 or None in parts:
        return None
    return workers.split(parts)


# Floats of im2col's columns gathered at a time (conv_epilogue): a block of output rows (or of
# whole images) gathered, then multiplied while it is in L2, then the next into the same
# buffer. ResNet-18's 7x7 stem at 224 (147 x 12,544 columns, 7.4 MB), one thread: 5.6 ms
# gathered whole then multiplied, 5.0-5.1 in blocks of 4 output rows, 4.9-5.0 of 8 or 16
# (2^17 floats: 8), 5.1 of 28, 5.8 of 56 (one process, interleaved).
GATHER_BLOCK_FLOATS = 1 << 17


def _blocked_gather(a, b, rows, depth, out_shape, dtype, copy, product):
    """A step gathering images a:b's columns at output rows `rows` (a range) by blocks of
    about GATHER_BLOCK_FLOATS into one buffer (copy(images, rows, block)), each block
    multiplied (product(images, columns, source=block)) before the next is gathered; or
    None where a step does not bind."""
    (_, ow), (r0, r1) = out_shape, rows
    per_row = depth * ow
    if (r1 - r0) * per_row >= GATHER_BLOCK_FLOATS:  # blocks of an image's rows
        images, count = 1, max(1, GATHER_BLOCK_FLOATS // per_row)
    else:  # blocks of whole images
        images, count = min(b - a, max(1, GATHER_BLOCK_FLOATS // ((r1 - r0) * per_row))), r1 - r0
    buffer = scratch((images * count * per_row,), dtype)  # rewritten whole every run
    steps = []
    for i in range(a, b, images):
        j = min(b, i + images)
        for s in range(r0, r1, count):
            e = min(r1, s + count)
            block = buffer[:(j - i) * (e - s) * per_row].reshape(j - i, depth, (e - s) * ow)
            steps += [copy(i, j, (s, e), block), product(slice(i, j), slice(s * ow, e * ow), source=block)]
    return None if None in steps else sequence(*steps)


def _patches(x, w, out):
    """A conv whose windows tile x without overlap or padding (kernel == strides, dilation
    1, one group: a 2x2 stride-2 downsampling, a ViT's patch embedding): x's windows copied
    once in im2col's order (C, kh, kw) by one strided copy (jit.py's patches_loop where numba
    is loaded), then (M, C * kh * kw) @ columns. The tap runs would copy x twice (into one
    phase per tap, then into the columns): a 64->64 2x2 stride-2 conv at 32x32 took 285 us
    that way, 210 this one, 132 with the loop (iris_landmark's eight such convs 582 -> 365)."""
    n, c = x.shape[:2]
    m, (kh, kw), (oh, ow) = w.shape[0], w.shape[2:], out.shape[2:]
    s = x.strides
    windows = np.lib.stride_tricks.as_strided(x, (n, c, kh, kw, oh, ow), (s[0], s[1], s[2], s[3], kh * s[2], kw * s[3]))
    cols = scratch((n, c * kh * kw, oh * ow), x.dtype)  # rewritten whole every run
    cols6 = reshaped(cols, (n, c, kh, kw, oh, ow))
    ws, result = w.reshape(m, -1), reshaped(out, (n, m, oh * ow))

    def copy(a, b):  # images a:b's windows into their columns: jit.py's loop where numba is loaded
        return jit.bind_patches(x, cols, (kh, kw), (oh, ow), a, b) or partial(np.copyto, cols6[a:b], windows[a:b])
    return _gathered_product(copy, ws, cols, result)


def _gathered_product(copy, ws, cols, result):
    """A step running copy(a, b) (a step writing images a:b's columns into cols) and then
    ws @ cols into result (N, M, L), split over the plan's workers where there is much work:
    images apart where there are as many as workers (each gathers and multiplies its own),
    else the gather, then output channels apart."""
    n, m = result.shape[0], ws.shape[0]
    workers = threads.current()
    if workers is None or 2 * result.size * ws.shape[1] < threads.MIN_FLOPS:
        return sequence(copy(0, n), partial(np.matmul, ws, cols, out=result))
    if n >= workers.n:
        return _Split(workers, [sequence(copy(a, b), partial(np.matmul, ws, cols[a:b], out=result[a:b]))
                                for a, b in threads.pieces(n, workers.n)])
    parts = [partial(np.matmul, ws[a:b], cols, out=result[:, a:b]) for a, b in threads.pieces(m, workers.n, 8)]
    return sequence(copy(0, n), _Split(workers, parts, rows=True))


def _columns(x, w, group, out, strides, dilations, begin):
    """A 2-D conv of one group as im2col's columns (N, C * kh * kw, OH * OW), gathered from x
    in place by jit.py's im2col_loop, then one product (M, C * kh * kw) @ columns written
    straight to out; or None where numba is not loaded (the tap runs' path then). Against
    the tap runs (x copied into its stride phases, each tap's run of them copied into the
    columns, a product wider than out, then a crop): ResNet-18's 7x7 stem 0.93x of their time,
    its strided 3x3 and 1x1 convs 0.90-0.98x, a run at batch 8 338 -> 314 ms (one thread,
    numba loaded: alternating processes)."""
    if x.ndim != 4 or group != 1 or x.dtype not in jit.FLOATS or not x.flags.c_contiguous or not jit.loaded():
        return None
    n, c = x.shape[:2]
    m, kernel, out_shape = w.shape[0], w.shape[2:], out.shape[2:]
    cols = scratch((n, c * math.prod(kernel), math.prod(out_shape)), x.dtype)  # rewritten whole every run
    return _gathered_product(lambda a, b: jit.bind_im2col(x, cols, kernel, strides, dilations, begin, out_shape, a, b),
                             w.reshape(m, -1), cols, reshaped(out, (n, m, -1)))


def _tiles_without_overlap(x, kernel_shape, group, strides, dilations, begin, end, out_shape):
    """Whether _patches computes this conv: its windows tile x (kernel == strides), or it has
    one window (a 1x1 output: iris_landmark's last 2x2 convs over 2x2 planes, 52 -> 34 us and
    17 -> 7)."""
    return x.ndim == 4 and group == 1 and math.prod(kernel_shape) > 1 and set(dilations) == {1} \
        and not any(begin + end) and (tuple(kernel_shape) == tuple(strides) or set(out_shape) == {1})


def _im2col(runs, w, group, acc):
    """Gather the runs into columns (N, g, C/g * taps, L), then one batched product with w."""
    sources = runs.runs()
    n, c, length = sources[0].shape
    m = w.shape[0]
    cols = scratch((n, c, len(sources), length), w.dtype)  # rewritten whole every run
    gathers = [(cols[:, :, t], run) for t, run in enumerate(sources)]
    flat = reshaped(cols, (n, group, -1, cols.shape[-1]))
    ws = reshaped(w, (group, m // group, -1))
    result = reshaped(acc, (n, group, m // group, -1))

    def piece(g, p):  # the gathers and the product of groups g, columns p
        channels = slice(g.start * (c // group), g.stop * (c // group))
        return sequence(_copies([(dst[:, channels, p], src[:, channels, p]) for dst, src in gathers]),
                        partial(np.matmul, ws[g], flat[:, g, :, p], out=result[:, g, :, p]))

    def rows(r):  # output channels r of every group, once the gathers are done
        return partial(np.matmul, ws[:, r], flat, out=result[:, :, r])

    def images(b):  # the gathers and the product of images b
        return sequence(_copies([(dst[b], src[b]) for dst, src in gathers]),
                        partial(np.matmul, ws, flat[b], out=result[b]))
    split = _split(piece, group, result, flat.shape[2], rows, images)
    if split is None:
        return piece(slice(0, group), slice(None))
    return sequence(_copies(gathers), split) if split.rows else split  # rows: every worker reads all columns


def _copies(pairs):
    """A step copying each (destination, source) pair."""
    def run():
        for dst, src in pairs:
            np.copyto(dst, src)
    return run


class _Split:
    """A step running `parts` on `workers`; `rows`: the parts split output channels."""

    def __init__(self, workers, parts, rows=False):
        self.run, self.rows = workers.split(parts), rows

    def __call__(self):
        self.run()


def _split(piece, group, result, depth, rows=None, images=None):
    """A step running the product over the plan's workers, or None (one thread, little
    work): `images(batch)` (a slice; a step) for a batch of as many images as workers or
    more (each worker's operands and output stay contiguous), else `piece(groups, columns)`
    (slices; each a step) for groups apart when there are several, else `rows(output
    channels)` when there are threads.ROWS_FIRST of them (or too few columns), else for
    columns."""
    workers = threads.current()
    if workers is None or 2 * result.size * depth < threads.MIN_FLOPS:
        return None
    if images is not None and result.shape[0] >= workers.n:
        parts = [images(slice(a, b)) for a, b in threads.pieces(result.shape[0], workers.n)]
    elif group >= workers.n:
        parts = [piece(slice(a, b), slice(None)) for a, b in threads.pieces(group, workers.n)]
    elif rows is not None and (result.shape[-2] >= threads.ROWS_FIRST or result.shape[-1] < threads.MIN_COLUMNS * workers.n) \
            and result.shape[-2] >= 8 * workers.n:
        parts = [rows(slice(a, b)) for a, b in threads.pieces(result.shape[-2], workers.n, 8)]
        return _Split(workers, parts, rows=True) if len(parts) > 1 else None
    else:
        parts = [piece(slice(0, group), slice(a, b))
                 for a, b in threads.pieces(result.shape[-1], workers.n, threads.MIN_COLUMNS)]
    return _Split(workers, parts) if len(parts) > 1 else None


def _jit_conv(bind, x, w, bias, out, strides, dilations, begin, activation):
    """numba's one-pass conv `bind` (jit.bind_depthwise or jit.bind_small_conv; or None),
    split over the plan's workers by images when there are as many as workers, else (one
    image) a stem's compiled kernel by output rows (each worker copies the input rows its
    band reads: split by channels, each copied the whole image, and MobileNetV2's stem took
    0.96x its one-thread time at two, by rows 0.78x; EfficientNet-B0's 0.69x, ResNet-18's
    0.55x), else by output channels, whose slices stay contiguous (a depthwise conv's input
    channels with them)."""
    workers = threads.current()
    if workers is None or (x.shape[0] != 1 and x.shape[0] < workers.n) \
            or 2 * out.size * math.prod(w.shape[1:]) < threads.MIN_FLOPS:
        return bind(x, w, bias, out, strides, dilations, begin, activation)
    if x.shape[0] >= workers.n:
        parts = [bind(x[a:b], w, bias, out[a:b], strides, dilations, begin, activation)
                 for a, b in threads.pieces(x.shape[0], workers.n)]
    else:
        parts = [None] if bind is not jit.bind_small_conv else [
            bind(x, w, bias, out, strides, dilations, begin, activation, rows)
            for rows in threads.pieces(out.shape[2], workers.n)]
        if None in parts:
            depthwise = bind is jit.bind_depthwise
            parts = [bind(x[:, a:b] if depthwise else x, w[a:b], None if bias is None else bias[a:b], out[:, a:b],
                          strides, dilations, begin, activation)
                     for a, b in threads.pieces(out.shape[1], workers.n)]
    if None in parts:
        return None
    return workers.split(parts) if len(parts) > 1 else parts[0]  # on the native workers: jit._bound


def _grouped(x, w, bias, out, group, strides, dilations, begin, activation):
    """A grouped 2-D conv (not depthwise: RegNet's 8 channels a group, ResNeXt's 4 to 32) of
    at most native_small_conv.GROUP_CHANNELS input channels a group, as native_small_conv's
    direct kernel runs it (each image's group copied into its padded rows, then its output
    channels' tiles summed in registers; no im2col columns, no product per group); split
    over the plan's workers by images where there are as many, else (one image) by groups;
    or None: numba not loaded (the JIT off, or a plan keeping its first run short, as
    _epilogue), native_gemm not running here, or a conv the kernel does not take. RegNetY-400MF's
    grouped convs at batch 1, one thread, each step alone: 6.35 ms in all, 2.31 this way."""
    c = x.shape[1] // group
    if not jit.loaded() or x.ndim != 4 or x.dtype != np.float32 or out.dtype != np.float32 \
            or not native_small_conv.suits(c, w.shape[2:], strides, dilations, begin, out.shape[2:], activation,
                                           native_small_conv.GROUP_CHANNELS) \
            or not all(a.flags.c_contiguous for a in (x, w, out)) or not native_gemm.available():
        return None
    n, m = x.shape[0], w.shape[0] // group

    def bind(images, first, last):  # images (a slice), groups first:last
        return native_small_conv.bind(
            x[images, first * c:last * c], w[first * m:last * m], None if bias is None else bias[first * m:last * m],
            out[images, first * m:last * m], strides[0], dilations, begin, activation, groups=last - first)
    workers = threads.current()
    if workers is None or 2 * out.size * math.prod(w.shape[1:]) < threads.MIN_FLOPS or 1 < n < workers.n:
        parts = [bind(slice(None), 0, group)]
    elif n >= workers.n:
        parts = [bind(slice(a, b), 0, group) for a, b in threads.pieces(n, workers.n)]
    else:  # one image: its channels of a group range lie together
        parts = [bind(slice(None), a, b) for a, b in threads.pieces(group, workers.n)]
    if None in parts:
        return None
    return workers.split(parts) if len(parts) > 1 else parts[0]


_REACHING = {}  # reaching()'s weights, while their constants live


def _outputs_reached(n, k, s, dl, b, o):
    """Along one axis (x's size n, kernel size k, stride s, dilation dl, padding before b, o
    outputs): for each kernel position, (first, last + 1) of the outputs that read an
    element of x through it (first >= last where none does)."""
    spans = []
    for t in range(k):
        first_read = t * dl - b  # x's index that output 0 reads through tap t
        spans.append((max(0, -(first_read // s)),  # the first output reading at 0 or past it
                      min(o - 1, (n - 1 - first_read) // s) + 1))  # past the last reading before n
    return spans


def reaching_taps(sizes, kernel_shape, strides, dilations, begin, out_shape):
    """Per spatial axis, (first, last + 1) of the kernel positions whose taps read an element
    of x for some output position: the others, before and after them, read only padding.
    (0, 0) on an axis where none does."""
    spans = []
    for axis in zip(sizes, kernel_shape, strides, dilations, begin, out_shape):
        used = [t for t, (first, last) in enumerate(_outputs_reached(*axis)) if first < last]
        spans.append((used[0], used[-1] + 1) if used else (0, 0))
    return spans


def reaching(x, w, attrs):
    """(w, attrs) of this conv without the kernel rows and columns (planes) whose taps read
    only padding at every output position: the same sums, less the products of zeros.
    DeepLabV3's atrous pyramid on MobileNetV3's 14x14 map (960 -> 256, 3x3 at dilations 12,
    24 and 36, padded as much): at 24 and 36 only the centre reaches the map, a 1x1 conv
    where a 3x3 ran, 12.9 -> 1.6-1.8 ms each. The conv unchanged where every tap reaches x, w is
    not a model's constant (a train step's variable), or a pad would turn negative; the
    trimmed weights a contiguous constant, made once (per_constant). EDGEFLOW_CONV_ALGO set
    to an algorithm runs the conv as written."""
    if w.flags.writeable or x.ndim < 3 or os.environ.get(winograd.ENV, "").strip().lower() in winograd.ALGOS:
        return w, attrs
    kernel_shape = w.shape[2:]
    strides, dilations, _ = window_params("conv", attrs, x.ndim - 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    spans = reaching_taps(x.shape[2:], kernel_shape, strides, dilations, begin, out_shape)
    if all(span == (0, k) for span, k in zip(spans, kernel_shape)) or any(lo == hi for lo, hi in spans):
        return w, attrs
    begin = [b - lo * dl for b, (lo, _), dl in zip(begin, spans, dilations)]
    end = [e - (k - hi) * dl for e, (_, hi), dl, k in zip(end, spans, dilations, kernel_shape)]
    if min(begin + end) < 0:
        return w, attrs
    trimmed = per_constant(_REACHING, (id(w), tuple(spans)), (w,), lambda: _read_only(np.ascontiguousarray(
        w[(slice(None), slice(None)) + tuple(slice(lo, hi) for lo, hi in spans)])))
    return trimmed, {**attrs, "pads": tuple(begin + end), "auto_pad": "NOTSET"}


def _read_only(a):
    a.flags.writeable = False
    return a


# A one-group conv whose taps reach fewer than this share of the (tap, output position)
# pairs runs each tap's product over the outputs it reaches (`_reached`), where that spares
# REACHED_MIN_FLOPS operations or more (else a tiny conv's one product and its few calls).
REACHED_SHARE = 0.5
REACHED_MIN_FLOPS = 1 << 22
_TAP_MATRICES = {}  # _reached's (kh, kw, M, C) weights, while their constants live


def _reached(x, w, bias, out, strides, dilations, begin, out_shape, activation):
    """A step for a one-group 2-D conv whose taps mostly read padding (each reaching only a
    band of the outputs: DeepLabV3's dilation-12 3x3 on a 14x14 map, padded 12, reaches 324
    of its 9 x 196 pairs): each tap's product W[:, :, i, j] @ x over the outputs it reaches
    (x's rows and columns it reads gathered, then multiplied, then added to out's block),
    the taps reaching every output first, written rather than added; then the bias and the
    activation. None where w is not a model's constant, the taps reach REACHED_SHARE or
    more of the pairs (im2col's one product is faster there), or too little is spared."""
    if w.flags.writeable or x.ndim != 4 or x.dtype not in (np.float32, np.float64) or w.dtype != x.dtype:
        return None
    n, c = x.shape[:2]
    m, _, kh, kw = w.shape
    reach = [_outputs_reached(*axis) for axis in zip(x.shape[2:], (kh, kw), strides, dilations, begin, out_shape)]
    taps = [(i, j, reach[0][i], reach[1][j]) for i in range(kh) for j in range(kw)
            if reach[0][i][0] < reach[0][i][1] and reach[1][j][0] < reach[1][j][1]]
    pairs = sum((r1 - r0) * (c1 - c0) for _, _, (r0, r1), (c0, c1) in taps)
    every = kh * kw * out_shape[0] * out_shape[1]
    if not taps or pairs >= REACHED_SHARE * every or 2 * n * m * c * (every - pairs) < REACHED_MIN_FLOPS:
        return None
    matrices = per_constant(_TAP_MATRICES, id(w), (w,),
                            lambda: _read_only(np.ascontiguousarray(w.transpose(2, 3, 0, 1))))
    steps, written = [], False
    taps.sort(key=lambda tap: -(tap[2][1] - tap[2][0]) * (tap[3][1] - tap[3][0]))  # the widest first
    for i, j, (r0, r1), (c0, c1) in taps:
        rows, cols = r1 - r0, c1 - c0
        full = (rows, cols) == tuple(out_shape)
        first_row = r0 * strides[0] + i * dilations[0] - begin[0]
        first_col = c0 * strides[1] + j * dilations[1] - begin[1]
        source = x[:, :, first_row:first_row + (rows - 1) * strides[0] + 1:strides[0],
                   first_col:first_col + (cols - 1) * strides[1] + 1:strides[1]]
        gathered = scratch((n, c, rows, cols), x.dtype)
        block = out[:, :, r0:r1, c0:c1]
        weights = matrices[i, j]
        if full and not written:  # straight into out
            steps += [partial(np.copyto, gathered, source), _product(weights, gathered.reshape(n, c, -1),
                                                                     out.reshape(n, m, -1))]
            written = True
            continue
        result = scratch((n, m, rows * cols), x.dtype)
        steps += [partial(np.copyto, gathered, source),
                  _product(weights, gathered.reshape(n, c, -1), result),
                  partial(np.add, block, result.reshape(n, m, rows, cols), out=block)]
    if not written:
        steps.insert(0, partial(out.fill, 0))
    finish = jit.bind_bias_activation(out, bias, out, activation)
    if finish is not None:
        return sequence(*steps, finish)
    if bias is not None:
        steps.append(partial(np.add, out, bias.reshape(-1, 1, 1), out=out))
    return with_activation(sequence(*steps), activation, out)


def _product(a, b, out):
    """a @ b into out, split over the plan's workers where it is worth it."""
    from .math import split_matmul
    return split_matmul(a, b, out) or partial(np.matmul, a, b, out=out)


@kernel("conv")
def _conv(ins, outs, attrs):
    w, attrs = reaching(ins[0], ins[1], attrs)  # taps that read only padding dropped
    ins = [ins[0], w, *ins[2:]]
    x = ins[0]
    bias = ins[2] if len(ins) > 2 else None
    out, group = outs[0], attrs["group"]
    kernel_shape = w.shape[2:]
    strides, dilations, _ = window_params("conv", attrs, x.ndim - 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    if x.ndim == 4 and ((group > 1 and group == x.shape[1] == w.shape[0])  # depthwise, or a stem:
                        or (group == 1 and x.shape[1] <= jit.SMALL_CONV_CHANNELS)):  # one pass where numba is
        bind = jit.bind_depthwise if group > 1 else jit.bind_small_conv
        step = _jit_conv(bind, x, w, bias, out, strides, dilations, begin, attrs["activation"])
        if step is not None:
            return step
    if 1 < group < x.shape[1] and (step := _grouped(x, w, bias, out, group, strides, dilations, begin,
                                                    attrs["activation"])) is not None:
        return step  # each group a conv of few channels: the stems' direct kernel, a group at a time
    if group == 1 and (step := _reached(x, w, bias, out, strides, dilations, begin, out_shape,
                                        attrs["activation"])) is not None:
        return step  # taps reaching few of the outputs each: their products over those alone
    algo = winograd.choose(x, w, group, strides, dilations, out_shape,  # see winograd.py
                           winograd.variable_rule if w.flags.writeable else winograd.rule)
    if algo != "direct":
        return winograd.conv(x, w, bias, begin, out, algo, attrs["activation"])
    fused = _epilogue(ins, out, attrs)  # the product and its epilogue in one pass, where it runs
    if fused is not None:
        return fused
    if math.prod(kernel_shape) == 1 and set(strides) == {1} and not any(begin + end):
        step, runs, acc = _pointwise(x, w, group, out), None, out
    elif _tiles_without_overlap(x, kernel_shape, group, strides, dilations, begin, end, out_shape):
        step, runs, acc = _patches(x, w, out), None, out
    elif (step := _columns(x, w, group, out, strides, dilations, begin)) is not None:
        runs, acc = None, out
    else:
        runs = tap_runs(x, kernel_shape, strides, dilations, begin, out_shape)
        acc = out if runs.wide == out_shape else scratch(out.shape[:2] + runs.wide, out.dtype)
        step = sequence(runs.load, _im2col(runs, w, group, acc))
    finish = jit.bind_bias_activation(acc, bias, out, attrs["activation"])  # crop, bias, activation in one pass
    if finish is not None:
        return sequence(step, finish)
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
    # Scratch (bounded, shared): run() rewrites both whole (the matmul, then fill(0)).
    full = out if direct else scratch((n, m) + full_shape, out.dtype)
    crop = full[(Ellipsis,) + tuple(slice(b, b + o) for b, o in zip(begin, out_shape))]
    cols = scratch((n, group, (m // group) * math.prod(kernel_shape), math.prod(sizes)), x.dtype)
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


# Window ops run backwards over the tap runs of conv.py: each tap's run of the padded,
# phase-split input is where that tap's share of the gradient goes, so the gradients are
# added run by run (long and unit-stride, as the forward reads them) into zeroed buffers
# laid out as the runs, and the input's part of those is copied out at the end.

def unload_step(runs, grads, x, kernel_shape, strides, dilations, begin):
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


def _widened(runs, dy, shape, spans=None):
    """(array, step): dy copied into a zeroed array of `shape` ending in the wide layout
    (N, M, *wide), or dy itself with no step where that layout is dy's own. With `spans`
    ((first, last) along axis 1), a list of steps, one copying each span."""
    if runs.wide == runs.out_shape and shape == dy.shape and dy.flags.c_contiguous:
        return dy, (None if spans is None else [None] * len(spans))
    wide = scratch(shape, dy.dtype)
    box = tuple(slice(0, o) for o in runs.out_shape)

    def copy(a, b):
        part = wide[:, a:b]
        pads = outside(part, (slice(None), slice(None)) + box)  # the columns past the outputs: zero

        def run():
            for pad in pads:
                pad.fill(0)
            np.copyto(part[(Ellipsis,) + box], dy[:, a:b])
        return run
    return wide, (copy(0, shape[1]) if spans is None else [copy(a, b) for a, b in spans])


def _conv_geometry(x, kernel_shape, attrs):
    strides, dilations, _ = window_params("conv", attrs, x.ndim - 2)
    out_shape, begin, end = window_geometry("conv", x.shape[2:], kernel_shape, attrs)
    pointwise = math.prod(kernel_shape) == 1 and set(strides) == {1} and not any(begin + end)
    return strides, dilations, out_shape, begin, pointwise


def _jit_depthwise_grad(which, a, b, out, strides, dilations, begin):
    """numba's one-pass gradient of a 2-D depthwise conv (jit.bind_depthwise_grad: `which`
    "input" or "filter"), its channels split over the plan's workers; or None."""
    dy, w = (b, out) if which == "filter" else (a, b)
    workers = threads.current()
    n = 1 if workers is None or 2 * dy.size * math.prod(w.shape[2:]) < threads.MIN_FLOPS else workers.n
    parts = [jit.bind_depthwise_grad(which, a, b, out, strides, dilations, begin, c0, c1)
             for c0, c1 in threads.pieces(w.shape[0], n)]
    if None in parts:
        return None
    return _Split(workers, parts) if len(parts) > 1 else parts[0]


@kernel("conv_input_grad")
def _conv_input_grad(ins, outs, attrs):
    """Columns w^T @ dy (N, C, taps, L), each tap's added into its run, then unloaded."""
    dy, w, dx = ins[0], ins[1], outs[0]
    (n, c), m, group, kernel_shape = dx.shape[:2], w.shape[0], attrs["group"], w.shape[2:]
    strides, dilations, out_shape, begin, pointwise = _conv_geometry(dx, kernel_shape, attrs)
    ws = np.swapaxes(reshaped(w, (group, m // group, -1)), 1, 2)
    if pointwise:
        result, dys = reshaped(dx, (n, group, c // group, -1)), reshaped(dy, (n, group, m // group, -1))
        return _by_images([partial(np.matmul, ws, dys[a:b], out=result[a:b])
                           for a, b in _image_spans(n, result.size * (m // group))])
    if dx.ndim == 4 and group == c == m:
        step = _jit_depthwise_grad("input", dy, w, dx, strides, dilations, begin)
        if step is not None:
            return step
    step = _input_grad_as_conv(dy, w, dx, group, strides, dilations, begin)
    if step is not None:
        return step
    runs = tap_runs(dx, kernel_shape, strides, dilations, begin, out_shape)  # never loaded
    wide, widen = _widened(runs, dy, (n, m) + runs.wide)
    sources = runs.runs()
    taps, length = len(sources), sources[0].shape[-1]
    dys = reshaped(wide, (n, group, m // group, length))
    targets = [reshaped(run, (n, group, c // group, length)) for run in sources]
    if m == group:  # one output channel per group (depthwise): the product is an outer one, slow in BLAS
        part = scratch((n, group, c // group, length), dx.dtype)
        w_taps = reshaped(w, (group, c // group, taps))[..., None]
        adds = [(partial(np.multiply, dys, w_taps[:, :, t], out=part), part, target)
                for t, target in enumerate(targets)]

        def body():
            for multiply, product, target in adds:
                multiply()
                np.add(target, product, out=target)
    else:  # the product and the taps' adds image by image, images apart on the plan's workers
        cols = scratch((n, group, c // group, taps, length), dx.dtype)
        flat = reshaped(cols, (n, group, -1, length))

        def images(a, b):
            def step():
                np.matmul(ws, dys[a:b], out=flat[a:b])
                for t, target in enumerate(targets):
                    np.add(target[a:b], cols[a:b, :, :, t], out=target[a:b])
            return step
        body = _by_images([images(a, b) for a, b in _image_spans(n, cols.size * (m // group))])
    unload = unload_step(runs, runs.buffers, dx, kernel_shape, strides, dilations, begin)

    def run():
        runs.buffers.fill(0)
        body()
        unload()
    return sequence(widen, run)


def _input_grad_as_conv(dy, w, dx, group, strides, dilations, begin):
    """A stride-1 conv's input gradient is a conv too: of dy with w's taps flipped and its
    channel axes swapped, padded by (kernel - 1 - padding) at the start. Where that conv
    takes a Winograd path (3x3, one group: ResNet's), the step copying w so (it is a
    variable: every run) and running it; else None. ResNet-18's layers at batch 8, one
    thread, against im2col and the taps' adds: 64 channels at 56x56 41 -> 34 ms, 128 at 28
    36 -> 20, 256 at 14 38 -> 26, 512 at 7 66 -> 44."""
    kernel = w.shape[2:]
    if dx.ndim != 4 or group != 1 or set(strides) != {1} or set(dilations) != {1} \
            or any(b > k - 1 for b, k in zip(begin, kernel)):
        return None
    shape = (w.shape[1], w.shape[0]) + kernel
    algo = winograd.choose(dy, np.empty(shape, w.dtype), 1, strides, dilations, dx.shape[2:],  # pages untouched
                           winograd.variable_rule)
    if algo == "direct":
        return None
    flipped = scratch(shape, w.dtype)  # rewritten whole every run
    full = tuple(k - 1 - b for b, k in zip(begin, kernel))
    return sequence(partial(np.copyto, flipped, np.swapaxes(w, 0, 1)[:, :, ::-1, ::-1]),
                    winograd.conv(dy, flipped, None, full, dx, algo))


def _image_spans(n, macs):
    """(first, last) images of each piece of a gradient's product of `macs` multiply-adds:
    one piece, or one per worker of the plan when it has some, work enough, and images
    enough (a train step's batch)."""
    workers = threads.current()
    if workers is None or n < workers.n or 2 * macs < threads.MIN_FLOPS:
        return [(0, n)]
    return threads.pieces(n, workers.n)


def _by_images(steps):
    """One step running `steps` (made over _image_spans) on the plan's workers."""
    return steps[0] if len(steps) == 1 else _Split(threads.current(), steps)


@kernel("conv_filter_grad")
def _conv_filter_grad(ins, outs, attrs):
    """One product per group over the whole batch: dy (M/g, N * L) @ columns (N * L, C/g * taps);
    on a plan's workers with as many images as workers, one per worker over its images,
    then their sum (the stem of ResNet-18 at batch 8: 60 MB of columns, gathered by its 3
    input channels, did not split)."""
    x, dy, dw = ins[0], ins[1], outs[0]
    (n, c), m, group, kernel_shape = x.shape[:2], dw.shape[0], attrs["group"], dw.shape[2:]
    strides, dilations, out_shape, begin, pointwise = _conv_geometry(x, kernel_shape, attrs)
    result = reshaped(dw, (group, m // group, -1))
    if pointwise:  # per image (M/g, P) @ (P, C/g), then the sum over images
        per_image = scratch((n,) + result.shape, dw.dtype)
        xs = np.swapaxes(reshaped(x, (n, group, c // group, -1)), 2, 3)
        dys = reshaped(dy, (n, group, m // group, -1))
        return sequence(_by_images([partial(np.matmul, dys[a:b], xs[a:b], out=per_image[a:b])
                                    for a, b in _image_spans(n, per_image.size * xs.shape[2])]),
                        partial(np.sum, per_image, axis=0, out=result))
    if x.ndim == 4 and group == c == m:
        step = _jit_depthwise_grad("filter", x, dy, dw, strides, dilations, begin)
        if step is not None:
            return step
    if winograd.applies(x, dw, group, strides, dilations) and all(b <= 2 for b in begin):
        algo = winograd.choose(x, dw, group, strides, dilations, out_shape, winograd.filter_grad_rule)
        if algo != "direct":
            return winograd.filter_grad(x, dy, begin, dw, algo)
    runs = tap_runs(x, kernel_shape, strides, dilations, begin, out_shape)
    sources = runs.runs()
    length = sources[0].shape[-1]
    spans = _image_spans(n, result.size * n * length)
    wide, widening = _widened(runs, np.swapaxes(dy, 0, 1), (m, n) + runs.wide, spans if len(spans) > 1 else None)
    cols = scratch((c, len(sources), n, length), x.dtype)
    gathers = [(cols[:, t], np.swapaxes(run, 0, 1)) for t, run in enumerate(sources)]
    if len(spans) > 1:  # images apart: each worker widens its dy, gathers its columns, sums its product
        partials = scratch((len(spans),) + result.shape, dw.dtype)
        parts = [sequence(widen, _copies([(dst[:, a:b], src[:, a:b]) for dst, src in gathers]),
                          partial(np.matmul, reshaped(wide[:, a:b], (group, m // group, -1)),
                                  np.swapaxes(reshaped(cols[:, :, a:b], (group, -1, (b - a) * length)), 1, 2),
                                  out=partials[k]))
                 for k, ((a, b), widen) in enumerate(zip(spans, widening))]
        return sequence(runs.load, _by_images(parts), partial(np.sum, partials, axis=0, out=result))
    wides = reshaped(wide, (group, m // group, -1))
    columns = np.swapaxes(reshaped(cols, (group, -1, n * length)), 1, 2)
    workers = threads.current()
    if workers is None or 2 * result.size * columns.shape[1] < threads.MIN_FLOPS:
        product = partial(np.matmul, wides, columns, out=result)
        copies = _copies(gathers)
    else:  # the gathers by input channels, then the product by output channels, apart on the workers
        copies = _Split(workers, [_copies([(dst[a:b], src[a:b]) for dst, src in gathers])
                                  for a, b in threads.pieces(c, workers.n)])
        rows = m // group
        product = _Split(workers, [partial(np.matmul, wides[:, a:b], columns, out=result[:, a:b])
                                   for a, b in threads.pieces(rows, workers.n, min(8, rows))])
    return sequence(runs.load, copies, widening, product)


@kernel("deform_conv")
def _deform_conv(ins, outs, attrs):
    """Columns (N, C, taps, L) sampled bilinearly where each tap lands (a loop over the taps
    and over the 2^r corners), then one batched product with w per group."""
    from ...ops.conv import deform_geometry
    from ...ops.registry import TensorSpec
    x, w, offset, out = ins[0], ins[1], ins[2], outs[0]
    bias, mask = (list(ins[3:]) + [None, None])[:2]
    kernel_, strides, pads, dilations, size = deform_geometry(
        "deform_conv", TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype), attrs)
    n, c, spatial, r = x.shape[0], x.shape[1], x.shape[2:], x.ndim - 2
    group, og, m = attrs["group"], attrs["offset_group"], w.shape[0]
    taps, places = int(np.prod(kernel_)), int(np.prod(size))
    work = np.promote_types(x.dtype, np.float32)
    grid = np.meshgrid(*[np.arange(o) * s - p for o, s, p in zip(size, strides, pads)], indexing="ij")
    starts = [g.reshape(-1) for g in grid]  # per axis, (L,)
    tap_at = list(itertools.product(*[range(k) for k in kernel_]))
    strides_in = [int(np.prod(spatial[a + 1:])) for a in range(r)]

    def run():
        xs = x.astype(work, copy=False).reshape(n, og, c // og, -1)
        offs = offset.astype(work, copy=False).reshape(n, og, taps, r, places)
        masks = None if mask is None else mask.astype(work, copy=False).reshape(n, og, taps, places)
        cols = np.zeros((n, og, c // og, taps, places), work)
        for t, at in enumerate(tap_at):
            corners = [(np.zeros((n, og, places), np.intp), None)]
            for a in range(r):
                pos = starts[a] + at[a] * dilations[a] + offs[:, :, t, a]
                low = np.floor(pos)
                frac = pos - low
                axis_taps = []
                for i, wt in ((low, 1 - frac), (low + 1, frac)):
                    inside = (i >= 0) & (i < spatial[a])
                    axis_taps.append((np.clip(i, 0, spatial[a] - 1).astype(np.intp) * strides_in[a],
                                      np.where(inside, wt, 0)))
                corners = [(ci + ai, aw if cw is None else cw * aw) for ci, cw in corners for ai, aw in axis_taps]
            for index, weight in corners:
                if masks is not None:
                    weight = weight * masks[:, :, t]
                picked = np.take_along_axis(xs, index[:, :, None, :], axis=3)
                cols[:, :, :, t] += picked * weight[:, :, None, :].astype(work)
        cols = cols.reshape(n, group, (c // group) * taps, places)
        y = np.matmul(w.astype(work, copy=False).reshape(group, m // group, -1), cols)  # (N, g, M/g, L)
        y = y.reshape(n, m, places)
        if bias is not None:
            y += bias.astype(work, copy=False)[:, None]
        np.copyto(out.reshape(n, m, places), y, casting="unsafe")
    return run
