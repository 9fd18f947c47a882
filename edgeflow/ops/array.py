"""Ops that move, select or reinterpret elements without arithmetic."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt, normalize_axes, normalize_axis, num_elements, vector_length


# Data movement: every dtype, as it is.
_MOVES = Types("x: T -> T", T=dtypes.ANY)


def _target_shape(inputs, attrs):
    """(reshape's target, the positions it copies from the input)."""
    shape = attrs["shape"]
    if not attrs["copy_zeros"]:
        return tuple(shape), frozenset()
    x = inputs[0]  # ONNX (allowzero=0): a 0 keeps the input's dimension
    if any(d == 0 and i >= x.rank for i, d in enumerate(shape)):
        raise GraphError(f"reshape: a 0 in {shape} has no input dimension to copy")
    # A copied dimension is the same on both sides: it cancels out of the element count,
    # known or not (but a copied 0 would leave a -1 ambiguous).
    copied = frozenset(i for i, d in enumerate(shape) if d == 0 and x.shape[i] != 0)
    return tuple(x.shape[i] if d == 0 else d for i, d in enumerate(shape)), copied


def _reshape_unknown(own, attrs, operands):
    """While the target is unknown: its length sets the rank."""
    return [TensorSpec((None,) * vector_length("reshape", operands[0], "the target shape"), own[0].dtype)]


@define("reshape", view=True, types=Types("x: T, shape: index? -> T", T=dtypes.ANY),
        attrs={"shape": Attr(AttrKind.INTS, ()), "copy_zeros": Attr(AttrKind.BOOL, False)},
        operands=("shape",), unknown=_reshape_unknown)
def _reshape(inputs, attrs):
    """Same elements in a new shape: the `shape` attr, or the second operand's value.

    At most one dimension may be -1 (inferred). With copy_zeros, a 0 keeps the input
    dimension at that position, as in ONNX's Reshape; otherwise it is a zero dimension.
    """
    x, (shape, copied) = inputs[0], _target_shape(inputs, attrs)
    if any(d is None for i, d in enumerate(shape) if i not in copied):
        return [TensorSpec(shape, x.dtype)]
    if sum(d == -1 for d in shape) > 1 or any(d is not None and d < -1 for d in shape):
        raise GraphError(f"reshape: bad target shape {shape}; dims must be >= 0 with at most one -1")
    n = num_elements([d for j, d in enumerate(x.shape) if j not in copied])
    known = num_elements([d for i, d in enumerate(shape) if i not in copied and d != -1])
    if -1 not in shape:
        if n is not None and known is not None and n != known:
            raise GraphError(f"reshape: cannot reshape {fmt(x.shape)} to {fmt(shape)}")
        return [TensorSpec(shape, x.dtype)]
    if n is None or known is None:
        inferred = None
    elif known == 0 or n % known:
        raise GraphError(f"reshape: cannot reshape {fmt(x.shape)} to {fmt(shape)}")
    else:
        inferred = n // known
    return [TensorSpec(tuple(inferred if d == -1 else d for d in shape), x.dtype)]


def _fewer_dims(own, attrs, operands):
    """Squeezed while the axes are unknown: as many dims fewer as there are axes, all ?."""
    x, n = own[0], vector_length("squeeze", operands[0], "axes")
    if n == 0:
        raise GraphError("squeeze: with no axes given, which dims drop depends on x's shape; "
                         "the axes must be known")
    return [TensorSpec((None,) * (x.rank - n), x.dtype)]


def _more_dims(own, attrs, operands):
    x = own[0]
    return [TensorSpec((None,) * (x.rank + vector_length("expand_dims", operands[0], "axes")), x.dtype)]


_MOVES_ALONG_AXES = Types("x: T, axes: index? -> T", T=dtypes.ANY)


@define("squeeze", attrs={"axes": Attr(AttrKind.INTS, ())}, view=True, types=_MOVES_ALONG_AXES,
        operands=("axes",), unknown=_fewer_dims)
def _squeeze(inputs, attrs):
    """Drop size-1 dimensions: those in `axes`, or all of them when `axes` is empty."""
    x = inputs[0]
    if attrs["axes"]:
        axes = normalize_axes(attrs["axes"], x.rank, "squeeze")
    elif None in x.shape:
        raise GraphError(f"squeeze: shape {fmt(x.shape)} has unknown dims; name the axes to squeeze")
    else:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    bad = [a for a in axes if x.shape[a] not in (1, None)]
    if bad:
        raise GraphError(f"squeeze: dimension(s) {bad} of {fmt(x.shape)} are not 1")
    return [TensorSpec(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)]


@define("expand_dims", attrs={"axes": Attr(AttrKind.INTS)}, view=True, types=_MOVES_ALONG_AXES,
        operands=("axes",), unknown=_more_dims)
def _expand_dims(inputs, attrs):
    """Insert size-1 dimensions at `axes` (positions in the output)."""
    x = inputs[0]
    rank = x.rank + len(attrs["axes"])
    axes = normalize_axes(attrs["axes"], rank, "expand_dims")
    dims = iter(x.shape)
    return [TensorSpec(tuple(1 if i in axes else next(dims) for i in range(rank)), x.dtype)]


@define("transpose", attrs={"perm": Attr(AttrKind.INTS, ())}, types=_MOVES)
def _transpose(inputs, attrs):
    """Permute dimensions: output dim i is input dim perm[i]; reversed when perm is empty."""
    x = inputs[0]
    perm = attrs["perm"] or tuple(reversed(range(x.rank)))
    if sorted(perm) != list(range(x.rank)):
        raise GraphError(f"transpose: perm {perm} is not a permutation of {x.rank} axes")
    return [TensorSpec(tuple(x.shape[p] for p in perm), x.dtype)]


@define("concat", attrs={"axis": Attr(AttrKind.INT)}, types=Types("T+ -> T", T=dtypes.ANY))
def _concat(inputs, attrs):
    """Join tensors along `axis`; other dimensions must agree."""
    first = inputs[0]
    axis = normalize_axis(attrs["axis"], first.rank, "concat")
    for s in inputs[1:]:
        if s.rank != first.rank:
            raise GraphError(f"concat: inputs differ in rank: {fmt(first.shape)} vs {fmt(s.shape)}")
    shape = []
    for i in range(first.rank):
        dims = [s.shape[i] for s in inputs]
        if i == axis:
            shape.append(None if None in dims else sum(dims))
            continue
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise GraphError(f"concat: dimension {i} differs between inputs: {sorted(known)}")
        shape.append(known.pop() if known else None)
    return [TensorSpec(tuple(shape), first.dtype)]


def slice_length(dim, start, end, step):
    return None if dim is None else len(range(*slice(start, end, step).indices(dim)))


def slice_params(attrs):
    """(starts, ends, axes, steps) with the defaults filled in; GraphError if they disagree."""
    starts, ends, axes, steps = (attrs[k] for k in ("starts", "ends", "axes", "steps"))
    axes = axes or tuple(range(len(starts)))
    steps = steps or (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise GraphError(f"slice: starts, ends, axes and steps differ in length: "
                         f"{starts}, {ends}, {axes}, {steps}")
    if 0 in steps:
        raise GraphError("slice: steps must be non-zero")
    return starts, ends, axes, steps


@define("slice", types=Types("x: T, starts: index?, ends: index?, axes: index?, steps: index? -> T",
                            T=dtypes.ANY), attrs={"starts": Attr(AttrKind.INTS, ()), "ends": Attr(AttrKind.INTS, ()),
                                       "axes": Attr(AttrKind.INTS, ()), "steps": Attr(AttrKind.INTS, ())},
        operands=("starts", "ends", "axes", "steps"))
def _slice(inputs, attrs):
    """x[starts:ends:steps] along `axes` (default the first len(starts) axes), clamped as
    Python does. The four come from the attrs, or from operands 1-4 (known values) as in
    ONNX's Slice."""
    x = inputs[0]
    starts, ends, axes, steps = slice_params(attrs)
    normalize_axes(axes, x.rank, "slice")  # rejects repeated axes
    shape = list(x.shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = normalize_axis(axis, x.rank, "slice")
        shape[axis] = slice_length(x.shape[axis], start, end, step)
    return [TensorSpec(tuple(shape), x.dtype)]


@define("gather", attrs={"axis": Attr(AttrKind.INT, 0)}, types=Types("params: T, indices: index -> T", T=dtypes.ANY))
def _gather(inputs, attrs):
    """Take slices of `params` along `axis` at `indices` (negative ones count from the end)."""
    params, indices = inputs
    axis = normalize_axis(attrs["axis"], params.rank, "gather")
    return [TensorSpec(params.shape[:axis] + indices.shape + params.shape[axis + 1:], params.dtype)]


# -- gradients -----------------------------------------------------------------------------

@gradient("reshape", "squeeze", "expand_dims")
def _reshape_grad(g, op, grads):
    grad = g("reshape", grads[0], g("shape", op.inputs[0]))
    return [grad] + [None] * (len(op.inputs) - 1)


@gradient("transpose")
def _transpose_grad(g, op, grads):
    rank = op.inputs[0].rank
    perm = op.attrs["perm"] or tuple(reversed(range(rank)))
    return [g("transpose", grads[0], perm=tuple(perm.index(i) for i in range(rank)))]


@gradient("concat")
def _concat_grad(g, op, grads):
    axis = normalize_axis(op.attrs["axis"], op.inputs[0].rank, "concat")
    sizes = [t.shape[axis] for t in op.inputs]
    if None in sizes:
        raise GraphError("concat: gradients need the concatenated sizes known while building")
    if len(sizes) == 1:
        return [grads[0]]
    return list(g("split", grads[0], axis=axis, sizes=tuple(sizes)))


@gradient("slice")
def _slice_grad(g, op, grads):
    if len(op.inputs) > 1:
        raise GraphError("slice: gradients need starts/ends as attributes, not operands")
    return [g("slice_grad", grads[0], op.inputs[0], **op.attrs)]


@gradient("gather")
def _gather_grad(g, op, grads):
    params, indices = op.inputs
    return [g("gather_grad", grads[0], indices, params, axis=op.attrs["axis"]), None]


# Gradients of slice and gather, as ops: their own gradients make second derivatives possible.

@define("slice_grad", types=Types("grad: T, like: any -> T", T=dtypes.NUMERIC), attrs={"starts": Attr(AttrKind.INTS, ()), "ends": Attr(AttrKind.INTS, ()),
                                       "axes": Attr(AttrKind.INTS, ()), "steps": Attr(AttrKind.INTS, ())})
def _slice_grad_infer(inputs, attrs):
    """Zeros shaped like `like`, with grad written where slice (same attrs) took its values."""
    grad, like = inputs
    slice_params(attrs)
    return [TensorSpec(like.shape, grad.dtype)]


@define("gather_grad", attrs={"axis": Attr(AttrKind.INT, 0)},
        types=Types("grad: T, indices: index, like: any -> T", T=dtypes.NUMERIC))
def _gather_grad_infer(inputs, attrs):
    """Zeros shaped like `like` (gather's params), with grad added back at `indices`."""
    grad, indices, like = inputs
    normalize_axis(attrs["axis"], like.rank, "gather_grad")
    return [TensorSpec(like.shape, grad.dtype)]


@gradient("slice_grad")
def _slice_grad_grad(g, op, grads):
    return [g("slice", grads[0], **op.attrs), None]


@gradient("gather_grad")
def _gather_grad_grad(g, op, grads):
    return [g("gather", grads[0], op.inputs[1], axis=op.attrs["axis"]), None, None]


# -- indexing by tensors of positions (ONNX's GatherElements, GatherND, Scatter*, OneHot) ------

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(op, attrs):
    if attrs["reduction"] not in _REDUCTIONS:
        raise GraphError(f"{op}: reduction must be one of {', '.join(_REDUCTIONS)}, got {attrs['reduction']!r}")


def _same_rank(op, data, indices):
    if data.rank == 0 or indices.rank != data.rank:
        raise GraphError(f"{op}: indices {fmt(indices.shape)} must have the rank of data "
                         f"{fmt(data.shape)}, at least 1")


@define("gather_elements", attrs={"axis": Attr(AttrKind.INT, 0)},
        types=Types("data: T, indices: index -> T", T=dtypes.ANY))
def _gather_elements(inputs, attrs):
    """out[i][j][k] = data[indices[i][j][k]][j][k] (for axis 0): indices has data's rank."""
    data, indices = inputs
    _same_rank("gather_elements", data, indices)
    normalize_axis(attrs["axis"], data.rank, "gather_elements")
    return [TensorSpec(indices.shape, data.dtype)]


def nd_index_depth(op, data, indices, batch_dims):
    """k, the length of each index tuple (indices' last dimension), checked against data."""
    if indices.rank < 1 or batch_dims < 0 or batch_dims >= min(data.rank, indices.rank):
        raise GraphError(f"{op}: batch_dims {batch_dims} must be below the ranks of data "
                         f"{fmt(data.shape)} and indices {fmt(indices.shape)} (indices rank >= 1)")
    k = indices.shape[-1]
    if k is None:
        raise GraphError(f"{op}: the last dimension of indices {fmt(indices.shape)} must be known")
    if k > data.rank - batch_dims:
        raise GraphError(f"{op}: index tuples of length {k} exceed data {fmt(data.shape)} "
                         f"past {batch_dims} batch dims")
    return k


@define("gather_nd", attrs={"batch_dims": Attr(AttrKind.INT, 0)},
        types=Types("data: T, indices: index -> T", T=dtypes.ANY))
def _gather_nd(inputs, attrs):
    """Slices of data at the index tuples in indices' last dimension, as ONNX's GatherND;
    the first batch_dims dimensions of both are batch dimensions."""
    data, indices = inputs
    b = attrs["batch_dims"]
    k = nd_index_depth("gather_nd", data, indices, b)
    return [TensorSpec(indices.shape[:-1] + data.shape[b + k:], data.dtype)]


@define("scatter_elements", attrs={"axis": Attr(AttrKind.INT, 0), "reduction": Attr(AttrKind.STRING, "none")},
        types=Types("data: T, indices: index, updates: T -> T", T=dtypes.ANY))
def _scatter_elements(inputs, attrs):
    """A copy of data with updates written (or combined by `reduction`: add, mul, max,
    min) at the places gather_elements would read them from."""
    data, indices, updates = inputs
    _same_rank("scatter_elements", data, indices)
    _reduction("scatter_elements", attrs)
    normalize_axis(attrs["axis"], data.rank, "scatter_elements")
    if not _compatible(indices.shape, updates.shape):
        raise GraphError(f"scatter_elements: updates {fmt(updates.shape)} must be shaped like "
                         f"indices {fmt(indices.shape)}")
    return [TensorSpec(data.shape, data.dtype)]


def _compatible(a, b):
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


@define("scatter_nd", attrs={"reduction": Attr(AttrKind.STRING, "none")},
        types=Types("data: T, indices: index, updates: T -> T", T=dtypes.ANY))
def _scatter_nd(inputs, attrs):
    """A copy of data with updates written (or combined by `reduction`) at the index
    tuples in indices' last dimension, as ONNX's ScatterND."""
    data, indices, updates = inputs
    _reduction("scatter_nd", attrs)
    k = nd_index_depth("scatter_nd", data, indices, 0)
    if not _compatible(indices.shape[:-1] + data.shape[k:], updates.shape):
        raise GraphError(f"scatter_nd: updates {fmt(updates.shape)} must be shaped "
                         f"{fmt(indices.shape[:-1] + data.shape[k:])}")
    return [TensorSpec(data.shape, data.dtype)]


def _one_more_dim(own, attrs, operands):
    indices, values = own
    axis = normalize_axis(attrs["axis"], indices.rank + 1, "one_hot")
    return [TensorSpec(indices.shape[:axis] + (None,) + indices.shape[axis:], values.dtype)]


@define("one_hot", attrs={"depth": Attr(AttrKind.INT), "axis": Attr(AttrKind.INT, -1)},
        types=Types("indices: I, values: T, depth: D? -> T", I=dtypes.NUMERIC, T=dtypes.ANY, D=dtypes.NUMERIC),
        operands=("depth",), unknown=_one_more_dim)
def _one_hot(inputs, attrs):
    """values[1] where the position along the new axis `axis` equals the index (negative
    ones count from depth), values[0] elsewhere; indices outside [-depth, depth) are all off."""
    indices, values = inputs
    if attrs["depth"] < 1:
        raise GraphError(f"one_hot: depth must be >= 1, got {attrs['depth']}")
    if values.shape not in ((2,), (None,)):
        raise GraphError(f"one_hot: values must hold [off, on], got shape {fmt(values.shape)}")
    axis = normalize_axis(attrs["axis"], indices.rank + 1, "one_hot")
    return [TensorSpec(indices.shape[:axis] + (attrs["depth"],) + indices.shape[axis:], values.dtype)]


@define("trilu", attrs={"upper": Attr(AttrKind.BOOL, True), "k": Attr(AttrKind.INT, 0)},
        types=Types("x: T, k: int64? -> T", T=dtypes.ANY))
def _trilu(inputs, attrs):
    """The upper (lower) triangle of each matrix in x's last two dimensions, from diagonal k
    (the operand's value when given, else the attribute); the rest zero."""
    x = inputs[0]
    if x.rank < 2:
        raise GraphError(f"trilu: x must have rank >= 2, got {fmt(x.shape)}")
    if len(inputs) > 1 and inputs[1].rank != 0 and inputs[1].shape != (1,):
        raise GraphError(f"trilu: k must be a scalar, got shape {fmt(inputs[1].shape)}")
    return [TensorSpec(x.shape, x.dtype)]


@define("reverse_sequence", attrs={"batch_axis": Attr(AttrKind.INT, 1), "time_axis": Attr(AttrKind.INT, 0)},
        types=Types("x: T, sequence_lens: int64 -> T", T=dtypes.ANY))
def _reverse_sequence(inputs, attrs):
    """The first sequence_lens[b] steps along time_axis reversed in each batch entry b (along
    batch_axis); later steps unchanged (ONNX's ReverseSequence). Axes are 0 and 1."""
    x, lens = inputs
    axes = attrs["batch_axis"], attrs["time_axis"]
    if x.rank < 2 or sorted(axes) != [0, 1]:
        raise GraphError(f"reverse_sequence: x must have rank >= 2 and batch_axis, time_axis be 0 and 1 "
                         f"in some order; got x {fmt(x.shape)}, axes {axes}")
    if lens.rank != 1 or None not in (lens.shape[0], x.shape[axes[0]]) and lens.shape[0] != x.shape[axes[0]]:
        raise GraphError(f"reverse_sequence: sequence_lens must hold one length per batch entry "
                         f"({x.shape[axes[0]]}), got shape {fmt(lens.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


@gradient("gather_elements")
def _gather_elements_grad(g, op, grads):
    data, indices = op.inputs
    return [g("scatter_elements", g.zeros_like(data), indices, grads[0], axis=op.attrs["axis"],
              reduction="add"), None]


@gradient("gather_nd")
def _gather_nd_grad(g, op, grads):
    data, indices = op.inputs
    if op.attrs["batch_dims"]:
        raise GraphError("gather_nd: gradients need batch_dims 0")
    return [g("scatter_nd", g.zeros_like(data), indices, grads[0], reduction="add"), None]


def _scatter_grad(scatter, gather):
    """add: data's gradient passes through; none: it stops where updates overwrote data.
    updates get the gradient at the places they went to."""
    def rule(g, op, grads):
        data, indices, updates = op.inputs
        attrs = {"axis": op.attrs["axis"]} if scatter == "scatter_elements" else {}
        if op.attrs["reduction"] == "add":
            through = grads[0]
        elif op.attrs["reduction"] == "none":
            through = g(scatter, grads[0], indices, g.zeros_like(updates), **attrs, reduction="none")
        else:
            raise GraphError(f"{scatter}: gradients need reduction none or add, not {op.attrs['reduction']!r}")
        return [through, None, g(gather, grads[0], indices, **attrs)]
    gradient(scatter)(rule)


_scatter_grad("scatter_elements", "gather_elements")
_scatter_grad("scatter_nd", "gather_nd")


@gradient("trilu")
def _trilu_grad(g, op, grads):
    return [g("trilu", grads[0], *op.inputs[1:], **op.attrs)] + [None] * (len(op.inputs) - 1)


@gradient("reverse_sequence")
def _reverse_sequence_grad(g, op, grads):
    """Reversing the same steps again is the inverse (a permutation that is its own)."""
    return [g("reverse_sequence", grads[0], op.inputs[1], **op.attrs), None]
