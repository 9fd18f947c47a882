"""Elementwise math, matrix products and selection (edgeflow/ops/math.py). Elementwise
ops run in their operands' layout (context.common_layout)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import unsupported
from . import fused, handler

BINARY = {"ADD": "add", "SUB": "sub", "MUL": "mul", "DIV": "div", "MAXIMUM": "maximum", "MINIMUM": "minimum",
          "POW": "pow", "LESS": "less", "LESS_EQUAL": "less_equal", "GREATER": "greater",
          "GREATER_EQUAL": "greater_equal", "EQUAL": "equal", "LOGICAL_AND": "logical_and",
          "LOGICAL_OR": "logical_or", "FLOOR_MOD": "mod"}
UNARY = {"LOGISTIC": "sigmoid", "TANH": "tanh", "EXP": "exp", "LOG": "log", "SQRT": "sqrt", "ABS": "abs",
         "NEG": "neg", "FLOOR": "floor", "CEIL": "ceil", "ROUND": "round", "SIN": "sin", "COS": "cos",
         "LOGICAL_NOT": "logical_not", "SIGN": "sign"}


def elementwise(ctx, op, edgeflow_op, indices, attrs=None, name=None):
    """(Tensor, perm): edgeflow_op over inputs `indices`, in their common layout."""
    perm, rank = ctx.common_layout(indices)
    ins = [ctx.get_like(i, perm, rank) for i in indices]
    return apply(edgeflow_op, ins, attrs, name=name or f"{op.name}/{edgeflow_op}"), perm


@handler(BINARY)
def _binary(ctx, op):
    edgeflow_op = BINARY[op.opcode]
    y, perm = elementwise(ctx, op, edgeflow_op, op.inputs[:2], {"fmod": False} if edgeflow_op == "mod" else None)
    ctx.set(op.outputs[0], fused(op, y), perm)


@handler({"NOT_EQUAL": "equal"})
def _not_equal(ctx, op):
    """Not equal: equal, negated (edgeflow, as ONNX, has no not_equal of its own)."""
    same, perm = elementwise(ctx, op, "equal", op.inputs[:2])
    ctx.set(op.outputs[0], apply("logical_not", [same], name=f"{op.name}/not"), perm)


@handler({"SQUARED_DIFFERENCE": "mul"})
def _squared_difference(ctx, op):
    d, perm = elementwise(ctx, op, "sub", op.inputs[:2])
    ctx.set(op.outputs[0], apply("mul", [d, d], name=f"{op.name}/square"), perm)


@handler({"FLOOR_DIV": "floor"})
def _floor_div(ctx, op):
    q, perm = elementwise(ctx, op, "div", op.inputs[:2])
    if q.dtype.kind == "f":
        q = apply("floor", [q], name=f"{op.name}/floor")
    elif q.dtype.kind == "i":  # integer division rounds toward zero; TFLite's floors
        raise unsupported(op, "integer FLOOR_DIV")
    ctx.set(op.outputs[0], q, perm)


@handler(UNARY)
def _unary(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i)
    ctx.set(op.outputs[0], apply(UNARY[op.opcode], [ctx.get(i, perm)], name=f"{op.name}/{UNARY[op.opcode]}"), perm)


@handler({"RSQRT": "div"})
def _rsqrt(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i)
    root = apply("sqrt", [ctx.get(i, perm)], name=f"{op.name}/sqrt")
    ctx.set(op.outputs[0], apply("div", [np.ones((), root.dtype), root], name=f"{op.name}/rsqrt"), perm)


@handler({"SQUARE": "mul"})
def _square(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i)
    x = ctx.get(i, perm)
    ctx.set(op.outputs[0], apply("mul", [x, x], name=f"{op.name}/square"), perm)


@handler("CAST", op="cast")
def _cast(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i)
    dtype = np.dtype(op.output_tensor().dtype)
    ctx.set(op.outputs[0], apply("cast", [ctx.get(i, perm)], {"dtype": dtype}, name=f"{op.name}/cast"), perm)


@handler({"SELECT": "where", "SELECT_V2": "where"})
def _select(ctx, op):
    y, perm = elementwise(ctx, op, "where", op.inputs[:3])
    ctx.set(op.outputs[0], y, perm)


@handler("FULLY_CONNECTED", op="matmul")
def _fully_connected(ctx, op):
    """x [..., K] (flattened to [-1, K] unless keep_num_dims) times weights [O, K]^T, plus bias."""
    if op.option("weights_format", 0) != 0:
        raise unsupported(op, "shuffled weights (weights_format SHUFFLED4x16INT8)")
    w_shape = ctx.tensor_shape(op.inputs[1])
    if len(w_shape) != 2:
        raise unsupported(op, f"weights of rank {len(w_shape)}")
    k = w_shape[1]
    x = ctx.get(op.inputs[0])
    out_shape = op.output_tensor().shape
    if not (op.option("keep_num_dims", False) and len(x.shape) >= 2):
        x = apply("reshape", [x], {"shape": (-1, k)}, name=f"{op.name}/flat")
    w = ctx.get(op.inputs[1])  # [O, K] as TFLite holds it: one copy where an embedding shares it (tied weights)
    y = apply("matmul", [x, w], {"transpose_b": True}, name=f"{op.name}/matmul")
    if op.has(2):
        y = apply("add", [y, ctx.get(op.inputs[2])], name=f"{op.name}/bias")
    y = fused(op, y)
    if op.option("keep_num_dims", False) and len(y.shape) != len(out_shape):
        y = apply("reshape", [y], {"shape": tuple(-1 if d is None else d for d in out_shape)},
                  name=f"{op.name}/shape")
    ctx.set(op.outputs[0], y)


@handler("BATCH_MATMUL", op="matmul")
def _batch_matmul(ctx, op):
    a, b = ctx.get(op.inputs[0]), ctx.get(op.inputs[1])
    attrs = {"transpose_a": bool(op.option("adj_x", False)), "transpose_b": bool(op.option("adj_y", False))}
    ctx.set(op.outputs[0], apply("matmul", [a, b], attrs, name=f"{op.name}/matmul"))
