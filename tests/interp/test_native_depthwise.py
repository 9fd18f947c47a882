"""edgeflow/interp/kernels/native_depthwise.py's depthwise convs (stride 1 and 2, 3x3 and 5x5)
against the same conv evaluated here in float64 (numpy, over a zero-padded copy of x), against jit.py's
loops, and in a model split over threads. They run where native_gemm does (x86-64 with AVX2
and FMA); elsewhere they decline and the loops run."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgeflow as ef
import edgeflow.interp.threads
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp.kernels import jit, native_depthwise

from .native_cases import ACTIVATIONS, guarded, needs_native, record_binds


def reference(x, w, bias, stride, top, left, oh, ow, activation):
    """act(the depthwise conv of x by w, `stride`, `top` and `left` zeros before x and zeros
    past it, + bias) in float64, (N, C, OH, OW)."""
    n, c, h, wd = x.shape
    k, s = w.shape[-1], stride
    padded = np.zeros((n, c, max(top + h, s * (oh - 1) + k), max(left + wd, s * (ow - 1) + k)))
    padded[:, :, top:top + h, left:left + wd] = x
    out = np.zeros((n, c, oh, ow)) + (0 if bias is None else bias[None, :, None, None])
    for a in range(k):
        for b in range(k):
            out += w[None, :, 0, a, b, None, None] * padded[:, :, a:a + s * (oh - 1) + 1:s, b:b + s * (ow - 1) + 1:s]
    return ACTIVATIONS[activation](out)


@needs_native
@settings(max_examples=80, deadline=None)
@given(k=st.sampled_from([3, 5, 7]), stride=st.sampled_from([1, 2]), n=st.integers(1, 3), c=st.integers(1, 6), h=st.integers(1, 40),
       w=st.integers(1, 40), data=st.data(), activation=st.sampled_from(sorted(ACTIVATIONS)),
       with_bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matches_float64(k, stride, n, c, h, w, data, activation, with_bias, seed):
    """Planes narrower than a row of 16 floats and wider, odd and even, outputs narrower than a
    vector (the row's lanes past it stored on the next row, the plane's last in pieces) and
    wider (the last group overlapping the one before), any zeros before x and after it (or x's
    last rows and columns out of reach): float64's values within float32 rounding, and no
    float written outside out."""
    top, left = data.draw(st.integers(0, k - 1)), data.draw(st.integers(0, k - 1))
    bottom, right = data.draw(st.integers(-1, k - 1)), data.draw(st.integers(-1, k - 1))
    oh, ow = (top + h + bottom - k) // stride + 1, (left + w + right - k) // stride + 1
    if oh < 1 or ow < 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if with_bias else None
    out, buffer = guarded((n, c, oh, ow))
    assert stride == 1 or native_depthwise.suits((h, w), (k, k), (2, 2), (1, 1), (top, left), (oh, ow), activation)
    native_depthwise.bind(x, wt, bias, out, stride, (top, left), activation)()
    want = reference(x.astype(np.float64), wt.astype(np.float64), None if bias is None else bias.astype(np.float64),
                     stride, top, left, oh, ow, activation)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * (np.abs(want).max() + 1))
    assert np.isnan(buffer[:64]).all() and np.isnan(buffer[-64:]).all()


@needs_native
@pytest.mark.parametrize("n, c, h, k, stride, pads, activation", [
    (1, 8, 112, 3, 2, (0, 0, 1, 1), "relu6"),  # TF's "same" (MobileNetV2 from TFLite)
    (1, 6, 112, 3, 2, (1, 1, 1, 1), "relu6"),  # MobileNetV2's first stride-2 layer
    (2, 5, 56, 3, 2, (1, 1, 1, 1), "relu6"),
    (1, 7, 28, 3, 2, (1, 1, 1, 1), ""),
    (1, 9, 14, 3, 2, (1, 1, 1, 1), "relu"),
    (1, 4, 56, 5, 2, (2, 2, 2, 2), "swish"),  # EfficientNet-B0's
    (2, 3, 14, 5, 2, (2, 2, 2, 2), "swish"),
    (1, 5, 28, 5, 2, (1, 1, 2, 2), "hard_swish"),
    (1, 6, 14, 3, 1, (1, 1, 1, 1), "relu6"),  # MobileNetV2's stride-1 layers at 14x14 and 7x7
    (2, 5, 7, 3, 1, (1, 1, 1, 1), "relu6"),
    (1, 4, 28, 5, 1, (2, 2, 2, 2), "swish"),  # EfficientNet-B0's
    (1, 3, 7, 5, 1, (2, 2, 2, 2), "swish"),
    (1, 3, 21, 3, 1, (0, 0, 2, 2), ""),
    (1, 6, 56, 7, 1, (3, 3, 3, 3), ""),  # ConvNeXt's, at each of its four widths
    (1, 5, 28, 7, 1, (3, 3, 3, 3), ""),
    (2, 4, 14, 7, 1, (3, 3, 3, 3), ""),
    (1, 7, 7, 7, 1, (3, 3, 3, 3), "")])
def test_whole_layers_match_the_loops(n, c, h, k, stride, pads, activation):
    """MobileNetV2's, EfficientNet-B0's and TF-padded layers: jit.py's depthwise_loop's values
    (summed in another order: within float32 rounding)."""
    assert jit.available()
    top, left, bottom, right = pads
    oh = ow = (h + top + bottom - k) // stride + 1
    rng = np.random.default_rng(n * 100 + c)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    got = np.full((n, c, oh, ow), np.nan, np.float32)
    native_depthwise.bind(x, wt, bias, got, stride, (top, left), activation)()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(native_depthwise, "suits", lambda *args: False)
        m.setattr(jit, "DEPTHWISE_PLANE_MIN", 0)
        m.setattr(jit, "DEPTHWISE_SAME_MIN", 1 << 30)
        loop = np.full_like(got, np.nan)
        jit.bind_depthwise(x, wt, bias, loop, (stride, stride), (1, 1), (top, left), activation)()
    np.testing.assert_allclose(got, loop, rtol=0, atol=2e-6 * (np.abs(loop).max() + 1))


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch, stride", [(1, 2), (2, 2), (1, 1)])
def test_in_a_model_split_over_threads(monkeypatch, threads, batch, stride):
    """A depthwise conv in a model binds the compiled kernel (stride 2 at 56x56, stride 1 at
    14x14, split there however little its work), whole or split over 2 threads (by channels at batch 1, by images at 2: each piece
    a step of its own), with the float64 conv's values."""
    assert jit.available()
    monkeypatch.setenv("EDGEFLOW_JIT", "1")
    bound = record_binds(monkeypatch, native_depthwise)
    rng = np.random.default_rng(threads + 10 * batch)
    c = 96
    size = 56 if stride == 2 else 14
    if stride == 1:  # 0.34 MFLOP: below threads.MIN_FLOPS
        monkeypatch.setattr(edgeflow.interp.threads, "MIN_FLOPS", 1)
    x = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    wt = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [t, wt, bias], {"strides": (stride, stride), "pads": (1, 1, 1, 1), "group": c,
                                           "activation": "relu6"})
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=threads)
    got = interp.get_signature_runner("infer")(x=x)["y"]
    side = size // stride
    want = reference(x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), stride, 1, 1, side, side,
                     "relu6")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * (np.abs(want).max() + 1))
    assert bound and all(bound) and len(bound) == threads, bound
