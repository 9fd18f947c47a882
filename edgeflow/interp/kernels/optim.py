"""Kernels of edgeflow/ops/optim.py: numba's one pass where it is there, else numpy's ops
in the unfused graph's order (the same rounding either way)."""
from functools import partial

import numpy as np

from ..arena import scratch
from . import jit, kernel


def _adam_numpy(m, v, grad, var, outs, scalars, tmp):
    b1, ob1, b2, ob2, eps, wd, lr, c1, c2 = scalars
    new_m, new_v, delta = outs
    np.multiply(m, b1, out=new_m)
    np.multiply(grad, ob1, out=tmp)
    np.add(new_m, tmp, out=new_m)
    np.multiply(v, b2, out=new_v)
    np.multiply(grad, ob2, out=tmp)
    np.multiply(tmp, grad, out=tmp)
    np.add(new_v, tmp, out=new_v)
    np.divide(new_v, c2, out=delta)
    np.sqrt(delta, out=delta)
    np.add(delta, eps, out=delta)
    np.divide(new_m, c1, out=tmp)
    np.multiply(tmp, lr, out=tmp)
    np.divide(tmp, delta, out=delta)
    if var is not None:
        np.multiply(var, lr * wd, out=tmp)
        np.add(delta, tmp, out=delta)


@kernel("adam_update")
def _adam_update(ins, outs, attrs):
    """lr and the bias corrections are read into the scalars' array before each run."""
    m, v, grad, lr, c1, c2 = ins[:6]
    var = ins[6] if len(ins) > 6 else None
    dtype = m.dtype.type
    b1, b2 = dtype(attrs["beta1"]), dtype(attrs["beta2"])
    scalars = np.array([b1, dtype(1) - b1, b2, dtype(1) - b2, attrs["epsilon"], attrs["weight_decay"], 0, 0, 0],
                       m.dtype)
    live = scalars[6:]
    step = jit.bind_adam(m, v, grad, var, outs, scalars)
    if step is None:
        step = partial(_adam_numpy, m, v, grad, var, outs, scalars, scratch(m.shape, m.dtype))

    def run():
        live[0], live[1], live[2] = lr, c1, c2
        step()
    return run
