"""Ops that move, select or reinterpret elements (edgeflow/ops/array.py). Attributes that
ONNX takes as inputs (a target shape, slice bounds, axes) become int64 initializers; ops
that read them from operands pass those on."""
import numpy as np

from edgeflow.ops.array import slice_params

from . import exporter

SAME = {"transpose": "Transpose", "concat": "Concat", "gather": "Gather", "gather_elements": "GatherElements",
        "gather_nd": "GatherND", "scatter_elements": "ScatterElements", "scatter_nd": "ScatterND",
        "reverse_sequence": "ReverseSequence"}


def ints(g, values, name):
    return g.const(np.array(values, np.int64), name)


@exporter
def reshape(g, op):
    """allowzero=1 where a 0 is a zero-length dimension (copy_zeros off), which only a 0
    in the target makes differ."""
    shape = g.given(op, "shape", np.int64)
    explicit_zeros = not op.attrs["copy_zeros"] and ("shape" in op.operands or 0 in op.attrs["shape"])
    g.node("Reshape", [op.inputs[0], shape], op.outputs, allowzero=int(explicit_zeros))


@exporter
def squeeze(g, op):
    if "axes" in op.operands or op.attrs["axes"]:
        g.node("Squeeze", [op.inputs[0], g.given(op, "axes", np.int64)], op.outputs)
    else:
        g.node("Squeeze", op.inputs, op.outputs)


@exporter
def expand_dims(g, op):
    g.node("Unsqueeze", [op.inputs[0], g.given(op, "axes", np.int64)], op.outputs)


@exporter
def slice_(g, op):
    if op.operands:  # starts, ends, axes, steps known when running: ONNX's operands
        g.node("Slice", op.inputs, op.outputs)
        return
    starts, ends, axes, steps = slice_params(op.attrs)
    g.node("Slice", [op.inputs[0]] + [ints(g, v, k) for v, k in ((starts, "starts"), (ends, "ends"),
                                                                 (axes, "axes"), (steps, "steps"))], op.outputs)


@exporter
def one_hot(g, op):
    """OneHot(indices, depth, values): edgeflow takes depth last, as an operand or attribute."""
    indices, values = op.inputs[:2]
    g.node("OneHot", [indices, g.given(op, "depth", np.int64), values], op.outputs, axis=op.attrs["axis"])


@exporter
def trilu(g, op):
    k = op.inputs[1:] or ([ints(g, op.attrs["k"], "k")] if op.attrs["k"] else [])
    g.node("Trilu", [op.inputs[0], *k], op.outputs, upper=int(op.attrs["upper"]))
