"""An independent reference for the image ops: one ONNX node run by onnxruntime.

`onnx_node(op_type, inputs, attrs)` builds a single-node model whose first input is fed at
run time and whose other inputs are initializers, and runs it (onnxruntime, or ONNX's
reference evaluator where onnxruntime lacks a mode).
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

_SESSION = None


def _options():
    global _SESSION
    if _SESSION is None:
        _SESSION = ort.SessionOptions()
        _SESSION.intra_op_num_threads = 1
        _SESSION.log_severity_level = 3
    return _SESSION


def single_node_model(op_type, x, constants=(), attrs=None, opset=17):
    """A serialized model: y = op_type(x, *constants) with x fed as input "x"."""
    names = ["x"] + [f"c{i}" if c is not None else "" for i, c in enumerate(constants)]
    node = helper.make_node(op_type, names, ["y"], **(attrs or {}))
    elem = helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype)
    graph = helper.make_graph(
        [node], op_type, [helper.make_tensor_value_info("x", elem, np.shape(x))],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(np.asarray(c), n) for c, n in zip(constants, names[1:]) if c is not None])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # what every onnxruntime release reads
    return model


def onnx_node(op_type, x, constants=(), attrs=None, opset=17, evaluator="onnxruntime"):
    """y of the single-node model on x, run by onnxruntime or by onnx.reference."""
    model = single_node_model(op_type, x, constants, attrs, opset)
    if evaluator == "reference":
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, {"x": x})[0]
    session = ort.InferenceSession(model.SerializeToString(), _options(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]
