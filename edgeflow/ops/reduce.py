"""Reductions over axes, running sums along one, and top-k selection."""
from .. import dtypes
from ..errors import GraphError
from .math import NUMERIC
from .registry import Attr, AttrKind, TensorSpec, define
from .shapes import normalize_axes, normalize_axis


def reduced_shape(shape, axes, keepdims, op):
    """Shape after reducing `axes` (all axes when empty)."""
    axes = normalize_axes(axes, len(shape), op) if axes else tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _numeric(op, x, allowed=NUMERIC):
    if x.dtype not in allowed:
        raise GraphError(f"{op}: dtype {x.dtype} not supported; expected one of "
                         f"{', '.join(sorted(d.name for d in allowed))}")


def _reduction(name, allowed):
    def infer(inputs, attrs):
        x = inputs[0]
        _numeric(name, x, allowed)
        return [TensorSpec(reduced_shape(x.shape, attrs["axes"], attrs["keepdims"], name), x.dtype)]
    infer.__doc__ = f"{name} over `axes` (all when empty), keeping them as 1s if keepdims."
    return infer


# reduce_l2 is sqrt(sum(x ** 2)); integer norms are left out as rarely meant.
for _name in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l2"):
    define(_name, inputs=1, attrs={"axes": Attr(AttrKind.INTS, ()),
                                   "keepdims": Attr(AttrKind.BOOL, False)})(
        _reduction(_name, dtypes.FLOATS if _name == "reduce_l2" else NUMERIC))


@define("argmax", inputs=1, attrs={"axis": Attr(AttrKind.INT, 0), "keepdims": Attr(AttrKind.BOOL, False),
                                   "select_last_index": Attr(AttrKind.BOOL, False)})
def _argmax(inputs, attrs):
    """Index (int64) of the largest element along `axis`; on ties the first one, or the
    last one if select_last_index."""
    x = inputs[0]
    if x.rank == 0:
        raise GraphError("argmax: input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "argmax")
    return [TensorSpec(reduced_shape(x.shape, (axis,), attrs["keepdims"], "argmax"), dtypes.int64)]


@define("cumsum", inputs=1, attrs={"axis": Attr(AttrKind.INT, 0), "exclusive": Attr(AttrKind.BOOL, False),
                                   "reverse": Attr(AttrKind.BOOL, False)})
def _cumsum(inputs, attrs):
    """Running sums along `axis`, as ONNX's CumSum.

    exclusive: each sum leaves out its own element (the first is 0); reverse: the sums
    run from the end of the axis toward its start.
    """
    x = inputs[0]
    _numeric("cumsum", x)
    if x.rank == 0:
        raise GraphError("cumsum: input must have rank >= 1")
    normalize_axis(attrs["axis"], x.rank, "cumsum")
    return [TensorSpec(x.shape, x.dtype)]


@define("topk", inputs=1, outputs=2, attrs={"k": Attr(AttrKind.INT), "axis": Attr(AttrKind.INT, -1),
                                            "largest": Attr(AttrKind.BOOL, True),
                                            "sorted": Attr(AttrKind.BOOL, True)})
def _topk(inputs, attrs):
    """The k largest (smallest if not `largest`) elements along `axis` and their int64 indices.

    Results come in order, best first, whatever `sorted` says; equal elements come in
    index order, and the lower index wins a tie for the last places (as ONNX's TopK).
    NaN counts as larger than every number.
    """
    x, k = inputs[0], attrs["k"]
    _numeric("topk", x)
    if x.rank == 0:
        raise GraphError("topk: input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "topk")
    if k < 0 or (x.shape[axis] is not None and k > x.shape[axis]):
        raise GraphError(f"topk: k must be in [0, {x.shape[axis]}] (the size of axis {axis}), got {k}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, dtypes.int64)]
