"""An independent reference for op tests: one ONNX node run by onnxruntime.

`onnx_node(op_type, x, constants, attrs)` builds a single-node model whose first input is
fed at run time and whose other inputs are initializers, and runs it (onnxruntime, or
ONNX's reference evaluator where onnxruntime lacks a mode). `onnx_reference(op_type,
inputs, output_dtypes, **attrs)` feeds every input and returns every output.
"""
import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

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


def onnx_reference(op_type, inputs, output_dtypes, opset=17, **attrs):
    """Outputs of onnxruntime running one ONNX node `op_type` on `inputs`.

    `inputs` are arrays, or None for an optional input left out.
    """
    def info(name, dtype):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)
    names = ["" if a is None else f"x{i}" for i, a in enumerate(inputs)]
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    outs = [f"y{i}" for i in range(len(output_dtypes))]
    graph = helper.make_graph([helper.make_node(op_type, names, outs, **attrs)], "single",
                              [info(n, a.dtype) for n, a in feeds.items()],
                              [info(n, d) for n, d in zip(outs, output_dtypes)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # what onnxruntime reads, whatever the onnx package writes
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
