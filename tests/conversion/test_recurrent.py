"""RNN, LSTM and GRU nodes with sequence_lens (absent optional inputs between: the converter
gives zeros), layout 1 and a dynamic batch, converted and run against onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer

rng = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", GATES)
def test_sequence_lens_with_holes_and_dynamic_batch(op, direction, layout):
    seq, size, hidden = 6, 4, 3
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    weights = {"W": rng.normal(0, 0.7, (d, g * hidden, size)).astype(np.float32),
               "R": rng.normal(0, 0.7, (d, g * hidden, hidden)).astype(np.float32)}
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])

    def model(layout):
        x_dims = ["n", seq, size] if layout else [seq, "n", size]
        shapes = [["n", seq, d, hidden] if layout else [seq, d, "n", hidden]] + [
            ["n", d, hidden] if layout else [d, "n", hidden]] * 2
        node = helper.make_node(op, ["X", "W", "R", "", "lens"], outputs, hidden_size=hidden, direction=direction,
                                layout=layout)
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims),
                          helper.make_tensor_value_info("lens", TensorProto.INT32, ["n"])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in zip(outputs, shapes)],
            initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
        proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 14)])
        proto.ir_version = 8
        return proto

    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model(layout)).model)).get_signature_runner("infer")
    # onnxruntime has no layout 1: it runs the sequence-major model on transposed operands
    session = ort.InferenceSession(model(0).SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 4):
        x = rng.normal(size=(seq, batch, size)).astype(np.float32)
        lens = rng.integers(1, seq + 1, batch).astype(np.int32)
        got = runner(X=x.transpose(1, 0, 2) if layout else x, lens=lens)
        for name, expected in zip(outputs, session.run(None, {"X": x, "lens": lens})):
            if layout:
                expected = expected.transpose((2, 0, 1, 3) if name == "Y" else (1, 0, 2))
            np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)
