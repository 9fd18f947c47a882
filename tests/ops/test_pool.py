"""max_pool and avg_pool against onnxruntime's MaxPool and AveragePool (one-node models)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from . import harness
from .harness import assert_close
from .onnx_reference import onnx_node, onnx_reference

ONNX_NAMES = {"max_pool": "MaxPool", "avg_pool": "AveragePool"}


def check(op, x, attrs, run=harness.run_op, tol=1e-6):
    got = run(lambda t: apply(op, [t], attrs), x)
    onnx_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
    expected = onnx_node(ONNX_NAMES[op], x, (), onnx_attrs, opset=19 if "dilations" in attrs else 17)
    assert_close(got, expected, x.dtype, rtol=tol, atol=tol)
    return got


CASES = {
    "2x2 stride 2": ((1, 3, 8, 8), {"kernel_shape": (2, 2), "strides": (2, 2)}),
    "3x3 stride 2 odd": ((2, 4, 9, 7), {"kernel_shape": (3, 3), "strides": (2, 2)}),
    "3x3 stride 1 padded": ((1, 2, 6, 5), {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
    "asymmetric pads": ((1, 2, 7, 6), {"kernel_shape": (3, 2), "strides": (2, 1), "pads": (0, 1, 2, 0)}),
    "ceil mode": ((1, 2, 8, 7), {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": True}),
    "ceil mode padded": ((2, 2, 7, 9), {"kernel_shape": (3, 2), "strides": (2, 3), "pads": (1, 1, 1, 0),
                                        "ceil_mode": True}),
    "ceil mode last window dropped": ((1, 1, 5, 5), {"kernel_shape": (2, 2), "strides": (2, 2),
                                                     "pads": (1, 1, 1, 1), "ceil_mode": True}),
    "same upper": ((1, 2, 7, 8), {"kernel_shape": (3, 3), "strides": (2, 2), "auto_pad": "SAME_UPPER"}),
    "same lower": ((1, 2, 7, 8), {"kernel_shape": (2, 3), "strides": (2, 2), "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 2, 7, 8), {"kernel_shape": (3, 3), "strides": (2, 2), "auto_pad": "VALID"}),
    "1-D": ((2, 3, 11), {"kernel_shape": (3,), "strides": (2,), "pads": (1, 0)}),
    "3-D": ((1, 2, 5, 6, 4), {"kernel_shape": (2, 3, 2), "strides": (2, 2, 1), "pads": (0, 1, 0, 1, 0, 1)}),
    "global": ((2, 3, 5, 6), {"kernel_shape": (5, 6)}),
}


@pytest.mark.parametrize("case", CASES)
def test_max_pool(run_op, rng, case):
    shape, attrs = CASES[case]
    check("max_pool", rng.standard_normal(shape).astype(np.float32), attrs, run_op)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_avg_pool(run_op, rng, case, count_include_pad):
    shape, attrs = CASES[case]
    check("avg_pool", rng.standard_normal(shape).astype(np.float32),
          {**attrs, "count_include_pad": count_include_pad}, run_op)


DILATED = [
    {"kernel_shape": (2, 2), "dilations": (2, 2)},
    {"kernel_shape": (3, 2), "dilations": (2, 3), "strides": (2, 1), "pads": (1, 0, 2, 1)},
    {"kernel_shape": (2, 2), "dilations": (2, 1), "strides": (2, 2), "ceil_mode": True},
    {"kernel_shape": (3, 3), "dilations": (2, 2), "strides": (3, 2), "pads": (2, 1, 2, 2), "ceil_mode": True},
]


@pytest.mark.parametrize("attrs", DILATED)
def test_max_pool_dilations(run_op, rng, attrs):
    check("max_pool", rng.standard_normal((1, 3, 9, 8)).astype(np.float32), attrs, run_op)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("attrs", DILATED)
def test_avg_pool_dilations(run_op, rng, attrs, count_include_pad):
    check("avg_pool", rng.standard_normal((1, 3, 9, 8)).astype(np.float32),
          {**attrs, "count_include_pad": count_include_pad}, run_op)


def test_avg_pool_dilations_closed_form(run_op):
    """1-D, kernel 2, dilation 3, stride 2, pads 2: window o averages x[2o - 2] and x[2o + 1]
    where they exist (x[i] = i + 1)."""
    x = np.arange(1, 8, dtype=np.float64).reshape(1, 1, 7)
    attrs = {"kernel_shape": (2,), "dilations": (3,), "strides": (2,), "pads": (2, 2)}
    got = run_op(lambda t: apply("avg_pool", [t], attrs), x)
    np.testing.assert_allclose(got.ravel(), [2, (1 + 4) / 2, (3 + 6) / 2, 5])
    got = run_op(lambda t: apply("avg_pool", [t], {**attrs, "count_include_pad": True}), x)
    np.testing.assert_allclose(got.ravel(), [2 / 2, (1 + 4) / 2, (3 + 6) / 2, 5 / 2])


def test_max_pool_padding_never_wins(run_op):
    x = np.full((1, 1, 3, 3), -100.0, np.float32)
    got = run_op(lambda t: apply("max_pool", [t], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}), x)
    assert (got == -100).all()


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_max_pool_integers(run_op, rng, dtype):
    x = harness.random_array(rng, (1, 2, 7, 7), dtype, 0 if dtype == "uint8" else -100, 100)
    check("max_pool", x, {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, run_op)


def test_float16(run_op, rng):
    x = (rng.standard_normal((1, 2, 8, 8)) * 1000).astype(np.float16)
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}
    check("max_pool", x, attrs, run_op)
    got = run_op(lambda t: apply("avg_pool", [t], attrs), x)
    expected = onnx_node("AveragePool", x.astype(np.float32), (), {**attrs, "ceil_mode": 1})
    assert_close(got, expected, np.float16, rtol=2e-3, atol=1e-2)


@given(data=st.data())
def test_pool_random(data):
    d = data.draw(st.integers(1, 2))
    kernel = [data.draw(st.integers(1, 4)) for _ in range(d)]
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]  # onnxruntime wants pads < kernel
    sizes = [data.draw(st.integers(max(1, k - pads[i] - pads[i + d]), 12)) for i, k in enumerate(kernel)]
    attrs = {"kernel_shape": tuple(kernel), "pads": tuple(pads),
             "strides": tuple(data.draw(st.integers(1, 3)) for _ in range(d)),
             "ceil_mode": data.draw(st.booleans())}
    op = data.draw(st.sampled_from(["max_pool", "avg_pool"]))
    if op == "avg_pool":
        attrs["count_include_pad"] = data.draw(st.booleans())
    x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal(
        (data.draw(st.integers(1, 2)), 2, *sizes)).astype(np.float32)
    check(op, x, attrs)


def test_dynamic_batch_and_spatial(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 2, None, None), name="x")
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}
    y = apply("max_pool", [x], attrs)
    z = apply("avg_pool", [x], {"kernel_shape": (2, 2), "strides": (2, 2), "auto_pad": "SAME_UPPER"})
    assert y.shape == z.shape == (None, 2, None, None)
    f = ef.placeholder("float32", (None, 2, 9, 8), name="f")
    assert apply("max_pool", [f], attrs).shape == (None, 2, 5, 5)
    run = compile_graph(graph, {"x": x}, {"y": y, "z": z})
    for shape in [(1, 2, 8, 8), (3, 2, 7, 5), (1, 2, 8, 8)]:  # the last reuses a plan
        v = rng.standard_normal(shape).astype(np.float32)
        got = run(x=v)
        assert_close(got["y"], onnx_node("MaxPool", v, (), {**attrs, "ceil_mode": 1}), np.float32)
        assert_close(got["z"], onnx_node("AveragePool", v, (), {"kernel_shape": (2, 2), "strides": (2, 2),
                                                                 "auto_pad": "SAME_UPPER"}), np.float32)


@pytest.mark.parametrize("op, shape, attrs, message", [
    ("max_pool", (1, 2, 4, 4), {"kernel_shape": (3,)}, "kernel_shape"),
    ("max_pool", (1, 2, 4, 4), {"kernel_shape": (0, 2)}, "kernel_shape"),
    ("max_pool", (4, 4), {"kernel_shape": (2, 2)}, "spatial"),
    ("max_pool", (1, 2, 4, 4), {"kernel_shape": (5, 2)}, "larger"),
    ("max_pool", (1, 2, 4, 4), {"kernel_shape": (2, 2), "strides": (1,)}, "strides"),
    ("max_pool", (1, 2, 4, 4), {"kernel_shape": (2, 2), "auto_pad": "same"}, "auto_pad"),
    ("avg_pool", (1, 2, 4, 4), {"kernel_shape": (2, 2), "pads": (1, 1, 1)}, "pads"),
    ("avg_pool", (1, 2, 4, 4), {"kernel_shape": (2, 2), "dilations": (4, 4)}, "larger"),
])
def test_invalid(graph, op, shape, attrs, message):
    x = ef.placeholder("float32", shape)
    with pytest.raises(GraphError, match=message):
        apply(op, [x], attrs)


def test_invalid_dtype(graph):
    with pytest.raises(GraphError, match="dtype"):
        apply("avg_pool", [ef.placeholder("int32", (1, 1, 4, 4))], {"kernel_shape": (2, 2)})
    with pytest.raises(GraphError, match="required"):
        apply("max_pool", [ef.placeholder("float32", (1, 1, 4, 4))], {})


# -- max_pool_indices, lp_pool, max_unpool --------------------------------------------------

def _indices_closed_form(x, kernel, strides, storage_order):
    """MaxPool's Indices without padding, element by element in Python: the first maximum in
    kernel (row-major) order, flattened over (N, C, H, W), H and W swapped for storage_order 1."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, strides
    out = np.zeros((n, c, (h - kh) // sh + 1, (w - kw) // sw + 1), np.int64)
    for b, ch, i, j in np.ndindex(*out.shape):
        best = None
        for u in range(kh):
            for v in range(kw):
                r, q = i * sh + u, j * sw + v
                if best is None or x[b, ch, r, q] > x[b, ch, best[0], best[1]]:
                    best = (r, q)
        spatial = best[1] * h + best[0] if storage_order else best[0] * w + best[1]
        out[b, ch, i, j] = (b * c + ch) * h * w + spatial
    return out


@pytest.mark.parametrize("storage_order", [False, True])
def test_max_pool_indices_closed_form(run_op, rng, storage_order):
    x = rng.integers(0, 4, (2, 3, 7, 6)).astype(np.float32)  # many ties: the first maximum wins
    attrs = {"kernel_shape": (3, 2), "strides": (2, 2), "storage_order": storage_order}
    got = run_op(lambda t: apply("max_pool_indices", [t], attrs), x)
    np.testing.assert_array_equal(got, _indices_closed_form(x, (3, 2), (2, 2), storage_order))


def _onnx_max_pool_indices(x, attrs, opset=12):
    onnx_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
    return onnx_reference("MaxPool", [x], [x.dtype, np.int64], opset=opset, **onnx_attrs)


@pytest.mark.parametrize("storage_order", [False, True])
@pytest.mark.parametrize("case", [c for c in CASES if c != "3-D"])
def test_max_pool_indices(run_op, rng, case, storage_order):
    shape, attrs = CASES[case]
    x = rng.standard_normal(shape).astype(np.float32)
    attrs = {**attrs, "storage_order": storage_order}
    got = run_op(lambda t: apply("max_pool_indices", [t], attrs), x)
    np.testing.assert_array_equal(got, _onnx_max_pool_indices(x, attrs)[1])


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint8"])
@pytest.mark.parametrize("attrs", DILATED + [CASES["3-D"][1]])
def test_max_pool_indices_dtypes_dilations_3d(run_op, rng, attrs, dtype):
    shape = (1, 2, 5, 6, 4) if len(attrs["kernel_shape"]) == 3 else (2, 2, 9, 8)
    x = harness.random_array(rng, shape, dtype, 0, 100)
    got = run_op(lambda t: apply("max_pool_indices", [t], attrs), x)
    expected = _onnx_max_pool_indices(x.astype(np.float32), attrs)[1]  # onnxruntime pools floats
    np.testing.assert_array_equal(got, expected)


def _lp_closed_form(x, kernel, p):
    """LpPool without padding, stride 1, 2-D: (sum |x|^p)^(1/p) window by window in numpy."""
    kh, kw = kernel
    h, w = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    return np.stack([np.stack([(np.abs(x[:, :, i:i + kh, j:j + kw]) ** p).sum((2, 3)) ** (1 / p)
                               for j in range(w)], -1) for i in range(h)], -2)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool_closed_form(run_op, rng, p):
    x = rng.standard_normal((2, 3, 6, 5))
    got = run_op(lambda t: apply("lp_pool", [t], {"kernel_shape": (3, 2), "p": p}), x)
    np.testing.assert_allclose(got, _lp_closed_form(x, (3, 2), p), rtol=1e-12)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_lp_pool(run_op, rng, case, p):
    shape, attrs = CASES[case]
    x = rng.standard_normal(shape).astype(np.float32)
    got = run_op(lambda t: apply("lp_pool", [t], {**attrs, "p": p}), x)
    onnx_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
    assert_close(got, onnx_node("LpPool", x, (), {**onnx_attrs, "p": p}, opset=18), np.float32,
                 rtol=1e-5, atol=1e-6)


def _lp_dilated_closed_form(x, attrs, p=2):
    """2-D LpPool tap by tap over x zero-padded (padding adds nothing to the sum)."""
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel_shape"], attrs.get("strides", (1, 1)), attrs["dilations"]
    pads = attrs.get("pads", (0, 0, 0, 0))
    xp = np.pad(np.abs(x) ** p, [(0, 0), (0, 0), (pads[0], pads[2] + sh), (pads[1], pads[3] + sw)])
    oh, ow = (np.array(x.shape[2:]) + [pads[0] + pads[2], pads[1] + pads[3]] - [(kh - 1) * dh + 1, (kw - 1) * dw + 1])
    ceil = attrs.get("ceil_mode", False)
    oh, ow = [-(-span // st) + 1 if ceil else span // st + 1 for span, st in ((oh, sh), (ow, sw))]
    return sum(xp[:, :, u * dh:u * dh + (oh - 1) * sh + 1:sh, v * dw:v * dw + (ow - 1) * sw + 1:sw]
               for u in range(kh) for v in range(kw)) ** (1 / p)


@pytest.mark.parametrize("attrs", DILATED)
def test_lp_pool_dilations(run_op, rng, attrs):
    """Against a closed form, and ONNX's reference evaluator where no window reaches into
    padding (it scales a window's mean by the kernel size); onnxruntime's LpPool has no dilations."""
    x = rng.standard_normal((1, 3, 9, 8))
    got = run_op(lambda t: apply("lp_pool", [t], attrs), x)
    np.testing.assert_allclose(got, _lp_dilated_closed_form(x, attrs), rtol=1e-12)
    if not any(attrs.get("pads", ())):
        onnx_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
        np.testing.assert_allclose(got, onnx_node("LpPool", x, (), onnx_attrs, opset=18, evaluator="reference"),
                                   rtol=1e-12)


def test_lp_pool_float16(run_op, rng):
    x = (rng.standard_normal((1, 2, 8, 8)) * 100).astype(np.float16)
    got = run_op(lambda t: apply("lp_pool", [t], {"kernel_shape": (3, 3), "strides": (2, 2)}), x)
    expected = onnx_node("LpPool", x.astype(np.float32), (), {"kernel_shape": (3, 3), "strides": (2, 2)})
    assert_close(got, expected, np.float16, rtol=2e-3, atol=1e-2)


def test_max_unpool_closed_form(run_op):
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    i = np.array([[[[5, 7], [13, 15]]]], np.int64)
    got = run_op(lambda a, b: apply("max_unpool", [a, b], {"kernel_shape": (2, 2), "strides": (2, 2)}), x, i)
    np.testing.assert_array_equal(got, [[[[0, 0, 0, 0], [0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 0, 4]]]])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape, attrs", [
    ((2, 3, 9, 7), {"kernel_shape": (3, 3), "strides": (2, 2)}),
    ((1, 2, 8, 8), {"kernel_shape": (2, 2), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((2, 2, 11), {"kernel_shape": (3,), "strides": (3,)}),
    ((1, 2, 5, 6, 4), {"kernel_shape": (2, 3, 2), "strides": (2, 2, 2)}),
])
def test_max_unpool_undoes_max_pool(run_op, rng, shape, attrs, dtype):
    """MaxPool then MaxUnpool with output_shape = MaxPool's input: onnxruntime's reading."""
    x = rng.standard_normal(shape).astype(dtype)
    y, indices = _onnx_max_pool_indices(x.astype(np.float32), attrs)
    y = y.astype(dtype)
    default = [(o - 1) * st - b - e + k for o, st, k, b, e in zip(
        y.shape[2:], attrs["strides"], attrs["kernel_shape"], *np.reshape(attrs.get("pads", [0] * 2 * (y.ndim - 2)),
                                                                          (2, -1)))]
    for output_shape in [shape] + ([()] if tuple(default) == shape[2:] else []):  # () : the default
        unpool = {**attrs, "output_shape": output_shape}
        got = run_op(lambda a, b: apply("max_unpool", [a, b], unpool), y, indices)
        expected = onnx_reference("MaxUnpool", [y.astype(np.float32), indices] + (
            [np.array(output_shape, np.int64)] if output_shape else []), [np.float32], opset=11, **attrs)[0]
        assert got.shape == expected.shape
        assert_close(got, expected, dtype)


def test_max_unpool_rejects_indices_out_of_range(run_op):
    from edgeflow.errors import InvalidInputError
    x, i = np.ones((1, 1, 1, 1), np.float32), np.full((1, 1, 1, 1), 4, np.int64)
    with pytest.raises(InvalidInputError, match="max_unpool"):
        run_op(lambda a, b: apply("max_unpool", [a, b], {"kernel_shape": (2, 2)}), x, i)


def test_invalid_new_pools(graph):
    x = ef.placeholder("float32", (1, 2, 4, 4))
    with pytest.raises(GraphError, match="p must be >= 1"):
        apply("lp_pool", [x], {"kernel_shape": (2, 2), "p": 0})
    with pytest.raises(GraphError, match="indices must have x's shape"):
        apply("max_unpool", [x, ef.placeholder("int64", (1, 2, 4, 3))], {"kernel_shape": (2, 2)})
    with pytest.raises(GraphError, match="output_shape"):
        apply("max_unpool", [x, ef.placeholder("int64", (1, 2, 4, 4))],
              {"kernel_shape": (2, 2), "output_shape": (1, 3, 8, 8)})
    with pytest.raises(GraphError, match="int64"):
        apply("max_unpool", [x, ef.placeholder("int32", (1, 2, 4, 4))], {"kernel_shape": (2, 2)})
    assert apply("max_pool_indices", [x], {"kernel_shape": (2, 2)}).dtype == np.int64
