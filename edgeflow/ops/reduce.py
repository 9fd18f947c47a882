"""Reductions over axes, running sums along one, and top-k selection."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import normalize_axes, normalize_axis, vector_length


def reduced_shape(shape, axes, keepdims, op):
    """Shape after reducing `axes` (all axes when empty)."""
    axes = normalize_axes(axes, len(shape), op) if axes else tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


_NUMERIC = Types("x: T -> T", T=dtypes.NUMERIC)


def _reduced_unknown(own, attrs, operands):
    """Reduced while the axes are unknown: all dims ?, and as many fewer as there are axes
    unless keepdims."""
    x = own[0]
    if attrs["keepdims"]:
        return [TensorSpec((None,) * x.rank, x.dtype)]
    n = vector_length("reduce", operands[0], "axes")
    if not n:  # no axes: all of them, or none with noop_with_empty_axes
        n = 0 if attrs["noop_with_empty_axes"] else x.rank
    return [TensorSpec((None,) * (x.rank - n), x.dtype)]


def _reduction(name):
    def infer(inputs, attrs):
        x = inputs[0]
        if not attrs["axes"] and attrs["noop_with_empty_axes"]:
            return [TensorSpec(x.shape, x.dtype)]
        return [TensorSpec(reduced_shape(x.shape, attrs["axes"], attrs["keepdims"], name), x.dtype)]
    infer.__doc__ = (f"{name} over `axes` (all when empty, none with noop_with_empty_axes), keeping them "
                     "as 1s if keepdims.")
    return infer


# reduce_l2 is sqrt(sum(x ** 2)); integer norms are left out as rarely meant.
# reduce_log_sum_exp is log(sum(exp(x))), computed as m + log(sum(exp(x - m))) with m the
# largest x: no overflow; -inf over an empty set.
_FLOAT_ONLY = ("reduce_l2", "reduce_log_sum_exp")
for _name in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod") + _FLOAT_ONLY:
    define(_name, attrs={"axes": Attr(AttrKind.INTS, ()), "keepdims": Attr(AttrKind.BOOL, False),
                         "noop_with_empty_axes": Attr(AttrKind.BOOL, False)},
           types=Types("x: T, axes: index? -> T",  # bfloat16 is computed in float32
                       T=(dtypes.FLOATS if _name in _FLOAT_ONLY else dtypes.NUMERIC) | {dtypes.bfloat16}),
           operands=("axes",), unknown=_reduced_unknown)(
        _reduction(_name))


_ARG_ATTRS = {"axis": Attr(AttrKind.INT, 0), "keepdims": Attr(AttrKind.BOOL, False),
              "select_last_index": Attr(AttrKind.BOOL, False)}


def _arg_index(op, inputs, attrs):
    x = inputs[0]
    if x.rank == 0:
        raise GraphError(f"{op}: input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, op)
    return [TensorSpec(reduced_shape(x.shape, (axis,), attrs["keepdims"], op), dtypes.int64)]


@define("argmax", types=Types("x: any -> int64"), attrs=_ARG_ATTRS)
def _argmax(inputs, attrs):
    """Index (int64) of the largest element along `axis`; on ties the first one, or the
    last one if select_last_index."""
    return _arg_index("argmax", inputs, attrs)


@define("argmin", types=Types("x: any -> int64"), attrs=_ARG_ATTRS)
def _argmin(inputs, attrs):
    """Index (int64) of the smallest element along `axis`; on ties the first one, or the
    last one if select_last_index."""
    return _arg_index("argmin", inputs, attrs)


def _same_shape(own, attrs, operands):
    return [TensorSpec(own[0].shape, own[0].dtype)]


# op -> (what runs, ONNX's op, the first value of an exclusive run)
_RUNNING = {"cumsum": ("sums", "CumSum", 0), "cumprod": ("products", "CumProd", 1)}


def _running(name):
    def infer(inputs, attrs):
        x = inputs[0]
        if x.rank == 0:
            raise GraphError(f"{name}: input must have rank >= 1")
        normalize_axis(attrs["axis"], x.rank, name)
        return [TensorSpec(x.shape, x.dtype)]
    what, onnx_op, first = _RUNNING[name]
    infer.__doc__ = (f"Running {what} along `axis`, as ONNX's {onnx_op}. exclusive: each leaves out its own "
                     f"element (the first is {first}); reverse: they run from the end of the axis toward its start.")
    return infer


for _name in _RUNNING:
    define(_name, types=Types("x: T, axis: index? -> T", T=dtypes.NUMERIC), operands=("axis",), unknown=_same_shape,
           attrs={"axis": Attr(AttrKind.INT, 0), "exclusive": Attr(AttrKind.BOOL, False),
                  "reverse": Attr(AttrKind.BOOL, False)})(_running(_name))


def _k_unknown(own, attrs, operands):
    x = own[0]
    axis = normalize_axis(attrs["axis"], x.rank, "topk")
    shape = x.shape[:axis] + (None,) + x.shape[axis + 1:]
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, dtypes.int64)]


@define("topk", types=Types("x: T, k: index? -> values: T, indices: int64", T=dtypes.NUMERIC),
        operands=("k",), unknown=_k_unknown,
        attrs={"k": Attr(AttrKind.INT), "axis": Attr(AttrKind.INT, -1), "largest": Attr(AttrKind.BOOL, True),
               "sorted": Attr(AttrKind.BOOL, True)})
def _topk(inputs, attrs):
    """The k largest (smallest if not `largest`) elements along `axis` and their int64 indices.

    Results come in order, best first, whatever `sorted` says; equal elements come in
    index order, and the lower index wins a tie for the last places (as ONNX's TopK).
    NaN counts as larger than every number.
    """
    x, k = inputs[0], attrs["k"]
    if x.rank == 0:
        raise GraphError("topk: input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "topk")
    if k < 0 or (x.shape[axis] is not None and k > x.shape[axis]):
        raise GraphError(f"topk: k must be in [0, {x.shape[axis]}] (the size of axis {axis}), got {k}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, dtypes.int64)]


# -- gradients -----------------------------------------------------------------------------

def reduced_axes(op, x):
    if not op.attrs["axes"]:
        return () if op.attrs["noop_with_empty_axes"] else tuple(range(x.rank))
    return normalize_axes(op.attrs["axes"], x.rank, op.name)


def kept(g, op, t):
    """`t` (shaped like the reduction's output) with the reduced axes kept as 1s."""
    if op.attrs["keepdims"]:
        return t
    axes = reduced_axes(op, op.inputs[0])
    return g("expand_dims", t, axes=axes) if axes else t


def spread(g, op, t):
    """`t` with reduced axes kept, broadcast back to the input's shape."""
    return g("expand", kept(g, op, t), g("shape", op.inputs[0]))


@gradient("reduce_sum")
def _reduce_sum_grad(g, op, grads):
    return [spread(g, op, grads[0])]


@gradient("reduce_mean")
def _reduce_mean_grad(g, op, grads):
    x, y = op.inputs[0], op.outputs[0]
    size = g("div", g("reduce_prod", g("shape", x)), g("reduce_prod", g("shape", y)))
    return [g("div", spread(g, op, grads[0]), g("cast", size, dtype=x.dtype))]


@gradient("reduce_max", "reduce_min")
def _reduce_max_grad(g, op, grads):
    """Split equally among the elements that tie for the maximum (minimum), as TensorFlow does."""
    x = op.inputs[0]
    hits = g("cast", g("equal", x, spread(g, op, op.outputs[0])), dtype=x.dtype)
    count = g("reduce_sum", hits, axes=reduced_axes(op, x), keepdims=True)
    return [g("mul", hits, g("div", kept(g, op, grads[0]), count))]


@gradient("reduce_prod")
def _reduce_prod_grad(g, op, grads):
    """The product of the other elements: y / x where no element is 0; where one is, the
    product of the rest for that element and 0 for the others; 0 where two or more are."""
    x = op.inputs[0]
    axes, zero, one = reduced_axes(op, x), g.constant(0, x), g.constant(1, x)
    is_zero = g("equal", x, zero)
    nonzero = g("where", is_zero, one, x)
    rest = g("div", g("reduce_prod", nonzero, axes=axes, keepdims=True), nonzero)
    zeros = g("reduce_sum", g("cast", is_zero, dtype=x.dtype), axes=axes, keepdims=True)
    # An element gets `rest` if no other element is 0, that is if zeros - is_zero == 0.
    others_zero = g("sub", zeros, g("cast", is_zero, dtype=x.dtype))
    live = g("equal", others_zero, zero)
    return [g("mul", g("where", live, rest, zero), kept(g, op, grads[0]))]


@gradient("reduce_l2")
def _reduce_l2_grad(g, op, grads):
    """dy * x / y, taken as 0 where y is 0 (the subgradient of least norm)."""
    x, y = op.inputs[0], kept(g, op, op.outputs[0])
    zero = g.constant(0, y)
    empty = g("equal", y, zero)
    scale = g("where", empty, zero, g("div", kept(g, op, grads[0]), g("where", empty, g.constant(1, y), y)))
    return [g("mul", x, scale)]


@gradient("reduce_log_sum_exp")
def _reduce_log_sum_exp_grad(g, op, grads):
    """dy * softmax(x) over the reduced axes: dy * exp(x - y)."""
    x, y = op.inputs[0], kept(g, op, op.outputs[0])
    return [g("mul", g("exp", g("sub", x, y)), kept(g, op, grads[0]))]


@gradient("cumsum")
def _cumsum_grad(g, op, grads):
    """Each x reaches the sums after it (before it, if reverse): a running sum the other way."""
    return [g("cumsum", grads[0], axis=op.attrs["axis"], exclusive=op.attrs["exclusive"],
              reverse=not op.attrs["reverse"])]


@gradient("cumprod")
def _cumprod_grad(g, op, grads):
    """dx_i = sum of dy_j * y_j / x_i over the products y_j that hold x_i: a running sum the
    other way, divided by x_i. Not dividing by 0: past a line's first zero every product
    holds it (0); at it, the products are those of x with that zero made 1."""
    x, y, dy = op.inputs[0], op.outputs[0], grads[0]
    run = {"axis": op.attrs["axis"], "exclusive": op.attrs["exclusive"]}
    back = {**run, "reverse": not op.attrs["reverse"]}
    zero, one = g.constant(0, x), g.constant(1, x)
    is_zero = g("equal", x, zero)
    zeros_before = g("cumsum", g("cast", is_zero, dtype=x.dtype), axis=run["axis"], exclusive=True,
                     reverse=op.attrs["reverse"])
    no_zero_before = g("equal", zeros_before, zero)
    first_zero = g("logical_and", is_zero, no_zero_before)
    x_safe = g("where", no_zero_before, g("where", first_zero, one, x), one)
    before = g("div", g("cumsum", g("mul", dy, y), **back), x_safe)
    y_at = g("cumprod", g("where", first_zero, one, x), **run, reverse=op.attrs["reverse"])
    at = g("cumsum", g("mul", dy, y_at), **back)
    return [g("where", first_zero, at, g("where", no_zero_before, before, zero))]


@gradient("argmax", "argmin")
def _argmax_grad(g, op, grads):
    return [None]  # piecewise constant in x


@gradient("topk")
def _topk_grad(g, op, grads):
    """dy of the values scattered back to the places they were taken from.

    With the axis moved last and x flattened, element j of row m is element m * n + j, so
    one gather_grad along the only axis does the scattering.
    """
    x, dy = op.inputs[0], grads[0]
    if dy is None:
        return [None]
    if op.attrs["k"] == 0:
        return [g.zeros_like(x)]
    axis = normalize_axis(op.attrs["axis"], x.rank, "topk")
    perm = tuple(i for i in range(x.rank) if i != axis) + (axis,)
    moved = perm != tuple(range(x.rank))
    x_last, dy_last, indices = x, dy, op.outputs[1]
    if moved:
        x_last, dy_last, indices = (g("transpose", t, perm=perm) for t in (x, dy, indices))
    flat_x = g("reshape", x_last, shape=(-1,))
    n = g("shape", x_last, start=-1)
    starts = g("range", g.constant(0, n), g("reduce_prod", g("shape", flat_x)), n)
    flat_indices = g("reshape", g("add", g("reshape", indices, shape=(-1, op.attrs["k"])),
                                  g("expand_dims", starts, axes=(1,))), shape=(-1,))
    grad = g("gather_grad", g("reshape", dy_last, shape=(-1,)), flat_indices, flat_x, axis=0)
    grad = g("reshape", grad, g("shape", x_last))
    if moved:
        grad = g("transpose", grad, perm=tuple(perm.index(i) for i in range(x.rank)))
    return [grad]


# The gradient of broadcasting, which the gradients of every broadcasting op use.

@define("sum_to", types=Types("grad: T, like: any -> T", T=dtypes.NUMERIC))
def _sum_to(inputs, attrs):
    """grad summed over the axes that broadcasting added or stretched, to like's shape."""
    grad, like = inputs
    if grad.rank < like.rank:
        raise GraphError(f"sum_to: rank {grad.rank} is below the target's {like.rank}")
    return [TensorSpec(like.shape, grad.dtype)]


@gradient("sum_to")
def _sum_to_grad(g, op, grads):
    return [g("expand", grads[0], g("shape", op.inputs[0])), None]
