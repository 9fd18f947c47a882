"""RNN, LSTM and GRU nodes. ONNX leaves absent optional inputs as holes; edgeflow's ops take
the present ones in order and say which with has_* attributes."""
import numpy as np

from edgeflow.graph.graph import constant
from edgeflow.graph.math_ops import apply
from edgeflow.ops.rnn import ACTIVATIONS, DEFAULT_ACTIVATIONS, DIRECTIONS, GRU_OPTIONAL, LSTM_OPTIONAL, RNN_OPTIONAL

from . import handler, unsupported

# ONNX's input positions of the optional inputs.
_ONNX_INDEX = {"B": 3, "sequence_lens": 4, "initial_h": 5, "initial_c": 6, "P": 7}
_GATES = {"rnn": 1, "gru": 3, "lstm": 4}


def _activations(node, op, directions):
    """(activations, activation_alpha, activation_beta) attrs of the edgeflow op: ONNX's
    alphas and betas are consumed in order by the functions that take them (as onnxruntime
    reads them); edgeflow's ops hold one of each per function, defaults filled in."""
    names = [a.lower() for a in node.attr("activations", ())]
    if not names:
        names = list(DEFAULT_ACTIVATIONS[op] * directions)
    unknown = [n for n in names if n not in ACTIVATIONS]
    if unknown:
        raise unsupported(node, f"activations {unknown} (ONNX's RNN functions are {sorted(ACTIVATIONS)})")
    alphas, betas = list(node.attr("activation_alpha", ())), list(node.attr("activation_beta", ()))
    per_alpha, per_beta = [], []
    for n in names:
        alpha, beta = ACTIVATIONS[n]
        per_alpha.append(float(alphas.pop(0)) if alpha is not None and alphas else alpha or 0.0)
        per_beta.append(float(betas.pop(0)) if beta is not None and betas else beta or 0.0)
    if names == list(DEFAULT_ACTIVATIONS[op] * directions):
        return {}
    return {"activations": ",".join(names), "activation_alpha": tuple(per_alpha), "activation_beta": tuple(per_beta)}


def _zeros(x, node, name, hidden, directions):
    """Zeros standing in for an absent optional float input (static shape where it can be)."""
    gates = _GATES[node.op_type.lower()]
    if name == "B":
        return constant(np.zeros((directions, 2 * gates * hidden), x.dtype), name=f"{node.name}/B")
    if name == "P":
        return constant(np.zeros((directions, 3 * hidden), x.dtype), name=f"{node.name}/P")
    if x.shape[1] is not None:
        return constant(np.zeros((directions, x.shape[1], hidden), x.dtype), name=f"{node.name}/{name}")
    batch = apply("shape", [x], {"start": 1, "end": 2})
    dims = apply("concat", [constant(np.array([directions], np.int64)), batch,
                            constant(np.array([hidden], np.int64))], {"axis": 0})
    return apply("constant_of_shape", [dims], {"value": 0.0, "dtype": x.dtype}, name=f"{node.name}/{name}")


def _recurrent(ctx, node, op, optional, extra):
    directions = DIRECTIONS.get(node.attr("direction", "forward"), 1)
    batch_major = node.attr("layout", 0) == 1

    def operand(i):
        # layout=1 puts batch first in X, the initial states and the outputs; edgeflow's
        # ops take them sequence- and direction-major: swap the two leading axes around them.
        t = ctx.input(node, i)
        return _swap_leading(t, f"{node.name}/input{i}") if batch_major and i in (0, 5, 6) else t

    ins = [operand(0), operand(1), operand(2)]
    hidden = node.attr("hidden_size")
    attrs = {"hidden_size": hidden, "direction": node.attr("direction", "forward"),
             "clip": float(node.attr("clip", 0.0)), **_activations(node, op, directions), **extra}
    with_lens = ctx.has(node, _ONNX_INDEX["sequence_lens"])
    for name, flag in optional:
        index = _ONNX_INDEX[name]
        present = ctx.has(node, index)
        if present:
            t = operand(index)
            if name == "sequence_lens" and t.dtype != np.int32:
                t = apply("cast", [t], {"dtype": np.int32}, name=f"{node.name}/sequence_lens")
            ins.append(t)
        elif with_lens:  # the lengths are typed last: every float input comes before them
            ins.append(_zeros(ins[0], node, name, hidden, directions))
            present = True
        attrs[flag] = present
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


@handler("RNN", op="rnn")
def _rnn(ctx, node):
    return _recurrent(ctx, node, "rnn", RNN_OPTIONAL, {})
