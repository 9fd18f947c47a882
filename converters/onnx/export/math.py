"""Elementwise math, comparisons, casts and matrix products (edgeflow/ops/math.py)."""
import numpy as np

from edgeflow.ops.math import TRIG

from . import elem_type, exporter, unsupported

SAME = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "neg": "Neg", "abs": "Abs",
        "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sigmoid": "Sigmoid", "tanh": "Tanh", "maximum": "Max",
        "minimum": "Min", "equal": "Equal", "less": "Less", "greater": "Greater", "less_equal": "LessOrEqual",
        "greater_equal": "GreaterOrEqual", "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign",
        "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor", "logical_not": "Not", "is_nan": "IsNaN",
        "is_inf": "IsInf", "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor",
        "bitwise_not": "BitwiseNot", "where": "Where", "det": "Det",
        **{name: name.capitalize() for name in TRIG}}


@exporter
def cast(g, op):
    g.node("Cast", op.inputs, op.outputs, to=elem_type(op.attrs["dtype"]))


@exporter
def mod(g, op):
    """ONNX's Mod takes fmod=0 (the divisor's sign) for integers only: for floats it is
    fmod plus the divisor where the signs differ, as numpy's remainder computes it."""
    dtype = op.output_specs[0].dtype
    if op.attrs["fmod"] or dtype.kind != "f":
        g.node("Mod", op.inputs, op.outputs, fmod=int(op.attrs["fmod"]))
        return
    x, y = op.inputs
    zero = g.const(np.array(0, dtype), "zero")
    r = g.node("Mod", [x, y], fmod=1)
    signs_differ = g.node("Xor", [g.node("Less", [r, zero]), g.node("Less", [y, zero])])
    fix = g.node("And", [signs_differ, g.node("Not", [g.node("Equal", [r, zero])])])
    g.node("Where", [fix, g.node("Add", [r, y]), r], op.outputs)


@exporter
def bit_shift(g, op):
    dtype = op.output_specs[0].dtype
    if dtype.kind != "u":
        raise unsupported(op, f"ONNX's BitShift takes unsigned integers, not {dtype}")
    g.node("BitShift", op.inputs, op.outputs, direction="LEFT" if op.attrs["left"] else "RIGHT")


def _swap_last(rank):
    return list(range(rank - 2)) + [rank - 1, rank - 2]


@exporter
def matmul(g, op):
    """Gemm with transA/transB for 2-D floats, else MatMul of the operands transposed."""
    (a, b), (sa, sb) = op.inputs, op.input_specs
    ta, tb = op.attrs["transpose_a"] and sa.rank >= 2, op.attrs["transpose_b"] and sb.rank >= 2
    if (ta or tb) and sa.rank == sb.rank == 2 and sa.dtype.kind == "f":
        g.node("Gemm", [a, b], op.outputs, transA=int(ta), transB=int(tb))
        return
    if ta:
        a = g.node("Transpose", [a], perm=_swap_last(sa.rank))
    if tb:
        b = g.node("Transpose", [b], perm=_swap_last(sb.rank))
    g.node("MatMul", [a, b], op.outputs)
