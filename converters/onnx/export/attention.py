"""Attention and rotary embedding (edgeflow/ops/attention.py): ONNX's Attention, its absent
optional inputs and outputs holes where edgeflow's has_* attributes say so."""
from edgeflow import dtypes
from edgeflow.ops.attention import ATTENTION_OPTIONAL, attention_inputs

from . import elem_type, exporter, unsupported

SAME = {"rotary_embedding": "RotaryEmbedding"}


@exporter
def attention(g, op):
    a = op.attrs
    if a["left_window"] != -1 or a["right_window"] != -1:
        raise unsupported(op, "a sliding window (left_window, right_window): ONNX's Attention has none at opset 24")
    given = attention_inputs(op.inputs, a)
    ins = [given.get(name, "") for name in ["Q", "K", "V"] + [name for name, _ in ATTENTION_OPTIONAL]]
    while not ins[-1]:
        ins.pop()
    outs = op.outputs[:1] + (op.outputs[1:3] if a["with_present"] else ["", ""]) + \
        (op.outputs[-1:] if a["qk_output"] >= 0 else [])
    while not outs[-1]:
        outs.pop()
    attrs = {"is_causal": int(a["is_causal"]), "softcap": a["softcap"]}
    attrs.update((k, a[k]) for k in ("q_num_heads", "kv_num_heads", "scale") if a[k])
    if a["softmax_precision"]:
        attrs["softmax_precision"] = elem_type(dtypes.as_dtype(a["softmax_precision"]))
    if a["qk_output"] >= 0:
        attrs["qk_matmul_output_mode"] = a["qk_output"]
    g.node("Attention", ins, outs, **attrs)
