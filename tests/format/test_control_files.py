"""Hostile control flow in files: subgraph references that loop, leave the model or
disagree with the op are FormatErrors, and a loop that never ends stops at its bound."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import FormatError
from edgeflow.format import reader, writer


@pytest.fixture
def unchecked(monkeypatch):
    """`to_bytes` without the writer's final verification, to write broken graphs."""
    monkeypatch.setattr(writer.verifier, "verify", lambda *args, **kwargs: None)
    return writer.to_bytes


def _model():
    """main: while(i, x) whose body holds an if; int32 values, so dtypes are explicit."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.int32, [2], name="x")

        def body(i, v):
            return i + 1, ef.cond(ef.reduce_sum(v) > 10, lambda: v - 1, lambda: v * 2)
        _, y = ef.while_loop(lambda i, v: i < 5, body, [ef.constant(0), x])
    model = ef.to_model(g, {"infer": ({"x": x}, {"y": y})})
    names = [s.name for s in model.subgraphs]
    assert names == ["main", "cond", "body", "then_branch", "else_branch"], names
    return model


def _op(model, subgraph, opcode):
    return next(op for op in model.subgraphs[subgraph].operators if op.opcode == opcode)


def test_the_model_itself_is_valid():
    model = reader.load(writer.to_bytes(_model()))
    run = ef.Interpreter(writer.to_bytes(model)).get_signature_runner("infer")
    v = np.array([1, 2], np.int32)
    for _ in range(5):
        v = v - 1 if v.sum() > 10 else v * 2
    np.testing.assert_array_equal(run(x=np.array([1, 2], np.int32))["y"], v)


@pytest.mark.parametrize("target,message", [
    (2, r"subgraph 2 'body': runs itself: subgraphs 2 -> 2"),
    (0, r"subgraph 0 'main': runs itself: subgraphs 0 -> 2 -> 0"),
    (5, r"attribute 'then_branch' names subgraph 5, but the model has 5"),
])
def test_a_branch_that_leads_back_or_nowhere(unchecked, target, message):
    model = _model()
    _op(model, 2, "if").attrs["then_branch"] = target
    with pytest.raises(FormatError, match=message):
        reader.load(unchecked(model))


def test_a_negative_subgraph_index():
    # main: KeyError from the verifier (found by tests/interp/test_fuzz_interpreter.py)
    from .patch import Patcher
    data = writer.to_bytes(_model())
    p = Patcher(data)
    model = reader.load(data)
    k, i = next((k, i) for k, sg in enumerate(model.subgraphs) for i, op in enumerate(sg.operators)
                if op.opcode == "if")
    op = p.model.Subgraphs(k).Operators(i)
    attr = next(op.Attrs(j) for j in range(op.AttrsLength()) if op.Attrs(j).Name() == b"then_branch")
    p.set(attr, "Attr", "i", "q", -3)
    with pytest.raises(FormatError, match=r"attribute 'then_branch' names subgraph -3, but the model has 5"):
        reader.load(p.bytes())


def test_a_while_body_that_runs_itself(unchecked):
    model = _model()
    _op(model, 0, "while").attrs["cond"] = 0
    with pytest.raises(FormatError, match=r"'main': runs itself: subgraphs 0 -> 0"):
        reader.load(unchecked(model))


def test_branches_whose_outputs_disagree_in_dtype(unchecked):
    model = _model()
    other = model.subgraphs[4]
    other.tensors[other.outputs[0]].dtype = np.dtype(np.int64)
    with pytest.raises(FormatError, match=r"operator \d+ 'if': else_branch outputs: \(int64\) where \(int32\)"):
        reader.load(unchecked(model))


def test_a_loop_whose_body_changes_a_dtype_or_drops_a_variable(unchecked):
    model = _model()
    body = model.subgraphs[2]
    body.outputs = body.outputs[:1]
    with pytest.raises(FormatError, match=r"body gives 1 outputs; it must give the 2 loop variables first"):
        reader.load(unchecked(model))


def test_a_condition_that_is_not_bool_and_a_negative_bound(unchecked):
    model = _model()
    cond = model.subgraphs[1]
    cond.outputs = [cond.inputs[0]]
    with pytest.raises(FormatError, match=r"cond outputs: \(int32\) where \(bool\)"):
        reader.load(unchecked(model))
    model = _model()
    _op(model, 0, "while").attrs["maximum_iterations"] = -7
    with pytest.raises(FormatError, match="maximum_iterations is -7"):
        reader.load(unchecked(model))


def test_a_subgraph_run_by_an_op_may_not_hold_variables(unchecked):
    model = _model()
    body = model.subgraphs[2]
    const = next(t for t in body.tensors if t.data is not None)
    const.is_variable = True
    with pytest.raises(FormatError, match="'body': is run by an op but holds variable"):
        reader.load(unchecked(model))


def test_an_endless_loop_with_a_bound_stops_at_the_bound():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [3], name="x")
        y = ef.while_loop(lambda v: ef.equal(ef.reduce_sum(v), ef.reduce_sum(v)), lambda v: v + 1.0, x,
                          maximum_iterations=1000)
    run = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})}))).get_signature_runner("infer")
    np.testing.assert_array_equal(run(x=np.zeros(3, np.float32))["y"], [1000, 1000, 1000])
