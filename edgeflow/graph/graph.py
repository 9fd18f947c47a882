"""The graph IR: a Graph of Nodes whose outputs are symbolic Tensors.

The programming model is the seeds' TensorFlow: ops are added to the default graph as
the builder functions are called, placeholders stand for inputs, constants hold data,
and nothing runs until the graph is packaged or run.
"""
import contextlib
import threading

import numpy as np

from .. import dtypes, ops
from ..errors import GraphError
from ..ops.registry import TensorSpec
from ..ops.dims import fmt

# Node kinds that are not ops: they hold data or stand for it.
PLACEHOLDER = "Placeholder"
CONST = "Const"


class Tensor:
    """Output `index` of `node`: a symbolic value with a (partly known) shape and a dtype."""

    __array_priority__ = 100  # make `ndarray + Tensor` call Tensor.__radd__

    def __init__(self, node, index, spec):
        self.node, self.index, self.spec = node, index, spec

    @property
    def shape(self):
        return self.spec.shape

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def rank(self):
        return len(self.spec.shape)

    @property
    def graph(self):
        return self.node.graph

    @property
    def name(self):
        return self.node.name if len(self.node.outputs) == 1 else f"{self.node.name}:{self.index}"

    def __repr__(self):
        return f"<ef.Tensor {self.name!r} shape={fmt(self.shape)} dtype={self.dtype}>"

    def __hash__(self):
        return id(self)

    # Operators are attached in math_ops.py, next to the functions they call.


class Node:
    def __init__(self, graph, op, name, inputs, attrs, device, role=None):
        self.graph, self.op, self.name = graph, op, name
        self.inputs, self.attrs, self.device = list(inputs), attrs, device
        self.role = role  # ("grad", forward node) or ("update", variable node): see Graph.role
        self.outputs = []

    def __repr__(self):
        return f"<ef.Node {self.name!r} op={self.op}>"


class Graph:
    """A dataflow graph. Use `with g.as_default():` to build into it."""

    def __init__(self):
        self.nodes = []
        self._names = {}
        self._device = ""
        self._role = None
        self.gradient_of = {}  # variable node -> the gradient tensor its optimizer applies
        self.seed, self.seed_draws = 0, 0  # for initializers given no seed (set_random_seed)
        self.update_ops = []  # Operations layers want run with each train step (batch_norm)
        self.summaries = {}  # name -> summary.Summary: outputs of the `train` signature (ef.summary)

    def unique_name(self, base):
        """`base` if unused, else `base_1`, `base_2`, ... as TensorFlow does."""
        base = base or "op"
        n = self._names.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names[base] = n + 1
        self._names.setdefault(name, 1)
        return name

    def owns(self, t):
        """Whether ops of this graph may read tensor `t`: it is this graph's, or (in a
        cond branch or loop body) an enclosing graph's, which is then captured."""
        return t.graph is self

    def _own(self, t, op):
        """`t` as a tensor of this graph (a subgraph captures enclosing graphs' tensors)."""
        if t.graph is not self:
            raise GraphError(f"{op}: input {t.name!r} belongs to another graph")
        return t

    def add_node(self, op, inputs, attrs, name, specs):
        inputs = [self._own(t, op) for t in inputs]
        node = Node(self, op, self.unique_name(name or op), inputs, attrs, self._device, self._role)
        node.outputs = [Tensor(node, i, s) for i, s in enumerate(specs)]
        self.nodes.append(node)
        return node

    def add_op(self, op, inputs, attrs=None, name=None):
        """Add a registered op; attrs are checked and output specs inferred now."""
        opdef = ops.get(op)
        inputs = [self._own(t, op) for t in inputs]
        attrs = opdef.check_attrs(attrs or {}, len(inputs))
        try:
            specs = opdef.infer_specs([t.spec for t in inputs], attrs)
        except GraphError as e:
            label = f" {name!r}" if name else ""
            raise GraphError(f"op{label}: {e}") from None
        if inputs and not (opdef.random or opdef.fold_at_plan or opdef.subgraphs) and all(t.spec.value is not None for t in inputs):
            specs = _with_values(op, attrs, inputs, specs)
        return self.add_node(op, inputs, attrs, name, specs)

    @contextlib.contextmanager
    def as_default(self):
        _stack().append(self)
        try:
            yield self
        finally:
            _stack().pop()

    @contextlib.contextmanager
    def role(self, kind, of):
        """Mark the ops created inside as the gradient of forward node `of` (kind "grad") or
        the update of variable node `of` ("update"). A split of a training graph places each
        backward op with its forward op and each update with its variable."""
        saved, self._role = self._role, (kind, of)
        try:
            yield
        finally:
            self._role = saved

    @contextlib.contextmanager
    def device(self, name):
        """Pin the ops created inside to "device" or "cloud" (the splitter honours it)."""
        if name not in ("", "device", "cloud"):
            raise GraphError(f"device must be 'device' or 'cloud', got {name!r}")
        saved, self._device = self._device, name
        try:
            yield
        finally:
            self._device = saved

    def get_tensor_by_name(self, name):
        for node in self.nodes:
            for t in node.outputs:
                if t.name == name:
                    return t
        raise GraphError(f"no tensor named {name!r} in the graph")


def _with_values(op, attrs, inputs, specs):
    """Specs with their values, computed now: every operand is known (constants, static
    shapes), so shape operands downstream are known too, as TensorFlow's constant_value."""
    from ..interp.kernels import evaluate
    try:
        values = evaluate(op, attrs, [t.spec.value for t in inputs], specs)
    except (IndexError, ValueError) as e:
        raise GraphError(f"{op} on constant operands failed: {e}") from None
    for v in values:
        v.setflags(write=False)
    return [TensorSpec(s.shape, s.dtype, v) for s, v in zip(specs, values)]


_local = threading.local()
_global_default = Graph()


def _stack():
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def get_default_graph():
    stack = _stack()
    return stack[-1] if stack else _global_default


def reset_default_graph():
    global _global_default
    if _stack():
        raise GraphError("reset_default_graph() inside a `with graph.as_default()` block")
    _global_default = Graph()


def device(name):
    """`with ef.device("cloud"):` pins ops to a side of the split, in the default graph."""
    return get_default_graph().device(name)


def placeholder(dtype, shape=None, name=None):
    """A graph input of `dtype`; None in `shape` marks a dimension given at run time."""
    if shape is None:
        raise GraphError("placeholder: give a shape (use None for dynamic dimensions)")
    shape = tuple(None if d is None or d == -1 else int(d) for d in shape)
    spec = TensorSpec(shape, dtypes.as_dtype(dtype))
    return get_default_graph().add_node(PLACEHOLDER, [], {}, name or "Placeholder", [spec]).outputs[0]


def constant(value, dtype=None, name=None):
    """A constant tensor holding `value` (copied), converted to `dtype` when given.

    Without `dtype`, numpy arrays keep theirs; Python floats become float32 and Python
    ints int32, as in TensorFlow.
    """
    if dtype is not None:
        array = dtypes.array(value, dtype)
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.array(value)
    else:
        array = np.array(value)
        array = array.astype(_PYTHON_DEFAULTS.get(array.dtype, array.dtype))
    dtypes.as_dtype(array.dtype)
    array.setflags(write=False)
    spec = TensorSpec(array.shape, array.dtype, array)
    return get_default_graph().add_node(CONST, [], {"value": array}, name or "Const", [spec]).outputs[0]


_PYTHON_DEFAULTS = {np.dtype(np.float64): dtypes.float32, np.dtype(np.int64): dtypes.int32}


def convert_to_tensor(value, dtype_hint=None):
    """A Tensor as is; anything else becomes a constant.

    A Python scalar or list next to a tensor takes that tensor's dtype (`dtype_hint`):
    rounded for float tensors, exactly or not at all for integer ones (`x_int + 1.5` is
    an error, as in TensorFlow).
    """
    if isinstance(value, Tensor):
        return value
    if dtype_hint is None or isinstance(value, (np.ndarray, np.generic)):
        return constant(value)
    if dtype_hint == dtypes.bfloat16:  # rounds, as for the other float dtypes
        return constant(value, dtype_hint)
    source = np.asarray(value)
    with np.errstate(all="ignore"):
        converted = source.astype(dtype_hint)
    # Floats may round (0.1 in float32); integers and bools must convert exactly.
    exact = np.dtype(dtype_hint).kind == "f" and np.all(np.isfinite(converted) == np.isfinite(source)) \
        if source.dtype.kind in "biuf" else False
    if not exact and (source.dtype.kind not in "biuf" or not np.array_equal(converted, source)):
        raise GraphError(f"cannot use {value!r} with a {np.dtype(dtype_hint)} tensor: the value "
                         f"does not convert to {np.dtype(dtype_hint)} exactly; cast one side")
    return constant(converted)
