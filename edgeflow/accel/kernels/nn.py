"""OpenCL kernels of edgeflow/ops/nn.py: softmax and log_softmax (nn.cl, one work-group per
row), relu and relu_grad (elementwise.cl)."""
import numpy as np

from ...ops.dims import normalize_axis
from . import cl_kernel, elementwise
from .layout import per_row, shape_supported


def _softmax(log_mode):
    def make(rt, ins, outs, attrs):
        x = ins[0]
        axis = normalize_axis(attrs["axis"], x.ndim, "softmax")
        return per_row(rt, "softmax_rows", x.shape, [axis],
                       lambda *geo: (x.data, outs[0].data, *geo, np.int32(log_mode)))
    return make


cl_kernel("softmax", unsupported=shape_supported)(_softmax(0))
cl_kernel("log_softmax", unsupported=shape_supported)(_softmax(1))


@cl_kernel("relu")
def _relu(rt, ins, outs, attrs):
    return elementwise.unary(rt, "relu", ins[0], outs[0])


@cl_kernel("relu_grad", unsupported=elementwise.rank_supported)
def _relu_grad(rt, ins, outs, attrs):
    """dy where x > 0, else 0: a binary op of elementwise.cl."""
    return elementwise.binary(rt, "relu_grad", ins, outs[0])
