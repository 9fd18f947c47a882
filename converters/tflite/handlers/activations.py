"""Activations (edgeflow/ops/activations.py), elementwise in their input's layout."""
from edgeflow.graph.math_ops import apply
from edgeflow.graph.nn import prelu

from . import handler


def _same_layout(ctx, op, edgeflow_op, attrs=None):
    i = op.inputs[0]
    perm = ctx.perm(i)
    y = apply(edgeflow_op, [ctx.get(i, perm)], attrs, name=f"{op.name}/{edgeflow_op}")
    ctx.set(op.outputs[0], y, perm)


@handler({"RELU6": "clip", "RELU_N1_TO_1": "clip", "RELU_0_TO_1": "clip"})
def _clipped_relu(ctx, op):
    low, high = {"RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}[op.opcode]
    _same_layout(ctx, op, "clip", {"min": low, "max": high})


@handler("HARD_SWISH", op="hard_swish")
def _hard_swish(ctx, op):
    _same_layout(ctx, op, "hard_swish")


@handler("LEAKY_RELU", op="leaky_relu")
def _leaky_relu(ctx, op):
    _same_layout(ctx, op, "leaky_relu", {"alpha": float(op.option("alpha", 0.2))})


@handler("ELU", op="elu")
def _elu(ctx, op):
    _same_layout(ctx, op, "elu", {"alpha": 1.0})


@handler("GELU", op="gelu")
def _gelu(ctx, op):
    _same_layout(ctx, op, "gelu", {"approximate": "tanh" if op.option("approximate", False) else "none"})


@handler("PRELU", op="prelu")
def _prelu(ctx, op):
    """x where x >= 0, alpha * x elsewhere (alpha broadcast to x): ef.nn.prelu."""
    x_index, alpha_index = op.inputs[:2]
    perm, rank = ctx.common_layout([x_index])
    x = ctx.get(x_index, perm)
    alpha = ctx.get_like(alpha_index, perm, rank)
    ctx.set(op.outputs[0], prelu(x, alpha, name=f"{op.name}/prelu"), perm)
