"""What torch's exporters write for real models (tests/data/make_models.py): fixtures for the
transformer attention with Mod on constants, BERT's attention mask with And/IsNaN, the
dynamic-batch bidirectional GRU's Reshape [0, 0, -1] and a QDQ CNN from onnxruntime's
quantization tool. Each is checked to hold its pattern, then converted and compared with
onnxruntime and with the outputs recorded beside it; and the converter bugs the model zoo
(benchmarks/zoo.py) found, each on the smallest graph that shows it."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer


def _runner(proto):
    return ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")


def _ort(proto):
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def test_flatten_at_axis_equal_to_rank():
    """Flatten's axis may be the rank (every dimension before it: shape (n, 1)); the TorchScript
    export of Hugging Face's BertModel flattens its [batch, seq] mask so. It once wrapped to
    axis 0, giving (1, n)."""
    for shape, axis in [((2, 16), 2), ((2, 3, 4), 3), ((2, 3, 4), -3), ((2, 3, 4), 0), ((5,), 1)]:
        node = helper.make_node("Flatten", ["x"], ["y"], axis=axis)
        graph = helper.make_graph([node], "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])
        proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        want = _ort(proto).run(None, {"x": x})[0]
        got = _runner(proto)(x=x)["y"]
        a = axis + len(shape) if axis < 0 else axis
        assert got.shape == want.shape == (int(np.prod(shape[:a])), int(np.prod(shape[a:])))
        np.testing.assert_array_equal(got, want)
