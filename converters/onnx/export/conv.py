"""Convolutions (edgeflow/ops/conv.py): ONNX's own attributes and inputs; a fused
activation is written after the node (Graph._op)."""
from edgeflow.ops.conv import window_geometry

from . import exporter, onnx_attrs

SAME = {"conv_transpose": "ConvTranspose", "deform_conv": "DeformConv"}


def explicit_pads(op, kernel):
    """The op's attrs, automatic padding of a dilated window written as the pads it comes to
    where the input's spatial size is known (onnxruntime refuses SAME_* with dilations)."""
    attrs = op.attrs
    sizes = op.input_specs[0].shape[2:]
    if attrs["auto_pad"] in ("SAME_UPPER", "SAME_LOWER") and max(attrs["dilations"], default=1) > 1 \
            and None not in sizes:
        _, begin, end = window_geometry(op.opcode, sizes, kernel, attrs)
        attrs = {**attrs, "auto_pad": "NOTSET", "pads": begin + end}
    return attrs


@exporter
def conv(g, op):
    g.node("Conv", op.inputs, op.outputs, **onnx_attrs(explicit_pads(op, op.input_specs[1].shape[2:])))
