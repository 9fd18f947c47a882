"""Steps running elementwise.cl: binary ops with broadcasting and a fused activation, and
unary math. The launchers are registered where their ops are defined (math.py, nn.py,
activations.py)."""
import math

import numpy as np

BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4, "minimum": 5, "pow": 6, "prelu": 7, "clip_grad": 8,
          "relu_grad": 9}
UNARY = {"neg": 0, "abs": 1, "exp": 2, "log": 3, "sqrt": 4, "relu": 5, "sigmoid": 6, "tanh": 7, "swish": 8}
ACTIVATIONS = {"": 0, "relu": 1, "relu6": 2, "swish": 3, "hard_swish": 4}  # common.cl's fused_activation


def _global(n, group):
    return (max(-(-n // group) * group, group),)


def broadcast_strides(shape, out_shape):
    """Element strides of a contiguous array of `shape` read at `out_shape`'s indices (0 where it broadcasts)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(0 if d == 1 else step)
        step *= d
    return np.array(strides[::-1], np.int32)


def binary(rt, name, ins, out, activation="", **defines):
    """A step computing out = activation(name(a, b)), a and b broadcast to out's shape;
    `defines`: the op's constants (clip_grad's LOW and HIGH), as OpenCL C expressions."""
    a, b = ins
    n = int(out.size)
    act = ACTIVATIONS[activation]
    program = rt.program("elementwise", OP=BINARY[name], UOP=0, ACT=act, **defines)
    if a.shape == b.shape == out.shape:
        kernel = rt.kernel(program, "binary_same")
        group = min(rt.max_group(kernel), 256)
        kernel.set_args(a.data, b.data, out.data, np.int32(n))
        return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, _global(n, group), (group,))
    import pyopencl.array as cla
    dims = cla.to_device(rt.queue, np.array(out.shape or (1,), np.int32))
    sa = cla.to_device(rt.queue, broadcast_strides(a.shape, out.shape) if out.shape else np.zeros(1, np.int32))
    sb = cla.to_device(rt.queue, broadcast_strides(b.shape, out.shape) if out.shape else np.zeros(1, np.int32))
    kernel = rt.kernel(program, "binary_broadcast")
    group = min(rt.max_group(kernel), 256)
    kernel.set_args(a.data, b.data, out.data, np.int32(n), np.int32(max(len(out.shape), 1)),
                    dims.data, sa.data, sb.data)
    keep = (dims, sa, sb)  # the step owns the index buffers

    def run(keep=keep):
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, _global(n, group), (group,))
    return run


def rank_supported(attrs, ins, outs):
    """Why not, for binary ops: an output of rank above 8; else None."""
    return None if len(outs[0].shape) <= 8 else "rank above 8"


def unary(rt, name, x, out, **defines):
    """A step computing out = name(x); `defines` set the op's constants (swish: ALPHA)."""
    n = int(out.size)
    kernel = rt.kernel(rt.program("elementwise", OP=0, UOP=UNARY[name], ACT=0, **defines), "unary")
    group = min(rt.max_group(kernel), 256)
    kernel.set_args(x.data, out.data, np.int32(n))
    return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, _global(n, group), (group,))


def float_literal(value):
    """`value` as an OpenCL C float expression (INFINITY for infinities)."""
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{float(value)!r}f"
