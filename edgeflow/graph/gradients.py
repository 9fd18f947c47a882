"""Reverse-mode autodiff on the graph: `ef.gradients(ys, xs)` adds gradient nodes.

Each op's rule lives beside its definition in edgeflow/ops (registered with
`@gradient(name)`); this module only walks the graph backwards, sums the gradients
that reach a tensor along several paths, and gives rules a small builder.
"""
import numpy as np

from .. import dtypes, ops
from ..errors import GraphError
from .graph import Tensor
from .math_ops import apply


class Builder:
    """What a gradient rule may use to add ops: `g(op, *inputs, **attrs)`."""

    def __init__(self, graph):
        self.graph = graph

    def __call__(self, op, *inputs, **attrs):
        with self.graph.as_default():
            return apply(op, list(inputs), attrs)

    def constant(self, value, like):
        """A scalar or array constant of `like`'s dtype."""
        from .graph import constant
        with self.graph.as_default():
            return constant(np.asarray(value, like.dtype))

    def sum_to(self, grad, like):
        """`grad` summed over the axes broadcasting added or stretched, to `like`'s shape."""
        if grad.shape == like.shape and None not in like.shape:
            return grad
        return self("sum_to", grad, like)

    def zeros_like(self, t):
        return self("constant_of_shape", self("shape", t), value=0.0, dtype=t.dtype)


class _Op:
    """The forward node as a rule sees it."""

    def __init__(self, node):
        self.inputs, self.outputs, self.attrs, self.name = node.inputs, node.outputs, node.attrs, node.name
        self.node = node  # for rules that extend the forward op (a while loop's stacks)


def _differentiable(t):
    return t.dtype in dtypes.FLOATS


def _between(ys, xs):
    """Nodes on some path from an x to a y."""
    from .save import needed_nodes
    upstream = needed_nodes(ys)
    downstream, frontier = set(), [x.node for x in xs]
    consumers = {}
    for node in upstream:
        for t in node.inputs:
            consumers.setdefault(t.node, []).append(node)
    while frontier:
        node = frontier.pop()
        if node in downstream:
            continue
        downstream.add(node)
        frontier.extend(consumers.get(node, ()))
    return upstream & downstream


def _total(parts, g):
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = g("add", total, p)
    return total


def gradients(ys, xs, grad_ys=None):
    """d(sum of ys)/d(x) for each x in xs, as tensors of the graph (None where no path).

    `grad_ys` weights each y (ones by default), as tf.gradients' does.
    """
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    xs = list(xs) if isinstance(xs, (list, tuple)) else [xs]
    for t in ys + xs:
        if not isinstance(t, Tensor):
            raise GraphError(f"gradients: expected Tensors, got {t!r}")
    graph = ys[0].graph
    g = Builder(graph)
    grad_ys = grad_ys if grad_ys is not None else [None] * len(ys)
    parts = {}
    for y, gy in zip(ys, grad_ys):
        if not _differentiable(y):
            raise GraphError(f"gradients: {y.name!r} is {y.dtype}; only float tensors have gradients")
        with graph.role("grad", y.node):
            seed = gy if gy is not None else (g.constant(1, y) if y.shape == () else g("constant_of_shape", g("shape", y), value=1.0, dtype=y.dtype))
        parts.setdefault(y, []).append(seed)
    between = _between(ys, xs)
    for node in reversed(graph.nodes):
        if node not in between:
            continue
        with graph.role("grad", node):
            _backprop(node, parts, between, g, graph)
    out = []
    for x in xs:  # the sum of the parts reaching x goes with x
        with graph.role("grad", x.node):
            out.append(_total(parts.get(x, []), g))
    return out


def _backprop(node, parts, between, g, graph):
    """Sum the gradients of `node`'s outputs and run its rule, adding its inputs' parts."""
    grads = [_total(parts.get(t, []), g) for t in node.outputs]
    for t, gr in zip(node.outputs, grads):
        if gr is not None:
            parts[t] = [gr]  # summed once; kept, since t may be one of the xs
    if all(gr is None for gr in grads) or not node.inputs:
        return
    rule = ops.get(node.op).gradient
    wanted = [t for t in node.inputs if t.node in between and _differentiable(t)]
    if not wanted:
        return
    if rule is None:
        raise GraphError(f"gradients: op {node.op} ({node.name!r}) has no gradient rule")
    with graph.device(node.device):
        in_grads = rule(g, _Op(node), grads)
    if len(in_grads) != len(node.inputs):
        raise AssertionError(f"gradient of {node.op} gave {len(in_grads)} results for "
                             f"{len(node.inputs)} inputs")
    for t, gr in zip(node.inputs, in_grads):
        if gr is not None and t.node in between and _differentiable(t):
            parts.setdefault(t, []).append(gr)
