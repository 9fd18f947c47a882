"""If, Loop and Scan (edgeflow/ops/control.py): each subgraph (a GraphProto attribute) is
converted by the same handlers in a child context (Context.subgraph) while the branch or
loop body being built is the default graph; names of enclosing scopes resolve to their
tensors, which the body captures as inputs.

A loop variable is shaped as it enters the loop; where the body gives it another shape
the body is built again with those dimensions unknown (None), until they agree."""
import numpy as np

from edgeflow import dtypes
from edgeflow.graph import control, math_ops as m
from edgeflow.graph.graph import constant
from edgeflow.ops.control import merge_shapes

from ..context import Sequence
from . import handler, unsupported

_NO_SEQUENCES = "edgeflow has no sequence values"


def _scalar(t):
    """One-element tensor `t` as a scalar."""
    return t if t.shape == () else m.reshape(t, ())


def _tensors(node, values, what):
    """`values`, refused (UnsupportedOpError) if one is a sequence."""
    if any(isinstance(v, Sequence) for v in values):
        raise unsupported(node, f"{what} is a sequence: {_NO_SEQUENCES}")
    return values


@handler("If", op="if")
def _if(ctx, node):
    then, other = node.attrs["then_branch"], node.attrs["else_branch"]
    known = ctx.value(node, 0)
    if known is not None:  # the branch taken is known now: its nodes, inlined
        return ctx.subgraph(then if bool(np.asarray(known).reshape(-1)[0]) else other)

    def branch(graph):
        return lambda: _tensors(node, ctx.subgraph(graph), "an output of a branch taken when running")
    outs = control.cond(_scalar(ctx.input(node, 0)), branch(then), branch(other), name=node.outputs[0])
    return list(outs)


class _Loosen(Exception):
    """The body gave loop variables shapes their placeholders do not admit: build it again
    with these shapes."""

    def __init__(self, shapes):
        super().__init__(shapes)
        self.shapes = shapes


def _while(leaves, cond_fn, step, name):
    """control.loop on loop variables `leaves`: `step(*vars)` gives (new vars, values to
    stack). The variables' placeholders are shaped as they enter, with None where `step`
    changes a dimension (found by building again)."""
    shapes = [tuple(t.shape) for t in leaves]

    def body(*params):
        new, stacks = step(*params)
        loose = [merge_shapes(s, v.shape) if v.rank == len(s) else s for s, v in zip(shapes, new)]
        if loose != shapes:  # a rank change is left for control.loop to report
            raise _Loosen(loose)
        return new, stacks

    for _ in range(1 + sum(len(s) for s in shapes)):  # each try makes one more dimension None
        try:
            return control.loop(cond_fn, body, leaves, shapes, -1, name)
        except _Loosen as e:
            shapes = e.shapes
    raise AssertionError("loop variable shapes did not settle")  # unreachable: dims only loosen


@handler("Loop", op="while")
def _loop(ctx, node):
    """Loop variables (iteration count, condition, v...): the loop runs while the
    condition holds (when given) and the count is below M (when given)."""
    body = node.attrs["body"]
    trip = _scalar(ctx.input(node, 0)) if ctx.has(node, 0) else None
    given = ctx.has(node, 1)
    start = _scalar(ctx.input(node, 1)) if given else constant(True)
    initial = _tensors(node, [ctx.any_input(node, i) for i in range(2, len(node.inputs))],
                       "a loop-carried value")
    n = len(initial)
    if trip is not None and trip.dtype != dtypes.int64:
        trip = m.cast(trip, dtypes.int64)

    def cond_fn(i, running, *_):
        parts = ([running] if given else []) + ([m.less(i, trip)] if trip is not None else [])
        if not parts:
            return constant(True)
        return parts[0] if len(parts) == 1 else m.apply("logical_and", parts)

    def step(i, running, *values):
        outs = _tensors(node, ctx.subgraph(body, [i, running, *values]), "a loop body output")
        if len(outs) < 1 + n:
            raise unsupported(node, f"the body gives {len(outs)} outputs for {n} loop-carried values")
        return [m.add(i, constant(np.int64(1))), _scalar(outs[0]), *outs[1:1 + n]], outs[1 + n:]

    outs = _while([constant(np.int64(0)), start, *initial], cond_fn, step, node.outputs[0] or node.name)
    return outs[2:]


@handler("Scan", op="while")
def _scan(ctx, node):
    """A loop over slices of the scan inputs along their axes (reversed where the
    directions say): state variables carried, scan outputs stacked along their axes."""
    if node.opset < 9:
        raise unsupported(node, "Scan before opset 9 (batched, with sequence_lens) is not supported")
    body = node.attrs["body"]
    k = node.attr("num_scan_inputs")
    args = [ctx.input(node, i) for i in range(len(node.inputs))]
    n = len(args) - k
    states, xs = args[:n], args[n:]
    in_axes = [a + x.rank if a < 0 else a for a, x in zip(node.attr("scan_input_axes", [0] * k), xs)]
    in_reverse = node.attr("scan_input_directions", [0] * k)
    scans = len(body.output) - n
    out_axes, out_reverse = node.attr("scan_output_axes", [0] * scans), node.attr("scan_output_directions", [0] * scans)
    steps = xs[0].shape[in_axes[0]]
    length = constant(np.int64(steps)) if steps is not None else m.gather(m.shape(xs[0]), in_axes[0])

    def step(i, *values):
        last = m.subtract(length, constant(np.int64(1)))
        at = [m.subtract(last, i) if rev else i for rev in in_reverse]
        slices = [m.gather(x, t, axis=a) for x, t, a in zip(xs, at, in_axes)]
        outs = ctx.subgraph(body, [*values, *slices])
        return [m.add(i, constant(np.int64(1))), *outs[:n]], outs[n:]

    outs = _while([constant(np.int64(0)), *states], lambda i, *_: m.less(i, length), step,
                  node.outputs[0] or node.name)
    finals, stacks = outs[1:1 + n], outs[1 + n:]
    placed = []
    for stack, axis, rev in zip(stacks, out_axes, out_reverse):
        if rev:
            stack = m.strided_slice(stack, [-1], [-(2 ** 62)], [0], [-1])
        axis = axis + stack.rank if axis < 0 else axis
        if axis:
            perm = list(range(1, stack.rank))
            perm.insert(axis, 0)
            stack = m.transpose(stack, perm)
        placed.append(stack)
    return finals + placed
