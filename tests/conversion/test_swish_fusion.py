"""optimize.fuse_swish: ONNX's SiLU (Sigmoid then Mul(x, sigmoid)) converts to one swish op,
fused into the op before it where that op is its input's only reader (fuse_activations),
with onnxruntime's results, and a trainable conversion of it trains as the unfused graph does."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import reader
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
    return _onnx(nodes, ["n", 5], ["n", 3], inits)


def _onnx(nodes, x_shape, y_shape, inits):
    """An opset-17 model of `nodes` from float input x to float output y."""
    graph = helper.make_graph(nodes, "model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_silu_becomes_swish_with_onnxruntime_results(tmp_path):
    model = _model()
    fused = onnx_converter.convert(model, tmp_path / "f.efl")
    plain = onnx_converter.convert(model, tmp_path / "p.efl", optimize=False)
    assert plain.ops["sigmoid"] == 3 and plain.ops["mul"] == 3 and "swish" not in plain.ops
    # Two SiLUs become swish ops; the first, on the Gemm's output, then fuses into it (the
    # bias add's fused activation); the sigmoid read twice stays.
    assert fused.ops["swish"] == 1 and fused.ops["sigmoid"] == 1 and fused.ops["mul"] == 1
    assert sum(fused.ops.values()) == sum(plain.ops.values()) - 3
    ops = reader.load(tmp_path / "f.efl").subgraphs[0].operators
    assert [op.opcode for op in ops if op.attrs.get("activation") == "swish"] == ["add"]
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


def _conv_model():
    """MobileNetV3's and EfficientNet's pattern: Conv then HardSwish, Conv then SiLU, and a
    HardSwish whose input an Add also reads (not fused: the conv's output must stay)."""
    rng = np.random.default_rng(1)
    inits = {f"w{k}": rng.standard_normal((4, 4 if k else 3, 3, 3)).astype(np.float32) * 0.5 for k in range(3)}
    inits.update({f"b{k}": rng.standard_normal(4).astype(np.float32) for k in range(3)})
    conv = lambda k, x, y: helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [y], pads=[1, 1, 1, 1])  # noqa: E731
    nodes = [conv(0, "x", "c0"), helper.make_node("HardSwish", ["c0"], ["h0"]),
             conv(1, "h0", "c1"), helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["h1"]),
             conv(2, "h1", "c2"), helper.make_node("HardSwish", ["c2"], ["h2"]), helper.make_node("Add", ["h2", "c2"], ["y"])]
    return _onnx(nodes, [1, 3, 9, 9], [1, 4, 9, 9], inits)


def test_swish_and_hard_swish_fuse_into_the_conv_before_them_with_onnxruntime_results(tmp_path):
    model = _conv_model()
    result = onnx_converter.convert(model, tmp_path / "c.efl")
    ops = reader.load(tmp_path / "c.efl").subgraphs[0].operators
    assert [op.attrs.get("activation") for op in ops if op.opcode == "conv"] == ["hard_swish", "swish", ""]
    assert result.ops["hard_swish"] == 1 and "swish" not in result.ops and "sigmoid" not in result.ops
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(2).standard_normal((1, 3, 9, 9)) * 3).astype(np.float32)
    expected = session.run(None, {"x": x})[0]
    got = ef.Interpreter(tmp_path / "c.efl").get_signature_runner("infer")(x=x)["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_an_op_with_a_fused_swish_cannot_be_differentiated():
    from edgeflow.errors import GraphError
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [1, 3, 5, 5], name="x")
        w = ef.Variable(np.ones((2, 3, 3, 3), np.float32), name="w")
        y = apply("conv", [x, w], {"activation": "swish"})
        with pytest.raises(GraphError, match="cannot differentiate its fused swish activation"):
            ef.gradients(ef.reduce_sum(y), [w])
