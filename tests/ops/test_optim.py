"""adam_update (edgeflow/ops/optim.py): one Adam step against numpy's expression of it in
the unfused graph's order (bit for bit), float64 arithmetic (close), numba's loop against
the numpy path, pieces over workers, and its checks. Whole training runs against a numpy
Adam are in tests/graph/test_train.py."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import run_op

ATTRS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def adam_expression(m, v, g, lr, c1, c2, var=None, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0):
    """The step as numpy computes the unfused graph's ops, one at a time, in m's dtype."""
    t = m.dtype.type
    b1, b2 = t(beta1), t(beta2)
    new_m = b1 * m + (t(1) - b1) * g
    new_v = b2 * v + (t(1) - b2) * g * g
    delta = lr * (new_m / c1) / (np.sqrt(new_v / c2) + t(epsilon))
    if weight_decay:
        delta = delta + lr * t(weight_decay) * var
    return new_m, new_v, delta


def _case(rng, shape, dtype, step=3):
    m = (rng.standard_normal(shape) * 0.1).astype(dtype)
    v = (rng.random(shape) * 0.01).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    g.reshape(-1)[:3] = 0  # a zero gradient
    lr = np.asarray(0.003, dtype)
    c1, c2 = (np.asarray(1 - b ** step, dtype) for b in (0.9, 0.999))
    return m, v, g, lr, c1, c2


@pytest.mark.parametrize("jit_on", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 0.25])
def test_adam_update_is_the_unfused_step(rng, monkeypatch, jit_on, dtype, weight_decay):
    monkeypatch.setenv("EDGEFLOW_JIT", "1" if jit_on else "0")
    m, v, g, lr, c1, c2 = _case(rng, (37, 5), dtype)
    var = rng.standard_normal((37, 5)).astype(dtype)
    attrs = {**ATTRS, "weight_decay": weight_decay}
    ins = [m, v, g, lr, c1, c2] + ([var] if weight_decay else [])
    got = run_op(lambda *t: apply("adam_update", list(t), attrs), *ins)
    want = adam_expression(m, v, g, lr, c1, c2, var, weight_decay=weight_decay)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)
    held = {k: float(dtype(x)) for k, x in (("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8),
                                             ("weight_decay", weight_decay))}  # the constants as the dtype holds them
    exact = adam_expression(*(x.astype(np.float64) for x in (m, v, g, lr, c1, c2, var)), **held)
    for a, b in zip(got, exact):  # the sums cancel in places: an absolute part, of the largest value
        tol = 1e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(a, b, rtol=10 * tol, atol=tol * np.abs(b).max())


def test_adam_update_over_workers_equals_one_thread(rng):
    """A variable large enough to split into pieces over 3 threads (whole cache lines)."""
    m, v, g, lr, c1, c2 = _case(rng, (601, 517), np.float32)  # past threads.MIN_ELEMENTS
    g = ef.Graph()
    grad = rng.standard_normal(m.shape).astype(np.float32)
    with g.as_default():
        holders = [ef.placeholder(ef.float32, a.shape, name=n) for a, n in zip((m, v, grad, lr, c1, c2),
                                                                               "m v g lr c1 c2".split())]
        outs = apply("adam_update", holders, ATTRS)
    package = ef.to_model(g, {"infer": ({h.name.split(":")[0]: h for h in holders},
                                        {k: t for k, t in zip(("m2", "v2", "d"), outs)})})
    from edgeflow.format.writer import to_bytes
    blob = to_bytes(package)
    feeds = dict(zip("m v g lr c1 c2".split(), (m, v, grad, lr, c1, c2)))
    from edgeflow.interp import threads
    assert m.size >= threads.MIN_ELEMENTS
    one = ef.Interpreter(blob, num_threads=1).get_signature_runner("infer")(**feeds)
    three = ef.Interpreter(blob, num_threads=3).get_signature_runner("infer")(**feeds)
    want = adam_expression(m, v, grad, lr, c1, c2)
    for k, w in zip(("m2", "v2", "d"), want):
        np.testing.assert_array_equal(one[k], w)
        np.testing.assert_array_equal(three[k], w)


@pytest.mark.parametrize("shapes, attrs, message", [
    ([(2, 3), (2, 4), (2, 3), (), (), ()], {}, "m and v"),
    ([(2, 3), (2, 3), (3, 2), (), (), ()], {}, "grad"),
    ([(2, 3), (2, 3), (2, 3), (1,), (), ()], {}, "lr must be a scalar"),
    ([(2, 3), (2, 3), (2, 3), (), (), ()], {"weight_decay": 0.1}, "weight_decay"),
    ([(2, 3), (2, 3), (2, 3), (), (), (), (2, 3)], {}, "weight_decay"),
])
def test_adam_update_checks(graph, shapes, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply("adam_update", [ef.placeholder("float32", s) for s in shapes], {**ATTRS, **attrs})
