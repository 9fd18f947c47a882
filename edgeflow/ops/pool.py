"""Max and average pooling over channels-first layouts, as ONNX's MaxPool and AveragePool.

Global average pooling needs no op of its own: it is reduce_mean over the spatial axes.
"""
from .. import dtypes
from ..errors import GraphError
from .conv import window_attrs, window_geometry
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt


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
       attrs={**window_attrs(dilations=False), **_COMMON, "count_include_pad": Attr(AttrKind.BOOL, False)})(
    _pool("avg_pool", "Mean of each window; padding counts only with count_include_pad (never the ceil_mode "
                      "overhang)."))


@gradient("max_pool")
def _max_pool_grad(g, op, grads):
    return [g("max_pool_grad", op.inputs[0], grads[0], **op.attrs)]


@gradient("avg_pool")
def _avg_pool_grad(g, op, grads):
    return [g("avg_pool_grad", grads[0], op.inputs[0], **op.attrs)]
