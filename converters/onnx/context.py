"""What an ONNX op handler sees: the node with decoded attributes, and the conversion
context that maps ONNX value names to edgeflow tensors."""
import numpy as np

from edgeflow import dtypes
from edgeflow.errors import ConversionError


def onnx_dtype(elem_type):
    """The numpy dtype of ONNX data type `elem_type` (a TensorProto code); BFLOAT16 is
    edgeflow's bfloat16 (onnx's would be ml_dtypes')."""
    from onnx import TensorProto, helper
    return dtypes.bfloat16 if elem_type == TensorProto.BFLOAT16 else helper.tensor_dtype_to_np_dtype(elem_type)


def onnx_array(tensor):
    """The value of TensorProto `tensor` as a numpy array of an edgeflow dtype (bfloat16:
    numpy_helper gives ml_dtypes', viewed as edgeflow's)."""
    from onnx import numpy_helper
    return dtypes.asarray(numpy_helper.to_array(tensor))


class Node:
    """An ONNX NodeProto with its attributes decoded to Python values."""

    def __init__(self, proto, opset):
        from onnx import helper
        self.proto, self.opset = proto, opset
        self.op_type, self.domain = proto.op_type, proto.domain or "ai.onnx"
        self.name = proto.name or (proto.output[0] if proto.output else proto.op_type)
        self.inputs, self.outputs = list(proto.input), list(proto.output)
        self.attrs = {}
        for a in proto.attribute:
            value = helper.get_attribute_value(a)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode("utf-8", "replace") for v in value]
            self.attrs[a.name] = value

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def where(self):
        return f"{self.op_type} node {self.name!r}"


class Context:
    """ONNX names -> edgeflow Tensors, in the graph being built."""

    def __init__(self, graph):
        self.graph = graph
        self.tensors = {}
        self.values_read = set()  # ONNX names whose values conversion needed (shape operands)

    def has(self, node, i):
        return i < len(node.inputs) and node.inputs[i] != ""

    def input(self, node, i):
        """Input `i` of `node` as a Tensor, or None if the optional input is absent."""
        if not self.has(node, i):
            return None
        try:
            return self.tensors[node.inputs[i]]
        except KeyError:
            raise ConversionError(f"{node.where()}: input {node.inputs[i]!r} is not defined "
                                  "before it is used") from None

    def inputs(self, node):
        return [self.input(node, i) for i in range(len(node.inputs))]

    def value(self, node, i):
        """The value of input `i` if known while converting (constants, static shapes)."""
        t = self.input(node, i)
        if t is not None:
            self.values_read.add(node.inputs[i])
        return None if t is None else t.spec.value

    def constant(self, node, i, what):
        """The value of input `i`, which this converter needs as a constant."""
        value = self.value(node, i)
        if value is None:
            raise ConversionError(f"{node.where()}: {what} (input {i}) must be a constant or "
                                  "computable from static shapes; it depends on input values")
        return value

    def ints(self, node, i, what):
        return tuple(int(v) for v in np.asarray(self.constant(node, i, what)).reshape(-1))
