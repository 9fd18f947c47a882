"""Reductions over axes."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, define
from .shapes import normalize_axes, normalize_axis


def reduced_shape(shape, axes, keepdims, op):
    """Shape after reducing `axes` (all axes when empty)."""
    axes = normalize_axes(axes, len(shape), op) if axes else tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduction(name):
    def infer(inputs, attrs):
        x = inputs[0]
        if x.dtype not in dtypes.FLOATS | dtypes.INTEGERS:
            raise GraphError(f"{name}: dtype {x.dtype} not supported")
        return [TensorSpec(reduced_shape(x.shape, attrs["axes"], attrs["keepdims"], name), x.dtype)]
    infer.__doc__ = f"{name} over `axes` (all when empty), keeping them as 1s if keepdims."
    return infer


for _name in ("reduce_sum", "reduce_mean", "reduce_max"):
    define(_name, inputs=1, attrs={"axes": Attr(AttrKind.INTS, ()),
                                   "keepdims": Attr(AttrKind.BOOL, False)})(_reduction(_name))


@define("argmax", inputs=1, attrs={"axis": Attr(AttrKind.INT, 0), "keepdims": Attr(AttrKind.BOOL, False)})
def _argmax(inputs, attrs):
    """Index (int64) of the largest element along `axis`; the first one on ties."""
    x = inputs[0]
    if x.rank == 0:
        raise GraphError("argmax: input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "argmax")
    return [TensorSpec(reduced_shape(x.shape, (axis,), attrs["keepdims"], "argmax"), dtypes.int64)]
