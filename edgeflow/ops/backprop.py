"""Ops that gradients need and forward models do not: undoing broadcasting, slicing and
gathering. Their own gradients make second derivatives of those possible."""
from ..errors import GraphError
from .array import INDEX_DTYPES, slice_params
from .registry import Attr, AttrKind, TensorSpec, define, gradient
from .shapes import normalize_axis


@define("sum_to", inputs=2)
def _sum_to(inputs, attrs):
    """grad summed over the axes that broadcasting added or stretched, to like's shape."""
    grad, like = inputs
    if grad.rank < like.rank:
        raise GraphError(f"sum_to: rank {grad.rank} is below the target's {like.rank}")
    return [TensorSpec(like.shape, grad.dtype)]


@define("slice_grad", inputs=2, attrs={"starts": Attr(AttrKind.INTS, ()), "ends": Attr(AttrKind.INTS, ()),
                                       "axes": Attr(AttrKind.INTS, ()), "steps": Attr(AttrKind.INTS, ())})
def _slice_grad(inputs, attrs):
    """Zeros shaped like `like`, with grad written where slice (same attrs) took its values."""
    grad, like = inputs
    slice_params([like], attrs)
    return [TensorSpec(like.shape, grad.dtype)]


@define("gather_grad", inputs=3, attrs={"axis": Attr(AttrKind.INT, 0)})
def _gather_grad(inputs, attrs):
    """Zeros shaped like `like` (gather's params), with grad added back at `indices`."""
    grad, indices, like = inputs
    if indices.dtype not in INDEX_DTYPES:
        raise GraphError(f"gather_grad: indices must be int32 or int64, got {indices.dtype}")
    normalize_axis(attrs["axis"], like.rank, "gather_grad")
    return [TensorSpec(like.shape, grad.dtype)]


@gradient("sum_to")
def _sum_to_grad(g, op, grads):
    return [g("expand", grads[0], g("shape", op.inputs[0])), None]


@gradient("slice_grad")
def _slice_grad_grad(g, op, grads):
    return [g("slice", grads[0], **op.attrs), None]


@gradient("gather_grad")
def _gather_grad_grad(g, op, grads):
    return [g("gather", grads[0], op.inputs[1], axis=op.attrs["axis"]), None, None]
