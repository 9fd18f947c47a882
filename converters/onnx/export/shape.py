"""Ops that read shapes or make tensors from them (edgeflow/ops/shape.py)."""
import numpy as np

from edgeflow import dtypes

from . import exporter, tensor_proto

SAME = {"expand": "Expand", "tile": "Tile", "eye_like": "EyeLike"}
_END = 2 ** 62  # shape's default end: all dimensions


@exporter
def shape(g, op):
    attrs = {"start": op.attrs["start"]} if op.attrs["start"] else {}
    if op.attrs["end"] != _END:
        attrs["end"] = op.attrs["end"]
    g.node("Shape", op.inputs, op.outputs, **attrs)


@exporter
def constant_of_shape(g, op):
    fill = dtypes.array([op.attrs["value"]], op.attrs["dtype"])
    g.node("ConstantOfShape", [g.cast(op.inputs[0], op.input_specs[0].dtype, np.int64)], op.outputs,
           value=tensor_proto(fill, "value"))


@exporter
def range_(g, op):
    """Range takes scalars; edgeflow's range also takes one-element vectors."""
    g.node("Range", [g.scalar(name, spec.rank) for name, spec in zip(op.inputs, op.input_specs)], op.outputs)


@exporter
def split(g, op):
    if "sizes" in op.operands or op.attrs["sizes"]:
        g.node("Split", [op.inputs[0], g.given(op, "sizes", np.int64)], op.outputs, axis=op.attrs["axis"])
    else:
        g.node("Split", op.inputs, op.outputs, axis=op.attrs["axis"], num_outputs=op.attrs["num_outputs"])
