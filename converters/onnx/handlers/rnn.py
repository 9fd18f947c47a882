"""LSTM and GRU nodes. ONNX leaves absent optional inputs as holes; edgeflow's ops take
the present ones in order and say which with has_* attributes."""
from edgeflow.graph.math_ops import apply
from edgeflow.ops.rnn import GRU_OPTIONAL, LSTM_OPTIONAL

from . import handler, unsupported

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _recurrent(ctx, node, op, optional, extra):
    if ctx.has(node, 4):
        raise unsupported(node, "sequence_lens (pad sequences to one length instead)")
    if node.op_type == "LSTM" and ctx.has(node, 7):
        raise unsupported(node, "peephole weights (P)")
    acts = node.attr("activations")
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    if acts and [a.lower() for a in acts] != [a.lower() for a in _DEFAULT_ACTIVATIONS[node.op_type] * directions]:
        raise unsupported(node, f"activations {acts} (only the defaults are supported)")
    batch_major = node.attr("layout", 0) == 1

    def operand(i):
        # layout=1 puts batch first in X, the initial states and the outputs; edgeflow's
        # ops take them sequence- and direction-major: swap the two leading axes around them.
        t = ctx.input(node, i)
        return _swap_leading(t, f"{node.name}/input{i}") if batch_major and i in (0, 5, 6) else t

    ins = [operand(0), operand(1), operand(2)]
    attrs = {"hidden_size": node.attr("hidden_size"), "direction": node.attr("direction", "forward"),
             "clip": float(node.attr("clip", 0.0)), **extra}
    onnx_index = {"B": 3, "initial_h": 5, "initial_c": 6}
    for name, flag in optional:
        present = ctx.has(node, onnx_index[name])
        attrs[flag] = present
        if present:
            ins.append(operand(onnx_index[name]))
    if not batch_major:
        return list(apply(op, ins, attrs, name=node.outputs[0] or f"{node.name}/Y"))
    y, *states = apply(op, ins, attrs, name=f"{node.name}/seq_major")
    names = [o or f"{node.name}/output{k}" for k, o in enumerate(node.outputs + [""] * 3)]
    return [apply("transpose", [y], {"perm": (2, 0, 1, 3)}, name=names[0]),
            *(_swap_leading(t, name) for t, name in zip(states, names[1:]))]


def _swap_leading(t, name):
    return apply("transpose", [t], {"perm": (1, 0, 2)}, name=name)


@handler("LSTM", op="lstm")
def _lstm(ctx, node):
    return _recurrent(ctx, node, "lstm", LSTM_OPTIONAL, {"input_forget": bool(node.attr("input_forget", 0))})


@handler("GRU", op="gru")
def _gru(ctx, node):
    return _recurrent(ctx, node, "gru", GRU_OPTIONAL,
                      {"linear_before_reset": int(node.attr("linear_before_reset", 0))})
