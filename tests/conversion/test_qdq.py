"""Models in the QDQ form onnxruntime's quantization tool writes (QuantizeLinear ->
DequantizeLinear on activations, DequantizeLinear on int8 per-channel weights) convert,
keep their weights in int8 and match onnxruntime."""
import pathlib

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer

DATA = pathlib.Path(__file__).parents[1] / "data" / "onnx"


def qdq_matmul():
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (6, 4)).astype(np.int8)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (w, "w_q"), (rng.uniform(0.005, 0.02, 4).astype(np.float32), "w_scale"), (np.zeros(4, np.int8), "w_zero"),
        (np.array(0.02, np.float32), "x_scale"), (np.array(128, np.uint8), "x_zero"),
        (rng.standard_normal(4).astype(np.float32), "bias")]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], axis=1),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 19)])


def test_qdq_matmul_matches_onnxruntime():
    proto = qdq_matmul()
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).uniform(-2.5, 2.5, (5, 6)).astype(np.float32)
    np.testing.assert_allclose(runner(x=x)["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_int8_weights_stay_int8_in_the_file():
    """DequantizeLinear on a constant runs when a plan is made, not when converting."""
    tensors = {t.name: t for t in onnx_converter.convert(qdq_matmul()).model.subgraphs[0].tensors}
    assert tensors["w_q"].data.dtype == np.int8 and tensors["w_q"].data.shape == (6, 4)
    assert not any(t.data is not None and t.data.dtype == np.float32 and t.data.shape == (6, 4)
                   for t in tensors.values())


def test_a_cnn_quantized_by_onnxruntimes_tool_matches_onnxruntime(tmp_path):
    """MobileNetV2 of tests/data, quantized by onnxruntime.quantization.quantize_static (QDQ,
    int8 per-channel weights, uint8 activations): edgeflow computes what its nodes define,
    as onnxruntime does with graph optimizations off; the file keeps the weights in int8."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    data = np.load(DATA / "mobilenetv2_io.npz")
    images = data["b8.image"]

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"image": images[i:i + 1]} for i in range(len(images))])

        def get_next(self):
            return next(self.batches, None)

    quantized = tmp_path / "q.onnx"
    quantize_static(str(DATA / "mobilenetv2.onnx"), str(quantized), Calibration(), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(quantized), options, providers=["CPUExecutionProvider"]).run(
        None, {"image": images})[0]
    converted = onnx_converter.convert(str(quantized))
    got = ef.Interpreter(writer.to_bytes(converted.model)).get_signature_runner("infer")(image=images)["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    int8_bytes = sum(t.data.nbytes for t in converted.model.subgraphs[0].tensors
                     if t.data is not None and t.data.dtype == np.int8)
    assert int8_bytes > 60_000 and len(writer.to_bytes(converted.model)) < quantized.stat().st_size * 1.1


def test_qlinear_conv_per_channel_matches_onnxruntime_within_one_step():
    """onnxruntime's integer kernels requantize in their own order: results may differ by
    one quantization step, no more."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (np.array(0.05, np.float32), "x_scale"), (np.array(120, np.uint8), "x_zero"),
        (rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8), "w"),
        (rng.uniform(0.002, 0.01, 4).astype(np.float32), "w_scale"), (np.zeros(4, np.int8), "w_zero"),
        (np.array(0.1, np.float32), "y_scale"), (np.array(100, np.uint8), "y_zero"),
        (rng.integers(-500, 500, 4).astype(np.int32), "bias")]]
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale",
                                            "y_zero", "bias"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4, 5, 5])],
                              initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 19)])
    x = rng.integers(0, 256, (1, 3, 9, 9)).astype(np.uint8)
    got = ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")(x=x)["y"]
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == np.uint8 and got.shape == want.shape
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
