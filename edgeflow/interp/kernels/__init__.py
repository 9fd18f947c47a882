"""numpy kernels, registered by op name against the definitions in edgeflow.ops.

A kernel is `make(ins, outs, attrs) -> step`: given the input arrays and the planned
output arrays (views into the arena) once, at prepare time, it returns a zero-argument
callable that computes into `outs`. Planning stays out of the hot loop, as in TFLite's
prepare/eval split. Ops whose definition says `view=True` need no kernel: their output
is a reshaped view of their input, made by the planner.
"""
from functools import partial

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


def ufunc(name, fn):
    """Register numpy ufunc `fn` as the kernel of elementwise op `name`."""
    kernel(name)(lambda ins, outs, attrs: partial(fn, *ins, out=outs[0]))


from . import (activations, array, conv, einsum, image, math, nn, norm, pool, reduce,  # noqa: E402,F401
               rnn, shape)  # (registration)
