"""The normalizations converted by composition (InstanceNormalization, GroupNormalization,
MeanVarianceNormalization, LpNormalization) on a dynamic batch, against onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer

rng = np.random.default_rng(0)


def check(node, opset, initializers, zero_row=False):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6, 5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6, 5, 4])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = rng.standard_normal((batch, 6, 5, 4)).astype(np.float32) * 3 + 1
        if zero_row:
            x[0, 2, 1] = 0  # a zero norm along the last axis
        np.testing.assert_allclose(runner(x=x)["y"], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_instance_norm():
    check(helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3), 17,
          {"s": rng.standard_normal(6).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)})


def test_group_norm():
    check(helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-4), 21,
          {"s": rng.standard_normal(6).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)})


@pytest.mark.parametrize("p, axis", [(1, -1), (2, -1), (2, 1)])
def test_lp_normalization(p, axis):
    check(helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis), 17, {}, zero_row=True)


@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (2, 3)])
def test_mean_variance_normalization(axes):
    check(helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=list(axes)), 17, {})
