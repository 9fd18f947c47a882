"""Pooling over channels-first layouts, as ONNX's MaxPool (and its Indices), AveragePool,
LpPool and MaxUnpool.

Global average pooling needs no op of its own: it is reduce_mean over the spatial axes.
"""
from .. import dtypes
from ..errors import GraphError
from .conv import window_attrs, window_geometry, window_params
from .registry import Attr, AttrKind, TensorSpec, Types, define, get, gradient
from .dims import check_gradient_shape, fmt


def _pool(op, doc, dtype=None):
    """Inference of a pooling op: (N, C, *windows), of x's dtype or `dtype`."""
    def infer(inputs, attrs):
        x = inputs[0]
        kernel = attrs["kernel_shape"]
        if not 3 <= x.rank <= 5 or len(kernel) != x.rank - 2 or min(kernel) < 1:
            raise GraphError(f"{op}: x must be (N, C, spatial...) with 1 to 3 spatial axes and "
                             f"kernel_shape one positive int per spatial axis; got x "
                             f"{fmt(x.shape)}, kernel_shape {kernel}")
        if attrs.get("p", 1) < 1:
            raise GraphError(f"{op}: p must be >= 1, got {attrs['p']}")
        out, _, _ = window_geometry(op, x.shape[2:], kernel, attrs, attrs["ceil_mode"])
        return [TensorSpec(x.shape[:2] + out, dtype or x.dtype)]
    infer.__doc__ = doc
    return infer


_COMMON = {"kernel_shape": Attr(AttrKind.INTS), "ceil_mode": Attr(AttrKind.BOOL, False)}

define("max_pool", attrs={**window_attrs(), **_COMMON},
       types=Types("x: T -> T", T=dtypes.FLOATS | {dtypes.int8, dtypes.uint8}))(
    _pool("max_pool", "Largest element of each window; padding never wins."))

define("avg_pool", types=Types("x: T -> T", T=dtypes.FLOATS),
       attrs={**window_attrs(), **_COMMON, "count_include_pad": Attr(AttrKind.BOOL, False)})(
    _pool("avg_pool", "Mean of each window; padding counts only with count_include_pad (never the ceil_mode "
                      "overhang)."))


define("max_pool_indices", attrs={**get("max_pool").attrs, "storage_order": Attr(AttrKind.BOOL, False)},
       types=Types("x: T -> int64", T=get("max_pool").types.sets["T"]))(_pool(
    "max_pool_indices", "Where max_pool (same attrs) takes each window's element from: its index in x "
                        "flattened (ONNX's MaxPool Indices), the first maximum in kernel order on ties; "
                        "storage_order 1 counts the spatial axes column-major.", dtypes.int64))
# int64 output: no gradient flows through it.

define("lp_pool", types=Types("x: T -> T", T=dtypes.FLOATS),
       attrs={**window_attrs(), **_COMMON, "p": Attr(AttrKind.INT, 2)})(
    _pool("lp_pool", "(sum of |x|^p over each window)^(1/p); padding adds nothing (ONNX's LpPool)."))


@define("max_unpool", types=Types("x: T, indices: int64, output_shape: index? -> T", T=dtypes.FLOATS),
        attrs={"kernel_shape": Attr(AttrKind.INTS), "strides": Attr(AttrKind.INTS, ()),
               "pads": Attr(AttrKind.INTS, ()), "output_shape": Attr(AttrKind.INTS, ())},
        operands=("output_shape",))
def _max_unpool(inputs, attrs):
    """Zeros of the shape max_pool (these attrs) reduced, or of `output_shape`, with each x put at
    its index (flattened, as max_pool_indices gives) of the output (ONNX's MaxUnpool)."""
    x, indices = inputs
    kernel, d = attrs["kernel_shape"], x.rank - 2
    if not 3 <= x.rank <= 5 or len(kernel) != d or min(kernel) < 1:
        raise GraphError(f"max_unpool: x must be (N, C, spatial...) with 1 to 3 spatial axes and "
                         f"kernel_shape one positive int per spatial axis; got x {fmt(x.shape)}, "
                         f"kernel_shape {kernel}")
    if indices.rank != x.rank or any(None not in (a, b) and a != b for a, b in zip(x.shape, indices.shape)):
        raise GraphError(f"max_unpool: indices must have x's shape {fmt(x.shape)}, got {fmt(indices.shape)}")
    strides, _, pads = window_params("max_unpool", {**attrs, "auto_pad": "NOTSET"}, d)
    if attrs["output_shape"]:
        shape = attrs["output_shape"]
        if len(shape) != x.rank or any(None not in (a, b) and a != b for a, b in zip(x.shape[:2], shape[:2])):
            raise GraphError(f"max_unpool: output_shape must be (N, C, spatial...) of x {fmt(x.shape)}, "
                             f"got {shape}")
        return [TensorSpec(tuple(shape), x.dtype)]
    out = tuple(None if n is None else (n - 1) * s - pads[i] - pads[i + d] + k
                for i, (n, s, k) in enumerate(zip(x.shape[2:], strides, kernel)))
    if any(n is not None and n < 1 for n in out):
        raise GraphError(f"max_unpool: pads {pads} leave no output for x {fmt(x.shape)}")
    return [TensorSpec(x.shape[:2] + out, x.dtype)]


@gradient("max_pool")
def _max_pool_grad(g, op, grads):
    return [g("max_pool_grad", op.inputs[0], grads[0], **op.attrs)]


@gradient("avg_pool")
def _avg_pool_grad(g, op, grads):
    return [g("avg_pool_grad", grads[0], op.inputs[0], **op.attrs)]


# Gradients of pooling, as ops (their operands as conv_input_grad's).

@define("max_pool_grad", types=Types("x: T, dy: T -> T", T=dtypes.FLOATS), attrs=get("max_pool").attrs)
def _max_pool_grad_infer(inputs, attrs):
    """dy of max_pool (same attrs) routed to x's element that won each window, the first
    (in kernel order) on ties; added up where windows overlap."""
    x, dy = inputs
    check_gradient_shape("max_pool_grad", "max_pool", (x,), attrs, dy)
    return [TensorSpec(x.shape, dy.dtype)]


@define("avg_pool_grad", types=Types("dy: T, like: T -> T", T=dtypes.FLOATS), attrs=get("avg_pool").attrs)
def _avg_pool_grad_infer(inputs, attrs):
    """dy of avg_pool (same attrs), each window's share spread evenly over what it averaged."""
    dy, like = inputs
    check_gradient_shape("avg_pool_grad", "avg_pool", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@gradient("avg_pool_grad")
def _avg_pool_grad_grad(g, op, grads):
    return [g("avg_pool", grads[0], **op.attrs), None]
