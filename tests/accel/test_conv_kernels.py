"""The OpenCL conv, pooling, batch_norm and pad kernels against the numpy kernels: each op
alone in a model, run by the interpreter with and without the OpenCL delegate."""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgeflow as ef
import edgeflow.accel
from edgeflow.accel.kernels import conv as conv_kernels
from edgeflow.accel.kernels import gemm
from edgeflow.format import writer
from edgeflow.graph import math_ops

# The window kernels are built per geometry (every size a compile-time constant), so each
# new example compiles a program: these tests take a quarter of the profile's examples.
PER_GEOMETRY = settings(max_examples=max(1, settings.default.max_examples // 4))


@pytest.fixture(scope="module")
def delegate():
    return edgeflow.accel.OpenCLDelegate()


def one_op_model(op, arrays, attrs):
    g = ef.Graph()
    with g.as_default():
        inputs = {f"in{i}": ef.placeholder(ef.float32, a.shape, name=f"in{i}") for i, a in enumerate(arrays)}
        y = math_ops.apply(op, list(inputs.values()), attrs)
    return writer.to_bytes(ef.to_model(g, {"infer": (inputs, {"y": y})}))


def check(delegate, op, arrays, attrs, tol=1e-4):
    """The op on OpenCL equals the numpy kernel's result, and really ran on OpenCL."""
    model = one_op_model(op, arrays, attrs)
    feeds = {f"in{i}": a for i, a in enumerate(arrays)}
    expected = ef.Interpreter(model).get_signature_runner("infer")(**feeds)["y"]
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    got = runner(**feeds)["y"]
    assert set(runner.last_plan.placement.values()) == {"opencl"}, runner.last_plan.fallbacks
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    return runner


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


ACTIVATION = st.sampled_from(["", "relu", "relu6", "swish", "hard_swish"])


@st.composite
def windows(draw, rank, dilations=True):
    """(kernel, attrs) of a sliding window over `rank` spatial axes of sizes that fit it."""
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    attrs = {"strides": tuple(draw(st.integers(1, 3)) for _ in range(rank))}
    if dilations:
        attrs["dilations"] = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    attrs["auto_pad"] = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if attrs["auto_pad"] == "NOTSET":
        attrs["pads"] = tuple(draw(st.integers(0, k - 1)) for k in kernel * 2)
    return kernel, attrs


def spatial(draw, kernel, attrs):
    dil = attrs.get("dilations") or (1,) * len(kernel)
    return tuple(draw(st.integers((k - 1) * d + 1, (k - 1) * d + 9)) for k, d in zip(kernel, dil))


@PER_GEOMETRY
@given(data=st.data(), rank=st.sampled_from([1, 2, 2]), cpu=st.booleans(), seed=st.integers(0, 2**31))
def test_conv(delegate, data, rank, cpu, seed):
    """By the direct kernel, and by im2col + the register-blocked GEMM (the CPU path)."""
    kernel, attrs = data.draw(windows(rank))
    group = data.draw(st.integers(1, 3))
    cpg, mpg = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))  # mpg crosses the 4-channel tile
    rng = np.random.default_rng(seed)
    x = normal(rng, data.draw(st.integers(1, 2)), group * cpg, *spatial(data.draw, kernel, attrs))
    arrays = [x, normal(rng, group * mpg, cpg, *kernel)]
    if data.draw(st.booleans()):
        arrays.append(normal(rng, group * mpg))
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "conv", arrays, {**attrs, "group": group, "activation": data.draw(ACTIVATION)})


@PER_GEOMETRY
@given(data=st.data(), rank=st.sampled_from([1, 2, 2]), cpu=st.booleans(), seed=st.integers(0, 2**31))
def test_depthwise_conv(delegate, data, rank, cpu, seed):
    """By the run-time-geometry kernel (GPUs) and window.cl's, built per geometry (CPUs)."""
    kernel, attrs = data.draw(windows(rank))
    c, multiplier = data.draw(st.integers(2, 9)), data.draw(st.integers(1, 2))
    rng = np.random.default_rng(seed)
    x = normal(rng, data.draw(st.integers(1, 2)), c, *spatial(data.draw, kernel, attrs))
    arrays = [x, normal(rng, c * multiplier, 1, *kernel), normal(rng, c * multiplier)]
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "conv", arrays[:data.draw(st.integers(2, 3))],
              {**attrs, "group": c, "activation": data.draw(ACTIVATION)})


@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize("n,c,h,w,stride,pads", [(1, 3, 1, 1, 1, (1, 1, 1, 1)), (2, 5, 17, 1, 2, (1, 1, 1, 1)),
                                                 (1, 7, 5, 31, 2, (1, 1, 1, 1)), (3, 2, 9, 8, 3, (2, 1, 0, 2))])
def test_depthwise_conv_odd_sizes(delegate, n, c, h, w, stride, pads, cpu):
    """Odd and prime sizes: window.cl's work-groups divide each dimension (fixed_range)."""
    rng = np.random.default_rng(c * h * w)
    arrays = [normal(rng, n, c, h, w), normal(rng, c, 1, 3, 3), normal(rng, c)]
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "conv", arrays, {"group": c, "strides": (stride, stride), "pads": pads,
                                         "activation": "relu"})


def test_fixed_range_divides_and_fills_units(delegate):
    from edgeflow.accel.kernels.conv import fixed_range
    rt = delegate.rt
    for dims in [(1,), (7,), (997,), (32, 32, 16), (13, 1, 7), (4, 4, 576), (1024,)]:
        size, group = fixed_range(rt, dims)
        assert size == dims and all(d % g == 0 for d, g in zip(dims, group))
        assert np.prod(group) <= min(conv_kernels.CPU_GROUP_ITEMS, rt.device.max_work_group_size)
        groups = np.prod(dims) // np.prod(group)
        assert groups >= min(conv_kernels.GROUPS_PER_UNIT * rt.device.max_compute_units, np.prod(dims)) or \
            np.prod(group) == 1


@given(n=st.integers(1, 2), group=st.sampled_from([1, 1, 2]), cpg=st.integers(1, 20), mpg=st.integers(1, 40),
       h=st.integers(1, 11), w=st.integers(1, 13), bias=st.booleans(), activation=ACTIVATION,
       tiled=st.booleans(), cpu=st.booleans(), seed=st.integers(0, 2**31))
def test_pointwise_conv(delegate, n, group, cpg, mpg, h, w, bias, activation, tiled, cpu, seed):
    """1x1 stride-1 convs: a GEMM over channels, tiles crossing every edge of the sizes, by
    the local-memory kernel (what GPUs run), the register-blocked GEMM on the input (what
    CPUs run) and the direct one."""
    rng = np.random.default_rng(seed)
    arrays = [normal(rng, n, group * cpg, h, w), normal(rng, group * mpg, cpg, 1, 1), normal(rng, group * mpg)]
    with mock.patch.object(conv_kernels, "LOCAL_TILING", tiled), mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "conv", arrays[:2 + bias], {"group": group, "activation": activation})


@PER_GEOMETRY
@given(data=st.data(), rank=st.sampled_from([1, 2, 2]), ceil_mode=st.booleans(), cpu=st.booleans(),
       seed=st.integers(0, 2**31))
def test_max_pool(delegate, data, rank, ceil_mode, cpu, seed):
    kernel, attrs = data.draw(windows(rank))
    x = normal(np.random.default_rng(seed), 2, 3, *spatial(data.draw, kernel, attrs))
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "max_pool", [x], {**attrs, "kernel_shape": kernel, "ceil_mode": ceil_mode})


def test_max_pool_propagates_nan(delegate):
    x = np.zeros((1, 2, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    for cpu in (True, False):
        with mock.patch.object(gemm, "CPU_PATH", cpu):
            runner = check(delegate, "max_pool", [x], {"kernel_shape": (2, 2), "strides": (2, 2)})
            assert np.isnan(runner(in0=x)["y"][0, 0, 0, 0])


@PER_GEOMETRY
@given(data=st.data(), rank=st.sampled_from([1, 2, 2]), ceil_mode=st.booleans(), include=st.booleans(),
       cpu=st.booleans(), seed=st.integers(0, 2**31))
def test_avg_pool(delegate, data, rank, ceil_mode, include, cpu, seed):
    kernel, attrs = data.draw(windows(rank, dilations=False))
    x = normal(np.random.default_rng(seed), 2, 3, *spatial(data.draw, kernel, attrs))
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        check(delegate, "avg_pool", [x], {**attrs, "kernel_shape": kernel, "ceil_mode": ceil_mode,
                                          "count_include_pad": include})


@given(shape=st.lists(st.integers(1, 7), min_size=2, max_size=5), eps=st.sampled_from([1e-5, 1e-3]),
       seed=st.integers(0, 2**31))
def test_batch_norm(delegate, shape, eps, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    arrays = [normal(rng, *shape), normal(rng, c), normal(rng, c), normal(rng, c),
              rng.uniform(0.1, 2, c).astype(np.float32)]
    check(delegate, "batch_norm", arrays, {"epsilon": eps})


@given(data=st.data(), mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]), seed=st.integers(0, 2**31))
def test_pad(delegate, data, mode, seed):
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    low = -2 if mode == "constant" else 0
    pads = [data.draw(st.integers(max(low, -(n // 2)), 4)) for n in shape]  # crops leave >= 1
    pads += [data.draw(st.integers(max(low, -((n - 1) // 2)), 4)) for n in shape]
    x = normal(np.random.default_rng(seed), *shape)
    check(delegate, "pad", [x], {"pads": tuple(pads), "mode": mode, "value": 1.5}, tol=0)


def test_conv_3d_falls_back_with_its_reason(delegate):
    rng = np.random.default_rng(0)
    model = one_op_model("conv", [normal(rng, 1, 2, 4, 4, 4), normal(rng, 3, 2, 2, 2, 2)], {})
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    runner(in0=normal(rng, 1, 2, 4, 4, 4), in1=normal(rng, 3, 2, 2, 2, 2))
    assert set(runner.last_plan.placement.values()) == {"cpu"}
    assert "3-D convolution" in next(iter(runner.last_plan.fallbacks.values()))


def test_dilated_avg_pool_falls_back_with_its_reason(delegate):
    rng = np.random.default_rng(0)
    attrs = {"kernel_shape": (2, 2), "dilations": (2, 2)}
    model = one_op_model("avg_pool", [normal(rng, 1, 2, 6, 6)], attrs)
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    runner(in0=normal(rng, 1, 2, 6, 6))
    assert set(runner.last_plan.placement.values()) == {"cpu"}
    assert "dilations" in next(iter(runner.last_plan.fallbacks.values()))
