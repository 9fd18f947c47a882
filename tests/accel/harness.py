"""Helpers for the OpenCL kernel tests: one-op models run with and without the delegate."""
import numpy as np

import edgeflow as ef
from edgeflow.format.writer import to_bytes
from edgeflow.graph.math_ops import apply


def one_op_model(op, arrays, attrs=None):
    """The bytes of a model computing y = op(x0, x1, ...), every array fed as an input."""
    g = ef.Graph()
    with g.as_default():
        feeds = {f"x{i}": ef.placeholder(a.dtype, a.shape, name=f"x{i}") for i, a in enumerate(arrays)}
        y = apply(op, list(feeds.values()), attrs)
    return to_bytes(ef.to_model(g, {"infer": (feeds, {"y": y})}))


def run_numpy(op, arrays, attrs=None):
    """op on `arrays` by the numpy kernels."""
    values = {f"x{i}": a for i, a in enumerate(arrays)}
    return ef.Interpreter(one_op_model(op, arrays, attrs)).get_signature_runner("infer")(**values)["y"]


def run_both(delegate, op, arrays, attrs=None, on_device=True):
    """(numpy result, OpenCL result, plan) of op on `arrays` (all fed as inputs).

    With `on_device`, asserts that every op ran on OpenCL (empty tensors excepted: they
    stay on the CPU, with that reason).
    """
    model = one_op_model(op, arrays, attrs)
    values = {f"x{i}": a for i, a in enumerate(arrays)}
    want = ef.Interpreter(model).get_signature_runner("infer")(**values)["y"]
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    got = runner(**values)["y"]
    plan = runner.last_plan
    if not want.size:
        assert all("empty tensor" in why for why in plan.fallbacks.values()), plan.fallbacks
    elif on_device:
        assert set(plan.placement.values()) == {"opencl"}, (plan.placement_summary(), plan.fallbacks)
    assert got.dtype == want.dtype and got.shape == want.shape
    return want, got, plan


def randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)
