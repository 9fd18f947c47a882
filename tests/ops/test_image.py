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
from .onnx_reference import onnx_node


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
    ("resize", (1, 2, 4, 4), {}, "exactly one"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "sizes": (8, 8)}, "exactly one"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0, 2.0)}, "entries"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 1.0, 2.0, 2.0)}, "batch and channel"),
    ("resize", (1, 2, 4, 4), {"scales": (0.0, 2.0)}, "positive"),
    ("resize", (1, 2, 4, 4), {"scales": (0.1, 2.0)}, "nothing"),
    ("resize", (1, 2, 4, 4), {"sizes": (3, 2, 8, 8)}, "batch or channel"),
    ("resize", (2, 4, 4), {"scales": (2.0, 2.0)}, r"\(N, C, H, W\)"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "mode": "cubic"}, "mode"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "coordinate_transformation_mode": "tf"}, "coordinate"),
    ("resize", (1, 2, 4, 4), {"scales": (2.0, 2.0), "nearest_mode": "round"}, "nearest_mode"),
])
def test_invalid(graph, op, shape, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply(op, [ef.placeholder("float32", shape)], attrs)


def test_invalid_dtype(graph):
    with pytest.raises(GraphError, match="dtype"):
        apply("resize", [ef.placeholder("int32", (1, 1, 2, 2))], {"scales": (2.0, 2.0), "mode": "linear"})
