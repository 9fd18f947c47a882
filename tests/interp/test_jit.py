"""The numba loops of edgeflow/interp/kernels/jit.py: each kernel they serve, run with them
(`jit`) and with numba disabled (`numpy`, EDGEFLOW_JIT=0: the numpy-only install's path),
against onnxruntime on odd shapes and, for the JIT, against the numpy path it replaces.

fp32 results agree within 1e-4 of the largest magnitude of the reference (sums of random
terms cancel, so a bound relative to each element would test the rounding of numbers near 0).
"""
import ctypes
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp import threads
from edgeflow.interp.kernels import conv as conv_kernels
from edgeflow.interp.kernels import jit, native_depthwise, native_gemm, native_small_conv

from .native_cases import ACTIVATIONS

FEW = settings(max_examples=12)
FUSED = sorted(set(ACTIVATIONS) - {""})


@pytest.fixture(params=["jit", "numpy"])
def mode(request, monkeypatch):
    """Which path the kernels bind to; under `jit`, the loops bound are recorded in
    `bound` (a list of loop names) so that a test can check the JIT did run."""
    return _bind_mode(request.param, monkeypatch)


@pytest.fixture
def jit_mode(monkeypatch):
    """`mode`'s JIT path alone, for tests of what only the loops promise."""
    return _bind_mode("jit", monkeypatch)


def _bind_mode(path, monkeypatch):
    monkeypatch.setenv("EDGEFLOW_JIT", "1" if path == "jit" else "0")
    if path == "jit":  # the jit extra is installed with the tests: a broken numba fails here
        assert jit.available(), "numba does not import"  # loaded: the loops of small gains bind too
    bound, compiled, native, native_dw = [], jit.compiled, native_gemm.bind, native_depthwise.bind
    native_sc = native_small_conv.bind

    def recording(loop, *args, **kwargs):
        bound.append(loop.__name__)
        return compiled(loop, *args, **kwargs)

    def recording_native(*args, **kwargs):
        step = native(*args, **kwargs)
        if step is not None:
            bound.append("native_gemm")
        return step
    def recording_depthwise(*args, **kwargs):
        step = native_dw(*args, **kwargs)
        if step is not None:
            bound.append("native_depthwise")
        return step

    def recording_small_conv(*args, **kwargs):
        step = native_sc(*args, **kwargs)
        if step is not None:
            bound.append("native_small_conv")
        return step
    monkeypatch.setattr(jit, "compiled", recording)
    monkeypatch.setattr(native_gemm, "bind", recording_native)
    monkeypatch.setattr(native_depthwise, "bind", recording_depthwise)
    monkeypatch.setattr(native_small_conv, "bind", recording_small_conv)
    return path, bound


def run(build, x, jit_on=None):
    """build(placeholder) run on x by an Interpreter; EDGEFLOW_JIT set to `jit_on` (if not
    None) while its plan binds."""
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = build(t)
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))) \
        .get_signature_runner("infer")
    if jit_on is None:
        return runner(x=x)["y"]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("EDGEFLOW_JIT", "1" if jit_on else "0")
        return runner(x=x)["y"]


def onnx_run(nodes, x, inits, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def close(got, expected, rtol=1e-4):
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * max(float(np.abs(expected).max()), 1.0))


def check(mode, build, x, expected, loop):
    """The kernel's result on x is `expected` (onnxruntime's), and under the JIT also the
    numpy path's, with `loop` the one bound (or one of a tuple of them)."""
    path, bound = mode
    bound.clear()
    got = run(build, x)
    close(got, expected)
    if path == "jit":
        assert set((loop,) if isinstance(loop, str) else loop) & set(bound), bound
        close(got, run(build, x, jit_on=False))
    else:
        assert not bound


# -- depthwise convolution -------------------------------------------------------------------

@st.composite
def depthwise_cases(draw):
    k = draw(st.sampled_from([3, 5]))
    c, n = draw(st.sampled_from([2, 3, 5, 6, 64, 67])), draw(st.integers(1, 2))  # 64: one channel block, 67: two
    h, w = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
    reach = (k - 1) * dilation + 1
    assume(h + pads[0] + pads[2] >= reach and w + pads[1] + pads[3] >= reach)
    return (n, c, h, w), k, {"strides": (stride, stride), "dilations": (dilation, dilation), "pads": tuple(pads),
                             "group": c}, draw(st.sampled_from(list(ACTIVATIONS))), draw(st.booleans())


@pytest.fixture(params=["depthwise_loop", "depthwise_channels_loop", "native_depthwise"])
def depthwise(request, monkeypatch):
    """Which of the two depthwise loops binds, whatever the plane's width, the compiled
    kernel (native_depthwise) left out; or the default choice, the compiled kernel where it
    `suits`: the name."""
    if request.param != "native_depthwise":
        monkeypatch.setattr(jit, "DEPTHWISE_PLANE_MIN", 0 if request.param == "depthwise_loop" else 1 << 30)
        monkeypatch.setattr(jit, "DEPTHWISE_SAME_MIN", 1 << 30)
        monkeypatch.setattr(native_depthwise, "suits", lambda *args: False)
    return request.param


@FEW
@given(case=depthwise_cases(), seed=st.integers(0, 2 ** 16))
def test_depthwise_conv(mode, depthwise, case, seed):
    shape, k, attrs, activation, with_bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, k, k)).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32) if with_bias else None
    operands = [w] + ([b] if with_bias else [])
    inits = {"w": w, **({"b": b} if with_bias else {})}
    expected = ACTIVATIONS[activation](onnx_run([helper.make_node("Conv", ["x", *inits], ["y"], **attrs)], x, inits))
    loop = depthwise
    if depthwise == "native_depthwise":
        # the conv as bound: outer taps that read only padding dropped (conv.reaching)
        fixed = w.copy()
        fixed.flags.writeable = False
        kept, bound = conv_kernels.reaching(x, fixed, {**attrs, "auto_pad": "NOTSET"})
        kernel, pads = kept.shape[2:], bound["pads"]
        out = [(size + pads[i] + pads[i + 2] - (kernel[i] - 1) * attrs["dilations"][i] - 1) // attrs["strides"][i] + 1
               for i, size in enumerate(shape[2:])]
        if not native_depthwise.suits(shape[2:], kernel, attrs["strides"], attrs["dilations"], pads[:2], out,
                                      activation):
            loop = ("depthwise_loop", "depthwise_channels_loop", "depthwise_same_loop")
    check(mode, lambda t: apply("conv", [t] + operands, {**attrs, "activation": activation}), x, expected, loop)


@pytest.mark.parametrize("c, size, stride, k", [(24, 28, 2, 3), (16, 14, 2, 5), (40, 14, 1, 5)])
def test_a_compiled_depthwise_convs_swish_is_a_pass_after_it(jit_mode, c, size, stride, k):
    """Where native_depthwise's kernel takes a depthwise conv with a swish, the conv runs
    without it, then swish_inplace_loop over its output (one array, vectorized): the values
    of a float64 conv and swish, and the bits of swish_loop out of place on the conv's."""
    if not native_gemm.available():
        pytest.skip("native_depthwise runs where native_gemm does: x86-64 with AVX2 and FMA")
    rng = np.random.default_rng(c + k)
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    o = (size + 2 * (k // 2) - k) // stride + 1
    out, plain = np.full((1, c, o, o), np.nan, np.float32), np.empty((1, c, o, o), np.float32)
    jit_mode[1].clear()
    jit.bind_depthwise(x, w, b, out, (stride, stride), (1, 1), (k // 2, k // 2), "swish")()
    assert jit_mode[1] == ["native_depthwise", "swish_inplace_loop"], jit_mode[1]
    jit.bind_depthwise(x, w, b, plain, (stride, stride), (1, 1), (k // 2, k // 2), "")()
    swished = np.empty_like(plain)
    jit.bind_activation("swish", plain, swished, {})()
    np.testing.assert_array_equal(out, swished)
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x.astype(np.float64), ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2))), (k, k),
        axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.einsum("nchwij,cij->nchw", windows, w[:, 0]) + b[:, None, None]
    np.testing.assert_allclose(out, y / (1 + np.exp(-y)), rtol=1e-5, atol=1e-5 * np.abs(y).max())


def test_depthwise_float64(jit_mode, depthwise):
    """float64 operands take the loops too, in float64 (the compiled kernel, float32's alone,
    declines them: a plane of 11 columns then takes the channel blocks' loop)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 70, 9, 11))
    w, b = rng.standard_normal((70, 1, 3, 3)), rng.standard_normal(70)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float64, x.shape, name="x")
        y = apply("conv", [t, w, b], {"pads": (1, 1, 1, 1), "group": 70, "activation": "relu"})
    jit_mode[1].clear()
    got = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))) \
        .get_signature_runner("infer")(x=x)["y"]
    assert (depthwise if depthwise != "native_depthwise" else "depthwise_channels_loop") in jit_mode[1]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = sum(w[None, :, 0, i, j, None, None] * padded[:, :, i:i + 9, j:j + 11]
                   for i in range(3) for j in range(3))
    np.testing.assert_allclose(got, np.maximum(expected + b[None, :, None, None], 0), rtol=1e-12, atol=1e-12)


@st.composite
def same_cases(draw):
    """Stride-1 depthwise convs whose output plane is the input's (K x K, (K - 1) / 2 zeros
    on every side): depthwise_same_loop's, on planes from the smallest it takes."""
    k = draw(st.sampled_from([3, 5]))
    c, n = draw(st.sampled_from([2, 5, 64, 67])), draw(st.integers(1, 2))
    shape = (n, c, draw(st.integers(k + 1, 17)), draw(st.integers(k, 17)))
    attrs = {"pads": (k // 2,) * 4, "group": c}
    return shape, k, attrs, draw(st.sampled_from(list(ACTIVATIONS))), draw(st.booleans())


@FEW
@given(case=same_cases(), seed=st.integers(0, 2 ** 16))
def test_depthwise_same_conv(mode, case, seed):
    """depthwise_same_loop (taken here whatever the plane's width, native_depthwise left
    out) against onnxruntime and the numpy path, on planes whose rows and bands are a few
    elements long."""
    shape, k, attrs, activation, with_bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, k, k)).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32) if with_bias else None
    inits = {"w": w, **({"b": b} if with_bias else {})}
    expected = ACTIVATIONS[activation](onnx_run([helper.make_node("Conv", ["x", *inits], ["y"], **attrs)], x, inits))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(jit, "DEPTHWISE_SAME_MIN", 0)
        m.setattr(native_depthwise, "suits", lambda *args: False)  # its stride-1 convs left out
        check(mode, lambda t: apply("conv", [t, *inits.values()], {**attrs, "activation": activation}), x,
              expected, "depthwise_same_loop")


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("kernel", ["depthwise_same_loop", "native_depthwise"])
def test_depthwise_same_keeps_rows_apart(jit_mode, k, kernel, monkeypatch):
    """The long run reads a row's neighbours past its ends and drops them by mask: an inf or
    a NaN at the end of a row (or of a channel) reaches only the outputs whose windows hold
    it, as in onnxruntime; so in native_depthwise's copy inside zeros, which the default
    thresholds pick for a 16-wide plane."""
    if kernel == "depthwise_same_loop":
        monkeypatch.setattr(native_depthwise, "suits", lambda *args: False)
    rng = np.random.default_rng(k)
    x = rng.standard_normal((1, 3, 12, 16)).astype(np.float32)
    x[0, 0, 4, -1], x[0, 1, 7, 0], x[0, 2, -1, -1], x[0, 1, 0, 0] = np.inf, -np.inf, np.nan, np.inf
    w = rng.standard_normal((3, 1, k, k)).astype(np.float32)
    attrs = {"pads": (k // 2,) * 4, "group": 3}
    expected = onnx_run([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], x, {"w": w})
    assert np.isfinite(expected).sum() > expected.size // 2
    jit_mode[1].clear()
    got = run(lambda t: apply("conv", [t, w], {**attrs, "activation": ""}), x)
    assert kernel in jit_mode[1]
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected[np.isfinite(expected)]).max())


def test_depthwise_same_float64(jit_mode):
    """float64 operands take depthwise_same_loop too, in float64."""
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 5, 11, 12)), rng.standard_normal((5, 1, 5, 5)), rng.standard_normal(5)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float64, x.shape, name="x")
        y = apply("conv", [t, w, b], {"pads": (2, 2, 2, 2), "group": 5, "activation": "relu6"})
    jit_mode[1].clear()
    got = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))) \
        .get_signature_runner("infer")(x=x)["y"]
    assert "depthwise_same_loop" in jit_mode[1]
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    expected = sum(w[None, :, 0, i, j, None, None] * padded[:, :, i:i + 11, j:j + 12]
                   for i in range(5) for j in range(5))
    np.testing.assert_allclose(got, np.clip(expected + b[None, :, None, None], 0, 6), rtol=1e-12, atol=1e-12)


def test_depthwise_mobilenet_layer(mode, depthwise):
    """A MobileNetV2 layer: 3x3, stride 2, padding 1, bias, relu6."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 24, 28, 28)).astype(np.float32)
    w, b = rng.standard_normal((24, 1, 3, 3)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    attrs = {"strides": (2, 2), "pads": (1, 1, 1, 1), "group": 24}
    expected = np.clip(onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": w, "b": b}),
                       0, 6)
    check(mode, lambda t: apply("conv", [t, w, b], {**attrs, "activation": "relu6"}), x, expected, depthwise)


def _depthwise_grads_reference(x, w, dy, attrs):
    """(dx, dw) of a depthwise conv in float64, tap by tap over the padded input's windows."""
    (sh, sw), (dh, dw_), (top, left, bottom, right) = attrs["strides"], attrs["dilations"], attrs["pads"]
    n, c, h, wd = x.shape
    oh, ow = dy.shape[2:]
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    dx, dw = np.zeros_like(padded), np.zeros(w.shape)
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            window = (slice(None), slice(None), slice(i * dh, i * dh + (oh - 1) * sh + 1, sh),
                      slice(j * dw_, j * dw_ + (ow - 1) * sw + 1, sw))
            dw[:, 0, i, j] = (padded[window] * dy).sum(axis=(0, 2, 3))
            dx[window] += dy * w[None, :, 0, i, j, None, None]
    return dx[:, :, top:top + h, left:left + wd], dw


def _depthwise_grads(x, w, dy, attrs, num_threads=None):
    """conv_input_grad and conv_filter_grad of a depthwise conv, run by an Interpreter."""
    dtype = ef.float64 if x.dtype == np.float64 else ef.float32
    g = ef.Graph()
    with g.as_default():
        tx, tdy = ef.placeholder(dtype, x.shape, name="x"), ef.placeholder(dtype, dy.shape, name="dy")
        dx = apply("conv_input_grad", [tdy, w, ef.constant(np.zeros(x.shape, x.dtype))], attrs)
        dw = apply("conv_filter_grad", [tx, tdy, ef.constant(np.zeros(w.shape, w.dtype))], attrs)
    model = writer.to_bytes(ef.to_model(g, {"infer": ({"x": tx, "dy": tdy}, {"dx": dx, "dw": dw})}))
    got = ef.Interpreter(model, num_threads=num_threads).get_signature_runner("infer")(x=x, dy=dy)
    return got["dx"], got["dw"]


@FEW
@given(case=depthwise_cases(), seed=st.integers(0, 2 ** 16))
def test_depthwise_conv_gradients(mode, case, seed):
    """A train step's depthwise conv backwards (strides, dilations, uneven pads, odd planes):
    the input's and the filter's gradients against a float64 numpy reference, and under
    the JIT (depthwise_input_grad_loop, depthwise_filter_grad_loop) the numpy path's."""
    shape, k, attrs, _, _ = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, k, k)).astype(np.float32)
    out = [(size + a + b - (k - 1) * d - 1) // s + 1 for size, a, b, d, s in
           zip(shape[2:], attrs["pads"][:2], attrs["pads"][2:], attrs["dilations"], attrs["strides"])]
    dy = rng.standard_normal(shape[:2] + tuple(out)).astype(np.float32)
    path, bound = mode
    bound.clear()
    got = _depthwise_grads(x, w, dy, attrs)
    for a, b in zip(got, _depthwise_grads_reference(x, w, dy, attrs)):
        close(a, b)
    if path == "jit":
        assert {"depthwise_input_grad_loop", "depthwise_filter_grad_loop"} <= set(bound), bound
        with pytest.MonkeyPatch.context() as m:
            m.setenv("EDGEFLOW_JIT", "0")
            for a, b in zip(got, _depthwise_grads(x, w, dy, attrs)):
                close(a, b)
    else:
        assert not bound


def _max_pool_grad_reference(x, dy, k, stride, dilation, pads):
    """Brute force: each window's dy to its first maximum in kernel order, padding excluded."""
    dx = np.zeros(x.shape)
    for n, c, oh, ow in np.ndindex(dy.shape):
        taps = [(ih, iw) for i in range(k) for j in range(k)
                for ih, iw in [(oh * stride + i * dilation - pads[0], ow * stride + j * dilation - pads[1])]
                if 0 <= ih < x.shape[2] and 0 <= iw < x.shape[3]]
        best = max(x[n, c, ih, iw] for ih, iw in taps)
        ih, iw = next(t for t in taps if x[n, c, t[0], t[1]] == best)
        dx[n, c, ih, iw] += dy[n, c, oh, ow]
    return dx


@FEW
@given(n=st.integers(1, 3), c=st.integers(1, 5), h=st.integers(1, 12), w=st.integers(1, 12), k=st.integers(1, 3),
       stride=st.integers(1, 3), dilation=st.integers(1, 2), pads=st.lists(st.integers(0, 1), min_size=4, max_size=4),
       ceil_mode=st.booleans(), threads_=st.sampled_from([None, 2]), seed=st.integers(0, 2 ** 16))
def test_max_pool_grad(mode, n, c, h, w, k, stride, dilation, pads, ceil_mode, threads_, seed):
    """A train step's max pool backwards: each window's gradient to its first maximum in
    kernel order (inputs rounded: many ties), against brute force; under the JIT
    (max_pool_grad_loop; images apart with 2 workers) as under numpy."""
    reach = (k - 1) * dilation + 1
    assume(h + pads[0] + pads[2] >= reach and w + pads[1] + pads[3] >= reach and max(pads) < reach)
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal((n, c, h, w)) * 2).astype(np.float32)
    attrs = {"kernel_shape": (k, k), "strides": (stride, stride), "dilations": (dilation, dilation),
             "pads": tuple(pads), "ceil_mode": ceil_mode}
    g = ef.Graph()
    with g.as_default():
        out_shape = apply("max_pool", [ef.placeholder(ef.float32, x.shape)], attrs).shape
    assume(all(any(0 <= o * stride + i * dilation - pads[a] < (h, w)[a] for i in range(k)) for a, o in
               ((0, out_shape[2] - 1), (1, out_shape[3] - 1))))  # ceil_mode's last window reaches x
    dy = rng.standard_normal(out_shape).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        tx, tdy = ef.placeholder(ef.float32, x.shape, name="x"), ef.placeholder(ef.float32, dy.shape, name="dy")
        y = apply("max_pool_grad", [tx, tdy], attrs)
    model = writer.to_bytes(ef.to_model(g, {"infer": ({"x": tx, "dy": tdy}, {"y": y})}))
    path, bound = mode
    bound.clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(threads, "MIN_ELEMENTS", 1)
        got = ef.Interpreter(model, num_threads=threads_).get_signature_runner("infer")(x=x, dy=dy)["y"]
    close(got, _max_pool_grad_reference(x, dy, k, stride, dilation, pads))
    if path == "jit":
        assert bound.count("max_pool_grad_loop") == (min(2, n) if threads_ and n >= 2 else 1), bound
    else:
        assert not bound


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-0.5, 1.0), (0.0, np.inf), (-np.inf, 0.25)])
@pytest.mark.parametrize("threads_", [None, 2])
def test_clip_grad(mode, dtype, bounds, threads_):
    """ReLU6's (clip's) gradient in one pass: dy where min <= x <= max (bounds included,
    NaN x passes), 0 elsewhere; a numpy expression the reference; with 2 workers and 2^18
    elements and more, in pieces."""
    low, high = bounds
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 300, 301)) * 4).astype(dtype)
    x.flat[:6] = [low, high, np.nan, np.inf, -np.inf, 0.0]
    dy = rng.standard_normal(x.shape).astype(dtype)
    g = ef.Graph()
    with g.as_default():
        kind = ef.float32 if dtype == np.float32 else ef.float64
        tx, tdy = ef.placeholder(kind, x.shape, name="x"), ef.placeholder(kind, x.shape, name="dy")
        y = apply("clip_grad", [tdy, tx], {"min": low, "max": high})
    model = writer.to_bytes(ef.to_model(g, {"infer": ({"x": tx, "dy": tdy}, {"y": y})}))
    path, bound = mode
    bound.clear()
    got = ef.Interpreter(model, num_threads=threads_).get_signature_runner("infer")(x=x, dy=dy)["y"]
    np.testing.assert_array_equal(got, np.where((x < low) | (x > high), 0, dy))
    assert bound.count("clip_grad_loop") == (0 if path == "numpy" else 2 if threads_ else 1), bound


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads_", [None, 2])
def test_relu_grad(mode, dtype, threads_):
    """ReLU's gradient in one pass: dy where x > 0, 0 elsewhere (x = 0, NaN, -inf included);
    a numpy expression the reference; with 2 workers and 2^18 elements and more, in pieces."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 300, 301)).astype(dtype)
    x.flat[:5] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    dy = rng.standard_normal(x.shape).astype(dtype)
    g = ef.Graph()
    with g.as_default():
        kind = ef.float32 if dtype == np.float32 else ef.float64
        tx, tdy = ef.placeholder(kind, x.shape, name="x"), ef.placeholder(kind, x.shape, name="dy")
        y = apply("relu_grad", [tdy, tx], {})
    model = writer.to_bytes(ef.to_model(g, {"infer": ({"x": tx, "dy": tdy}, {"y": y})}))
    path, bound = mode
    bound.clear()
    got = ef.Interpreter(model, num_threads=threads_).get_signature_runner("infer")(x=x, dy=dy)["y"]
    np.testing.assert_array_equal(got, np.where(x > 0, dy, 0))
    assert bound.count("relu_grad_loop") == (0 if path == "numpy" else 2 if threads_ else 1), bound


def test_depthwise_gradients_float64_and_threads(jit_mode):
    """float64 takes the gradient loops in float64; with 2 workers the channels split between
    them (a MobileNetV2 layer at batch 4, stride 2: work enough to split) and the pieces
    cover every channel."""
    rng = np.random.default_rng(4)
    attrs = {"strides": (2, 2), "dilations": (1, 1), "pads": (1, 1, 1, 1), "group": 96}
    x, w = rng.standard_normal((4, 96, 28, 28)), rng.standard_normal((96, 1, 3, 3))
    dy = rng.standard_normal((4, 96, 14, 14))
    expected = _depthwise_grads_reference(x, w, dy, attrs)
    for threads_ in (None, 2):
        jit_mode[1].clear()
        got = _depthwise_grads(x, w, dy, attrs, num_threads=threads_)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert jit_mode[1].count("depthwise_input_grad_loop") == (2 if threads_ else 1), jit_mode[1]
        f32 = _depthwise_grads(x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), attrs, threads_)
        for a, b in zip(f32, expected):
            close(a, b)


@pytest.fixture(params=["small_conv_loop", "native_small_conv"])
def stem(request, monkeypatch):
    """The stem loop, the compiled kernel (native_small_conv) left out; or the default
    choice, the compiled kernel where it `suits` and runs: the name."""
    if request.param == "small_conv_loop":
        monkeypatch.setattr(native_small_conv, "suits", lambda *args: False)
    return request.param


def _stem_path(stem, c, k, stride, dilation, pads, out, activation):
    """The path a stem conv of these takes under `stem` (the fixture's choice)."""
    if stem == "native_small_conv" and native_gemm.available() and native_small_conv.suits(
            c, (k, k), (stride, stride), (dilation, dilation), pads[:2], out, activation):
        return "native_small_conv"
    return "small_conv_loop"


@FEW
@given(c=st.integers(1, 4), m=st.integers(1, 9), n=st.integers(1, 2), h=st.integers(1, 13), w=st.integers(1, 13),
       k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2), dilation=st.integers(1, 2),
       pads=st.lists(st.integers(0, 2), min_size=4, max_size=4), activation=st.sampled_from(list(ACTIVATIONS)),
       seed=st.integers(0, 2 ** 16))
def test_small_conv(mode, stem, c, m, n, h, w, k, stride, dilation, pads, activation, seed):
    """A stem's conv: 1-4 input channels, one group, any stride, dilation and padding."""
    reach = (k - 1) * dilation + 1
    assume(h + pads[0] + pads[2] >= reach and w + pads[1] + pads[3] >= reach)
    out = ((h + pads[0] + pads[2] - reach) // stride + 1, (w + pads[1] + pads[3] - reach) // stride + 1)
    _check_conv(mode, (n, c, h, w), (m, c, k, k), stride, dilation, pads, activation, seed,
                _stem_path(stem, c, k, stride, dilation, pads, out, activation))


def _check_conv(mode, x_shape, w_shape, stride, dilation, pads, activation, seed, loop):
    """A conv with a bias and `activation` of random operands against onnxruntime's, `loop`
    bound under the JIT (`check`)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    attrs = {"strides": (stride, stride), "dilations": (dilation, dilation), "pads": tuple(pads)}
    expected = ACTIVATIONS[activation](
        onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": weight, "b": b}))
    check(mode, lambda t: apply("conv", [t, weight, b], {**attrs, "activation": activation}), x, expected, loop)


@pytest.mark.parametrize("k, stride, m", [(3, 1, 6), (5, 2, 24), (3, 2, 32)])
def test_small_conv_over_many_row_blocks(mode, stem, k, stride, m):
    """Planes of several accumulator blocks (SMALL_CONV_BLOCK), output channels four at a
    time and the rest one at a time (the loop), or rows of several tiles (the compiled
    kernel): a stem at a real image size, against onnxruntime."""
    rng = np.random.default_rng(k * m)
    x = rng.standard_normal((1, 3, 97, 131)).astype(np.float32)
    weight = rng.standard_normal((m, 3, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"strides": (stride, stride), "pads": (k // 2,) * 4}
    out_rows = (97 + 2 * (k // 2) - k) // stride + 1
    assert out_rows * (131 // stride) > 2 * jit.SMALL_CONV_BLOCK
    expected = np.clip(onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x,
                                {"w": weight, "b": b}), 0, 6)
    check(mode, lambda t: apply("conv", [t, weight, b], {**attrs, "activation": "relu6"}), x, expected,
          _stem_path(stem, 3, k, stride, 1, attrs["pads"], (out_rows, 131 // stride), "relu6"))


def _grouped_path(c, m, k, stride, dilation, pads, out, activation):
    """The path a grouped conv (c, m: a group's channels) takes under the JIT."""
    if native_gemm.available() and native_small_conv.suits(c, (k, k), (stride, stride), (dilation, dilation), pads[:2],
                                                           out, activation, native_small_conv.GROUP_CHANNELS):
        return "native_small_conv"
    return ("im2col_loop", "bias_activation_loop", "bias_activation_inplace_loop", "native_gemm")


@settings(max_examples=40)
@given(groups=st.integers(2, 5), c=st.sampled_from([2, 3, 5, 8, 13, 48]), m=st.integers(1, 9), n=st.integers(1, 3),
       h=st.integers(1, 13), w=st.integers(1, 13), k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
       dilation=st.integers(1, 2), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       activation=st.sampled_from(list(ACTIVATIONS)), seed=st.integers(0, 2 ** 16))
def test_grouped_conv(mode, groups, c, m, n, h, w, k, stride, dilation, pads, activation, seed):
    """A grouped conv (c input and m output channels a group, not depthwise): the compiled
    stems' kernel a group at a time (each group's panels of weights, x's and out's channels
    of the group), against onnxruntime and the numpy path."""
    reach = (k - 1) * dilation + 1
    assume(h + pads[0] + pads[2] >= reach and w + pads[1] + pads[3] >= reach)
    out = ((h + pads[0] + pads[2] - reach) // stride + 1, (w + pads[1] + pads[3] - reach) // stride + 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, groups * c, h, w)).astype(np.float32)
    weight = rng.standard_normal((groups * m, c, k, k)).astype(np.float32)
    b = rng.standard_normal(groups * m).astype(np.float32)
    attrs = {"strides": (stride, stride), "dilations": (dilation, dilation), "pads": tuple(pads), "group": groups}
    expected = ACTIVATIONS[activation](
        onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": weight, "b": b}))
    check(mode, lambda t: apply("conv", [t, weight, b], {**attrs, "activation": activation}), x, expected,
          _grouped_path(c, m, k, stride, dilation, pads, out, activation))


@pytest.mark.parametrize("n, groups, stride, num_threads", [(1, 13, 1, 2), (1, 6, 2, 2), (2, 13, 2, 2), (3, 4, 1, 2),
                                                            (2, 4, 1, 3)])
def test_grouped_conv_split_over_threads(jit_mode, n, groups, stride, num_threads):
    """RegNet's 8 channels a group on the workers: one image split by groups (each worker its
    own range of them), as many images as workers or more split by images, fewer images
    than workers (but more than one) whole; each piece binding the compiled kernel, against
    onnxruntime."""
    rng = np.random.default_rng(groups)
    x = rng.standard_normal((n, 8 * groups, 28, 28)).astype(np.float32)
    weight = rng.standard_normal((8 * groups, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8 * groups).astype(np.float32)
    attrs = {"strides": (stride, stride), "pads": (1, 1, 1, 1), "group": groups}
    expected = np.maximum(onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x,
                                   {"w": weight, "b": b}), 0)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, weight, b], {**attrs, "activation": "relu"})
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})),
                            num_threads=num_threads).get_signature_runner("infer")
    jit_mode[1].clear()
    close(runner(x=x)["y"], expected)
    assert jit_mode[1] == ["native_small_conv"] * (1 if 1 < n < num_threads else num_threads), jit_mode[1]


def test_grouped_conv_of_variable_weights(jit_mode):
    """A grouped conv whose weights and bias are variables (a model being trained): packed
    again at each run, so that new values set between runs are the ones multiplied."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 24, 9, 11)).astype(np.float32)
    values = [(rng.standard_normal((12, 8, 3, 3)).astype(np.float32), rng.standard_normal(12).astype(np.float32))
              for _ in range(2)]
    attrs = {"strides": (2, 2), "pads": (1, 0, 1, 2), "group": 3}
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        wv, bv = ef.Variable(values[0][0], name="w"), ef.Variable(values[0][1], name="b")
        y = apply("conv", [t, wv, bv], attrs)
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})))
    runner = interp.get_signature_runner("infer")
    for weight, b in values:
        interp.set_variables({"w": weight, "b": b})
        jit_mode[1].clear()
        got = runner(x=x)["y"]
        close(got, onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": weight, "b": b}))
    assert "native_small_conv" in jit_mode[1] or not jit_mode[1]  # bound at the first run only


def _batch_norm_operands(rng, channels, variables=False):
    scale, bias, mean = (rng.standard_normal(channels).astype(np.float32) for _ in range(3))
    return [scale, bias, mean, rng.uniform(0.1, 2.0, channels).astype(np.float32)]


def _batch_norm_then(t, params, after):
    """batch_norm of t, then `after` ("", "relu", "relu6" as a clip to [0, 6], "relu" as a
    clip to [0, inf): "clip"), the batch norm's output read by that op alone."""
    y = apply("batch_norm", [t, *params], {"epsilon": 1e-3})
    if after == "relu":
        return apply("relu", [y])
    if after in ("relu6", "clip"):
        return apply("clip", [y], {"min": 0.0, "max": 6.0 if after == "relu6" else float("inf")})
    return y


@FEW
@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=5), after=st.sampled_from(["", "relu", "relu6", "clip"]),
       seed=st.integers(0, 2 ** 16))
def test_batch_norm_and_its_rectifier_in_one_pass(mode, shape, after, seed):
    """An inference batch norm, and the relu (or clip) that alone reads it, as one pass
    (scale_shift_loop: the plan fuses them), against onnxruntime's BatchNormalization and
    Relu or Clip; under the JIT the same bits as the numpy path's passes."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    params = _batch_norm_operands(rng, shape[1])
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3)]
    if after == "relu":
        nodes.append(helper.make_node("Relu", ["n"], ["y"]))
    elif after:
        nodes += [helper.make_node("Clip", ["n", "lo", "hi"], ["y"])]
    else:
        nodes[0].output[0] = "y"
    inits = dict(zip("sbmv", params), lo=np.float32(0), hi=np.float32(6 if after == "relu6" else np.inf))
    expected = onnx_run(nodes, x, inits)
    build = lambda t: _batch_norm_then(t, params, after)  # noqa: E731
    check(mode, build, x, expected, "scale_shift_loop")
    if mode[0] == "jit":
        np.testing.assert_array_equal(run(build, x), run(build, x, jit_on=False))


def test_a_batch_norm_whose_output_another_op_reads_keeps_its_relu_apart(jit_mode):
    """The batch norm's output read by the relu and by an add: the batch norm's pass alone
    (no activation), the relu its own op; both results right."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
    params = _batch_norm_operands(rng, 5)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        n = apply("batch_norm", [t, *params], {"epsilon": 1e-3})
        r = apply("relu", [n])
        y = apply("add", [r, n])
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y, "r": r})})))
    got = interp.get_signature_runner("infer")(x=x)
    scale, bias, mean, var = params
    c = (1, -1, 1, 1)
    normed = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-3) * scale.reshape(c) + bias.reshape(c)
    close(got["r"], np.maximum(normed, 0))
    close(got["y"], np.maximum(normed, 0) + normed)
    assert jit_mode[1].count("scale_shift_loop") == 1


def test_batch_norm_of_variables_takes_their_values_at_each_run(jit_mode):
    """Statistics that are variables (a model being trained): a and b made again before each
    run, so that values set between runs are the ones applied."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    values = [_batch_norm_operands(rng, 4) for _ in range(2)]
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        params = [ef.Variable(v, name=name) for v, name in zip(values[0], "sbmv")]
        y = _batch_norm_then(t, params, "relu")
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})))
    runner = interp.get_signature_runner("infer")
    for params in values:
        interp.set_variables(dict(zip("sbmv", params)))
        expected = onnx_run([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
                             helper.make_node("Relu", ["n"], ["y"])], x, dict(zip("sbmv", params)))
        close(runner(x=x)["y"], expected)
    assert "scale_shift_loop" in jit_mode[1]


@pytest.mark.parametrize("shape", [(1, 37, 100, 100), (2, 16, 96, 96)])
def test_batch_norm_split_over_threads(jit_mode, shape):
    """Rows of whole channels apart over 2 workers where there are many elements: the second
    piece's first row is channel 18 of 37 (one image) or channel 0 of the second image."""
    rng = np.random.default_rng(shape[1])
    x = rng.standard_normal(shape).astype(np.float32)
    params = _batch_norm_operands(rng, shape[1])
    assert x.size >= threads.MIN_ELEMENTS
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = _batch_norm_then(t, params, "relu6")
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=2) \
        .get_signature_runner("infer")
    jit_mode[1].clear()
    got = runner(x=x)["y"]
    expected = onnx_run([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
                         helper.make_node("Clip", ["n", "lo", "hi"], ["y"])], x,
                        {**dict(zip("sbmv", params)), "lo": np.float32(0), "hi": np.float32(6)})
    close(got, expected)
    assert jit_mode[1] == ["scale_shift_loop"] * 2, jit_mode[1]


def test_small_conv_takes_rgb_stems_only(jit_mode):
    """Three input channels: a 3x3 or 5x5 kernel the compiled kernel where native_gemm runs,
    else the loop; a 7x7 kernel the compiled kernel (numba is loaded here), else im2col and
    BLAS; eight channels: im2col and BLAS."""
    x = np.ones((1, 3, 16, 16), np.float32)
    for k in (3, 5, 7):
        out = np.empty((1, 8, 16, 16), np.float32)
        jit_mode[1].clear()
        step = jit.bind_small_conv(x, np.ones((8, 3, k, k), np.float32), None, out, (1, 1), (1, 1), (1, 1), "")
        assert (step is not None) == (k < 7 or native_gemm.available()), k
        assert jit_mode[1] == ["native_small_conv" if native_gemm.available() else "small_conv_loop"][:k < 7 or None]
    assert jit.bind_small_conv(np.ones((1, 8, 16, 16), np.float32), np.ones((8, 8, 3, 3), np.float32), None,
                               np.empty((1, 8, 16, 16), np.float32), (1, 1), (1, 1), (1, 1), "") is None


@FEW
@given(c=st.integers(5, 9), m=st.integers(1, 20), n=st.integers(1, 3), h=st.integers(1, 13), w=st.integers(1, 13),
       kh=st.sampled_from([1, 2, 3, 7]), kw=st.sampled_from([1, 3, 5]), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), pads=st.lists(st.integers(0, 3), min_size=4, max_size=4),
       activation=st.sampled_from(["", "relu"]), seed=st.integers(0, 2 ** 16), block=st.integers(1, 3000))
def test_im2col_conv(mode, c, m, n, h, w, kh, kw, stride, dilation, pads, activation, seed, block):
    """A conv of one group that neither Winograd, a pointwise product nor the stem loop takes
    (a 7x7 stem, strided 3x3 and 1x1 convs): im2col_loop's columns, gathered from x in place
    with its pads as zeros, then one product (blocks of `block` floats of columns at a time:
    rows of an image, or whole images), against onnxruntime."""
    from edgeflow.interp.kernels import conv
    assume(h + pads[0] + pads[2] >= (kh - 1) * dilation + 1 and w + pads[1] + pads[3] >= (kw - 1) * dilation + 1)
    assume(kh * kw > 1 or stride > 1 or any(pads))
    with pytest.MonkeyPatch.context() as m_:
        m_.setattr(conv, "GATHER_BLOCK_FLOATS", block)
        m_.setenv("EDGEFLOW_CONV_ALGO", "direct")  # not Winograd's, for the 3x3 stride-1 cases
        _check_conv(mode, (n, c, h, w), (m, c, kh, kw), stride, dilation, pads, activation, seed, "im2col_loop")


@pytest.mark.parametrize("n,block,pairs", [(1, "rows", 8), (3, "rows", 21), (3, "images", 2), (1, "whole", 2)])
def test_im2col_conv_at_two_threads(jit_mode, n, block, pairs, monkeypatch):
    """ResNet's 7x7 stem (the compiled direct kernel, native_small_conv, left out) through
    im2col_loop and native_gemm's product on two workers, each gathering and multiplying its
    own images, or at batch 1 its own output rows, a block of columns at a time
    (conv.GATHER_BLOCK_FLOATS: 5 output rows of 32, two whole images, or one worker's share),
    against onnxruntime."""
    from edgeflow.interp.kernels import conv
    monkeypatch.setattr(native_small_conv, "suits", lambda *args: False)
    depth = 3 * 7 * 7
    monkeypatch.setattr(conv, "GATHER_BLOCK_FLOATS", {"rows": 5 * 32, "images": 2 * 32 * 32, "whole": 32 * 32}[block]
                        * depth)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3, 64, 64)).astype(np.float32)
    weight = rng.standard_normal((16, 3, 7, 7)).astype(np.float32)
    attrs = {"strides": (2, 2), "pads": (3, 3, 3, 3)}
    expected = onnx_run([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], x, {"w": weight})
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, weight], attrs)
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=2) \
        .get_signature_runner("infer")
    jit_mode[1].clear()
    close(runner(x=x)["y"], expected)
    assert jit_mode[1] == ["im2col_loop", "native_gemm"] * pairs, jit_mode[1]


@FEW
@given(n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(2, 13), w=st.integers(2, 13), ceil_mode=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_max_pool_tiles(mode, n, c, h, w, ceil_mode, seed):
    """2x2 stride-2 pools (a leftover row or column of an odd plane unread, or, with
    ceil_mode, a window past it: max_pool_rows_loop's), against onnxruntime, and with NaN and
    ties of -0.0 and 0.0 the numpy path (values: numpy's maximum takes the later of two
    equal zeros, the loops the earlier), and bit for bit max_pool_loop."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    attrs = {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": int(ceil_mode)}
    expected = onnx_run([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], x, {})
    build = lambda t: apply("max_pool", [t], attrs)  # noqa: E731
    past = ceil_mode and (h % 2 or w % 2)
    check(mode, build, x, expected, "max_pool_rows_loop" if past else "max_pool_tiles_loop")
    if mode[0] == "jit":
        x.reshape(-1)[rng.integers(0, x.size, 3)] = np.nan
        x.reshape(-1)[rng.integers(0, x.size, 4)] = -0.0
        x.reshape(-1)[rng.integers(0, x.size, 4)] = 0.0
        got, numpy_path = run(build, x), run(build, x, jit_on=False)
        np.testing.assert_array_equal(got, numpy_path)
        out = np.empty_like(got)
        layout, tap_off, acc, cols, qw = jit.depthwise_layout((h, w), (2, 2), (2, 2), (1, 1), (0, 0), got.shape[2:],
                                                              x.dtype)
        layout.fill(-np.inf)
        dims = np.array([n, c, h, w, *got.shape[2:], 2, 2, 0, 0, qw, layout.size // 4], np.uint64)
        args = (x.reshape(-1), out.reshape(-1), dims, cols, layout, tap_off, acc)
        jit.compiled(jit.max_pool_loop, *args)(*args)
        np.testing.assert_array_equal(got.view(np.int32), out.view(np.int32))


@pytest.mark.parametrize("kernel, stride, pads, n, c, split", [
    (3, 2, (1, 1, 1, 1), 1, 64, True),  # ResNet's pool at 112x112: max_pool_rows_loop
    (2, 2, (0, 0, 0, 0), 2, 33, True),  # 2x2 windows tiling x: max_pool_tiles_loop
    (3, 2, (1, 1, 1, 1), 1, 1, False),  # one plane: nothing to split
    (3, 2, (1, 1, 1, 1), 1, 5, False)])  # too little work to split
def test_max_pool_splits_its_planes_on_the_workers(jit_mode, kernel, stride, pads, n, c, split):
    """A max pool of enough work splits its (image, channel) planes over 2 workers, on the
    native workers where they run; the bits of one thread's run, and numpy's maximum over
    the windows."""
    from edgeflow.interp.kernels import pool
    rng = np.random.default_rng(c)
    size = 112 if c > 5 else 16
    x = rng.standard_normal((n, c, size, size)).astype(np.float32)
    attrs = {"kernel_shape": (kernel, kernel), "strides": (stride, stride), "pads": pads, "dilations": (1, 1),
             "ceil_mode": 0, "auto_pad": "NOTSET"}
    o = (size + pads[0] + pads[2] - kernel) // stride + 1
    like = np.empty((n, c, o, o), np.float32)
    whole, pieces = _whole_and_split(lambda out: pool._max_pool([x], [out], attrs), like, split)
    np.testing.assert_array_equal(pieces, whole)
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    np.testing.assert_array_equal(whole, windows[:, :, ::stride, ::stride].max(axis=(-2, -1))[:, :, :o, :o])


@FEW
@given(n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(1, 12), w=st.integers(1, 12), k=st.integers(1, 3),
       stride=st.integers(1, 3), dilation=st.integers(1, 2), pads=st.lists(st.integers(0, 1), min_size=4, max_size=4),
       ceil_mode=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_max_pool(mode, n, c, h, w, k, stride, dilation, pads, ceil_mode, seed):
    """2-D max pools of any window against onnxruntime; with NaN (which onnxruntime's max
    drops) and ties of -0.0 and 0.0, the loop equals numpy's maximum over the taps (the numpy
    path), NaN carried."""
    reach = (k - 1) * dilation + 1
    assume(h + pads[0] + pads[2] >= reach and w + pads[1] + pads[3] >= reach and max(pads) < reach)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    attrs = {"kernel_shape": (k, k), "strides": (stride, stride), "dilations": (dilation, dilation),
             "pads": tuple(pads), "ceil_mode": int(ceil_mode)}
    expected = onnx_run([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], x, {})
    assume(not (expected < -1e38).any())  # a window all padding: onnxruntime's -FLT_MAX, edgeflow's -inf
    build = lambda t: apply("max_pool", [t], {**attrs, "ceil_mode": ceil_mode})  # noqa: E731
    tiles = (k, stride, dilation, pads[0], pads[1]) == (2, 2, 1, 0, 0) and 2 * expected.shape[2] <= h \
        and 2 * expected.shape[3] <= w  # 2x2 windows that tile x (end pads unread): read in place
    check(mode, build, x, expected,
          "max_pool_tiles_loop" if tiles else "max_pool_rows_loop" if dilation == 1 else "max_pool_loop")
    if mode[0] == "jit":
        x.reshape(-1)[rng.integers(0, x.size, 2)] = np.nan
        x.reshape(-1)[rng.integers(0, x.size, 3)] = -0.0
        got, numpy_path = run(build, x), run(build, x, jit_on=False)
        np.testing.assert_array_equal(got, numpy_path)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(numpy_path))
        if not tiles and dilation == 1:  # max_pool_rows_loop's bits are max_pool_loop's
            begin = (pads[0], pads[1])
            out = np.empty_like(got)
            layout, tap_off, acc, cols, qw = jit.depthwise_layout((h, w), (k, k), (stride, stride), (1, 1), begin,
                                                                  got.shape[2:], x.dtype)
            layout.fill(-np.inf)
            dims = np.array([n, c, h, w, *got.shape[2:], stride, stride, *begin, qw, layout.size // stride ** 2],
                            np.uint64)
            args = (x.reshape(-1), out.reshape(-1), dims, cols, layout, tap_off, acc)
            jit.compiled(jit.max_pool_loop, *args)(*args)
            np.testing.assert_array_equal(got.view(np.int32), out.view(np.int32))


@FEW
@given(shape=st.lists(st.integers(1, 9), min_size=4, max_size=4), data=st.data(),
       mode_=st.sampled_from(["linear", "cubic"]), coordinates=st.sampled_from(["half_pixel", "align_corners",
                                                                               "asymmetric", "pytorch_half_pixel"]),
       seed=st.integers(0, 2 ** 16))
def test_resize(mode, shape, data, mode_, coordinates, seed):
    """Linear and cubic resizes of the last two axes (and of the last alone) against
    onnxruntime; under the JIT, bit for bit the numpy path's sums, and a NaN reaches only the
    outputs whose taps read it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    axes = data.draw(st.sampled_from([1, 2]))
    sizes = list(shape[:-axes]) + [data.draw(st.integers(1, 17)) for _ in range(axes)]
    assume(sizes != shape)  # an axis kept is no step
    attrs = {"mode": mode_, "coordinate_transformation_mode": coordinates}
    expected = onnx_run([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)], x,
                        {"sizes": np.array(sizes, np.int64)})
    build = lambda t: apply("resize", [t], {**attrs, "sizes": tuple(sizes)})  # noqa: E731
    check(mode, build, x, expected, "interpolate_loop")
    if mode[0] == "jit":
        x.reshape(-1)[rng.integers(0, x.size)] = np.nan
        got, numpy_path = run(build, x), run(build, x, jit_on=False)
        np.testing.assert_array_equal(got, numpy_path)


# -- a conv's bias and activation, a residual add's activation -------------------------------

@FEW
@given(k=st.sampled_from([1, 3]), c=st.integers(5, 7), m=st.integers(1, 5), h=st.integers(3, 11),
       w=st.integers(3, 11), rank=st.sampled_from([1, 2]), activation=st.sampled_from(FUSED),
       seed=st.integers(0, 2 ** 16))
def test_conv_bias_activation(mode, k, c, m, h, w, rank, activation, seed):
    """1x1, 1-D and 2-D 3x3 padded (im2col's product writes out: bias and activation in
    place, or native_gemm's product applies them as it stores: relu and relu6 on x86-64
    with AVX2); 5 input channels or more (fewer take small_conv_loop)."""
    rng = np.random.default_rng(seed)
    spatial = (h, w)[:rank]
    x = rng.standard_normal((2, c) + spatial).astype(np.float32)
    weight = rng.standard_normal((m, c) + (k,) * rank).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"pads": (k // 2,) * (2 * rank)}
    expected = ACTIVATIONS[activation](
        onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": weight, "b": b}))
    check(mode, lambda t: apply("conv", [t, weight, b], {**attrs, "activation": activation}), x, expected,
          ("bias_activation_inplace_loop", "native_gemm"))


@FEW
@given(h=st.integers(3, 11), w=st.integers(3, 11), activation=st.sampled_from(FUSED), seed=st.integers(0, 2 ** 16))
def test_grouped_conv_bias_activation(mode, h, w, activation, seed, monkeypatch):
    """A grouped 3x3 padded conv (not depthwise) of more channels a group than the compiled
    kernel takes: the tap runs' wide result, cropped into out with the bias and activation
    in one pass."""
    monkeypatch.setattr(native_small_conv, "GROUP_CHANNELS", 2)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, h, w)).astype(np.float32)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    attrs = {"pads": (1, 1, 1, 1), "group": 2}
    expected = ACTIVATIONS[activation](
        onnx_run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], x, {"w": weight, "b": b}))
    check(mode, lambda t: apply("conv", [t, weight, b], {**attrs, "activation": activation}), x, expected,
          "bias_activation_loop")


@FEW
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), row=st.booleans(),
       activation=st.sampled_from(FUSED), seed=st.integers(0, 2 ** 16))
def test_add_activation(mode, shape, row, activation, seed):
    """A residual add (same shapes) or a bias add (a vector along the last axis), then the
    activation the optimizer fused into it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 4
    other = rng.standard_normal(shape[-1:] if row else shape).astype(np.float32) * 4
    expected = ACTIVATIONS[activation](onnx_run([helper.make_node("Add", ["x", "o"], ["y"])], x, {"o": other}))
    check(mode, lambda t: apply("add", [t, other], {"activation": activation}), x, expected, "add_activation_loop")


@pytest.mark.parametrize("shape, split", [((1, 24, 28, 28), False), ((1, 64, 64, 65), True)])
def test_add_activation_at_two_threads(jit_mode, shape, split):
    """On two threads an add too small to split (under threads.MIN_ELEMENTS) still takes the
    one-pass loop with its relu; one large enough runs numpy's add in pieces, then the relu."""
    rng = np.random.default_rng(6)
    x, other = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    assert (x.size >= threads.MIN_ELEMENTS) == split
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("add", [t, other], {"activation": "relu"})
    jit_mode[1].clear()
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=2) \
        .get_signature_runner("infer")
    np.testing.assert_array_equal(runner(x=x)["y"], np.maximum(x + other, 0))
    assert ("add_activation_loop" in jit_mode[1]) != split, jit_mode[1]


@FEW
@given(channels=st.integers(8, 12), size=st.integers(24, 40), seed=st.integers(0, 2 ** 16))
def test_where_as_a_prelu(mode, channels, size, seed):
    """where(x < 0, alpha * x, x), the PReLU the TFLite converter builds, against
    onnxruntime's PRelu; NaN, inf and -0.0 keep their way through the select, exactly."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32) * 3
    alpha = rng.uniform(0, 0.5, (channels, 1, 1)).astype(np.float32)

    def build(t):
        negative = apply("less", [t, np.zeros((), np.float32)])
        return apply("where", [negative, apply("mul", [t, alpha]), t])
    assert x.size >= jit.WHERE_MIN_ELEMENTS
    check(mode, build, x, onnx_run([helper.make_node("PRelu", ["x", "a"], ["y"])], x, {"a": alpha}), "where_loop")
    x.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    got = run(build, x)
    expected = onnx_run([helper.make_node("PRelu", ["x", "a"], ["y"])], x, {"a": alpha})
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got.flat[:4]), np.signbit(expected.flat[:4]))


# -- affine quantization -----------------------------------------------------------------------

GRID_TYPES = {"int8": (np.int8, TensorProto.INT8), "uint8": (np.uint8, TensorProto.UINT8),
              "int16": (np.int16, TensorProto.INT16)}


def _onnx_round_trip(x, scale, zero, axis):
    """onnxruntime's QuantizeLinear then DequantizeLinear of x: (q, real)."""
    kind = GRID_TYPES[zero.dtype.name][1]
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("q", kind, x.shape),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})


@FEW
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), grid=st.sampled_from(sorted(GRID_TYPES)),
       per_axis=st.booleans(), exact_scale=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_quantize_and_dequantize(mode, shape, grid, per_axis, exact_scale, threads, seed):
    """quantize_linear then dequantize_linear against onnxruntime's, bit for bit (the
    integers and the reals): half-way values (a power-of-two scale makes x / scale land on
    them) round to even, values past the grid saturate; per tensor and per axis."""
    path, bound = mode
    rng = np.random.default_rng(seed)
    dtype = GRID_TYPES[grid][0]
    axis = int(rng.integers(0, len(shape)))
    n = shape[axis] if per_axis else 1
    scale = (2.0 ** rng.integers(-4, 0, n) if exact_scale else rng.uniform(0.01, 0.2, n)).astype(np.float32)
    info = np.iinfo(dtype)
    zero = rng.integers(max(info.min, -20), min(info.max, 20) + 1, n).astype(dtype)
    if not per_axis:
        scale, zero = scale.reshape(()), zero.reshape(())
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x.flat[::3] = np.round(x.flat[::3] * 2) / 2 * float(scale.flat[0])  # ties at the first scale
    x.flat[1::7] *= 1e4 if grid == "int16" else 100  # past the grid's ends
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        q = apply("quantize_linear", [t, scale, zero], {"axis": axis, "dtype": np.dtype(dtype)})
        y = apply("dequantize_linear", [q, scale, zero], {"axis": axis})
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"q": q, "y": y})})),
                            num_threads=threads).get_signature_runner("infer")
    got = runner(x=x)
    want_q, want_y = _onnx_round_trip(x, scale, zero, axis)
    np.testing.assert_array_equal(got["q"], want_q)
    np.testing.assert_array_equal(got["y"], want_y)
    assert got["y"].dtype == np.float32
    assert sorted(set(bound)) == (["dequantize_loop", "quantize_loop"] if path == "jit" else [])


# -- layer norm and GELU -----------------------------------------------------------------------

@FEW
@given(shape=st.lists(st.integers(1, 11), min_size=1, max_size=4), last=st.integers(1, 2),
       with_bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_layer_norm(mode, shape, last, with_bias, seed):
    """Statistics over the last one or two axes; scale and bias of the normalized shape."""
    assume(last <= len(shape))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    normalized = tuple(shape[-last:])
    scale = rng.standard_normal(normalized).astype(np.float32)
    bias = rng.standard_normal(normalized).astype(np.float32) if with_bias else None
    inits = {"s": scale, **({"b": bias} if with_bias else {})}
    expected = onnx_run([helper.make_node("LayerNormalization", ["x", *inits], ["y"], axis=-last, epsilon=1e-5)],
                        x, inits)
    operands = [scale] + ([bias] if with_bias else [])
    check(mode, lambda t: apply("layer_norm", [t] + operands, {"axis": -last, "epsilon": 1e-5}), x, expected,
          "layer_norm_loop")


def _softmax64(x, axis=-1):
    """float64 softmax, numpy's formula (NaN where a row holds NaN or +inf)."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


@FEW
@given(shape=st.lists(st.integers(1, 37), min_size=1, max_size=3), seed=st.integers(0, 2 ** 16))
def test_softmax(mode, shape, seed):
    """Over the last axis, rows of 1-37 (a remainder past the eight running maxima), against
    onnxruntime's Softmax."""
    x = (np.random.default_rng(seed).standard_normal(shape) * 5).astype(np.float32)
    expected = onnx_run([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], x, {}, opset=13)
    check(mode, lambda t: apply("softmax", [t], {"axis": -1}), x, expected, "softmax_loop")
    close(run(lambda t: apply("softmax", [t], {"axis": -1}), x), _softmax64(x))


def test_softmax_special_rows(mode):
    """Rows holding NaN, +inf, -inf, only -inf, and a far larger last element (past the eight
    maxima's stride): NaN where numpy's formula gives NaN, its values elsewhere."""
    x = np.array([[1, np.nan, 3, 0, 0, 0, 0, 0, 0], [1, np.inf, 3, 0, 0, 0, 0, 0, 0],
                  [-np.inf, 0, 1, 2, 3, 4, 5, 6, 7], [-np.inf] * 9, [np.nan] + [1] * 8,
                  [0, 0, 0, 0, 0, 0, 0, 0, 100]], np.float32)
    got = run(lambda t: apply("softmax", [t], {"axis": -1}), x)
    want = _softmax64(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6, atol=1e-30)


def test_softmax_split_over_threads(jit_mode):
    """An attention's softmax past threads.MIN_ELEMENTS, its rows split over two workers."""
    x = (np.random.default_rng(4).standard_normal((4, 130, 513)) * 3).astype(np.float32)
    assert x.size >= threads.MIN_ELEMENTS
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("softmax", [t], {"axis": -1})
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=2) \
        .get_signature_runner("infer")
    close(runner(x=x)["y"], _softmax64(x))
    assert "softmax_loop" in jit_mode[1]


@pytest.mark.parametrize("columns, split", [(128, True), (127, False)])
def test_softmax_splits_from_its_cost(jit_mode, columns, split):
    """A softmax splits its rows over 2 workers from threads.MIN_ELEMENTS / 4 elements (its
    loop's weight in `_COSTS`: BERT's attention at batch 1, 4 x 128 x 128, splits; 127
    columns do not), on the native workers where they run; the bits of one thread's run."""
    x = (np.random.default_rng(5).standard_normal((1, 4, 128, columns)) * 3).astype(np.float32)
    whole, pieces = _whole_and_split(lambda out: jit.bind_softmax(x, out, -1), x, split)
    np.testing.assert_array_equal(pieces, whole)


def _whole_and_split(bind, like, split, native=True):
    """(whole, pieces): bind(out)'s step run on one thread, and bound and run under 2
    workers, where it splits in two pieces or not as `split` says (on the native workers
    where they run and `native`)."""
    whole, pieces = np.empty_like(like), np.empty_like(like)
    bind(whole)()
    workers = threads.Workers(2)
    try:
        with threads.using(workers):
            step = bind(pieces)
        tasks = step.args[-1] if getattr(step, "func", None) in (workers._run_native, workers.run) else None
        assert (tasks is not None and len(tasks) == 2) == split
        if split and native and workers.native is not None:
            assert step.func == workers._run_native
        step()
    finally:
        workers.close()
    return whole, pieces


@pytest.mark.parametrize("rows, split", [(512, True), (511, False)])
def test_layer_norm_splits_its_rows_from_its_cost(jit_mode, rows, split):
    """A layer norm splits its rows over 2 workers from threads.MIN_ELEMENTS / 2 elements
    (its loop's weight in `_COSTS`: a BERT-like encoder's (8, 128, 256) at batch 8 splits,
    batch 1's does not), on the native workers where they run; the bits of one thread's run."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((rows, 256)) * 3 + 1).astype(np.float32)
    scale, bias = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    whole, pieces = _whole_and_split(lambda out: jit.bind_layer_norm(x, scale, bias, out, -1, 1e-5), x, split)
    np.testing.assert_array_equal(pieces, whole)
    mean, var = x.astype(np.float64).mean(-1, keepdims=True), x.astype(np.float64).var(-1, keepdims=True)
    np.testing.assert_allclose(whole, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [np.add, np.subtract, np.multiply])
@pytest.mark.parametrize("operands", ["same", "scalar_second", "scalar_first", "broadcast", "small"])
def test_binary_arithmetic_splits_on_the_native_workers(jit_mode, fn, operands):
    """A float32 add, subtract or multiply of operands of out's shape, or of one and a single
    float (either side), of threads.MIN_ELEMENTS elements or more, splits over the native
    workers (binary_loop, scalar_loop: native entries) with numpy's bits; other broadcasts,
    fewer elements, or no workers: None (numpy's ufunc, whole or on the lock workers)."""
    rng = np.random.default_rng(8)
    rows = 1024 if operands != "small" else 1023
    a = rng.standard_normal((rows, 256)).astype(np.float32)
    other = {"same": rng.standard_normal((rows, 256)), "scalar_second": np.array([0.37]), "scalar_first": np.array(2.5),
             "broadcast": rng.standard_normal(256), "small": rng.standard_normal((rows, 256))}[operands].astype(np.float32)
    ins = (other, a) if operands == "scalar_first" else (a, other)
    out = np.full(a.shape, np.nan, np.float32)
    assert jit.bind_binary(fn, ins, out) is None  # no workers
    workers = threads.Workers(2)
    try:
        with threads.using(workers):
            step = jit.bind_binary(fn, ins, out)
        if operands in ("broadcast", "small") or workers.native is None:
            assert step is None
            return
        assert step.func == workers._run_native and len(step.args[-1]) == 2
        step()
    finally:
        workers.close()
    np.testing.assert_array_equal(out, fn(*ins))


@pytest.mark.parametrize("shape, perm", [
    ((8, 128, 256), (1, 0, 2)),  # a BERT-like encoder's at batch 8 (torch's MultiheadAttention)
    ((1, 128, 8, 3, 256), (3, 1, 2, 0, 4)),
    ((8, 4, 128, 64), (0, 1, 3, 2)),  # K transposed: strided inner runs
    ((8, 4, 128, 64), (2, 0, 1, 3)),
    ((2, 3, 4, 5, 6, 7, 8, 9), (1, 0, 2, 3, 4, 5, 6, 7)),  # 3 axes once collapsed
    ((11, 12, 13, 14, 15), (4, 3, 2, 1, 0)),  # 5 axes: numpy's copy
    ((4, 3, 150, 173), (0, 3, 1, 2))])
def test_transposes_split_over_workers(jit_mode, shape, perm):
    """A float32 transpose of threads.MIN_ELEMENTS elements or more copies in strided_copy_loop
    pieces, split over 2 workers by its outermost axis (the native ones where they run), its
    view's axes collapsed to at most 4; x.transpose(perm)'s values exactly. Without workers,
    or with more than 4 axes left, numpy's copy (None here)."""
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    out = np.full(x.transpose(perm).shape, np.nan, np.float32)
    assert jit.bind_copy(x.transpose(perm), out) is None  # no workers
    workers = threads.Workers(2)
    try:
        with threads.using(workers):
            step = jit.bind_copy(x.transpose(perm), out)
        if perm == (4, 3, 2, 1, 0):
            assert step is None
            return
        assert getattr(step, "func", None) in (workers._run_native, workers.run)
        if workers.native is not None:
            assert step.func == workers._run_native
        step()
    finally:
        workers.close()
    np.testing.assert_array_equal(out, x.transpose(perm))


def test_softmax_loads_numba_when_large(monkeypatch):
    """A softmax of SOFTMAX_LOADS elements or more binds the loop where numba is not loaded
    yet (and loads it); a smaller one only where it is; another axis, or float64, never."""
    assert jit.available(), "numba does not import"
    monkeypatch.setattr(jit, "loaded", lambda: False)
    small = np.zeros((2, 8), np.float32)
    large = np.zeros((jit.SOFTMAX_LOADS // 64, 64), np.float32)
    assert jit.bind_softmax(small, np.empty_like(small), -1) is None
    assert jit.bind_softmax(large, np.empty_like(large), 1) is not None
    assert jit.bind_softmax(large, np.empty_like(large), 0) is None
    assert jit.bind_softmax(large.astype(np.float64), np.empty(large.shape), -1) is None


@FEW
@given(shape=st.lists(st.integers(1, 17), min_size=0, max_size=3), approximate=st.sampled_from(["none", "tanh"]),
       seed=st.integers(0, 2 ** 16))
def test_gelu(mode, shape, approximate, seed):
    x = np.asarray(np.random.default_rng(seed).standard_normal(shape) * 4, np.float32)
    expected = onnx_run([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], x, {}, opset=20)
    check(mode, lambda t: apply("gelu", [t], {"approximate": approximate}), x, expected, "gelu_float32_loop")


@pytest.mark.parametrize("name, elements, split", [("gelu", 1 << 16, True), ("gelu", (1 << 16) - 16, False),
                                                    ("swish", 1 << 17, True), ("sigmoid", 1 << 17, True),
                                                    ("hard_swish", 1 << 17, False), ("hard_swish", 1 << 18, True)])
def test_costly_activations_split_from_fewer_elements(jit_mode, name, elements, split):
    """At 2 threads an activation splits from threads.MIN_ELEMENTS weighted by its loop's
    cost an element (gelu 4, swish and sigmoid 2, hard_swish 1: `_COSTS`), on the native
    workers where its loop has a native entry (gelu, sigmoid, hard_swish); split or not, the
    bits of one thread's run."""
    x = np.asarray(np.random.default_rng(4).standard_normal(elements) * 4, np.float32)
    bind = (lambda out: jit.bind_gelu(x, out, "none")) if name == "gelu" \
        else (lambda out: jit.bind_activation(name, x, out, {}))
    whole, pieces = _whole_and_split(bind, x, split, native=name != "swish")  # their pieces' native entries
    np.testing.assert_array_equal(pieces, whole)


def test_gelu_float64(mode):
    """float64 gelu runs gelu_loop (math.erfc in float64), against scipy."""
    from scipy import special
    path, bound = mode
    x = np.random.default_rng(3).standard_normal((5, 7)) * 6
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float64, x.shape, name="x")
        y = apply("gelu", [t], {"approximate": "none"})
    got = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))) \
        .get_signature_runner("infer")(x=x)["y"]
    np.testing.assert_allclose(got, x / 2 * special.erfc(-x / np.sqrt(2)), rtol=1e-12, atol=1e-300)
    assert ("gelu_loop" in bound) == (path == "jit")


# -- float32 activations on jit's vectorized exp ----------------------------------------------

def _sigmoid64(x):
    from scipy import special
    return special.expit(x)


def _erfc64(x):
    from scipy import special
    return special.erfc(x)


ALPHA, BETA = float(np.float32(0.2)), float(np.float32(0.5))
# name, attrs, float64 reference (of float64 x), the loop, an onnxruntime graph of it
ACTIVATION_CASES = {
    "sigmoid": ({}, _sigmoid64, "sigmoid_loop", [helper.make_node("Sigmoid", ["x"], ["y"])]),
    "swish": ({"alpha": 1.0}, lambda x: x * _sigmoid64(x), "swish_loop",
              [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]),
    "swish_alpha": ({"alpha": 1.7}, lambda x: x * _sigmoid64(float(np.float32(1.7)) * x), "swish_loop", None),
    "hard_sigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda x: np.clip(ALPHA * x + BETA, 0, 1), "hard_sigmoid_loop",
                     [helper.make_node("HardSigmoid", ["x"], ["y"], alpha=0.2, beta=0.5)]),
    "hard_swish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1), "hard_swish_loop",
                   [helper.make_node("HardSwish", ["x"], ["y"])]),
    "gelu": ({"approximate": "none"}, lambda x: x / 2 * _erfc64(-x / np.sqrt(2)), "gelu_float32_loop",
             [helper.make_node("Gelu", ["x"], ["y"])]),
    "gelu_tanh": ({"approximate": "tanh"},
                  lambda x: x * _sigmoid64(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)), "gelu_float32_loop",
                  [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")]),
}
SPECIAL = np.float32([-np.inf, -1e30, -110, -104, -100, -88.8, -88, -87, -20, -14, -13, -10, -3, -2.5, -1e-30, -0.0,
                      0, 1e-30, 2.5, 3, 10, 20, 87, 88, 88.8, 100, 104, 110, 1e30, np.inf, np.nan])
TINY = float(np.finfo(np.float32).tiny)


def _op(name):
    return {"swish_alpha": "swish", "gelu_tanh": "gelu"}.get(name, name)


def _accurate(got, expected, rtol):
    """got (float32) is expected (float64) within rtol of each element, where expected is a
    normal float32 number; within 1e-42 where it is smaller (subnormals: x sigmoid(x) of
    x < -104 is 104 times a sigmoid that rounded to 0); inf and NaN where it is."""
    assert got.dtype == np.float32 and got.shape == expected.shape
    g = got.astype(np.float64)
    normal = np.isfinite(expected) & (np.abs(expected) >= TINY)
    np.testing.assert_allclose(g[normal], expected[normal], rtol=rtol, atol=0)
    tiny = np.isfinite(expected) & ~normal
    np.testing.assert_allclose(g[tiny], expected[tiny], rtol=0, atol=1e-42)
    rest = ~np.isfinite(expected)
    np.testing.assert_array_equal(g[rest], expected[rest])


def _each_element(name):
    """jit.py's scalar function `name` (compiled) applied to each element of a 1-D array."""
    import numba
    jit._compile_scalars(numba)
    scalar = getattr(jit, name)

    @numba.njit
    def each(x, out):
        for i in range(x.shape[0]):
            out[i] = scalar(x[i])

    def run(x):
        out = np.empty_like(x)
        each(x, out)
        return out
    return run


def test_the_gates_tanh_over_float32_range(jit_mode):
    """_tanh_gate, the recurrent loops' tanh: within 3.5e-7 absolute and relative of float64
    tanh (a dense sweep of -12..12, where it bends and reaches its clamp at 9, tiny magnitudes
    and SPECIAL), never past +-1; signs of zero, infinities and NaN kept."""
    x = np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32), SPECIAL,
                        np.geomspace(1e-30, 1, 2001, dtype=np.float32), np.float32([8.999999, 9, 9.000001])])
    x = np.concatenate([x, -x])
    got = _each_element("_tanh_gate")(x)
    exact = np.tanh(x.astype(np.float64))
    finite = ~np.isnan(x)
    assert np.abs(got[finite] - exact[finite]).max() <= 3.5e-7
    _accurate(got, exact, 3.5e-7)
    assert np.abs(got[finite]).max() <= 1
    assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))
    assert np.isnan(got[~finite]).all()


def test_exp_nonpositive_over_float32_range(jit_mode):
    """_exp_nonpositive, sigmoid's and softmax's exp: within 2e-7 relative (1.5 ulp) of float64
    exp over every float32 x <= 0 (a dense sweep of -110..0, where its results turn
    subnormal below -87.3 and 0 below -104, and SPECIAL's), NaN kept."""
    x = np.concatenate([np.linspace(-110, 0, 400_001, dtype=np.float32), SPECIAL[~(SPECIAL > 0)],
                        -np.float32([1e-8, 1e-38, 1e-45, 87.33654, 87.33655, 103.97208, 103.97209])])
    got = _each_element("_exp_nonpositive")(x)
    with np.errstate(under="ignore"):
        _accurate(got, np.exp(x.astype(np.float64)), 2e-7)


@pytest.mark.parametrize("name", list(ACTIVATION_CASES))
def test_activation_over_float32_range(jit_mode, name):
    """Every float32 magnitude (0 to 1e30, both signs, inf, NaN; a dense sweep of -110..110
    on an odd shape) against float64 scipy: sigmoid, hard_*, gelu within 1e-6 relative of
    each element; swish within 2e-5 (x sigmoid(x) of x < -87, where sigmoid is subnormal,
    keeps fewer bits; measured 5.5e-6). The JIT's loops only: the numpy formulas round in
    float32 (x / 6 + 1 / 2 cancels near -3, exp overflows below -88), and
    test_activation_against_onnxruntime checks them."""
    _, bound = jit_mode
    attrs, reference, loop, _ = ACTIVATION_CASES[name]
    sweep = np.linspace(-110, 110, 3003 * 7 - SPECIAL.size, dtype=np.float32)
    x = np.concatenate([SPECIAL, sweep]).reshape(-1, 7)
    with np.errstate(all="ignore"):
        expected = reference(x.astype(np.float64))
    bound.clear()
    got = run(lambda t: apply(_op(name), [t], attrs), x)
    _accurate(got, expected, 2e-5 if name.startswith("swish") else 1e-6)
    assert loop in bound, bound


@FEW
@given(name=st.sampled_from([k for k, v in ACTIVATION_CASES.items() if v[3]]),
       shape=st.lists(st.integers(1, 19), min_size=0, max_size=4), scale=st.sampled_from([1.0, 8.0, 60.0]),
       seed=st.integers(0, 2 ** 16))
def test_activation_against_onnxruntime(mode, name, shape, scale, seed):
    """Odd shapes, values up to the overflow range of exp, against onnxruntime (swish: its
    Sigmoid then Mul, as ONNX exports SiLU), and the JIT against the numpy path."""
    attrs, _, loop, nodes = ACTIVATION_CASES[name]
    x = np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, np.float32)
    expected = onnx_run(nodes, x, {}, opset=20)
    check(mode, lambda t: apply(_op(name), [t], attrs), x, expected, loop)


def test_activations_split_across_workers(mode):
    """2 workers and an activation of 2^18 elements and more: the loop binds once a piece,
    and the pieces cover the whole array."""
    path, bound = mode
    x = np.random.default_rng(5).standard_normal((3, 131072 + 5)).astype(np.float32) * 10
    for name in ("swish", "gelu", "hard_swish"):
        bound.clear()
        attrs, reference, loop, _ = ACTIVATION_CASES[name]
        g = ef.Graph()
        with g.as_default():
            t = ef.placeholder(ef.float32, x.shape, name="x")
            y = apply(name, [t], attrs)
        runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=2) \
            .get_signature_runner("infer")
        got, expected = runner(x=x)["y"], reference(x.astype(np.float64))
        _accurate(got, expected, 2e-5) if path == "jit" else close(got, expected.astype(np.float32))
        assert bound.count(loop) == (2 if path == "jit" else 0), bound


# -- recurrences -------------------------------------------------------------------------------

RECURRENCE_OUTPUTS = {"lstm": ["Y", "Y_h", "Y_c"], "gru": ["Y", "Y_h"]}


@FEW
@given(op=st.sampled_from(["lstm", "gru"]), direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       linear_before_reset=st.booleans(), seq=st.integers(1, 7), batch=st.integers(1, 2),
       size=st.integers(1, 9), hidden=st.integers(1, 11), with_bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_recurrence(mode, op, direction, linear_before_reset, seq, batch, size, hidden, with_bias, seed):
    """A whole LSTM / GRU sequence (Y, then the final states) in one compiled loop."""
    rng = np.random.default_rng(seed)
    gates, dirs = {"lstm": 4, "gru": 3}[op], 2 if direction == "bidirectional" else 1
    x = rng.normal(0, 1, (seq, batch, size)).astype(np.float32)
    w = rng.normal(0, 0.8, (dirs, gates * hidden, size)).astype(np.float32)
    r = rng.normal(0, 0.8, (dirs, gates * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.8, (dirs, 2 * gates * hidden)).astype(np.float32)
    attrs = {"hidden_size": hidden, "direction": direction}
    if op == "gru":
        attrs["linear_before_reset"] = int(linear_before_reset)
    inits = {"w": w, "r": r, **({"b": b} if with_bias else {})}
    node = helper.make_node(op.upper(), ["x", *inits], RECURRENCE_OUTPUTS[op], **attrs)
    for k, name in enumerate(RECURRENCE_OUTPUTS[op]):
        expected = onnx_run([node, helper.make_node("Identity", [name], ["y"])], x, inits, opset=14)
        has = {"has_bias": with_bias}
        check(mode, lambda t: apply(op, [t, w, r] + ([b] if with_bias else []), {**attrs, **has})[k], x,
              expected, f"{op}_loop")


# -- the numpy-only install -------------------------------------------------------------------

def _in_fresh_interpreter(code, env=None):
    import os
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_interpreter_does_not_import_numba():
    assert _in_fresh_interpreter("import sys, json, edgeflow.interp\nprint(json.dumps('numba' in sys.modules))") \
        is False


@pytest.mark.parametrize("threads", [1, 2])
def test_a_resnet_does_not_import_numba(threads):
    """A 7x7 stem of 3 channels, a max pool and 3x3 convs (ResNet's ops) take numpy's
    kernels without importing numba: importing it would cost the first run a second. At 2
    threads neither do the native workers (llvmlite's), which the interpreter has."""
    code = """
import sys, json
import numpy as np
import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
x = np.ones((1, 3, 32, 32), np.float32)
g = ef.Graph()
with g.as_default():
    t = ef.placeholder(ef.float32, x.shape, name="x")
    y = apply("conv", [t, np.ones((8, 3, 7, 7), np.float32)], {"strides": (2, 2), "pads": (3, 3, 3, 3)})
    y = apply("max_pool", [y], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)})
    y = apply("conv", [y, np.ones((8, 8, 3, 3), np.float32)], {"pads": (1, 1, 1, 1), "activation": "relu"})
    y = apply("reduce_mean", [y], {"axes": (2, 3)})
it = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=THREADS)
it.get_signature_runner("infer")(x=x)
print(json.dumps(["numba" in sys.modules, it._workers is not None and it._workers.native is not None]))
""".replace("THREADS", str(threads))
    assert _in_fresh_interpreter(code, {"EDGEFLOW_JIT": "1", "EDGEFLOW_NATIVE_THREADS": "1"}) == [False, threads > 1]


RESNET_OPS = """
import sys, json
import numpy as np
import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp.kernels import jit, native_depthwise, native_gemm
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
g = ef.Graph()
with g.as_default():
    t = ef.placeholder(ef.float32, x.shape, name="x")
    y = apply("conv", [t, rng.standard_normal((8, 3, 7, 7)).astype(np.float32)], {"strides": (2, 2),
              "pads": (3, 3, 3, 3), "activation": "relu"})
    y = apply("max_pool", [y], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)})
    z = apply("conv", [y, rng.standard_normal((8, 8, 3, 3)).astype(np.float32)], {"pads": (1, 1, 1, 1)})
    y = apply("add", [z, y], {"activation": "relu"})
interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), jit=JIT)
imported = "numba" in sys.modules
runner = interp.get_signature_runner("infer")
out = runner(x=x)["y"]
provisional = runner.last_plan.provisional
bound = sorted(k for k in jit.BIND_SECONDS if k != "import numba")
jit.wait()  # numba's background load, where the first plan wanted it
later = runner(x=x)["y"]
native = bool(native_gemm._built) and native_gemm._built[0] is not None
print(json.dumps([imported, bound, out.ravel().tolist(), native, provisional,
                  sorted(k for k in jit.BIND_SECONDS if k != "import numba"), later.ravel().tolist(),
                  runner.last_plan.provisional]))
"""


def test_jit_on_imports_numba_up_front_and_binds_every_loop():
    """Interpreter(jit=True) imports numba when it is made, so that the kernels that would not
    import it themselves (ResNet's: a 7x7 stem, a max pool, 3x3 convs, add + relu) bind their
    loops; the result is the default's (numpy's kernels, numba never imported) within float32
    rounding, and a float64 numpy evaluation's. Where native_gemm's module runs, the stem is
    its direct conv (native_small_conv's, with the bias and relu), and the 3x3 conv's product
    (of im2col's columns) takes the add + relu after it into its own pass (no bias or add
    loop)."""
    on = _in_fresh_interpreter(RESNET_OPS.replace("JIT", "True"), {"EDGEFLOW_JIT": "1"})
    auto = _in_fresh_interpreter(RESNET_OPS.replace("JIT", "None"), {"EDGEFLOW_JIT": "1"})
    assert on[0] is True and auto[0] is False
    assert on[3] == native_gemm.available()
    loops = {"im2col_loop", "max_pool_rows_loop"} | (set() if on[3] else
                                                     {"add_activation_loop", "bias_activation_inplace_loop"})
    assert loops <= set(on[1]), on[1]
    assert auto[1] == [] and auto[3] is False, auto
    np.testing.assert_allclose(on[2], auto[2], rtol=1e-5, atol=1e-5 * max(np.abs(auto[2]).max(), 1.0))


def test_a_large_plan_binds_the_loops_once_numba_has_loaded():
    """In the default mode a plan of jit.PLAN_FLOPS or more arithmetic operations a run
    (here with the threshold lowered to the ResNet ops' count) wants numba: its first run
    does not wait for it (numba not imported before; numpy's kernels, jit=False's output bit
    for bit; the plan provisional), numba then loads in the background, and once it has,
    the next run's plan is made again with the loops jit=True's binds (jit=True's output
    bit for bit). Below the threshold, and under jit=False, numba stays out."""
    flops = 2 * 8 * 16 * 16 * 3 * 49 + 2 * 8 * 8 * 8 * 8 * 9  # the two convs' multiply-adds (a lower bound)
    def run(jit, threshold):
        code = RESNET_OPS.replace("interp = ef.Interpreter", f"jit.PLAN_FLOPS = {threshold}\ninterp = ef.Interpreter")
        return _in_fresh_interpreter(code.replace("JIT", jit), {"EDGEFLOW_JIT": "1"})
    big, small, off = run("None", flops), run("None", 100 * flops), run("False", flops)
    on = _in_fresh_interpreter(RESNET_OPS.replace("JIT", "True"), {"EDGEFLOW_JIT": "1"})
    assert big[0] is False and big[4] is True and big[7] is False
    np.testing.assert_array_equal(big[2], off[2])
    assert set(on[1]) <= set(big[5]) and {"im2col_loop", "max_pool_rows_loop"} <= set(big[5]), big[5]
    np.testing.assert_array_equal(big[6], on[2])
    assert small[4] is False and small[5] == [] and off[4] is False and off[5] == []


def test_the_tensor_api_keeps_its_inputs_when_the_plan_is_made_again():
    """set_tensor, invoke (a provisional plan), then numba's load ends: the next invoke makes
    the plan again with the inputs set before carried over (no set_tensor between), its
    output jit=True's bit for bit."""
    code = RESNET_OPS.replace("interp = ef.Interpreter", "jit.PLAN_FLOPS = 1\ninterp = ef.Interpreter").replace(
        "runner = interp.get_signature_runner(\"infer\")", "runner = None")
    code = code[:code.index("out = runner(x=x)")] + """
index = interp.get_input_details()[0]["index"]
interp.allocate_tensors()
interp.set_tensor(index, x)
interp.invoke()
first = interp._plan.provisional
jit.wait()
interp.invoke()
out = interp.get_tensor(interp.get_output_details()[0]["index"])
print(json.dumps([first, interp._plan.provisional, out.ravel().tolist()]))
"""
    first, later, out = _in_fresh_interpreter(code.replace("JIT", "None"), {"EDGEFLOW_JIT": "1"})
    on = _in_fresh_interpreter(RESNET_OPS.replace("JIT", "True"), {"EDGEFLOW_JIT": "1"})
    assert first is True and later is False
    np.testing.assert_array_equal(out, on[2])


def test_jit_off_keeps_numpy_kernels_where_numba_is_loaded(jit_mode):
    """Interpreter(jit=False): its plans bind no loop though numba is loaded (the result is
    EDGEFLOW_JIT=0's bit for bit), another interpreter's plans still do; a jit that is not
    None, True or False is refused."""
    _, bound = jit_mode
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 6, 12, 12)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, w], {"group": 6, "pads": (1, 1, 1, 1), "activation": "swish"})
    model = writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))
    off = ef.Interpreter(model, jit=False).get_signature_runner("infer")(x=x)["y"]
    assert bound == []
    with pytest.MonkeyPatch.context() as m:
        m.setenv("EDGEFLOW_JIT", "0")
        numpy_only = ef.Interpreter(model).get_signature_runner("infer")(x=x)["y"]
    np.testing.assert_array_equal(off, numpy_only)
    ef.Interpreter(model).get_signature_runner("infer")(x=x)
    assert "native_depthwise" in bound, bound  # a 12x12 plane's 3x3: the compiled kernel
    with pytest.raises(ef.errors.InvalidInputError, match="jit"):
        ef.Interpreter(model, jit="on")


def test_a_train_step_loads_numba_before_its_forward_binds():
    """A train step's gradient kernels load numba; the plan loads it first, so the forward's
    max pool (bound before any gradient) takes its loop too, in a process where nothing
    loaded numba before (ResNet-18's pool at batch 8: 30 -> 7 ms a step)."""
    code = """
import sys, json
import numpy as np
import edgeflow as ef
from edgeflow.format import writer
from edgeflow.interp.kernels import jit, native_depthwise, native_gemm
g = ef.Graph()
with g.as_default():
    x = ef.placeholder(ef.float32, [2, 8, 8, 8], name="x")  # 8 channels: no stem loop (it loads numba)
    y = ef.layers.max_pool2d(ef.layers.conv2d(x, 4, 3, padding="same"), 2, 2)
    loss = ef.reduce_mean(y * y)
    step = ef.train.Adam(0.01).minimize(loss)
runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"train": ({"x": x}, {"loss": loss}, [step])}))) \\
    .get_signature_runner("train")
runner(x=np.ones((2, 8, 8, 8), np.float32))
print(json.dumps(sorted(jit.BIND_SECONDS)))
"""
    bound = _in_fresh_interpreter(code, {"EDGEFLOW_JIT": "1"})
    assert "max_pool_tiles_loop" in bound and "adam_loop" in bound, bound


DEPTHWISE_RUN = """
import sys, json
import numpy as np
import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
rng = np.random.default_rng(1)
x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
g = ef.Graph()
with g.as_default():
    t = ef.placeholder(ef.float32, x.shape, name="x")
    y = apply("conv", [t, w], {"group": 4, "pads": (1, 1, 1, 1), "activation": "relu"})
    z = apply("layer_norm", [y, np.ones(9, np.float32)], {"axis": -1, "epsilon": 1e-5})
runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"z": z})}))).get_signature_runner("infer")
first = runner(x=x)["z"]
from edgeflow.interp.kernels import jit
jit.wait()  # the depthwise conv wants numba: it loads after the first run
out = runner(x=x)["z"]
print(json.dumps([sys.modules.get("numba") is not None, out.ravel().tolist(), first.ravel().tolist()]))
"""


@pytest.mark.parametrize("how", ["disabled", "absent"])
def test_kernels_run_without_numba(how):
    """EDGEFLOW_JIT=0, or numba not installed (an import that fails): the numpy path runs,
    numba is never imported, and the result is the JIT's (where numba is installed)."""
    blocked = "import sys; sys.modules['numba'] = None\n" if how == "absent" else ""
    imported, out, first = _in_fresh_interpreter(blocked + DEPTHWISE_RUN,
                                                 {"EDGEFLOW_JIT": "0"} if how == "disabled" else {"EDGEFLOW_JIT": "1"})
    assert not imported
    np.testing.assert_array_equal(out, first)
    imported_jit, out_jit, first_jit = _in_fresh_interpreter(DEPTHWISE_RUN, {"EDGEFLOW_JIT": "1"})
    assert imported_jit
    np.testing.assert_array_equal(first_jit, out)  # the first run, bound while numba loads: numpy's kernels
    close(np.float32(out), np.float32(out_jit))


def _arguments():
    """Arguments of the kinds the loops take: arrays of two dtypes, 0-3 dimensions, C- or
    F-ordered or strided, read-only or not, aligned or not; numpy and Python scalars."""
    def array(dtype, shape, order, step, writeable, aligned):
        base = np.zeros([d * step for d in shape] or [1], dtype, order=order)
        a = base[tuple(slice(None, None, step) for _ in shape)] if shape else base.reshape(())
        if not aligned and a.size:
            raw = np.zeros(a.nbytes + 1, np.uint8)[1:]
            a = raw.view(dtype)[:a.size].reshape(a.shape)
        a.setflags(write=writeable)
        return a
    arrays = st.builds(array, st.sampled_from([np.float32, np.float64]),
                       st.lists(st.integers(1, 3), max_size=3), st.sampled_from("CF"), st.sampled_from([1, 2]),
                       st.booleans(), st.booleans())
    scalars = st.one_of(st.integers(-2 ** 64 + 1, 2 ** 64 - 1), st.floats(allow_nan=False), st.booleans(),
                        st.integers(0, 2 ** 64 - 1).map(np.uint64), st.floats(width=32).map(np.float32))
    return st.one_of(arrays, scalars)


@settings(max_examples=200)
@given(a=_arguments(), b=_arguments())
def test_kinds_part_arguments_as_numba_types_them(a, b):
    """Arguments of one kind (the key under which `compiled` keeps a loop's entry point,
    called without type checks) have one numba type; arrays of one numba type have one kind
    (a scalar may have two: np.uint64 and a Python int past int64's range)."""
    assert jit.available(), "numba does not import"
    import numba
    try:
        ta, tb = numba.typeof(a), numba.typeof(b)
    except ValueError:  # a Python int past uint64's range: numba types none, nor do the loops take it
        return
    if jit._kind(a) == jit._kind(b):
        assert ta == tb
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and ta == tb:
        assert jit._kind(a) == jit._kind(b), (a.flags, b.flags)


@pytest.mark.parametrize("case", ["same", "plane", "channels", "winograd"])
def test_a_loops_native_entry_gives_its_bits_on_the_native_workers(case, monkeypatch):
    """Where a plan has native workers, the depthwise and Winograd loops' steps carry a
    native entry (a C function of one int64, jit._NATIVE_ENTRIES): called by address it
    writes the step's own bits; Workers.split posts such steps to the native workers, and
    the split gives the bits of one thread and numpy's float64 result within 1e-4 (the
    stride-2 plane's loop: native_depthwise's compiled kernel left out)."""
    import ctypes

    from edgeflow.interp.kernels import winograd
    assert jit.available()
    monkeypatch.setattr(native_depthwise, "suits", lambda *args: False)
    rng = np.random.default_rng(3)
    c, size, stride = {"same": (24, 14, 1), "plane": (24, 40, 2), "channels": (70, 7, 1), "winograd": (16, 12, 1)}[case]
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = rng.standard_normal((c, 1 if case != "winograd" else c, 3, 3)).astype(np.float32)
    w.flags.writeable = False  # a model's constant
    bias = rng.standard_normal(c).astype(np.float32)
    o = (size + 2 - 3) // stride + 1
    workers = threads.Workers(2)
    assert workers.native is not None
    try:
        with threads.using(workers):
            if case == "winograd":
                out = np.empty((1, c, o, o), np.float32)
                u, made = winograd.pending_weights(w, 2)
                made.result()
                v = np.empty((16, c, 49), np.float32)
                products = np.empty((16, c, 49), np.float32)
                steps = [jit.bind_winograd_input(x, v, 2, (1, 1), 7, 7, 0, c),
                         jit.bind_winograd_output(products, bias, out, 2, 7, 7, "relu", 0, c)]
                steps[0]()
                np.matmul(u, v, out=products)
            else:
                out = np.empty((1, c, o, o), np.float32)
                halves = [(a, b) for a, b in threads.pieces(c, 2)]
                steps = [jit.bind_depthwise(x[:, a:b], w[a:b], bias[a:b], out[:, a:b], (stride, stride), (1, 1),
                                            (1, 1), "relu6") for a, b in halves]
                loops = {"same": "depthwise_same_loop", "plane": "depthwise_loop", "channels": "depthwise_channels_loop"}
                assert jit._NATIVE_ADDRESSES.get(loops[case])
        for step in steps:
            assert step.native_call is not None
        steps[-1]() if case == "winograd" else [s() for s in steps]
        want = out.copy()
        out.fill(np.nan)
        for step in steps[-1:] if case == "winograd" else steps:
            address, argument = step.native_call
            ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)(argument)
        np.testing.assert_array_equal(out, want)
        if case != "winograd":
            out.fill(np.nan)
            split = workers.split(steps)
            assert split.func == workers._run_native
            split()
            np.testing.assert_array_equal(out, want)
    finally:
        workers.close()
    x64 = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    taps = np.lib.stride_tricks.sliding_window_view(x64, (3, 3), axis=(2, 3))[:, :, ::stride, ::stride]
    if case == "winograd":
        ref = np.maximum(np.einsum("nchwij,mcij->nmhw", taps, w.astype(np.float64)) + bias[:, None, None], 0)
    else:
        ref = np.clip(np.einsum("nchwij,cij->nchw", taps, w[:, 0].astype(np.float64)) + bias[:, None, None], 0, 6)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)



@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 5), k=st.integers(1, 40), n=st.integers(1, 13), seed=st.integers(0, 2**16))
def test_the_recurrences_product_is_one_c_function_giving_numpys_product(b, k, n, seed):
    """The recurrences' a @ w^T (jit.MATMUL_NT_SYMBOL): the C function named to LLVM gives
    numpy's product on odd shapes (rows of a past the 2-row tile, rows of w past the
    4-row one), writing out and nothing past it; a numba function calling it by name
    (_call_matmul_nt) gets its bits."""
    assert jit.available(), "numba does not import"
    jit._compile_scalars(jit._numba[0])
    address = jit._matmul_nt_symbol()
    from llvmlite import binding
    assert binding.address_of_symbol(jit.MATMUL_NT_SYMBOL) == address
    rng = np.random.default_rng(seed)
    a, w = rng.standard_normal((b, k), np.float32), rng.standard_normal((n, k), np.float32)
    buffer = np.full(b * n + 8, np.nan, np.float32)
    body = buffer[:b * n].reshape(b, n)  # out; the 8 floats past it never written
    floats = ctypes.POINTER(ctypes.c_float)
    ctypes.CFUNCTYPE(None, floats, floats, floats, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(address)(
        *(x.ctypes.data_as(floats) for x in (a, w, body)), b, k, n)
    np.testing.assert_allclose(body, a.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5 * k)
    assert np.isnan(buffer[b * n:]).all()
    gates = np.zeros((b, n), np.float32)
    jit._numba[0].njit(lambda a, w, g: jit._call_matmul_nt(a, w, g))(a, w, gates)
    np.testing.assert_array_equal(gates, body)
