"""if and while (edgeflow/ops/control.py) as ONNX's If and Loop. A branch reads the if's
arguments from the enclosing graph; a Loop body runs edgeflow's body, then its condition
on the new loop variables (the condition on the first ones runs before the Loop)."""
import numpy as np

from edgeflow.ops import TensorSpec

from . import exporter, spec_of, value_info


@exporter
def if_(g, op):
    """If on the condition; each branch writes its subgraph on the if's other inputs."""
    def branch(key):
        index = op.attrs[key]
        sg = g.model.subgraphs[index]
        child = g.child()
        outs = child.inline(index, op.inputs[1:])
        return child.graph(f"{op.outputs[0]}/{key}", [], child.outputs(outs, [_spec(sg, t) for t in sg.outputs]))
    g.node("If", op.inputs[:1], op.outputs, then_branch=branch("then_branch"), else_branch=branch("else_branch"))


@exporter
def while_(g, op):
    """Loop(maximum_iterations or none, cond(loop vars), loop vars) whose body gives
    cond(new loop vars), the new loop vars and the values stacked over the iterations."""
    cond, body, limit = op.attrs["cond"], op.attrs["body"], op.attrs["maximum_iterations"]
    n, cond_out = len(op.inputs), _spec(g.model.subgraphs[cond], g.model.subgraphs[cond].outputs[0])
    (first,) = g.inline(cond, op.inputs)
    child = g.child()
    step, running = child.fresh(f"{op.outputs[0]}/iteration"), child.fresh(f"{op.outputs[0]}/running")
    carried = [child.fresh(f"{name}/carried") for name in op.inputs]
    outs = child.inline(body, carried)
    (again,) = child.inline(cond, outs[:n])
    sg = g.model.subgraphs[body]
    body_graph = child.graph(
        f"{op.outputs[0]}/body",
        [value_info(step, np.int64, ()), value_info(running, np.bool_, ())] +
        [value_info(name, s.dtype, s.shape) for name, s in zip(carried, op.output_specs[:n])],
        child.outputs([child.scalar(again, cond_out.rank)] + outs,
                      [_bool_scalar()] + list(op.output_specs[:n]) + [_spec(sg, t) for t in sg.outputs[n:]]))
    trips = g.const(np.array(limit, np.int64), "maximum_iterations") if limit >= 0 else ""
    g.node("Loop", [trips, g.scalar(first, cond_out.rank), *op.inputs], op.outputs, body=body_graph)


def _spec(sg, t):
    return spec_of(sg.tensors[t])


def _bool_scalar():
    return TensorSpec((), np.dtype(np.bool_))
