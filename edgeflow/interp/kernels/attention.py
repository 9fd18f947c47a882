"""Kernels of edgeflow/ops/attention.py.

Grouped-query heads are never repeated: the query heads that share a key/value head are
stacked along the query axis, so each key/value head takes one matrix product. float16
products accumulate in float32; the rest follows ONNX's dtypes step by step (scores and
bias in Q's dtype, softmax in softmax_precision's).
"""
import math
from functools import partial, reduce

import numpy as np

from ...ops.attention import attention_inputs
from . import kernel


def _heads(a, heads):
    """The (batch, heads, seq, size) view of a 3D (batch, seq, heads * size) array."""
    batch, seq, hidden = a.shape
    return a.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)


def _matmul(a, b, dtype):
    if dtype == np.float16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    return np.matmul(a, b)


def _allowed(lengths, past, q_seq, total, attrs):
    """Where query i may attend key j, broadcastable to (batch, 1, q_seq, total); None: everywhere."""
    j = np.arange(total)
    offset = past if lengths is None else lengths.reshape(-1, 1, 1, 1).astype(np.int64) - q_seq
    i = np.arange(q_seq)[:, None] + offset  # the query's absolute position
    tests = [j <= i] if attrs["is_causal"] else []
    if attrs["left_window"] >= 0:
        tests.append(i - j <= attrs["left_window"])
    if attrs["right_window"] >= 0:
        tests.append(j - i <= attrs["right_window"])
    if lengths is not None:
        tests.append(j < lengths.reshape(-1, 1, 1, 1))
    return reduce(np.logical_and, tests) if tests else None


def _bias(x, past, q_seq, total, attrs, dtype):
    """The additive bias (0 where attended, -inf where not, plus a float mask), broadcastable
    to (batch, q_heads, q_seq, total)."""
    bias = np.zeros((q_seq, total), dtype)
    mask = x.get("attn_mask")
    if mask is not None:
        if mask.dtype == np.bool_:
            mask = np.where(mask, dtype.type(0), dtype.type(-np.inf))
        pad = np.full(mask.shape[:-1] + (total - mask.shape[-1],), -np.inf, dtype)
        bias = bias + np.concatenate([mask.astype(dtype, copy=False), pad], axis=-1)
    allowed = _allowed(x.get("nonpad_kv_seqlen"), past, q_seq, total, attrs)
    if allowed is not None:
        # Added, not selected: a NaN in a float mask stays NaN, as ONNX's reference has it.
        bias = bias + np.where(allowed, dtype.type(0), dtype.type(-np.inf))
    return bias


def _softmax(s, bias):
    """softmax(s) along the last axis; rows whose bias is all -inf (no key attended) are zeros."""
    top = s.max(axis=-1, keepdims=True)
    top[np.isneginf(top)] = 0
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    total[total == 0] = 1
    e /= total
    return np.where(np.isneginf(bias.max(axis=-1, keepdims=True)), e.dtype.type(0), e)


class _Pass:
    """The forward pass of one attention op on its input arrays, keeping what the
    gradient needs: heads as (batch, heads, seq, size), keys and values with the past
    before them, the scores at each stage and the probabilities."""

    def __init__(self, ins, attrs):
        x = attention_inputs(ins, attrs)
        q, k, v = x["Q"], x["K"], x["V"]
        self.three_d, t1 = q.ndim == 3, q.dtype
        if self.three_d:
            q, k, v = (_heads(q, attrs["q_num_heads"]), _heads(k, attrs["kv_num_heads"]),
                       _heads(v, attrs["kv_num_heads"]))
        self.past = 0
        if attrs["has_past"]:
            self.past = x["past_key"].shape[2]
            k = np.concatenate([x["past_key"], k], axis=2)
            v = np.concatenate([x["past_value"], v], axis=2)
        self.q, self.k, self.v = q, k, v
        batch, q_heads, q_seq, head = q.shape
        kv_heads, total = k.shape[1:3]
        self.heads = (batch, q_heads, q_seq, total)
        self.stacked = (batch, kv_heads, q_heads // kv_heads * q_seq)  # the query heads of one kv head
        self.root = t1.type(math.sqrt(attrs["scale"] or 1 / math.sqrt(head)))
        scores = _matmul((q * self.root).reshape(self.stacked + (head,)), (k * self.root).swapaxes(2, 3), t1)
        self.raw = scores = scores.reshape(self.heads)
        if attrs["softcap"] > 0:
            scores = np.tanh(scores / t1.type(attrs["softcap"])) * t1.type(attrs["softcap"])
        self.capped = scores
        bias = _bias(x, self.past, q_seq, total, attrs, t1)
        self.biased = scores + bias
        precision = attrs["softmax_precision"] or t1
        self.probs = _softmax(self.biased.astype(precision, copy=False), bias).astype(t1, copy=False)

    def stack(self, a):
        """(batch, q_heads, q_seq, n) -> (batch, kv_heads, group * q_seq, n)."""
        return a.reshape(self.stacked + (a.shape[-1],))

    def unstack(self, a):
        return a.reshape(self.heads[:3] + (a.shape[-1],))

    def merge(self, a):
        """A (batch, heads, seq, size) result in the inputs' layout."""
        return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1) if self.three_d else a


def _attention(ins, outs, attrs):
    f = _Pass(ins, attrs)
    if attrs["with_present"]:
        outs[1][...], outs[2][...] = f.k, f.v
    if attrs["qk_output"] >= 0:
        outs[-1][...] = (f.raw, f.capped, f.biased, f.probs)[attrs["qk_output"]]
    outs[0][...] = f.merge(f.unstack(_matmul(f.stack(f.probs), f.v, f.q.dtype)))


@kernel("attention")
def _attention_kernel(ins, outs, attrs):
    return partial(_attention, ins, outs, attrs)


def _attention_grad(ins, outs, attrs):
    """Gradients of Q, K, V (and past_key, past_value), in float64."""
    n = 1 + 2 * attrs["with_present"]
    f = _Pass([a.astype(np.float64) if a.dtype.kind == "f" else a for a in ins[:-n]],
              {**attrs, "softmax_precision": ""})
    dy, *dpresent = (a.astype(np.float64) for a in ins[-n:])
    if f.three_d:
        dy = _heads(dy, attrs["q_num_heads"])
    probs = f.stack(f.probs)
    dv = probs.swapaxes(2, 3) @ f.stack(dy)  # (batch, kv_heads, total, v_head)
    dp = f.unstack(f.stack(dy) @ f.v.swapaxes(2, 3))
    ds = f.probs * (dp - (dp * f.probs).sum(axis=-1, keepdims=True))
    if attrs["softcap"] > 0:
        ds *= 1 - (f.capped / attrs["softcap"]) ** 2
    ds = f.stack(ds) * f.root ** 2
    dq = f.unstack(ds @ f.k)
    dk = ds.swapaxes(2, 3) @ f.stack(f.q)
    if dpresent:
        dk, dv = dk + dpresent[0], dv + dpresent[1]
    past = f.past
    results = [f.merge(dq), f.merge(dk[:, :, past:]), f.merge(dv[:, :, past:])]
    if attrs["has_past"]:
        results += [dk[:, :, :past], dv[:, :, :past]]
    for out, r in zip(outs, results):
        out[...] = r


@kernel("attention_grad")
def _attention_grad_kernel(ins, outs, attrs):
    return partial(_attention_grad, ins, outs, attrs)


def _rotary(x, cos, sin, positions, out, attrs):
    batch, seq = x.shape[0], x.shape[-2 if x.ndim == 4 else 1]
    # (batch, seq, heads, head) layout, where the caches broadcast over the heads.
    y = x.transpose(0, 2, 1, 3).copy() if x.ndim == 4 else x.reshape(batch, seq, attrs["num_heads"], -1).copy()
    if positions is not None:
        if positions.size and (positions.min() < 0 or positions.max() >= len(cos)):
            # reported as InvalidInputError: a model's inputs are not trusted
            raise IndexError(f"rotary_embedding: a position id is outside the caches' [0, {len(cos)})")
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotary = attrs["rotary_embedding_dim"] or y.shape[-1]
    if attrs["interleaved"]:
        first, second = slice(0, rotary, 2), slice(1, rotary, 2)
    else:
        first, second = slice(0, rotary // 2), slice(rotary // 2, rotary)
    x1, x2 = y[..., first].copy(), y[..., second]
    y[..., first] = cos * x1 - sin * x2
    y[..., second] = sin * x1 + cos * x2
    out[...] = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(out.shape)


@kernel("rotary_embedding")
def _rotary_embedding(ins, outs, attrs):
    x, cos, sin, *positions = ins
    return partial(_rotary, x, cos, sin, positions[0] if positions else None, outs[0], attrs)
