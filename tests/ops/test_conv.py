"""conv and conv_transpose against onnxruntime's Conv and ConvTranspose (one-node models)."""
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from . import harness
from .harness import assert_close
from .onnx_reference import onnx_node

ACTIVATIONS = {"": lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6),
               "swish": lambda y: y / (1 + np.exp(-y)), "hard_swish": lambda y: y * np.clip(y + 3, 0, 6) / 6}
ONNX_NAMES = {"conv": "Conv", "conv_transpose": "ConvTranspose"}


def reference(op, x, w, b, attrs):
    """onnxruntime's result, then the fused activation (which ONNX has no attribute for)."""
    onnx_attrs = {k: v for k, v in attrs.items() if k != "activation"}
    evaluator = "reference" if x.dtype == np.float64 else "onnxruntime"  # no float64 Conv there
    y = onnx_node(ONNX_NAMES[op], x, [w] + ([b] if b is not None else []), onnx_attrs, evaluator=evaluator)
    return ACTIVATIONS[attrs.get("activation", "")](y)


def edgeflow_op(op, x, w, b, attrs, run=harness.run_op, shape=None):
    operands = [w] + ([b] if b is not None else [])
    return run(lambda t: apply(op, [t] + operands, attrs), x, shapes=[shape or x.shape])


def operands(rng, x_shape, w_shape, bias, dtype="float32"):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0] if bias else 0).astype(dtype) if bias else None
    return x, w, b


def check(op, rng, run_op, x_shape, w_shape, attrs, bias=True, dtype="float32", tol=2e-5):
    x, w, b = operands(rng, x_shape, w_shape, bias, dtype)
    if op == "conv_transpose" and b is not None:
        b = rng.standard_normal(w_shape[1] * attrs.get("group", 1)).astype(dtype)
    got = edgeflow_op(op, x, w, b, attrs, run_op)
    assert_close(got, reference(op, x, w, b, attrs), dtype, rtol=tol, atol=tol)
    return got


CONV_CASES = {
    "3x3 same": ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    "odd sizes, stride 2": ((2, 3, 9, 7), (5, 3, 3, 3), {"strides": (2, 2)}),
    "asymmetric pads and strides": ((1, 4, 11, 6), (3, 4, 3, 2), {"strides": (2, 1), "pads": (0, 2, 1, 0)}),
    "dilations": ((1, 2, 10, 9), (3, 2, 3, 2), {"dilations": (2, 3), "pads": (2, 1, 2, 1)}),
    "groups 2": ((2, 4, 7, 7), (6, 2, 3, 3), {"group": 2, "pads": (1, 1, 1, 1)}),
    "depthwise": ((2, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "pads": (1, 1, 1, 1)}),
    "depthwise stride 2": ((1, 5, 9, 9), (5, 1, 3, 3),
                           {"group": 5, "strides": (2, 2), "pads": (1, 0, 1, 0)}),
    "depthwise multiplier 2": ((1, 3, 6, 7), (6, 1, 3, 3), {"group": 3, "dilations": (1, 2)}),
    "depthwise 5x5": ((1, 4, 12, 12), (4, 1, 5, 5), {"group": 4, "pads": (2, 2, 2, 2)}),
    "1x1": ((2, 8, 5, 7), (16, 8, 1, 1), {}),
    "1x1 groups": ((1, 8, 5, 5), (4, 4, 1, 1), {"group": 2}),
    "1x1 stride 2": ((1, 8, 7, 7), (4, 8, 1, 1), {"strides": (2, 2)}),
    "1x1 padded": ((1, 3, 4, 4), (2, 3, 1, 1), {"pads": (1, 0, 0, 1)}),
    "kernel as large as input": ((1, 2, 4, 5), (3, 2, 4, 5), {}),
    "batch 4": ((4, 3, 6, 6), (2, 3, 3, 3), {"pads": (1, 1, 1, 1), "strides": (2, 2)}),
    "1-D": ((2, 3, 17), (4, 3, 5), {"strides": (2,), "pads": (2, 1)}),
    "1-D dilated grouped": ((1, 4, 20), (4, 2, 3), {"dilations": (3,), "group": 2}),
    "1-D depthwise": ((3, 4, 10), (4, 1, 3), {"group": 4, "pads": (1, 1)}),
    "3-D": ((1, 2, 5, 6, 4), (3, 2, 3, 3, 2), {"strides": (1, 2, 1), "pads": (1, 0, 1, 0, 1, 0)}),
    "3-D depthwise": ((1, 3, 4, 5, 5), (3, 1, 2, 3, 3), {"group": 3}),
    "same upper": ((1, 2, 7, 8), (3, 2, 3, 4), {"auto_pad": "SAME_UPPER", "strides": (2, 3)}),
    "same lower": ((1, 2, 7, 8), (3, 2, 4, 3), {"auto_pad": "SAME_LOWER", "strides": (2, 1)}),
    "valid": ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": (2, 2)}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(run_op, rng, case, bias):
    x_shape, w_shape, attrs = CONV_CASES[case]
    check("conv", rng, run_op, x_shape, w_shape, attrs, bias)


@pytest.mark.parametrize("activation", ["relu", "relu6", "swish", "hard_swish"])
@pytest.mark.parametrize("case", ["3x3 same", "depthwise", "depthwise 5x5", "1x1", "groups 2", "odd sizes, stride 2"])
def test_conv_fused_activation(run_op, rng, case, activation):
    x_shape, w_shape, attrs = CONV_CASES[case]
    got = check("conv", rng, run_op, x_shape, w_shape, {**attrs, "activation": activation})
    if activation.startswith("relu"):
        assert got.min() == 0 and (activation == "relu" or got.max() <= 6)


@pytest.mark.parametrize("activation", ["swish", "hard_swish"])
@pytest.mark.parametrize("case", ["3x3 same", "depthwise 5x5", "1x1"])
def test_conv_fused_activation_float64(run_op, rng, case, activation):
    x_shape, w_shape, attrs = CONV_CASES[case]
    check("conv", rng, run_op, x_shape, w_shape, {**attrs, "activation": activation}, dtype="float64", tol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_conv_dtypes(run_op, rng, dtype):
    tol = 2e-2 if dtype == "float16" else 1e-12
    check("conv", rng, run_op, (1, 3, 6, 6), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}, dtype=dtype, tol=tol)
    check("conv", rng, run_op, (1, 4, 6, 6), (4, 1, 3, 3), {"group": 4}, dtype=dtype, tol=tol)


TRANSPOSE_CASES = {
    "plain": ((1, 3, 5, 5), (3, 2, 3, 3), {}),
    "stride 2": ((2, 4, 4, 5), (4, 3, 3, 3), {"strides": (2, 2)}),
    "stride 2 pads output_padding": ((1, 3, 5, 4), (3, 2, 3, 3),
                                     {"strides": (2, 2), "pads": (1, 1, 1, 1), "output_padding": (1, 1)}),
    "asymmetric": ((1, 2, 4, 6), (2, 3, 2, 4), {"strides": (3, 2), "pads": (0, 1, 2, 0),
                                               "output_padding": (2, 0)}),
    "output_padding past the taps": ((1, 2, 3, 3), (2, 2, 2, 2),
                                     {"strides": (3, 3), "output_padding": (2, 1)}),
    "stride 2 kernel 2": ((1, 4, 6, 6), (4, 4, 2, 2), {"strides": (2, 2)}),
    "dilations": ((1, 2, 4, 4), (2, 3, 3, 2), {"dilations": (2, 3), "strides": (2, 1)}),
    "groups 2": ((2, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    "depthwise": ((1, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "strides": (2, 2), "output_padding": (1, 1)}),
    "1-D": ((2, 3, 7), (3, 2, 4), {"strides": (2,), "pads": (1, 2)}),
    "3-D": ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": (2, 1, 2)}),
    "same upper": ((1, 2, 5, 4), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    "valid": ((1, 2, 5, 4), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": (2, 1)}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose(run_op, rng, case, bias):
    x_shape, w_shape, attrs = TRANSPOSE_CASES[case]
    check("conv_transpose", rng, run_op, x_shape, w_shape, attrs, bias)


def test_conv_transpose_relu(run_op, rng):
    x_shape, w_shape, attrs = TRANSPOSE_CASES["stride 2 pads output_padding"]
    got = check("conv_transpose", rng, run_op, x_shape, w_shape, {**attrs, "activation": "relu6"})
    assert got.min() == 0 and got.max() <= 6


@st.composite
def conv_problems(draw):
    """A random valid conv: 1 or 2 spatial axes, any group that divides the channels."""
    d = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]))
    per_group = draw(st.integers(1, 3))
    outs = group * draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 4)) for _ in range(d)]
    dilations = [draw(st.integers(1, 3)) for _ in range(d)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * d)]
    strides = [draw(st.integers(1, 3)) for _ in range(d)]
    extents = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
    sizes = [draw(st.integers(max(1, e - pads[i] - pads[i + d]), e + 8)) for i, e in enumerate(extents)]
    batch = draw(st.integers(1, 3))
    attrs = {"strides": tuple(strides), "dilations": tuple(dilations), "pads": tuple(pads), "group": group}
    return (batch, group * per_group, *sizes), (outs, per_group, *kernel), attrs, draw(st.booleans())


@given(problem=conv_problems(), seed=st.integers(0, 2**32 - 1))
def test_conv_random(problem, seed):
    x_shape, w_shape, attrs, bias = problem
    check("conv", np.random.default_rng(seed), harness.run_op, x_shape, w_shape, attrs, bias, tol=1e-4)


@st.composite
def patch_problems(draw):
    """A conv whose windows tile x without overlap (kernel == strides, no padding), with
    rows and columns left past the last window; big enough, at times, to split."""
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    tiles = (draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    sizes = [k * t + draw(st.integers(0, k - 1)) for k, t in zip(kernel, tiles)]
    shape = (draw(st.integers(1, 3)), draw(st.integers(5, 12)), *sizes)  # past jit's stems (1-4 channels)
    return shape, (draw(st.integers(1, 70)), shape[1], *kernel), draw(st.booleans())


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("copy", ["numpy", "jit"])
def test_conv_of_patches_split_over_threads(batch, copy):
    """iris_landmark's 64->64 2x2 stride-2 conv at 32x32, and a ViT-style 8x8 patch embedding,
    on two threads: one image (output channels apart) and two (images apart)."""
    for x_shape, w_shape in (((batch, 64, 33, 32), (64, 64, 2, 2)), ((batch, 6, 64, 67), (48, 6, 8, 8))):
        check_patches((x_shape, w_shape, True), 2, batch, copy=copy)


@given(problem=patch_problems(), threads=st.sampled_from([None, 2]), seed=st.integers(0, 2**32 - 1),
       copy=st.sampled_from(["numpy", "jit"]))
def test_conv_of_patches(problem, threads, seed, copy):
    check_patches(problem, threads, seed, copy=copy)


@pytest.mark.parametrize("x_shape, w_shape, strides", [((1, 128, 2, 2), (213, 128, 2, 2), (1, 1)),
                                                     ((2, 6, 5, 4), (7, 6, 4, 3), (2, 2))])
@pytest.mark.parametrize("copy", ["numpy", "jit"])
def test_conv_of_one_window(x_shape, w_shape, strides, copy):
    """A conv with one window (a 1x1 output; iris_landmark's 2x2 conv over a 2x2 plane, and
    a window with rows left past it) takes _patches too, whatever its strides."""
    check_patches((x_shape, w_shape, True), None, 3, strides, copy)


def check_patches(problem, threads, seed, strides=None, copy="numpy"):
    """conv.py's _patches (the windows copied into columns, one product) against onnxruntime,
    on one thread and split over two; the path is the one taken, the copy `copy`'s: numpy's
    strided copy, or jit.py's patches_loop (numba loaded, as it is once a plan used it)."""
    from edgeflow.format import writer
    from edgeflow.interp.kernels import conv as conv_kernels, jit, native_gemm
    if copy == "jit":
        assert jit.available(), "numba does not import"
    x_shape, w_shape, bias = problem
    if math.prod(w_shape[2:]) == 1:
        return  # a 1x1 conv takes the pointwise path
    rng = np.random.default_rng(seed)
    x, w, b = operands(rng, x_shape, w_shape, bias)
    attrs = {"strides": strides or w_shape[2:], "activation": "relu"}
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x_shape, name="x")
        y = apply("conv", [t, w] + ([b] if b is not None else []), attrs)
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})),
                            num_threads=threads).get_signature_runner("infer")
    loops, bind, products, product = [], jit.bind_patches, [], native_gemm.bind
    with mock.patch.object(conv_kernels, "_patches", wraps=conv_kernels._patches) as patches, \
            mock.patch.object(jit, "loaded", lambda: copy == "jit"), \
            mock.patch.object(jit, "bind_patches", lambda *args: loops.append(bind(*args)) or loops[-1]), \
            mock.patch.object(native_gemm, "bind", lambda *a, **k: products.append(product(*a, **k)) or products[-1]):
        got = runner(x=x)["y"]  # planned now
    assert_close(got, reference("conv", x, w, b, attrs), "float32", rtol=1e-4, atol=1e-4)
    # The same columns, multiplied by native_gemm's product (conv_epilogue, in pieces over
    # threads) where it runs.
    assert (patches.call_count == 1) != any(p is not None for p in products)
    assert loops and all(loop is not None for loop in loops) if copy == "jit" else not any(loops)


@given(problem=conv_problems(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_conv_transpose_random(problem, seed, data):
    x_shape, w_shape, attrs, bias = problem
    group, d = attrs["group"], len(x_shape) - 2
    w_shape = (x_shape[1], w_shape[0] // group) + w_shape[2:]  # (C, M/group, *kernel)
    # PyTorch allows output_padding below stride or dilation; onnxruntime only below stride.
    attrs["output_padding"] = tuple(data.draw(st.integers(0, s - 1)) for s in attrs["strides"])
    full = [s * (n - 1) + (k - 1) * dl + 1 + e for n, k, s, dl, e in
            zip(x_shape[2:], w_shape[2:], attrs["strides"], attrs["dilations"], attrs["output_padding"])]
    attrs["pads"] = tuple(min(p, (f - 1) // 2) for p, f in zip(attrs["pads"], full + full))
    assert len(full) == d
    check("conv_transpose", np.random.default_rng(seed), harness.run_op, x_shape, w_shape, attrs, bias,
          tol=1e-4)


def test_conv_dynamic_batch_and_spatial(compile_graph, graph, rng):
    """Unknown dims at build time; SAME padding is resolved per run from the actual sizes."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = ef.placeholder("float32", (None, 3, None, None), name="x")
    attrs = {"auto_pad": "SAME_UPPER", "strides": (2, 2)}
    y = apply("conv", [x, w, b], attrs)
    assert y.shape == (None, 4, None, None)
    z = apply("conv", [x, w], {"strides": (1, 2), "pads": (1, 0, 1, 0)})
    assert z.shape == (None, 4, None, None)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for shape in [(1, 3, 8, 8), (3, 3, 7, 5), (2, 3, 12, 9), (1, 3, 8, 8)]:  # the last reuses a plan
        v = rng.standard_normal(shape).astype(np.float32)
        got = run(x=v)
        assert_close(got["y"], reference("conv", v, w, b, attrs), np.float32, 2e-5, 2e-5)
        assert_close(got["z"], reference("conv", v, w, None, {"strides": (1, 2), "pads": (1, 0, 1, 0)}),
                     np.float32, 2e-5, 2e-5)


def test_conv_transpose_dynamic_batch(compile_graph, graph, rng):
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    x = ef.placeholder("float32", (None, 3, 4, 5), name="x")
    attrs = {"strides": (2, 2), "pads": (1, 0, 0, 1), "output_padding": (1, 0)}
    y = apply("conv_transpose", [x, w], attrs)
    assert y.shape == (None, 2, 9, 10)
    run = compile_graph(graph, {"x": x}, {"y": y})
    for batch in (1, 3):
        v = rng.standard_normal((batch, 3, 4, 5)).astype(np.float32)
        assert_close(run(x=v)["y"], reference("conv_transpose", v, w, None, attrs), np.float32, 2e-5, 2e-5)


def test_conv_reads_fresh_inputs_each_run(compile_graph, graph, rng):
    """Buffers bound at prepare time (padding, columns) must not hold on to old inputs."""
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    x = ef.placeholder("float32", (1, 2, 5, 5), name="x")
    y = apply("conv", [ef.nn.relu(x), w], {"pads": (1, 1, 1, 1)})
    run = compile_graph(graph, {"x": x}, {"y": y})
    for _ in range(3):
        v = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
        assert_close(run(x=v)["y"], reference("conv", np.maximum(v, 0), w, None, {"pads": (1, 1, 1, 1)}),
                     np.float32, 2e-5, 2e-5)


BAD = [
    ("conv", (1, 3, 8, 8), (4, 2, 3, 3), {}, "channels"),
    ("conv", (1, 4, 8, 8), (3, 2, 3, 3), {"group": 2}, "divisible"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"group": 0}, "group"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"pads": (1, 1)}, "pads"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"strides": (0, 1)}, "strides"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"dilations": (1, 1, 1)}, "dilations"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"auto_pad": "SAME"}, "auto_pad"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "pads": (1, 1, 1, 1)}, "not both"),
    ("conv", (1, 3, 8, 8), (4, 3, 9, 3), {}, "larger"),
    ("conv", (1, 3, 8, 8), (4, 3, 3, 3), {"activation": "tanh"}, "activation"),
    ("conv", (1, 3, 8, 8), (4, 3, 3), {}, "rank"),
    ("conv", (3, 8), (4, 3), {}, "spatial"),
    ("conv_transpose", (1, 3, 4, 4), (2, 3, 3, 3), {}, "channels"),
    ("conv_transpose", (1, 3, 4, 4), (3, 2, 3, 3), {"group": 2}, "divisible"),
    ("conv_transpose", (1, 3, 4, 4), (3, 2, 3, 3), {"strides": (2, 2), "output_padding": (2, 0)},
     "output_padding"),
    ("conv_transpose", (1, 3, 2, 2), (3, 2, 2, 2), {"pads": (2, 2, 1, 1)}, "remove"),
]


@pytest.mark.parametrize("op, x_shape, w_shape, attrs, message", BAD)
def test_invalid_shapes_and_attrs(graph, op, x_shape, w_shape, attrs, message):
    x = ef.placeholder("float32", x_shape)
    with pytest.raises(GraphError, match=message):
        apply(op, [x, np.zeros(w_shape, np.float32)], attrs)


def test_invalid_bias_and_dtype(graph):
    x = ef.placeholder("float32", (1, 3, 8, 8))
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(GraphError, match="bias"):
        apply("conv", [x, w, np.zeros(3, np.float32)])
    with pytest.raises(GraphError, match="bias"):
        apply("conv", [x, w, np.zeros((4, 1), np.float32)])
    with pytest.raises(GraphError, match="float"):
        apply("conv", [x, w.astype(np.float64)])
    xi = ef.placeholder("int32", (1, 3, 8, 8))
    with pytest.raises(GraphError, match="float"):
        apply("conv", [xi, w.astype(np.int32)])


def _deform_reference(inputs, attrs, evaluator):
    from onnx import helper
    names = ["x", "w", "offset", "b", "mask"][:len(inputs)]
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    node = helper.make_node("DeformConv", [n if a is not None else "" for n, a in zip(names, inputs)], ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    model = helper.make_model(helper.make_graph(
        [node], "d", [helper.make_tensor_value_info(n, elem, a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", elem, None)]), opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    if evaluator == "reference":
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, feeds)[0]
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


DEFORM = {  # x shape, w shape, attrs, with bias, with mask
    "plain": ((1, 2, 5, 6), (3, 2, 3, 3), {}, False, False),
    "pads, strides, bias": ((2, 2, 6, 5), (4, 2, 2, 3), {"pads": [1, 0, 2, 1], "strides": [2, 1]}, True, False),
    "groups, offset groups, mask": ((1, 4, 5, 5), (6, 2, 2, 2), {"group": 2, "offset_group": 2}, True, True),
    "dilations, mask without bias": ((1, 2, 7, 6), (2, 2, 2, 2), {"dilations": [2, 3], "offset_group": 2}, False, True),
}


@pytest.mark.parametrize("evaluator", ["reference", "onnxruntime"])
@pytest.mark.parametrize("case", DEFORM)
def test_deform_conv(rng, case, evaluator):
    """The ONNX node converted, against ONNX's reference and onnxruntime."""
    from onnx import helper
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.format import writer
    x_shape, w_shape, attrs, with_bias, with_mask = DEFORM[case]
    attrs = {**attrs, "kernel_shape": list(w_shape[2:])}
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    r, og = 2, attrs.get("offset_group", 1)
    pads, strides, dil = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    out = [(x_shape[2 + i] + pads[i] + pads[i + 2] - dil[i] * (w_shape[2 + i] - 1) - 1) // strides[i] + 1
           for i in range(r)]
    taps = int(np.prod(w_shape[2:]))
    offset = (rng.standard_normal((x_shape[0], og * taps * r, *out)) * 1.5).astype(np.float32)
    bias = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    mask = rng.uniform(0, 1, (x_shape[0], og * taps, *out)).astype(np.float32) if with_mask else None
    inputs = [x, w, offset, bias, mask] if with_mask else [x, w, offset] + ([bias] if with_bias else [])
    want = _deform_reference(inputs, attrs, evaluator)
    names = ["x", "w", "offset", "b", "mask"][:len(inputs)]
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    node = helper.make_node("DeformConv", [n if a is not None else "" for n, a in zip(names, inputs)], ["y"], **attrs)
    model = helper.make_model(helper.make_graph(
        [node], "d", [helper.make_tensor_value_info(n, 1, a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", 1, want.shape)]), opset_imports=[helper.make_opsetid("", 19)])
    got = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")(**feeds)
    assert_close(got["y"], want, np.float32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_deform_conv_dtypes(run_op, rng, dtype):
    x = rng.standard_normal((1, 2, 4, 5))
    w = rng.standard_normal((2, 2, 2, 2))
    offset = rng.standard_normal((1, 8, 3, 4))
    want = _deform_reference([x, w, offset], {"kernel_shape": [2, 2]}, "reference")
    got = run_op(lambda *t: apply("deform_conv", list(t), {}), *(a.astype(dtype) for a in (x, w, offset)))
    # (the reference samples through GridSample, whose coordinates are float32)
    assert_close(got, want.astype(dtype), dtype, rtol=2e-2 if dtype == "float16" else 1e-5,
                 atol=5e-2 if dtype == "float16" else 1e-5)


@pytest.mark.parametrize("shapes, attrs, message", [
    ([(1, 2, 5, 5), (3, 2, 3, 3), (1, 16, 3, 3)], {}, "offset must be"),
    ([(1, 2, 5, 5), (3, 2, 3, 3), (1, 18, 3, 3), (3,), (1, 8, 3, 3)], {}, "mask must be"),
    ([(1, 3, 5, 5), (3, 3, 3, 3), (1, 36, 3, 3)], {"offset_group": 2}, "offset_group"),
    ([(1, 2, 5, 5), (3, 2, 3, 3), (1, 18, 3, 3)], {"kernel_shape": (2, 2)}, "kernel_shape"),
    ([(1, 2, 2, 2), (3, 2, 3, 3), (1, 18, 1, 1)], {}, "larger"),
])
def test_deform_conv_invalid(graph, shapes, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply("deform_conv", [ef.placeholder("float32", s) for s in shapes], attrs)


def _reaching_brute_force(sizes, kernel_shape, strides, dilations, begin, out_shape):
    """reaching_taps' spans by trying every output position of every tap."""
    spans = []
    for n, k, s, dl, b, o in zip(sizes, kernel_shape, strides, dilations, begin, out_shape):
        used = [t for t in range(k) if any(0 <= i * s + t * dl - b < n for i in range(o))]
        spans.append((used[0], used[-1] + 1) if used else (0, 0))
    return spans


@given(n=st.integers(1, 12), k=st.integers(1, 5), s=st.integers(1, 3), dl=st.integers(1, 9),
       b=st.integers(0, 20), e=st.integers(0, 20))
def test_reaching_taps_against_every_output_position(n, k, s, dl, b, e):
    from edgeflow.interp.kernels.conv import reaching_taps
    span = n + b + e - (k - 1) * dl - 1
    if span < 0:
        return
    geometry = ((n,), (k,), (s,), (dl,), (b,), (span // s + 1,))
    assert reaching_taps(*geometry) == _reaching_brute_force(*geometry)


def test_an_atrous_pyramid_on_a_small_map_keeps_the_taps_that_reach_it():
    """DeepLabV3's pyramid on a 14x14 map (3x3, dilation and padding 12, 24, 36): at 24 and 36
    only the centre reads the map (a 1x1 conv, unpadded), at 12 every tap reads some of it."""
    from edgeflow.interp.kernels.conv import reaching
    x = np.zeros((1, 8, 14, 14), np.float32)
    w = np.arange(4 * 8 * 9, dtype=np.float32).reshape(4, 8, 3, 3)
    w.flags.writeable = False
    for rate in (12, 24, 36):
        attrs = {"strides": (1, 1), "dilations": (rate, rate), "pads": (rate,) * 4, "auto_pad": "NOTSET", "group": 1}
        got, trimmed = reaching(x, w, attrs)
        if rate == 12:
            assert got is w and trimmed is attrs
        else:
            np.testing.assert_array_equal(got, w[:, :, 1:2, 1:2])
            assert trimmed["pads"] == (0, 0, 0, 0) and not got.flags.writeable
    variable = w.copy()  # a train step's weights: left whole (they change between runs)
    assert reaching(x, variable, {"strides": (1, 1), "dilations": (24, 24), "pads": (24,) * 4,
                                  "auto_pad": "NOTSET", "group": 1})[0] is variable


@st.composite
def padded_problems(draw):
    """A conv whose padding and dilation are large against x, so that some taps read only
    padding (an atrous pyramid on a small map), one group or depthwise, 1 or 2 spatial axes."""
    d = draw(st.integers(1, 2))
    depthwise = draw(st.booleans())
    c = draw(st.integers(1, 4))
    kernel = [draw(st.sampled_from([1, 3, 5])) for _ in range(d)]
    dilations = [draw(st.integers(1, 8)) for _ in range(d)]
    sizes = [draw(st.integers(1, 7)) for _ in range(d)]
    pads = [draw(st.integers(0, (k - 1) * dl + 2)) for k, dl in zip(kernel + kernel, dilations + dilations)]
    for i in range(d):  # the window must fit the padded axis
        extent = (kernel[i] - 1) * dilations[i] + 1
        pads[i + d] = max(pads[i + d], extent - sizes[i] - pads[i])
    strides = [draw(st.integers(1, 2)) for _ in range(d)]
    attrs = {"strides": tuple(strides), "dilations": tuple(dilations), "pads": tuple(pads),
             "group": c if depthwise else 1, "activation": draw(st.sampled_from(["", "relu"]))}
    m = c if depthwise else draw(st.integers(1, 5))
    return (draw(st.integers(1, 2)), c, *sizes), (m, 1 if depthwise else c, *kernel), attrs, draw(st.booleans())


@pytest.mark.parametrize("path", ["numpy", "jit"])
@given(problem=padded_problems(), seed=st.integers(0, 2**32 - 1))
def test_conv_with_taps_reading_only_padding(path, problem, seed):
    """Convs whose outer taps read only padding (dropped when the plan binds: `reaching`), or
    whose taps each reach a band of the outputs (`_reached`, however little it spares here),
    give onnxruntime's result, on numpy's kernels and on the compiled ones."""
    from edgeflow.interp.kernels import conv as conv_kernels
    from edgeflow.interp.kernels import jit
    x_shape, w_shape, attrs, bias = problem
    with mock.patch.dict("os.environ", {"EDGEFLOW_JIT": "1" if path == "jit" else "0"}), \
            mock.patch.object(conv_kernels, "REACHED_MIN_FLOPS", 0):  # tiny convs take conv._reached too
        if path == "jit":
            assert jit.available()
        check("conv", np.random.default_rng(seed), harness.run_op, x_shape, w_shape, attrs, bias, tol=1e-4)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("rate, stride, batch", [(12, 1, 1), (12, 1, 2), (8, 2, 1)])
def test_taps_reaching_a_band_of_the_outputs_multiply_only_there(monkeypatch, num_threads, rate, stride, batch):
    """A one-group conv whose taps each reach a band of the outputs (DeepLabV3's dilation-12
    3x3 on a 14x14 map, padded 12) runs each tap's product over its band alone (conv._reached:
    bound, not im2col's one product), with the bias and relu, at 1 and 2 threads: onnxruntime's
    values."""
    from edgeflow.format import writer
    from edgeflow.interp.kernels import conv as conv_kernels
    bound = []
    real = conv_kernels._reached
    monkeypatch.setattr(conv_kernels, "_reached", lambda *a: bound.append(real(*a)) or bound[-1])
    rng = np.random.default_rng(rate + batch)
    x = rng.standard_normal((batch, 128, 14, 14)).astype(np.float32)
    w = rng.standard_normal((96, 128, 3, 3)).astype(np.float32) / 30
    b = rng.standard_normal(96).astype(np.float32)
    attrs = {"strides": (stride, stride), "dilations": (rate, rate), "pads": (rate,) * 4, "activation": "relu"}
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, w, b], attrs)
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=num_threads)
    got = interp.get_signature_runner("infer")(x=x)["y"]
    assert bound and bound[-1] is not None
    assert_close(got, reference("conv", x, w, b, attrs), "float32", rtol=1e-4, atol=1e-4)
