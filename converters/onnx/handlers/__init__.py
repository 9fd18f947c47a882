"""ONNX op type -> handler. A handler builds the op with edgeflow's builder (edgeflow.ops
defines every op; handlers only translate ONNX's attributes and inputs) and returns the
Tensors for the node's outputs.

Handlers are grouped as edgeflow.ops groups the ops they build: the handler of an ONNX
type lives in the module named like the ops/ module defining its principal op, which
`BUILDS` records (tests/test_op_families.py checks it)."""
import numpy as np

from edgeflow import dtypes
from edgeflow.errors import ConversionError, UnsupportedOpError

HANDLERS = {}
BUILDS = {}  # ONNX op type -> the edgeflow op its handler builds (the principal one), or None
_NO_OP = object()


def handler(op_types, op=_NO_OP):
    """Register `fn(ctx, node) -> Tensor or list of Tensors` for ONNX op types.

    `@handler("Conv", op="conv")`: one ONNX type and the edgeflow op it builds (None
    where it builds none); `@handler({"Add": "add", "Sub": "sub"})`: several at once.
    """
    if isinstance(op_types, str):
        if op is _NO_OP:
            raise AssertionError(f"handler for ONNX {op_types}: say which edgeflow op it builds (op=...)")
        op_types = {op_types: op}
    elif op is not _NO_OP:
        raise AssertionError("handler: give op only with a single ONNX type")

    def register(fn):
        for op_type, built in op_types.items():
            if op_type in HANDLERS:
                raise AssertionError(f"two handlers for ONNX {op_type}")
            HANDLERS[op_type], BUILDS[op_type] = fn, built
        return fn
    return register


def unsupported(node, why):
    """An UnsupportedOpError for a node whose op exists but whose variant does not."""
    return UnsupportedOpError(f"{node.where()}: {why}",
                              [(node.op_type, node.opset, node.name, why)])


def attrs_or_operands(ctx, node, given):
    """ONNX inputs that edgeflow ops take as attributes: `given` maps each attribute, in
    the op's `operands` order, to (ONNX input index, value -> attribute). Returns (attrs,
    operands): all as attributes when their values are known while converting, else the
    inputs as operands, which the op reads once they are known (when running)."""
    present = [(name, i, to_attr) for name, (i, to_attr) in given.items() if ctx.has(node, i)]
    values = [ctx.value(node, i) for _, i, _ in present]
    if all(v is not None for v in values):
        return {name: to_attr(v) for (name, _, to_attr), v in zip(present, values)}, []
    if [name for name, _, _ in present] != list(given)[:len(present)]:
        raise unsupported(node, f"{', '.join(given)} computed when running, with some of them absent")
    return {}, [ctx.input(node, i) for _, i, _ in present]


def ints(value):
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def first_int(value):
    """A scalar operand as an int (a float count is truncated, as ONNX does)."""
    return int(np.asarray(value).reshape(-1)[0])


def first_float(value):
    value = np.asarray(value)
    return float((dtypes.widen(value) if value.dtype == dtypes.bfloat16 else value).reshape(-1)[0])


def sequence_position(ctx, node, i, length, default, extra=0):
    """The constant `position` input `i` of a sequence op in [0, length + extra), counted
    from the back when negative; `default` where it is absent."""
    if not ctx.has(node, i):
        return default
    if ctx.value(node, i) is None:
        raise unsupported(node, "a position known only when running: edgeflow has no sequence values, "
                                "so positions must be constants")
    at = first_int(ctx.value(node, i))
    if not -length <= at < length + extra:
        raise ConversionError(f"{node.where()}: position {at} is out of range for a sequence of {length}")
    return at + length if at < 0 else at


from . import (activations, array, attention, control, conv, einsum, image, loss, math, nn, no_op, norm, pool,  # noqa: E402,F401
               quantize, reduce, rnn, select, shape, signal)  # (registration)
