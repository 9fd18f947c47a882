"""Gradients of conv, conv_transpose, pooling, pad and resize, against finite differences
(float64)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .gradcheck import check_gradients

rng = np.random.default_rng(0)


def r(*shape):
    return rng.uniform(-2.0, 2.0, shape)


def op(name, **attrs):
    return lambda *inputs: apply(name, list(inputs), attrs)


def with_bias(name, **attrs):
    return lambda x, w, b: apply(name, [x, w, b], attrs)


CONV = {  # x shape, w shape, attrs
    "1-D stride 2 asymmetric pads": ((2, 3, 9), (4, 3, 3), {"strides": (2,), "pads": (1, 2)}),
    "3x3 pads 1": ((2, 3, 6, 5), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    "strides, dilations, groups": ((2, 4, 9, 8), (6, 2, 3, 2), {"strides": (2, 1), "dilations": (1, 2),
                                                                 "pads": (1, 0, 2, 1), "group": 2}),
    "stride past the last window": ((1, 2, 8, 7), (3, 2, 2, 3), {"strides": (3, 2)}),
    "dilation above stride": ((1, 2, 9, 9), (2, 2, 3, 3),
                              {"strides": (2, 2), "dilations": (3, 2), "pads": (2, 0, 1, 1)}),
    "depthwise stride 2": ((2, 4, 7, 6), (4, 1, 3, 3), {"group": 4, "strides": (2, 2), "pads": (1, 1, 1, 0)}),
    "depthwise multiplier 2": ((1, 3, 6, 7), (6, 1, 3, 3), {"group": 3, "dilations": (1, 2)}),
    "SAME_UPPER stride 2": ((1, 3, 7, 6), (2, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    "SAME_LOWER": ((1, 2, 5, 6), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER"}),
    "VALID": ((2, 2, 5, 6), (3, 2, 2, 2), {"auto_pad": "VALID", "strides": (1, 2)}),
    "1x1 groups": ((2, 4, 3, 5), (6, 2, 1, 1), {"group": 2}),
    "1x1 stride 2": ((1, 3, 5, 6), (2, 3, 1, 1), {"strides": (2, 2)}),
    "3-D": ((1, 2, 4, 5, 3), (3, 2, 2, 3, 2), {"strides": (1, 2, 1), "pads": (1, 0, 1, 0, 1, 0)}),
    "fused relu6": ((2, 2, 5, 5), (3, 2, 3, 3), {"pads": (1, 1, 1, 1), "activation": "relu6"}),
}


@pytest.mark.parametrize("case", CONV)
def test_conv(case):
    x_shape, w_shape, attrs = CONV[case]
    check_gradients(with_bias("conv", **attrs), r(*x_shape), r(*w_shape), r(w_shape[0]))


CONV_TRANSPOSE = {  # x shape, w shape, attrs
    "1-D stride 2 output_padding": ((2, 3, 4), (3, 2, 3), {"strides": (2,), "output_padding": (1,)}),
    "strides, pads, groups": ((2, 4, 4, 3), (4, 3, 3, 3), {"strides": (2, 2), "pads": (1, 0, 1, 1),
                                                            "output_padding": (1, 0), "group": 2}),
    "output_padding past the end pad": ((1, 2, 3, 4), (2, 3, 2, 3),
                                        {"strides": (3, 2), "pads": (0, 1, 0, 0), "output_padding": (2, 1)}),
    "dilation above stride": ((1, 2, 4, 3), (2, 2, 3, 2), {"dilations": (3, 2), "output_padding": (2, 1)}),
    "depthwise": ((2, 3, 4, 4), (3, 1, 3, 3), {"group": 3, "strides": (2, 1), "pads": (1, 1, 1, 1)}),
    "SAME_UPPER": ((1, 2, 3, 4), (2, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    "SAME_LOWER": ((1, 2, 3, 3), (2, 2, 4, 3), {"auto_pad": "SAME_LOWER", "strides": (2, 1)}),
    "3-D": ((1, 2, 3, 2, 3), (2, 2, 2, 2, 3), {"strides": (2, 1, 2), "pads": (0, 1, 0, 1, 0, 1)}),
    "fused relu": ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": (2, 2), "activation": "relu"}),
}


@pytest.mark.parametrize("case", CONV_TRANSPOSE)
def test_conv_transpose(case):
    x_shape, w_shape, attrs = CONV_TRANSPOSE[case]
    check_gradients(with_bias("conv_transpose", **attrs), r(*x_shape), r(*w_shape),
                    r(w_shape[1] * attrs.get("group", 1)))


def test_conv_without_bias_and_constant_filter():
    w = r(3, 2, 3, 3)
    check_gradients(lambda x: apply("conv", [x, ef.constant(w)], {"strides": (2, 2)}), r(2, 2, 7, 6))
    check_gradients(lambda x, w: apply("conv_transpose", [x, w], {"strides": (2, 2)}),
                    r(1, 3, 3, 2), r(3, 2, 2, 2))


POOL = {  # x shape, attrs
    "1-D": ((2, 3, 9), {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1)}),
    "2x2 stride 2": ((2, 3, 6, 8), {"kernel_shape": (2, 2), "strides": (2, 2)}),
    "overlapping, pads": ((1, 2, 7, 6), {"kernel_shape": (3, 3), "strides": (2, 1), "pads": (1, 0, 1, 2)}),
    "ceil_mode": ((1, 2, 7, 8), {"kernel_shape": (3, 2), "strides": (2, 3), "pads": (1, 0, 0, 0),
                                 "ceil_mode": True}),
    "SAME_UPPER": ((1, 2, 7, 5), {"kernel_shape": (3, 2), "strides": (2, 2), "auto_pad": "SAME_UPPER"}),
    "SAME_LOWER": ((1, 2, 6, 5), {"kernel_shape": (2, 3), "auto_pad": "SAME_LOWER"}),
    "3-D": ((1, 2, 5, 4, 4), {"kernel_shape": (2, 2, 3), "strides": (2, 1, 1), "pads": (1, 0, 1, 0, 1, 1)}),
}


@pytest.mark.parametrize("case", list(POOL) + ["dilations"])
def test_max_pool(case):
    x_shape, attrs = POOL.get(case) or ((1, 2, 9, 8), {"kernel_shape": (2, 3), "dilations": (3, 2),
                                                        "strides": (2, 1), "ceil_mode": True})
    check_gradients(op("max_pool", **attrs), r(*x_shape))


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("case", list(POOL) + ["dilations"])
def test_avg_pool(case, count_include_pad):
    x_shape, attrs = POOL.get(case) or ((1, 2, 9, 8), {"kernel_shape": (2, 3), "dilations": (3, 2),
                                                        "strides": (2, 1), "pads": (1, 1, 2, 0), "ceil_mode": True})
    check_gradients(op("avg_pool", count_include_pad=count_include_pad, **attrs), r(*x_shape))


def _gradient(fn, x, dy):
    """d(sum(fn(x) * dy)) / dx, run through ef.Session."""
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(x.dtype, x.shape)
        (grad,) = ef.gradients(ef.reduce_sum(fn(p) * ef.constant(dy)), [p])
        return ef.Session().run(grad, {p: x})


def test_max_pool_routes_ties_to_the_first_maximum_in_kernel_order():
    x = np.array([[[[1, 5, 5, 0],
                    [5, 2, 5, 3],
                    [0, 1, 4, 4]]]], np.float64)
    # 2x2 windows, stride 1: (0, 0), (0, 1) and (0, 2) all have 5 at several taps.
    dy = np.array([[[[1.0, 10, 100], [1000, 10000, 100000]]]])
    got = _gradient(op("max_pool", kernel_shape=(2, 2)), x, dy)
    np.testing.assert_array_equal(got, [[[[0, 11, 100, 0],
                                          [1000, 0, 110000, 0],
                                          [0, 0, 0, 0]]]])


PADS = {  # x shape, pads, modes
    "1-D": ((5,), (2, 3), ("constant", "reflect", "edge", "wrap")),
    "2-D": ((3, 4), (1, 2, 3, 1), ("constant", "reflect", "edge", "wrap")),
    "NCHW, spatial only": ((2, 2, 4, 5), (0, 0, 2, 1, 0, 0, 1, 3), ("constant", "reflect", "edge")),
    "crop": ((3, 5), (-1, 2, 1, -2), ("constant",)),
    "past the length": ((2, 3), (0, 5, 1, 4), ("edge",)),
    "reflect twice over": ((3, 4), (3, 0, 4, 5), ("reflect", "wrap")),
    "every axis": ((2, 3, 4), (1, 1, 2, 2, 1, 3), ("constant", "reflect", "edge", "wrap")),
}


@pytest.mark.parametrize("case, mode", [(c, m) for c, (_, _, modes) in PADS.items() for m in modes])
def test_pad(case, mode):
    shape, pads, _ = PADS[case]
    check_gradients(op("pad", pads=pads, mode=mode, value=1.5), r(*shape))


RESIZE = {  # x shape, attrs
    "2x up": ((1, 2, 3, 4), {"scales": (2.0, 2.0)}),
    "odd sizes up": ((2, 1, 3, 4), {"sizes": (7, 5)}),
    "down": ((1, 2, 7, 8), {"sizes": (3, 5)}),
    "up and down": ((1, 1, 5, 4), {"scales": (0.6, 2.5)}),
}
COORDINATES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("case", RESIZE)
def test_resize_linear(case, coordinates):
    shape, attrs = RESIZE[case]
    check_gradients(op("resize", mode="linear", coordinate_transformation_mode=coordinates, **attrs),
                    r(*shape))


@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("case", ["odd sizes up", "down"])
def test_resize_nearest(case, coordinates, rounding):
    shape, attrs = RESIZE[case]
    check_gradients(op("resize", mode="nearest", coordinate_transformation_mode=coordinates,
                       nearest_mode=rounding, **attrs), r(*shape))


# The gradient ops' own gradients: second derivatives.

CONV_GRAD = {
    "strides, pads, groups": ((2, 4, 7, 6), (6, 2, 3, 2),
                              {"strides": (2, 1), "pads": (1, 0, 0, 1), "group": 2}),
    "1x1": ((2, 3, 4, 3), (2, 3, 1, 1), {}),
}


@pytest.mark.parametrize("case", CONV_GRAD)
def test_conv_gradient_ops_gradients(case):
    x_shape, w_shape, attrs = CONV_GRAD[case]
    x, w = r(*x_shape), r(*w_shape)
    dy = r(*_conv_output(x, w, attrs).shape)
    like_x, like_w = np.zeros(x_shape), np.zeros(w_shape)
    check_gradients(lambda dy, w: apply("conv_input_grad", [dy, w, ef.constant(like_x)], attrs), dy, w)
    check_gradients(lambda x, dy: apply("conv_filter_grad", [x, dy, ef.constant(like_w)], attrs), x, dy)


def _conv_output(x, w, attrs):
    g = ef.Graph()
    with g.as_default():
        return ef.Session().run(apply("conv", [ef.constant(x), ef.constant(w)], attrs))


def test_second_derivative_of_a_conv():
    """d/dw of (dL/dx)^2 goes through conv_input_grad's gradient."""
    def fn(x, w):
        y = apply("conv", [x, w], {"strides": (2, 2), "pads": (1, 1, 0, 0)})
        (dx,) = ef.gradients(ef.reduce_sum(y * y), [x])
        return dx * dx
    check_gradients(fn, r(1, 2, 5, 4), r(3, 2, 3, 2), rtol=1e-4)


@pytest.mark.parametrize("name, attrs, x_shape", [
    ("avg_pool_grad", {"kernel_shape": (3, 2), "strides": (2, 1), "pads": (1, 0, 1, 1), "ceil_mode": True},
     (1, 2, 6, 5)),
    ("pad_grad", {"pads": (0, 0, 1, 3, 0, 0, 2, 0), "mode": "reflect"}, (1, 2, 4, 3)),
    ("pad_grad", {"pads": (0, 1, 2, 3), "mode": "edge"}, (3, 2)),
    ("resize_grad", {"sizes": (5, 7), "mode": "linear"}, (1, 2, 3, 4)),
    ("resize_grad", {"scales": (0.5, 2.0), "mode": "nearest"}, (1, 1, 6, 3)),
])
def test_gradient_ops_gradients(name, attrs, x_shape):
    forward = {"avg_pool_grad": "avg_pool", "pad_grad": "pad", "resize_grad": "resize"}[name]
    g = ef.Graph()
    with g.as_default():
        y_shape = ef.Session().run(apply(forward, [ef.constant(np.zeros(x_shape))], attrs)).shape
    check_gradients(lambda dy: apply(name, [dy, ef.constant(np.zeros(x_shape))], attrs), r(*y_shape))


def test_dynamic_batch_and_spatial_sizes():
    """One graph built for (None, 3, None, None) gives, at two input sizes, the gradients of
    a graph built for each size, which agree with finite differences."""
    w = r(4, 3, 3, 3)  # conv 3 -> 4 channels, conv_transpose 4 -> 3
    layers = [("conv", {"strides": (2, 2), "auto_pad": "SAME_UPPER"}),
              ("max_pool", {"kernel_shape": (2, 2)}),
              ("conv_transpose", {"strides": (2, 2), "pads": (1, 0, 1, 1), "output_padding": (1, 1)}),
              ("resize", {"scales": (2.0, 2.0), "mode": "linear"}),
              ("avg_pool", {"kernel_shape": (2, 2), "pads": (1, 1, 0, 0)}),
              ("pad", {"pads": (0, 0, 1, 2, 0, 0, 2, 1), "mode": "reflect"})]

    def net(x, w):
        for name, attrs in layers:
            x = apply(name, [x, w] if name.startswith("conv") else [x], attrs)
        return x * x

    g = ef.Graph()
    with g.as_default():
        px, pw = ef.placeholder(ef.float64, (None, 3, None, None)), ef.placeholder(ef.float64, w.shape)
        grads = ef.gradients(ef.reduce_sum(net(px, pw)), [px, pw])
        sess = ef.Session()
    for shape in [(1, 3, 8, 7), (3, 3, 11, 9)]:
        x = r(*shape)
        got = sess.run(grads, {px: x, pw: w})
        g = ef.Graph()
        with g.as_default():
            sx, sw = ef.placeholder(ef.float64, x.shape), ef.placeholder(ef.float64, w.shape)
            want = ef.Session().run(ef.gradients(ef.reduce_sum(net(sx, sw)), [sx, sw]), {sx: x, sw: w})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        check_gradients(net, x, w, rtol=1e-4, max_elements=20)


def test_gradient_ops_check_shapes():
    g = ef.Graph()
    with g.as_default():
        x, w = ef.placeholder(ef.float32, (1, 3, 8, 8)), ef.placeholder(ef.float32, (4, 3, 3, 3))
        with pytest.raises(GraphError, match="conv_input_grad: the gradient has shape"):
            apply("conv_input_grad", [ef.placeholder(ef.float32, (1, 4, 7, 6)), w, x])
        with pytest.raises(GraphError, match="negated pads"):
            apply("pad_grad", [ef.placeholder(ef.float32, (1, 3, 9, 9)), x],
                  {"pads": (0, 0, 1, 0, 0, 0, 0, 1)})
