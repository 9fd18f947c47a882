"""dft, stft, window and mel_weight_matrix against closed forms written here: the DFT as
its sum (a matrix of exp(-2 pi i k n / N), no FFT), frames cut one by one, the window
formulas, and the mel filter bank built triangle by triangle in Python."""
import math

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close, random_array

INTEGERS = ("int8", "int16", "int32", "int64", "uint8")


def op(name, *constants, **attrs):
    return lambda *ts: apply(name, list(ts) + [np.asarray(c) for c in constants], attrs)


def dft_matrix(n_out, n_in, n, inverse=False):
    """[n_out, n_in]: exp(-+2 pi i k m / n) for k < n_out, m < n_in (inverse: / n)."""
    k, m = np.arange(n_out)[:, None], np.arange(n_in)[None, :]
    w = np.exp((2j if inverse else -2j) * np.pi * k * m / n)
    return w / n if inverse else w


def as_complex(x):
    x = x.astype(np.float64)
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def as_pairs(z):
    return np.stack([z.real, z.imag], -1)


def reference_dft(x, axis, n=None, inverse=False, onesided=False):
    """The DFT's sum along `axis` (an axis of x without its trailing 1 or 2)."""
    z = np.moveaxis(as_complex(x), axis, -1)
    length = z.shape[-1]
    if inverse and onesided:
        n = n or 2 * (length - 1)
        # The real signal whose one-sided spectrum is z: the spectrum completed by symmetry.
        half = np.zeros(z.shape[:-1] + (n // 2 + 1,), complex)
        m = min(length, n // 2 + 1)
        half[..., :m] = z[..., :m]
        full = np.concatenate([half, np.conj(half[..., 1:(n + 1) // 2][..., ::-1])], -1)
        full[..., 0] = full[..., 0].real
        if n % 2 == 0:
            full[..., n // 2] = full[..., n // 2].real
        y = (full @ dft_matrix(n, n, n, inverse=True).T).real[..., None]
        return np.moveaxis(y, -2, axis)
    n = n or length
    used = min(length, n)
    y = z[..., :used] @ dft_matrix(n // 2 + 1 if onesided else n, used, n, inverse).T
    return np.moveaxis(as_pairs(y), -2, axis)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("last", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -2, -3])
def test_dft_forward_and_inverse(run_op, rng, dtype, last, axis):
    x = random_array(rng, (3, 6, last), dtype, -2, 2)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == "float16" else {}
    for inverse in (False, True):
        expected = reference_dft(x, axis % x.ndim, inverse=inverse)
        assert_close(run_op(op("dft", axis=axis, inverse=inverse), x), expected, dtype, **tol)


@pytest.mark.parametrize("length", [4, 7, 9, 12])
def test_dft_length_pads_or_cuts(run_op, rng, length):
    x = random_array(rng, (2, 7, 2), "float64", -2, 2)
    for inverse in (False, True):
        assert_close(run_op(op("dft", np.int64(length), axis=1, inverse=inverse), x),
                     reference_dft(x, 1, length, inverse=inverse), "float64")


@pytest.mark.parametrize("length", [None, 6, 7, 10])
@pytest.mark.parametrize("last", [1, 2])
def test_dft_onesided(run_op, rng, length, last):
    x = random_array(rng, (7, 3, last), "float32", -2, 2)
    extra = () if length is None else (np.int32(length),)
    assert_close(run_op(op("dft", *extra, axis=0, onesided=True), x), reference_dft(x, 0, length, onesided=True),
                 "float32", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [None, 6, 7, 10])
def test_dft_inverse_onesided_gives_the_real_signal(run_op, rng, length):
    x = random_array(rng, (4, 5, 2), "float64", -2, 2)
    extra = () if length is None else (np.int64(length),)
    y = run_op(op("dft", *extra, axis=-2, inverse=True, onesided=True), x)
    assert y.shape == (4, length or 8, 1)
    assert_close(y, reference_dft(x, 1, length, inverse=True, onesided=True), "float64")


def test_dft_round_trip(run_op, rng):
    signal = random_array(rng, (2, 10, 1), "float64", -2, 2)
    spectrum = run_op(op("dft", axis=1, onesided=True), signal)
    assert_close(run_op(op("dft", np.int64(10), axis=1, inverse=True, onesided=True), spectrum), signal, "float64")


def test_dft_rejects_what_it_cannot_take(graph):
    with pytest.raises(GraphError, match=r"dft: axis 2 out of range for rank 3; expected \[-3, -2\] or \[0, 1\]"):
        apply("dft", [ef.placeholder("float32", (2, 3, 2))], {"axis": 2})
    with pytest.raises(GraphError, match=r"dft: x must end in a dimension of 1 \(real\) or 2 \(complex\)"):
        apply("dft", [ef.placeholder("float32", (2, 3, 3))], {"axis": 1})
    with pytest.raises(GraphError, match=r"dft: length must be at least 1, got -1"):
        apply("dft", [ef.placeholder("float32", (2, 3, 2)), np.int64(-1)], {"axis": 1})
    with pytest.raises(GraphError, match=r"dft: x: dtype int32 not supported"):
        apply("dft", [ef.placeholder("int32", (2, 3, 2))], {"axis": 1})


def test_dft_length_unknown_while_building(graph):
    n = ef.placeholder("int64", ())
    y = apply("dft", [ef.placeholder("float32", (2, 3, 1)), n], {"axis": 1})
    assert y.shape == (2, None, 2)


def reference_stft(signal, step, frame, window=None, onesided=True):
    z = as_complex(signal)
    frames = (z.shape[1] - frame) // step + 1
    cut = np.stack([z[:, f * step:f * step + frame] for f in range(frames)], 1)  # [batch, frames, frame]
    if window is not None:
        cut = cut * window.astype(np.float64)
    bins = frame // 2 + 1 if onesided else frame
    return as_pairs(cut @ dft_matrix(bins, frame, frame).T)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("step, frame", [(4, 8), (3, 7), (5, 5), (1, 16)])
@pytest.mark.parametrize("windowed", [False, True])
def test_stft_real(run_op, rng, dtype, step, frame, windowed):
    signal = random_array(rng, (2, 23, 1), dtype, -1, 1)
    window = random_array(rng, (frame,), dtype, 0, 1) if windowed else None
    extra = (window,) if windowed else ()
    y = run_op(op("stft", np.int64(step), np.int64(frame), *extra), signal)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == "float16" else {"rtol": 1e-4, "atol": 1e-5}
    assert_close(y, reference_stft(signal, step, frame, window), dtype, **tol)


@pytest.mark.parametrize("onesided", [False, True])
def test_stft_complex_and_two_sided(run_op, rng, onesided):
    signal = random_array(rng, (3, 20, 2), "float64", -1, 1)
    y = run_op(op("stft", np.int32(3), np.int32(6), onesided=onesided), signal)
    assert_close(y, reference_stft(signal, 3, 6, onesided=onesided), "float64")


def test_stft_rejects_what_it_cannot_take(graph):
    s = ef.placeholder("float32", (1, 16, 1))
    with pytest.raises(GraphError, match=r"stft: window must be a vector of frame_length 8 values, got \(4\)"):
        apply("stft", [s, np.int64(2), np.int64(8), ef.placeholder("float32", (4,))])
    with pytest.raises(GraphError, match=r"stft: frame_length 17 must be in \[1, 16\]"):
        apply("stft", [s, np.int64(2), np.int64(17)])
    with pytest.raises(GraphError, match=r"stft: frame_step must be at least 1, got 0"):
        apply("stft", [s, np.int64(0), np.int64(4)])
    with pytest.raises(GraphError, match=r"stft: signal must be \[batch, length, 1 or 2\]"):
        apply("stft", [ef.placeholder("float32", (16, 1)), np.int64(2), np.int64(4)])


# kind -> w(n, N) on Python floats: torch's and scipy's definitions
WINDOW_FORMULAS = {
    "hann": lambda n, N: math.sin(math.pi * n / N) ** 2,
    "hamming": lambda n, N: 25 / 46 - 21 / 46 * math.cos(2 * math.pi * n / N),
    "blackman": lambda n, N: 0.42 - 0.5 * math.cos(2 * math.pi * n / N) + 0.08 * math.cos(4 * math.pi * n / N),
}


@pytest.mark.parametrize("kind", WINDOW_FORMULAS)
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
def test_windows(run_op, kind, periodic, dtype):
    size = 9
    N = size if periodic else size - 1
    values = np.array([WINDOW_FORMULAS[kind](n, N) for n in range(size)])
    y = run_op(op("window", np.int64(size), kind=kind, periodic=periodic, dtype=dtype))
    if np.dtype(dtype).kind == "f":
        assert_close(y, values, dtype, atol=1e-3 if dtype == "float16" else 1e-7)
    else:  # integers truncate toward zero: 1 at the peak (exactly 1, though a float sum may miss it), else 0
        assert_close(y, np.trunc(values + 1e-12), dtype)


def test_window_of_size_zero_and_one(run_op):
    assert run_op(op("window", np.int32(0), kind="hann")).shape == (0,)
    assert_close(run_op(op("window", np.int32(1), kind="hamming")), [25 / 46 - 21 / 46], "float32")


def test_window_rejects_an_unknown_kind(graph):
    with pytest.raises(GraphError, match=r"window: kind 'kaiser'; expected one of hann, hamming, blackman"):
        apply("window", [np.int64(4)], {"kind": "kaiser"})


def reference_mel(mels, n, rate, low_hz, high_hz):
    """The filter bank triangle by triangle, on Python floats and ints."""
    def mel(f):
        return 2595 * math.log10(1 + f / 700)
    low, high = mel(low_hz), mel(high_hz)
    edges = [low + i * (high - low) / (mels + 2) for i in range(mels + 2)]
    bins = [math.floor((n + 1) * 700 * (10 ** (m / 2595) - 1) / rate) for m in edges]
    out = np.zeros((n // 2 + 1, mels))
    for i in range(mels):
        left, center, right = bins[i:i + 3]
        for j in range(left, center):
            out[j, i] = (j - left) / (center - left)
        out[center, i] = 1.0
        for j in range(center + 1, right):
            out[j, i] = (right - j) / (right - center)
    return out


@pytest.mark.parametrize("mels, n, rate, low, high", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 8000.0),
                                                      (5, 33, 22050, 300.0, 9000.0), (3, 8, 8000, 0.0, 4000.0)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mel_weight_matrix(run_op, mels, n, rate, low, high, dtype):
    def fn(rate, low, high):  # the sizes constant, the rest fed at run time
        return apply("mel_weight_matrix", [np.int64(mels), np.int64(n), rate, low, high], {"dtype": dtype})
    y = run_op(fn, np.int32(rate), np.array(low, dtype), np.array(high, dtype))
    assert_close(y, reference_mel(mels, n, rate, low, high), dtype)


def test_mel_weight_matrix_integer_output(run_op):
    def fn(rate):
        return apply("mel_weight_matrix", [np.int64(8), np.int64(16), rate, np.float32(0), np.float32(4096)],
                     {"dtype": "int32"})
    y = run_op(fn, np.int64(8192))
    assert_close(y, np.trunc(reference_mel(8, 16, 8192, 0.0, 4096.0)), "int32")


def test_mel_weight_matrix_shape_from_constant_sizes(graph):
    y = apply("mel_weight_matrix", [np.int64(4), np.int64(20), ef.placeholder("int64", ()),
                                    ef.placeholder("float32", ()), ef.placeholder("float32", ())])
    assert y.shape == (11, 4) and y.dtype == np.float32
