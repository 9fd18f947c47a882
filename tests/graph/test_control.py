"""ef.cond, ef.case, ef.while_loop and ef.map_fn: built into subgraphs, run through a
Session and through a saved package, against plain Python/numpy; their gradients
against float64 finite differences (gradcheck.py)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.ops.control import check_subgraphs

from .gradcheck import check_gradients


def _run(build, feeds):
    """Build `build(*placeholders) -> dict of tensors` and run it through a Session."""
    g = ef.Graph()
    with g.as_default():
        phs = [ef.placeholder(np.asarray(v).dtype, np.shape(v), name=f"in{k}") for k, v in enumerate(feeds)]
        outs = build(*phs)
        sess = ef.Session()
    return sess.run(outs, dict(zip(phs, feeds)))


def _package(tmp_path, build, feeds):
    """The same, saved as a package and run by the Interpreter."""
    g = ef.Graph()
    with g.as_default():
        phs = [ef.placeholder(np.asarray(v).dtype, [None] * np.ndim(v), name=f"in{k}") for k, v in enumerate(feeds)]
        outs = build(*phs)
    ef.save(g, tmp_path / "m.efl", {"infer": ({f"in{k}": p for k, p in enumerate(phs)}, outs)})
    return ef.Interpreter(str(tmp_path / "m.efl")).get_signature_runner("infer")


# -- cond and case ---------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_runs_the_branch_taken(sign):
    x = sign * np.arange(1, 4, dtype=np.float32)
    w = np.full((5, 3), 0.5, np.float32)  # large enough to be captured as an input, not copied

    def build(xp):
        wc = ef.constant(w)
        return {"y": ef.cond(ef.reduce_sum(xp) > 0, lambda: ef.reduce_sum(wc * xp, axis=1), lambda: xp * 3.0)}
    got = _run(build, [x])["y"]
    want = (w * x).sum(1) if x.sum() > 0 else x * 3
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cond_branches_with_other_shapes_through_a_package(tmp_path):
    def build(x, n):
        return {"y": ef.cond(n > 2, lambda: ef.concat([x, x], 0), lambda: x[:1])}
    run = _package(tmp_path, build, [np.zeros(3, np.float32), np.int32(0)])
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run(in0=x, in1=np.int32(5))["y"], np.concatenate([x, x]))
    np.testing.assert_array_equal(run(in0=x, in1=np.int32(1))["y"], x[:1])
    np.testing.assert_array_equal(run(in0=x[:2], in1=np.int32(9))["y"], np.concatenate([x[:2], x[:2]]))


def test_nested_cond_captures_from_two_levels():
    def build(x, a, b):
        outer = x * 2.0

        def inner_true():
            return ef.cond(b, lambda: outer + x, lambda: outer - x)
        return {"y": ef.cond(a, inner_true, lambda: -outer)}
    x = np.array([1.0, -2.0], np.float32)
    for a in (True, False):
        for b in (True, False):
            got = _run(build, [x, np.bool_(a), np.bool_(b)])["y"]
            want = (2 * x + x if b else 2 * x - x) if a else -2 * x
            np.testing.assert_allclose(got, want)


def test_cond_returns_structures():
    def build(x):
        return {"pair": ef.cond(ef.reduce_sum(x) > 0, lambda: (x + 1.0, [x * 2.0]), lambda: (x - 1.0, [x * 3.0]))}
    first, (second,) = _run(build, [np.ones(2, np.float32)])["pair"]
    np.testing.assert_allclose(first, 2.0)
    np.testing.assert_allclose(second, 2.0)


def test_case_takes_the_first_true_predicate():
    def build(x):
        return {"y": ef.case([(x < 0, lambda: ef.constant(-1)), (x < 10, lambda: ef.constant(1))],
                             default=lambda: ef.constant(100))}
    assert [int(_run(build, [np.int32(v)])["y"]) for v in (-5, 5, 50)] == [-1, 1, 100]


def test_cond_refuses_what_tensorflow_refuses():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2])
        with pytest.raises(GraphError, match="bool scalar"):
            ef.cond(x, lambda: x, lambda: x)
        with pytest.raises(GraphError, match="different structures"):
            ef.cond(x[0] > 0, lambda: (x, x), lambda: x)
        with pytest.raises(GraphError, match=r"else_branch outputs: \(int32\) where \(float32\)"):
            ef.cond(x[0] > 0, lambda: x, lambda: ef.cast(x, ef.int32))
        with pytest.raises(GraphError, match="variables inside cond or while_loop"):
            ef.cond(x[0] > 0, lambda: ef.Variable(np.zeros(2, np.float32)) + x, lambda: x)
        inner = {}
        ef.cond(x[0] > 0, lambda: inner.setdefault("t", x * 2.0), lambda: x)
        with pytest.raises(GraphError, match="does not enclose"):
            ef.cond(x[0] > 0, lambda: inner["t"] + 1.0, lambda: x)


# -- while_loop and map_fn --------------------------------------------------------------

def test_while_loop_counts_and_accumulates():
    def build(x, n):
        i, acc = ef.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a * 0.5 + x), [ef.constant(0), x])
        return {"i": i, "acc": acc}
    x = np.array([1.0, 4.0], np.float32)
    for n in (0, 1, 7):
        got = _run(build, [x, np.int32(n)])
        want = x.copy()
        for _ in range(n):
            want = want * 0.5 + x
        assert int(got["i"]) == n
        np.testing.assert_allclose(got["acc"], want, rtol=1e-6)


def test_loop_variable_that_grows_needs_a_shape_invariant(tmp_path):
    def grow(n, invariant):
        return ef.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, ef.concat([s, ef.cast(ef.reshape(i, [1]), ef.float32)], 0)),
                             [ef.constant(0), ef.constant(np.zeros(1, np.float32))],
                             shape_invariants=invariant)
    g = ef.Graph()
    with g.as_default():
        n = ef.placeholder(ef.int32, [])
        with pytest.raises(GraphError, match="shape_invariants"):
            grow(n, None)
    run = _package(tmp_path, lambda n: {"s": grow(n, [(), (None,)])[1]}, [np.int32(0)])
    for count in (0, 3, 6):
        np.testing.assert_array_equal(run(in0=np.int32(count))["s"], np.concatenate([[0.0], np.arange(count)]))


def test_maximum_iterations_bounds_a_loop_that_would_not_end(tmp_path):
    def build(x, limit):
        static = ef.while_loop(lambda v: ef.reduce_sum(v) > -1.0, lambda v: v + 1.0, x, maximum_iterations=4)
        dynamic = ef.while_loop(lambda v: ef.reduce_sum(v) > -1.0, lambda v: v + 1.0, x, maximum_iterations=limit)
        return {"static": static, "dynamic": dynamic}
    run = _package(tmp_path, build, [np.zeros(2, np.float32), np.int32(0)])
    got = run(in0=np.zeros(2, np.float32), in1=np.int32(9))
    np.testing.assert_array_equal(got["static"], [4, 4])
    np.testing.assert_array_equal(got["dynamic"], [9, 9])


def test_map_fn_against_numpy(tmp_path):
    def build(m, v):
        doubled, summed = ef.map_fn(lambda ab: (ab[0] * 2.0, ab[1] + ab[0]), (m, m))
        return {"rows": ef.map_fn(lambda row: ef.reduce_sum(row * v), m), "doubled": doubled, "summed": summed}
    run = _package(tmp_path, build, [np.zeros((1, 3), np.float32), np.zeros(3, np.float32)])
    rng = np.random.default_rng(0)
    v = rng.standard_normal(3).astype(np.float32)
    for rows in (0, 1, 5):
        m = rng.standard_normal((rows, 3)).astype(np.float32)
        got = run(in0=m, in1=v)
        np.testing.assert_allclose(got["rows"], m @ v, rtol=1e-5, atol=1e-6)
        assert got["rows"].shape == (rows,)
        np.testing.assert_allclose(got["doubled"], m * 2)
        np.testing.assert_allclose(got["summed"], m + m)


def test_while_loop_refuses_a_body_that_changes_dtype_or_count():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2])
        with pytest.raises(GraphError, match="enters as float32 and body_fn makes it int32"):
            ef.while_loop(lambda v: ef.reduce_sum(v) < 3.0, lambda v: ef.cast(v, ef.int32), [x])
        with pytest.raises(GraphError, match="returns 2 loop variables for 1"):
            ef.while_loop(lambda v: ef.reduce_sum(v) < 3.0, lambda v: (v, v), [x])
        with pytest.raises(GraphError, match="bool scalar"):
            ef.while_loop(lambda v: v, lambda v: v, [x])


def test_check_subgraphs_names_each_disagreement():
    f, i, b = np.dtype("float32"), np.dtype("int32"), np.dtype("bool")
    sigs = {"cond": ([f, i], [f]), "body": ([f, i], [f, f, f])}
    problems = check_subgraphs("while", {}, [f, i], [f, i, f], lambda name: sigs[name])
    assert problems == ["cond outputs: (float32) where (bool) is expected",
                        "body outputs (the loop variables): (float32, float32) where (float32, int32) is expected"]
    assert check_subgraphs("while", {}, [f], [i], lambda name: ([f], [b] if name == "cond" else [f])) == [
        "outputs: (int32) where (float32) is expected"]
    assert check_subgraphs("if", {}, [b, f], [f], lambda name: ([f], [f])) == []


# -- gradients --------------------------------------------------------------------------

def test_gradient_through_cond_follows_the_branch_taken():
    w = np.random.default_rng(1).standard_normal((3, 3))
    for x in (np.array([0.5, 1.0, 0.2]), np.array([-0.5, -1.0, 0.2])):
        check_gradients(lambda x, w: ef.cond(ef.reduce_sum(x) > 0, lambda: ef.tanh(ef.matmul(w, ef.reshape(x, [3, 1]))),
                                             lambda: ef.reshape(x * x * ef.reduce_sum(w), [3, 1])), x, w)


def test_gradient_through_while_loop_with_captured_weights():
    rng = np.random.default_rng(2)

    def rnn(x, w):
        _, h = ef.while_loop(lambda i, h: i < 4, lambda i, h: (i + 1, ef.tanh(ef.matmul(w, h)) + 0.1 * h),
                             [ef.constant(0), ef.reshape(x, [3, 1])])
        return h
    check_gradients(rnn, rng.standard_normal(3), rng.standard_normal((3, 3)))


def test_gradient_through_a_loop_whose_trip_count_depends_on_the_data():
    """Doubling x until its norm passes 10: the number of iterations depends on x (and is
    the same for x +- h), so d(result)/dx = 2**iterations * I, times the weights."""
    def doubling(x):
        return ef.while_loop(lambda v: ef.reduce_sum(v * v) < 100.0, lambda v: v * 2.0 + ef.sin(v) * 0.1, x)
    for x in (np.array([0.3, -0.2]), np.array([3.0, 1.0]), np.array([20.0, 0.0])):
        check_gradients(doubling, x)


def test_gradient_through_map_fn_and_nested_loops():
    rng = np.random.default_rng(3)

    def nested(m, v):
        def row(r):
            return ef.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, ef.sin(a) * v + r), [ef.constant(0), r])[1]
        return ef.map_fn(row, m)
    check_gradients(nested, rng.standard_normal((4, 2)), rng.standard_normal(2))


def test_gradient_through_a_cond_inside_a_loop():
    def switching(x):
        def body(i, v):
            return i + 1, ef.cond(ef.reduce_sum(v) > 0, lambda: v * v - 1.0, lambda: ef.exp(v))
        return ef.while_loop(lambda i, v: i < 3, body, [ef.constant(0), x])[1]
    check_gradients(switching, np.array([0.7, -0.2]))
