"""optimize.fold_pads: a zero Pad of the spatial axes read only by convs becomes their
padding (with onnxruntime's results); pads of another value, of the channels, or read by
other ops stay."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter


def _model():
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((6, 3, 3, 3)).astype(np.float32),
             "w2": rng.standard_normal((6, 1, 3, 3)).astype(np.float32),
             "w3": rng.standard_normal((4, 6, 1, 1)).astype(np.float32),
             "spatial": np.array([0, 0, 2, 1, 0, 0, 0, 3], np.int64),  # top 2, left 1, right 3
             "channels": np.array([0, 1, 0, 0, 0, 1, 0, 0], np.int64),
             "one": np.array(1.0, np.float32)}
    nodes = [helper.make_node("Pad", ["x", "spatial"], ["p1"]),  # read by one conv: folded
             helper.make_node("Conv", ["p1", "w1"], ["c1"], pads=[1, 0, 0, 1], strides=[2, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Pad", ["r1", "spatial"], ["p2"]),  # read by two convs: folded into both
             helper.make_node("Conv", ["p2", "w2"], ["c2"], group=6),
             helper.make_node("Conv", ["p2", "w2"], ["c3"], group=6, auto_pad="VALID", strides=[2, 2]),
             helper.make_node("Pad", ["c2", "spatial", "one"], ["p3"]),  # pads ones: stays
             helper.make_node("Conv", ["p3", "w3"], ["y1"]),
             helper.make_node("Pad", ["c3", "channels"], ["p4"]),  # pads channels: stays
             helper.make_node("ReduceSum", ["p4"], ["y2"], keepdims=0),
             helper.make_node("Pad", ["c3", "spatial"], ["p5"]),  # read by a conv and a ReduceMax: stays
             helper.make_node("Conv", ["p5", "w2"], ["c5"], group=6),
             helper.make_node("ReduceMax", ["p5"], ["m5"], keepdims=0),
             helper.make_node("ReduceSum", ["c5"], ["s5"], keepdims=0),
             helper.make_node("Add", ["m5", "s5"], ["y3"])]
    graph = helper.make_graph(nodes, "pads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 11, 13])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                               for n, shape in (("y1", [2, 4, 8, 22]), ("y2", []), ("y3", []))],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_zero_spatial_pads_fold_into_convs(tmp_path):
    model = _model()
    folded = onnx_converter.convert(model, tmp_path / "f.efl")
    plain = onnx_converter.convert(model, tmp_path / "p.efl", optimize=False)
    assert plain.ops["pad"] == 5 and folded.ops["pad"] == 3 and folded.ops["conv"] == plain.ops["conv"] == 5
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 3, 11, 13)).astype(np.float32)
    expected = session.run(None, {"x": x})
    for path in ("f.efl", "p.efl"):
        got = ef.Interpreter(tmp_path / path).get_signature_runner("infer")(x=x)
        for name, want in zip(("y1", "y2", "y3"), expected):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
