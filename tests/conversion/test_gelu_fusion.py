"""optimize.fuse_tanh_gelu: GELU's tanh approximation written out in ops (GPT-2's
NewGELUActivation as PyTorch exports it: Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul) converts to
one gelu op (approximate "tanh") in the operand orders exporters write, with onnxruntime's
results; a chain whose constants or readers differ stays as it is."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter

SQRT_2_PI = float(np.sqrt(2 / np.pi))


def _gelu_nodes(x, y, tag, cube="pow", half_first=False, constants_first=False, coefficient=0.044715):
    """Nodes computing y = 0.5 x (1 + tanh(sqrt(2/pi) (x + coefficient x^3))) from x, as GPT-2's
    export writes them ((x * 0.5) * (1 + tanh(...)), x^3 by Pow) or otherwise: the cube as
    x * (x * x), the half on the other product (x * ((1 + tanh(...)) * 0.5)), each
    constant as the first operand."""
    def mul(a, b, out):
        return helper.make_node("Mul", [b, a] if constants_first and b.startswith("c_") else [a, b], [out])

    def add(a, b, out):
        return helper.make_node("Add", [b, a] if constants_first and b.startswith("c_") else [a, b], [out])
    t = lambda name: f"{tag}_{name}"  # noqa: E731
    if cube == "pow":
        nodes = [helper.make_node("Pow", [x, "c_three"], [t("cube")])]
    else:
        nodes = [mul(x, x, t("square")), mul(x, t("square"), t("cube"))]
    nodes += [mul(t("cube"), f"c_{tag}_k", t("scaled_cube")), add(x, t("scaled_cube"), t("inner")),
              mul(t("inner"), "c_root", t("arg")), helper.make_node("Tanh", [t("arg")], [t("tanh")]),
              add(t("tanh"), "c_one", t("one_plus"))]
    if half_first:
        nodes += [mul(t("one_plus"), "c_half", t("halved")), mul(x, t("halved"), y)]
    else:
        nodes += [mul(x, "c_half", t("half_x")), mul(t("half_x"), t("one_plus"), y)]
    return nodes, {f"c_{tag}_k": np.float32(coefficient)}


def _model():
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((6, 16)).astype(np.float32), "b1": rng.standard_normal(16).astype(np.float32),
             "w2": rng.standard_normal((16, 3)).astype(np.float32), "c_three": np.float32(3.0),
             "c_root": np.float32(SQRT_2_PI), "c_one": np.float32(1.0), "c_half": np.float32(0.5)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"])]
    for tag, x, y, options in (("a", "h", "g1", {}),  # GPT-2's
                               ("b", "g1", "g2", {"cube": "mul", "half_first": True, "constants_first": True}),
                               ("c", "g2", "g3", {"coefficient": 0.05}),  # not GELU's constant: kept
                               ("d", "g3", "g4", {})):
        found, constants = _gelu_nodes(x, y, tag, **options)
        nodes += found
        inits.update(constants)
    # d's tanh is read by another op too: its chain is kept
    nodes += [helper.make_node("Add", ["g4", "d_tanh"], ["e"]), helper.make_node("Gemm", ["e", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
                               helper.make_tensor_value_info("g2", TensorProto.FLOAT, ["n", 16])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_tanh_gelu_written_out_becomes_one_gelu_with_onnxruntime_results(tmp_path):
    model = _model()
    fused = onnx_converter.convert(model, tmp_path / "f.efl")
    plain = onnx_converter.convert(model, tmp_path / "p.efl", optimize=False)
    assert "gelu" not in plain.ops and plain.ops["tanh"] == 4
    assert fused.ops["gelu"] == 2 and fused.ops["tanh"] == 2  # a and b fused; c and d kept
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for path in ("f.efl", "p.efl"):
        runner = ef.Interpreter(tmp_path / path).get_signature_runner("infer")
        for n in (1, 9):
            x = (np.random.default_rng(n).standard_normal((n, 6)) * 2).astype(np.float32)
            expected, g2 = session.run(None, {"x": x})
            got = runner(x=x)
            np.testing.assert_allclose(got["y"], expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
            # the second GELU's output itself, closely (erf's GELU is 1e-4 off the tanh form's)
            np.testing.assert_allclose(got["g2"], g2, rtol=2e-6, atol=2e-6)
