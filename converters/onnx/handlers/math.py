"""Elementwise math, comparison, cast, where and matrix-product nodes (edgeflow/ops/math.py)."""
import numpy as np

from edgeflow import dtypes
from edgeflow.graph.math_ops import apply

from ..context import onnx_dtype
from . import handler

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal",
           "Less": "less", "Greater": "greater",
           "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
           "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Sigmoid": "sigmoid", "Tanh": "tanh",
          "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
          "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
          "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "IsNaN": "is_nan", "Not": "logical_not",
          "BitwiseNot": "bitwise_not"}
_VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}


def _same_dtype(ctx, node, a, b):
    """Pow may take an exponent of another type: a constant one is cast to the base's."""
    if a.dtype != b.dtype and node.op_type == "Pow":
        return apply("cast", [b], {"dtype": a.dtype}, name=f"{node.outputs[0]}/exponent")
    return b


@handler(_BINARY)
def _binary(ctx, node):
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if node.op_type == "Pow" and a.dtype.kind in "iu":
        return _integer_pow(node, a, b)
    return apply(_BINARY[node.op_type], [a, _same_dtype(ctx, node, a, b)], name=node.outputs[0])


def _integer_pow(node, a, b):
    """Pow of an integer base (int32, int64 in ONNX): edgeflow's pow takes floats, so it
    runs in float64 (exact below 2**53) and the result is cast back to the base's type."""
    out, wide = node.outputs[0], np.dtype(np.float64)
    a64 = apply("cast", [a], {"dtype": wide}, name=f"{out}/base")
    b64 = apply("cast", [b], {"dtype": wide}, name=f"{out}/exponent")
    return apply("cast", [apply("pow", [a64, b64], name=f"{out}/float64")], {"dtype": a.dtype}, name=out)


@handler(_VARIADIC)
def _variadic(ctx, node):
    op = _VARIADIC[node.op_type]
    ins = ctx.inputs(node)
    out = ins[0]
    for k, t in enumerate(ins[1:], 1):
        last = k == len(ins) - 1 and node.op_type != "Mean"
        out = apply(op, [out, t], name=node.outputs[0] if last else f"{node.outputs[0]}/{k}")
    if node.op_type == "Mean":
        out = apply("div", [out, dtypes.array(len(ins), out.dtype)], name=node.outputs[0])
    return out


@handler(_UNARY)
def _unary(ctx, node):
    return apply(_UNARY[node.op_type], [ctx.input(node, 0)], name=node.outputs[0])


@handler("Reciprocal", op="div")
def _reciprocal(ctx, node):
    x = ctx.input(node, 0)
    return apply("div", [dtypes.array(1, x.dtype), x], name=node.outputs[0])


@handler("Cast", op="cast")
def _cast(ctx, node):
    dtype = onnx_dtype(node.attr("to"))
    return apply("cast", [ctx.input(node, 0)], {"dtype": dtype}, name=node.outputs[0])


@handler("Where", op="where")
def _where(ctx, node):
    return apply("where", ctx.inputs(node), name=node.outputs[0])


@handler("MatMul", op="matmul")
def _matmul(ctx, node):
    return apply("matmul", [ctx.input(node, 0), ctx.input(node, 1)], name=node.outputs[0])


@handler("Det", op="det")
def _det(ctx, node):
    return apply("det", [ctx.input(node, 0)], name=node.outputs[0])


@handler("Gemm", op="matmul")
def _gemm(ctx, node):
    """alpha * A' @ B' + beta * C, as matmul (with transposes), scale and bias add."""
    a, b, c = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    out = node.outputs[0]
    y = apply("matmul", [a, b], {"transpose_a": bool(node.attr("transA", 0)),
                                 "transpose_b": bool(node.attr("transB", 0))},
              name=out if c is None and alpha == 1.0 else f"{out}/matmul")
    if alpha != 1.0:
        y = apply("mul", [y, dtypes.array(alpha, y.dtype)], name=out if c is None else f"{out}/alpha")
    if c is not None:
        if beta != 1.0:
            c = apply("mul", [c, dtypes.array(beta, c.dtype)], name=f"{out}/beta")
        y = apply("add", [y, c], name=out)
    return y


@handler("CastLike", op="cast")
def _cast_like(ctx, node):
    """Cast to the dtype of the second input, which conversion knows."""
    return apply("cast", [ctx.input(node, 0)], {"dtype": ctx.input(node, 1).dtype}, name=node.outputs[0])


@handler("MatMulInteger", op="matmul")
def _matmul_integer(ctx, node):
    """(A - a_zero_point) @ (B - b_zero_point), accumulated exactly in int32."""
    from .quantize import centered
    return apply("matmul", [centered(ctx, node, 0, 2, True), centered(ctx, node, 1, 3, False)],
                 name=node.outputs[0])


@handler("IsInf", op="is_inf")
def _is_inf(ctx, node):
    return apply("is_inf", [ctx.input(node, 0)], {"detect_positive": bool(node.attr("detect_positive", 1)),
                                                  "detect_negative": bool(node.attr("detect_negative", 1))},
                 name=node.outputs[0])


@handler("Mod", op="mod")
def _mod(ctx, node):
    return apply("mod", [ctx.input(node, 0), ctx.input(node, 1)], {"fmod": bool(node.attr("fmod", 0))},
                 name=node.outputs[0])


@handler("BitShift", op="bit_shift")
def _bit_shift(ctx, node):
    left = {"LEFT": True, "RIGHT": False}[node.attr("direction")]
    return apply("bit_shift", [ctx.input(node, 0), ctx.input(node, 1)], {"left": left}, name=node.outputs[0])


@handler("BitCast", op="bitcast")
def _bitcast(ctx, node):
    dtype = onnx_dtype(node.attr("to"))
    return apply("bitcast", [ctx.input(node, 0)], {"dtype": dtype}, name=node.outputs[0])
