"""DFT, STFT, window and mel filter-bank nodes (edgeflow/ops/signal.py)."""
import numpy as np

from edgeflow.errors import ConversionError
from edgeflow.graph.math_ops import apply

from . import attrs_or_operands, first_int, handler


@handler("DFT", op="dft")
def _dft(ctx, node):
    """Axis: an attribute (default 1) before opset 20, then an input (default -2); it and
    dft_length become attributes, or operands where they are known only when running."""
    x, out = ctx.input(node, 0), node.outputs[0]
    attrs = {"inverse": bool(node.attr("inverse", 0)), "onesided": bool(node.attr("onesided", 0))}
    if node.opset < 20:
        attrs["axis"] = node.attr("axis", 1)
        given = {"length": (1, first_int)}
    elif not ctx.has(node, 1) and ctx.has(node, 2) and ctx.value(node, 2) is None:
        # axis known only when running, no dft_length: operands go in order, 0 stands for it
        return apply("dft", [x, np.array(0, np.int64), ctx.input(node, 2)], attrs, name=out)
    else:
        given = {"length": (1, first_int), "axis": (2, first_int)}
    known, operands = attrs_or_operands(ctx, node, given)
    return apply("dft", [x, *operands], {**attrs, **known}, name=out)


@handler("STFT", op="stft")
def _stft(ctx, node):
    """frame_length, when absent, is the window's length, else the signal's."""
    signal, window = ctx.input(node, 0), ctx.input(node, 2)
    if ctx.has(node, 3):
        frame_length = ctx.input(node, 3)
    else:
        length = signal.shape[1] if window is None else window.shape[0]
        if length is None:
            raise ConversionError(f"{node.where()}: frame_length is absent and the "
                                  f"{'signal' if window is None else 'window'}'s length is dynamic")
        frame_length = np.array(length, np.int64)
    ins = [signal, ctx.input(node, 1), frame_length] + ([] if window is None else [window])
    return apply("stft", ins, {"onesided": bool(node.attr("onesided", 1))}, name=node.outputs[0])


def _output_dtype(node):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(node.attr("output_datatype", 1))


_WINDOWS = {"HannWindow": "hann", "HammingWindow": "hamming", "BlackmanWindow": "blackman"}


@handler({name: "window" for name in _WINDOWS})
def _window(ctx, node):
    return apply("window", [ctx.input(node, 0)], {"kind": _WINDOWS[node.op_type],
                                                 "periodic": bool(node.attr("periodic", 1)),
                                                 "dtype": _output_dtype(node)}, name=node.outputs[0])


@handler("MelWeightMatrix", op="mel_weight_matrix")
def _mel_weight_matrix(ctx, node):
    return apply("mel_weight_matrix", ctx.inputs(node), {"dtype": _output_dtype(node)}, name=node.outputs[0])
