"""pad and resize against onnxruntime's Pad and Resize (one-node models)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from . import harness
from .harness import assert_close
from .onnx_reference import onnx_node, single_node_model


def onnx_pad(x, pads, mode="constant", value=0.0):
    constants = [np.array(pads, np.int64)] + ([np.array(value, x.dtype)] if mode == "constant" else [])
    return onnx_node("Pad", x, constants, {"mode": mode})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(0, 0, 1, 2, 0, 0, 3, 1), (0, 1, 0, 0, 0, 0, 2, 0),
                                  (0, 0, 0, 0, 0, 0, 0, 0), (1, 0, 2, 2, 0, 2, 1, 3)])
def test_pad(run_op, rng, mode, pads):
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    got = run_op(lambda t: apply("pad", [t], {"pads": pads, "mode": mode, "value": 1.5}), x)
    assert_close(got, onnx_pad(x, pads, mode, 1.5), np.float32)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("dtype", ["int32", "uint8", "float16", "float64"])
def test_pad_dtypes_and_ranks(run_op, rng, mode, dtype):
    for shape, pads in [((7,), (2, 3)), ((3, 4), (1, 2, 2, 0)), ((2, 3, 4), (0, 2, 1, 1, 0, 3))]:
        x = harness.random_array(rng, shape, dtype, 0, 100)
        got = run_op(lambda t: apply("pad", [t], {"pads": pads, "mode": mode, "value": 7.0}), x)
        assert_close(got, onnx_pad(x, pads, mode, 7), dtype)


def test_pad_negative_crops(run_op, rng):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    pads = (0, 0, -1, 2, 0, -1, 1, -2)
    got = run_op(lambda t: apply("pad", [t], {"pads": pads}), x)
    assert_close(got, onnx_pad(x, pads), np.float32)


@given(data=st.data())
def test_pad_random(data):
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    shape = tuple(data.draw(st.lists(st.integers(2, 5), min_size=1, max_size=4)))
    limit = [n - 1 if mode == "reflect" else 4 for n in shape]  # onnxruntime reflects once at most
    pads = tuple(data.draw(st.integers(0, lim)) for lim in limit * 2)
    x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal(shape).astype(np.float32)
    got = harness.run_op(lambda t: apply("pad", [t], {"pads": pads, "mode": mode}), x)
    assert_close(got, onnx_pad(x, pads, mode), np.float32)


def onnx_resize(x, attrs):
    constants = [None, np.array(attrs["scales"], np.float32)] if "scales" in attrs else \
        [None, None, np.array(attrs["sizes"], np.int64)]
    onnx_attrs = {k: v for k, v in attrs.items() if k not in ("scales", "sizes")}
    return onnx_node("Resize", x, constants, onnx_attrs, opset=13)


# (asymmetric, floor) is PyTorch's nearest, (half_pixel, round_prefer_floor) ONNX's default.
NEAREST = [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
           ("align_corners", "round_prefer_ceil"), ("pytorch_half_pixel", "ceil"),
           ("half_pixel", "round_prefer_ceil"), ("asymmetric", "round_prefer_floor")]
TARGETS = [{"scales": (1, 1, 2, 2)}, {"scales": (1, 1, 3, 1.5)}, {"scales": (1, 1, 0.5, 0.5)},
           {"scales": (1, 1, 0.6, 1.7)}, {"sizes": (2, 3, 9, 5)}, {"sizes": (2, 3, 1, 1)},
           {"scales": (2.0, 2.0)}]


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("coordinates, rounding", NEAREST)
def test_resize_nearest(run_op, rng, coordinates, rounding, target):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    attrs = {**target, "mode": "nearest", "coordinate_transformation_mode": coordinates,
             "nearest_mode": rounding}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    full = {"scales": (1, 1) + tuple(target["scales"][-2:])} if "scales" in target else target
    assert_close(got, onnx_resize(x, {**attrs, **full}), np.float32, rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("coordinates", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
def test_resize_linear(run_op, rng, coordinates, target):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    attrs = {**target, "mode": "linear", "coordinate_transformation_mode": coordinates}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    full = {"scales": (1, 1) + tuple(target["scales"][-2:])} if "scales" in target else target
    assert_close(got, onnx_resize(x, {**attrs, **full}), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float16"])
def test_resize_nearest_dtypes(run_op, rng, dtype):
    x = harness.random_array(rng, (1, 2, 4, 5), dtype, 0, 100)
    attrs = {"scales": (1, 1, 2, 1.5), "mode": "nearest", "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "floor"}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    assert_close(got, onnx_resize(x.astype(np.float32), attrs), dtype)


def resize_reference(x, attrs, evaluator="onnxruntime"):
    """ONNX's Resize (opset 19) on x with edgeflow's full-rank attrs."""
    constants = [np.array(attrs.get("roi", ()), np.float32)]
    constants += [np.array(attrs["scales"], np.float32), None] if "sizes" not in attrs else \
        [None, np.array(attrs["sizes"], np.int64)]
    onnx_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()
                  if k not in ("scales", "sizes", "roi")}
    return onnx_node("Resize", x, constants, onnx_attrs, opset=19, evaluator=evaluator)


CUBIC = [{"scales": (1, 1, 2, 2)}, {"scales": (1, 1, 0.6, 1.7)}, {"sizes": (2, 3, 4, 9)},
         {"scales": (1, 1, 0.5, 0.25)}, {"sizes": (2, 3, 1, 1)}]


@pytest.mark.parametrize("target", CUBIC, ids=str)
@pytest.mark.parametrize("a, exclude", [(-0.75, False), (-0.5, True), (-0.5, False)])
@pytest.mark.parametrize("coordinates", ["half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners"])
def test_resize_cubic(run_op, rng, coordinates, a, exclude, target):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    attrs = {**target, "mode": "cubic", "coordinate_transformation_mode": coordinates,
             "cubic_coeff_a": a, "exclude_outside": exclude}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    assert_close(got, resize_reference(x, attrs), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [{"scales": (1, 1, 0.5, 0.6)}, {"scales": (1, 1, 0.3, 0.8)},
                                    {"sizes": (2, 3, 3, 2)}, {"scales": (1, 1, 2, 0.5)}], ids=str)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(run_op, rng, mode, target):
    """Against ONNX's reference (onnxruntime clips the widened filter at the borders, as with
    exclude_outside; ONNX's spec and reference read the edge there)."""
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    attrs = {**target, "mode": mode, "antialias": True}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    assert_close(got, resize_reference(x, attrs, "reference"), np.float32, rtol=1e-5, atol=1e-5)


def test_resize_antialias_inside_matches_onnxruntime(run_op, rng):
    """Where the widened filter stays inside x, onnxruntime agrees."""
    x = rng.standard_normal((1, 2, 12, 12)).astype(np.float32)
    attrs = {"scales": (1, 1, 0.5, 0.5), "mode": "linear", "antialias": True}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    assert_close(got[..., 1:-1, 1:-1], resize_reference(x, attrs)[..., 1:-1, 1:-1], np.float32, 1e-5, 1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi, target", [
    ((0, 0, 0.4, 0.6, 1, 1, 0.6, 0.8), {"sizes": (2, 3, 3, 3)}),
    ((0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7), {"scales": (1, 1, 0.8, 0.8)}),
    ((0, 0, -0.3, 0.1, 1, 1, 0.9, 1.4), {"sizes": (2, 3, 5, 1)})], ids=str)
def test_resize_tf_crop_and_resize(run_op, rng, mode, roi, target):
    """Against ONNX's reference where the box starts before x (onnxruntime then extrapolates
    nowhere and samples shifted rows), onnxruntime elsewhere."""
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    attrs = {**target, "mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "roi": roi, "extrapolation_value": 10.0}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    evaluator = "reference" if min(roi) < 0 else "onnxruntime"
    assert_close(got, resize_reference(x, attrs, evaluator), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 0.6, 1.7), (1, 1, 2.0, 0.35), (1, 1, 1.5, 1.0)], ids=str)
def test_resize_half_pixel_symmetric(run_op, rng, mode, scales):
    """Nearest against ONNX's reference (onnxruntime picks other pixels, as if half_pixel
    without the offset), linear and cubic against onnxruntime."""
    x = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    attrs = {"scales": scales, "mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    evaluator = "reference" if mode == "nearest" else "onnxruntime"
    assert_close(got, resize_reference(x, attrs, evaluator), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("shape, target", [
    ((7,), {"scales": (1.6,)}), ((5, 4), {"sizes": (3, 9)}), ((2, 5, 4, 3, 2), {"scales": (1, 0.6, 1, 2, 1.5)}),
    ((4, 3, 5), {"sizes": (7, 3, 2)})], ids=str)
def test_resize_any_rank_and_axes(run_op, rng, mode, shape, target):
    """Against ONNX's reference: onnxruntime's linear and cubic take only some ranks and axes."""
    x = rng.standard_normal(shape).astype(np.float32)
    attrs = {**target, "mode": mode}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    assert_close(got, resize_reference(x, attrs, "reference"), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_float_dtypes(run_op, rng, dtype, mode):
    x = rng.standard_normal((1, 2, 5, 6)).astype(dtype)
    attrs = {"scales": (1, 1, 1.5, 0.7), "mode": mode}
    got = run_op(lambda t: apply("resize", [t], attrs), x)
    if dtype == "float16":
        assert_close(got, resize_reference(x, attrs), dtype, rtol=1e-2)
    else:  # onnxruntime has no float64 Resize; the reference maps coordinates in float64, edgeflow in float32
        assert_close(got, resize_reference(x, attrs, "reference"), dtype, rtol=1e-5, atol=1e-6)


def test_resize_keep_aspect_ratio_converts(rng):
    """keep_aspect_ratio_policy: the converter gives one scale and the rounded lengths."""
    from onnx import helper
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.format import writer
    x = rng.standard_normal((1, 2, 6, 9)).astype(np.float32)
    for policy, mode in [("not_larger", "linear"), ("not_smaller", "cubic"), ("not_smaller", "nearest")]:
        attrs = {"mode": mode, "keep_aspect_ratio_policy": policy, "axes": [3, 2]}
        sizes = np.array([5, 4], np.int64)
        model = single_node_model("Resize", x, [None, None, sizes], attrs, opset=19)
        expected = onnx_node("Resize", x, [None, None, sizes], attrs, opset=19)
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", 1, expected.shape))
        blob = writer.to_bytes(onnx_converter.convert(model).model)
        got = ef.Interpreter(blob).get_signature_runner("infer")(x=x)["y"]
        assert_close(got, expected, np.float32, rtol=1e-5, atol=1e-5)


def test_resize_dynamic_batch_and_spatial(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 3, None, None), name="x")
    up = {"scales": (2.0, 2.0), "mode": "nearest", "coordinate_transformation_mode": "asymmetric",
          "nearest_mode": "floor"}
    to = {"sizes": (5, 4), "mode": "linear"}
    y, z = apply("resize", [x], up), apply("resize", [x], to)
    assert y.shape == (None, 3, None, None) and z.shape == (None, 3, 5, 4)
    assert apply("resize", [ef.placeholder("float32", (None, 3, 7, 5))], up).shape == (None, 3, 14, 10)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for shape in [(1, 3, 4, 4), (2, 3, 7, 3), (1, 3, 4, 4)]:  # the last reuses a plan
        v = rng.standard_normal(shape).astype(np.float32)
        got = run(x=v)
        assert_close(got["y"], onnx_resize(v, {**up, "scales": (1, 1, 2, 2)}), np.float32)
        assert_close(got["z"], onnx_resize(v, {**to, "sizes": (shape[0], 3, 5, 4)}), np.float32,
                     1e-5, 1e-5)


def test_pad_dynamic(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 2, None), name="x")
    y = apply("pad", [x], {"pads": (0, 0, 1, 0, 0, 2), "mode": "reflect"})
    assert y.shape == (None, 2, None)
    run = compile_graph(graph, {"x": x}, {"y": y})
    for shape in [(1, 2, 3), (3, 2, 6), (1, 2, 3)]:  # the last reuses a plan
        v = rng.standard_normal(shape).astype(np.float32)
        assert_close(run(x=v)["y"], onnx_pad(v, (0, 0, 1, 0, 0, 2), "reflect"), np.float32)


@pytest.mark.parametrize("op, shape, attrs, message", [
    ("pad", (2, 3), {"pads": (1, 1)}, "pads must hold 4"),
    ("pad", (2, 3), {"pads": (1, 1, 1, 1), "mode": "circular"}, "mode"),
    ("pad", (2, 3), {"pads": (0, -1, 0, 0), "mode": "reflect"}, "negative"),
    ("pad", (2, 3), {"pads": (0, -2, 0, -2)}, "remove"),
    ("resize", (1, 2, 4, 4), {}, "neither"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0, 2.0)}, "entries"),
    ("resize", (1, 2, 4, 4), {"sizes": (2, 2, 2)}, "entries"),
    ("resize", (1, 2, 4, 4), {"scales": (0.0, 2.0)}, "positive"),
    ("resize", (1, 2, 4, 4), {"sizes": (0, 2)}, "positive"),
    ("resize", (1, 2, 4, 4), {"scales": (0.1, 2.0)}, "nothing"),
    ("resize", (1, 2, 4, 4), {"scales": (1e38, 2.0)}, "overflow float32"),
    ("resize", (4,), {"scales": (2.0, 2.0)}, "fewer axes"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "mode": "bicubic"}, "mode"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "coordinate_transformation_mode": "tf_crop_and_resize"},
     "roi"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "coordinate_transformation_mode": "tf"}, "coordinate"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "nearest_mode": "round"}, "nearest_mode"),
])
def test_invalid(graph, op, shape, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply(op, [ef.placeholder("float32", shape)], attrs)


def test_invalid_dtype(graph):
    with pytest.raises(GraphError, match="dtype"):
        apply("resize", [ef.placeholder("int32", (1, 1, 2, 2))], {"scales": (2.0, 2.0), "mode": "linear"})
