"""edgeflow/interp/kernels/native_winograd.py's F(4x4, 3x3) input transform against B^T d B
of each tile evaluated here in float64 (numpy, from winograd.py's B^T), and against jit.py's
loop. It runs where native_gemm does (x86-64 with AVX2 and FMA); elsewhere bind_input
declines and the loop runs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeflow.interp.kernels import jit, native_gemm, native_winograd, winograd

HERE = native_gemm.available()


def transformed(x, top, left, tile_rows, tile_cols):
    """V (36, C, N * tiles) in float64: B^T d B of each 6x6 tile d of x zero-padded."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, 4 * tile_rows + 2 + h + top, 4 * tile_cols + 2 + w + left))
    padded[:, :, top:top + h, left:left + w] = x
    windows = np.lib.stride_tricks.sliding_window_view(padded, (6, 6), axis=(2, 3))[:, :, ::4, ::4]
    d = windows[:, :, :tile_rows, :tile_cols]  # (N, C, TH, TW, 6, 6)
    bt = winograd.TRANSFORMS[4][0]
    v = np.einsum("kr,ncijrs,ts->ktncij", bt, d, bt)  # (6, 6, N, C, TH, TW)
    return v.transpose(0, 1, 3, 2, 4, 5).reshape(36, c, n * tile_rows * tile_cols)


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(1, 40), w=st.integers(1, 40),
       top=st.integers(0, 2), left=st.integers(0, 2), tile_rows=st.integers(1, 11), tile_cols=st.integers(1, 11),
       channels=st.data(), seed=st.integers(0, 2 ** 16))
def test_input_transform(n, c, h, w, top, left, tile_rows, tile_cols, channels, seed):
    """Planes narrower and wider than a vector's 8 tiles (the last group overlapping the one
    before), rows and columns of x past the tiles' reach and tiles past x's edge, pads, images
    and a range of channels (the others left as they were): float64's values within float32
    rounding, and jit.py's loop's."""
    c0 = channels.draw(st.integers(0, c - 1))
    c1 = channels.draw(st.integers(c0 + 1, c))
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    v = np.full((36, c, n * tile_rows * tile_cols), np.nan, np.float32)
    native_winograd.bind_input(x, v, (top, left), tile_rows, tile_cols, c0, c1)()
    want = transformed(x.astype(np.float64), top, left, tile_rows, tile_cols)
    scale = np.abs(want[:, c0:c1]).max() + 1e-30
    np.testing.assert_allclose(v[:, c0:c1], want[:, c0:c1], rtol=0, atol=1e-6 * scale)
    assert np.isnan(v[:, :c0]).all() and np.isnan(v[:, c1:]).all()
    assert jit.available()
    loop = np.full_like(v, np.nan)
    jit.bind_winograd_input(x, loop, 4, (top, left), tile_rows, tile_cols, c0, c1)()
    np.testing.assert_allclose(v[:, c0:c1], loop[:, c0:c1], rtol=0, atol=1e-6 * scale)


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("n, c, h, w, pads", [(1, 3, 56, 56, 1), (2, 2, 28, 28, 1), (1, 4, 14, 14, 1), (1, 5, 7, 7, 1),
                                              (1, 2, 37, 45, 0), (1, 2, 33, 64, 2)])
def test_input_transform_of_whole_layers(n, c, h, w, pads):
    """ResNet-like planes (56 x 56: 14 tiles a row, two groups of 8, the second overlapping;
    28: 7; 14: 4; 7: 2) and odd ones, the tiles a 'same' conv's: float64's values."""
    x = np.random.default_rng(h * w).standard_normal((n, c, h, w)).astype(np.float32)
    rows, cols = -(-(h + 2 * pads - 2) // 4), -(-(w + 2 * pads - 2) // 4)
    v = np.full((36, c, n * rows * cols), np.nan, np.float32)
    native_winograd.bind_input(x, v, (pads, pads), rows, cols, 0, c)()
    want = transformed(x.astype(np.float64), pads, pads, rows, cols)
    np.testing.assert_allclose(v, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.skipif(not HERE, reason="native_gemm runs on x86-64 with AVX2 and FMA")
def test_input_transform_declines_what_it_does_not_take():
    x = np.zeros((1, 2, 8, 8), np.float32)
    v = np.zeros((36, 2, 4), np.float32)
    assert native_winograd.bind_input(x, v, (1, 1), 2, 2, 0, 2) is not None
    assert native_winograd.bind_input(x.astype(np.float64), v.astype(np.float64), (1, 1), 2, 2, 0, 2) is None
    assert native_winograd.bind_input(x, v[:, :, :3], (1, 1), 2, 2, 0, 2) is None  # not (36, C, tiles)
    assert native_winograd.bind_input(x[:, :, :, ::2], v, (1, 1), 2, 2, 0, 2) is None  # not contiguous


def test_declines_where_native_gemm_does_not_run(monkeypatch):
    monkeypatch.setattr(native_gemm, "available", lambda: False)
    x = np.zeros((1, 2, 8, 8), np.float32)
    assert native_winograd.bind_input(x, np.zeros((36, 2, 4), np.float32), (1, 1), 2, 2, 0, 2) is None
