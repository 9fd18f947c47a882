"""Image ops: padding, and resizing the spatial axes of (N, C, H, W) tensors, as ONNX's Pad and Resize."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, get, gradient
from .dims import check_gradient_shape, fmt

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@define("pad", types=Types("x: T, pads: index?, value: T? -> T", T=dtypes.ANY),
        attrs={"pads": Attr(AttrKind.INTS), "mode": Attr(AttrKind.STRING, "constant"),
               "value": Attr(AttrKind.FLOAT, 0.0)}, operands=("pads", "value"))
def _pad(inputs, attrs):
    """Grow each axis by pads (begin..., end...): with `value`, a mirror (reflect), the edge, or
    the axis repeated as on a torus (wrap).

    Negative pads remove elements, in constant mode only.
    """
    x, pads, mode = inputs[0], attrs["pads"], attrs["mode"]
    if mode not in PAD_MODES:
        raise GraphError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    if len(pads) != 2 * x.rank:
        raise GraphError(f"pad: pads must hold {2 * x.rank} ints (begin..., end...) for "
                         f"{fmt(x.shape)}, got {len(pads)}")
    if mode != "constant" and min(pads, default=0) < 0:
        raise GraphError(f"pad: negative pads crop, which only mode 'constant' does; got {pads}")
    shape = []
    for i, n in enumerate(x.shape):
        pb, pe = pads[i], pads[i + x.rank]
        if n is not None and n + pb + pe < 0:
            raise GraphError(f"pad: pads {pb}, {pe} remove more than axis {i} of {fmt(x.shape)} holds")
        if mode != "constant" and n == 0 and pb + pe:
            raise GraphError(f"pad: mode {mode!r} cannot pad axis {i} of {fmt(x.shape)}: it is empty")
        shape.append(None if n is None else n + pb + pe)
    return [TensorSpec(tuple(shape), x.dtype)]


RESIZE_MODES = ("nearest", "linear")
COORDINATE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def spatial_scales(op, attrs, rank):
    """(scales, sizes) for the last two axes, one of them None; GraphError unless exactly one is given."""
    scales, sizes = attrs["scales"], attrs["sizes"]
    if bool(scales) == bool(sizes):
        raise GraphError(f"{op}: give exactly one of scales and sizes, got scales={scales}, sizes={sizes}")
    given = scales or sizes
    if len(given) not in (2, rank):
        raise GraphError(f"{op}: scales or sizes must have 2 (H, W) or {rank} entries, got {given}")
    if scales and (min(scales) <= 0 or any(s != 1 for s in scales[:-2])):
        raise GraphError(f"{op}: scales must be positive, and 1 on the batch and channel axes; got {scales}")
    if sizes and min(sizes[-2:]) < 1:
        raise GraphError(f"{op}: sizes must be positive, got {sizes}")
    return (tuple(scales[-2:]), None) if scales else (None, tuple(sizes[-2:]))


def resized(n, scale):
    """floor(n * scale), in float32 as ONNX Runtime computes it."""
    return int(np.floor(np.float32(n) * np.float32(scale)))


@define("resize", types=Types("x: T -> T", T=dtypes.NUMERIC), attrs={
    "scales": Attr(AttrKind.FLOATS, ()), "sizes": Attr(AttrKind.INTS, ()),
    "mode": Attr(AttrKind.STRING, "nearest"),
    "coordinate_transformation_mode": Attr(AttrKind.STRING, "half_pixel"),
    "nearest_mode": Attr(AttrKind.STRING, "round_prefer_floor")})
def _resize(inputs, attrs):
    """Resample H and W of (N, C, H, W) to `sizes`, or to floor(size * scales).

    Each output pixel maps back to an input coordinate by coordinate_transformation_mode;
    nearest rounds it by nearest_mode, linear interpolates (bilinear).
    """
    x = inputs[0]
    for key, allowed in (("mode", RESIZE_MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                         ("nearest_mode", NEAREST_MODES)):
        if attrs[key] not in allowed:
            raise GraphError(f"resize: {key} must be one of {allowed}, got {attrs[key]!r}")
    if attrs["mode"] != "nearest" and x.dtype not in dtypes.FLOATS:  # a declaration cannot say this
        raise GraphError(f"resize: mode {attrs['mode']!r} does not take dtype {x.dtype}")
    if x.rank != 4:
        raise GraphError(f"resize: x must be (N, C, H, W), got {fmt(x.shape)}")
    scales, sizes = spatial_scales("resize", attrs, x.rank)
    if sizes is not None and len(attrs["sizes"]) == 4 and any(
            n is not None and n != s for n, s in zip(x.shape[:2], attrs["sizes"][:2])):
        raise GraphError(f"resize: sizes {attrs['sizes']} would resize the batch or channel axis of "
                         f"{fmt(x.shape)}; only H and W are resized")
    if sizes is None:
        sizes = tuple(None if n is None else resized(n, s) for n, s in zip(x.shape[2:], scales))
        if any(s is not None and s < 1 for s in sizes):
            raise GraphError(f"resize: scales {scales} shrink {fmt(x.shape)} to nothing")
    return [TensorSpec(x.shape[:2] + sizes, x.dtype)]


@gradient("pad")
def _pad_grad(g, op, grads):
    """Constant padding's gradient is dy cropped (and zero-padded where pad cropped): pad by
    the negated pads. Reflect, edge and wrap also add each border's gradient to its source."""
    if op.attrs["mode"] == "constant":
        return [g("pad", grads[0], pads=tuple(-p for p in op.attrs["pads"]))]
    return [g("pad_grad", grads[0], op.inputs[0], **op.attrs)]


@gradient("resize")
def _resize_grad(g, op, grads):
    return [g("resize_grad", grads[0], op.inputs[0], **op.attrs)]


# Gradients of pad and resize, as ops (their operands as conv_input_grad's).

@define("pad_grad", types=Types("dy: T, like: T -> T", T=dtypes.NUMERIC), attrs=get("pad").attrs)
def _pad_grad_infer(inputs, attrs):
    """dy of pad (same attrs, mode reflect, edge or wrap) with each border element's gradient added
    to the element it copies, cropped to like's shape."""
    dy, like = inputs
    if attrs["mode"] == "constant":
        raise GraphError("pad_grad: mode 'constant' needs no op of its own: pad by the negated pads")
    check_gradient_shape("pad_grad", "pad", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("resize_grad", types=Types("dy: T, like: T -> T", T=dtypes.FLOATS), attrs=get("resize").attrs)
def _resize_grad_infer(inputs, attrs):
    """dy of resize (same attrs) added back to the input pixels each output pixel read, with
    the weights it read them with; shaped like `like`."""
    dy, like = inputs
    check_gradient_shape("resize_grad", "resize", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@gradient("pad_grad")
def _pad_grad_grad(g, op, grads):
    return [g("pad", grads[0], **op.attrs), None]


@gradient("resize_grad")
def _resize_grad_grad(g, op, grads):
    return [g("resize", grads[0], **op.attrs), None]
