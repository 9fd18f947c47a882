"""Signal processing: discrete Fourier transforms (dft, stft), window functions and the mel
filter bank (ONNX's DFT, STFT, Hann/Hamming/BlackmanWindow, MelWeightMatrix).

edgeflow has no complex dtype: as in ONNX, a complex tensor is a real one with a trailing
dimension of 2 (real, imaginary), and a real signal may be given with a trailing 1.
Operands that decide an output's length (a DFT length, a window size) are `index`
tensors, as in shape.py: the length is unknown (None) while their value is.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define
from .dims import fmt
from .shape import known_ints

# Window kind -> (a0, a1, a2) of w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N).
WINDOWS = {"hann": (0.5, 0.5, 0.0), "hamming": (25 / 46, 21 / 46, 0.0), "blackman": (0.42, 0.5, 0.08)}


def _scalar(op, spec, what):
    """The value of a scalar `index` operand, or None while it is unknown."""
    values = known_ints(op, spec, what)
    if values is not None and len(values) != 1:
        raise GraphError(f"{op}: {what} must be a scalar, got {fmt(spec.shape)}")
    return None if values is None else values[0]


def _complex_dim(op, spec, what):
    if spec.rank < 2 or spec.shape[-1] not in (1, 2, None):
        raise GraphError(f"{op}: {what} must end in a dimension of 1 (real) or 2 (complex), "
                         f"got {fmt(spec.shape)}")


def dft_axis(axis, rank):
    """`axis` as a non-negative axis of a signal of `rank` (its last axis holds real and
    imaginary parts, and is no signal axis); GraphError outside [-rank, -2] or [0, rank-2]."""
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise GraphError(f"dft: axis {axis} out of range for rank {rank}; expected [{-rank}, -2] or "
                         f"[0, {rank - 2}] (the last axis holds real and imaginary parts)")
    return axis % rank


def dft_length(x_len, length, inverse, onesided):
    """The transform's length n: `length` if given, else the axis's (2 (len - 1) for an
    inverse one-sided transform); None while unknown."""
    if length is not None:
        return length
    if x_len is None:
        return None
    return 2 * (x_len - 1) if inverse and onesided else x_len


def _dft_unknown(own, attrs, operands):
    """While the length (or the axis) is known only when running: that axis is ? (all are)."""
    x = own[0]
    last = 1 if attrs["inverse"] and attrs["onesided"] else 2
    if len(operands) > 1 and operands[1].value is None:
        return [TensorSpec((None,) * (x.rank - 1) + (last,), x.dtype)]
    axis = dft_axis(attrs["axis"] if len(operands) < 2 else int(np.asarray(operands[1].value).reshape(())), x.rank)
    return [TensorSpec(x.shape[:axis] + (None,) + x.shape[axis + 1:-1] + (last,), x.dtype)]


@define("dft", types=Types("x: T, length: index?, axis: index? -> T", T=dtypes.FLOATS),
        attrs={"axis": Attr(AttrKind.INT, -2), "inverse": Attr(AttrKind.BOOL, False),
               "onesided": Attr(AttrKind.BOOL, False), "length": Attr(AttrKind.INT, 0)},
        operands=("length", "axis"), unknown=_dft_unknown)
def _dft(inputs, attrs):
    """DFT of x along `axis` (x[..., 1] real or x[..., 2] complex), zero-padded or cut to
    `length` (0: the axis's length); inverse divides by it. onesided: forward keeps bins 0..n//2 (complex out);
    inverse takes them and gives the real signal (x[..., 1])."""
    x = inputs[0]
    _complex_dim("dft", x, "x")
    axis = dft_axis(attrs["axis"], x.rank)
    inverse, onesided = attrs["inverse"], attrs["onesided"]
    if attrs["length"] < 0:
        raise GraphError(f"dft: length must be at least 1, got {attrs['length']}")
    n = dft_length(x.shape[axis], attrs["length"] or None, inverse, onesided)
    if n is not None and n < 1:
        raise GraphError(f"dft: an inverse one-sided transform of {x.shape[axis]} bins has no default length; "
                         "give one")
    out = n if inverse or not onesided or n is None else n // 2 + 1
    last = 1 if inverse and onesided else 2
    return [TensorSpec(x.shape[:axis] + (out,) + x.shape[axis + 1:-1] + (last,), x.dtype)]


def stft_frames(length, frame_step, frame_length):
    return None if None in (length, frame_step, frame_length) else (length - frame_length) // frame_step + 1


@define("stft", types=Types("signal: T, frame_step: index, frame_length: index, window: T? -> T", T=dtypes.FLOATS),
        attrs={"onesided": Attr(AttrKind.BOOL, True)})
def _stft(inputs, attrs):
    """Short-time Fourier transform of signal [batch, length, 1 or 2]: frames of
    `frame_length` every `frame_step` samples, times `window` (default ones), each
    transformed: [batch, frames, bins, 2], bins frame_length // 2 + 1 when onesided."""
    signal, step_spec, length_spec = inputs[:3]
    if signal.rank != 3:
        raise GraphError(f"stft: signal must be [batch, length, 1 or 2], got {fmt(signal.shape)}")
    _complex_dim("stft", signal, "signal")
    step = _scalar("stft", step_spec, "frame_step")
    frame = _scalar("stft", length_spec, "frame_length")
    if step is not None and step < 1:
        raise GraphError(f"stft: frame_step must be at least 1, got {step}")
    if frame is not None and (frame < 1 or (signal.shape[1] is not None and frame > signal.shape[1])):
        raise GraphError(f"stft: frame_length {frame} must be in [1, {signal.shape[1]}] (the signal's length)")
    if len(inputs) > 3:
        window = inputs[3]
        if window.rank != 1 or (None not in (frame, window.shape[0]) and window.shape[0] != frame):
            raise GraphError(f"stft: window must be a vector of frame_length {frame} values, "
                             f"got {fmt(window.shape)}")
    bins = None if frame is None else frame // 2 + 1 if attrs["onesided"] else frame
    frames = stft_frames(signal.shape[1], step, frame)
    return [TensorSpec((signal.shape[0], frames, bins, 2), signal.dtype)]


@define("window", types=Types("size: index -> dtype", dtype=dtypes.NUMERIC),
        attrs={"kind": Attr(AttrKind.STRING), "periodic": Attr(AttrKind.BOOL, True),
               "dtype": Attr(AttrKind.DTYPE, dtypes.float32)})
def _window(inputs, attrs):
    """A window of `size` values: w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N =
    size (periodic) or size - 1, with (a0, a1, a2) of `kind` (WINDOWS: hann, hamming,
    blackman); computed in float64, then cast to `dtype` (integers truncate)."""
    if attrs["kind"] not in WINDOWS:
        raise GraphError(f"window: kind {attrs['kind']!r}; expected one of {', '.join(WINDOWS)}")
    size = _scalar("window", inputs[0], "size")
    if size is not None and size < 0:
        raise GraphError(f"window: size must be >= 0, got {size}")
    return [TensorSpec((size,), attrs["dtype"])]


@define("mel_weight_matrix", types=Types("num_mel_bins: index, dft_length: index, sample_rate: index, "
                                         "lower_edge_hertz: T, upper_edge_hertz: T -> dtype",
                                         T=dtypes.FLOATS, dtype=dtypes.NUMERIC),
        attrs={"dtype": Attr(AttrKind.DTYPE, dtypes.float32)})
def _mel_weight_matrix(inputs, attrs):
    """[dft_length // 2 + 1, num_mel_bins] triangular filters, peak 1, evenly spaced on the mel
    scale (mel(f) = 2595 log10(1 + f / 700)) from lower_edge_hertz to upper_edge_hertz, that
    map a one-sided spectrum to mel bands (ONNX's MelWeightMatrix)."""
    for spec, what in zip(inputs[2:], ("sample_rate", "lower_edge_hertz", "upper_edge_hertz")):
        if spec.rank > 1 or (spec.rank == 1 and spec.shape[0] not in (1, None)):
            raise GraphError(f"mel_weight_matrix: {what} must be a scalar, got {fmt(spec.shape)}")
    mels = _scalar("mel_weight_matrix", inputs[0], "num_mel_bins")
    length = _scalar("mel_weight_matrix", inputs[1], "dft_length")
    if mels is not None and mels < 1 or length is not None and length < 1:
        raise GraphError(f"mel_weight_matrix: num_mel_bins ({mels}) and dft_length ({length}) must be >= 1")
    return [TensorSpec((None if length is None else length // 2 + 1, mels), attrs["dtype"])]
