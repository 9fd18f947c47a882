"""Ops that gradients need and forward models do not: undoing broadcasting, slicing,
gathering, convolution, pooling, padding and resizing. Their own gradients, where they
have them, make second derivatives of those possible."""
import math

from .. import dtypes
from ..errors import GraphError
from . import image, pool  # noqa: F401  (the forward ops whose attrs the gradient ops take)
from .array import INDEX_DTYPES, slice_params
from .conv import window_attrs
from .registry import Attr, AttrKind, TensorSpec, define, get, gradient
from .dims import fmt, normalize_axis


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


# Gradients of the window and image ops. Each takes the forward input (or a tensor shaped
# like it, `like`) as an operand, so that its output shape is known when the batch is not.

def _conv_grad_attrs():
    return {**window_attrs(), "group": Attr(AttrKind.INT, 1)}


def _matches(op, what, got, want):
    """GraphError unless shapes `got` and `want` agree where both are known."""
    if len(got) != len(want) or any(None not in (a, b) and a != b for a, b in zip(got, want)):
        raise GraphError(f"{op}: {what} has shape {fmt(got)}, but the forward op gives {fmt(want)}")


def _forward_output(op, forward, inputs, attrs, dy):
    """Check dy against the output spec of op `forward` (its own checks included) on `inputs`."""
    spec = get(forward).infer(list(inputs), attrs)[0]
    if dy.dtype != spec.dtype:
        raise GraphError(f"{op}: the gradient is {dy.dtype}, the forward op's output {spec.dtype}")
    _matches(op, "the gradient", dy.shape, spec.shape)


def _conv_grad_flops(dy, w):
    return lambda inputs, outputs, attrs: 2 * math.prod(inputs[dy].shape) * math.prod(inputs[w].shape[1:])


@define("conv_input_grad", inputs=3, attrs=_conv_grad_attrs(), flops=_conv_grad_flops(0, 1))
def _conv_input_grad(inputs, attrs):
    """Gradient of conv (same attrs) with respect to its input: dy (N, M, *out) taken back
    through w (M, C/group, *kernel) to like's shape (N, C, *in)."""
    dy, w, like = inputs
    _forward_output("conv_input_grad", "conv", (like, w), {**attrs, "activation": ""}, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("conv_filter_grad", inputs=3, attrs=_conv_grad_attrs(), flops=_conv_grad_flops(1, 2))
def _conv_filter_grad(inputs, attrs):
    """Gradient of conv (same attrs) with respect to its filter: x (N, C, *in) correlated with
    dy (N, M, *out), summed over the batch, shaped like w (M, C/group, *kernel)."""
    x, dy, like = inputs
    _forward_output("conv_filter_grad", "conv", (x, like), {**attrs, "activation": ""}, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("max_pool_grad", inputs=2, attrs=get("max_pool").attrs)
def _max_pool_grad(inputs, attrs):
    """dy of max_pool (same attrs) routed to x's element that won each window, the first
    (in kernel order) on ties; added up where windows overlap."""
    x, dy = inputs
    if x.dtype not in dtypes.FLOATS:
        raise GraphError(f"max_pool_grad: x must be a float tensor, got {x.dtype}")
    _forward_output("max_pool_grad", "max_pool", (x,), attrs, dy)
    return [TensorSpec(x.shape, dy.dtype)]


@define("avg_pool_grad", inputs=2, attrs=get("avg_pool").attrs)
def _avg_pool_grad(inputs, attrs):
    """dy of avg_pool (same attrs), each window's share spread evenly over what it averaged."""
    dy, like = inputs
    _forward_output("avg_pool_grad", "avg_pool", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("pad_grad", inputs=2, attrs=get("pad").attrs)
def _pad_grad(inputs, attrs):
    """dy of pad (same attrs, mode reflect or edge) with each border element's gradient added
    to the element it copies, cropped to like's shape."""
    dy, like = inputs
    if attrs["mode"] == "constant":
        raise GraphError("pad_grad: mode 'constant' needs no op of its own: pad by the negated pads")
    _forward_output("pad_grad", "pad", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("resize_grad", inputs=2, attrs=get("resize").attrs)
def _resize_grad(inputs, attrs):
    """dy of resize (same attrs) added back to the input pixels each output pixel read, with
    the weights it read them with; shaped like `like`."""
    dy, like = inputs
    if dy.dtype not in dtypes.FLOATS:
        raise GraphError(f"resize_grad: the gradient must be a float tensor, got {dy.dtype}")
    _forward_output("resize_grad", "resize", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


# Each of these is linear in its gradient operand; the rules below are its transpose.

@gradient("conv_input_grad")
def _conv_input_grad_grad(g, op, grads):
    dy, w, _ = op.inputs
    return [g("conv", grads[0], w, **op.attrs), g("conv_filter_grad", grads[0], dy, w, **op.attrs), None]


@gradient("conv_filter_grad")
def _conv_filter_grad_grad(g, op, grads):
    x, dy, _ = op.inputs
    return [g("conv_input_grad", dy, grads[0], x, **op.attrs), g("conv", x, grads[0], **op.attrs), None]


@gradient("avg_pool_grad")
def _avg_pool_grad_grad(g, op, grads):
    return [g("avg_pool", grads[0], **op.attrs), None]


@gradient("pad_grad")
def _pad_grad_grad(g, op, grads):
    return [g("pad", grads[0], **op.attrs), None]


@gradient("resize_grad")
def _resize_grad_grad(g, op, grads):
    return [g("resize", grads[0], **op.attrs), None]
