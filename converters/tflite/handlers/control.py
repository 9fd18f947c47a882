"""Control flow (edgeflow/ops/control.py): TFLite's WHILE and IF run subgraphs of the
model, converted with the builder's while_loop and cond."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import unsupported
from . import handler


def _call(ctx, op, option, args):
    from .. import call_subgraph
    s = op.option(option)
    return call_subgraph(ctx.model, s, list(args), ctx.depth + 1)


def _scalar(t, op):
    if any(d != 1 for d in t.shape):  # TFLite reads a condition of one element, whatever its rank
        raise unsupported(op, f"a condition of shape {t.shape}")
    if t.dtype != np.bool_:
        t = apply("cast", [t], {"dtype": np.dtype(np.bool_)}, name=f"{op.name}/bool")
    return apply("reshape", [t], {"shape": ()}, name=f"{op.name}/scalar") if len(t.shape) else t


@handler("WHILE", op="while")
def _while(ctx, op):
    from edgeflow.graph.control import while_loop
    body = ctx.model.subgraphs[op.option("body_subgraph_index")]
    loop_vars = [ctx.get(i) for i in op.inputs]
    # a loop variable keeps its shape, but for the dimensions the body declares dynamic
    shapes = [tuple(None if len(b) == len(t.shape) and b[k] is None else d for k, d in enumerate(t.shape))
              for t, b in zip(loop_vars, (body.tensors[i].shape for i in body.inputs))]
    outs = while_loop(lambda *v: _scalar(_call(ctx, op, "cond_subgraph_index", v)[0], op),
                      lambda *v: _call(ctx, op, "body_subgraph_index", v),
                      loop_vars, shape_invariants=shapes, name=f"{op.name}/while")
    for i, t in zip(op.outputs, outs):
        declared = ctx.subgraph.tensors[i].shape
        if None not in declared and None not in t.shape and tuple(declared) != tuple(t.shape) and \
                np.prod(declared, dtype=np.int64) == np.prod(t.shape, dtype=np.int64):
            # the body's outputs set the shape (a [1] counter that the body keeps as a scalar)
            t = apply("reshape", [t], {"shape": tuple(declared)}, name=f"{op.name}/shape{i}")
        ctx.set(i, t, exact=True)


@handler("IF", op="if")
def _if(ctx, op):
    from edgeflow.graph.control import cond
    args = [ctx.get(i) for i in op.inputs[1:]]
    outs = cond(_scalar(ctx.get(op.inputs[0]), op), lambda: _call(ctx, op, "then_subgraph_index", args),
                lambda: _call(ctx, op, "else_subgraph_index", args), name=f"{op.name}/if")
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for i, t in zip(op.outputs, outs):
        ctx.set(i, t, exact=True)
