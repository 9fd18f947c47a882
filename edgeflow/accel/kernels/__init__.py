"""OpenCL kernels, registered by op name against edgeflow.ops, like the numpy kernels.

`@cl_kernel("name", unsupported=None, int_inputs=False)` registers
`make(rt, ins, outs, attrs) -> step`: `rt` is the Runtime (edgeflow/accel/opencl.py:
`rt.program("file", DEFINE=value)`, `rt.kernel(program, name)`, `rt.queue`,
`rt.max_group(kernel)`), `ins`/`outs` are pyopencl arrays (contiguous, the op's shapes);
the step enqueues the kernels (no finish). `unsupported(attrs, ins, outs)` returns why a
case is not handled (host arrays), or None.

Float tensors are stored as common.cl's `store_t` and read and written through its
LOAD/STORE macros: float32 buffers by default, float16 (half) buffers in fp16 mode
(`rt.half`), where the device arrays a step gets have dtype float16 and the math in the
kernels stays float. Integer and bool tensors are stored as they are.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ... import ops


@dataclass(frozen=True)
class Entry:
    make: Callable
    unsupported: Optional[Callable]
    int_inputs: bool


CL_KERNELS = {}


def tensor_dtype(array):
    """The dtype of the values device array `array` holds: float32 for a float tensor,
    whether it is stored as float32 or (fp16 mode) as half."""
    return np.dtype(np.float32) if array.dtype.kind == "f" else array.dtype


def cl_kernel(name, unsupported=None, int_inputs=False):
    def register(make):
        ops.get(name)
        if name in CL_KERNELS:
            raise AssertionError(f"two OpenCL kernels for {name!r}")
        CL_KERNELS[name] = Entry(make, unsupported, int_inputs)
        return make
    return register


for _view in ("reshape", "squeeze", "expand_dims"):
    # Views cost nothing on the device either: the same buffer, a new shape.
    CL_KERNELS[_view] = Entry(None, None, True)

from . import math, nn, array, reduce, conv, pool, norm, image, activations  # noqa: E402,F401  (registration)
