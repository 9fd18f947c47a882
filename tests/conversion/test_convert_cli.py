"""`edgeflow convert` and converters.onnx.convert on good, unsupported and malformed input."""
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import ConversionError, UnsupportedOpError
from edgeflow.format import writer

import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_every_unsupported_op_is_listed_at_once():
    model = _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Det", ["a"], ["b"], name="det_1"),
         helper.make_node("Det", ["b"], ["c"], name="det_2"),
         helper.make_node("Bernoulli", ["c"], ["d"], name="bernoulli"),
         helper.make_node("Custom", ["d"], ["y"], name="mine", domain="com.example")],
        [_vi("x", [3, 3])], [_vi("y", [3, 3])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as info:
        onnx_converter.convert(model)
    message = str(info.value)
    assert "3 unsupported op type(s) in 4 node(s)" in message
    for piece in ("Det (opset 17): det_1, det_2", "Bernoulli (opset 17): bernoulli", "com.example.Custom"):
        assert piece in message
    assert sorted(op for op, *_ in info.value.ops) == ["Bernoulli", "Det", "Det", "com.example.Custom"]


def test_unsupported_variants_are_collected_too():
    model = _model(
        [helper.make_node("Resize", ["x", "", "scales"], ["a"], mode="cubic", name="cubic"),
         helper.make_node("Dropout", ["x", "", "training"], ["b"], name="training"),
         helper.make_node("Relu", ["a"], ["c"], name="after_cubic")],
        [_vi("x", [1, 1, 2, 2])], [_vi("b", [1, 1, 2, 2]), _vi("c", [1, 1, 4, 4])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
         numpy_helper.from_array(np.array(True), "training")])
    with pytest.raises(UnsupportedOpError) as info:
        onnx_converter.convert(model)
    assert {name for _, _, name, _ in info.value.ops} == {"cubic", "training"}


def test_old_opsets_are_lifted(tmp_path):
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                   [_vi("x", ["n", 4])], [_vi("y", ["n", 4])], opset=11)
    result = onnx_converter.convert(model, tmp_path / "m.efl")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")(x=x)["y"]
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-6)
    assert result.ops == {"softmax": 1}


@pytest.mark.parametrize("axis", [0, 1, 2, -1, None])
def test_hardmax_before_opset_13_flattens_at_its_axis(axis):
    """ONNX's version converter leaves such a Hardmax as it is; onnxruntime runs opset 11."""
    import onnxruntime as ort
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], **({} if axis is None else {"axis": axis}))],
                   [_vi("x", ["n", 3, 4])], [_vi("y", ["n", 3, 4])], opset=11)
    model.ir_version = 8  # what onnxruntime reads
    x = np.round(np.random.default_rng(1).standard_normal((2, 3, 4)), 1).astype(np.float32)  # ties
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")
    np.testing.assert_array_equal(runner(x=x)["y"], expected[0])


def test_invalid_models_raise_conversion_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not protobuf")
    with pytest.raises(ConversionError, match="not a readable ONNX model|invalid ONNX model"):
        onnx_converter.convert(bad)
    dangling = _model([helper.make_node("Relu", ["nowhere"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ConversionError, match="invalid ONNX model"):
        onnx_converter.convert(dangling)


def test_cli_converts_and_reports(tmp_path):
    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                    helper.make_node("Relu", ["h"], ["y"])],
                   [_vi("x", ["batch", 8])], [_vi("y", ["batch", 16])],
                   [numpy_helper.from_array(np.ones((8, 16), np.float32), "w")])
    onnx.save(model, tmp_path / "m.onnx")
    r = edgeflow("convert", tmp_path / "m.onnx", "-o", tmp_path / "m.efl", "--quantize", "fp16")
    assert r.returncode == 0, r.stderr
    assert "ONNX ops         2" in r.stdout and "parameters   128" in r.stdout and ".efl, fp16" in r.stdout
    out = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")(x=np.ones((2, 8), np.float32))
    np.testing.assert_array_equal(out["y"], np.full((2, 16), 8, np.float32))
    r = edgeflow("convert", tmp_path / "m.onnx", "--no-optimize")
    assert r.returncode == 0 and (tmp_path / "m.efl").exists()


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x0a\xff\xff\xff\xff\x0f"])
def test_cli_malformed_file_is_one_line_and_exit_2(tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    r = edgeflow("convert", bad, "-o", tmp_path / "out.efl")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("edgeflow convert: error:")
    assert not (tmp_path / "out.efl").exists()


def test_cli_unsupported_ops_exit_2(tmp_path):
    model = _model([helper.make_node("Det", ["x"], ["y"], name="d")], [_vi("x", [3, 3])], [_vi("y", [])])
    onnx.save(model, tmp_path / "det.onnx")
    r = edgeflow("convert", tmp_path / "det.onnx")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Det (opset 17): d" in r.stderr


def test_cli_bad_arguments():
    assert edgeflow("convert").returncode == 2
    assert edgeflow("convert", "m.onnx", "--quantize", "int4").returncode == 2
    assert edgeflow("convert", "--help").stdout.startswith("usage: edgeflow convert")
