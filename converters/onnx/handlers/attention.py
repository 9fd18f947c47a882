"""Attention and RotaryEmbedding nodes (edgeflow/ops/attention.py)."""
from edgeflow.graph.math_ops import apply

from . import handler, unsupported

# ONNX's softmax_precision (a TensorProto element type) -> edgeflow's dtype name.
_PRECISIONS = {1: "float32", 10: "float16", 11: "float64"}


def _attention_attrs(node):
    precision = node.attr("softmax_precision")
    if precision is not None and precision not in _PRECISIONS:
        raise unsupported(node, f"softmax_precision {precision} (edgeflow computes in float16, float32 "
                                "or float64)")
    scale = node.attr("scale")
    if scale is not None and scale <= 0:
        raise unsupported(node, f"scale {scale} (edgeflow takes a positive scale)")
    return {"scale": scale or 0.0, "is_causal": bool(node.attr("is_causal", 0)),
            "q_num_heads": node.attr("q_num_heads", 0), "kv_num_heads": node.attr("kv_num_heads", 0),
            "softcap": node.attr("softcap", 0.0), "softmax_precision": _PRECISIONS.get(precision, ""),
            "left_window": node.attr("left_window_size", -1), "right_window": node.attr("right_window_size", -1)}


@handler("Attention", op="attention")
def _attention(ctx, node):
    ins = [ctx.input(node, i) for i in range(3)]
    attrs = _attention_attrs(node)
    if ctx.has(node, 4) != ctx.has(node, 5):
        raise unsupported(node, "past_key without past_value or the reverse (ONNX requires both)")
    for flag, index in (("has_mask", 3), ("has_past", 4), ("has_nonpad", 6)):
        attrs[flag] = ctx.has(node, index)
    ins += [ctx.input(node, i) for i in (3, 4, 5, 6) if ctx.has(node, i)]
    outputs = node.outputs + [""] * (4 - len(node.outputs))
    attrs["with_present"] = bool(outputs[1] or outputs[2])
    attrs["qk_output"] = node.attr("qk_matmul_output_mode", 0) if outputs[3] else -1
    made = apply("attention", ins, attrs, name=node.outputs[0])
    made = list(made) if isinstance(made, (list, tuple)) else [made]
    y, rest = made[0], made[1:]
    present = rest[:2] if attrs["with_present"] else [None, None]
    qk = rest[-1] if attrs["qk_output"] >= 0 else None
    return [y, *present, qk]


@handler("RotaryEmbedding", op="rotary_embedding")
def _rotary_embedding(ctx, node):
    ins = [ctx.input(node, i) for i in range(3)] + ([ctx.input(node, 3)] if ctx.has(node, 3) else [])
    attrs = {"interleaved": bool(node.attr("interleaved", 0)),
             "rotary_embedding_dim": node.attr("rotary_embedding_dim", 0), "num_heads": node.attr("num_heads", 0)}
    return apply("rotary_embedding", ins, attrs, name=node.outputs[0])
