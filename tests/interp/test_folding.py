"""Values known while preparing (constants, shapes) are computed then, not when invoked."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import model as fm, writer


def _runner(g, inputs, outputs):
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (inputs, outputs)})))
    return interp, interp.get_signature_runner("infer")


def _executed(interp, runner):
    ops = interp.model.subgraphs[0].operators
    return [ops[i].opcode for i in runner.last_plan.step_ops]


def test_shape_chain_is_folded_per_input_shape():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        batch = ef.shape(x)[0:1]
        target = ef.concat([batch, ef.constant(np.array([2, 2], np.int64))], axis=0)
        y = ef.reshape(x * 2.0, target, name="y")
        zeros = ef.fill(ef.concat([ef.shape(x)[0:1], ef.constant(np.array([3], np.int64))], 0), 0.5)
        z = ef.reduce_sum(zeros, axis=1, name="z")
    assert len(y.shape) == 3  # values from a dynamic shape are known only when preparing
    interp, runner = _runner(g, {"x": x}, {"y": y, "z": z})
    for n in (1, 3, 6):
        xv = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        out = runner(x=xv)
        np.testing.assert_array_equal(out["y"], (xv * 2).reshape(n, 2, 2))
        np.testing.assert_array_equal(out["z"], np.full(n, 1.5, np.float32))
        assert sorted(_executed(interp, runner)) == ["mul"]  # everything else was known


def test_range_over_a_dynamic_length():
    g = ef.Graph()
    with g.as_default():
        tokens = ef.placeholder(ef.int64, [None, None], name="tokens")
        positions = ef.range(ef.constant(np.int64(0)), ef.shape(tokens)[1], ef.constant(np.int64(1)))
        y = ef.add(tokens, positions, name="y")
    _, runner = _runner(g, {"tokens": tokens}, {"y": y})
    for b, s in ((1, 5), (2, 9)):
        tv = np.ones((b, s), np.int64)
        np.testing.assert_array_equal(runner(tokens=tv)["y"], tv + np.arange(s))


def test_ops_on_constants_run_once_for_all_plans():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 5], name="x")
        wt = ef.transpose(ef.constant(w), name="wt")
        y = ef.matmul(x, wt, name="y")
    interp, runner = _runner(g, {"x": x}, {"y": y})
    plans = []
    for n in (2, 7):
        xv = rng.standard_normal((n, 5)).astype(np.float32)
        np.testing.assert_allclose(runner(x=xv)["y"], xv @ w.T, rtol=1e-5)
        assert _executed(interp, runner) == ["matmul"]
        plans.append(runner.last_plan)
    index = next(i for i, t in enumerate(interp.model.subgraphs[0].tensors) if t.name == "wt")
    assert plans[0].arrays[index] is plans[1].arrays[index]  # folded once, shared


@pytest.mark.parametrize("axis", [None, 0])
def test_quantized_constants_are_dequantized(axis):
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (4, 3)).astype(np.int8)
    if axis is None:
        quant, real = fm.QuantizationDef((0.05,), (2,)), (q.astype(np.float32) - 2) * 0.05
    else:
        scales, zeros = (0.1, 0.2, 0.05, 0.5), (0, 1, -1, 3)
        quant = fm.QuantizationDef(scales, zeros, axis=0)
        real = (q.astype(np.float32) - np.array(zeros, np.float32)[:, None]) \
            * np.array(scales, np.float32)[:, None]
    tensors = [fm.TensorDef("x", np.dtype(np.float32), (-1, 4)),
               fm.TensorDef("w", np.dtype(np.int8), (4, 3), q, quantization=quant),
               fm.TensorDef("y", np.dtype(np.float32), (-1, 3))]
    ops = [fm.OperatorDef("matmul", [0, 1], [2], {})]
    model = fm.ModelDef([fm.SubGraphDef("main", tensors, ops, [0], [2])],
                        [fm.SignatureDef("infer", {"x": 0}, {"y": 2})])
    runner = ef.Interpreter(writer.to_bytes(model)).get_signature_runner("infer")
    xv = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(runner(x=xv)["y"], xv @ real, rtol=1e-5, atol=1e-6)
