"""Control flow in the builder: `cond`, `case`, `while_loop` and `map_fn`, as in TensorFlow 1.x.

The functions given to them are called once, each inside a `Body`: a graph of its own
whose ops become a subgraph of the package (edgeflow/ops/control.py). A tensor of an
enclosing graph used inside a body is captured: it becomes one of the body's inputs and
an explicit input of the `if` or `while` op (a loop passes it through unchanged), so a
subgraph reads nothing but its inputs and constants. Small constants are copied into the
body instead, so that shapes computed from them stay known there.

Gradients: through `if`, the gradient of the branch taken (a backward `if` whose branches
differentiate each forward branch); through `while`, TensorFlow's stack-based scheme: the
forward loop also stacks the loop variables each iteration enters with (added to it when
a gradient is first asked for), and a backward loop walks the iterations in reverse,
recomputing one iteration of the body from its stacked entry and taking its gradient.
"""
import numpy as np

from .. import dtypes, ops
from ..errors import GraphError
from ..ops.control import IF, WHILE, merge_shapes
from ..ops.dims import fmt
from ..ops.registry import TensorSpec
from .graph import CONST, PLACEHOLDER, Graph, Tensor, constant, convert_to_tensor, get_default_graph, placeholder

# A captured constant with at most this many elements is copied into the body (it may be
# a shape, an axis, a scalar); larger ones (weights) become inputs, stored once.
COPY_CONSTANTS_UP_TO = 64


class Body(Graph):
    """A subgraph under construction: the ops of a branch, a loop condition or a body.

    `inputs` are its placeholders in order (the op's inputs map onto them), `outputs`
    the tensors it gives. Tensors of enclosing graphs it reads are captured (`captured`:
    the enclosing graph's tensor -> this body's placeholder, in order of first use).
    """

    def __init__(self, parent, name):
        super().__init__()
        self.parent, self.name = parent, name
        self.inputs, self.outputs = [], []
        self.captured = {}
        self._copies = {}  # enclosing graphs' small constants -> their copies here
        self.seed = parent.seed  # random ops inside draw from the enclosing graph's seed
        self.update_ops = parent.update_ops

    def __repr__(self):
        return f"<ef.Body {self.name!r}: {len(self.inputs)} inputs, {len(self.outputs)} outputs>"

    @property
    def input_specs(self):
        return [t.spec for t in self.inputs]

    @property
    def output_specs(self):
        return [t.spec for t in self.outputs]

    def enclosing(self):
        graph = self.parent
        while graph is not None:
            yield graph
            graph = getattr(graph, "parent", None)

    def owns(self, t):
        return t.graph is self or any(t.graph is g for g in self.enclosing())

    def _own(self, t, op):
        if t.graph is self:
            return t
        if not self.owns(t):
            raise GraphError(f"{op}: input {t.name!r} belongs to a graph that does not enclose "
                             f"{self.name!r} (a tensor made inside another branch or body?)")
        value = t.spec.value
        if value is not None and value.size <= COPY_CONSTANTS_UP_TO:
            if t not in self._copies:
                with self.as_default():
                    self._copies[t] = constant(value, name=t.node.name)
            return self._copies[t]
        return self.input_for(self.parent._own(t, op))

    def _placeholder(self, spec, name):
        node = self.add_node(PLACEHOLDER, [], {}, name, [TensorSpec(spec.shape, spec.dtype)])
        return node.outputs[0]

    def input_for(self, outer):
        """This body's placeholder for enclosing tensor `outer` (made unused if need be)."""
        if outer not in self.captured:
            self.captured[outer] = self._placeholder(outer.spec, outer.node.name)
        return self.captured[outer]

    def add_node(self, op, inputs, attrs, name, specs):
        opdef = ops.find(op)
        if op not in (CONST, PLACEHOLDER) and (opdef is None or opdef.stateful):
            what = "variables" if opdef is None else f"{op} ops (they write variables)"
            raise GraphError(f"{self.name}: {what} inside cond or while_loop are not supported; "
                             "create variables outside and read them inside, and update them "
                             "from the loop's results")
        return super().add_node(op, inputs, attrs, name, specs)

    def call(self, args):
        """This body's outputs computed on `args` (tensors of the default graph): its ops
        added again there, in order."""
        graph = get_default_graph()
        if len(args) != len(self.inputs):
            raise AssertionError(f"{self.name}: {len(args)} arguments for {len(self.inputs)} inputs")
        mapped = dict(zip(self.inputs, args))
        from .save import needed_nodes
        needed = needed_nodes(self.outputs)
        with graph.as_default():
            for node in self.nodes:
                if node not in needed or node.op == PLACEHOLDER:
                    continue
                if node.op == CONST:
                    mapped[node.outputs[0]] = constant(node.attrs["value"], name=node.name)
                    continue
                new = graph.add_op(node.op, [mapped[t] for t in node.inputs], node.attrs, node.name)
                mapped.update(zip(node.outputs, new.outputs))
        return [mapped[t] for t in self.outputs]

    def with_outputs(self, outputs):
        """A Body with the same ops and inputs, giving `outputs`."""
        other = Body.__new__(Body)
        other.__dict__.update(self.__dict__)
        other.outputs = list(outputs)
        return other


def _flatten(structure, what):
    """(leaves, rebuild): the tensors of a tensor or a nested list/tuple of them."""
    if isinstance(structure, (list, tuple)):
        parts = [_flatten(s, what) for s in structure]
        leaves = [leaf for p, _ in parts for leaf in p]
        sizes = [len(p) for p, _ in parts]

        def rebuild(values):
            out, at = [], 0
            for (_, again), size in zip(parts, sizes):
                out.append(again(values[at:at + size]))
                at += size
            return type(structure)(out)
        return leaves, rebuild
    if structure is None:
        raise GraphError(f"{what}: None is not a tensor")
    return [structure], lambda values: values[0]


def _shapes_like(structure, shapes):
    """The shapes in `shapes`, a structure like `structure` whose leaves are shapes."""
    if isinstance(structure, (list, tuple)):
        if not isinstance(shapes, (list, tuple)) or len(shapes) != len(structure):
            raise GraphError(f"while_loop: shape_invariants {shapes!r} do not follow the loop "
                             f"variables' structure")
        return [s for part, shape in zip(structure, shapes) for s in _shapes_like(part, shape)]
    if not isinstance(shapes, (list, tuple)) or not all(d is None or isinstance(d, (int, np.integer)) for d in shapes):
        raise GraphError(f"while_loop: a shape invariant is a list of ints and None, got {shapes!r}")
    return [tuple(shapes)]


def _build(parent, name, fn, args, what):
    """A Body holding `fn(*args)`'s ops; (body, leaves of the result, rebuild)."""
    body = Body(parent, name)
    with body.as_default():
        result = fn(*args)
        leaves, rebuild = _flatten(result, what)
        leaves = [body._own(convert_to_tensor(v), what) for v in leaves]
    body.outputs = leaves
    return body, rebuild


def _scalar_bool(t, what):
    if t.dtype != dtypes.bool_ or t.shape not in ((), (1,)):
        raise GraphError(f"{what} must give a bool scalar, got {t.dtype}{fmt(t.shape)}")


def cond(pred, true_fn, false_fn, name=None):
    """`true_fn()` if `pred` (a bool scalar tensor) else `false_fn()`, in the graph.

    Both functions are called once, to build the two branches; they return a tensor or
    a nested list/tuple of tensors of the same structure and dtypes (shapes may differ:
    the result has the dimensions both agree on). Only the branch taken runs.
    """
    graph = get_default_graph()
    pred = convert_to_tensor(pred)
    _scalar_bool(pred, "cond: pred")
    then, rebuild = _build(graph, "then_branch", true_fn, (), "cond: true_fn")
    other, rebuild_other = _build(graph, "else_branch", false_fn, (), "cond: false_fn")
    if len(then.outputs) != len(other.outputs) or \
            rebuild(list(range(len(then.outputs)))) != rebuild_other(list(range(len(other.outputs)))):
        raise GraphError(f"cond: true_fn and false_fn return different structures "
                         f"({len(then.outputs)} and {len(other.outputs)} tensors)")
    captured = list(dict.fromkeys([*then.captured, *other.captured]))
    for body in (then, other):
        body.inputs = [body.input_for(t) for t in captured]
    outs = graph.add_op(IF, [pred] + captured, {"then_branch": then, "else_branch": other},
                        name or "cond").outputs
    return rebuild(list(outs))


def case(pred_fn_pairs, default=None, name=None):
    """The result of the first `fn` whose `pred` is true, else of `default()` (default:
    the last pair's fn), as nested conds: later predicates are evaluated only if needed."""
    pairs = list(pred_fn_pairs.items() if isinstance(pred_fn_pairs, dict) else pred_fn_pairs)
    if not pairs:
        raise GraphError("case: give at least one (pred, fn) pair")
    if default is None:
        default = pairs[-1][1]

    def chain(k):
        if k == len(pairs):
            return default()
        pred, fn = pairs[k]
        return cond(pred, fn, lambda: chain(k + 1), name=name or "case")
    return chain(0)


def while_loop(cond_fn, body_fn, loop_vars, shape_invariants=None, maximum_iterations=None, name=None):
    """Repeat `loop_vars = body_fn(*loop_vars)` while `cond_fn(*loop_vars)`; the final loop_vars.

    As TensorFlow 1.x's: `loop_vars` is a tensor or a nested list/tuple of them, which
    body_fn returns in the same structure and dtypes. A loop variable keeps its shape
    unless `shape_invariants` (same structure, None for a dimension that may change)
    says otherwise. `maximum_iterations` (an int or an int scalar tensor) bounds the
    number of iterations.
    """
    leaves, rebuild = _flatten(loop_vars if isinstance(loop_vars, (list, tuple)) else [loop_vars],
                               "while_loop: loop_vars")
    single = not isinstance(loop_vars, (list, tuple))
    leaves = [convert_to_tensor(v) for v in leaves]
    shapes = [t.shape for t in leaves]
    if shape_invariants is not None:
        given = _shapes_like(loop_vars if not single else [loop_vars],
                             shape_invariants if not single else [shape_invariants])
        shapes = [tuple(None if d is None or d == -1 else int(d) for d in s) for s in given]
        for k, (t, s) in enumerate(zip(leaves, shapes)):
            if merge_shapes(t.shape, s) is None or any(a is not None and b is not None and a != b
                                                       for a, b in zip(t.shape, s)):
                raise GraphError(f"while_loop: loop variable {k} has shape {fmt(t.shape)}, which its "
                                 f"shape invariant {fmt(s)} does not admit")
    def cond(*args):
        return cond_fn(*rebuild(list(args)))

    def body(*args):
        return list(_flatten(body_fn(*rebuild(list(args))), "while_loop: body_fn")[0]), []
    if isinstance(maximum_iterations, Tensor):  # the bound is a value: a counter joins the loop variables
        from . import math_ops as m
        bound = m.cast(maximum_iterations, dtypes.int32)
        outs = loop(lambda i, *args: m.logical_and(m.less(i, bound), cond(*args)),
                    lambda i, *args: ([m.add(i, 1)] + body(*args)[0], []),
                    [constant(0, dtypes.int32)] + leaves, [()] + shapes, -1, name)[1:]
    else:
        limit = -1 if maximum_iterations is None else int(maximum_iterations)
        if maximum_iterations is not None and limit < 0:
            raise GraphError(f"while_loop: maximum_iterations must be >= 0, got {limit}")
        outs = loop(cond, body, leaves, shapes, limit, name)
    result = rebuild(outs)
    return result[0] if single else result


def loop(cond_fn, body_fn, leaves, shapes, limit=-1, name=None):
    """The `while` op under while_loop and map_fn, for converters too: loop variables
    `leaves` (a flat list of tensors; inside, placeholders shaped `shapes`, None where a
    dimension may change), `cond_fn(*vars)` a bool scalar, `body_fn(*vars)` returns (new
    loop variables, values to stack over the iterations). `limit`: at most that many
    iterations (-1: no bound). Returns the final loop variables, then the stacks."""
    graph = get_default_graph()
    cond_body = Body(graph, "cond")
    with cond_body.as_default():
        params = [placeholder(t.dtype, s, name=f"loop_var_{k}") for k, (t, s) in enumerate(zip(leaves, shapes))]
        out = cond_body._own(convert_to_tensor(cond_fn(*params)), "while_loop: cond_fn")
    _scalar_bool(out, "while_loop: cond_fn")
    cond_body.inputs, cond_body.outputs = params, [out]
    body = Body(graph, "body")
    with body.as_default():
        params = [placeholder(t.dtype, s, name=f"loop_var_{k}") for k, (t, s) in enumerate(zip(leaves, shapes))]
        new, stacks = body_fn(*params)
        if len(new) == len(leaves):
            new = [body._own(convert_to_tensor(v, t.dtype), "while_loop: body_fn") for v, t in zip(new, leaves)]
        stacks = [body._own(convert_to_tensor(v), "while_loop: body_fn") for v in stacks]
    if len(new) != len(leaves):
        raise GraphError(f"while_loop: body_fn returns {len(new)} loop variables for {len(leaves)}")
    for k, (t, v, s) in enumerate(zip(leaves, new, shapes)):
        if v.dtype != t.dtype:
            raise GraphError(f"while_loop: loop variable {k} enters as {t.dtype} and body_fn makes it {v.dtype}")
        if len(v.shape) != len(s) or any(a is not None and b is not None and a != b for a, b in zip(s, v.shape)):
            raise GraphError(f"while_loop: loop variable {k} enters as {fmt(s)} and body_fn makes it "
                             f"{fmt(v.shape)}; give shape_invariants with None where it may change")
    captured = list(dict.fromkeys([*cond_body.captured, *body.captured]))
    cond_body.inputs += [cond_body.input_for(t) for t in captured]
    passed = [body.input_for(t) for t in captured]
    body.inputs = params + passed
    body.outputs = list(new) + passed + list(stacks)
    # The op's outputs: loop vars (the captured ones included), then the stacks.
    node = graph.add_op(WHILE, leaves + captured, {"cond": cond_body, "body": body,
                                                   "maximum_iterations": limit}, name or "while")
    return list(node.outputs[:len(leaves)]) + list(node.outputs[len(leaves) + len(captured):])


def map_fn(fn, elems, name=None):
    """`fn` applied to each slice of `elems` along axis 0, the results stacked: a while
    loop. `elems` is a tensor or a nested list/tuple of tensors of the same length, and
    `fn` takes one slice of the same structure; it returns a tensor or a nested
    list/tuple of them, each stacked into a result of shape [len] + its shape."""
    from . import math_ops as m
    leaves, rebuild = _flatten(elems, "map_fn: elems")
    leaves = [convert_to_tensor(e) for e in leaves]
    if any(t.rank == 0 for t in leaves):
        raise GraphError("map_fn: elems must have a leading axis to map over")
    count = m.cast(m.gather(m.shape(leaves[0]), 0), dtypes.int32)
    built = {}

    def body(i):
        result = fn(rebuild([m.gather(e, i) for e in leaves]))
        outs, built["rebuild"] = _flatten(result, "map_fn: fn")
        return [m.add(i, 1)], outs
    outs = loop(lambda i: m.less(i, count), body, [constant(0, dtypes.int32)], [()], -1, name or "map")
    length = leaves[0].shape[0]
    if length is not None:  # the stacks' length is known: say so, as TensorFlow's map_fn does
        outs = [m.reshape(t, (length,) + t.shape[1:]) if None not in t.shape[1:] else t for t in outs[1:]]
    else:
        outs = outs[1:]
    return built["rebuild"](outs)


# -- gradients ------------------------------------------------------------------------

def _differentiable(t):
    return t.dtype in dtypes.FLOATS


def _zeros_like(t):
    from . import math_ops as m
    if None not in t.shape:
        return constant(np.zeros(t.shape, t.dtype))
    return m.apply("constant_of_shape", [m.shape(t)], {"value": 0.0, "dtype": t.dtype})


def _gradients_or_zeros(ys, grad_ys, xs):
    """d(ys . grad_ys)/d(xs), zeros where no path."""
    from .gradients import gradients
    pairs = [(y, gy) for y, gy in zip(ys, grad_ys) if _differentiable(y)]
    found = gradients([y for y, _ in pairs], xs, grad_ys=[gy for _, gy in pairs]) if pairs else [None] * len(xs)
    return [g if g is not None else _zeros_like(x) for g, x in zip(found, xs)]


@ops.gradient(IF)
def _if_gradient(g, op, grads):
    """A backward `if` on the same condition: each branch recomputes its forward branch
    and differentiates it, so the gradient flows through the branch taken."""
    args = op.inputs[1:]
    wanted = [k for k, a in enumerate(args) if _differentiable(a)]
    flowing = [k for k, (y, gy) in enumerate(zip(op.outputs, grads)) if gy is not None and _differentiable(y)]
    if not wanted or not flowing:
        return [None] * len(op.inputs)

    def backward(branch):
        body = Body(g.graph, f"{branch.name}_grad")
        with body.as_default():
            xs = [placeholder(a.dtype, a.shape, name=f"arg_{k}") for k, a in enumerate(args)]
            dys = [placeholder(grads[k].dtype, op.outputs[k].shape, name=f"grad_{k}") for k in flowing]
            ys = branch.call(xs)
            dxs = _gradients_or_zeros([ys[k] for k in flowing], dys, [xs[k] for k in wanted])
        body.inputs, body.outputs = xs + dys, dxs
        return body
    then, other = backward(op.attrs["then_branch"]), backward(op.attrs["else_branch"])
    with g.graph.as_default():
        node = g.graph.add_op(IF, [op.inputs[0], *args, *(grads[k] for k in flowing)],
                              {"then_branch": then, "else_branch": other})
    found = dict(zip(wanted, node.outputs))
    return [None] + [found.get(k) for k in range(len(args))]


def _entry_stacks(node):
    """Outputs of forward `while` node stacking, per iteration, the values the loop
    variables enter it with: {loop variable: stack}. Added to the node the first time
    (its body gives them as further stacked outputs); variables the body passes through
    unchanged need none."""
    if getattr(node, "entry_stacks", None) is not None:
        return node.entry_stacks
    body, n = node.attrs["body"], len(node.inputs)
    varying = [k for k in range(n) if body.outputs[k] is not body.inputs[k]]
    node.attrs = dict(node.attrs, body=body.with_outputs(body.outputs + [body.inputs[k] for k in varying]))
    first = len(node.outputs)
    for j, k in enumerate(varying):
        spec = body.inputs[k].spec
        node.outputs.append(Tensor(node, first + j, TensorSpec((None,) + spec.shape, spec.dtype)))
    node.entry_stacks = {k: node.outputs[first + j] for j, k in enumerate(varying)}
    return node.entry_stacks


@ops.gradient(WHILE)
def _while_gradient(g, op, grads):
    """A backward loop over the forward iterations in reverse: iteration i takes the loop
    variables' entry values from the forward loop's stacks, recomputes the body on them
    and maps the gradients of its outputs to those of its inputs. Loop variables the
    body passes through (captured weights) add up their gradient over the iterations."""
    from . import math_ops as m
    n = len(op.inputs)
    body = op.attrs["body"]
    # Stacked outputs the loop gives its users (before any entry stacks added for gradients).
    scans = len(body.outputs) - n - len(getattr(op.node, "entry_stacks", None) or {})
    diff = [k for k in range(n) if _differentiable(op.inputs[k])]
    scan_grads = [(j, grads[n + j]) for j in range(scans)
                  if grads[n + j] is not None and _differentiable(op.outputs[n + j])]
    if not diff:
        return [None] * n
    with g.graph.as_default():
        stacks = _entry_stacks(op.node)
        sized = list(stacks.values()) or [gr for _, gr in scan_grads]
        if not sized:  # nothing changes in the loop: the gradient passes through
            return [grads[k] if k in diff else None for k in range(n)]
        count = m.cast(m.gather(m.shape(sized[0]), 0), dtypes.int32)
        start = [grads[k] if grads[k] is not None else _zeros_like(op.outputs[k]) for k in diff]

        def backward(i, *dvs):
            at = m.subtract(m.subtract(count, 1), i)
            here = get_default_graph()  # the backward body: differentiate w.r.t. its own tensors
            entry = [m.gather(stacks[k], at) if k in stacks else here._own(op.inputs[k], WHILE) for k in range(n)]
            ys = body.call(entry)
            targets = [ys[k] for k in diff] + [ys[n + j] for j, _ in scan_grads]
            weights = list(dvs) + [m.gather(gr, at) for _, gr in scan_grads]
            return [m.add(i, 1)] + _gradients_or_zeros(targets, weights, [entry[k] for k in diff]), []
        outs = loop(lambda i, *dvs: m.less(i, count), backward, [constant(0, dtypes.int32)] + start,
                      [()] + [op.outputs[k].shape for k in diff], -1, f"{op.name}_grad")
    found = dict(zip(diff, outs[1:]))
    return [found.get(k) for k in range(n)]
