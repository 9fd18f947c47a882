"""Control flow: ops that run subgraphs of the model (TFLite's IF and WHILE).

    if(cond, *args)       runs subgraph `then_branch` or `else_branch` on `args`; both take
                          the args and give the op's outputs.
    while(*loop_vars)     runs subgraph `body` (loop vars -> new loop vars, then K values
                          stacked over the iterations) while subgraph `cond` (loop vars ->
                          a bool scalar) gives true, at most `maximum_iterations` times when
                          that is not -1. Outputs: the final loop vars, then the K stacks
                          (shape [iterations, ...]).

Values a subgraph reads from outside are explicit op inputs (a while loop passes them
through its body unchanged), so a subgraph sees nothing but its inputs and constants.
`check_subgraphs` holds the rules that the op and its subgraphs must agree on; the file
verifier and the builder both apply it. The interpreter runs these ops with
edgeflow/interp/control.py; their gradients are in edgeflow/graph/control.py.
"""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define
from .dims import fmt

IF, WHILE = "if", "while"


def merge_shapes(a, b):
    """The shape both `a` and `b` fit (None where they differ), or None if ranks differ."""
    if len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def check_subgraphs(opcode, attrs, in_dtypes, out_dtypes, signature):
    """Messages (empty if none) where the op and its subgraphs disagree on arity or dtypes.

    `signature(name)` gives (input dtypes, output dtypes) of the subgraph that attr `name`
    names; `out_dtypes` is None when the op's outputs are not known yet (the builder).
    """
    problems = []

    def agree(what, got, want):
        if list(got) != list(want):
            problems.append(f"{what}: {_names(got)} where {_names(want)} is expected")

    if opcode == IF:
        for name in ("then_branch", "else_branch"):
            ins, outs = signature(name)
            agree(f"{name} inputs", ins, in_dtypes[1:])
            if out_dtypes is not None:
                agree(f"{name} outputs", outs, out_dtypes)
        if out_dtypes is None:
            agree("else_branch outputs", signature("else_branch")[1], signature("then_branch")[1])
    elif opcode == WHILE:
        n = len(in_dtypes)
        if attrs.get("maximum_iterations", -1) < -1:
            problems.append(f"maximum_iterations is {attrs['maximum_iterations']}; give a bound >= 0, or -1 for none")
        ins, outs = signature("cond")
        agree("cond inputs", ins, in_dtypes)
        agree("cond outputs", outs, [dtypes.bool_])
        ins, outs = signature("body")
        agree("body inputs", ins, in_dtypes)
        if len(outs) < n:
            problems.append(f"body gives {len(outs)} outputs; it must give the {n} loop variables first")
        else:
            agree("body outputs (the loop variables)", outs[:n], in_dtypes)
            if out_dtypes is not None:
                agree("outputs", out_dtypes, list(in_dtypes) + list(outs[n:]))
    return problems


def _names(dts):
    return "(" + ", ".join(dtypes.name(d) for d in dts) + ")"


def _specs(body):
    """(input specs, output specs) of a subgraph being built (a Body)."""
    return body.input_specs, body.output_specs


def _check(opcode, inputs, attrs):
    problems = check_subgraphs(opcode, attrs, [s.dtype for s in inputs], None,
                               lambda name: tuple([s.dtype for s in specs] for specs in _specs(attrs[name])))
    if problems:
        raise GraphError(f"{opcode}: " + "; ".join(problems))


@define(IF, types=Types("cond: bool, any* -> any*"), outputs="subgraphs",
        attrs={"then_branch": Attr(AttrKind.SUBGRAPH), "else_branch": Attr(AttrKind.SUBGRAPH)})
def if_(inputs, attrs):
    """if(cond, *args): the outputs of subgraph then_branch(*args) when cond (a one-element
    bool tensor) is true, else of else_branch(*args). Both give the same dtypes."""
    if inputs[0].shape not in ((), (1,)) and None not in inputs[0].shape:
        raise GraphError(f"if: cond must hold one bool, got shape {fmt(inputs[0].shape)}")
    _check(IF, inputs, attrs)
    then, other = attrs["then_branch"].output_specs, attrs["else_branch"].output_specs
    out = []
    for k, (a, b) in enumerate(zip(then, other)):
        shape = merge_shapes(a.shape, b.shape)
        if shape is None:
            raise GraphError(f"if: output {k} has rank {len(a.shape)} in then_branch "
                             f"{fmt(a.shape)} but {len(b.shape)} in else_branch {fmt(b.shape)}")
        out.append(TensorSpec(shape, a.dtype))
    return out


@define(WHILE, types=Types("any* -> any*"), outputs="subgraphs",
        attrs={"cond": Attr(AttrKind.SUBGRAPH), "body": Attr(AttrKind.SUBGRAPH),
               "maximum_iterations": Attr(AttrKind.INT, -1)})
def while_(inputs, attrs):
    """while(*loop_vars): loop_vars = body(*loop_vars)[:N] while cond(*loop_vars), at most
    maximum_iterations times (-1: no bound). Outputs: the final loop vars, then each
    further output of body stacked over the iterations, shape [iterations, ...]."""
    _check(WHILE, inputs, attrs)
    body_out = attrs["body"].output_specs
    n = len(inputs)
    out = []
    for k, (a, b) in enumerate(zip(inputs, body_out[:n])):
        shape = merge_shapes(a.shape, b.shape)
        if shape is None:
            raise GraphError(f"while: loop variable {k} enters as {fmt(a.shape)} and the body "
                             f"makes it {fmt(b.shape)}: its rank may not change")
        out.append(TensorSpec(shape, a.dtype))
    return out + [TensorSpec((None,) + s.shape, s.dtype) for s in body_out[n:]]
