"""Kernels of edgeflow/ops/array.py (reshape, squeeze and expand_dims are views: no kernel)."""
from functools import partial

import numpy as np

from ...ops.array import slice_params
from . import jit, kernel


# Output axes this short, innermost, are looped over in pieces (see _transpose).
SHORT_AXIS = 4


@kernel("transpose", bfloat16="bits")
def _transpose(ins, outs, attrs):
    """A copy from x's transposed view (copy_view)."""
    return copy_view(ins[0].transpose(attrs["perm"] or None), outs[0])


def copy_view(src, out):
    """A step copying `src`, a view of another array's elements, into `out` (C-contiguous,
    of its shape): a transpose's, a layout chain's (interp/layout.py). numpy's copy runs its
    innermost loop along the output's last axis: where that axis is short (SHORT_AXIS or
    less; a depth-to-space's 2, an NCHW -> NHWC of 2-3 channels) and strided in src, the copy
    is made of one piece per index of it, so that the inner loop runs along the next axis
    (pose_detection's depth-to-spaces, (1, 2, 2, 24, 28, 28) by (0, 3, 4, 1, 5, 2): 339 -> 61
    us; (1, 3, 224, 224) to NHWC: 457 -> 79), at most 64 pieces."""
    step = jit.bind_copy(src, out)
    if step is not None:  # split over the plan's workers
        return step
    pairs = [(out, src)]
    while True:
        dst, view = pairs[0]
        if dst.ndim < 2 or dst.shape[-1] > SHORT_AXIS or view.strides[-1] == view.itemsize \
                or len(pairs) * dst.shape[-1] > 64:
            break
        pairs = [(o[..., j], x[..., j]) for o, x in pairs for j in range(o.shape[-1])]
    if len(pairs) == 1:
        return partial(np.copyto, *pairs[0])

    def run():
        for dst, view in pairs:
            np.copyto(dst, view)
    return run


@kernel("concat", bfloat16="bits")
def _concat(ins, outs, attrs):
    return partial(np.concatenate, ins, attrs["axis"], outs[0])


@kernel("slice", bfloat16="bits")
def _slice(ins, outs, attrs):
    x = ins[0]
    index = [np.s_[:]] * x.ndim
    for axis, start, end, step in zip(*_reorder(slice_params(attrs))):
        index[axis] = slice(start, end, step)
    return partial(np.copyto, outs[0], x[tuple(index)])


def _reorder(params):
    starts, ends, axes, steps = params
    return axes, starts, ends, steps


def in_range(op, indices, n, where):
    """indices with the negative ones counted from n; IndexError (which the plan reports as
    InvalidInputError) if one lies outside [-n, n): a model's indices are not trusted."""
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"{op}: an index is out of range [-{n}, {n}) for {where}")
    return np.where(indices < 0, indices + n, indices)


def _gather(params, indices, axis, out):
    n = params.shape[axis]
    if indices.ndim == 0:  # one index (a transformer's q, k, v out of one projection): a copy of a view
        i = int(indices)
        if not -n <= i < n:
            raise IndexError(f"gather: an index is out of range [-{n}, {n}) for axis {axis}")
        np.copyto(out, params[(slice(None),) * axis + (i,)])
        return
    in_range("gather", indices, n, f"axis {axis}")
    # Checked above, so "wrap" only counts negative indices from the end, as "raise" would; "raise"
    # copies the result through a buffer (22 -> 8 us for a (128, 1, 256) slice of 3).
    np.take(params, indices, axis=axis, out=out, mode="wrap")


@kernel("gather", bfloat16="bits")
def _gather_kernel(ins, outs, attrs):
    return partial(_gather, ins[0], ins[1], attrs["axis"] % ins[0].ndim, outs[0])


@kernel("slice_grad")
def _slice_grad(ins, outs, attrs):
    grad, out = ins[0], outs[0]
    index = [np.s_[:]] * out.ndim
    starts, ends, axes, steps = slice_params(attrs)
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


# -- indexing by tensors of positions ---------------------------------------------------

def _element_index(op, indices, axis, shape):
    """The full index tuple of a gather/scatter along `axis`: indices there, each element's
    own position along every other axis (checked: indices may not outgrow data there)."""
    if any(i > d for a, (i, d) in enumerate(zip(indices.shape, shape)) if a != axis):
        raise IndexError(f"{op}: indices {indices.shape} exceed data {shape} off axis {axis}")
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = in_range(op, indices, shape[axis], f"axis {axis}")
    return tuple(index)


@kernel("gather_elements", bfloat16="bits")
def _gather_elements(ins, outs, attrs):
    data, indices, out = ins[0], ins[1], outs[0]
    axis = attrs["axis"] % data.ndim

    def run():
        out[...] = data[_element_index("gather_elements", indices, axis, data.shape)]
    return run


def _nd_index(op, indices, shape):
    """The flat positions in `shape` (a data shape past the batch dims) of index tuples."""
    k = indices.shape[-1]
    tuples = indices.reshape(int(np.prod(indices.shape[:-1], dtype=np.int64)), k)
    columns = [in_range(op, tuples[:, i], n, f"dimension {i} of the index tuples") for i, n in enumerate(shape[:k])]
    return np.ravel_multi_index(columns, shape[:k]) if k else np.zeros(len(tuples), np.intp)


@kernel("gather_nd", bfloat16="bits")
def _gather_nd(ins, outs, attrs):
    """Constant indices (a mask's expansion in a dynamo-exported BERT) are checked and made
    flat positions once, when the step binds: each run is one take (86 -> 3 us there)."""
    data, indices, out = ins[0], ins[1], outs[0]
    b = attrs["batch_dims"]
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    k = indices.shape[-1]

    def positions():
        """Each index tuple's row of data viewed as (batch * its rows, the rest), flat."""
        if indices.shape[:b] != data.shape[:b]:
            raise ValueError(f"gather_nd: batch dims of indices {indices.shape} and data {data.shape} differ")
        flat = _nd_index("gather_nd", indices, data.shape[b:]).reshape(batch, -1)
        return (flat + np.arange(batch)[:, None] * int(np.prod(data.shape[b:b + k], dtype=np.int64))).reshape(-1)
    inner = int(np.prod(data.shape[b + k:], dtype=np.int64))
    if not indices.flags.writeable and data.size and out.size:  # a constant: checked once, here
        fixed = positions()
        rows, flat_out = data.reshape(-1, inner), out.reshape(-1, inner)
        return partial(np.take, rows, fixed, axis=0, out=flat_out, mode="wrap")  # checked: in range

    def run():
        where = positions()
        out[...] = data.reshape(-1, inner)[where].reshape(out.shape)
    return run


_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(target, index, updates, reduction):
    if reduction == "none":
        target[index] = updates
    else:
        _COMBINE[reduction].at(target, index, updates)


def _slice_indices(indices, axis, shape):
    """indices' values along `axis` where they are the same at every position off it and
    span data's other axes whole (each update a whole slice of data along `axis`), else
    None: torchvision's MultiScaleRoIAlign puts each level's (R, C, 7, 7) results back so,
    its index broadcast to the results' shape."""
    if any(i != d for a, (i, d) in enumerate(zip(indices.shape, shape)) if a != axis) or not indices.size:
        return None
    first = indices[tuple(slice(None) if a == axis else slice(0, 1) for a in range(indices.ndim))]
    return first.reshape(-1) if (indices == first).all() else None


@kernel("scatter_elements")
def _scatter_elements(ins, outs, attrs):
    """Where the indices pick whole slices along the axis (`_slice_indices`), the slices are
    written at once, in the same order (a repeated index: the last one's, as elementwise):
    Faster R-CNN's (150, 256, 7, 7) 43.5 -> 4.8 ms; else element by element."""
    data, indices, updates, out = *ins, outs[0]
    axis = attrs["axis"] % data.ndim

    def run():
        rows = _slice_indices(indices, axis, data.shape) if updates.shape == indices.shape else None
        if rows is not None:
            rows = in_range("scatter_elements", rows, data.shape[axis], f"axis {axis}")
            np.copyto(out, data)
            _scatter(np.moveaxis(out, axis, 0), rows, np.moveaxis(updates, axis, 0), attrs["reduction"])
            return
        index = _element_index("scatter_elements", indices, axis, data.shape)
        np.copyto(out, data)
        _scatter(out, index, updates, attrs["reduction"])
    return run


@kernel("scatter_nd")
def _scatter_nd(ins, outs, attrs):
    data, indices, updates, out = *ins, outs[0]
    k = indices.shape[-1]

    def run():
        flat = _nd_index("scatter_nd", indices, data.shape)
        np.copyto(out, data)
        rows = out.view()
        rows.shape = (-1,) + data.shape[k:]  # in place: raises rather than copy
        _scatter(rows, flat, updates.reshape((len(flat),) + data.shape[k:]), attrs["reduction"])
    return run


@kernel("one_hot", bfloat16="bits")
def _one_hot(ins, outs, attrs):
    indices, values, out = ins[0], ins[1], outs[0]
    depth, axis = attrs["depth"], attrs["axis"] % out.ndim
    positions = np.arange(depth).reshape((depth,) + (1,) * (out.ndim - 1 - axis))

    def run():
        whole = indices.astype(np.int64) if indices.dtype.kind == "f" else indices
        hot = np.expand_dims(np.where(whole < 0, whole + depth, whole), axis) == positions
        np.copyto(out, np.where(hot, values[1], values[0]))
    return run


@kernel("trilu", bfloat16="bits")
def _trilu(ins, outs, attrs):
    x, out = ins[0], outs[0]
    triangle = np.triu if attrs["upper"] else np.tril

    def run():
        k = int(ins[1].reshape(())) if len(ins) > 1 else attrs["k"]
        k = max(min(k, x.shape[-1] + 1), -x.shape[-2] - 1)  # beyond the matrix: all or nothing
        np.copyto(out, triangle(x, k))
    return run


@kernel("reverse_sequence")
def _reverse_sequence(ins, outs, attrs):
    """One gather along time: step t of entry b reads step lens[b] - 1 - t where t < lens[b]."""
    x, lens, out = ins[0], ins[1], outs[0]
    batch_axis, time_axis = attrs["batch_axis"], attrs["time_axis"]
    steps = np.arange(x.shape[time_axis])
    trail = (1,) * (x.ndim - 2)

    def run():
        if lens.size and (lens.min() < 0 or lens.max() > len(steps)):
            raise IndexError(f"reverse_sequence: a sequence length is outside [0, {len(steps)}]")
        source = np.where(steps < lens[:, None], lens[:, None] - 1 - steps, steps)  # (batch, time)
        index = source if batch_axis == 0 else source.T
        np.copyto(out, np.take_along_axis(x, index.reshape(index.shape + trail), axis=time_axis))
    return run
