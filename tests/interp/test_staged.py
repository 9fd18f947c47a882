"""Shapes that depend on values known only when running (TFLite's dynamic tensors): the
plan runs up to the op that needs them, runs that op on the values it gets, and plans the
rest for the shapes that gave. Results are checked against numpy."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import InvalidInputError
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp.staged import StagedPlan


def _runner(g, inputs, outputs):
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (inputs, outputs)})))
    return interp, interp.get_signature_runner("infer")


def _reshape_to_fed_shape():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        shape = ef.placeholder(ef.int64, [2], name="shape")
        y = ef.reshape(x * 2.0, shape, name="y")
        z = ef.reduce_sum(y, axis=1, name="z")
    return _runner(g, {"x": x, "shape": shape}, {"y": y, "z": z})


@pytest.mark.parametrize("n, shape", [(6, (2, 3)), (6, (3, -1)), (12, (1, 12)), (0, (0, 4))])
def test_reshape_to_a_fed_shape(n, shape):
    _, runner = _reshape_to_fed_shape()
    x = np.arange(n, dtype=np.float32)
    out = runner(x=x, shape=np.array(shape))
    np.testing.assert_array_equal(out["y"], (x * 2).reshape(shape))
    np.testing.assert_array_equal(out["z"], (x * 2).reshape(shape).sum(axis=1))
    assert isinstance(runner.last_plan, StagedPlan)


def test_the_rest_is_planned_once_per_shape():
    _, runner = _reshape_to_fed_shape()
    x = np.arange(6, dtype=np.float32)
    rests = []
    for shape in ((2, 3), (3, 2), (2, 3)):
        runner(x=x, shape=np.array(shape))
        rests.append(runner.last_plan.rest)
    assert rests[0] is rests[2] and rests[0] is not rests[1]


def test_a_bad_value_is_invalid_input_and_the_interpreter_goes_on():
    _, runner = _reshape_to_fed_shape()
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(InvalidInputError, match=r"reshape.*\(6\) to \(4, 3\)"):
        runner(x=x, shape=np.array([4, 3]))
    np.testing.assert_array_equal(runner(x=x, shape=np.array([3, 2]))["y"], (x * 2).reshape(3, 2))


def test_values_selected_by_nonzero():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        where = apply("squeeze", [apply("nonzero", [x])], {"axes": (0,)})
        y = ef.multiply(apply("gather", [x, where]), 3.0, name="y")
    _, runner = _runner(g, {"x": x}, {"y": y})
    rng = np.random.default_rng(0)
    for n in (1, 7, 30):
        xv = np.where(rng.random(n) < 0.5, 0, rng.standard_normal(n)).astype(np.float32)
        np.testing.assert_array_equal(runner(x=xv)["y"], xv[xv != 0] * 3)


def test_tensors_carried_past_stages_are_read_where_the_ops_before_made_them():
    """Two nonzero stages in a row, a tensor made before the first (x * 2 + 1) read after
    the second, and a small integer carried (its value assumed by the rest): each rest
    reads the carried tensor in the before plan's array (no copy per stage), across runs
    of new values and of a new rest (other shapes), against numpy."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        k = ef.placeholder(ef.int64, [1], name="k")
        made = ef.add(ef.multiply(x, 2.0), 1.0, name="made")
        first = apply("squeeze", [apply("nonzero", [ef.greater(x, 0.0)])], {"axes": (0,)})
        second = apply("squeeze", [apply("nonzero", [ef.greater(apply("gather", [x, first]), 1.0)])],
                       {"axes": (0,)})
        picked = apply("gather", [made, apply("gather", [first, second])])
        values, _ = apply("topk", [picked, k], {"axis": 0})
        y = ef.add(values, apply("reduce_sum", [made], {"keepdims": False}), name="y")
    _, runner = _runner(g, {"x": x, "k": k}, {"y": y})
    rng = np.random.default_rng(2)
    for n in (40, 40, 25):
        xv = (rng.standard_normal(n) * 2).astype(np.float32)
        m = xv * 2 + 1
        chosen = m[np.flatnonzero(xv > 0)[xv[xv > 0] > 1]]
        kv = min(3, len(chosen))
        got = runner(x=xv, k=np.array([kv]))["y"]
        np.testing.assert_allclose(got, -np.sort(-chosen)[:kv] + m.sum(), rtol=1e-6)
        plan = runner.last_plan
        inner = plan.rest
        assert isinstance(plan, StagedPlan) and isinstance(inner, StagedPlan)
        made_t = next(t for t in plan._carried if plan.subgraph.tensors[t].name == "made")
        assert inner.before.arrays[made_t] is plan.before.arrays[made_t]
        assert inner.rest.arrays[made_t] is plan.before.arrays[made_t]


def test_two_stages_and_the_profiler_times_every_op():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        shape = ef.placeholder(ef.int64, [2], name="shape")
        k = ef.placeholder(ef.int64, [1], name="k")
        values, _ = apply("topk", [ef.reshape(x, shape), k], {"axis": 1})
        y = ef.add(values, 1.0, name="y")
    interp, runner = _runner(g, {"x": x, "shape": shape, "k": k}, {"y": y})
    profiler = interp.enable_profiling()
    xv = np.random.default_rng(1).standard_normal(12).astype(np.float32)
    for rows, kv in ((3, 2), (2, 5), (4, 1)):
        got = runner(x=xv, shape=np.array([rows, -1]), k=np.array([kv]))["y"]
        np.testing.assert_array_equal(got, -np.sort(-xv.reshape(rows, -1), axis=1)[:, :kv] + 1)
    assert {r.opcode: r.calls for r in profiler.top()} == {"reshape": 3, "topk": 3, "add": 3}


@pytest.mark.parametrize("op, attrs, operand, reference", [
    ("squeeze", {}, np.array([1]), lambda x: x.squeeze(1)),
    ("expand_dims", {}, np.array([0, 3]), lambda x: x[None, :, :, None]),
    ("reduce_sum", {"keepdims": False}, np.array([0, 2]), lambda x: x.sum(axis=(0, 2))),
    ("reduce_max", {"keepdims": True}, np.array([-1]), lambda x: x.max(axis=-1, keepdims=True)),
    ("cumsum", {}, np.array(2), lambda x: np.cumsum(x, axis=2)),
])
def test_attributes_given_by_fed_operands(op, attrs, operand, reference):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, None, None], name="x")
        given = ef.placeholder(ef.int64, list(operand.shape), name="given")
        y = apply(op, [x, given], attrs, name="y")
    _, runner = _runner(g, {"x": x, "given": given}, {"y": y})
    xv = np.random.default_rng(2).standard_normal((3, 1, 4)).astype(np.float32)
    np.testing.assert_allclose(runner(x=xv, given=operand)["y"], reference(xv), rtol=1e-6)


def test_clip_bounds_fed_as_tensors():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        lo = ef.placeholder(ef.float32, [], name="lo")
        hi = ef.placeholder(ef.float32, [], name="hi")
        y = apply("clip", [x, lo, hi], name="y")
    _, runner = _runner(g, {"x": x, "lo": lo, "hi": hi}, {"y": y})
    xv = np.linspace(-3, 3, 13, dtype=np.float32)
    for bounds in ((-1.0, 2.0), (0.5, 0.75)):
        got = runner(x=xv, lo=np.float32(bounds[0]), hi=np.float32(bounds[1]))["y"]
        np.testing.assert_array_equal(got, np.clip(xv, *bounds))


def test_split_run_of_a_fed_shape_plans_for_its_value():
    """Interpreter.run (split inference) plans for a small fed integer tensor's value, as
    before: one plan per value rather than a staged one."""
    interp, _ = _reshape_to_fed_shape()
    out = interp.run(["y"], {"x": np.arange(6, dtype=np.float32), "shape": np.array([3, 2])})
    np.testing.assert_array_equal(out["y"], np.arange(6, dtype=np.float32).reshape(3, 2) * 2)
    assert not isinstance(list(interp._plans.values())[-1], StagedPlan)


@pytest.mark.parametrize("noop", [False, True])
def test_empty_fed_axes_reduce_all_or_none(noop):
    """ONNX's noop_with_empty_axes where the axes are fed: empty axes reduce every axis,
    or none (the input comes back) with noop; given axes reduce those either way."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, None], name="x")
        axes = ef.placeholder(ef.int64, [None], name="axes")
        y = apply("reduce_sum", [x, axes], {"keepdims": True, "noop_with_empty_axes": noop}, name="y")
    _, runner = _runner(g, {"x": x, "axes": axes}, {"y": y})
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(runner(x=xv, axes=np.zeros(0, np.int64))["y"],
                                  xv if noop else xv.sum(keepdims=True))
    np.testing.assert_array_equal(runner(x=xv, axes=np.array([1]))["y"], xv.sum(axis=1, keepdims=True))


def test_gradient_of_a_reduction_that_reduces_nothing():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2, 3], name="x")
        y = apply("reduce_sum", [x * x], {"noop_with_empty_axes": True})
        (dx,) = ef.gradients(ef.reduce_sum(y * 3.0), [x])
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(ef.Session(g).run(dx, {x: xv}), 6 * xv)  # d/dx sum(3 x^2)
