"""Pooling (edgeflow/ops/pool.py). max_pool_indices is MaxPool's Indices output."""
import numpy as np

from . import exporter, onnx_attrs
from .conv import explicit_pads

POOLS = {"max_pool": "MaxPool", "avg_pool": "AveragePool", "lp_pool": "LpPool"}


@exporter(POOLS)
def pool(g, op):
    g.node(POOLS[op.opcode], op.inputs, op.outputs, **onnx_attrs(explicit_pads(op, op.attrs["kernel_shape"])))


@exporter
def max_pool_indices(g, op):
    g.node("MaxPool", op.inputs, [g.fresh(f"{op.outputs[0]}/values"), *op.outputs],
           **onnx_attrs(explicit_pads(op, op.attrs["kernel_shape"])))


@exporter
def max_unpool(g, op):
    attrs = dict(op.attrs)
    shape = [g.given(op, "output_shape", np.int64)] if "output_shape" in op.operands or attrs["output_shape"] else []
    del attrs["output_shape"]
    g.node("MaxUnpool", op.inputs[:2] + shape, op.outputs, **onnx_attrs(attrs))
