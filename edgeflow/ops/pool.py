"""Max and average pooling over channels-first layouts, as ONNX's MaxPool and AveragePool.

Global average pooling needs no op of its own: it is reduce_mean over the spatial axes.
"""
from .. import dtypes
from ..errors import GraphError
from .conv import window_attrs, window_geometry
from .registry import Attr, AttrKind, TensorSpec, Types, define, get, gradient
from .dims import check_gradient_shape, fmt


def _pool(op, doc):
    def infer(inputs, attrs):
        x = inputs[0]
        kernel = attrs["kernel_shape"]
        if not 3 <= x.rank <= 5 or len(kernel) != x.rank - 2 or min(kernel) < 1:
            raise GraphError(f"{op}: x must be (N, C, spatial...) with 1 to 3 spatial axes and "
                             f"kernel_shape one positive int per spatial axis; got x "
                             f"{fmt(x.shape)}, kernel_shape {kernel}")
        out, _, _ = window_geometry(op, x.shape[2:], kernel, attrs, attrs["ceil_mode"])
        return [TensorSpec(x.shape[:2] + out, x.dtype)]
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
