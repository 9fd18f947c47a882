"""Inputs for a signature, for tools that run a model without real data (profiling,
benchmarks): the runner to call, and random arrays of its declared dtypes and shapes."""
import numpy as np

from .. import dtypes
from ..errors import InvalidInputError


def pick_signature(interp, key=None):
    """The runner for `key`; by default 'infer', or the only signature."""
    sigs = interp.get_signature_list()
    if key is None:
        key = "infer" if "infer" in sigs or len(sigs) != 1 else next(iter(sigs))
    return interp.get_signature_runner(key)


def random_inputs(runner, given, seed=0, shapes=None):
    """Inputs for a runner: the given arrays, random ones for the rest, of `shapes`
    ({name: shape}) where given, else of the declared shapes with dynamic dims 1."""
    rng = np.random.default_rng(seed)
    out = dict(given)
    shapes = shapes or {}
    unknown = sorted(set(shapes) - set(runner.get_input_details()))
    if unknown:
        raise InvalidInputError(f"no input(s) {unknown}; the inputs are {sorted(runner.get_input_details())}")
    for name, d in runner.get_input_details().items():
        if name in out:
            continue
        dt, shape = np.dtype(d["dtype"]), tuple(shapes.get(name, d["shape"]))
        if dt == dtypes.bfloat16:
            out[name] = dtypes.narrow(rng.standard_normal(shape))
        elif dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            out[name] = rng.integers(0, 2, shape).astype(dt)
    return out
