"""DFT, STFT, windows and the mel filter bank (edgeflow/ops/signal.py)."""
import numpy as np

from . import elem_type, exporter

WINDOWS = {"hann": "HannWindow", "hamming": "HammingWindow", "blackman": "BlackmanWindow"}


@exporter
def dft(g, op):
    """dft_length and axis as DFT's inputs; a length of 0 (an operand standing in for an
    absent one, or the attribute's default) is no length."""
    absent = _zero(op.value(1)) if "length" in op.operands else op.attrs["length"] == 0
    length = "" if absent else g.given(op, "length", np.int64)
    g.node("DFT", [op.inputs[0], length, g.given(op, "axis", np.int64)], op.outputs,
           inverse=int(op.attrs["inverse"]), onesided=int(op.attrs["onesided"]))


def _zero(value):
    return value is not None and not np.any(value)


@exporter
def stft(g, op):
    """STFT(signal, frame_step, window, frame_length): edgeflow takes the window last."""
    signal, step, length = op.inputs[:3]
    g.node("STFT", [signal, step, op.inputs[3] if len(op.inputs) > 3 else "", length], op.outputs,
           onesided=int(op.attrs["onesided"]))


@exporter
def window(g, op):
    g.node(WINDOWS[op.attrs["kind"]], op.inputs, op.outputs, periodic=int(op.attrs["periodic"]),
           output_datatype=elem_type(op.attrs["dtype"]))


@exporter
def mel_weight_matrix(g, op):
    g.node("MelWeightMatrix", op.inputs, op.outputs, output_datatype=elem_type(op.attrs["dtype"]))
