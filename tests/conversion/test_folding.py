"""Nodes without a handler whose inputs are all constant are computed at conversion time
(converters/onnx/folding.py), so only the rest must be supported. Mul stands for an op
without a handler: the tests remove its handler."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.converters.onnx.folding import fold_unsupported
from edgeflow.converters.onnx.handlers import HANDLERS
from edgeflow.errors import UnsupportedOpError
from edgeflow.format import writer

A = np.array([1.5, -2.0, 3.0], np.float32)
B = np.array([2.0, 0.5, -1.0], np.float32)


def constant(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def model(nodes, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


def run_both(proto):
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    converted = onnx_converter.convert(proto)
    interp = ef.Interpreter(writer.to_bytes(converted.model))
    return interp.get_signature_runner("infer")(x=x)["y"], want, converted


@pytest.fixture
def no_mul(monkeypatch):
    monkeypatch.delitem(HANDLERS, "Mul")


def test_an_unsupported_node_on_constants_is_folded(no_mul):
    got, want, converted = run_both(model([constant("a", A), constant("b", B),
                                           helper.make_node("Mul", ["a", "b"], ["c"]),
                                           helper.make_node("Add", ["x", "c"], ["y"])]))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert "mul" not in converted.ops


def test_folding_follows_supported_nodes_on_constants(no_mul):
    """Neg has a handler; its output is still a constant the unsupported Mul can use."""
    got, want, _ = run_both(model([constant("a", A), helper.make_node("Neg", ["a"], ["n"]),
                                   helper.make_node("Mul", ["n", "b"], ["c"]),
                                   helper.make_node("Add", ["x", "c"], ["y"])],
                                  [numpy_helper.from_array(B, "b")]))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_an_unsupported_node_on_a_graph_input_is_still_refused(no_mul):
    proto = model([constant("a", A), helper.make_node("Mul", ["x", "a"], ["y"], name="scale")])
    with pytest.raises(UnsupportedOpError, match=r"Mul \(opset 17\): scale"):
        onnx_converter.convert(proto)


def test_trainable_weights_are_not_constants():
    proto = model([helper.make_node("Mul", ["w", "b"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
                  [numpy_helper.from_array(A, "w"), numpy_helper.from_array(B, "b")])
    supported = set(HANDLERS) - {"Mul"}
    assert [n.op_type for n in fold_unsupported(proto, supported).graph.node] == ["Add"]
    assert fold_unsupported(proto, supported, variables={"w"}) is proto


def _loop_over(body_nodes, body_inputs):
    body = helper.make_graph(body_nodes + [helper.make_node("Identity", ["c"], ["c_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, [])] + body_inputs,
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3])])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "v0"], ["v"], body=body)], "g",
                              [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                               helper.make_tensor_value_info("v0", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, [3])],
                              initializer=[numpy_helper.from_array(A, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


def test_nodes_inside_a_loop_body_fold_on_the_enclosing_constants():
    """Mul(w, b): w the main graph's initializer, b a Constant in the body."""
    proto = _loop_over([constant("b", B), helper.make_node("Mul", ["w", "b"], ["wb"]),
                        helper.make_node("Add", ["v", "wb"], ["v_out"])],
                       [helper.make_tensor_value_info("v", TensorProto.FLOAT, [3])])
    folded = fold_unsupported(proto, set(HANDLERS) - {"Mul"})
    body = folded.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["Constant", "Add", "Identity"]
    np.testing.assert_array_equal(numpy_helper.to_array(body.initializer[0]), A * B)
    assert [n.op_type for n in proto.graph.node[0].attribute[0].g.node][:3] == ["Constant", "Mul", "Add"]  # untouched


def test_a_body_input_hides_the_enclosing_constant_of_that_name():
    """The body's loop variable is named `w` like the main graph's initializer: Mul(w, b)
    reads the loop variable, which is no constant."""
    proto = _loop_over([constant("b", B), helper.make_node("Mul", ["w", "b"], ["v_out"])],
                       [helper.make_tensor_value_info("w", TensorProto.FLOAT, [3])])
    assert fold_unsupported(proto, set(HANDLERS) - {"Mul"}) is proto
