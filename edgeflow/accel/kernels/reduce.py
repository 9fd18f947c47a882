"""OpenCL kernels of edgeflow/ops/reduce.py: reduce_sum, reduce_mean, reduce_max (nn.cl, one
work-group per output row) and sum_to (backprop.cl, one work-item per output element)."""
import numpy as np

from . import cl_kernel
from .conv import constant_ints, launcher
from .layout import contiguous_strides, float32_supported, host_table, per_row, shape_supported


def _reduce(mode):
    def make(rt, ins, outs, attrs):
        x = ins[0]
        axes = sorted({a % x.ndim for a in attrs["axes"]}) if attrs["axes"] else list(range(x.ndim))
        return per_row(rt, "reduce_rows", x.shape, axes,
                       lambda *geo: (x.data, outs[0].data, *geo, np.int32(mode)))
    return make


def _reduce_supported(attrs, ins, outs):
    if not attrs["axes"] and attrs["noop_with_empty_axes"]:
        return "noop_with_empty_axes with no axes: a copy, left to the CPU"
    return shape_supported(attrs, ins, outs)


for _mode, _name in enumerate(("reduce_sum", "reduce_mean", "reduce_max")):
    cl_kernel(_name, unsupported=_reduce_supported)(_reduce(_mode))


def _sum_to_table(grad_shape, out_shape):
    """(table, kept dims, reduced dims, elements summed per output element)."""
    lead = len(grad_shape) - len(out_shape)
    strides = contiguous_strides(grad_shape)
    reduced = [d for d in range(len(grad_shape))
               if d < lead or (out_shape[d - lead] == 1 and grad_shape[d] != 1)]
    kept = [d for d in range(len(grad_shape)) if d not in reduced]
    rows = ([grad_shape[d] for d in kept], [strides[d] for d in kept],
            [grad_shape[d] for d in reduced], [strides[d] for d in reduced])
    return host_table(*rows), len(kept), len(reduced), int(np.prod(rows[2], dtype=np.int64))


@cl_kernel("sum_to", unsupported=float32_supported)
def _sum_to(rt, ins, outs, attrs):
    grad, out = ins[0], outs[0]
    table, n_kept, n_reduced, count = _sum_to_table(grad.shape, out.shape)
    geo = constant_ints(rt, table)
    total = int(out.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), "sum_to"), total, grad.data, out.data,
                    geo.data, np.int32(total), np.int32(n_kept), np.int32(n_reduced), np.int32(count))
    return lambda keep=geo: step()
