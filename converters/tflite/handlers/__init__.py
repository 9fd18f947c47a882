"""TFLite builtin operator -> handler. A handler builds the op with edgeflow's builder
(edgeflow.ops defines every op; handlers translate TFLite's options, inputs and layouts)
and sets the op's outputs in the Context (converters/tflite/context.py).

Handlers are grouped as edgeflow.ops groups the ops they build: the handler of a TFLite
op lives in the module named like the ops/ module defining its principal op, which
`BUILDS` records (tests/test_op_families.py checks it)."""
import numpy as np

from ..context import ACTIVATIONS, unsupported

HANDLERS = {}
BUILDS = {}  # TFLite op name -> the edgeflow op its handler builds (the principal one), or None
_NO_OP = object()


def handler(opcodes, op=_NO_OP):
    """Register `fn(ctx, op)` for TFLite ops: `@handler("CONV_2D", op="conv")`, or
    `@handler({"ADD": "add", "SUB": "sub"})`. Custom ops are named "CUSTOM:<code>"."""
    if isinstance(opcodes, str):
        if op is _NO_OP:
            raise AssertionError(f"handler for TFLite {opcodes}: say which edgeflow op it builds (op=...)")
        opcodes = {opcodes: op}
    elif op is not _NO_OP:
        raise AssertionError("handler: give op only with a single TFLite op")

    def register(fn):
        for opcode, built in opcodes.items():
            if opcode in HANDLERS:
                raise AssertionError(f"two handlers for TFLite {opcode}")
            HANDLERS[opcode], BUILDS[opcode] = fn, built
        return fn
    return register


def fused(op, tensor, name=None):
    """`tensor` with op's fused_activation_function applied (TFLite's ActivationFunctionType)."""
    from edgeflow.graph.math_ops import apply
    kind = op.option("fused_activation_function", 0)
    act = ACTIVATIONS.get(kind, kind)
    name = name or f"{op.name}/{act}"
    if act is None:
        return tensor
    if act == "relu":
        return apply("relu", [tensor], name=name)
    if act == "relu6":
        return apply("clip", [tensor], {"min": 0.0, "max": 6.0}, name=name)
    if act == "relu_n1_to_1":
        return apply("clip", [tensor], {"min": -1.0, "max": 1.0}, name=name)
    if act == "tanh":
        return apply("tanh", [tensor], name=name)
    raise unsupported(op, f"fused activation {act}")


def padding(op):
    """edgeflow's auto_pad for TFLite's Padding option (SAME puts the odd pixel last)."""
    kind = op.option("padding", 0)
    if kind == 0:
        return "SAME_UPPER"
    if kind == 1:
        return "VALID"
    raise unsupported(op, f"padding {kind}")


def axes_of(value, rank):
    """TFLite axes (an array, possibly negative) as a tuple in [0, rank)."""
    return tuple(sorted({int(a) % rank for a in np.asarray(value).reshape(-1)})) if rank else ()


from . import activations, array, control, conv, geometry, image, math, nn, no_op, pool, quantize, reduce, shape  # noqa: E402,F401,E501
