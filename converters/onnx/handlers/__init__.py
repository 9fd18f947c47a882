"""ONNX op type -> handler. A handler builds the op with edgeflow's builder (edgeflow.ops
defines every op; handlers only translate ONNX's attributes and inputs) and returns the
Tensors for the node's outputs.

Handlers are grouped as edgeflow.ops groups the ops they build: the handler of an ONNX
type lives in the module named like the ops/ module defining its principal op, which
`BUILDS` records (tests/test_op_families.py checks it)."""
from edgeflow.errors import UnsupportedOpError

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


def node_axes(ctx, node, index=1):
    """Axes given as an attribute (older opsets) or as constant input `index`."""
    if ctx.has(node, index):
        return ctx.ints(node, index, "axes")
    return tuple(node.attr("axes", ()))


from . import (activations, array, attention, conv, einsum, image, math, nn, no_op, norm, pool, reduce,  # noqa: E402,F401
               quantize, rnn, shape)  # (registration)
