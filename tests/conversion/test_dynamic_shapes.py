"""Shape inference where other dimensions are dynamic: the dynamic-batch pattern torch
exporters emit for RNN outputs, `Reshape(x, [0, -1])` then `MatMul`, resolves the -1
(the copied batch dimension cancels out), checked against onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import GraphError
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply


@pytest.mark.parametrize("target, want", [((0, -1), (None, 24)), ((0, 2, -1), (None, 2, 12)),
                                          ((-1, 0, 4), (None, 2, 4)), ((0, 0, -1), (None, 2, 12))])
def test_the_minus_one_resolves_beside_a_copied_dynamic_dim(target, want):
    with ef.Graph().as_default():
        x = ef.placeholder(ef.float32, [None, 2, 12])
        y = apply("reshape", [x], {"shape": target, "copy_zeros": True})
    assert y.shape == want


def test_an_impossible_target_is_still_refused():
    with ef.Graph().as_default():
        x = ef.placeholder(ef.float32, [None, 2, 12])
        with pytest.raises(GraphError, match="cannot reshape"):
            apply("reshape", [x], {"shape": (0, 5, -1), "copy_zeros": True})


def test_dynamic_batch_reshape_then_matmul_matches_onnxruntime():
    w = np.random.default_rng(1).standard_normal((24, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        initializer=[numpy_helper.from_array(np.array([0, -1], np.int64), "shape"), numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 2, 12)).astype(np.float32)
        np.testing.assert_allclose(runner(x=x)["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
