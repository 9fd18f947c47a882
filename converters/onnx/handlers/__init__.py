"""ONNX op type -> handler. A handler builds the op with edgeflow's builder (edgeflow.ops
defines every op; handlers only translate ONNX's attributes and inputs) and returns the
Tensors for the node's outputs."""
from edgeflow.errors import UnsupportedOpError

HANDLERS = {}


def handler(*op_types, since=1):
    """Register `fn(ctx, node) -> Tensor or list of Tensors` for ONNX `op_types`."""
    def register(fn):
        for op_type in op_types:
            if op_type in HANDLERS:
                raise AssertionError(f"two handlers for ONNX {op_type}")
            HANDLERS[op_type] = fn
        return fn
    return register


def unsupported(node, why):
    """An UnsupportedOpError for a node whose op exists but whose variant does not."""
    return UnsupportedOpError(f"{node.where()}: {why}",
                              [(node.op_type, node.opset, node.name, why)])


from . import elementwise, nn, shape, conv, rnn  # noqa: E402,F401  (registration)
