"""RNN, LSTM and GRU (edgeflow/ops/rnn.py): edgeflow's present optional inputs back in
ONNX's positions, and its gate functions by ONNX's names."""
from edgeflow.ops.rnn import ACTIVATIONS, DEFAULT_ACTIVATIONS, GRU_OPTIONAL, LSTM_OPTIONAL, RNN_OPTIONAL, \
    activations, named_inputs

from . import exporter

RECURRENT = {"rnn": ("RNN", RNN_OPTIONAL), "lstm": ("LSTM", LSTM_OPTIONAL), "gru": ("GRU", GRU_OPTIONAL)}
_ONNX_ORDER = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
# ONNX's spelling of each gate function edgeflow names in lower case.
ONNX_NAMES = {name.lower(): name for name in ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu",
                                              "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus")}
assert ONNX_NAMES.keys() == ACTIVATIONS.keys()


@exporter(RECURRENT)
def recurrent(g, op):
    onnx_type, optional = RECURRENT[op.opcode]
    a = op.attrs
    given = named_inputs(op.opcode, op.inputs, a, optional)
    ins = [given.get(name, "") for name in _ONNX_ORDER]
    while not ins[-1]:
        ins.pop()
    attrs = {"hidden_size": a["hidden_size"], "direction": a["direction"]}
    if a["clip"]:
        attrs["clip"] = a["clip"]
    attrs.update((k, int(a[k])) for k in ("input_forget", "linear_before_reset") if k in a)
    functions = activations(op.opcode, a)
    defaults = list(DEFAULT_ACTIVATIONS[op.opcode]) * (2 if a["direction"] == "bidirectional" else 1)
    if [n for n, _, _ in functions] != defaults or a["activation_alpha"] or a["activation_beta"]:
        # ONNX reads alpha and beta in order, one per function that takes them.
        attrs["activations"] = [ONNX_NAMES[n] for n, _, _ in functions]
        alphas = [alpha for n, alpha, _ in functions if ACTIVATIONS[n][0] is not None]
        betas = [beta for n, _, beta in functions if ACTIVATIONS[n][1] is not None]
        attrs.update((k, v) for k, v in (("activation_alpha", alphas), ("activation_beta", betas)) if v)
    g.node(onnx_type, ins, op.outputs, **attrs)
