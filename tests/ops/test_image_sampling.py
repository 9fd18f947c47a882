"""grid_sample, affine_grid, col2im, roi_align and CenterCropPad against onnxruntime, ONNX's reference
evaluator and closed forms."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import assert_close
from .onnx_reference import onnx_reference


def onnx_run(op_type, inputs, output_dtypes, opset, evaluator="onnxruntime", **attrs):
    """Outputs of one ONNX node on `inputs`, by onnxruntime or ONNX's reference evaluator."""
    if evaluator == "onnxruntime":
        return onnx_reference(op_type, inputs, output_dtypes, opset=opset, **attrs)
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    names = ["" if a is None else f"x{i}" for i, a in enumerate(inputs)]
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    outs = [f"y{i}" for i in range(len(output_dtypes))]
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op_type, names, outs, **attrs)], "single",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
         for n, d in zip(outs, output_dtypes)]), opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


def grid(rng, shape, spread=1.3):
    """Normalized positions, some outside [-1, 1], some exactly on pixel centres and edges."""
    g = rng.uniform(-spread, spread, shape).astype(np.float32)
    g.reshape(-1)[::7] = np.round(g.reshape(-1)[::7] * 4) / 4
    return g


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_2d(run_op, rng, mode, padding, align_corners):
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    g = grid(rng, (2, 4, 7, 2), spread=2.5 if padding == "reflection" else 1.3)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align_corners}
    got = run_op(lambda a, b: apply("grid_sample", [a, b], attrs), x, g)
    want, = onnx_run("GridSample", [x, g], [np.float32], 20, mode=mode, padding_mode=padding,
                     align_corners=int(align_corners))
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode, padding", [(m, p) for m in ("linear", "nearest", "cubic")
                                           for p in ("zeros", "border", "reflection") if (m, p) != ("cubic", "border")])
def test_grid_sample_3d_and_1d(run_op, rng, mode, padding, align_corners):
    """Volumetric and 1-D against ONNX's reference (onnxruntime samples 2-D and 3-D
    linear and nearest only). Cubic with border padding is left out: the reference clamps
    coordinates beyond the borders before placing the 4 taps, where PyTorch and
    onnxruntime (and edgeflow, checked in 2-D above) clamp each tap."""
    for x_shape, g_shape in [((1, 2, 3, 4, 5), (1, 2, 3, 4, 3)), ((2, 2, 6), (2, 5, 1))]:
        x = rng.standard_normal(x_shape).astype(np.float32)
        g = grid(rng, g_shape)
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": align_corners}
        got = run_op(lambda a, b: apply("grid_sample", [a, b], attrs), x, g)
        want, = onnx_run("GridSample", [x, g], [np.float32], 22, "reference", mode=mode,
                         padding_mode=padding, align_corners=int(align_corners))
        assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)


def test_grid_sample_3d_matches_onnxruntime(run_op, rng):
    x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    g = grid(rng, (1, 2, 3, 4, 3))
    got = run_op(lambda a, b: apply("grid_sample", [a, b], {"padding_mode": "border"}), x, g)
    want, = onnx_run("GridSample", [x, g], [np.float32], 20, padding_mode="border")
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_grid_sample_opset_16_names(rng, mode):
    """Opset 16's mode names convert to linear and cubic."""
    from onnx import helper
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.format import writer
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    g = grid(rng, (1, 3, 3, 2))
    want, = onnx_reference("GridSample", [x, g], [np.float32], opset=16, mode=mode)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode)
    model = helper.make_model(helper.make_graph(
        [node], "gs", [helper.make_tensor_value_info("x", 1, x.shape), helper.make_tensor_value_info("g", 1, g.shape)],
        [helper.make_tensor_value_info("y", 1, want.shape)]), opset_imports=[helper.make_opsetid("", 16)])
    got = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")(x=x, g=g)
    assert_close(got["y"], want, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_dtype, g_dtype", [("float16", "float16"), ("float64", "float64"),
                                              ("float32", "float64"), ("float64", "float32")])
def test_grid_sample_float_dtypes(run_op, rng, x_dtype, g_dtype):
    x = rng.standard_normal((1, 2, 5, 4)).astype(x_dtype)
    g = grid(rng, (1, 3, 6, 2)).astype(g_dtype)
    got = run_op(lambda a, b: apply("grid_sample", [a, b], {"mode": "cubic", "padding_mode": "reflection"}), x, g)
    want, = onnx_run("GridSample", [x.astype(np.float64), g.astype(np.float64)], [np.float64], 22, "reference",
                     mode="cubic", padding_mode="reflection")
    assert_close(got, want.astype(x_dtype), x_dtype, rtol=2e-2 if "float16" in (x_dtype, g_dtype) else 1e-5,
                 atol=2e-2 if "float16" in (x_dtype, g_dtype) else 1e-5)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "int8"])
def test_grid_sample_nearest_any_dtype(run_op, rng, dtype):
    x = rng.integers(0, 100, (2, 2, 4, 5)).astype(dtype)
    g = grid(rng, (2, 3, 3, 2))
    got = run_op(lambda a, b: apply("grid_sample", [a, b], {"mode": "nearest"}), x, g)
    want, = onnx_run("GridSample", [x.astype(np.float32), g], [np.float32], 22, "reference", mode="nearest")
    assert_close(got, want.astype(dtype), dtype)


@pytest.mark.parametrize("x_shape, g_shape, attrs, message", [
    ((1, 2, 4, 4), (1, 3, 3, 3), {}, "ending in 2"),
    ((1, 2, 4, 4), (1, 3, 2), {}, "rank 4"),
    ((2, 2, 4, 4), (3, 3, 3, 2), {}, "batch"),
    ((1, 2, 4, 4), (1, 3, 3, 2), {"mode": "bilinear"}, "mode"),
    ((1, 2, 4, 4), (1, 3, 3, 2), {"padding_mode": "wrap"}, "padding_mode"),
])
def test_grid_sample_invalid(graph, x_shape, g_shape, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply("grid_sample", [ef.placeholder("float32", x_shape), ef.placeholder("float32", g_shape)], attrs)


def test_grid_sample_integer_interpolation_invalid(graph):
    with pytest.raises(GraphError, match="dtype"):
        apply("grid_sample", [ef.placeholder("int32", (1, 1, 2, 2)), ef.placeholder("float32", (1, 2, 2, 2))], {})


def convert_node(op_type, inputs, constants, attrs, opset):
    """The edgeflow runner of one ONNX node: `inputs` (name -> array) fed, `constants` (name
    -> array) initializers, input names in order inputs then constants ("" for a gap)."""
    from onnx import helper, numpy_helper
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.format import writer
    names = list(inputs) + list(constants)
    feeds = {n: a for n, a in inputs.items()}
    want = onnx_run(op_type, [*inputs.values(), *constants.values()], [next(iter(inputs.values())).dtype],
                    opset, **attrs)[0]
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op_type, names, ["y"], **attrs)], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(want.dtype), want.shape)],
        [numpy_helper.from_array(a, n) for n, a in constants.items()]), opset_imports=[helper.make_opsetid("", opset)])
    got = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")(**feeds)
    return got["y"], want


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (1, 1, 1, 3), (2, 1, 3, 4, 2), (1, 2, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_affine_grid(run_op, rng, size, align_corners, dtype):
    """Against a closed form: theta times each pixel centre's (or corner's) normalized position."""
    r = len(size) - 2
    theta = rng.standard_normal((size[0], r, r + 1)).astype(dtype)
    got = run_op(lambda t: apply("affine_grid", [t], {"size": size, "align_corners": align_corners}), theta)
    spatial = size[2:]
    axes = [np.linspace(-1, 1, n) if align_corners else (np.arange(n) + 0.5) * 2 / n - 1 for n in spatial]
    want = np.zeros(got.shape)
    for index in np.ndindex(*spatial):
        point = [axes[a][i] for a, i in enumerate(index)][::-1] + [1.0]  # (w, h, d..., 1)
        want[(slice(None),) + index] = theta.astype(np.float64) @ np.array(point)
    assert_close(got, want.astype(dtype), dtype, rtol=1e-2 if dtype == "float16" else 1e-6,
                 atol=1e-2 if dtype == "float16" else 1e-6)


def test_affine_grid_matches_onnxruntime(rng):
    theta = rng.standard_normal((2, 2, 3)).astype(np.float32)
    got, want = convert_node("AffineGrid", {"theta": theta}, {"size": np.array([2, 3, 5, 4], np.int64)},
                             {"align_corners": 1}, 20)
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, target, axes", [
    ((20, 10, 3), (10, 7, 3), None), ((10, 7, 3), (20, 10, 3), None), ((20, 8, 3), (9, 11, 3), None),
    ((3, 20, 9), (11, 12), (1, 2)), ((5, 6, 7), (4, 9), (-1, 0))], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool", "float16"])
def test_center_crop_pad(rng, shape, target, axes, dtype):
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    attrs = {} if axes is None else {"axes": list(axes)}
    got, want = convert_node("CenterCropPad", {"x": x}, {"shape": np.array(target, np.int64)}, attrs, 18)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("image, block, attrs", [
    ((5, 5), (1, 5), {}), ((5, 5), (2, 2), {"strides": [2, 2]}), ((5, 5), (1, 5), {"pads": [0, 1, 0, 1]}),
    ((6, 6), (2, 2), {"dilations": [1, 5]}), ((3, 4, 5), (1, 2, 2), {"strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 0]}),
    ((7, 6), (3, 2), {"strides": [2, 1], "dilations": [2, 2], "pads": [1, 2, 0, 1]}), ((9,), (3,), {"strides": [2]})],
    ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_col2im(rng, image, block, attrs, dtype):
    """Against ONNX's reference (onnxruntime's Col2Im takes float32 2-D images only), and
    against onnxruntime where it does."""
    r = len(image)
    strides, dil = attrs.get("strides", [1] * r), attrs.get("dilations", [1] * r)
    pads = attrs.get("pads", [0] * 2 * r)
    count = int(np.prod([(image[i] + pads[i] + pads[i + r] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
                         for i in range(r)]))
    x = (rng.standard_normal((2, 3 * int(np.prod(block)), count)) * 10).astype(dtype)
    got = harness_run_col2im(x, image, block, attrs)
    want, = onnx_run("Col2Im", [x, np.array(image, np.int64), np.array(block, np.int64)], [dtype], 18,
                     "reference", **attrs)
    assert_close(got, want, dtype, rtol=1e-6, atol=1e-5)
    if r == 2 and dtype == "float32":
        got, want = convert_node("Col2Im", {"x": x}, {"image": np.array(image, np.int64),
                                                      "block": np.array(block, np.int64)}, attrs, 18)
        assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)


def harness_run_col2im(x, image, block, attrs):
    from . import harness
    full = {"image_shape": image, "block_shape": block, **{k: tuple(v) for k, v in attrs.items()}}
    return harness.run_op(lambda t: apply("col2im", [t], full), x)


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("affine_grid", [(2, 2, 3)], {"size": (2, 3, 4)}, "size"),
    ("affine_grid", [(2, 2, 3)], {"size": (2, 3, 4, 4, 4)}, "theta"),
    ("col2im", [(1, 4, 8)], {"image_shape": (4, 4), "block_shape": (2, 2)}, "blocks"),
    ("col2im", [(1, 5, 9)], {"image_shape": (4, 4), "block_shape": (2, 2)}, "multiple"),
    ("col2im", [(1, 4, 9)], {"image_shape": (4, 4), "block_shape": (2,)}, "one entry"),
    ("col2im", [(1, 4, 9)], {"image_shape": (2, 2), "block_shape": (3, 3)}, "does not fit"),
    ("roi_align", [(1, 2, 4, 4), (3, 4), (2,)], {}, "differ in length"),
    ("roi_align", [(1, 2, 4, 4), (3, 5), (3,)], {}, r"rois \(R, 4\)"),
    ("roi_align", [(1, 2, 4, 4), (3, 4), (3,)], {"mode": "sum"}, "mode"),
    ("roi_align", [(1, 2, 4, 4), (3, 4), (3,)], {"output_height": 0}, "positive"),
])
def test_invalid_shapes(graph, op, inputs, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply(op, [ef.placeholder("int64" if op == "roi_align" and i == 2 else "float32", s)
                   for i, s in enumerate(inputs)], attrs)


def boxes(rng, count, h, w):
    """(x1, y1, x2, y2) boxes, some reaching outside the image, some thinner than a pixel."""
    x1, y1 = rng.uniform(-3, w, count), rng.uniform(-3, h, count)
    b = np.stack([x1, y1, x1 + rng.uniform(0.3, w, count), y1 + rng.uniform(0.3, h, count)], axis=1)
    b[0] = (1.2, 2.3, 1.5, 2.4)
    return b


@pytest.mark.parametrize("ratio", [0, 1, 2])
@pytest.mark.parametrize("coordinates", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(run_op, rng, mode, coordinates, ratio):
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = (boxes(rng, 6, 18, 22)).astype(np.float32)
    batch = rng.integers(0, 2, 6).astype(np.int64)
    attrs = {"mode": mode, "output_height": 3, "output_width": 4, "sampling_ratio": ratio,
             "spatial_scale": 0.5, "coordinate_transformation_mode": coordinates}
    got = run_op(lambda *t: apply("roi_align", list(t), attrs), x, rois, batch)
    want, = onnx_run("RoiAlign", [x, rois, batch], [np.float32], 16, **attrs)
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_loop_gives_the_numpy_steps_bits(monkeypatch, rng, mode, ratio, dtype):
    """jit.roi_align_loop (numba: a bin at a time) against the numpy steps it stands in for
    (a sampling slot at a time over every bin), bit for bit, both against onnxruntime: 40
    boxes on two images of 16 channels (Faster R-CNN's are 150 of 256), some reaching past
    the image, some thinner than a pixel, adaptive grids (ratio 0) of up to 6x6 slots."""
    from edgeflow.interp.kernels import KERNELS, jit
    assert jit.available()
    x = rng.standard_normal((2, 16, 9, 13)).astype(dtype)
    rois, batch = boxes(rng, 40, 36, 52).astype(dtype), rng.integers(0, 2, 40).astype(np.int64)
    attrs = {"mode": mode, "output_height": 3, "output_width": 5, "sampling_ratio": ratio, "spatial_scale": 0.25,
             "coordinate_transformation_mode": "half_pixel"}
    ran = []
    loop = jit.roi_align
    monkeypatch.setattr(jit, "roi_align", lambda *args: ran.append(loop(*args)) or ran[-1])
    got = np.full((40, 16, 3, 5), np.nan, dtype)
    KERNELS["roi_align"]([x, rois, batch], [got], attrs)()
    assert ran == [True]
    monkeypatch.setattr(jit, "roi_align", lambda *args: False)
    steps = np.full_like(got, np.nan)
    KERNELS["roi_align"]([x, rois, batch], [steps], attrs)()
    np.testing.assert_array_equal(got, steps)
    if dtype != "float16":  # onnxruntime has no float16 RoiAlign
        want, = onnx_run("RoiAlign", [x, rois, batch], [np.dtype(dtype)], 16, **attrs)
        assert_close(got, want, np.dtype(dtype), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_dtypes(run_op, rng, dtype, mode):
    """float64 against onnxruntime, float16 against float64 (onnxruntime has no float16 RoiAlign)."""
    x = rng.standard_normal((1, 2, 8, 8)).astype(dtype)
    rois, batch = boxes(rng, 4, 8, 8).astype(dtype), np.zeros(4, np.int64)
    attrs = {"mode": mode, "output_height": 2, "output_width": 2}
    got = run_op(lambda *t: apply("roi_align", list(t), attrs), x, rois, batch)
    want, = onnx_run("RoiAlign", [x.astype(np.float64), rois.astype(np.float64), batch], [np.float64], 16, **attrs)
    assert_close(got, want.astype(dtype), dtype, rtol=1e-2 if dtype == "float16" else 1e-9,
                 atol=1e-2 if dtype == "float16" else 1e-9)
