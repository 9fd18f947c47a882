"""Reductions, running sums and top-k (edgeflow/ops/reduce.py)."""
import numpy as np

from . import exporter

SAME = {"argmax": "ArgMax", "argmin": "ArgMin"}
REDUCE = {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean", "reduce_max": "ReduceMax",
          "reduce_min": "ReduceMin", "reduce_prod": "ReduceProd", "reduce_l2": "ReduceL2",
          "reduce_log_sum_exp": "ReduceLogSumExp"}


@exporter(REDUCE)
def reduce(g, op):
    """Axes as ONNX's input (none: all axes, or none with noop_with_empty_axes)."""
    axes = [g.given(op, "axes", np.int64)] if "axes" in op.operands or op.attrs["axes"] else []
    g.node(REDUCE[op.opcode], [op.inputs[0], *axes], op.outputs, keepdims=int(op.attrs["keepdims"]),
           noop_with_empty_axes=int(op.attrs["noop_with_empty_axes"]))


@exporter
def cumsum(g, op):
    g.node("CumSum", [op.inputs[0], g.given(op, "axis", np.int64)], op.outputs, exclusive=int(op.attrs["exclusive"]),
           reverse=int(op.attrs["reverse"]))


@exporter
def topk(g, op):
    g.node("TopK", [op.inputs[0], g.given(op, "k", np.int64, (1,))], op.outputs, axis=op.attrs["axis"],
           largest=int(op.attrs["largest"]), sorted=int(op.attrs["sorted"]))
