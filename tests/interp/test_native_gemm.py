"""edgeflow/interp/kernels/native_gemm.py's products (weights by x's columns; rows by packed
columns of weights) and the plan's fusions of a conv with the add and prelu after it, and of
a matmul with its bias and residual (plan.py's _epilogues), against numpy evaluations
in float64.

The product must run wherever llvmlite imports (the `jit` extra, installed with the tests)
on a CPU with AVX2 and FMA; elsewhere available() is False and the conv paths keep BLAS.
"""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp.kernels import jit, native_gemm

from .native_cases import run_graph as _run


def _host_has_avx2():
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    return bool(features.get("avx2") and features.get("fma"))


HERE = _host_has_avx2()


def test_available_where_the_host_has_avx2():
    assert native_gemm.available() == HERE


def _activate(y, activation):
    return {"": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6), "swish": y / (1 + np.exp(-y)),
            "hard_swish": y * np.clip(y + 3, 0, 6) / 6}[activation]


def _reference(w, bias, x, activation, residual, slope):
    y = np.einsum("mk,nkp->nmp", w.astype(np.float64), x.astype(np.float64)) + bias.astype(np.float64)[:, None]
    if residual is not None:
        y = y + residual
    y = _activate(y, activation)
    if slope is not None:
        y = np.where(y < 0, y * slope[:, None], y)
    return y


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 70), p=st.integers(4, 130),
       activation=st.sampled_from(sorted(native_gemm.ACTIVATIONS)), residual=st.booleans(), slope=st.booleans(),
       offset=st.integers(0, 3), block=st.sampled_from([5, 16, native_gemm.MAX_BLOCK]),
       scale=st.sampled_from([None, "each", "shared"]), strips=st.sampled_from([1, 1000, native_gemm.STRIP_BLOCK]),
       prefetch=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_product_and_epilogue(n, m, k, p, activation, residual, slope, offset, block, scale, strips, prefetch, seed):
    """Every panel and strip remainder (m not a multiple of MR, p of NR), x's rows and images
    apart (a view into a larger array), each epilogue, depths in one block of x's rows or
    several (MAX_BLOCK lowered: partial sums stored, then added to), strips packed one at a
    time or several (STRIP_BLOCK lowered or not), the tiles' loop prefetching x's next strips or
    not (TILE_PREFETCH_MIN_FLOATS lowered or not), and x's rows scaled by
    a factor for each image or one for all: within float32 rounding of the float64
    evaluation of the product of float32 x * scale; out's padding and elements past it are
    not written."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    big = rng.standard_normal((n, k + 2, p + offset + 3)).astype(np.float32)
    x = big[:, 1:k + 1, offset:offset + p]
    frame = np.full((n, m, p + 5), 7.0, np.float32)
    out = frame[:, :, :p]
    res = rng.standard_normal((n, m, p)).astype(np.float32) if residual else None
    s = rng.standard_normal(m).astype(np.float32) if slope else None
    factors = None if scale is None else rng.uniform(-2, 2, (n if scale == "each" else 1, k)).astype(np.float32)
    with mock.patch.object(native_gemm, "MAX_BLOCK", block), mock.patch.object(native_gemm, "STRIP_BLOCK", strips), \
            mock.patch.object(native_gemm, "TILE_PREFETCH_MIN_FLOATS", 0 if prefetch else 1 << 62):
        step = native_gemm.bind(native_gemm.pack(w, bias), x, out, activation, res, s, factors)
    step()
    expected = _reference(w, bias, x if factors is None else x * factors[:, :, None], activation, res, s)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * max(np.abs(expected).max(), 1.0))
    assert (frame[:, :, p:] == 7.0).all()


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), m=st.integers(1, 30), k=st.integers(1, 40), strips=st.integers(0, 2),
       tail=st.integers(1, native_gemm.COLUMN_TAIL), activation=st.sampled_from(sorted(native_gemm.ACTIVATIONS)),
       residual=st.booleans(), slope=st.booleans(), scale=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_last_few_columns_one_at_a_time(n, m, k, strips, tail, activation, residual, slope, scale, seed):
    """The last COLUMN_TAIL columns or fewer run one at a time (vectors of rows): the bits of
    the same columns where a strip of NR runs them (x's columns followed by NR more), with each
    epilogue, factors, rows past M (m not a multiple of VEC) and images apart; nothing past
    out's columns written."""
    rng = np.random.default_rng(seed)
    p = strips * native_gemm.NR + tail
    w, bias = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
    wide = rng.standard_normal((n, k, p + native_gemm.NR)).astype(np.float32)
    res = rng.standard_normal((n, m, p + native_gemm.NR)).astype(np.float32) if residual else None
    s = rng.standard_normal(m).astype(np.float32) if slope else None
    factors = rng.uniform(-2, 2, (n, k)).astype(np.float32) if scale else None
    frame = np.full((n, m, p + 3), 7.0, np.float32)
    packed = native_gemm.pack(w, bias)
    native_gemm.bind(packed, wide[:, :, :p], frame[:, :, :p], activation, None if res is None else res[:, :, :p], s,
                     factors)()
    whole = np.empty((n, m, p + native_gemm.NR), np.float32)
    native_gemm.bind(packed, wide, whole, activation, res, s, factors)()
    np.testing.assert_array_equal(frame[:, :, :p], whole[:, :, :p])
    assert (frame[:, :, p:] == 7.0).all()


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_residual_may_be_the_output_itself_but_not_overlap_it():
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((1, 8, 50)).astype(np.float32)
    out = rng.standard_normal((1, 8, 50)).astype(np.float32)
    expected = _reference(w, np.zeros(8, np.float32), x, "", out, None)
    native_gemm.bind(native_gemm.pack(w), x, out, "", out)()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    buffer = np.zeros((1, 8, 51), np.float32)
    assert native_gemm.bind(native_gemm.pack(w), x, buffer[:, :, 1:], "", buffer[:, :, :50]) is None
    assert native_gemm.bind(native_gemm.pack(w), x.astype(np.float64), out) is None  # float32 only


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 70), p=st.integers(1, 80),
       activation=st.sampled_from(sorted(native_gemm.ACTIVATIONS)), residual=st.booleans(), bias=st.booleans(),
       transposed=st.booleans(), offset=st.integers(0, 3), depth_block=st.sampled_from([5, 16, 1024]),
       seed=st.integers(0, 2 ** 16))
def test_rows_by_packed_columns(n, m, k, p, activation, residual, bias, transposed, offset, depth_block, seed):
    """bind_rows: every remainder of rows (m not a multiple of MR: rows past it read row m -
    1, never stored) and of columns (p not a multiple of NR), a's rows apart and its images
    apart (a view into a larger array), w packed from w.T too, each epilogue with a column's
    bias or none, depths in one block or several (ROWS_BLOCK lowered): within float32
    rounding of the float64 evaluation; nothing past out's columns written."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(p).astype(np.float32) if bias else None
    big = rng.standard_normal((n, m + 2, k + offset + 3)).astype(np.float32)
    a = big[:, 1:m + 1, offset:offset + k]
    frame = np.full((n, m, p + 5), 7.0, np.float32)
    out = frame[:, :, :p]
    res = rng.standard_normal((n, m, p)).astype(np.float32) if residual else None
    packed = native_gemm.pack_columns(np.ascontiguousarray(w.T).T if transposed else w, b)
    with mock.patch.object(native_gemm, "ROWS_BLOCK", depth_block):
        step = native_gemm.bind_rows(packed, a, out, activation, res)
    step()
    y = np.einsum("nmk,kp->nmp", a.astype(np.float64), w.astype(np.float64))
    y = _activate(y + (0 if b is None else b) + (0 if res is None else res), activation)
    np.testing.assert_allclose(out, y, rtol=1e-5, atol=1e-5 * max(np.abs(y).max(), 1.0))
    assert (frame[:, :, p:] == 7.0).all()


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_rows_decline_what_they_cannot_run():
    rng = np.random.default_rng(5)
    a, w = rng.standard_normal((1, 8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    packed = native_gemm.pack_columns(w)
    assert native_gemm.bind_rows(packed, a.astype(np.float64), np.zeros((1, 8, 8))) is None  # float32 only
    buffer = np.zeros((1, 8, 16), np.float32)
    assert native_gemm.bind_rows(packed, buffer, buffer[:, :, :8]) is None  # out over a
    assert native_gemm.bind_rows(packed, a, np.zeros((1, 8, 8), np.float32), "tanh") is None
    with pytest.raises(ValueError, match="do not fit"):
        native_gemm.bind_rows(packed, a, np.zeros((1, 8, 30), np.float32))


def _conv(x, w, b, activation=""):
    return apply("conv", [x, w, b], {"activation": activation})


def _np_conv(x, w, b):
    return np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x) + b[:, None, None]


def _prelu(y, slope):
    return np.where(y < 0, y * slope.reshape(1, -1, 1, 1), y)


def test_conv_add_prelu_in_two_interleaved_branches_run_as_two_steps():
    """Two branches of conv -> add(residual) -> prelu and conv -> prelu, whose ops the plan
    would otherwise interleave: each conv takes the ops after it into its own step (where
    the product runs here), and the outputs are numpy's."""
    rng = np.random.default_rng(1)
    c, m, hw = 16, 16, 9
    x = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
    w1, w2 = (rng.standard_normal((m, c, 1, 1)).astype(np.float32) for _ in range(2))
    b1, b2 = (rng.standard_normal(m).astype(np.float32) for _ in range(2))
    s1, s2 = (rng.uniform(0.05, 0.5, (1, m, 1, 1)).astype(np.float32) for _ in range(2))

    def build(t):
        a = apply("prelu", [apply("add", [_conv(t, w1, b1), t], {}), s1], {})
        b = apply("prelu", [_conv(t, w2, b2), s2], {})
        return {"a": a, "b": b}
    got, ran = _run(build, x, profile=True)
    np.testing.assert_allclose(got["a"], _prelu(_np_conv(x, w1, b1) + x, s1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["b"], _prelu(_np_conv(x, w2, b2), s2), rtol=1e-5, atol=1e-5)
    assert ran == (["conv", "conv"] if native_gemm.available() else ["add", "conv", "conv", "prelu", "prelu"])


def test_nothing_fuses_where_an_intermediate_is_read_elsewhere_or_an_output():
    """The conv's output is a signature output too, and the add's feeds a second op: each op
    keeps its step; the values are numpy's."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w, b = rng.standard_normal((8, 8, 1, 1)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    slope = np.full((1, 8, 1, 1), 0.25, np.float32)

    def build(t):
        y = _conv(t, w, b)
        z = apply("add", [y, t], {"activation": "relu"})
        return {"y": y, "z": z, "p": apply("prelu", [z, slope], {}), "q": apply("neg", [z], {})}
    got, ran = _run(build, x, profile=True)
    y = _np_conv(x, w, b)
    z = np.maximum(y + x, 0)
    for name, want in (("y", y), ("z", z), ("p", _prelu(z, slope)), ("q", -z)):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)
    assert ran.count("add") == 1 and ran.count("prelu") == 1


@pytest.mark.parametrize("num_threads, batch, size", [(1, 1, 40), (2, 1, 40), (2, 3, 40), (2, 1, 10)])
def test_a_chain_of_residual_blocks_with_activations(num_threads, batch, size):
    """relu and relu6 on the add, a prelu after a conv, a strided 2x2 conv whose windows tile
    x (its columns copied first), at 1 thread and at 2 (the product's pieces on the workers:
    columns apart for one 40x40 image, images apart for three, output channels apart for a
    10x10 image's few columns): numpy's values."""
    assert jit.available()
    rng = np.random.default_rng(3)
    channels = 12 if size > 10 else 48
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    w1, w2 = (rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.3 for _ in range(2))
    w3 = rng.standard_normal((20, channels, 2, 2)).astype(np.float32) * 0.3
    b1, b2, b3 = (rng.standard_normal(k).astype(np.float32) for k in (channels, channels, 20))
    slope = rng.uniform(0.1, 0.3, (1, channels, 1, 1)).astype(np.float32)

    def build(t):
        y = apply("add", [_conv(t, w1, b1), t], {"activation": "relu"})
        y = apply("add", [y, _conv(y, w2, b2)], {"activation": "relu6"})
        y = apply("prelu", [_conv(y, w1, b1), slope], {})
        return {"y": apply("conv", [y, w3, b3], {"strides": (2, 2)})}
    got, _ = _run(build, x, num_threads=num_threads)
    y = np.maximum(_np_conv(x, w1, b1) + x, 0)
    y = np.clip(y + _np_conv(y, w2, b2), 0, 6)
    y = _prelu(_np_conv(y, w1, b1), slope)
    windows = y.reshape(batch, channels, size // 2, 2, size // 2, 2)
    want = np.einsum("mcij,ncyixj->nmyx", w3.astype(np.float64), windows) + b3[:, None, None]
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("num_threads, batch, stride, output, fused", [
    (2, 1, 1, False, True), (2, 1, 2, False, True), (1, 1, 1, False, False), (2, 2, 1, False, False),
    (2, 1, 1, True, False)])
def test_a_1x1_conv_and_its_depthwise_conv_run_on_each_worker_in_turn(num_threads, batch, stride, output, fused):
    """A 1x1 conv whose output only a depthwise conv reads (MobileNet's expansion): at 2
    threads and batch 1 one step (conv.pointwise_depthwise: each worker's output channels of
    the 1x1 conv, then the depthwise conv of those channels); at 1 thread, at a batch of as
    many images as workers, or where the 1x1 conv's output is a signature output too, two.
    Either way numpy's values."""
    assert jit.available()
    rng = np.random.default_rng(9)
    c, m, size = 16, 96, 28
    x = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    w1 = rng.standard_normal((m, c, 1, 1)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((m, 1, 3, 3)).astype(np.float32) * 0.3
    b1, b2 = (rng.standard_normal(m).astype(np.float32) for _ in range(2))

    def build(t):
        y = _conv(t, w1, b1, "relu6")
        z = apply("conv", [y, w2, b2], {"group": m, "strides": (stride, stride), "pads": (1, 1, 1, 1),
                                       "activation": "relu6"})
        return {"z": z, **({"y": y} if output else {})}
    got, ran = _run(build, x, profile=True, num_threads=num_threads)
    y = np.clip(_np_conv(x, w1, b1), 0, 6)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                       axis=(2, 3))[:, :, ::stride, ::stride]
    want = np.clip(np.einsum("nmhwij,mij->nmhw", windows, w2[:, 0].astype(np.float64)) + b2[:, None, None], 0, 6)
    np.testing.assert_allclose(got["z"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if output:
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)
    assert ran == (["conv"] if fused and native_gemm.available() else ["conv", "conv"]), ran


def test_a_squeeze_excitation_scaled_1x1_conv_keeps_its_multiply_before_a_depthwise_conv():
    """At 2 threads, a 1x1 conv whose x a squeeze-excitation's multiply makes and whose output
    only a depthwise conv reads: the multiply's chain takes the conv (the product scales x
    as it packs it), the depthwise conv binds apart; numpy's values."""
    assert jit.available()
    rng = np.random.default_rng(10)
    c, m, size = 16, 64, 14
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w0 = rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3
    w1 = rng.standard_normal((m, c, 1, 1)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((m, 1, 3, 3)).astype(np.float32) * 0.3
    b0, b1, b2 = (rng.standard_normal(k).astype(np.float32) for k in (c, m, m))

    def build(t):
        s = apply("sigmoid", [_conv(apply("reduce_mean", [t], {"axes": (2, 3), "keepdims": True}), w0, b0)], {})
        y = _conv(apply("mul", [t, s], {}), w1, b1, "relu6")
        return {"z": apply("conv", [y, w2, b2], {"group": m, "pads": (1, 1, 1, 1)})}
    got, ran = _run(build, x, profile=True, num_threads=2)
    s = _sigmoid(_np_conv(x.mean(axis=(2, 3), keepdims=True, dtype=np.float64), w0, b0))
    y = np.clip(_np_conv(x * s, w1, b1), 0, 6)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                       axis=(2, 3))
    want = np.einsum("nmhwij,mij->nmhw", windows, w2[:, 0].astype(np.float64)) + b2[:, None, None]
    np.testing.assert_allclose(got["z"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert ran.count("conv") == (2 if native_gemm.available() else 3) and "mul" in ran, ran  # mul: the fused step


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


@pytest.mark.parametrize("num_threads, batch, channels, size, max_depth", [
    (1, 1, 16, 9, native_gemm.MAX_DEPTH), (2, 1, 16, 9, native_gemm.MAX_DEPTH), (2, 3, 24, 7, native_gemm.MAX_DEPTH),
    (1, 2, 24, 4, 16)])
def test_a_squeeze_excitation_multiply_runs_in_the_product_of_its_conv(num_threads, batch, channels, size,
                                                                       max_depth):
    """x times a factor for each image and channel, into a 1x1 conv and its residual add
    (EfficientNet's blocks): one step where the product runs (the multiply's; its conv and
    add in it), giving numpy's values and the same bits as the multiply and the conv apart
    (the multiply's product a signature output too). Past native_gemm.MAX_DEPTH input
    channels (lowered here) the product is BLAS's and the ops run apart."""
    assert jit.available()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    w1, w2 = (rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.2 for _ in range(2))
    b1, b2 = (rng.standard_normal(channels).astype(np.float32) for _ in range(2))

    def build(t, keep=False):
        s = apply("sigmoid", [_conv(apply("reduce_mean", [t], {"axes": (2, 3), "keepdims": True}), w1, b1)], {})
        y = apply("mul", [t, s], {})
        return {"z": apply("add", [_conv(y, w2, b2), t], {}), **({"y": y} if keep else {})}
    with mock.patch.object(native_gemm, "MAX_DEPTH", max_depth):
        got, ran = _run(build, x, profile=True, num_threads=num_threads)
        apart, _ = _run(lambda t: build(t, keep=True), x, num_threads=num_threads)
    s = _sigmoid(_np_conv(x.mean(axis=(2, 3), keepdims=True, dtype=np.float64), w1, b1)).astype(np.float32)
    want = _np_conv(x * s, w2, b2) + x
    np.testing.assert_allclose(got["z"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    native = native_gemm.available() and channels <= max_depth
    if native:
        assert (got["z"] == apart["z"]).all()
    assert ran == sorted(["reduce_mean", "conv", "sigmoid", "mul"] + ([] if native else ["conv", "add"]))


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_plans_of_one_model_share_its_packed_weights():
    """An interpreter's plans for two batch sizes bind the conv's product to one packed copy
    of its weights, freed with the model."""
    import gc
    assert jit.available()
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((24, 16, 1, 1)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, (None, 16, 8, 8), name="x")
        y = _conv(t, w, b, "relu")
    it = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})), num_threads=1, jit=True)
    runner = it.get_signature_runner("infer")
    gc.collect()
    before = len(native_gemm._PACKED)
    sizes = []
    for batch in (1, 3):
        x = rng.standard_normal((batch, 16, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(runner(x=x)["y"], np.maximum(_np_conv(x, w, b), 0), rtol=1e-5, atol=1e-5)
        sizes.append(len(native_gemm._PACKED))
    assert sizes == [before + 1, before + 1]
    del it, runner
    gc.collect()
    assert len(native_gemm._PACKED) == before


def _dense(x, w, b):
    return apply("add", [apply("matmul", [x, w], {}), b], {})


@pytest.mark.parametrize("num_threads, batch", [(1, 1), (2, 1), (2, 3)])
def test_a_transformer_feed_forward_block(num_threads, batch):
    """A BERT layer's feed-forward block: matmul -> add(bias) -> gelu -> matmul -> add(bias)
    -> add(residual), with a matmul by w.T (transpose_b) whose bias add has a relu beside
    it, and one whose bias add has a swish (not exact where it is applied: it stays apart):
    each product takes the adds after it into its own step (where it runs here), at 1
    thread and at 2 (columns apart for 1024 columns, rows apart for 40); the outputs are
    numpy's, and bit for bit those of the same model with every product's sum an output
    too (nothing fused: a model split between a matmul and its adds)."""
    from scipy import special
    assert jit.available()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((batch, 37, 40)).astype(np.float32)
    w1, w2 = rng.standard_normal((40, 1024)).astype(np.float32) * 0.1, rng.standard_normal((1024, 40)).astype(np.float32) * 0.05
    w3 = rng.standard_normal((24, 40)).astype(np.float32) * 0.2
    b1, b2, b3 = (rng.standard_normal(k).astype(np.float32) for k in (1024, 40, 24))

    def build(t, apart=False):
        sums = [apply("matmul", [t, w1], {})]
        h = apply("gelu", [apply("add", [sums[-1], b1], {})], {})
        sums.append(apply("matmul", [h, w2], {}))
        y = apply("add", [apply("add", [sums[-1], b2], {}), t], {})
        sums.append(apply("matmul", [t, w3], {"transpose_b": True}))
        z = apply("add", [sums[-1], b3], {"activation": "relu"})
        s = apply("add", [apply("matmul", [t, w3], {"transpose_b": True}), b3], {"activation": "swish"})
        return {"y": y, "z": z, "s": s, **({f"sum{k}": v for k, v in enumerate(sums)} if apart else {})}
    got, ran = _run(build, x, profile=True, num_threads=num_threads)
    x64 = x.astype(np.float64)
    h = x64 @ w1 + b1
    h = h / 2 * special.erfc(-h / np.sqrt(2))
    np.testing.assert_allclose(got["y"], h @ w2 + b2 + x64, rtol=1e-5, atol=1e-5 * np.abs(x).max())
    np.testing.assert_allclose(got["z"], np.maximum(x64 @ w3.T + b3, 0), rtol=1e-5, atol=1e-5)
    s = x64 @ w3.T + b3
    np.testing.assert_allclose(got["s"], s / (1 + np.exp(-s)), rtol=1e-5, atol=1e-5)
    assert ran == (sorted(["matmul"] * 4 + ["gelu", "add"]) if native_gemm.available()
                   else sorted(["matmul"] * 4 + ["add"] * 5 + ["gelu"]))
    apart, ran_apart = _run(lambda t: build(t, apart=True), x, profile=True, num_threads=num_threads)
    assert ran_apart.count("add") == 5
    for key in ("y", "z", "s"):
        np.testing.assert_array_equal(got[key], apart[key])


def test_a_matmul_chain_stays_apart_where_its_weights_are_fed_or_its_product_an_output():
    """The weights a signature input (they may change: nothing packed), or the product a
    signature output too: every op keeps its step; the values are numpy's."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((20, 16)).astype(np.float32)
    w, b = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        v = ef.placeholder(ef.float32, w.shape, name="w")
        fed = _dense(t, v, b)
        m = apply("matmul", [t, w], {})
        outputs = {"fed": apply("gelu", [fed], {}), "m": m, "y": apply("add", [m, b], {})}
    it = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t, "w": v}, outputs)})), num_threads=1,
                        jit=True)
    prof = it.enable_profiling()
    got = it.get_signature_runner("infer")(x=x, w=w)
    from scipy import special
    want = x.astype(np.float64) @ w + b
    np.testing.assert_allclose(got["fed"], want / 2 * special.erfc(-want / np.sqrt(2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["m"], want - b, rtol=1e-5, atol=1e-5)
    assert sorted(r.opcode for r in prof.records.values()) == ["add", "add", "gelu", "matmul", "matmul"]


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("p", [1, 8, 9, 16, 17, 23, 24, 25, 33, 41, 47, 49])
def test_last_columns_in_narrow_strips(p):
    """Both products where the last columns fill one, two or three vectors of the last strip
    (a 7x7 map's 49 columns: 24 + 24 + 1), with the residual and relu6: float64's values,
    nothing written past the columns."""
    rng = np.random.default_rng(p)
    w, bias = rng.standard_normal((10, 12)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    x, res = rng.standard_normal((1, 12, p)).astype(np.float32), rng.standard_normal((1, 10, p)).astype(np.float32)
    frame = np.full((1, 10, p + 9), 7.0, np.float32)
    if p >= 4:
        native_gemm.bind(native_gemm.pack(w, bias), x, frame[:, :, :p], "relu6", res)()
        want = _reference(w, bias, x, "relu6", res, None)
        np.testing.assert_allclose(frame[:, :, :p], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert (frame[:, :, p:] == 7.0).all()
    a = rng.standard_normal((1, 6, 12)).astype(np.float32)
    wide = rng.standard_normal((12, p)).astype(np.float32)
    rows = np.full((1, 6, p + 9), 7.0, np.float32)
    native_gemm.bind_rows(native_gemm.pack_columns(wide), a, rows[:, :, :p], "relu6")()
    want = np.clip(a[0].astype(np.float64) @ wide, 0, 6)
    np.testing.assert_allclose(rows[0, :, :p], want, rtol=1e-5, atol=1e-5 * max(np.abs(want).max(), 1.0))
    assert (rows[:, :, p:] == 7.0).all()


@pytest.mark.parametrize("num_threads", [1, 2])
def test_long_rows_run_here_with_their_adds(num_threads):
    """A dense layer (bias, then a residual add) of 1,024 rows of 300 floats (more than
    L2): one step of bind_rows with both adds, at one thread and split over two; numpy's
    values either way."""
    assert jit.available()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 256, 40)).astype(np.float32)
    w = rng.standard_normal((40, 300)).astype(np.float32) * 0.1
    r = rng.standard_normal((300, 300)).astype(np.float32) * 0.1
    b = rng.standard_normal(300).astype(np.float32)

    def build(t):
        h = apply("matmul", [t, w], {})  # not fused: a residual for the next layer
        return {"y": apply("add", [_dense(h, r, b), h], {})}
    got, ran = _run(build, x, profile=True, num_threads=num_threads)
    h = x.astype(np.float64) @ w
    np.testing.assert_allclose(got["y"], h @ r + b + h, rtol=1e-5, atol=1e-5 * np.abs(h).max())
    if native_gemm.available():
        assert ran == ["matmul", "matmul"], ran


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("rows, apart", [(200, "rows"), (24, "columns"), (8, "rows")])
def test_a_dense_layer_on_two_workers_splits_its_rows_where_each_has_many(rows, apart, monkeypatch):
    """matmul_epilogue over 2 workers: 200 rows (50 panels: ROWS_APART_PANELS or more
    each) rows apart, every worker all the columns; 24 rows columns apart, in whole strips;
    8 rows (two panels; a 40-column product has too few strips to split) rows apart.
    numpy's values with the bias and relu, and the bits of the product on one thread."""
    from edgeflow.interp import threads
    from edgeflow.interp.kernels import math as math_kernels
    assert jit.available()
    rng = np.random.default_rng(rows)
    n = 40 if rows == 8 else 300
    a = rng.standard_normal((rows, 64)).astype(np.float32)
    w = rng.standard_normal((64, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w.flags.writeable = b.flags.writeable = False
    attrs = {"transpose_a": False, "transpose_b": False, "activation": ""}
    bind_rows, pieces = native_gemm.bind_rows, []

    def recording(packed, x, out, *args):
        pieces.append((x.shape[1], out.shape[2]))  # the piece's rows, and its columns
        return bind_rows(packed, x, out, *args)
    monkeypatch.setattr(native_gemm, "bind_rows", recording)
    monkeypatch.setattr(threads, "MIN_FLOPS", 1)
    one = np.empty((rows, n), np.float32)
    math_kernels.matmul_epilogue([a, w], one, attrs, b, None, "relu")()
    pieces.clear()
    workers = threads.Workers(2)
    try:
        two = np.full((rows, n), np.nan, np.float32)
        with threads.using(workers):
            step = math_kernels.matmul_epilogue([a, w], two, attrs, b, None, "relu")
        step()
    finally:
        workers.close()
    assert len(pieces) == 2, pieces
    if apart == "rows":
        assert [c for _, c in pieces] == [n, n] and sum(r for r, _ in pieces) == rows, pieces
    else:
        assert [r for r, _ in pieces] == [rows, rows] and sum(c for _, c in pieces) == n, pieces
    np.testing.assert_array_equal(two, one)
    want = np.maximum(a.astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(two, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_machine_code_cache_loads_without_building_the_ir_and_survives_damage(monkeypatch):
    """The module's machine code is cached under its source key: a process that finds the
    file loads it as an object file (the IR never built) and runs the same products; a
    damaged file (its digest off) is compiled again and rewritten whole, not loaded."""
    import os
    import llvmlite.binding as llvm
    import llvmlite.ir as ir
    assert native_gemm.available()  # LLVM's native target and its printer initialized
    key = f"test{os.getpid()}"
    monkeypatch.setattr(native_gemm, "_source_key", lambda _: key)
    path = os.path.join(os.path.dirname(native_gemm.__file__), "__pycache__", f"native_gemm.{key}.o")
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((8, 20)).astype(np.float32), rng.standard_normal((1, 20, 30)).astype(np.float32)

    def product(built):
        monkeypatch.setattr(native_gemm, "_built", [built])
        out = np.empty((1, 8, 30), np.float32)
        native_gemm.bind(native_gemm.pack(w), x, out, "relu")()
        return out
    try:
        compiled = native_gemm._compile(llvm, ir)
        with open(path, "rb") as f:
            written = f.read()
        want = product(compiled)
        np.testing.assert_allclose(want, np.maximum(w @ x[0], 0)[None], rtol=1e-5, atol=1e-5)
        built = []
        module = native_gemm._module
        monkeypatch.setattr(native_gemm, "_module", lambda ir: built.append(1) or module(ir))
        loaded = native_gemm._compile(llvm, ir)
        assert not built
        np.testing.assert_array_equal(product(loaded), want)
        with open(path, "wb") as f:
            f.write(written[:40] + bytes(len(written) - 40))  # the code past its first bytes zeroed
        again = native_gemm._compile(llvm, ir)
        assert built == [1]
        np.testing.assert_array_equal(product(again), want)
        with open(path, "rb") as f:
            assert f.read() == written
    finally:
        if os.path.exists(path):
            os.remove(path)


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("m, k, p", [(12, 20, 30), (5, 3, 49), (64, 130, 16)])
def test_a_chain_of_products_bound_once(m, k, p):
    """bind_chain's products (one pack, x and out each, sharing the first's strip) run one
    after another: each the float64 product of its own weights and x, plus its bias; a
    product of other strides is refused."""
    rng = np.random.default_rng(m + k + p)
    ws = rng.standard_normal((4, m, k)).astype(np.float32)
    biases = rng.standard_normal((4, m)).astype(np.float32)
    xs = rng.standard_normal((4, 1, k, p)).astype(np.float32)
    outs = np.zeros((4, 1, m, p), np.float32)
    packs = [native_gemm.pack(w, b) for w, b in zip(ws, biases)]
    steps = native_gemm.bind_chain(packs, xs, outs)
    assert len(steps) == 4 and len({s.keep[0][native_gemm.STRIP] for s in steps}) == 1
    for step in steps:
        step()
    for w, b, x, out in zip(ws, biases, xs, outs):
        np.testing.assert_allclose(out, _reference(w, b, x, "", None, None), rtol=1e-5, atol=1e-5)
    wider = np.zeros((1, m, p + 1), np.float32)[:, :, :p]
    with pytest.raises(ValueError, match="match the first"):
        native_gemm.bind_chain(packs[:2], xs[:2], [outs[0], wider])
