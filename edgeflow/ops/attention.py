"""Attention and rotary position embedding, as ONNX defines them (Attention opsets 23-25,
RotaryEmbedding opset 23).

`attention` is scaled dot-product attention over heads: softmax(Q K^T * scale + bias) V,
with grouped-query heads (kv_num_heads dividing q_num_heads: query head h reads key/value
head h // (q_num_heads / kv_num_heads)), a key/value cache, soft-capped scores, and a bias
made of a mask, a causal frontier, a sliding window and per-batch padding lengths.

ONNX leaves absent optional inputs as holes; edgeflow's ops take the present ones in
order and say which with has_* attributes: Q, K, V, then attn_mask (has_mask),
past_key and past_value (has_past), nonpad_kv_seqlen (has_nonpad).
"""
from .. import dtypes
from ..errors import GraphError
from .dims import fmt
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient

ATTENTION_OPTIONAL = (("attn_mask", "has_mask"), ("past_key", "has_past"), ("past_value", "has_past"),
                      ("nonpad_kv_seqlen", "has_nonpad"))
SOFTMAX_PRECISIONS = ("", "float16", "float32", "float64")
# The qk_matmul_output modes: 0 raw Q K^T * scale, 1 after softcap, 2 with the bias added,
# 3 the softmax probabilities.
QK_MODES = (0, 1, 2, 3)

_I, _B, _F = AttrKind.INT, AttrKind.BOOL, AttrKind.FLOAT


def attention_inputs(inputs, attrs):
    """`inputs` by ONNX name: Q, K, V, then the optional ones whose has_* attribute is set."""
    names = ["Q", "K", "V"] + [name for name, flag in ATTENTION_OPTIONAL if attrs[flag]]
    if len(inputs) != len(names):
        raise GraphError(f"attention: with these has_* attributes the inputs are ({', '.join(names)}), "
                         f"got {len(inputs)} inputs")
    return dict(zip(names, inputs))


def attention_outputs(attrs):
    return 1 + 2 * attrs["with_present"] + (attrs["qk_output"] >= 0)


def _same(what, dims):
    """The one known value among `dims` (None if none is known); GraphError if they disagree."""
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise GraphError(f"attention: {what} disagrees between inputs: {sorted(known)}")
    return known.pop() if known else None


def _split_heads(name, spec, heads):
    """(batch, heads, seq, head size) of a 3D (batch, seq, heads * size) or 4D input."""
    if spec.rank == 4:
        return spec.shape
    batch, seq, hidden = spec.shape
    if hidden is not None and hidden % heads:
        raise GraphError(f"attention: {name} has hidden size {hidden}, not a multiple of its {heads} heads")
    return batch, heads, seq, None if hidden is None else hidden // heads


def _check_attrs(attrs, rank):
    if rank == 3 and (attrs["q_num_heads"] <= 0 or attrs["kv_num_heads"] <= 0):
        raise GraphError("attention: 3D inputs need q_num_heads and kv_num_heads (both positive), got "
                         f"{attrs['q_num_heads']} and {attrs['kv_num_heads']}")
    if attrs["softmax_precision"] not in SOFTMAX_PRECISIONS:
        raise GraphError(f"attention: softmax_precision must be one of {SOFTMAX_PRECISIONS}, "
                         f"got {attrs['softmax_precision']!r}")
    if attrs["qk_output"] not in (-1,) + QK_MODES:
        raise GraphError(f"attention: qk_output must be -1 (none) or a mode {QK_MODES}, got {attrs['qk_output']}")
    for key in ("left_window", "right_window"):
        if attrs[key] < -1:
            raise GraphError(f"attention: {key} must be -1 (unbounded) or >= 0, got {attrs[key]}")
    if attrs["softcap"] < 0 or attrs["scale"] < 0:
        raise GraphError(f"attention: softcap and scale must be >= 0, got {attrs['softcap']} and {attrs['scale']}")


def _check_optional(x, q, v, batch, kv_heads, sizes, total):
    """Dtypes and shapes of the optional inputs present in `x`."""
    mask = x.get("attn_mask")
    if mask is not None:
        if mask.rank > 4 or mask.rank < 1:
            raise GraphError(f"attention: attn_mask must have rank 1 to 4, got {fmt(mask.shape)}")
        if mask.dtype != dtypes.bool_ and mask.dtype != dtypes.bfloat16 and mask.dtype not in dtypes.NUMERIC:
            raise GraphError(f"attention: attn_mask: dtype {dtypes.name(mask.dtype)} not supported")
        last = mask.shape[-1]
        if None not in (last, total) and last > total:
            raise GraphError(f"attention: attn_mask has {last} keys, more than the {total} attended")
    for name, like, size in (("past_key", q, sizes[0]), ("past_value", v, sizes[1])):
        spec = x.get(name)
        if spec is None:
            continue
        if spec.dtype != like.dtype:
            raise GraphError(f"attention: {name} must be {like.dtype}, got {spec.dtype}")
        expected = (batch, kv_heads, None, size)
        if spec.rank != 4 or any(None not in (d, e) and d != e for d, e in zip(spec.shape, expected)):
            raise GraphError(f"attention: {name} must have shape {fmt(expected)}, got {fmt(spec.shape)}")
    lengths = x.get("nonpad_kv_seqlen")
    if lengths is not None:
        if lengths.dtype not in dtypes.INDEX or lengths.rank != 1:
            raise GraphError(f"attention: nonpad_kv_seqlen must be int64 of shape (batch,), got "
                             f"{lengths.dtype} {fmt(lengths.shape)}")
        if "past_key" in x:
            raise GraphError("attention: nonpad_kv_seqlen (an external cache) excludes past_key and past_value")


def attention_shapes(inputs, attrs):
    """Dimensions of an attention op's operands: a dict with batch, q_heads, kv_heads,
    q_seq, kv_seq (new keys), past, total (past + kv_seq), head (of Q and K), v_head."""
    x = attention_inputs(inputs, attrs)
    q, k, v = x["Q"], x["K"], x["V"]
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise GraphError(f"attention: Q, K and V must all be 3D or all 4D, got {fmt(q.shape)}, "
                         f"{fmt(k.shape)} and {fmt(v.shape)}")
    _check_attrs(attrs, q.rank)
    qb, qh, qs, qd = _split_heads("Q", q, attrs["q_num_heads"])
    kb, kh, ks, kd = _split_heads("K", k, attrs["kv_num_heads"])
    vb, vh, vs, vd = _split_heads("V", v, attrs["kv_num_heads"])
    batch = _same("the batch size", [qb, kb, vb])
    kv_heads = _same("the number of key/value heads", [kh, vh])
    if None not in (qh, kv_heads) and (kv_heads == 0 or qh % kv_heads):
        raise GraphError(f"attention: {qh} query heads are not a multiple of {kv_heads} key/value heads")
    head = _same("the head size of Q and K", [qd, kd])
    past = x["past_key"].shape[2] if "past_key" in x else 0
    if "past_value" in x:
        past = _same("the past sequence length", [past, x["past_value"].shape[2]])
    kv_seq = _same("the key/value sequence length", [ks, vs])
    total = None if None in (past, kv_seq) else past + kv_seq
    _check_optional(x, q, v, batch, kv_heads, (head, vd), total)
    return {"batch": batch, "q_heads": qh, "kv_heads": kv_heads, "q_seq": qs, "kv_seq": kv_seq,
            "past": past, "total": total, "head": head, "v_head": vd, "rank": q.rank, "inputs": x}


def _attention_flops(inputs, outputs, attrs):
    d = attention_shapes(inputs, attrs)
    return 2 * d["batch"] * d["q_heads"] * d["q_seq"] * d["total"] * (d["head"] + d["v_head"])


_ATTENTION_ATTRS = {
    "scale": Attr(_F, 0.0), "is_causal": Attr(_B, False), "q_num_heads": Attr(_I, 0), "kv_num_heads": Attr(_I, 0),
    "softcap": Attr(_F, 0.0), "softmax_precision": Attr(AttrKind.STRING, ""), "left_window": Attr(_I, -1),
    "right_window": Attr(_I, -1), "has_mask": Attr(_B, False), "has_past": Attr(_B, False),
    "has_nonpad": Attr(_B, False), "with_present": Attr(_B, False), "qk_output": Attr(_I, -1)}


@define("attention", types=Types("Q: T1, K: T1, V: T2, any?, any?, any?, any? -> T1, T1?, T2?, T1?",
                                 T1=dtypes.FLOATS | {dtypes.bfloat16}, T2=dtypes.FLOATS | {dtypes.bfloat16}),
        outputs=attention_outputs, flops=_attention_flops, attrs=_ATTENTION_ATTRS)
def _attention(inputs, attrs):
    """ONNX Attention: Y = softmax(Q K^T * scale + bias) V per head, Q (batch, q_heads, q_seq,
    head) and K, V (batch, kv_heads, kv_seq, head or v_head), or 3D (batch, seq, heads * size)
    with q_num_heads and kv_num_heads. scale 0: 1 / sqrt(head). past_key/past_value
    (batch, kv_heads, past, size) go before K and V. softcap > 0 maps scores s to
    softcap * tanh(s / softcap). The bias adds attn_mask (bool: True attends; float: added;
    its last axis padded to past + kv_seq with "not attended"), and -inf where key j is
    outside the causal frontier j <= i + offset (is_causal) or the window
    i + offset - left_window <= j <= i + offset + right_window (-1: unbounded), or past
    nonpad_kv_seqlen[b]; offset is past, or nonpad_kv_seqlen[b] - q_seq. A query whose
    every key is masked gives zeros. softmax_precision names the softmax's dtype ("": T1's).
    Outputs Y; with_present: present_key, present_value (past and new keys); qk_output >= 0:
    the scores of that mode (0: Q K^T * scale, 1: softcapped, 2: biased, 3: probabilities).
    """
    d = attention_shapes(inputs, attrs)
    x = d["inputs"]
    q, k, v = x["Q"], x["K"], x["V"]
    if d["rank"] == 3:
        y = (d["batch"], d["q_seq"], None if d["v_head"] is None else d["q_heads"] * d["v_head"])
    else:
        y = (d["batch"], d["q_heads"], d["q_seq"], d["v_head"])
    outs = [TensorSpec(y, q.dtype)]
    if attrs["with_present"]:
        outs += [TensorSpec((d["batch"], d["kv_heads"], d["total"], d["head"]), k.dtype),
                 TensorSpec((d["batch"], d["kv_heads"], d["total"], d["v_head"]), v.dtype)]
    if attrs["qk_output"] >= 0:
        outs.append(TensorSpec((d["batch"], d["q_heads"], d["q_seq"], d["total"]), q.dtype))
    if "attn_mask" in x:
        target = (d["batch"], d["q_heads"], d["q_seq"])
        dims = x["attn_mask"].shape[-2::-1]
        if any(None not in (a, b) and a not in (1, b) for a, b in zip(dims, target[::-1])):
            raise GraphError(f"attention: attn_mask {fmt(x['attn_mask'].shape)} does not broadcast to "
                             f"{fmt(target + (d['total'],))}")
    return outs


# -- gradients -----------------------------------------------------------------------------
# attention_grad recomputes the forward pass (in float64) and takes dY, and dpresent_key and
# dpresent_value when the forward op gives them; it gives dQ, dK, dV, and d past_key and
# d past_value when the forward op takes them. attn_mask and nonpad_kv_seqlen get none.

@define("attention_grad", types=Types("Q: T1, K: T1, V: T2, any?, any?, any?, any?, any?, any?, any? "
                                      "-> dQ: T1, dK: T1, dV: T2, T1?, T2?", T1=dtypes.FLOATS, T2=dtypes.FLOATS),
        outputs=lambda attrs: 3 + 2 * attrs["has_past"], attrs=_ATTENTION_ATTRS,
        flops=lambda ins, outs, attrs: 2 * _attention_flops(ins[:len(ins) - 1 - 2 * attrs["with_present"]],
                                                            outs, attrs))
def _attention_grad(inputs, attrs):
    """The gradients of attention's Q, K, V (then past_key, past_value), given its inputs
    and the gradients of Y (then present_key, present_value)."""
    n = 1 + 2 * attrs["with_present"]
    forward, dys = inputs[:-n], inputs[-n:]
    outs = _attention(forward, {**attrs, "qk_output": -1})
    for name, dy, out in zip(("dY", "dpresent_key", "dpresent_value"), dys, outs):
        if dy.dtype != out.dtype or dy.rank != len(out.shape) or any(
                None not in (a, b) and a != b for a, b in zip(dy.shape, out.shape)):
            raise GraphError(f"attention_grad: {name} must be {out.dtype} {fmt(out.shape)}, got "
                             f"{dy.dtype} {fmt(dy.shape)}")
    x = attention_inputs(forward, attrs)
    names = ("Q", "K", "V") + (("past_key", "past_value") if attrs["has_past"] else ())
    return [TensorSpec(x[k].shape, x[k].dtype) for k in names]


@gradient("attention")
def _attention_gradient(g, op, grads):
    attrs = op.attrs
    if attrs["qk_output"] >= 0 and grads[-1] is not None:
        raise GraphError("attention: no gradient flows back through qk_matmul_output")
    n = 1 + 2 * attrs["with_present"]
    dys = [dy if dy is not None else g.zeros_like(y) for dy, y in zip(grads[:n], op.outputs[:n])]
    dq, dk, dv, *dpast = g("attention_grad", *op.inputs, *dys, **attrs)
    return [dq, dk, dv] + [None] * attrs["has_mask"] + dpast + [None] * attrs["has_nonpad"]


@define("rotary_embedding", types=Types("X: T, cos_cache: T, sin_cache: T, position_ids: index? -> T",
                                        T=dtypes.FLOATS),
        attrs={"interleaved": Attr(_B, False), "rotary_embedding_dim": Attr(_I, 0), "num_heads": Attr(_I, 0)})
def _rotary_embedding(inputs, attrs):
    """ONNX RotaryEmbedding: rotates the first rotary_embedding_dim (0: all) features of
    each head of X (batch, heads, seq, head) or 3D (batch, seq, num_heads * head) by the
    angles whose cosines and sines the caches hold: pairs (x1, x2) become
    (cos x1 - sin x2, sin x1 + cos x2), x1 and x2 the two halves of the rotated features,
    or (interleaved) its even and odd ones. The caches are (batch, seq, rotary dim / 2),
    or with position_ids (batch, seq) the rows they pick of (positions, rotary dim / 2).
    """
    x, cos, sin = inputs[:3]
    if x.rank == 4:
        batch, _, seq, head = x.shape
    elif x.rank == 3:
        batch, seq, hidden = x.shape
        heads = attrs["num_heads"]
        if heads <= 0 or (hidden is not None and hidden % heads):
            raise GraphError(f"rotary_embedding: a 3D input needs num_heads dividing its hidden size "
                             f"{hidden}, got num_heads {heads}")
        head = None if hidden is None else hidden // heads
    else:
        raise GraphError(f"rotary_embedding: X must be 3D or 4D, got {fmt(x.shape)}")
    rotary = attrs["rotary_embedding_dim"] or head
    if rotary is not None and (rotary % 2 or rotary < 0 or (head is not None and rotary > head)):
        raise GraphError(f"rotary_embedding: the rotated size {rotary} must be even and at most the "
                         f"head size {head}")
    half = None if rotary is None else rotary // 2
    if len(inputs) == 4:
        expected = (None, half)
        if inputs[3].rank != 2 or any(None not in (a, b) and a != b for a, b in zip(inputs[3].shape, (batch, seq))):
            raise GraphError(f"rotary_embedding: position_ids must be (batch, seq) = {fmt((batch, seq))}, "
                             f"got {fmt(inputs[3].shape)}")
    else:
        expected = (batch, seq, half)
    for name, spec in (("cos_cache", cos), ("sin_cache", sin)):
        if spec.rank != len(expected) or any(None not in (a, b) and a != b for a, b in zip(spec.shape, expected)):
            raise GraphError(f"rotary_embedding: {name} must have shape {fmt(expected)}, got {fmt(spec.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


@gradient("rotary_embedding")
def _rotary_embedding_grad(g, op, grads):
    """Each rotation's transpose turns by the opposite angle: dX is dY rotated with -sin.
    The caches and position ids get no gradient."""
    x, cos, sin, *positions = op.inputs
    return [g("rotary_embedding", grads[0], cos, g("neg", sin), *positions, **op.attrs), None, None] + (
        [None] if positions else [])
