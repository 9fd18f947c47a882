"""Activations that kernels apply to their own output in place (the `activation` attr)."""
from functools import partial

import numpy as np

from ... import ops


def with_activation(step, activation, out):
    """`step`, then `activation` (one of edgeflow.ops.registry.ACTIVATIONS) applied to `out`."""
    if not activation:
        return step
    if activation == "relu":
        act = partial(np.maximum, out, out.dtype.type(0), out=out)
    elif activation == "relu6":
        act = partial(np.clip, out, out.dtype.type(0), out.dtype.type(6), out=out)
    elif activation in ("swish", "hard_swish"):  # the activation ops' own kernels, in place
        from . import jit
        from .activations import FORMULAS, evaluate
        attrs = {"alpha": 1.0}
        act = jit.bind_activation(activation, out, out, attrs) or partial(evaluate, FORMULAS[activation], out,
                                                                          attrs, out)
    else:
        raise AssertionError(f"activation {activation!r} not in {ops.registry.ACTIVATIONS}")

    def run():
        step()
        act()
    return run
