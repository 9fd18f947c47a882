"""numpy kernels, registered by op name against the definitions in edgeflow.ops.

A kernel is `make(ins, outs, attrs) -> step`: given the input arrays and the planned
output arrays (views into the arena) once, at prepare time, it returns a zero-argument
callable that computes into `outs`. Planning stays out of the hot loop, as in TFLite's
prepare/eval split. Ops whose definition says `view=True` need no kernel: their output
is a reshaped view of their input, made by the planner.
"""
import numpy as np

from ... import ops

KERNELS = {}


def kernel(name):
    def register(make):
        ops.get(name)  # a kernel exists only for a defined op
        if name in KERNELS:
            raise AssertionError(f"two numpy kernels for {name!r}")
        KERNELS[name] = make
        return make
    return register


def evaluate(opcode, attrs, values, specs):
    """Output values of op `opcode` on known input `values` (arrays), computed now.

    `specs` are the output specs its inference gave. Used to fold ops whose operands
    are known before running, while building a graph and while preparing a plan.
    """
    if all(s.value is not None for s in specs):
        return [s.value for s in specs]
    if ops.get(opcode).view:
        return [np.asarray(values[0]).reshape(specs[0].shape)]
    outs = [np.empty(s.shape, s.dtype) for s in specs]
    values, attrs = ops.get(opcode).take_operands(values, attrs)
    with np.errstate(all="ignore"):
        KERNELS[opcode](values, outs, attrs)()
    return outs


from . import (activations, array, attention, conv, einsum, image, loss, math, nn, norm, pool,  # noqa: E402,F401
               quantize, random, reduce, rnn, select, shape, signal, state)  # (registration)
