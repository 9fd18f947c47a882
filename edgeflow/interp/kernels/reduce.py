"""Kernels of edgeflow/ops/reduce.py."""
import math
from functools import partial

import numpy as np

from .. import threads
from . import kernel


# The most elements a weighted-sum reduction sums with BLAS: its float32 sums grow their
# error with the count (a handful of running sums), numpy's pairwise sums with its logarithm.
GEMV_MAX = 4096


def _reduction(fn, scale=None):
    """The kernel reducing with fn; with `scale` (the count -> the factor of a weighted sum),
    float32/float64 reductions of x's last axes run as one BLAS matrix-vector product of x
    viewed (rows, count) with a vector of that factor (5-6x numpy's sum over the axes: a
    global average pool of 1280 channels of 7x7 takes 10 us, not 64)."""
    def make(ins, outs, attrs):
        x, out = ins[0], outs[0]
        if not attrs["axes"] and attrs["noop_with_empty_axes"]:
            return partial(np.copyto, out, x)
        axes = tuple(sorted({a % x.ndim for a in attrs["axes"]})) if attrs["axes"] else tuple(range(x.ndim))
        count = math.prod(x.shape[a] for a in axes)
        if scale is not None and axes == tuple(range(x.ndim - len(axes), x.ndim)) and count > 0 and out.size \
                and x.dtype in (np.float32, np.float64) and out.dtype == x.dtype \
                and x.flags.c_contiguous and out.flags.c_contiguous:
            step = _weighted_sum(x.reshape(-1, count), scale(count), out.reshape(-1))
            if step is not None:
                return step
        return _split_kept(fn, x, axes, attrs["keepdims"], out) \
            or partial(fn, x, axis=axes, keepdims=attrs["keepdims"], out=out)
    return make


def _weighted_sum(rows, factor, out):
    """A step writing factor * each row's sum of `rows` (R, count) into out (R,) by BLAS: one
    matrix-vector product where count <= GEMV_MAX, else one over pieces of the rows (their
    largest length <= GEMV_MAX that divides count, at least GEMV_MAX / 8) and numpy's sum of
    each row's pieces (EfficientNet-B0's global pool of 32 channels of 112x112, in 4 pieces
    of 3136 a channel: 424 -> 192 us in the model, 147 -> 48 alone, against numpy's mean);
    None where count has no such divisor."""
    r, count = rows.shape
    if count <= GEMV_MAX:
        return partial(np.matmul, rows, np.full(count, factor, rows.dtype), out=out)
    piece = next((d for d in range(GEMV_MAX, GEMV_MAX // 8 - 1, -1) if count % d == 0), None)
    if piece is None:
        return None
    partial_sums = np.empty((r, count // piece), rows.dtype)
    product = partial(np.matmul, rows.reshape(-1, piece), np.full(piece, factor, rows.dtype),
                      out=partial_sums.reshape(-1))

    def run():
        product()
        np.sum(partial_sums, axis=1, out=out)
    return run


def _split_kept(fn, x, axes, keepdims, out):
    """A step reducing x in pieces along its first kept axis long enough, on the plan's
    workers (a train step's bias gradients: (N, C, H, W) summed but for C, by channels); or
    None: one thread, few elements, or no such axis."""
    workers = threads.current()
    if workers is None or x.size < threads.MIN_ELEMENTS:
        return None
    kept = next((k for k in range(x.ndim) if k not in axes and x.shape[k] >= workers.n), None)
    if kept is None:
        return None
    at = kept if keepdims else kept - sum(1 for a in axes if a < kept)  # the axis in out

    def piece(a, b):
        return partial(fn, x[(slice(None),) * kept + (slice(a, b),)], axis=axes, keepdims=keepdims,
                       out=out[(slice(None),) * at + (slice(a, b),)])
    parts = [piece(a, b) for a, b in threads.pieces(x.shape[kept], workers.n)]
    return lambda: workers.run(parts)


def _mean(x, axis, keepdims, out):
    # Not np.mean(out=out): that sums float16 in float16, and overflows where the mean fits.
    np.copyto(out, np.mean(x, axis=axis, keepdims=keepdims), casting="unsafe")


def _in_float32_for_float16(fn):
    """fn(x, axis, keepdims) into out, computed in float32 when x is float16.

    float16 products and squares overflow (past 65504) where the result often fits.
    """
    def reduce(x, axis, keepdims, out):
        wide = x.astype(np.float32) if x.dtype == np.float16 else x
        np.copyto(out, fn(wide, axis=axis, keepdims=keepdims), casting="unsafe")
    return reduce


def _l2(x, axis, keepdims):
    return np.sqrt(np.sum(np.square(x), axis=axis, keepdims=keepdims))


def _log_sum_exp(x, axis, keepdims):
    top = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0)  # all -inf (or an inf, or NaN): nothing to shift by
    total = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return total if keepdims else np.squeeze(total, axis)


def _lowest(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype):
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _starting_at(fn, initial):
    """fn started from `initial(dtype)`: an empty set reduces to it (ONNX: -inf for
    ReduceMax, +inf for ReduceMin) where numpy would raise."""
    def reduce(x, axis, keepdims, out):
        fn(x, axis=axis, keepdims=keepdims, out=out, initial=initial(x.dtype))
    return reduce


kernel("reduce_sum")(_reduction(np.sum, lambda count: 1))
kernel("reduce_mean")(_reduction(_mean, lambda count: 1 / count))
kernel("reduce_max")(_reduction(_starting_at(np.max, _lowest)))
kernel("reduce_min")(_reduction(_starting_at(np.min, _highest)))
kernel("reduce_prod")(_reduction(_in_float32_for_float16(np.prod)))
kernel("reduce_l2")(_reduction(_in_float32_for_float16(_l2)))
kernel("reduce_log_sum_exp")(_reduction(_in_float32_for_float16(_log_sum_exp)))


def _last(fn):
    """fn (np.argmax or np.argmin) choosing the last of tied elements: the first of the flipped axis."""
    def last(x, axis, out, keepdims):
        fn(np.flip(x, axis), axis=axis, out=out, keepdims=keepdims)
        np.subtract(x.shape[axis] - 1, out, out=out)
    return last


def _arg_index(fn):
    def make(ins, outs, attrs):
        chosen = _last(fn) if attrs["select_last_index"] else fn
        return partial(chosen, ins[0], axis=attrs["axis"], out=outs[0], keepdims=attrs["keepdims"])
    return make


kernel("argmax")(_arg_index(np.argmax))
kernel("argmin")(_arg_index(np.argmin))


def _running(fn):
    """fn (np.cumsum or np.cumprod) into out; in float32 for float16, rounded once."""
    def run(x, axis, out):
        if out.dtype == np.float16:
            np.copyto(out, fn(x, axis, np.float32), casting="unsafe")
        else:
            fn(x, axis, out.dtype, out)
    return run


def _exclusive(run, identity, x, axis, first, rest):
    first.fill(identity)
    run(x, axis, rest)


def _running_kernel(fn, identity):
    def make(ins, outs, attrs):
        x, out = ins[0], outs[0]
        axis = attrs["axis"] % x.ndim
        if attrs["reverse"]:  # a running sum over flipped views runs from the end
            x, out = np.flip(x, axis), np.flip(out, axis)
        if not attrs["exclusive"]:
            return partial(_running(fn), x, axis, out)

        def along(part):
            return (slice(None),) * axis + (part,)
        return partial(_exclusive, _running(fn), identity, x[along(slice(None, -1))], axis,
                       out[along(slice(None, 1))], out[along(slice(1, None))])
    return make


kernel("cumsum")(_running_kernel(np.cumsum, 0))
kernel("cumprod")(_running_kernel(np.cumprod, 1))


def _selection(rows, kth, largest):
    """Masks of the elements that rank before `kth` (per row), and of those that tie with it.

    The rank is numpy's sort order, read from the end when `largest`; NaN sorts last.
    """
    before = rows > kth if largest else rows < kth
    tied = rows == kth
    if rows.dtype.kind == "f":
        nan, nan_kth = np.isnan(rows), np.isnan(kth)
        tied |= nan & nan_kth
        before |= (nan & ~nan_kth) if largest else (~nan & nan_kth)
    return before, tied


def _best_first(values, largest):
    """The stable order of each row's `values` (given in index order), best first."""
    if not largest:
        return np.argsort(values, axis=-1, kind="stable")
    # Sorting the reversed rows and reversing back keeps equal values in index order.
    k = values.shape[-1]
    return k - 1 - np.argsort(values[:, ::-1], axis=-1, kind="stable")[:, ::-1]


def _topk(x, k, largest, values, indices):
    """The top k of `x` along its last axis into `values` and `indices`.

    A partition finds each row's k-th best value in linear time; the elements before it
    and, of those tied with it, the ones of lowest index make up the k. Only those k
    are sorted.
    """
    n = x.shape[-1]
    if k == 0 or x.size == 0:
        return
    rows = x.reshape(-1, n)
    at = n - k if largest else k - 1
    kth = np.partition(rows, at, axis=-1)[:, at, None]
    before, tied = _selection(rows, kth, largest)
    tied &= np.cumsum(tied, axis=-1) <= k - before.sum(axis=-1, keepdims=True)
    chosen = np.nonzero(before | tied)[1].reshape(-1, k)  # per row, in index order
    order = _best_first(np.take_along_axis(rows, chosen, -1), largest)
    chosen = np.take_along_axis(chosen, order, -1)
    indices[...] = chosen.reshape(indices.shape)
    values[...] = np.take_along_axis(rows, chosen, -1).reshape(values.shape)


@kernel("topk")
def _topk_kernel(ins, outs, attrs):
    axis = attrs["axis"] % ins[0].ndim
    last = [np.moveaxis(a, axis, -1) for a in (ins[0], *outs)]
    return partial(_topk, last[0], attrs["k"], attrs["largest"], *last[1:])


@kernel("sum_to")
def _sum_to(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    lead = grad.ndim - out.ndim
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(out.shape)
                                      if d == 1 and grad.shape[lead + i] != 1)
    # keepdims: the sum's shape is out's with `lead` leading 1s, a view of out.
    return partial(np.sum, grad, axis=axes, keepdims=True, out=out.reshape((1,) * lead + out.shape))
