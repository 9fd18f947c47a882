"""edgeflow -> ONNX (converters/onnx/export, `edgeflow export`): ONNX models converted to .efl
and exported back run in onnxruntime as the originals do (the test models of
tests/data/onnx, and one-node graphs of every op family); ops that ONNX models cannot
give edgeflow are checked against edgeflow's interpreter; a package trained on the device
exports its trained weights; what ONNX cannot say fails with one typed error."""
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow import ops
from edgeflow.converters import onnx as onnx_converter
from edgeflow.converters.onnx import export as exporter
from edgeflow.converters.onnx.handlers import BUILDS
from edgeflow.errors import ConversionError, UnsupportedOpError
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"
MODELS = sorted(path.stem for path in DATA.glob("*.onnx"))
F32, I64 = np.float32, np.int64


def session(model):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    blob = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def round_trip(model, **options):
    """The ONNX model `model` (a path or ModelProto) converted to a .efl file's bytes and exported back."""
    blob = writer.to_bytes(onnx_converter.convert(model, **options).model)
    exported = exporter.export(blob)
    onnx.checker.check_model(exported, full_check=True)
    return exported


def assert_same(got, want, rtol=1e-5, atol=1e-6):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def assert_runs_as(exported, original, feeds):
    """onnxruntime gives the same outputs for both models on `feeds`."""
    for got, want in zip(session(exported).run(None, feeds), session(original).run(None, feeds), strict=True):
        assert_same(got, want)


# -- the test models -------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_test_models_run_as_the_originals(name):
    """Every model of tests/data/onnx, on its recorded inputs."""
    path = DATA / f"{name}.onnx"
    exported = round_trip(path)
    io = np.load(DATA / f"{name}_io.npz")
    inputs = [i.name for i in session(str(path)).get_inputs()]
    for case in io["cases"]:
        assert_runs_as(exported, str(path), {i: io[f"{case}.{i}"] for i in inputs})


def test_dynamic_dimensions_are_named_and_free():
    exported = round_trip(DATA / "mlp.onnx")
    (x,), (y,) = exported.graph.input, exported.graph.output
    assert [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim] == ["x_dim0", 64]
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["x_dim0", 10]
    for n in (1, 3, 17):
        assert_runs_as(exported, str(DATA / "mlp.onnx"), {"x": np.random.default_rng(n).standard_normal((n, 64), F32)})


def test_fused_ops_export_as_their_onnx_ops():
    """What conversion fuses comes back as one ONNX op (or the op's activation after it):
    conv + BatchNorm + Clip(0, 6) of mobilenetv2 as Conv and Clip, the transformer's
    LayerNormalization as itself, x * sigmoid(x) (swish) as Swish."""
    mobilenet = round_trip(DATA / "mobilenetv2.onnx")
    kinds = [n.op_type for n in mobilenet.graph.node]
    assert "BatchNormalization" not in kinds and kinds.count("Clip") == 16 and kinds.count("Conv") == 23
    transformer = round_trip(DATA / "transformer.onnx")
    assert [n.op_type for n in transformer.graph.node].count("LayerNormalization") == 4
    silu, _ = node_model("Sigmoid", [("x", F32, [4, 5])], outs=("s",),
                         extra=[helper.make_node("Mul", ["x", "s"], ["y"])])
    swish = round_trip(silu)
    assert [n.op_type for n in swish.graph.node] == ["Swish"]
    x = np.random.default_rng(1).standard_normal((4, 5), F32) * 4
    assert_same(session(swish).run(None, {"x": x})[0], session(silu).run(None, {"x": x})[0])


@pytest.mark.parametrize("quantize", ["int8", "fp16"])
def test_stored_weights_export_as_stored(quantize):
    """int8 weights: their int8 initializers through DequantizeLinear; float16 ones: a Cast of
    the float16 initializer. onnxruntime then gives what edgeflow's interpreter gives."""
    converted = onnx_converter.convert(DATA / "mobilenetv2.onnx", quantize=quantize)
    blob = writer.to_bytes(converted.model)
    exported = exporter.export(blob)
    onnx.checker.check_model(exported, full_check=True)
    stored = TensorProto.INT8 if quantize == "int8" else TensorProto.FLOAT16
    reader = "DequantizeLinear" if quantize == "int8" else "Cast"
    read = [n for n in exported.graph.node if n.op_type == reader]
    initializers = {i.name: i for i in exported.graph.initializer}
    assert len(read) >= 24 and {initializers[n.input[0]].data_type for n in read} == {stored}
    scales = {n.input[1] for n in read[1:] if reader == "DequantizeLinear"}
    assert not [n for n, i in initializers.items() if np.prod(i.dims) >= 64 and n not in scales
                and i.data_type == TensorProto.FLOAT]
    image = np.random.default_rng(0).standard_normal((2, 3, 64, 64), F32)
    want = ef.Interpreter(blob).get_signature_runner("infer")(image=image)["logits"]
    np.testing.assert_allclose(session(exported).run(None, {"image": image})[0], want, rtol=1e-4,
                               atol=1e-5 * np.abs(want).max())


# -- one-node graphs of every op family ------------------------------------------------------

def _sample(rng, dtype, shape, kind=None):
    if isinstance(kind, np.ndarray):
        return kind
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if isinstance(kind, tuple):
        return rng.integers(*kind, size=shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -5, 6, size=shape).astype(dtype)
    low, high = {"pos": (0.5, 2.0), "unit": (-0.9, 0.9), "ge1": (1.1, 3.0)}.get(kind, (None, None))
    x = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
    return x.astype(dtype)


def node_model(op_type, ins, outs=("y",), opset=18, inits=None, extra=(), shapes=None, **attrs):
    """A model of one `op_type` node (then the nodes `extra`): `ins` lists its inputs, each an
    initializer's name (of `inits`), "" (absent), or a graph input (name, dtype, shape[, how
    to sample it: "pos", "unit", "ge1", (low, high) integers, or the array itself]). Outputs
    are typed by ONNX's shape inference, float32 of `shapes` where it cannot say."""
    inputs = [i for i in ins if isinstance(i, tuple)]
    names = [i[0] if isinstance(i, tuple) else i for i in ins]
    nodes = [helper.make_node(op_type, names, list(outs), **attrs), *extra]
    graph = helper.make_graph(
        nodes, op_type, [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
                         for n, d, s, *_ in inputs],
        [helper.make_empty_tensor_value_info(o) for o in (extra[-1].output if extra else outs)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    model = onnx.shape_inference.infer_shapes(model)
    for out in model.graph.output:
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type or TensorProto.FLOAT,
                                                       shapes[out.name]))
    return model, inputs


def case(op_type, ins, *args, id=None, **kwargs):
    return pytest.param(op_type, ins, args, kwargs, id=id or op_type)


R = np.random.default_rng(7)
W33 = R.standard_normal((4, 3, 3, 3)).astype(F32)
B4 = R.standard_normal(4).astype(F32)
X4 = ("x", F32, [2, 3, 6, 6])  # an NCHW image

CASES = [
    # math
    *[case(t, [("a", F32, [2, 3, 4]), ("b", F32, [3, 1])]) for t in ("Add", "Sub", "Mul", "Div", "Max", "Min")],
    case("Pow", [("a", F32, [2, 3], "pos"), ("b", F32, [3])]),
    *[case(t, [("x", F32, [2, 5])]) for t in ("Neg", "Abs", "Exp", "Sigmoid", "Tanh", "Sin", "Cos", "Tan", "Atan",
                                              "Sinh", "Cosh", "Asinh", "Floor", "Ceil", "Round", "Sign", "Erf")],
    *[case(t, [("x", F32, [2, 5], "pos")]) for t in ("Log", "Sqrt", "Reciprocal")],
    *[case(t, [("x", F32, [2, 5], "unit")]) for t in ("Asin", "Acos", "Atanh")],
    case("Acosh", [("x", F32, [2, 5], "ge1")]),
    *[case(t, [("a", F32, [2, 3]), ("b", F32, [2, 3])]) for t in ("Equal", "Less", "Greater", "LessOrEqual",
                                                                  "GreaterOrEqual")],
    case("Equal", [("a", I64, [4]), ("b", I64, [4])], id="Equal-int64"),
    *[case(t, [("a", np.bool_, [3, 4]), ("b", np.bool_, [3, 4])]) for t in ("And", "Or", "Xor")],
    case("Not", [("x", np.bool_, [3, 4])]),
    case("IsNaN", [("x", F32, [4], np.array([1, np.nan, -np.inf, 0], F32))]),
    case("IsInf", [("x", F32, [4], np.array([1, np.nan, -np.inf, np.inf], F32))], detect_negative=0),
    case("Where", [("c", np.bool_, [2, 3]), ("a", F32, [2, 3]), ("b", F32, [3])]),
    case("Cast", [("x", F32, [2, 3])], to=TensorProto.INT32),
    case("Mod", [("a", np.int32, [6], (-9, 9)), ("b", np.int32, [6], (1, 4))]),
    case("Mod", [("a", F32, [6]), ("b", F32, [6], "pos")], fmod=1, id="Mod-fmod"),
    case("BitShift", [("a", np.uint8, [5]), ("b", np.uint8, [5], (0, 4))], direction="LEFT"),
    *[case(t, [("a", np.int32, [5], (-50, 50)), ("b", np.int32, [5], (-50, 50))])
      for t in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")],
    case("BitwiseNot", [("x", np.int32, [5], (-50, 50))]),
    case("Det", [("x", F32, [2, 3, 3])]),
    case("MatMul", [("a", F32, [2, 3, 4]), ("b", F32, [4, 5])]),
    case("MatMul", [("a", F32, [4]), ("b", F32, [2, 4, 5])], id="MatMul-vector"),
    case("Gemm", [("a", F32, [4, 3]), ("b", F32, [5, 4]), ("c", F32, [5])], transA=1, transB=1, alpha=0.5,
         beta=2.0),
    case("PRelu", [("x", F32, [2, 3, 4]), ("s", F32, [3, 1])]),
    case("Sum", [("a", F32, [3]), ("b", F32, [3]), ("c", F32, [2, 3])]),
    # activations
    *[case(t, [("x", F32, [2, 7])], **a) for t, a in (
        ("LeakyRelu", {"alpha": 0.2}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
        ("Softplus", {}), ("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 1.5}), ("Softsign", {}),
        ("Mish", {}), ("ThresholdedRelu", {"alpha": 0.4}), ("Shrink", {"lambd": 0.4, "bias": 0.1}), ("Relu", {}))],
    case("Gelu", [("x", F32, [2, 7])], opset=20),
    case("Gelu", [("x", F32, [2, 7])], opset=20, approximate="tanh", id="Gelu-tanh"),
    case("Swish", [("x", F32, [2, 7])], opset=24, alpha=1.5),
    case("Clip", [("x", F32, [2, 7]), "lo", "hi"], inits={"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    case("Clip", [("x", F32, [2, 7]), "", "hi"], inits={"hi": np.float32(0.7)}, id="Clip-max"),
    case("Clip", [("x", np.int8, [9], (-100, 100)), "lo"], inits={"lo": np.int8(-3)}, id="Clip-int8"),
    case("Clip", [("x", F32, [2, 7]), ("lo", F32, []), ("hi", F32, [])], id="Clip-inputs"),
    # nn
    *[case(t, [("x", F32, [2, 3, 5])], axis=1) for t in ("Softmax", "LogSoftmax", "Hardmax")],
    case("LRN", [X4], size=3, alpha=1e-3, beta=0.6, bias=2.0),
    # array
    case("Reshape", [("x", F32, [2, 3, 4]), "s"], inits={"s": np.array([0, -1, 2], I64)}),
    case("Reshape", [("x", F32, [2, 3, 4]), ("s", I64, [2], np.array([4, 6], I64))], id="Reshape-input"),
    case("Flatten", [("x", F32, ["n", 3, 4])], axis=2),
    case("Transpose", [("x", F32, [2, 3, 4])], perm=[2, 0, 1]),
    case("Concat", [("a", F32, [2, 3]), ("b", F32, [2, 1])], axis=-1),
    case("Squeeze", [("x", F32, [2, 1, 3, 1]), "a"], inits={"a": np.array([1, -1], I64)}),
    case("Unsqueeze", [("x", F32, [2, 3]), "a"], inits={"a": np.array([0, 3], I64)}),
    case("Slice", [("x", F32, [5, 6]), "s", "e", "a", "st"],
         inits={"s": np.array([4, 1], I64), "e": np.array([-6, 100], I64), "a": np.array([0, 1], I64),
                "st": np.array([-2, 2], I64)}),
    case("Slice", [("x", F32, [5, 6]), ("s", I64, [1], np.array([1], I64)), ("e", I64, [1], np.array([4], I64))],
         id="Slice-inputs"),
    case("Gather", [("x", F32, [5, 3]), ("i", I64, [2, 2], (-5, 5))], axis=0),
    case("GatherElements", [("x", F32, [3, 4]), ("i", I64, [3, 2], (0, 4))], axis=1),
    case("GatherND", [("x", F32, [2, 3, 4]), ("i", I64, [2, 1, 1], (0, 3))], batch_dims=1),
    case("ScatterElements", [("x", F32, [3, 4]), ("i", I64, [3, 2], np.array([[0, 1], [2, 3], [1, 1]], I64)),
                             ("u", F32, [3, 2])], axis=1, reduction="add"),
    case("ScatterND", [("x", F32, [4, 3]), ("i", I64, [2, 1], np.array([[3], [1]], I64)), ("u", F32, [2, 3])]),
    case("OneHot", [("i", I64, [4], (-3, 3)), "d", "v"], inits={"d": np.array(3, I64),
                                                              "v": np.array([0.5, 2], F32)}, axis=0),
    case("Trilu", [("x", F32, [2, 4, 4]), "k"], inits={"k": np.array(1, I64)}, upper=0),
    case("ReverseSequence", [("x", F32, [4, 3, 2]), ("n", I64, [3], np.array([4, 1, 2], I64))],
         batch_axis=1, time_axis=0),
    case("DepthToSpace", [("x", F32, [1, 8, 2, 3])], blocksize=2, mode="CRD"),
    case("Identity", [("x", F32, [3])]),
    # shape
    case("Shape", [("x", F32, ["n", 3, 4])], start=1),
    case("ConstantOfShape", [("s", I64, [2], np.array([2, 3], I64))],
         value=numpy_helper.from_array(np.array([7], np.int32))),
    case("EyeLike", [("x", F32, [3, 4])], k=1, dtype=TensorProto.DOUBLE),
    case("Range", [("a", F32, [], np.array(1.5, F32)), ("b", F32, [], np.array(9, F32)),
                   ("c", F32, [], np.array(2, F32))]),
    case("Expand", [("x", F32, [3, 1]), "s"], inits={"s": np.array([2, 3, 4], I64)}),
    case("Tile", [("x", F32, [2, 3]), "r"], inits={"r": np.array([2, 1], I64)}),
    case("Split", [("x", F32, [7, 2]), "s"], outs=("p", "q"), inits={"s": np.array([3, 4], I64)}),
    case("Split", [("x", F32, [7, 2])], outs=("p", "q", "r"), num_outputs=3, id="Split-num_outputs"),
    # reduce
    *[case(t, [("x", F32, [2, 3, 4]), "a"], inits={"a": np.array([0, 2], I64)}, keepdims=k) for t, k in (
        ("ReduceSum", 1), ("ReduceMean", 0), ("ReduceMax", 1), ("ReduceMin", 0), ("ReduceProd", 1),
        ("ReduceL2", 0), ("ReduceLogSumExp", 1), ("ReduceSumSquare", 0), ("ReduceL1", 1), ("ReduceLogSum", 0))],
    case("ReduceSum", [("x", F32, [2, 3])], keepdims=0, id="ReduceSum-all"),
    case("ArgMax", [("x", F32, [3, 4], np.array([[1, 2, 2, 0], [0, 0, 0, 0], [5, 1, 5, 5]], F32))], axis=1,
         select_last_index=1),
    case("ArgMin", [("x", F32, [3, 4])], axis=0, keepdims=0),
    case("CumSum", [("x", F32, [3, 4]), "a"], inits={"a": np.array(1, I64)}, exclusive=1, reverse=1),
    case("TopK", [("x", F32, [3, 6]), "k"], outs=("v", "i"), inits={"k": np.array([2], I64)}, largest=0),
    case("GlobalAveragePool", [X4]),
    case("GlobalMaxPool", [X4]),
    # conv, pool, norm
    case("Conv", [X4, "w", "b"], inits={"w": W33, "b": B4}, pads=[1, 0, 1, 2], strides=[2, 1]),
    case("Conv", [X4, "w"], inits={"w": R.standard_normal((6, 1, 3, 3)).astype(F32)}, group=3,
         auto_pad="SAME_UPPER", strides=[2, 1], id="Conv-grouped"),
    case("Conv", [X4, "w"], inits={"w": W33}, dilations=[2, 1], id="Conv-dilated"),
    case("Conv", [X4, "w", "b"], inits={"w": W33, "b": B4}, extra=[helper.make_node("Relu", ["y"], ["z"])],
         id="Conv-Relu"),
    case("ConvTranspose", [X4, "w", "b"], inits={"w": R.standard_normal((3, 2, 3, 3)).astype(F32),
                                                 "b": B4[:2]}, strides=[2, 2], output_padding=[1, 0]),
    case("DeformConv", [("x", F32, [1, 2, 5, 5]), "w", ("o", F32, [1, 18, 3, 3]), "b"], opset=19,
         inits={"w": R.standard_normal((3, 2, 3, 3)).astype(F32), "b": B4[:3]}),
    case("MaxPool", [X4], outs=("y", "i"), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    case("AveragePool", [X4], kernel_shape=[3, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    case("LpPool", [X4], kernel_shape=[2, 2], p=3),
    case("MaxUnpool", [("x", F32, [1, 1, 2, 2]), ("i", I64, [1, 1, 2, 2], np.array([[[[0, 7], [9, 15]]]], I64))],
         kernel_shape=[2, 2], strides=[2, 2]),
    case("BatchNormalization", [X4, "s", "b", "m", "v"],
         inits={"s": B4[:3], "b": B4[1:], "m": B4[:3] / 2, "v": np.abs(B4[1:]) + 0.5}, epsilon=1e-3),
    case("LayerNormalization", [("x", F32, [2, 3, 4]), "s", "b"], axis=1,
         inits={"s": R.standard_normal((3, 4)).astype(F32), "b": R.standard_normal((3, 4)).astype(F32)}),
    case("InstanceNormalization", [X4, "s", "b"], inits={"s": B4[:3], "b": B4[1:]}),
    case("GroupNormalization", [("x", F32, [2, 4, 3]), "s", "b"], opset=21, inits={"s": B4, "b": B4[::-1].copy()},
         num_groups=2, shapes={"y": [2, 4, 3]}),
    # image
    case("Pad", [("x", F32, [2, 3]), "p", "v"], inits={"p": np.array([1, 0, 0, 2], I64), "v": np.float32(9)}),
    *[case("Pad", [("x", F32, [2, 3, 4]), "p"], inits={"p": np.array([0, 1, 2, 0, 1, 1], I64)}, mode=m,
           opset=19, id=f"Pad-{m}") for m in ("reflect", "edge", "wrap")],
    case("Resize", [X4, "", "s"], inits={"s": np.array([1, 1, 1.5, 0.5], F32)}, mode="linear"),
    case("Resize", [X4, "", "", "z"], inits={"z": np.array([2, 3, 4, 9], I64)}, mode="cubic",
         coordinate_transformation_mode="align_corners", id="Resize-cubic"),
    case("Resize", [X4, "", "", "z"], inits={"z": np.array([2, 3, 9, 4], I64)}, mode="nearest",
         nearest_mode="floor", id="Resize-nearest"),
    case("GridSample", [X4, ("g", F32, [2, 4, 5, 2], "unit")], opset=20, mode="cubic", padding_mode="border"),
    case("AffineGrid", [("t", F32, [2, 2, 3]), "s"], opset=20, inits={"s": np.array([2, 3, 4, 5], I64)},
         align_corners=1),
    case("Col2Im", [("x", F32, [1, 4, 6]), "i", "b"], inits={"i": np.array([3, 4], I64),
                                                          "b": np.array([2, 2], I64)}),
    case("CenterCropPad", [("x", F32, [5, 4]), "s"], inits={"s": np.array([3, 7], I64)}),
    # attention
    case("Attention", [("q", F32, [2, 3, 4, 8]), ("k", F32, [2, 1, 6, 8]), ("v", F32, [2, 1, 6, 5])], opset=24,
         is_causal=1, softcap=2.0, id="Attention-gqa-causal"),
    case("Attention", [("q", F32, [2, 4, 12]), ("k", F32, [2, 6, 12]), ("v", F32, [2, 6, 6]),
                       ("m", np.bool_, [4, 6])], opset=24, q_num_heads=3, kv_num_heads=3, scale=0.3,
         id="Attention-3d-mask"),
    case("Attention", [("q", F32, [1, 2, 3, 4]), ("k", F32, [1, 2, 3, 4]), ("v", F32, [1, 2, 3, 4]), "",
                       ("pk", F32, [1, 2, 2, 4]), ("pv", F32, [1, 2, 2, 4])], outs=("y", "pk2", "pv2", "qk"),
         opset=24, qk_matmul_output_mode=3, id="Attention-past"),
    case("RotaryEmbedding", [("x", F32, [2, 3, 8]), ("c", F32, [2, 3, 2]), ("s", F32, [2, 3, 2])], opset=23,
         num_heads=2, rotary_embedding_dim=4, interleaved=1),
    case("Einsum", [("a", F32, [2, 3, 4]), ("b", F32, [2, 4, 5])], equation="bij,bjk->bik"),
    # recurrent
    case("LSTM", [("x", F32, [4, 2, 3]), "w", "r", "b", "", ("h", F32, [2, 2, 5]), ("c", F32, [2, 2, 5]), "p"],
         outs=("y", "yh", "yc"), hidden_size=5, direction="bidirectional",
         inits={"w": R.standard_normal((2, 20, 3)).astype(F32), "r": R.standard_normal((2, 20, 5)).astype(F32),
                "b": R.standard_normal((2, 40)).astype(F32), "p": R.standard_normal((2, 15)).astype(F32)}),
    case("GRU", [("x", F32, [4, 2, 3]), "w", "r", "b", ("n", np.int32, [2], np.array([4, 2], np.int32))],
         outs=("y", "yh"), hidden_size=5, linear_before_reset=1,
         inits={"w": R.standard_normal((1, 15, 3)).astype(F32), "r": R.standard_normal((1, 15, 5)).astype(F32),
                "b": R.standard_normal((1, 30)).astype(F32)}),
    case("RNN", [("x", F32, [4, 2, 3]), "w", "r"], outs=("y", "yh"), hidden_size=5, direction="reverse",
         activations=["LeakyRelu"], activation_alpha=[0.3], clip=2.0,
         inits={"w": R.standard_normal((1, 5, 3)).astype(F32), "r": R.standard_normal((1, 5, 5)).astype(F32)}),
    # select
    case("NonZero", [("x", F32, [3, 4], np.array([[0, 1, 0, 2], [3, 0, 0, 0], [0, 0, 4, 5]], F32))]),
    case("Compress", [("x", F32, [3, 4]), ("c", np.bool_, [3], np.array([True, False, True]))], axis=0),
    case("Unique", [("x", F32, [6], np.array([2, 1, 2, 3, 1, 1], F32))], outs=("y", "i", "inv", "n"), sorted=0),
    case("NonMaxSuppression", [("b", F32, [1, 6, 4], "pos"), ("s", F32, [1, 2, 6], "pos"), "m", "iou", "t"],
         inits={"m": np.array([3], I64), "iou": np.array([0.3], F32), "t": np.array([0.6], F32)}),
    # signal
    case("DFT", [("x", F32, [2, 8, 1]), "", "a"], opset=20, inits={"a": np.array(1, I64)}, onesided=1),
    case("DFT", [("x", F32, [2, 5, 2]), "n", "a"], opset=20, inits={"n": np.array(8, I64),
                                                                    "a": np.array(-2, I64)}, inverse=1,
         id="DFT-inverse"),
    case("STFT", [("x", F32, [1, 32, 1]), "step", "w", "n"], opset=17,
         inits={"step": np.array(4, I64), "w": np.hanning(8).astype(F32), "n": np.array(8, I64)}),
    case("HannWindow", [("n", np.int32, [], np.array(10, np.int32))], opset=17, periodic=0, shapes={"y": [10]}),
    case("MelWeightMatrix", [("m", I64, [], np.array(4, I64)), ("d", I64, [], np.array(16, I64)),
                             ("r", I64, [], np.array(8000, I64)), ("lo", F32, [], np.array(100, F32)),
                             ("hi", F32, [], np.array(3000, F32))], opset=17, shapes={"y": [9, 4]}),
    # quantize
    case("QuantizeLinear", [("x", F32, [2, 3]), "s", "z"], inits={"s": np.array([0.1, 0.2, 0.05], F32),
                                                            "z": np.array([3, -2, 0], np.int8)}, axis=1),
    case("DequantizeLinear", [("x", np.uint8, [2, 3]), "s", "z"], inits={"s": np.float32(0.3),
                                                                     "z": np.uint8(128)}),
    case("DynamicQuantizeLinear", [("x", F32, [2, 5])], outs=("y", "s", "z")),
    # losses
    case("SoftmaxCrossEntropyLoss", [("x", F32, [3, 4, 2]), ("t", I64, [3, 2], (0, 4)), "w"], outs=("l", "lp"),
         inits={"w": np.array([1, 2, 0.5, 1], F32)}, reduction="mean"),
    case("NegativeLogLikelihoodLoss", [("x", F32, [4, 3]), ("t", I64, [4], np.array([0, 2, 1, 2], I64))],
         reduction="none", ignore_index=1),
]


@pytest.mark.parametrize("op_type, ins, args, kwargs", CASES)
def test_one_node_graphs_run_as_the_originals(op_type, ins, args, kwargs):
    _check_one_node(op_type, ins, args, kwargs, session)


# What onnxruntime 1.32 does not run: RoiAlign's opset-22 form (ONNX's reference evaluator
# runs both models), SAME padding of a dilated window (the reference runs the original; the
# exporter writes the pads it comes to, which onnxruntime runs).
REFERENCE_CASES = [
    case("RoiAlign", [X4, ("r", F32, [3, 4], np.array([[0, 0, 4, 4], [1, 2, 5.5, 3], [2.5, 0.5, 3, 5]], F32)),
                      ("i", I64, [3], np.array([0, 1, 1], I64))], opset=22, output_height=2, output_width=3,
         sampling_ratio=2, spatial_scale=0.9),
    case("Conv", [X4, "w"], inits={"w": W33}, dilations=[2, 2], auto_pad="SAME_LOWER", id="Conv-dilated-same"),
    case("MaxPool", [X4], kernel_shape=[2, 3], dilations=[2, 1], auto_pad="SAME_UPPER", id="MaxPool-dilated-same"),
]


@pytest.mark.parametrize("op_type, ins, args, kwargs", REFERENCE_CASES)
def test_one_node_graphs_run_as_the_originals_in_onnx_reference(op_type, ins, args, kwargs):
    from onnx.reference import ReferenceEvaluator
    _check_one_node(op_type, ins, args, kwargs, ReferenceEvaluator,
                    ReferenceEvaluator if op_type == "RoiAlign" else session)


def _check_one_node(op_type, ins, args, kwargs, run, run_exported=None):
    model, inputs = node_model(op_type, ins, *args, **kwargs)
    rng = np.random.default_rng(0)
    feeds = {n: _sample(rng, d, [3 if isinstance(s, str) else s for s in shape], *how)
             for n, d, shape, *how in inputs}
    got = (run_exported or run)(round_trip(model)).run(None, feeds)
    for g, w in zip(got, run(model).run(None, feeds), strict=True):
        assert_same(g, w)


def _graph(nodes, name, inputs, outputs, initializers=()):
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_control_flow_exports_as_if_and_loop():
    """If (a condition known when running) and Loop (a trip count, a condition, a carried
    value and a scan output) become If and Loop, and run as the original. (The Loop is
    given its first condition: onnxruntime reads the body's condition even without one,
    which ONNX's specification and edgeflow do not.)"""
    f = TensorProto.FLOAT
    then = _graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [_vi("t", f, [3])],
                  [numpy_helper.from_array(np.full(3, 2, F32), "two")])
    other = _graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", f, [3])])
    body = _graph([helper.make_node("Add", ["acc", "x"], ["acc2"]),
                   helper.make_node("ReduceSum", ["acc2"], ["total"], keepdims=0),
                   helper.make_node("Less", ["total", "limit"], ["go"]),
                   helper.make_node("Identity", ["acc2"], ["seen"])], "body",
                  [_vi("i", TensorProto.INT64, []), _vi("c", TensorProto.BOOL, []), _vi("acc", f, [3])],
                  [_vi("go", TensorProto.BOOL, []), _vi("acc2", f, [3]), _vi("seen", f, [3])])
    nodes = [helper.make_node("If", ["flag"], ["branch"], then_branch=then, else_branch=other),
             helper.make_node("Loop", ["trips", "start", "branch"], ["final", "stack"], body=body)]
    graph = _graph(nodes, "control", [_vi("flag", TensorProto.BOOL, []), _vi("x", f, [3]),
                                      _vi("trips", TensorProto.INT64, []), _vi("start", TensorProto.BOOL, []),
                                      _vi("limit", f, [])],
                   [_vi("final", f, [3]), _vi("stack", f, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    exported = round_trip(model)
    assert [n.op_type for n in exported.graph.node].count("If") == 1
    assert [n.op_type for n in exported.graph.node].count("Loop") == 1
    for flag, trips, start, limit in ((True, 5, True, 100.0), (False, 5, True, 100.0), (True, 9, True, 12.0),
                                      (True, 0, True, 1.0), (True, 4, False, 100.0)):
        x = np.array([1.0, -0.5, 2.0], F32)
        assert_runs_as(exported, model, {"flag": np.array(flag), "x": x, "trips": np.array(trips, I64),
                                         "start": np.array(start), "limit": np.array(limit, F32)})


# -- ops that ONNX models do not give edgeflow: edgeflow's interpreter as the reference ----------

def _built(build, feeds, run=session):
    """A graph of `build(placeholders)` -> outputs, exported; its outputs run by `run(exported)`
    (onnxruntime) and the interpreter's."""
    g = ef.Graph()
    with g.as_default():
        inputs = {k: ef.placeholder(ef.dtypes.as_dtype(v.dtype), list(v.shape), name=k) for k, v in feeds.items()}
        outputs = build(**inputs)
    model = ef.to_model(g, {"infer": (inputs, outputs)})
    blob = writer.to_bytes(model)
    exported = exporter.export(blob)
    onnx.checker.check_model(exported, full_check=True)
    names = [o.name for o in exported.graph.output]
    want = ef.Interpreter(blob).get_signature_runner("infer")(**feeds)
    return exported, dict(zip(names, run(exported).run(None, feeds))), want


EDGEFLOW_ONLY = {
    # mod of floats with the divisor's sign: ONNX's Mod refuses fmod=0 for floats
    "mod-floats": (lambda a, b: {"y": apply("mod", [a, b], {"fmod": False})},
                   {"a": np.array([5.5, -5.5, 5.5, -5.5, 0, 3], F32), "b": np.array([2, 2, -2, -2, 3, 3], F32)}),
    "matmul-transposed-3d": (lambda a, b: {"y": apply("matmul", [a, b], {"transpose_a": True,
                                                                         "transpose_b": True})},
                             {"a": R.standard_normal((2, 4, 3), F32), "b": R.standard_normal((2, 5, 4), F32)}),
    "matmul-relu6": (lambda a, b: {"y": apply("matmul", [a, b], {"activation": "relu6"})},
                     {"a": R.standard_normal((3, 4), F32) * 3, "b": R.standard_normal((4, 5), F32) * 3}),
    "matmul-swish": (lambda a, b: {"y": apply("matmul", [a, b], {"activation": "swish"})},
                     {"a": R.standard_normal((3, 4), F32) * 3, "b": R.standard_normal((4, 5), F32) * 3}),
    "add-hard-swish": (lambda a, b: {"y": apply("add", [a, b], {"activation": "hard_swish"})},
                       {"a": R.standard_normal((3, 5), F32) * 3, "b": R.standard_normal((5,), F32) * 3}),
    "swiglu": (lambda a, b: {"y": apply("swiglu", [a, b], {"alpha": 1.2})},
               {"a": R.standard_normal((2, 6), F32), "b": R.standard_normal((2, 6), F32)}),
    "clip-int-past-range": (lambda x: {"y": apply("clip", [x], {"min": -1e12, "max": 4.0})},
                            {"x": np.arange(-6, 7, dtype=np.int32)}),
    "reshape-zero-length": (lambda x: {"y": apply("reshape", [x], {"shape": (0, 5)})},
                            {"x": np.zeros((0, 5), F32)}),
    "range-vectors": (lambda a, b: {"y": apply("range", [a, b, np.array([2], np.int32)])},
                      {"a": np.array([1], np.int32), "b": np.array([8], np.int32)}),
    "swish": (lambda x: {"y": apply("swish", [x], {"alpha": 0.5})}, {"x": R.standard_normal((4,), F32)}),
    "split-even": (lambda x: dict(zip("pq", apply("split", [x], {"axis": 1, "num_outputs": 2}))),
                   {"x": R.standard_normal((2, 6), F32)}),
    # MediaPipe's landmark ops (tests/ops/test_geometry.py checks the interpreter against its kernels)
    "landmarks_to_transform_matrix": (
        lambda x: {"y": apply("landmarks_to_transform_matrix", [x], {
            "left": 1, "right": 4, "subset": (0, 2, 3, 5, 7), "output_size": (4, 6), "scale": (1.5, 1.25),
            "target_rotation": 0.4})},
        {"x": R.uniform(-5, 20, (3, 9, 3)).astype(F32)}),
    "landmarks_to_transform_matrix-one-point": (  # left and right on one point: atan2(0, 0) = 0
        lambda x: {"y": apply("landmarks_to_transform_matrix", [x], {
            "left": 1, "right": 2, "subset": (0, 1, 3), "output_size": (4, 4)})},
        {"x": np.array([[[0, 0], [2, 3], [2, 3], [5, 1]]], F32)}),
    "transform_landmarks": (lambda x, m: {"y": apply("transform_landmarks", [x, m])},
                            {"x": R.standard_normal((2, 7, 3), F32), "m": R.standard_normal((1, 4, 4), F32)}),
    "transform_landmarks-2d": (lambda x, m: {"y": apply("transform_landmarks", [x, m])},
                               {"x": R.standard_normal((2, 7, 2), F32), "m": R.standard_normal((2, 4, 4), F32)}),
    "transform_tensor_bilinear": (
        lambda x, m: {"y": apply("transform_tensor_bilinear", [x, m], {"output_size": (4, 5)})},
        {"x": R.standard_normal((2, 3, 6, 7), F32),
         "m": np.array([[[0.9, -0.4, 0, 1.5], [0.4, 0.9, 0, 0.5], [0, 0, 1, 0], [0, 0, 0, 1]]], F32)}),
    "transform_tensor_bilinear-corners": (
        lambda x, m: {"y": apply("transform_tensor_bilinear", [x, m], {"output_size": (5, 3), "half_pixel": False})},
        {"x": R.standard_normal((1, 2, 4, 1), F32),
         "m": np.array([[[0.5, 0, 0, -0.25], [0, 1.1, 0, -0.5], [0, 0, 1, 0], [0, 0, 0, 1]]], F32)}),
}


@pytest.mark.parametrize("name", EDGEFLOW_ONLY)
def test_edgeflow_ops_without_an_onnx_source_run_as_edgeflow_runs_them(name):
    build, feeds = EDGEFLOW_ONLY[name]
    _, got, want = _built(build, feeds)
    for key in want:
        assert_same(got[key], want[key])


def test_random_uniform_draws_in_its_range():
    """Other numbers than edgeflow's (another generator), of the same shape, dtype and bounds:
    RandomUniformLike, run by ONNX's reference evaluator (onnxruntime 1.32 has no kernel for
    its opset-22 form)."""
    from onnx.reference import ReferenceEvaluator
    exported, got, want = _built(
        lambda s: {"y": apply("random_uniform", [s], {"minval": 2.0, "maxval": 3.0, "dtype": np.float64})},
        {"s": np.array([50, 4], I64)}, ReferenceEvaluator)
    assert got["y"].shape == want["y"].shape == (50, 4) and got["y"].dtype == np.float64
    assert 2.0 <= got["y"].min() and got["y"].max() < 3.0 and got["y"].std() > 0.1


# -- a package trained on the device -----------------------------------------------------------

def test_a_package_trained_on_the_device_exports_its_trained_weights(tmp_path):
    """convert --trainable, a few train steps, Interpreter.export: the exported ONNX model
    gives edgeflow's infer output with the trained weights, not the original's."""
    onnx_converter.convert(DATA / "mlp.onnx", tmp_path / "t.efl", trainable=True, optimizer="sgd:0.1")
    interp = ef.Interpreter(tmp_path / "t.efl")
    rng = np.random.default_rng(0)
    for _ in range(3):
        interp.get_signature_runner("train")(x=rng.standard_normal((8, 64), F32), labels=rng.integers(0, 10, 8))
    interp.export(tmp_path / "trained.efl")
    proto = exporter.export(tmp_path / "trained.efl", tmp_path / "trained.onnx")
    onnx.checker.check_model(str(tmp_path / "trained.onnx"), full_check=True)
    assert proto.graph.name == "infer" and [i.name for i in proto.graph.input] == ["x"]
    x = rng.standard_normal((5, 64), F32)
    want = interp.get_signature_runner("infer")(x=x)["logits"]
    got = session(str(tmp_path / "trained.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    original = session(str(DATA / "mlp.onnx")).run(None, {"x": x})[0]
    assert np.abs(got - original).max() > 100 * np.abs(got - want).max()


# -- what ONNX cannot say, and which signature ----------------------------------------------

def test_every_op_exports_or_says_why_not():
    """Every op of edgeflow/ops has an exporter, but those that write variables, talk to the
    cloud, only train (gradients, an optimizer's step), or are ONNX ops of a later opset;
    each of those says why."""
    missing = {name for name in ops.names() if name not in exporter.EXPORTERS}
    stateful = {name for name in missing if ops.get(name).stateful}
    remote = {name for name in missing if ops.get(name).remote}
    gradients = {name for name in missing if name.endswith("_grad") or name == "sum_to"}
    gradients |= set(exporter.TRAINING_OPS)
    assert stateful == {"assign", "assign_add", "assign_sub"} and remote == {"send", "recv"}
    assert missing - stateful - remote - gradients == set(exporter.NOT_AT_OPSET) == {"bitcast", "cumprod"}
    assert all(exporter.why_not(name) != exporter.why_not("no such op") for name in missing)


def test_exporters_sit_in_the_module_of_their_op():
    """As the converter's handlers: exporters/<m>.py writes the ops that edgeflow/ops/<m>.py defines."""
    placed = {name: module.rsplit(".", 1)[1] for name, module in exporter.MODULES.items()}
    home = {name: ops.get(name).infer.__module__.rsplit(".", 1)[1] for name in placed}
    assert {n: m for n, m in placed.items() if m != home[n]} == {}


def test_one_node_exports_read_back_as_the_same_op():
    """Each SAME entry writes an ONNX type that the converter reads back as that very op."""
    tables = [getattr(sys.modules[m], "SAME", {}) for m in set(exporter.MODULES.values())]
    same = {op: onnx_type for table in tables for op, onnx_type in table.items()}
    assert len(same) > 80 and {op: BUILDS.get(onnx_type) for op, onnx_type in same.items()} == {op: op for op in same}


def test_unmappable_ops_are_listed_all_at_once_one_line_each():
    def build(x, i):
        bits = apply("bitcast", [x], {"dtype": np.int32})
        shifted = apply("bit_shift", [i, i], {"left": True})
        twice = apply("bitcast", [apply("neg", [x])], {"dtype": np.int32})
        return {"y": apply("add", [apply("add", [bits, twice]), shifted]),
                "p": apply("cumprod", [x], {"axis": 0})}
    g = ef.Graph()
    with g.as_default():
        x, i = ef.placeholder(ef.float32, [4], name="x"), ef.placeholder(ef.int32, [4], name="i")
        model = ef.to_model(g, {"infer": ({"x": x, "i": i}, build(x, i))})
    with pytest.raises(UnsupportedOpError) as e:
        exporter.to_onnx(model)
    lines = str(e.value).splitlines()
    assert lines[0] == "3 edgeflow op(s) have no ONNX form at opset 24:"
    assert len(lines) == 4 and lines[1].startswith("  bit_shift: ONNX's BitShift takes unsigned integers")
    assert "bitcast: ONNX's BitCast is opset 26" in lines[2] and "cumprod" in lines[3]
    assert sorted(op for op, *_ in e.value.ops) == ["bit_shift", "bitcast", "bitcast", "cumprod"]


def test_the_signature_exported():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 2], name="x")
        w = ef.Variable(np.ones((2, 1), F32), name="w")
        y = ef.matmul(x, w, name="y")
        update = ef.assign_add(w, ef.constant(np.ones((2, 1), F32)))
    signatures = {"train": ({"x": x}, {}, [update]), "predict": ({"x": x}, {"y": y}),
                  "double": ({"x": x}, {"z": ef.add(y, y)})}
    model = ef.to_model(g, signatures, state_signatures=False)
    assert exporter.to_onnx(model).graph.name == "predict"  # no infer: the first that does not train
    assert [o.name for o in exporter.to_onnx(model, "double").graph.output] == ["z"]
    with pytest.raises(ConversionError, match=r"^no signature 'infer'; the model has train, predict, double$"):
        exporter.to_onnx(model, "infer")
    with pytest.raises(UnsupportedOpError, match="assign_add: writes a variable"):
        exporter.to_onnx(model, "train")


# -- the command line ---------------------------------------------------------------------------

def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_the_export_command(tmp_path):
    onnx_converter.convert(DATA / "digits_cnn.onnx", tmp_path / "d.efl")
    done = edgeflow("export", tmp_path / "d.efl")
    assert done.returncode == 0, done.stderr
    assert f"-> {tmp_path / 'd.onnx'}" in done.stdout and "opset        24" in done.stdout
    image = np.load(DATA / "digits_test.npz")["X"][:4]
    assert_runs_as(onnx.load(str(tmp_path / "d.onnx")), str(DATA / "digits_cnn.onnx"), {"image": image})
    done = edgeflow("export", tmp_path / "d.efl", "-o", tmp_path / "x.onnx", "-s", "infer")
    assert done.returncode == 0 and (tmp_path / "x.onnx").exists()
    help_text = edgeflow("export", "--help").stdout
    assert "example: edgeflow export" in help_text and "--signature" in help_text


@pytest.mark.parametrize("args, message", [
    (["missing.efl"], "edgeflow export: error: [Errno 2] No such file or directory: 'missing.efl'"),
    (["d.efl", "-s", "train"], "edgeflow export: error: no signature 'train'; the model has infer"),
    (["bad.efl"], "edgeflow export: error: "),
])
def test_export_command_errors_are_one_typed_line(tmp_path, args, message):
    onnx_converter.convert(DATA / "mlp.onnx", tmp_path / "d.efl")
    (tmp_path / "bad.efl").write_bytes(b"not a model at all")
    done = subprocess.run([sys.executable, "-m", "edgeflow", "export", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.onnx"))
