"""Ops that move, select or reinterpret elements without arithmetic."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt, normalize_axes, normalize_axis, num_elements


# Data movement: every dtype, as it is.
_MOVES = Types("x: T -> T", T=dtypes.ANY)


def _target_shape(inputs, attrs):
    """(reshape's target, the positions it copies from the input): the `shape` attr, or
    its second operand (which must be known)."""
    if len(inputs) == 2:
        from .shape import known_ints, unknown_dims
        shape = known_ints("reshape", inputs[1], "the target shape")
        if shape is None:
            return unknown_dims("reshape", inputs[1], "the target shape"), frozenset()
    else:
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


@define("reshape", view=True, types=Types("x: T, shape: index? -> T", T=dtypes.ANY),
        attrs={"shape": Attr(AttrKind.INTS, ()), "copy_zeros": Attr(AttrKind.BOOL, False)})
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


@define("squeeze", attrs={"axes": Attr(AttrKind.INTS, ())}, view=True, types=_MOVES)
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


@define("expand_dims", attrs={"axes": Attr(AttrKind.INTS)}, view=True, types=_MOVES)
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


def slice_params(inputs, attrs):
    """(starts, ends, axes, steps): from the attrs, or from operands 1-4 when given."""
    if len(inputs) > 1:
        from .shape import known_ints
        names = ("starts", "ends", "axes", "steps")
        given = [known_ints("slice", s, n) for s, n in zip(inputs[1:], names)]
        if None in given:
            return None
        starts, ends = given[0], given[1]
        axes = given[2] if len(given) > 2 else ()
        steps = given[3] if len(given) > 3 else ()
    else:
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
                                       "axes": Attr(AttrKind.INTS, ()), "steps": Attr(AttrKind.INTS, ())})
def _slice(inputs, attrs):
    """x[starts:ends:steps] along `axes` (default the first len(starts) axes), clamped as
    Python does. The four come from the attrs, or from operands 1-4 (known values) as in
    ONNX's Slice."""
    x = inputs[0]
    params = slice_params(inputs, attrs)
    if params is None:  # operands not known yet: any dimension may be cut
        return [TensorSpec((None,) * x.rank, x.dtype)]
    starts, ends, axes, steps = params
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
    slice_params([like], attrs)
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
