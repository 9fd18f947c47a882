"""What torch's exporters write for real models (tests/data/make_models.py): fixtures for the
transformer attention with Mod on constants, BERT's attention mask with And/IsNaN, the
dynamic-batch bidirectional GRU's Reshape [0, 0, -1] and a QDQ CNN from onnxruntime's
quantization tool. Each is checked to hold its pattern, then converted and compared with
onnxruntime and with the outputs recorded beside it; and the converter bugs the model zoo
(benchmarks/zoo.py) found, each on the smallest graph that shows it."""
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

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


def test_flatten_of_dimensions_unknown_on_both_sides():
    """torchvision's Faster R-CNN flattens RoI features whose every dimension is dynamic
    ([?, ?, ?, ?] at axis 1): the product is worked out from the shape when planning."""
    node = helper.make_node("Flatten", ["x"], ["y"], axis=2)
    graph = helper.make_graph([node], "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c", "d"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
    run = _runner(proto)
    for shape in [(2, 3, 4, 5), (1, 1, 7, 2), (3, 2, 1, 1)]:
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        got = run(x=x)["y"]
        assert got.shape == (shape[0] * shape[1], shape[2] * shape[3])
        np.testing.assert_array_equal(got, _ort(proto).run(None, {"x": x})[0])


# -- the committed fixtures ---------------------------------------------------------------------
DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"
FIXTURES = ["attention_mod", "bert_mask", "bigru", "qdq_cnn"]


def _producers(proto):
    return {out: node for node in proto.graph.node for out in node.output}


def _constant(proto, name):
    """The value of `name` if a Constant node or an initializer makes it, else None."""
    init = {i.name: i for i in proto.graph.initializer}
    if name in init:
        return numpy_helper.to_array(init[name])
    node = _producers(proto).get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(helper.get_attribute_value(node.attribute[0]))
    return None


def _dims(proto, index=0):
    dims = proto.graph.input[index].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims]


def _count(proto, op_type):
    return sum(n.op_type == op_type for n in proto.graph.node)


def test_attention_mod_has_a_mod_on_constants():
    proto = onnx.load(str(DATA / "attention_mod.onnx"))
    mods = [n for n in proto.graph.node if n.op_type == "Mod"]
    assert mods and all(_constant(proto, i) is not None for n in mods for i in n.input)
    assert _count(proto, "Softmax") == 1 and _dims(proto)[0] == "batch"


def test_bert_mask_has_and_isnan_gather_elements():
    proto = onnx.load(str(DATA / "bert_mask.onnx"))
    for op in ("And", "IsNaN", "GatherElements", "Where"):
        assert _count(proto, op) >= 1, op
    assert any(n.op_type == "Flatten" and helper.get_attribute_value(n.attribute[0]) == 2 for n in proto.graph.node)
    assert _dims(proto, 0) == _dims(proto, 1) == ["batch", "seq"]
    io = np.load(DATA / "bert_mask_io.npz")
    assert any((io[f"{c}.attention_mask"] == 0).any() for c in io["cases"])  # padding is exercised


def test_bigru_has_a_reshape_0_0_minus_1_on_a_dynamic_batch():
    proto = onnx.load(str(DATA / "bigru.onnx"))
    (gru,) = [n for n in proto.graph.node if n.op_type == "GRU"]
    assert helper.get_attribute_value(next(a for a in gru.attribute if a.name == "direction")) == b"bidirectional"
    shapes = [_constant(proto, n.input[1]) for n in proto.graph.node if n.op_type == "Reshape"]
    assert any(s is not None and list(s) == [0, 0, -1] for s in shapes)
    assert _dims(proto) == ["batch", 6, 8]


def test_qdq_cnn_is_quantized_with_int8_weights():
    proto = onnx.load(str(DATA / "qdq_cnn.onnx"))
    assert _count(proto, "QuantizeLinear") >= 4 and _count(proto, "DequantizeLinear") >= 8
    weights = [i for i in proto.graph.initializer if i.data_type == TensorProto.INT8 and len(i.dims) >= 2]
    assert sorted(len(w.dims) for w in weights) == [2, 4, 4, 4]  # three conv weights and the linear's
    assert not [i for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT and len(i.dims) >= 2]
    tensors = onnx_converter.convert(str(DATA / "qdq_cnn.onnx")).model.subgraphs[0].tensors
    kept = {t.data.shape for t in tensors if t.data is not None and t.data.dtype == np.int8}
    assert {tuple(w.dims) for w in weights} <= kept  # int8 in the .efl too


def _session(name):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if name == "qdq_cnn":  # the nodes as written: onnxruntime's fused int8 kernels round otherwise
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(DATA / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("optimize", [True, False])
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_onnxruntime_and_recorded_outputs(tmp_path, name, optimize):
    path = tmp_path / f"{name}.efl"
    onnx_converter.convert(DATA / f"{name}.onnx", path, optimize=optimize)
    runner = ef.Interpreter(path).get_signature_runner("infer")
    sess = _session(name)
    io = np.load(DATA / f"{name}_io.npz")
    batches = set()
    for case in (str(c) for c in io["cases"]):
        feeds = {i.name: io[f"{case}.{i.name}"] for i in sess.get_inputs()}
        batches.add(next(iter(feeds.values())).shape[0])
        ours = runner(**feeds)
        for meta, expected in zip(sess.get_outputs(), sess.run(None, feeds)):
            got, recorded = ours[meta.name], io[f"{case}.{meta.name}"]
            assert got.shape == expected.shape == recorded.shape and got.dtype == expected.dtype
            scale = np.abs(expected).max()
            assert np.abs(got - expected).max() <= 1e-4 * scale, (case, meta.name)
            assert np.abs(got - recorded).max() <= 1e-4 * scale, (case, meta.name)
    assert batches == {1, 8}
