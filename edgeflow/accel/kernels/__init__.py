"""OpenCL kernels, registered by op name against edgeflow.ops, like the numpy kernels.

`@cl_kernel("name", unsupported=None, int_inputs=False)` registers
`make(rt, ins, outs, attrs) -> step`: `rt` is the Runtime (edgeflow/accel/opencl.py:
`rt.program("file", DEFINE=value)`, `rt.kernel(program, name)`, `rt.queue`,
`rt.max_group(kernel)`), `ins`/`outs` are pyopencl arrays (contiguous, the op's shapes);
the step enqueues the kernels (no finish). `unsupported(attrs, ins, outs)` returns why a
case is not handled (host arrays), or None.
"""
from dataclasses import dataclass
from typing import Callable, Optional

from ... import ops


@dataclass(frozen=True)
class Entry:
    make: Callable
    unsupported: Optional[Callable]
    int_inputs: bool


CL_KERNELS = {}


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

from . import elementwise  # noqa: E402,F401  (registration)
from . import conv, pool, norm, image  # noqa: E402,F401
from . import gemm, nn  # noqa: E402,F401
from . import backprop, compare  # noqa: E402,F401
