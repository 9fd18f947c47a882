"""Kernels of edgeflow/ops/signal.py (numpy.fft)."""
from functools import partial

import numpy as np

from ...ops.signal import WINDOWS, dft_axis, dft_length
from . import kernel


def _complex(x):
    """x[..., 1] or x[..., 2] as a complex array (float16 computed in float32)."""
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _store(z, out):
    out[..., 0] = z.real
    if out.shape[-1] == 2:
        out[..., 1] = z.imag


@kernel("dft")
def _dft(ins, outs, attrs):
    x, out = ins[0], outs[0]
    axis = dft_axis(attrs["axis"], x.ndim)
    inverse, onesided = attrs["inverse"], attrs["onesided"]
    n = dft_length(x.shape[axis], attrs["length"] or None, inverse, onesided)

    def run():
        z = _complex(x)
        if inverse:
            y = np.fft.irfft(z, n, axis) if onesided else np.fft.ifft(z, n, axis)
        elif onesided and x.shape[-1] == 1:
            y = np.fft.rfft(z, n, axis)
        else:
            y = np.fft.fft(z, n, axis)
            if onesided:  # a complex signal has no symmetric spectrum: its first half, as ONNX's reference
                y = y[(slice(None),) * axis + (slice(0, n // 2 + 1),)]
        _store(y, out)
    return run


@kernel("stft")
def _stft(ins, outs, attrs):
    signal, out = ins[0], outs[0]
    window = ins[3] if len(ins) > 3 else None
    onesided, frames = attrs["onesided"], out.shape[1]

    def run():
        step, frame = int(ins[1].reshape(())), int(ins[2].reshape(()))
        # [batch, positions, 1 or 2, frame_length]: every window position, then every step-th one.
        views = np.lib.stride_tricks.sliding_window_view(signal, frame, axis=1)[:, :frames * step:step]
        z = _complex(np.moveaxis(views, 2, 3))
        if window is not None:
            z = z * window
        _store(np.fft.rfft(z, axis=-1) if onesided and signal.shape[-1] == 1 else
               np.fft.fft(z, axis=-1)[..., :out.shape[2]], out)
    return run


@kernel("window")
def _window(ins, outs, attrs):
    out, periodic = outs[0], attrs["periodic"]
    a0, a1, a2 = WINDOWS[attrs["kind"]]

    def run():
        size = out.shape[0]
        with np.errstate(divide="ignore", invalid="ignore"):  # size 1, symmetric: 0 / 0, as ONNX's function
            angle = np.arange(size) * (2 * np.pi / np.float64(size if periodic else size - 1))
            # a0 added last, as ONNX's reference does: Blackman's peak is then exactly 1 (an integer window keeps it)
            w = (a2 * np.cos(2 * angle) - a1 * np.cos(angle)) + a0
            np.copyto(out, w, casting="unsafe")
    return run


def _mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower, upper, out):
    mels, n, rate = (int(v.reshape(())) for v in (num_mel_bins, dft_length, sample_rate))
    low, high = (2595 * np.log10(1 + float(v.reshape(())) / 700) for v in (lower, upper))
    # num_mel_bins + 2 edges evenly spaced in mel, mapped to hertz, then to spectrum bins.
    edges = low + np.arange(mels + 2) * ((high - low) / (mels + 2))
    hertz = 700 * (10 ** (edges / 2595) - 1)
    bins = np.floor((n + 1) * hertz / rate).astype(np.int64)
    left, center, right = bins[:-2], bins[1:-1], bins[2:]
    j = np.arange(out.shape[0])[:, None]
    rising = np.where((j >= left) & (j < center), (j - left) / np.maximum(center - left, 1), 0.0)
    falling = np.where((j > center) & (j < right), (right - j) / np.maximum(right - center, 1), 0.0)
    peak = (j == center) & ((center >= left) | (right > center))  # none when the edges run backwards
    np.copyto(out, rising + falling + peak, casting="unsafe")


@kernel("mel_weight_matrix")
def _mel_weight_matrix_kernel(ins, outs, attrs):
    return partial(_mel_weight_matrix, *ins, outs[0])
