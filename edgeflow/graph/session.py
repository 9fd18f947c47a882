"""`ef.Session`: run the part of a graph that some fetches need, keeping variables.

As in the seeds' TensorFlow: `sess.run(fetches, feed_dict)` takes a Tensor, an
Operation, or a list, tuple or dict of them, and returns values of the same structure
(None for Operations). Each (fetches, feeds, shapes) is compiled once into the
interpreter's plan, so a session runs the same kernels, arena and scheduling as a
packaged model; variable values live in the session.
"""
import numpy as np

from ..errors import EdgeflowError, GraphError, InvalidInputError
from .graph import PLACEHOLDER, Node, Tensor, get_default_graph
from .save import to_model
from .variables import VARIABLE, Operation


class Session:
    def __init__(self, graph=None):
        self.graph = graph or get_default_graph()
        self._values = {}  # variable node -> its array, once initialized
        self._compiled = {}
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._closed = True
        self._compiled.clear()

    def run(self, fetches, feed_dict=None):
        """Values of `fetches` (same structure), running only what they need."""
        if self._closed:
            raise EdgeflowError("this Session is closed")
        flat = []
        structure = _flatten(fetches, flat)
        tensors = [f for f in flat if isinstance(f, Tensor)]
        targets = [n for f in flat if not isinstance(f, Tensor) for n in _nodes(f)]
        feeds = self._feeds(feed_dict or {})
        compiled = self._compile(tensors, targets, feeds)
        values = compiled.run(self, feeds)
        results = iter(values[t] if isinstance(t, Tensor) else None for t in flat)
        return _rebuild(structure, results)

    def _feeds(self, feed_dict):
        feeds = {}
        for key, value in feed_dict.items():
            t = self.graph.get_tensor_by_name(key) if isinstance(key, str) else key
            if not isinstance(t, Tensor) or t.node.op != PLACEHOLDER:
                raise InvalidInputError(f"feed_dict: {key!r} is not a placeholder of this graph")
            feeds[t] = value
        return feeds

    def _compile(self, tensors, targets, feeds):
        for t in tensors:
            if t.graph is not self.graph:
                raise GraphError(f"fetch {t.name!r} belongs to another graph than the session's")
        key = (tuple(tensors), tuple(targets), tuple(feeds),
               tuple(np.shape(v) for v in feeds.values()))
        if key not in self._compiled:
            self._compiled[key] = _Compiled(self.graph, tensors, targets, list(feeds))
        return self._compiled[key]


class _Compiled:
    """One (fetches, feeds) pair as a model, planned per set of feed shapes."""

    def __init__(self, graph, tensors, targets, feeds):
        inputs = {f"in{k}": t for k, t in enumerate(feeds)}
        outputs = {f"out{k}": t for k, t in enumerate(dict.fromkeys(tensors))}
        try:
            self.model = to_model(graph, {"run": (inputs, outputs, [Operation(targets, "run")])},
                                  state_signatures=False)
        except GraphError as e:
            raise InvalidInputError(f"Session.run: {e}; feed it in feed_dict") from None
        sub = self.model.subgraphs[0]
        sig = self.model.signatures[0]
        self.sub, self.sig = sub, sig
        self.feed_index = {t: sig.inputs[f"in{k}"] for k, t in enumerate(feeds)}
        self.fetch_index = {t: sig.outputs[n] for n, t in outputs.items()}
        by_name = {n.name: n for n in graph.nodes if n.op == VARIABLE}
        self.variables = {i: by_name[t.name] for i, t in enumerate(sub.tensors) if t.is_variable}
        self.constants = {i: t.data for i, t in enumerate(sub.tensors) if t.data is not None and not t.is_variable}
        self.folded, self.plans = {}, {}
        from ..interp.control import Program
        self.program = Program(self.model)  # the subgraphs that cond and while_loop run

    def _variable_arrays(self, session, plan_ops):
        """Session arrays for the variables; reading an uninitialized one is an error."""
        written_only = set()
        for op in plan_ops:
            if op.opcode == "assign":
                written_only.add(op.inputs[0])
        read = {t for op in plan_ops for k, t in enumerate(op.inputs)
                if t in self.variables and not (op.opcode == "assign" and k == 0)}
        read |= {i for i in self.fetch_index.values() if i in self.variables}
        arrays = {}
        for i, node in self.variables.items():
            if node not in session._values:
                if i in read:
                    raise EdgeflowError(f"variable {node.name!r} is not initialized: run "
                                        "ef.global_variables_initializer() first")
                session._values[node] = np.array(node.attrs["initial"])  # overwritten by assign
            arrays[i] = session._values[node]
        return arrays

    def run(self, session, feeds):
        from ..interp.interpreter import as_input
        from ..interp.plan import needed_operators
        from ..interp.staged import make_plan
        values = {self.feed_index[t]: as_input(self.sub.tensors[self.feed_index[t]], v,
                                               f"feed {t.name!r}") for t, v in feeds.items()}
        shapes = {i: v.shape for i, v in values.items()}
        key = tuple(shapes.values())
        plan = self.plans.get(key)
        if plan is None:
            producer = {t: i for i, op in enumerate(self.sub.operators) for t in op.outputs}
            order = needed_operators(self.sub, list(self.sig.outputs.values()), producer, self.sig.targets)
            arrays = self._variable_arrays(session, [self.sub.operators[i] for i in order])
            plan = make_plan(self.sub, list(values), list(self.sig.outputs.values()), shapes,
                             self.constants, arrays, self.folded, targets=self.sig.targets, program=self.program)
            self.plans[key] = plan
        else:
            self._variable_arrays(session, [self.sub.operators[i] for i in plan.order])
        for i, v in values.items():
            np.copyto(plan.arrays[i], v)
        plan.run()
        return {t: np.array(plan.arrays[i]) for t, i in self.fetch_index.items()}


def _nodes(fetch):
    if isinstance(fetch, Operation):
        return fetch.nodes
    if isinstance(fetch, Node):
        return [fetch]
    raise GraphError(f"cannot fetch {fetch!r}: expected a Tensor, an Operation or a list of them")


def _flatten(fetches, flat):
    """A description of the structure of `fetches`; the leaves are appended to `flat`."""
    if isinstance(fetches, (list, tuple)):
        return type(fetches), [_flatten(f, flat) for f in fetches]
    if isinstance(fetches, dict):
        return dict, {k: _flatten(v, flat) for k, v in fetches.items()}
    if fetches is None or not isinstance(fetches, (Tensor, Operation, Node)):
        raise GraphError(f"cannot fetch {fetches!r}: expected a Tensor, an Operation or a list of them")
    flat.append(fetches)
    return None


def _rebuild(structure, values):
    if structure is None:
        return next(values)
    kind, parts = structure
    if kind is dict:
        return {k: _rebuild(v, values) for k, v in parts.items()}
    return kind(_rebuild(p, values) for p in parts)
