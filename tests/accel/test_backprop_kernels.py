"""OpenCL gradient and comparison kernels against the numpy kernels: each op in a one-op
model, run with and without the OpenCL delegate; then a small CNN trained with both."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
import edgeflow.accel
from edgeflow.format.writer import to_bytes
from edgeflow.graph.math_ops import apply

from .harness import randn, run_both

from edgeflow.accel.kernels import CL_KERNELS, conv, math  # noqa: F401  (registration)

OURS = ("sum_to", "slice_grad", "gather_grad", "max_pool_grad", "avg_pool_grad", "conv_input_grad", "conv_filter_grad",
        "clip_grad", "relu_grad", *math.COMPARISONS)
shapes = st.lists(st.integers(1, 5), min_size=0, max_size=4)


@pytest.fixture(scope="module")
def delegate():
    return edgeflow.accel.OpenCLDelegate()


@given(shape=shapes, lead=st.lists(st.integers(1, 3), max_size=2), keep=st.lists(st.booleans(), min_size=4, max_size=4),
       seed=st.integers(0, 2 ** 16))
def test_sum_to(delegate, shape, lead, keep, seed):
    rng = np.random.default_rng(seed)
    like = tuple(d if k else 1 for d, k in zip(shape, keep))
    want, got, _ = run_both(delegate, "sum_to", [randn(rng, tuple(lead) + tuple(shape)), randn(rng, like)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(data=st.data(), shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), seed=st.integers(0, 2 ** 16))
def test_slice_grad(delegate, data, shape, seed):
    rng = np.random.default_rng(seed)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    bound = st.integers(-8, 8)
    starts, ends = data.draw(st.lists(bound, min_size=len(axes), max_size=len(axes))), \
        data.draw(st.lists(bound, min_size=len(axes), max_size=len(axes)))
    steps = data.draw(st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]), min_size=len(axes), max_size=len(axes)))
    index = [slice(None)] * len(shape)
    for a, s, e, t in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, t)
    taken = np.zeros(shape)[tuple(index)].shape
    if 0 in taken:
        return  # an empty gradient: nothing runs
    attrs = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    want, got, _ = run_both(delegate, "slice_grad", [randn(rng, taken), randn(rng, shape)], attrs)
    np.testing.assert_array_equal(got, want)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), indices=st.lists(st.integers(1, 4), max_size=2),
       data=st.data(), dtype=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 2 ** 16))
def test_gather_grad(delegate, shape, indices, data, dtype, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    index = rng.integers(-n, n, indices).astype(dtype)  # repeats and negatives
    grad_shape = tuple(shape[:axis % len(shape)]) + index.shape + tuple(shape[axis % len(shape) + 1:])
    want, got, _ = run_both(delegate, "gather_grad", [randn(rng, grad_shape), index, randn(rng, shape)], {"axis": axis})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def pool_case(data, rng, dilated):
    """(x, attrs) for a 2-D pool with random window, strides, pads and ceil mode."""
    kernel = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    strides = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    dilations = data.draw(st.tuples(st.integers(1, 2), st.integers(1, 2))) if dilated else (1, 1)
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    size = [data.draw(st.integers((k - 1) * d + 1, 9)) for k, d in zip(kernel, dilations)]
    x = randn(rng, (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), *size))
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": data.draw(st.booleans())}
    if dilated:
        attrs["dilations"] = dilations
    return x, attrs


@given(data=st.data(), ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_max_pool_grad(delegate, data, ties, seed):
    rng = np.random.default_rng(seed)
    x, attrs = pool_case(data, rng, dilated=True)
    if ties:
        x = np.round(x).astype(np.float32)  # equal maxima: the first in kernel order wins
    dy_shape = forward_shape("max_pool", x, attrs)
    want, got, _ = run_both(delegate, "max_pool_grad", [x, randn(rng, dy_shape)], attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(data=st.data(), include=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_avg_pool_grad(delegate, data, include, seed):
    rng = np.random.default_rng(seed)
    x, attrs = pool_case(data, rng, dilated=False)
    attrs["count_include_pad"] = int(include)
    dy_shape = forward_shape("avg_pool", x, attrs)
    want, got, _ = run_both(delegate, "avg_pool_grad", [randn(rng, dy_shape), x], attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def conv_case(data, rng):
    """(x, w, attrs, dy shape) for a 2-D conv with random window, strides, dilations, pads and groups."""
    group = data.draw(st.integers(1, 3))
    c, m = group * data.draw(st.integers(1, 2)), group * data.draw(st.integers(1, 3))
    kernel = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    dilations = data.draw(st.tuples(st.integers(1, 2), st.integers(1, 2)))
    attrs = {"strides": data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3))), "dilations": dilations,
             "group": group}
    auto_pad = data.draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = [data.draw(st.integers(0, 2)) for _ in range(4)]
    else:
        attrs["auto_pad"] = auto_pad
    size = [data.draw(st.integers((k - 1) * d + 1, 9)) for k, d in zip(kernel, dilations)]
    x = randn(rng, (data.draw(st.integers(1, 2)), c, *size))
    w = randn(rng, (m, c // group, *kernel))
    g = ef.Graph()
    with g.as_default():
        y = apply("conv", [ef.placeholder(x.dtype, x.shape, name="x"), ef.placeholder(w.dtype, w.shape, name="w")],
                  attrs)
    return x, w, attrs, tuple(y.shape)


@given(data=st.data(), seed=st.integers(0, 2 ** 16))
def test_conv_input_grad(delegate, data, seed):
    rng = np.random.default_rng(seed)
    x, w, attrs, dy_shape = conv_case(data, rng)
    want, got, _ = run_both(delegate, "conv_input_grad", [randn(rng, dy_shape), w, x], attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@given(data=st.data(), seed=st.integers(0, 2 ** 16))
def test_conv_filter_grad(delegate, data, seed):
    rng = np.random.default_rng(seed)
    x, w, attrs, dy_shape = conv_case(data, rng)
    want, got, _ = run_both(delegate, "conv_filter_grad", [x, randn(rng, dy_shape), w], attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_grads_1d_stay_on_cpu():
    reason = conv._conv_grad_unsupported({}, [np.zeros((1, 1, 5), np.float32)] * 2,
                                         [np.zeros((1, 1, 5), np.float32)])
    assert reason and "1-D" in reason


def forward_shape(op, x, attrs):
    g = ef.Graph()
    with g.as_default():
        return tuple(apply(op, [ef.placeholder(x.dtype, x.shape, name="x")], attrs).shape)


@given(op=st.sampled_from(sorted(math.COMPARISONS)), a=shapes, b=shapes,
       dtype=st.sampled_from([np.float32, np.int32, np.bool_]), seed=st.integers(0, 2 ** 16))
def test_comparisons_broadcast(delegate, op, a, b, dtype, seed):
    rng = np.random.default_rng(seed)
    b = [d if i >= len(a) or a[-1 - i] == 1 or d == 1 else a[-1 - i] for i, d in enumerate(b[::-1])][::-1]
    xa, xb = (rng.integers(-2, 3, s).astype(dtype) for s in (a, b))  # small integers: many equal pairs
    want, got, _ = run_both(delegate, op, [xa, xb])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-0.5, np.inf), (-np.inf, 0.25)])
def test_clip_grad(delegate, bounds):
    """ReLU6's (clip's) gradient: dy where min <= x <= max, the bounds themselves included."""
    rng = np.random.default_rng(3)
    x = randn(rng, (2, 3, 5, 7)) * 4
    x.flat[:2] = [b for b in bounds if np.isfinite(b)][0], 0.0
    dy = randn(rng, x.shape)
    want, got, _ = run_both(delegate, "clip_grad", [dy, x], {"min": bounds[0], "max": bounds[1]})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.where((x < bounds[0]) | (x > bounds[1]), 0, dy))


def test_relu_grad(delegate):
    """ReLU's gradient: dy where x > 0 (x = 0 gets none)."""
    rng = np.random.default_rng(4)
    x = np.round(randn(rng, (2, 3, 5, 7)))  # many zeros
    dy = randn(rng, x.shape)
    want, got, _ = run_both(delegate, "relu_grad", [dy, x])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.where(x > 0, dy, 0))


# -- a small CNN trained on the device and off it ------------------------------------------

def cnn_package():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [4, 1, 8, 8], name="x")
        labels = ef.placeholder(ef.int32, [4], name="labels")
        h = ef.layers.conv2d(x, 4, 3, padding="same", activation=ef.nn.relu)
        h = ef.layers.max_pool2d(h, 2, 2)
        logits = ef.layers.dense(ef.layers.flatten(h), 3)
        loss = ef.losses.softmax_cross_entropy(labels, logits)
        step = ef.train.GradientDescent(0.1).minimize(loss)
    return to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"logits": logits}),
                                    "train": ({"x": x, "labels": labels}, {"loss": loss}, [step])}))


def train(package, delegates, batches):
    interp = ef.Interpreter(package, delegates=delegates)
    runner = interp.get_signature_runner("train")
    losses = [float(runner(x=xv, labels=yv)["loss"]) for xv, yv in batches]
    return losses, interp.get_signature_runner("save")(), runner.last_plan


@pytest.mark.slow
def test_cnn_training_matches_and_runs_more_on_opencl(delegate, monkeypatch):
    rng = np.random.default_rng(1)
    batches = [(randn(rng, (4, 1, 8, 8)), rng.integers(0, 3, 4).astype(np.int32)) for _ in range(3)]
    package = cnn_package()
    want_losses, want, _ = train(package, [], batches)
    got_losses, got, after = train(package, [delegate], batches)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name in OURS:
        monkeypatch.delitem(CL_KERNELS, name)
    _, _, before = train(package, [delegate], batches)
    on_device = [sum(p == "opencl" for p in plan.placement.values()) for plan in (before, after)]
    print(f"train without these kernels: {before.placement_summary()}")
    print(f"train with them:             {after.placement_summary()}")
    print("still on CPU:", sorted(set(after.fallbacks.values())))
    assert on_device[1] > on_device[0]
