"""numpy kernels, registered by op name against the definitions in edgeflow.ops.

A kernel is `make(ins, outs, attrs) -> step`: given the input arrays and the planned
output arrays (views into the arena) once, at prepare time, it returns a zero-argument
callable that computes into `outs`. Planning stays out of the hot loop, as in TFLite's
prepare/eval split. Ops whose definition says `view=True` need no kernel: their output
is a reshaped view of their input, made by the planner.
"""
import functools
import weakref

import numpy as np

from ... import dtypes, ops

KERNELS = {}


def kernel(name, bfloat16="widen"):
    """Register `make` as op `name`'s kernel. How bfloat16 values (which numpy cannot
    compute on) reach it: "widen": as float32 copies, its bfloat16 outputs rounded back
    after each step; "bits": as their bits, uint16 views, exactly and at no cost (for a
    kernel that only moves, selects or copies elements); "as_is": as they are."""
    def register(make):
        ops.get(name)  # a kernel exists only for a defined op
        if name in KERNELS:
            raise AssertionError(f"two numpy kernels for {name!r}")
        KERNELS[name] = {"widen": _widened, "bits": _as_bits, "as_is": lambda m: m}[bfloat16](make)
        return make
    return register


def _bfloat16(a):
    return a is not None and a.dtype == dtypes.bfloat16


def _as_bits(make):
    @functools.wraps(make)
    def bits(ins, outs, attrs):
        if not any(map(_bfloat16, (*ins, *outs))):
            return make(ins, outs, attrs)
        return make(*([a["bfloat16"] if _bfloat16(a) else a for a in arrays] for arrays in (ins, outs)), attrs)
    return bits


def _widened(make):
    @functools.wraps(make)
    def widened(ins, outs, attrs):
        if not any(map(_bfloat16, (*ins, *outs))):
            return make(ins, outs, attrs)
        wide_ins = [dtypes.widen(a) if _bfloat16(a) else a for a in ins]
        wide_outs = [np.empty(a.shape, dtypes.float32) if _bfloat16(a) else a for a in outs]
        step = make(wide_ins, wide_outs, attrs)
        loads = [(a, w) for a, w in zip(ins, wide_ins) if w is not a]
        stores = [(w, a) for a, w in zip(outs, wide_outs) if w is not a]

        def run():
            for a, w in loads:
                dtypes.widen(a, out=w)
            step()
            for w, a in stores:
                dtypes.narrow(w, out=a)
        return run
    return widened


def per_constant(cache, key, owners, make):
    """make()'s result for a model's constant arrays `owners` (read-only: they do not change
    between runs), kept in `cache` under `key` while they live: made once however many plans
    bind them (an interpreter's plan for each set of input shapes), freed with the model."""
    found = cache.get(key)
    if found is None:
        found = cache[key] = make()
        for owner in owners:
            weakref.finalize(owner, cache.pop, key, None)
    return found


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


from . import (activations, array, attention, conv, einsum, geometry, image, loss, math, nn, norm,  # noqa: E402,F401
               optim, pool, quantize, random, reduce, rnn, select, shape, signal, state)  # (registration)
