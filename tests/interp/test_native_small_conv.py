"""edgeflow/interp/kernels/native_small_conv.py's direct convs of 1-4 input channels (a
network's stem) against the same conv evaluated here in float64 (numpy, over a zero-padded
copy of x), against onnxruntime's on the real stems' shapes, and in a model split over
threads. They run where native_gemm does (x86-64 with AVX2 and FMA); elsewhere they decline
and jit.py's loop or im2col runs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp.kernels import jit, native_small_conv

from .native_cases import ACTIVATIONS, guarded, needs_native, record_binds
from .test_jit import onnx_run


def reference(x, w, bias, stride, dilation, top, left, oh, ow, activation):
    """act(the conv of x (N, C, H, W) by w (M, C, KH, KW), `stride` and `dilation` both ways,
    `top` and `left` zeros before x and zeros past it, + bias) in float64, (N, M, OH, OW)."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    s, d = stride, dilation
    padded = np.zeros((n, c, max(top + h, s * (oh - 1) + (kh - 1) * d + 1),
                       max(left + wd, s * (ow - 1) + (kw - 1) * d + 1)))
    padded[:, :, top:top + h, left:left + wd] = x
    out = np.zeros((n, w.shape[0], oh, ow)) + (0 if bias is None else bias[None, :, None, None])
    for a in range(kh):
        for b in range(kw):
            patch = padded[:, :, a * d:a * d + s * (oh - 1) + 1:s, b * d:b * d + s * (ow - 1) + 1:s]
            out += np.einsum("mc,nchw->nmhw", w[:, :, a, b], patch)
    return ACTIVATIONS[activation](out)


def padding(data, k, stride, dilation, h, w):
    """(top, left, OH, OW): zeros drawn before x within the kernel's reach, and after it (-1:
    x's last row or column out of reach); OH or OW below 1 where nothing fits."""
    reach = (k - 1) * dilation + 1
    top, left = data.draw(st.integers(0, reach - 1)), data.draw(st.integers(0, reach - 1))
    bottom, right = data.draw(st.integers(-1, reach - 1)), data.draw(st.integers(-1, reach - 1))
    return top, left, (top + h + bottom - reach) // stride + 1, (left + w + right - reach) // stride + 1


@needs_native
@settings(max_examples=80, deadline=None)
@given(k=st.sampled_from([1, 2, 3, 5, 7]), stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       n=st.integers(1, 2), c=st.integers(1, 4), m=st.integers(1, 11), h=st.integers(1, 40), w=st.integers(1, 60),
       data=st.data(), activation=st.sampled_from(sorted(ACTIVATIONS)), with_bias=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_matches_float64(k, stride, dilation, n, c, m, h, w, data, activation, with_bias, seed):
    """Any kernel size, stride 1 or 2, dilation, 1-4 input channels, output channels not a
    whole panel's (4), rows narrower than a vector and wider than a tile's 24 columns (the
    last tile of 1, 2 or 3 vectors, its last stored in pieces), zeros before x within the
    kernel's reach and after it (or x's last rows and columns out of reach): float64's values
    within float32 rounding, and no float written outside out."""
    top, left, oh, ow = padding(data, k, stride, dilation, h, w)
    if oh < 1 or ow < 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32) if with_bias else None
    out, buffer = guarded((n, m, oh, ow))
    assert native_small_conv.suits(c, (k, k), (stride, stride), (dilation, dilation), (top, left), (oh, ow),
                                   activation)
    native_small_conv.bind(x, wt, bias, out, stride, (dilation, dilation), (top, left), activation)()
    want = reference(x.astype(np.float64), wt.astype(np.float64), None if bias is None else bias.astype(np.float64),
                     stride, dilation, top, left, oh, ow, activation)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * (np.abs(want).max() + 1))
    assert np.isnan(buffer[:64]).all() and np.isnan(buffer[-64:]).all()


@needs_native
@settings(max_examples=60, deadline=None)
@given(k=st.sampled_from([1, 3, 7]), stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]),
       h=st.integers(1, 30), w=st.integers(1, 30), data=st.data(), seed=st.integers(0, 2 ** 16))
def test_bands_of_rows_make_the_whole(k, stride, dilation, h, w, data, seed):
    """Output rows in bands (a worker's each: its own copy of the input rows its band
    reaches, zeros above and below x where the band meets them) make the whole conv, and a
    band writes its rows alone."""
    top, left, oh, ow = padding(data, k, stride, dilation, h, w)
    if oh < 1 or ow < 1:
        return
    cuts = sorted(set(data.draw(st.lists(st.integers(1, oh), max_size=3)) + [oh]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
    wt = rng.standard_normal((5, 3, k, k)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    out, buffer = guarded((2, 5, oh, ow))
    want = reference(x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), stride, dilation, top, left,
                     oh, ow, "relu")
    first = 0
    for last in cuts:
        native_small_conv.bind(x, wt, bias, out, stride, (dilation, dilation), (top, left), "relu", (first, last))()
        np.testing.assert_allclose(out[:, :, :last], want[:, :, :last], rtol=0, atol=2e-6 * (np.abs(want).max() + 1))
        assert np.isnan(out[:, :, last:]).all()
        first = last
    assert np.isnan(buffer[:64]).all() and np.isnan(buffer[-64:]).all()


def test_suits_stems_only():
    """One to four input channels, the same stride both ways (1 or 2), zeros before x within
    the kernel's reach, an activation the kernel computes."""
    assert native_small_conv.suits(3, (7, 7), (2, 2), (1, 1), (3, 3), (112, 112), "relu")
    assert native_small_conv.suits(1, (3, 3), (1, 1), (2, 2), (4, 4), (5, 5), "")
    assert not native_small_conv.suits(5, (3, 3), (2, 2), (1, 1), (1, 1), (112, 112), "relu6")
    assert not native_small_conv.suits(3, (3, 3), (2, 1), (1, 1), (1, 1), (112, 224), "")
    assert not native_small_conv.suits(3, (3, 3), (3, 3), (1, 1), (1, 1), (75, 75), "")
    assert not native_small_conv.suits(3, (3, 3), (2, 2), (1, 1), (3, 1), (112, 112), "")
    assert not native_small_conv.suits(3, (3, 3), (2, 2), (1, 1), (1, 1), (112, 112), "leaky_relu")


@needs_native
@pytest.mark.parametrize("m, k, stride, pads, activation", [
    (64, 7, 2, (3, 3, 3, 3), "relu"),  # ResNet's
    (32, 3, 2, (1, 1, 1, 1), "relu6"),  # MobileNetV2's
    (32, 3, 2, (1, 1, 1, 1), "swish"),  # EfficientNet-B0's
    (16, 3, 2, (1, 1, 1, 1), "hard_swish"),  # MobileNetV3's
    (32, 3, 2, (0, 0, 1, 1), "relu6"),  # TF's "same" (MobileNetV2 from TFLite)
    (24, 5, 1, (2, 2, 2, 2), "")])
def test_real_stems_match_onnxruntime(m, k, stride, pads, activation):
    """The stems of ResNet, MobileNetV2 and V3, EfficientNet-B0 and a TF-padded one at
    224x224: onnxruntime's conv, then the activation, within 1e-5 of the output's largest."""
    rng = np.random.default_rng(m * k)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    wt = (rng.standard_normal((m, 3, k, k)) / k).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    side = (224 + pads[0] + pads[2] - k) // stride + 1
    got = np.full((1, m, side, side), np.nan, np.float32)
    native_small_conv.bind(x, wt, bias, got, stride, (1, 1), pads[:2], activation)()
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=(stride, stride), pads=pads)
    want = ACTIVATIONS[activation](onnx_run([conv], x, {"w": wt, "b": bias}).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch, k", [(1, 7), (2, 7), (1, 3)])
def test_in_a_model_split_over_threads(monkeypatch, threads, batch, k):
    """A stem in a model binds the compiled kernel (ResNet's 7x7 once numba is loaded, as
    the plan that replaces a real-size model's first does; a 3x3), whole or split over 2
    threads (by output rows at batch 1, by images at 2: each piece a step of its own), with
    the float64 conv's values."""
    assert jit.available()
    monkeypatch.setenv("EDGEFLOW_JIT", "1")
    bound = record_binds(monkeypatch, native_small_conv)
    rng = np.random.default_rng(threads + 10 * batch + k)
    x = rng.standard_normal((batch, 3, 96, 96)).astype(np.float32)
    wt = rng.standard_normal((64, 3, k, k)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, wt, bias], {"strides": (2, 2), "pads": (k // 2,) * 4, "activation": "relu"})
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=threads)
    got = interp.get_signature_runner("infer")(x=x)["y"]
    want = reference(x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), 2, 1, k // 2, k // 2,
                     48, 48, "relu")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * (np.abs(want).max() + 1))
    assert bound and all(bound) and len(bound) == threads, bound


@needs_native
def test_variable_weights_are_read_at_each_run():
    """Weights and bias that are variables (writeable: a model being trained) are packed again
    at each run, before the compiled call; constants once, the step the compiled call itself
    (which the native workers run without Python): a run after the variables change gives the
    new weights' conv."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 20, 21)).astype(np.float32)
    wt = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    out = np.empty((1, 6, 10, 11), np.float32)
    step = native_small_conv.bind(x, wt, bias, out, 2, (1, 1), (1, 1), "")
    assert not hasattr(step, "native_call")
    step()
    np.testing.assert_allclose(out, reference(x, wt, bias, 2, 1, 1, 1, 10, 11, ""), rtol=0, atol=1e-5)
    wt *= -2
    bias += 1
    step()
    np.testing.assert_allclose(out, reference(x, wt, bias, 2, 1, 1, 1, 10, 11, ""), rtol=0, atol=1e-5)
    frozen, shift = wt.copy(), bias.copy()
    frozen.flags.writeable = shift.flags.writeable = False
    step = native_small_conv.bind(x, frozen, shift, out, 2, (1, 1), (1, 1), "")
    assert hasattr(step, "native_call")
    step()
    np.testing.assert_allclose(out, reference(x, frozen, shift, 2, 1, 1, 1, 10, 11, ""), rtol=0, atol=1e-5)
