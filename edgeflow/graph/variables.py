"""Variables (trainable state), the operations that update them, and initial values.

As in the seeds' TensorFlow: `ef.Variable(initial)` is a tensor whose value persists
across runs; `v.assign(x)`, `ef.group(...)`, an optimizer's `minimize` and
`ef.global_variables_initializer()` return Operations, run for their effect.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from ..ops.registry import TensorSpec
from .graph import Tensor, get_default_graph

VARIABLE = "Variable"


class Operation:
    """Ops run for their effect (variable updates), like TensorFlow's Operation."""

    def __init__(self, nodes, name):
        self.nodes, self.name = list(nodes), name

    @property
    def graph(self):
        return self.nodes[0].graph if self.nodes else get_default_graph()

    def __repr__(self):
        return f"<ef.Operation {self.name!r}: {len(self.nodes)} op(s)>"


def _initial_array(value, dtype):
    if isinstance(value, Tensor):
        if value.spec.value is None:
            raise GraphError(f"a variable's initial value must be known while building "
                             f"(a constant or an initializer), got {value!r}")
        value = value.spec.value
    array = dtypes.array(value, dtype) if dtype is not None else np.array(value)
    if dtype is None and not isinstance(value, (np.ndarray, np.generic)):
        array = array.astype({np.dtype(np.float64): dtypes.float32,
                              np.dtype(np.int64): dtypes.int32}.get(array.dtype, array.dtype))
    dtypes.as_dtype(array.dtype)
    array.setflags(write=False)
    return array


def Variable(initial_value, name=None, trainable=True, dtype=None):  # noqa: N802  (TensorFlow's name)
    """A tensor whose value persists across runs, starting at `initial_value`."""
    array = _initial_array(initial_value, dtype)
    graph = initial_value.graph if isinstance(initial_value, Tensor) else get_default_graph()
    node = graph.add_node(VARIABLE, [], {"initial": array, "trainable": bool(trainable)},
                          name or "Variable", [TensorSpec(array.shape, array.dtype)])
    return node.outputs[0]


def is_variable(t):
    return isinstance(t, Tensor) and t.node.op == VARIABLE


def _update(op, ref, value, name):
    from .math_ops import convert_to_tensor_like
    if not is_variable(ref):
        raise GraphError(f"{op}: {ref!r} is not a variable")
    value = convert_to_tensor_like(value, ref) if not isinstance(value, Tensor) else value
    node = ref.graph.add_op(op, [ref, value], name=name or f"{ref.node.name}/{op}")
    return Operation([node], node.name)


def assign(ref, value, name=None):
    """Write `value` into variable `ref`."""
    return _update("assign", ref, value, name)


def assign_add(ref, value, name=None):
    return _update("assign_add", ref, value, name)


def assign_sub(ref, value, name=None):
    return _update("assign_sub", ref, value, name)


Tensor.assign = assign
Tensor.assign_add = assign_add
Tensor.assign_sub = assign_sub


def group(*ops, name="group"):
    """One Operation running all of `ops` (Operations, or lists of them)."""
    nodes = []
    for op in ops:
        if isinstance(op, (list, tuple)):
            nodes.extend(group(*op).nodes)
        elif isinstance(op, Operation):
            nodes.extend(op.nodes)
        else:
            raise GraphError(f"group: expected Operations, got {op!r}")
    return Operation(list(dict.fromkeys(nodes)), name)


def global_variables(graph=None):
    """Every variable of the graph (the default one), in creation order."""
    return [n.outputs[0] for n in (graph or get_default_graph()).nodes if n.op == VARIABLE]


def trainable_variables(graph=None):
    return [v for v in global_variables(graph) if v.node.attrs["trainable"]]


def variables_initializer(var_list, name="init"):
    """An Operation setting each variable of `var_list` to its initial value."""
    from .graph import constant
    ops = []
    for v in var_list:
        with v.graph.as_default():
            ops.append(assign(v, constant(v.node.attrs["initial"], name=f"{v.node.name}/initial_value")))
    return group(*ops, name=name)


def global_variables_initializer():
    return variables_initializer(global_variables(), name="init")


# -- initial values: constants made on the host, seeded ------------------------------------

def set_random_seed(seed):
    """The graph-level seed: initializers without their own seed draw from it in turn."""
    graph = get_default_graph()
    graph.seed, graph.seed_draws = int(seed), 0


def _rng(seed):
    if seed is not None:
        return np.random.default_rng(seed)
    graph = get_default_graph()
    draws = getattr(graph, "seed_draws", 0)
    graph.seed_draws = draws + 1
    return np.random.default_rng([getattr(graph, "seed", 0), draws])


def _constant(array, dtype, name):
    from .graph import constant
    return constant(array, dtype=dtypes.as_dtype(dtype), name=name)


def zeros(shape, dtype=dtypes.float32, name=None):
    return _constant(np.zeros(shape), dtype, name or "zeros")


def ones(shape, dtype=dtypes.float32, name=None):
    return _constant(np.ones(shape), dtype, name or "ones")


def random_uniform(shape, minval=0.0, maxval=1.0, dtype=dtypes.float32, seed=None, name=None):
    return _constant(_rng(seed).uniform(minval, maxval, shape), dtype, name or "random_uniform")


def random_normal(shape, mean=0.0, stddev=1.0, dtype=dtypes.float32, seed=None, name=None):
    return _constant(_rng(seed).normal(mean, stddev, shape), dtype, name or "random_normal")


def glorot_uniform(shape, dtype=dtypes.float32, seed=None, name=None):
    """Uniform in +-sqrt(6 / (fan_in + fan_out)), fans as Keras counts them for dense and conv
    weights (conv: (out, in, *kernel), channels-first)."""
    shape = tuple(shape)
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    if len(shape) > 2:
        fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    else:
        fan_in, fan_out = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], shape[0]) if shape else (1, 1)
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return _constant(_rng(seed).uniform(-limit, limit, shape), dtype, name or "glorot_uniform")
