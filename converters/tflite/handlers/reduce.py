"""Reductions and arg max/min (edgeflow/ops/reduce.py), over axes mapped through the
input's layout."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import drop_axes, identity
from . import axes_of, handler

REDUCTIONS = {"MEAN": "reduce_mean", "SUM": "reduce_sum", "REDUCE_MAX": "reduce_max", "REDUCE_MIN": "reduce_min",
              "REDUCE_PROD": "reduce_prod"}


@handler(REDUCTIONS)
def _reduce(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    axes = axes_of(ctx.constant(op, 1, "axis"), rank)
    perm = ctx.perm(i) or identity(rank)
    keep = bool(op.option("keep_dims", False))
    kind = REDUCTIONS[op.opcode]
    if not axes:  # TFLite reduces nothing over no axes
        ctx.set(op.outputs[0], ctx.get(i, perm), perm, exact=ctx.same_grid(i, op.outputs[0]))
        return
    y = apply(kind, [ctx.get(i, perm)], {"axes": tuple(sorted(perm.index(a) for a in axes)), "keepdims": keep},
              name=f"{op.name}/{kind}")
    exact = op.opcode in ("REDUCE_MAX", "REDUCE_MIN") and ctx.same_grid(i, op.outputs[0])
    ctx.set(op.outputs[0], y, perm if keep else drop_axes(perm, axes), exact=exact)


@handler({"ARG_MAX": "argmax", "ARG_MIN": "argmin"})
def _arg(ctx, op):
    i = op.inputs[0]
    rank = ctx.rank(i)
    axis = int(np.asarray(ctx.constant(op, 1, "axis")).reshape(-1)[0]) % rank
    perm = ctx.perm(i) or identity(rank)
    kind = "argmax" if op.opcode == "ARG_MAX" else "argmin"
    y = apply(kind, [ctx.get(i, perm)], {"axis": perm.index(axis)}, name=f"{op.name}/{kind}")
    dtype = np.dtype(op.output_tensor().dtype)
    if y.dtype != dtype:
        y = apply("cast", [y], {"dtype": dtype}, name=f"{op.name}/cast")
    ctx.set(op.outputs[0], y, drop_axes(perm, [axis]))
