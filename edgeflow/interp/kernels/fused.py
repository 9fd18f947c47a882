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
    else:
        raise AssertionError(f"activation {activation!r} not in {ops.registry.ACTIVATIONS}")

    def run():
        step()
        act()
    return run
