"""DFT, STFT, the window functions and MelWeightMatrix converted from ONNX, against
onnxruntime and ONNX's reference evaluator: sizes given as initializers (as exporters
write them), signals and the other scalars fed at run time."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer

rng = np.random.default_rng(0)


def model(op_type, inputs, constants, opset, out_dtype=TensorProto.FLOAT, **attrs):
    """One node op_type(*names) with `inputs` fed ({name: array}) and `constants` initializers;
    names absent from both are left out ("")."""
    names = list(inputs) + [n for n in constants if n not in inputs]
    order = [n if n in inputs or n in constants else "" for n in attrs.pop("order", names)]
    while order and order[-1] == "":
        order.pop()
    graph = helper.make_graph(
        [helper.make_node(op_type, order, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", out_dtype, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in constants.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    proto.ir_version = 8
    return with_output_shape(proto, inputs)


def with_output_shape(proto, feeds):
    """`proto` with y's shape, which ONNX's checker wants, set to what the reference evaluator gives."""
    shape = ReferenceEvaluator(proto).run(None, feeds)[0].shape
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y", proto.graph.output[0].type.tensor_type.elem_type, shape))
    return proto


def run_all(proto, feeds, onnxruntime=True):
    """edgeflow's, onnxruntime's (or None) and the reference evaluator's y."""
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(proto).model)).get_signature_runner("infer")
    ours = runner(**feeds)["y"]
    theirs = None
    if onnxruntime:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        theirs = session.run(None, feeds)[0]
    return ours, theirs, ReferenceEvaluator(proto).run(None, feeds)[0]


def check(proto, feeds, rtol=1e-4, atol=1e-4, onnxruntime=True):
    ours, theirs, reference = run_all(proto, feeds, onnxruntime)
    for other in (theirs, reference):
        if other is not None:
            assert ours.dtype == other.dtype and ours.shape == other.shape
            np.testing.assert_allclose(ours, other, rtol=rtol, atol=atol)


DFT_CASES = [  # (last, inverse, onesided, length)
    (1, 0, 0, None), (2, 0, 0, None), (2, 1, 0, None), (1, 0, 1, None), (2, 0, 0, 12), (2, 1, 0, 7),
    (1, 0, 1, 9), (2, 1, 1, None), (2, 1, 1, 14), (2, 1, 1, 9), (2, 1, 1, 16), (1, 0, 0, 5),
]


@pytest.mark.parametrize("last, inverse, onesided, length", DFT_CASES)
@pytest.mark.parametrize("opset", [17, 20])
def test_dft(opset, last, inverse, onesided, length):
    x = rng.standard_normal((2, 8, 3, last)).astype(np.float32)
    constants = {} if length is None else {"n": np.array(length, np.int64)}
    if opset >= 20:
        constants["axis"] = np.array(-3, np.int64)  # axis 1, counted from the back
        proto = model("DFT", {"x": x}, constants, opset, order=["x", "n", "axis"], inverse=inverse,
                      onesided=onesided)
    else:
        proto = model("DFT", {"x": x}, constants, opset, order=["x", "n"], axis=1, inverse=inverse,
                      onesided=onesided)
    # An inverse one-sided DFT of length n reads n // 2 + 1 bins (numpy's irfft, ONNX's reference);
    # given 8, onnxruntime 1.32 gives other values where n // 2 + 1 is not 8.
    check(proto, {"x": x}, onnxruntime=not (inverse and onesided and length not in (None, 14)))


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("inputs", ["window", "frame_length", "both"])
def test_stft(inputs, onesided):
    signal = rng.standard_normal((2, 64, 1)).astype(np.float32)
    constants = {"step": np.array(6, np.int64)}
    if inputs in ("window", "both"):
        constants["window"] = np.hanning(12).astype(np.float32)
    if inputs in ("frame_length", "both"):
        constants["frame_length"] = np.array(12, np.int64)
    proto = model("STFT", {"signal": signal}, constants, 17, order=["signal", "step", "window", "frame_length"],
                  onesided=onesided)
    check(proto, {"signal": signal})


@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32])
def test_windows(op_type, periodic, dtype):
    proto = model(op_type, {}, {"size": np.array(11, np.int64)}, 17, out_dtype=dtype, periodic=periodic,
                  output_datatype=dtype)
    # onnxruntime and the reference evaluator compute float16 windows in float16; edgeflow in float64
    check(proto, {}, rtol=1e-3, atol=1e-3 if dtype == TensorProto.FLOAT16 else 1e-6)


@pytest.mark.parametrize("mels, n, rate, low, high", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 8000.0),
                                                      (6, 33, 22050, 300.0, 9000.0)])
def test_mel_weight_matrix(mels, n, rate, low, high):
    feeds = {"rate": np.array(rate, np.int64), "low": np.array(low, np.float32), "high": np.array(high, np.float32)}
    proto = model("MelWeightMatrix", feeds, {"mels": np.array(mels, np.int64), "n": np.array(n, np.int64)}, 17,
                  order=["mels", "n", "rate", "low", "high"])
    check(proto, feeds, rtol=1e-6, atol=1e-7)


def test_a_spectrogram_pipeline():
    """HannWindow -> STFT -> |.|^2 -> MatMul(MelWeightMatrix): a log-mel front end, as
    speech models export it."""
    nodes = [helper.make_node("HannWindow", ["size"], ["w"]),
             helper.make_node("STFT", ["x", "step", "w"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["s2"]),
             helper.make_node("ReduceSum", ["s2", "last"], ["power"], keepdims=0),
             helper.make_node("MelWeightMatrix", ["mels", "n", "rate", "low", "high"], ["m"]),
             helper.make_node("MatMul", ["power", "m"], ["y"])]
    consts = {"size": np.array(32, np.int64), "step": np.array(8, np.int64), "last": np.array([-1], np.int64),
              "mels": np.array(10, np.int64), "n": np.array(32, np.int64), "rate": np.array(16000, np.int64),
              "low": np.array(0, np.float32), "high": np.array(8000, np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 18)])
    proto.ir_version = 8
    x = rng.standard_normal((1, 256, 1)).astype(np.float32)
    proto = with_output_shape(proto, {"x": x})
    check(proto, {"x": x}, rtol=1e-4, atol=1e-3)
