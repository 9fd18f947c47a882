"""optimize.fuse_swish: ONNX's SiLU (Sigmoid then Mul(x, sigmoid)) converts to one swish op,
with onnxruntime's results, and a trainable conversion of it trains as the unfused graph does."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.graph import optimize


def _model():
    """Gemm, then x * sigmoid(x), sigmoid(x) * x (the other operand order), and a sigmoid read
    twice (by its Mul and by an Add: not fused), then a Gemm to the output."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((5, 9)).astype(np.float32), "b1": rng.standard_normal(9).astype(np.float32),
             "w2": rng.standard_normal((9, 3)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Sigmoid", ["h"], ["s1"]), helper.make_node("Mul", ["h", "s1"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["s2"]), helper.make_node("Mul", ["s2", "a"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["s3"]), helper.make_node("Mul", ["b", "s3"], ["c"]),
             helper.make_node("Add", ["c", "s3"], ["d"]),
             helper.make_node("Gemm", ["d", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_silu_becomes_swish_with_onnxruntime_results(tmp_path):
    model = _model()
    fused = onnx_converter.convert(model, tmp_path / "f.efl")
    plain = onnx_converter.convert(model, tmp_path / "p.efl", optimize=False)
    assert plain.ops["sigmoid"] == 3 and plain.ops["mul"] == 3 and "swish" not in plain.ops
    assert fused.ops["swish"] == 2 and fused.ops["sigmoid"] == 1 and fused.ops["mul"] == 1
    assert sum(fused.ops.values()) == sum(plain.ops.values()) - 2
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    runner = ef.Interpreter(tmp_path / "f.efl").get_signature_runner("infer")
    for n in (1, 7):
        x = (np.random.default_rng(n).standard_normal((n, 5)) * 4).astype(np.float32)
        expected = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(runner(x=x)["y"], expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def _train(tmp_path, name, batches):
    result = onnx_converter.convert(_model(), tmp_path / f"{name}.efl", trainable=True, loss="mse",
                                    optimizer="sgd:0.05")
    interp = ef.Interpreter(tmp_path / f"{name}.efl")
    train = interp.get_signature_runner("train")
    losses = [float(train(x=x, labels=y)["loss"]) for x, y in batches]
    return result, losses, interp.variables()


def test_trainable_swish_trains_as_sigmoid_times_x(tmp_path, monkeypatch):
    """swish's gradient (ops/activations.py) against the chain rule through sigmoid and mul:
    the same losses and weights after three SGD steps."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32))
               for _ in range(3)]
    fused, fused_losses, fused_vars = _train(tmp_path, "fused", batches)
    monkeypatch.setattr(optimize, "fuse_swish", lambda graph, signatures: signatures)
    plain, plain_losses, plain_vars = _train(tmp_path, "plain", batches)
    assert fused.ops["swish"] == 2 and "swish" not in plain.ops
    np.testing.assert_allclose(fused_losses, plain_losses, rtol=1e-5)
    assert fused_losses[-1] < fused_losses[0]
    assert fused_vars.keys() == plain_vars.keys() == {"w1", "b1", "w2"}
    for k in fused_vars:
        np.testing.assert_allclose(fused_vars[k], plain_vars[k], rtol=1e-5, atol=1e-6)
