"""equal, less and greater with broadcasting (compare.cl): float32, int32 or bool operands,
a bool (uchar) result; gradient graphs feed these to `where`."""
import numpy as np

from . import cl_kernel
from .elementwise import broadcast_strides

COMPARISONS = {"equal": 0, "less": 1, "greater": 2}
TYPES = {np.dtype(np.float32): "float", np.dtype(np.int32): "int", np.dtype(np.bool_): "uchar"}


def _operands(dtype):
    """compare.cl's defines for operands held as `dtype` on the device (floats may be half-stored)."""
    return {"FLOAT": 1} if dtype.kind == "f" else {"FLOAT": 0, "T": TYPES[dtype]}


def _unsupported(attrs, ins, outs):
    if ins[0].dtype not in TYPES:
        return f"dtype {ins[0].dtype} (comparisons take float32, int32 or bool)"
    return None if len(outs[0].shape) <= 8 else "rank above 8"


def _compare(name):
    def make(rt, ins, outs, attrs):
        import pyopencl.array as cla
        a, b = ins
        out = outs[0]
        shape = out.shape or (1,)
        n = int(out.size)
        tables = [cla.to_device(rt.queue, t) for t in (np.array(shape, np.int32), broadcast_strides(a.shape, shape),
                                                       broadcast_strides(b.shape, shape))]
        program = rt.program("compare", OP=COMPARISONS[name], **_operands(a.dtype))
        kernel = rt.kernel(program, "compare")
        group = min(rt.max_group(kernel), 256)
        kernel.set_args(a.data, b.data, out.data, np.int32(n), np.int32(len(shape)), *(t.data for t in tables))
        size = (-(-n // group) * group,)
        return lambda keep=tables: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))
    return make


for _name in COMPARISONS:
    cl_kernel(_name, unsupported=_unsupported, int_inputs=True)(_compare(_name))
