"""What an ONNX op handler sees: the node with decoded attributes, and the conversion
context that maps ONNX value names to edgeflow tensors. `Context.convert` walks a list of
nodes through the handlers: the main graph's, and each subgraph's (If branches, Loop and
Scan bodies) in a child context that also sees the names of the enclosing ones."""
from collections import ChainMap

import numpy as np

from edgeflow import dtypes
from edgeflow.errors import ConversionError, GraphError, UnsupportedOpError


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


class Sequence(list):
    """An ONNX sequence whose length is known while converting: its tensors, in order.
    edgeflow has no sequence values; the sequence ops rearrange these lists."""


class Context:
    """ONNX names -> edgeflow Tensors (or Sequences), in the graph being built. A child
    context (a subgraph's) sees the names of its enclosing contexts too."""

    def __init__(self, graph, opset, parent=None):
        self.graph, self.opset, self.parent = graph, opset, parent
        self.tensors = ChainMap({}, parent.tensors) if parent is not None else {}
        self.lost = set(parent.lost) if parent is not None else set()  # names unsupported nodes would make
        # ONNX names whose values conversion needed (shape operands), over all subgraphs
        self.values_read = parent.values_read if parent is not None else set()

    def convert(self, protos):
        """Convert ONNX NodeProtos, in order, into the default graph. Returns the
        (op_type, opset, name, why) of the nodes that are not supported; nodes that
        depend on them are skipped."""
        from .handlers import HANDLERS
        failed = []
        for proto in protos:
            node = Node(proto, self.opset)
            if self.lost.intersection(node.inputs) or self.lost.intersection(outer_names(proto)):
                self.lost.update(node.outputs)  # cannot convert past an unsupported node
                continue
            try:
                outs = HANDLERS[node.op_type](self, node)
            except UnsupportedOpError as e:
                failed.extend(e.ops)
                self.lost.update(node.outputs)
                continue
            except (GraphError, ConversionError) as e:
                raise ConversionError(f"{node.where()}: {e}") from None
            outs = [outs] if not isinstance(outs, list) or isinstance(outs, Sequence) else outs
            for name, t in zip(node.outputs, outs):
                if name:
                    self.tensors[name] = t
        return failed

    def subgraph(self, graph, inputs=()):
        """The outputs of ONNX subgraph `graph` (a GraphProto) converted into the default
        graph, its inputs bound to `inputs` (Tensors), in a child context: names of
        enclosing scopes resolve to their tensors (captured by the subgraph being built)."""
        from edgeflow.graph.graph import constant, get_default_graph
        child = Context(get_default_graph(), self.opset, self)
        if len(inputs) != len(graph.input):
            raise ConversionError(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, "
                                  f"given {len(inputs)}")
        for vi, t in zip(graph.input, inputs):
            child.tensors[vi.name] = t
        for init in graph.initializer:
            child.tensors[init.name] = constant(onnx_array(init), name=init.name)
        failed = child.convert(graph.node)
        if failed:
            raise UnsupportedOpError(f"{len(failed)} unsupported node(s) in subgraph {graph.name!r}", failed)
        missing = [vi.name for vi in graph.output if vi.name not in child.tensors]
        if missing:
            raise ConversionError(f"subgraph {graph.name!r}: output(s) {missing} are not computed")
        return [child.tensors[vi.name] for vi in graph.output]

    def has(self, node, i):
        return i < len(node.inputs) and node.inputs[i] != ""

    def input(self, node, i):
        """Input `i` of `node` as a Tensor, or None if the optional input is absent."""
        if not self.has(node, i):
            return None
        t = self.any_input(node, i)
        if isinstance(t, Sequence):
            raise ConversionError(f"{node.where()}: input {node.inputs[i]!r} is a sequence; "
                                  f"{node.op_type} takes a tensor there")
        return t

    def any_input(self, node, i):
        """Input `i` of `node`: a Tensor or a Sequence."""
        try:
            return self.tensors[node.inputs[i]]
        except KeyError:
            raise ConversionError(f"{node.where()}: input {node.inputs[i]!r} is not defined "
                                  "before it is used") from None

    def sequence(self, node, i):
        """Input `i` of `node`, which must be a Sequence."""
        value = self.any_input(node, i)
        if not isinstance(value, Sequence):
            raise ConversionError(f"{node.where()}: input {node.inputs[i]!r} must be a sequence")
        return value

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


def subgraphs(proto):
    """The GraphProtos held by NodeProto `proto`'s attributes (If's branches, a Loop body)."""
    for a in proto.attribute:
        if a.HasField("g"):
            yield a.g
        yield from a.graphs


def outer_names(proto):
    """Names that NodeProto `proto`'s subgraphs (at any depth) read from enclosing scopes."""
    found = set()
    for graph in subgraphs(proto):
        defined = {vi.name for vi in graph.input} | {i.name for i in graph.initializer}
        for node in graph.node:
            found.update(n for n in node.input if n and n not in defined)
            found.update(n for n in outer_names(node) if n not in defined)
            defined.update(node.output)
        found.update(vi.name for vi in graph.output if vi.name not in defined)
    return found
