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
    if node.attr("layout", 0) != 0:
        raise unsupported(node, "layout=1 (batch-major); only layout=0 is supported")
    acts = node.attr("activations")
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    if acts and [a.lower() for a in acts] != [a.lower() for a in _DEFAULT_ACTIVATIONS[node.op_type] * directions]:
        raise unsupported(node, f"activations {acts} (only the defaults are supported)")
    ins = [ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)]
    attrs = {"hidden_size": node.attr("hidden_size"), "direction": node.attr("direction", "forward"),
             "clip": float(node.attr("clip", 0.0)), **extra}
    onnx_index = {"B": 3, "initial_h": 5, "initial_c": 6}
    for name, flag in optional:
        present = ctx.has(node, onnx_index[name])
        attrs[flag] = present
        if present:
            ins.append(ctx.input(node, onnx_index[name]))
    outs = apply(op, ins, attrs, name=node.outputs[0] or f"{node.name}/Y")
    return list(outs)


@handler("LSTM")
def _lstm(ctx, node):
    return _recurrent(ctx, node, "lstm", LSTM_OPTIONAL, {"input_forget": bool(node.attr("input_forget", 0))})


@handler("GRU")
def _gru(ctx, node):
    return _recurrent(ctx, node, "gru", GRU_OPTIONAL,
                      {"linear_before_reset": int(node.attr("linear_before_reset", 0))})
