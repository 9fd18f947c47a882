"""edgeflow/interp/kernels/native_winograd.py's F(4x4, 3x3) transforms against B^T d B of each
input tile and act(A^T P A + bias) of each tile's products, evaluated here in float64 (numpy,
from winograd.py's B^T and A^T), and against jit.py's loops. They run where native_gemm does
(x86-64 with AVX2 and FMA); elsewhere they decline and the loops run."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeflow.interp.kernels import jit, native_gemm, native_winograd, winograd

HERE = native_gemm.available()


def transformed(x, top, left, tile_rows, tile_cols, m=4):
    """V (a^2, C, N * tiles) in float64: B^T d B of each a x a tile d of x zero-padded,
    tiles m apart (F(m x m, 3x3), a = m + 2)."""
    n, c, h, w = x.shape
    a = m + 2
    padded = np.zeros((n, c, m * tile_rows + 2 + h + top, m * tile_cols + 2 + w + left))
    padded[:, :, top:top + h, left:left + w] = x
    windows = np.lib.stride_tricks.sliding_window_view(padded, (a, a), axis=(2, 3))[:, :, ::m, ::m]
    d = windows[:, :, :tile_rows, :tile_cols]  # (N, C, TH, TW, a, a)
    bt = winograd.TRANSFORMS[m][0]
    v = np.einsum("kr,ncijrs,ts->ktncij", bt, d, bt)  # (a, a, N, C, TH, TW)
    return v.transpose(0, 1, 3, 2, 4, 5).reshape(a * a, c, n * tile_rows * tile_cols)


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("m", [4, 2])
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(1, 40), w=st.integers(1, 40),
       top=st.integers(0, 2), left=st.integers(0, 2), tile_rows=st.integers(1, 11), tile_cols=st.integers(1, 11),
       channels=st.data(), seed=st.integers(0, 2 ** 16))
def test_input_transform(m, n, c, h, w, top, left, tile_rows, tile_cols, channels, seed):
    """Planes narrower and wider than a vector's 8 tiles (the last group overlapping the one
    before), rows and columns of x past the tiles' reach and tiles past x's edge, pads, images
    and a range of channels (the others left as they were): float64's values within float32
    rounding, and jit.py's loop's."""
    c0 = channels.draw(st.integers(0, c - 1))
    c1 = channels.draw(st.integers(c0 + 1, c))
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    v = np.full(((m + 2) ** 2, c, n * tile_rows * tile_cols), np.nan, np.float32)
    native_winograd.bind_input(x, v, (top, left), tile_rows, tile_cols, c0, c1, m)()
    want = transformed(x.astype(np.float64), top, left, tile_rows, tile_cols, m)
    scale = np.abs(want[:, c0:c1]).max() + 1e-30
    np.testing.assert_allclose(v[:, c0:c1], want[:, c0:c1], rtol=0, atol=1e-6 * scale)
    assert np.isnan(v[:, :c0]).all() and np.isnan(v[:, c1:]).all()
    assert jit.available()
    loop = np.full_like(v, np.nan)
    jit.bind_winograd_input(x, loop, m, (top, left), tile_rows, tile_cols, c0, c1)()
    np.testing.assert_allclose(v[:, c0:c1], loop[:, c0:c1], rtol=0, atol=1e-6 * scale)


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("n, c, h, w, pads", [(1, 3, 56, 56, 1), (2, 2, 28, 28, 1), (1, 4, 14, 14, 1), (1, 5, 7, 7, 1),
                                              (1, 2, 37, 45, 0), (1, 2, 33, 64, 2)])
def test_input_transform_of_whole_layers(m, n, c, h, w, pads):
    """ResNet-like planes (F4 at 56 x 56: 14 tiles a row, two groups of 8, the second
    overlapping; 28: 7; 14: 4; 7: 2; F2 twice as many) and odd ones, the tiles a 'same'
    conv's: float64's values."""
    x = np.random.default_rng(h * w).standard_normal((n, c, h, w)).astype(np.float32)
    rows, cols = -(-(h + 2 * pads - 2) // m), -(-(w + 2 * pads - 2) // m)
    v = np.full(((m + 2) ** 2, c, n * rows * cols), np.nan, np.float32)
    native_winograd.bind_input(x, v, (pads, pads), rows, cols, 0, c, m)()
    want = transformed(x.astype(np.float64), pads, pads, rows, cols, m)
    np.testing.assert_allclose(v, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_input_transform_declines_what_it_does_not_take():
    x = np.zeros((1, 2, 8, 8), np.float32)
    v = np.zeros((36, 2, 4), np.float32)
    assert native_winograd.bind_input(x, v, (1, 1), 2, 2, 0, 2) is not None
    assert native_winograd.bind_input(x.astype(np.float64), v.astype(np.float64), (1, 1), 2, 2, 0, 2) is None
    assert native_winograd.bind_input(x, v[:, :, :3], (1, 1), 2, 2, 0, 2) is None  # not (36, C, tiles)
    assert native_winograd.bind_input(x, v, (1, 1), 2, 2, 0, 2, m=2) is None  # F2's V is (16, C, tiles)
    assert native_winograd.bind_input(x, np.zeros((16, 2, 16), np.float32), (1, 1), 4, 4, 0, 2, m=2) is not None
    assert native_winograd.bind_input(x[:, :, :, ::2], v, (1, 1), 2, 2, 0, 2) is None  # not contiguous


def test_declines_where_native_gemm_does_not_run(monkeypatch):
    monkeypatch.setattr(native_gemm, "available", lambda: False)
    x = np.zeros((1, 2, 8, 8), np.float32)
    assert native_winograd.bind_input(x, np.zeros((36, 2, 4), np.float32), (1, 1), 2, 2, 0, 2) is None


def untransformed(p, bias, out_shape, tile_rows, tile_cols, activation, residual=None):
    """act(A^T P A + bias [+ residual]) of each tile's products p (36, M, N * tiles) in
    float64, tiles placed at 4 i, 4 j of out (N, M, OH, OW) and cropped; and the largest
    |A^T| |P| |A| (the sums' terms' scale, which float32's rounding is relative to)."""
    n, m, oh, ow = out_shape
    at = winograd.TRANSFORMS[4][2]

    def placed(t, q):
        tiles = q.astype(np.float64).reshape(6, 6, m, n, tile_rows, tile_cols)
        return np.einsum("rk,ksmnij,cs->nmirjc", t, tiles, t).reshape(n, m, 4 * tile_rows, 4 * tile_cols)
    y = placed(at, p)[:, :, :oh, :ow] + bias.astype(np.float64)[:, None, None]
    terms = np.nanmax(placed(np.abs(at), np.abs(p))) + np.abs(bias).max()
    if residual is not None:
        y = y + residual
        terms += np.abs(residual).max()
    return {"": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6)}[activation], terms


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), m=st.integers(1, 5), oh=st.integers(1, 50), ow=st.integers(21, 70),
       activation=st.sampled_from(["", "relu", "relu6"]), residual=st.booleans(), channels=st.data(),
       seed=st.integers(0, 2 ** 16))
def test_output_transform(n, m, oh, ow, activation, residual, channels, seed):
    """Planes of OUTPUT_MIN_TILE_COLS tile columns and more (a last group of 8 tiles
    overlapping the one before where they are 8 or more), rows and columns cropped at the
    plane's edge (OH, OW not multiples of 4), images, each activation, with and without a
    residual (a ResNet block's add, before the activation), and a range of output channels
    (the others left as they were): float64's values within float32 rounding, and jit.py's
    loop's (which takes no residual); with a residual, bit for bit the transform without it,
    then numpy's add and clip."""
    m0 = channels.draw(st.integers(0, m - 1))
    m1 = channels.draw(st.integers(m0 + 1, m))
    rows, cols = -(-oh // 4), -(-ow // 4)
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((36, m, n * rows * cols)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    res = rng.standard_normal((n, m, oh, ow)).astype(np.float32) if residual else None
    out = np.full((n, m, oh, ow), np.nan, np.float32)
    native_winograd.bind_output(p, bias, out, rows, cols, activation, m0, m1, res)()
    want, scale = untransformed(p, bias, out.shape, rows, cols, activation, res)
    np.testing.assert_allclose(out[:, m0:m1], want[:, m0:m1], rtol=0, atol=1e-6 * scale)
    assert np.isnan(out[:, :m0]).all() and np.isnan(out[:, m1:]).all()
    if not residual:
        loop = np.full_like(out, np.nan)
        jit.bind_winograd_output(p, bias, loop, 4, rows, cols, activation, m0, m1)()
        np.testing.assert_allclose(out[:, m0:m1], loop[:, m0:m1], rtol=0, atol=1e-6 * scale)
    else:
        plain = np.full_like(out, np.nan)
        native_winograd.bind_output(p, bias, plain, rows, cols, "", m0, m1)()
        added = plain + res
        added = {"": added, "relu": np.maximum(added, 0), "relu6": np.clip(added, 0, 6)}[activation]
        np.testing.assert_array_equal(out[:, m0:m1], added[:, m0:m1])


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("n, m, oh, ow", [(1, 3, 56, 56), (2, 2, 28, 28), (1, 2, 24, 64)])
def test_output_transform_of_whole_layers(n, m, oh, ow):
    """ResNet-like planes (56x56: 14 tile columns, 28x28: 7) with relu, NaN kept by it."""
    rows, cols = -(-oh // 4), -(-ow // 4)
    rng = np.random.default_rng(oh)
    p = rng.standard_normal((36, m, n * rows * cols)).astype(np.float32)
    p[:, 0, 0] = np.nan  # tile (0, 0) of channel 0's first image: NaN throughout, through the clip
    bias = rng.standard_normal(m).astype(np.float32)
    out = np.empty((n, m, oh, ow), np.float32)
    native_winograd.bind_output(p, bias, out, rows, cols, "relu", 0, m)()
    want, scale = untransformed(p, bias, out.shape, rows, cols, "relu")
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * scale)
    assert np.isnan(out[0, 0, :4, :4]).all() and not np.isnan(out[0, 0, 4:]).any()


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_output_transform_declines_what_it_does_not_take():
    """Narrow planes (fewer than OUTPUT_MIN_TILE_COLS tile columns: jit.py's loop is as fast),
    more products than OUTPUT_MAX_PRODUCTS, activations other than relu and relu6, float64,
    a residual not of out's shape, dtype and layout: None."""
    p, bias = np.zeros((36, 2, 2 * 7), np.float32), np.zeros(2, np.float32)
    out = np.zeros((1, 2, 8, 28), np.float32)
    assert native_winograd.bind_output(p, bias, out, 2, 7, "relu", 0, 2) is not None
    assert native_winograd.bind_output(p, bias, out, 2, 7, "swish", 0, 2) is None
    assert native_winograd.bind_output(p, bias, out.astype(np.float64), 2, 7, "", 0, 2) is None
    narrow = np.zeros((36, 2, 4 * 4), np.float32)
    assert native_winograd.bind_output(narrow, bias, np.zeros((1, 2, 16, 16), np.float32), 4, 4, "", 0, 2) is None
    many = native_winograd.OUTPUT_MAX_PRODUCTS // (36 * 2 * 14 * 14) + 1  # images of 56x56
    large = np.zeros((36, 2, many * 14 * 14), np.float32)
    assert native_winograd.bind_output(large, bias, np.zeros((many, 2, 56, 56), np.float32), 14, 14, "", 0, 2) is None
    one = np.zeros((36, 2, 14 * 14), np.float32)
    assert native_winograd.bind_output(one, bias, np.zeros((1, 2, 56, 56), np.float32), 14, 14, "", 0, 2) is not None
    for residual in (np.zeros((1, 2, 56, 55), np.float32), np.zeros((1, 2, 56, 56)),
                     np.zeros((1, 2, 56, 112), np.float32)[..., ::2]):  # another shape, float64, strided
        assert native_winograd.bind_output(one, bias, np.zeros((1, 2, 56, 56), np.float32), 14, 14, "", 0, 2,
                                           residual) is None
