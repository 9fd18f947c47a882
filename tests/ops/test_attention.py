"""attention and rotary_embedding against a plain float64 numpy reference written here
(head by head, key by key), and ONNX's Attention and RotaryEmbedding nodes converted by
converters.onnx against onnxruntime (ONNX's reference evaluator where onnxruntime lacks a
mode)."""
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import GraphError
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.ops import TensorSpec, get

from .harness import assert_close


def reference(q, k, v, mask=None, past_key=None, past_value=None, lengths=None, *, scale=0.0,
              is_causal=False, q_num_heads=0, kv_num_heads=0, softcap=0.0, left_window=-1, right_window=-1):
    """(Y, present_key, present_value, {qk mode: scores}) in float64, one head at a time."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    three_d = q.ndim == 3
    if three_d:
        def heads(a, n):
            return a.reshape(a.shape[0], a.shape[1], n, -1).transpose(0, 2, 1, 3)
        q, k, v = heads(q, q_num_heads), heads(k, kv_num_heads), heads(v, kv_num_heads)
    past = 0
    if past_key is not None:
        past = past_key.shape[2]
        k, v = np.concatenate([past_key, k], axis=2), np.concatenate([past_value, v], axis=2)
    batch, q_heads, q_seq, head = q.shape
    kv_heads, total = k.shape[1:3]
    scale = scale or 1 / math.sqrt(head)
    y = np.zeros((batch, q_heads, q_seq, v.shape[3]))
    stages = {m: np.zeros((batch, q_heads, q_seq, total)) for m in range(4)}
    full_mask = None
    if mask is not None:
        full_mask = np.broadcast_to(mask, (batch, q_heads, q_seq, mask.shape[-1]))
    for b in range(batch):
        offset = past if lengths is None else int(lengths[b]) - q_seq
        for h in range(q_heads):
            kh = h // (q_heads // kv_heads)
            s = q[b, h] @ k[b, kh].T * scale
            stages[0][b, h] = s
            if softcap:
                s = softcap * np.tanh(s / softcap)
            stages[1][b, h] = s
            bias = np.zeros((q_seq, total))
            for i in range(q_seq):
                pos = i + offset
                for j in range(total):
                    if full_mask is not None:
                        m = full_mask[b, h, i, j] if j < mask.shape[-1] else (False if mask.dtype == bool else -np.inf)
                        bias[i, j] += (0.0 if m else -np.inf) if mask.dtype == bool else m
                    ok = (not is_causal or j <= pos) and (left_window < 0 or pos - j <= left_window) and (
                        right_window < 0 or j - pos <= right_window) and (lengths is None or j < lengths[b])
                    if not ok:
                        bias[i, j] = -np.inf
            s = s + bias
            stages[2][b, h] = s
            for i in range(q_seq):
                if np.all(np.isneginf(bias[i])):
                    continue  # no key attended: a zero row
                e = np.exp(s[i] - s[i].max())
                stages[3][b, h, i] = e / e.sum()
            y[b, h] = stages[3][b, h] @ v[b, kh]
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_seq, -1)
    return y, k, v, stages


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# name -> (Q, K, V shapes, attributes, optional inputs: mask (shape, "bool" or "float"),
#          past length, nonpad lengths)
CASES = {
    "4d": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), {}, {}),
    "4d_gqa": ((2, 6, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8), {}, {}),
    "4d_mqa_diff_head_sizes": ((1, 4, 3, 8), (1, 1, 5, 8), (1, 1, 5, 5), {}, {}),
    "4d_scaled_causal": ((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4), {"scale": 0.3, "is_causal": True}, {}),
    "3d": ((2, 4, 12), (2, 6, 12), (2, 6, 18), {"q_num_heads": 3, "kv_num_heads": 3}, {}),
    "3d_gqa_causal": ((2, 4, 16), (2, 4, 8), (2, 4, 6), {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": True},
                      {}),
    "softcap": ((1, 2, 4, 4), (1, 2, 6, 4), (1, 2, 6, 4), {"softcap": 1.5}, {}),
    "bool_mask_2d": ((2, 2, 4, 4), (2, 2, 6, 4), (2, 2, 6, 4), {}, {"mask": ((4, 6), "bool")}),
    "float_mask_4d": ((2, 2, 4, 4), (2, 2, 6, 4), (2, 2, 6, 4), {}, {"mask": ((2, 1, 4, 6), "float")}),
    "float_mask_3d_causal": ((2, 2, 4, 4), (2, 2, 4, 4), (2, 2, 4, 4), {"is_causal": True},
                             {"mask": ((2, 4, 4), "float")}),
    "short_mask": ((1, 2, 3, 4), (1, 2, 6, 4), (1, 2, 6, 4), {}, {"mask": ((3, 4), "bool")}),
    "past": ((2, 2, 1, 4), (2, 2, 1, 4), (2, 2, 1, 6), {"is_causal": True}, {"past": 5}),
    "past_gqa_mask": ((1, 4, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4), {}, {"past": 3, "mask": ((1, 4, 2, 5), "float")}),
    "3d_past": ((2, 3, 8), (2, 3, 8), (2, 3, 8), {"q_num_heads": 2, "kv_num_heads": 2, "is_causal": True},
                {"past": 4}),
    "nonpad": ((2, 2, 3, 4), (2, 2, 7, 4), (2, 2, 7, 4), {"is_causal": True}, {"lengths": [5, 7]}),
    "window": ((1, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), {"left_window": 2, "right_window": 1}, {"past": 2}),
    "fully_masked_row": ((1, 1, 3, 4), (1, 1, 4, 4), (1, 1, 4, 4), {}, {"mask": ((3, 4), "none_in_row_1")}),
}


def case_inputs(rng, name, dtype):
    """(inputs in ONNX's order, None where absent; the op's attributes)."""
    q_shape, k_shape, v_shape, attrs, extra = CASES[name]
    q, k, v = (_normal(rng, s, dtype) for s in (q_shape, k_shape, v_shape))
    mask = past_key = past_value = lengths = None
    if "mask" in extra:
        shape, kind = extra["mask"]
        if kind == "float":
            mask = rng.uniform(-2, 1, shape).astype(dtype)
            mask[..., 0] = -np.inf  # a masked key
        else:
            mask = rng.random(shape) < 0.7
            mask[..., 0] = True
            if kind == "none_in_row_1":
                mask[1] = False
    if "past" in extra:
        batch, heads = k_shape[0], k_shape[1] if len(k_shape) == 4 else attrs["kv_num_heads"]
        size = (k_shape[-1] if len(k_shape) == 4 else k_shape[-1] // heads,
                v_shape[-1] if len(v_shape) == 4 else v_shape[-1] // heads)
        past_key = _normal(rng, (batch, heads, extra["past"], size[0]), dtype)
        past_value = _normal(rng, (batch, heads, extra["past"], size[1]), dtype)
    if "lengths" in extra:
        lengths = np.array(extra["lengths"], np.int64)
    return [q, k, v, mask, past_key, past_value, lengths], attrs


def run_attention(run_op, inputs, attrs, with_present=True, qk_output=3):
    present = [a for a in inputs if a is not None]
    flags = {"has_mask": inputs[3] is not None, "has_past": inputs[4] is not None,
             "has_nonpad": inputs[6] is not None}
    return run_op(lambda *xs: apply("attention", list(xs), {**attrs, **flags, "with_present": with_present,
                                                            "qk_output": qk_output}), *present)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_numpy_reference(run_op, rng, name, dtype):
    inputs, attrs = case_inputs(rng, name, dtype)
    y, pk, pv, stages = reference(*inputs, **attrs)
    got = run_attention(run_op, inputs, attrs)
    for actual, expected in zip(got, (y, pk, pv, stages[3])):
        assert_close(actual, expected, dtype)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_output_modes(run_op, rng, mode):
    inputs, attrs = case_inputs(rng, "float_mask_3d_causal", "float64")
    attrs = {**attrs, "softcap": 2.0}
    y, _, _, stages = reference(*inputs, **attrs)
    got_y, qk = run_attention(run_op, inputs, attrs, with_present=False, qk_output=mode)
    assert_close(got_y, y, "float64")
    assert_close(qk, stages[mode], "float64")


@pytest.mark.parametrize("name", ["4d_gqa", "3d_past", "float_mask_4d", "softcap"])
def test_float16(run_op, rng, name):
    inputs, attrs = case_inputs(rng, name, "float16")
    y, pk, pv, stages = reference(*inputs, **attrs)
    got = run_attention(run_op, inputs, attrs)
    # Scores and probabilities are rounded to float16 on the way, as ONNX's dtypes say.
    for actual, expected in zip(got, (y, pk, pv, stages[3])):
        assert_close(actual, expected, "float16", rtol=1e-2, atol=4e-3)


def test_softmax_precision_float64_on_float32(run_op, rng):
    """Scores of 1e4 and 1e4 + 1e-3: their softmax needs float64 to tell them apart."""
    q = np.ones((1, 1, 1, 1), np.float32)
    k = np.array([[[[1e4], [1e4 + 0.5]]]], np.float32)
    v = np.array([[[[0.0], [1.0]]]], np.float32)
    attrs = {"scale": 1.0, "softmax_precision": "float64"}
    y = run_attention(run_op, [q, k, v, None, None, None, None], attrs, with_present=False, qk_output=-1)
    expected = reference(q, k, v, scale=1.0)[0]
    assert_close(y, expected, "float32")


def test_a_dynamic_batch_and_sequence(run_op, rng):
    inputs, attrs = case_inputs(rng, "3d_gqa_causal", "float32")
    q, k, v = inputs[:3]
    shapes = [(None, None, 16), (None, None, 8), (None, None, 6)]
    y = run_op(lambda *xs: apply("attention", list(xs), attrs), q, k, v, shapes=shapes)
    assert_close(y, reference(q, k, v, **attrs)[0], "float32")


@pytest.mark.parametrize("shapes,attrs,message", [
    ([(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3)], {}, "must all be 3D or all 4D"),
    ([(1, 3, 12), (1, 3, 12), (1, 3, 12)], {}, "3D inputs need q_num_heads"),
    ([(1, 3, 12), (1, 3, 12), (1, 3, 12)], {"q_num_heads": 5, "kv_num_heads": 2}, "not a multiple of its 5"),
    ([(1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)], {}, "3 query heads are not a multiple of 2"),
    ([(1, 2, 2, 4), (1, 2, 2, 5), (1, 2, 2, 4)], {}, "head size of Q and K"),
    ([(1, 2, 2, 4), (1, 2, 3, 4), (1, 2, 2, 4)], {}, "key/value sequence length"),
    ([(1, 2, 2, 4)] * 3, {"qk_output": 4}, "qk_output must be"),
    ([(1, 2, 2, 4)] * 3, {"softmax_precision": "int8"}, "softmax_precision must be"),
    ([(1, 2, 2, 4)] * 3, {"left_window": -2}, "left_window must be"),
    ([(1, 2, 2, 4)] * 3 + [(3, 2, 2)], {"has_mask": True}, "does not broadcast"),
    ([(1, 2, 2, 4)] * 3 + [(2, 3)], {"has_mask": True}, "3 keys, more than the 2"),
    ([(1, 2, 2, 4)] * 3 + [(1, 2, 1, 5)], {"has_past": True}, "with these has_"),
])
def test_invalid_operands(shapes, attrs, message):
    op = get("attention")
    specs = [TensorSpec(s, np.dtype(np.float32)) for s in shapes]
    with pytest.raises(GraphError, match=message):
        op.infer_specs(specs, op.check_attrs(attrs))


def test_past_value_must_have_the_value_dtype():
    op = get("attention")
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    specs = [TensorSpec((1, 2, 2, 4), f32)] * 3 + [TensorSpec((1, 2, 1, 4), f32), TensorSpec((1, 2, 1, 4), f64)]
    with pytest.raises(GraphError, match="past_value must be float32, got float64"):
        op.infer_specs(specs, op.check_attrs({"has_past": True}))


# -- the ONNX node, converted, against onnxruntime ------------------------------------------

_ONNX_ATTRS = {"left_window": "left_window_size", "right_window": "right_window_size"}
# Cases onnxruntime's CPU Attention does not run: checked against ONNX's reference evaluator.
_ORT_LACKS = {"nonpad": "nonpad_kv_seqlen (opset 24)", "window": "window sizes (opset 25)",
              "short_mask": "a mask shorter than the keys (its shape check refuses it)"}


def attention_model(inputs, attrs, opset, outputs=4, mode=0):
    names = ["" if a is None else f"x{i}" for i, a in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    onnx_attrs = {_ONNX_ATTRS.get(k, k): int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
    elem = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    out_names = ["y", "present_key", "present_value", "qk"][:outputs]
    node = helper.make_node("Attention", names, out_names, qk_matmul_output_mode=mode, **onnx_attrs)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs) if n],
        [helper.make_tensor_value_info(n, elem, [f"{n}{d}" for d in range(inputs[0].ndim if n == "y" else 4)])
         for n in out_names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, {n: a for n, a in zip(names, inputs) if n}


def run_edgeflow(model, feeds):
    blob = writer.to_bytes(onnx_converter.convert(model).model)
    out = ef.Interpreter(blob).get_signature_runner("infer")(**feeds)
    return [out[o.name] for o in model.graph.output]


def run_reference(model, feeds, name):
    if name in _ORT_LACKS:
        return ReferenceEvaluator(model).run(None, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_matches_onnxruntime(rng, name):
    inputs, attrs = case_inputs(rng, name, "float32")
    opset = 25 if "left_window" in attrs else 24 if inputs[6] is not None else 23
    has_past = inputs[4] is not None
    model, feeds = attention_model(inputs, attrs, opset, outputs=3 if has_past else 1)
    expected = run_reference(model, feeds, name)
    for actual, want in zip(run_edgeflow(model, feeds), expected):
        assert_close(actual, want, "float32", rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_onnx_qk_matmul_output_matches_onnxruntime(rng, mode):
    inputs, attrs = case_inputs(rng, "past_gqa_mask", "float32")
    model, feeds = attention_model(inputs, {**attrs, "softcap": 3.0}, 23, outputs=4, mode=mode)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for actual, want in zip(run_edgeflow(model, feeds), session.run(None, feeds)):
        assert_close(actual, want, "float32", rtol=2e-5, atol=2e-6)


def test_onnx_scale_zero_is_refused(rng):
    inputs, _ = case_inputs(rng, "4d", "float32")
    model, _ = attention_model(inputs, {"scale": 0.0}, 23)
    with pytest.raises(ef.errors.UnsupportedOpError, match="scale 0.0"):
        onnx_converter.convert(model)


# -- rotary_embedding ---------------------------------------------------------------------

def rotary_reference(x, cos, sin, positions=None, interleaved=False, rotary_embedding_dim=0, num_heads=0):
    """Each head's feature pairs rotated by their angle, one pair at a time, in float64."""
    x = np.asarray(x, np.float64)
    four_d = x.ndim == 4
    if not four_d:
        x = x.reshape(x.shape[0], x.shape[1], num_heads, -1).transpose(0, 2, 1, 3)
    batch, heads, seq, head = x.shape
    rotary = rotary_embedding_dim or head
    y = x.copy()
    for b in range(batch):
        for s in range(seq):
            row = s if positions is None else positions[b, s]
            c, n = (cos[row], sin[row]) if positions is not None else (cos[b, s], sin[b, s])
            for p in range(rotary // 2):
                i, j = (2 * p, 2 * p + 1) if interleaved else (p, p + rotary // 2)
                a, z = x[b, :, s, i], x[b, :, s, j]
                y[b, :, s, i] = c[p] * a - n[p] * z
                y[b, :, s, j] = n[p] * a + c[p] * z
    return y if four_d else y.transpose(0, 2, 1, 3).reshape(batch, seq, -1)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rank,rotary,positions", [(4, 0, True), (4, 4, False), (3, 0, False), (3, 6, True)])
def test_rotary_embedding(run_op, rng, dtype, interleaved, rank, rotary, positions):
    batch, heads, seq, head = 2, 3, 5, 8
    x = _normal(rng, (batch, heads, seq, head) if rank == 4 else (batch, seq, heads * head), dtype)
    half = (rotary or head) // 2
    angles = rng.uniform(0, 2 * np.pi, (11, half) if positions else (batch, seq, half))
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    ids = rng.integers(0, 11, (batch, seq)) if positions else None
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary, "num_heads": heads if rank == 3 else 0}
    arrays = [x, cos, sin] + ([ids] if positions else [])
    got = run_op(lambda *xs: apply("rotary_embedding", list(xs), attrs), *arrays)
    assert_close(got, rotary_reference(x, cos, sin, ids, **attrs), dtype)
    if dtype != "float64":  # onnxruntime's RotaryEmbedding takes float16 and float32
        onnx_attrs = {k: int(v) for k, v in attrs.items() if v}
        expected, = _ort_node("RotaryEmbedding", arrays, onnx_attrs, 23)
        assert_close(got, expected, dtype)


def _ort_node(op_type, arrays, attrs, opset):
    names = [f"x{i}" for i in range(len(arrays))]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["y"], **attrs)], "node",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, arrays)],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(arrays[0].dtype), arrays[0].shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, arrays)))


@pytest.mark.parametrize("shapes,attrs,message", [
    ([(1, 2, 3, 4), (1, 3, 2), (1, 3, 3)], {}, "sin_cache must have shape"),
    ([(1, 3, 8), (1, 3, 2), (1, 3, 2)], {}, "needs num_heads"),
    ([(1, 2, 3, 4), (1, 3, 3), (1, 3, 3)], {"rotary_embedding_dim": 6}, "at most the head size 4"),
    ([(1, 2, 3, 4), (1, 3, 2), (1, 3, 2)], {"rotary_embedding_dim": 3}, "must be even"),
])
def test_rotary_invalid_operands(shapes, attrs, message):
    op = get("rotary_embedding")
    specs = [TensorSpec(s, np.dtype(np.float32)) for s in shapes]
    with pytest.raises(GraphError, match=message):
        op.infer_specs(specs, op.check_attrs(attrs))


@pytest.mark.parametrize("position", [-1, 11])
def test_rotary_position_ids_outside_the_caches(run_op, position):
    x, cache = np.ones((1, 1, 2, 4), np.float32), np.ones((11, 2), np.float32)
    with pytest.raises(ef.errors.InvalidInputError, match=r"position id is outside the caches' \[0, 11\)"):
        run_op(lambda *xs: apply("rotary_embedding", list(xs)), x, cache, cache, np.array([[0, position]]))
