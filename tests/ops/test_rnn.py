"""rnn, lstm and gru against onnxruntime running the same single ONNX RNN/LSTM/GRU node (opset 14).

Every case feeds the same arrays to both: edgeflow gets X, W, R and the optional inputs
that are present (the has_* attributes say which), onnxruntime gets them at their ONNX
positions with "" for the absent ones.
"""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import assert_close, check_static

import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

GATES = {"lstm": 4, "gru": 3, "rnn": 1}
OUTPUTS = {"lstm": ("Y", "Y_h", "Y_c"), "gru": ("Y", "Y_h"), "rnn": ("Y", "Y_h")}
OPTIONAL = {"lstm": ("B", "initial_h", "initial_c"), "gru": ("B", "initial_h"), "rnn": ("B", "initial_h")}
HAS = {"B": "has_bias", "initial_h": "has_initial_h", "initial_c": "has_initial_c", "P": "has_peepholes",
       "sequence_lens": "has_sequence_lens"}
ONNX_INPUTS = {"lstm": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
               "gru": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
               "rnn": ("X", "W", "R", "B", "sequence_lens", "initial_h")}
# edgeflow's input order: the int32 lengths last
EDGEFLOW_INPUTS = {"lstm": ("X", "W", "R", "B", "initial_h", "initial_c", "P", "sequence_lens"),
                   "gru": ("X", "W", "R", "B", "initial_h", "sequence_lens"),
                   "rnn": ("X", "W", "R", "B", "initial_h", "sequence_lens")}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
TOL = dict(rtol=1e-5, atol=1e-5)


def onnx_model(nodes, inputs, outputs, initializers=()):
    """A float32 ONNX model (IR 8, opset 14) with these nodes, inputs (name -> shape; sequence_lens
    is int32) and outputs."""
    def elem(name):
        return TensorProto.INT32 if name == "sequence_lens" else TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, elem(n), s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def onnxruntime_reference(op, arrays, attrs):
    """Outputs of one ONNX `op` node on `arrays` (name -> array; absent names are left out)."""
    names = [n if n in arrays else "" for n in ONNX_INPUTS[op]]
    while not names[-1]:
        names.pop()
    onnx_attrs = {k: v for k, v in attrs.items() if not k.startswith("has_") and v not in ("", ())}
    if isinstance(onnx_attrs.get("activations"), str):
        onnx_attrs["activations"] = onnx_attrs["activations"].split(",")
    if not onnx_attrs.get("clip"):
        onnx_attrs.pop("clip", None)  # ONNX: absent clip means none; 0 is not accepted
    if "input_forget" in onnx_attrs:
        onnx_attrs["input_forget"] = int(onnx_attrs["input_forget"])
    node = helper.make_node(op.upper(), names, list(OUTPUTS[op]), **onnx_attrs)
    session = onnx_model([node], {n: a.shape for n, a in arrays.items()}, OUTPUTS[op])
    return session.run(None, {n: a if n == "sequence_lens" else a.astype(np.float32) for n, a in arrays.items()})


def recurrent_arrays(rng, op, seq, batch, size, hidden, direction, present, dtype=np.float32):
    """X, W, R and the `present` optional inputs, scaled so that gates neither saturate nor vanish."""
    g, d = GATES[op], DIRECTIONS[direction]
    shapes = {"X": (seq, batch, size), "W": (d, g * hidden, size), "R": (d, g * hidden, hidden),
              "B": (d, 2 * g * hidden), "initial_h": (d, batch, hidden), "initial_c": (d, batch, hidden),
              "P": (d, 3 * hidden)}
    return {n: rng.normal(0, 0.8, shapes[n]).astype(dtype) for n in ("X", "W", "R") + tuple(present)}


def edgeflow_outputs(compile_graph, op, arrays, attrs, shapes=None, feeds=()):
    """The op's outputs run by edgeflow; names in `feeds` (and X, initial states) are placeholders,
    built with `shapes` where given; the others are constants."""
    shapes = shapes or {}
    graph = ef.Graph()
    with graph.as_default():
        holders, inputs = {}, []
        for name in EDGEFLOW_INPUTS[op]:
            if name not in arrays:
                continue
            a = arrays[name]
            if name in ("X", "initial_h", "initial_c") or name in feeds:
                holders[name] = ef.placeholder(a.dtype, shapes.get(name, a.shape), name=name)
                inputs.append(holders[name])
            else:
                inputs.append(ef.constant(a, name=name))
        has = {HAS[n]: n in arrays for n in EDGEFLOW_INPUTS[op][3:]}
        tensors = apply(op, inputs, {**attrs, **has})
    run = compile_graph(graph, holders, dict(zip(OUTPUTS[op], tensors)))
    out = run(**{n: arrays[n] for n in holders})
    for name, t in zip(OUTPUTS[op], tensors):
        check_static(t, out[name])
    return [out[n] for n in OUTPUTS[op]], tensors


def check_against_onnxruntime(compile_graph, op, arrays, attrs, **kw):
    got, _ = edgeflow_outputs(compile_graph, op, arrays, attrs, **kw)
    expected = onnxruntime_reference(op, arrays, attrs)
    for name, a, e in zip(OUTPUTS[op], got, expected):
        assert_close(a, e, np.float32, **TOL), name


LSTM_OPTIONALS = [(), ("B",), ("initial_h",), ("initial_c",), ("B", "initial_h", "initial_c")]
GRU_OPTIONALS = [(), ("B",), ("initial_h",), ("B", "initial_h")]


@pytest.mark.parametrize("present", LSTM_OPTIONALS, ids=lambda p: "+".join(p) or "none")
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_matches_onnxruntime(compile_graph, rng, direction, present):
    arrays = recurrent_arrays(rng, "lstm", 7, 5, 4, 3, direction, present)
    check_against_onnxruntime(compile_graph, "lstm", arrays, {"hidden_size": 3, "direction": direction})


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("present", GRU_OPTIONALS, ids=lambda p: "+".join(p) or "none")
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_matches_onnxruntime(compile_graph, rng, direction, present, linear_before_reset):
    arrays = recurrent_arrays(rng, "gru", 7, 5, 4, 3, direction, present)
    attrs = {"hidden_size": 3, "direction": direction, "linear_before_reset": linear_before_reset}
    check_against_onnxruntime(compile_graph, "gru", arrays, attrs)


@pytest.mark.parametrize("seq,batch", [(1, 1), (1, 5), (7, 1), (7, 5)])
@pytest.mark.parametrize("op", GATES)
def test_sequence_and_batch_sizes(compile_graph, rng, op, seq, batch):
    arrays = recurrent_arrays(rng, op, seq, batch, 6, 8, "bidirectional", OPTIONAL[op])
    attrs = {"hidden_size": 8, "direction": "bidirectional"}
    if op == "gru":
        attrs["linear_before_reset"] = 1
    check_against_onnxruntime(compile_graph, op, arrays, attrs)


@pytest.mark.parametrize("variant", [{"op": "lstm"}, {"op": "gru", "linear_before_reset": 0},
                                     {"op": "gru", "linear_before_reset": 1}], ids=str)
def test_clip_bounds_the_gate_inputs(compile_graph, rng, variant):
    attrs = {k: v for k, v in variant.items() if k != "op"}
    op, clip = variant["op"], 0.4
    arrays = recurrent_arrays(rng, op, 7, 5, 4, 3, "bidirectional", OPTIONAL[op])
    arrays["X"] *= 4  # most pre-activations beyond the clip
    attrs.update(hidden_size=3, direction="bidirectional")
    check_against_onnxruntime(compile_graph, op, arrays, {**attrs, "clip": clip})
    clipped, _ = edgeflow_outputs(compile_graph, op, arrays, {**attrs, "clip": clip})
    unclipped, _ = edgeflow_outputs(compile_graph, op, arrays, attrs)
    assert np.abs(clipped[0] - unclipped[0]).max() > 0.1  # the clip did bite


def test_lstm_input_forget(compile_graph, rng):
    arrays = recurrent_arrays(rng, "lstm", 7, 5, 4, 3, "bidirectional", OPTIONAL["lstm"])
    attrs = {"hidden_size": 3, "direction": "bidirectional", "input_forget": True}
    check_against_onnxruntime(compile_graph, "lstm", arrays, attrs)


@pytest.mark.parametrize("op", GATES)
def test_dynamic_seq_and_batch(compile_graph, rng, op):
    """Built with seq and batch unknown; one model then runs at several run-time shapes."""
    d, hidden, size = 2, 5, 3
    present = OPTIONAL[op]
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    arrays = recurrent_arrays(rng, op, 2, 2, size, hidden, "bidirectional", present)
    graph = ef.Graph()
    with graph.as_default():
        x = ef.placeholder("float32", (None, None, size), name="X")
        states = [ef.placeholder("float32", (d, None, hidden), name=n) for n in present[1:]]
        weights = [ef.constant(arrays[n]) for n in ("W", "R", "B")]
        tensors = apply(op, [x] + weights + states, {**attrs, **{HAS[n]: True for n in present}})
    assert tensors[0].shape == (None, d, None, hidden)
    assert all(t.shape == (d, None, hidden) for t in tensors[1:])
    run = compile_graph(graph, {"X": x, **dict(zip(present[1:], states))}, dict(zip(OUTPUTS[op], tensors)))
    for seq, batch in [(7, 5), (1, 1), (3, 2), (7, 5)]:
        fresh = recurrent_arrays(rng, op, seq, batch, size, hidden, "bidirectional", present)
        feeds = {n: fresh[n] for n in ("X",) + present[1:]}
        out = run(**feeds)
        expected = onnxruntime_reference(op, {**arrays, **feeds}, attrs)
        for name, t, e in zip(OUTPUTS[op], tensors, expected):
            check_static(t, out[name])
            assert_close(out[name], e, np.float32, **TOL)


@pytest.mark.parametrize("op", GATES)
def test_weights_fed_as_inputs_are_read_on_every_invoke(compile_graph, rng, op):
    attrs = {"hidden_size": 4, "direction": "bidirectional"}
    graph = ef.Graph()
    first = recurrent_arrays(rng, op, 3, 2, 3, 4, "bidirectional", OPTIONAL[op])
    with graph.as_default():
        holders = {n: ef.placeholder("float32", a.shape, name=n) for n, a in first.items()}
        order = [n for n in EDGEFLOW_INPUTS[op] if n in holders]
        tensors = apply(op, [holders[n] for n in order], {**attrs, **{HAS[n]: True for n in OPTIONAL[op]}})
    run = compile_graph(graph, holders, dict(zip(OUTPUTS[op], tensors)))
    for arrays in (first, recurrent_arrays(rng, op, 3, 2, 3, 4, "bidirectional", OPTIONAL[op])):
        out = run(**arrays)
        for name, e in zip(OUTPUTS[op], onnxruntime_reference(op, arrays, attrs)):
            assert_close(out[name], e, np.float32, **TOL)


@pytest.mark.parametrize("dtype,tol", [("float16", dict(rtol=1e-2, atol=3e-3)),
                                       ("float64", dict(rtol=1e-5, atol=1e-5))])
@pytest.mark.parametrize("op", GATES)
def test_other_float_dtypes(compile_graph, rng, op, dtype, tol):
    """onnxruntime computes in float32 on the same values (float16 ones widen exactly)."""
    arrays = recurrent_arrays(rng, op, 7, 5, 4, 3, "bidirectional", OPTIONAL[op], dtype)
    attrs = {"hidden_size": 3, "direction": "bidirectional"}
    got, _ = edgeflow_outputs(compile_graph, op, arrays, attrs)
    for a, e in zip(got, onnxruntime_reference(op, arrays, attrs)):
        assert_close(a, e, dtype, **tol)


@pytest.mark.parametrize("present", GRU_OPTIONALS, ids=lambda p: "+".join(p) or "none")
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_rnn_matches_onnxruntime(compile_graph, rng, direction, present):
    arrays = recurrent_arrays(rng, "rnn", 7, 5, 4, 3, direction, present)
    check_against_onnxruntime(compile_graph, "rnn", arrays, {"hidden_size": 3, "direction": direction})


def test_rnn_closed_form(compile_graph, rng):
    """One direction, three steps: h_t = tanh(x_t W^T + h_{t-1} R^T + Wb + Rb) in numpy."""
    arrays = recurrent_arrays(rng, "rnn", 3, 2, 4, 5, "forward", ("B", "initial_h"), np.float64)
    (y, y_h), _ = edgeflow_outputs(compile_graph, "rnn", arrays, {"hidden_size": 5})
    w, r, b, h = arrays["W"][0], arrays["R"][0], arrays["B"][0], arrays["initial_h"][0]
    for t in range(3):
        h = np.tanh(arrays["X"][t] @ w.T + h @ r.T + b[:5] + b[5:])
        np.testing.assert_allclose(y[t, 0], h, rtol=1e-12)
    np.testing.assert_allclose(y_h[0], h, rtol=1e-12)


@pytest.mark.parametrize("variant", [{}, {"clip": 0.5}, {"input_forget": True}], ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_peepholes(compile_graph, rng, direction, variant):
    arrays = recurrent_arrays(rng, "lstm", 7, 5, 4, 3, direction, ("B", "initial_h", "initial_c", "P"))
    arrays["P"] *= 2  # peepholes that matter
    check_against_onnxruntime(compile_graph, "lstm", arrays, {"hidden_size": 3, "direction": direction, **variant})
    without = {n: a for n, a in arrays.items() if n != "P"}
    with_p, _ = edgeflow_outputs(compile_graph, "lstm", arrays, {"hidden_size": 3, "direction": direction, **variant})
    plain, _ = edgeflow_outputs(compile_graph, "lstm", without, {"hidden_size": 3, "direction": direction, **variant})
    assert np.abs(with_p[0] - plain[0]).max() > 0.05


def _all_float_inputs(op):
    return {"lstm": ("B", "initial_h", "initial_c", "P"), "gru": ("B", "initial_h"), "rnn": ("B", "initial_h")}[op]


@pytest.mark.parametrize("lens", [[7, 3, 1, 5, 2], [7, 7, 7, 7, 7], [2, 2, 1, 1, 2]], ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", GATES)
def test_sequence_lens(compile_graph, rng, op, direction, lens):
    """Padding steps give zeros in Y, the final states are the last valid step's, and the
    reverse direction starts at each entry's last step."""
    arrays = recurrent_arrays(rng, op, 7, 5, 4, 3, direction, _all_float_inputs(op))
    arrays["sequence_lens"] = np.array(lens, np.int32)
    attrs = {"hidden_size": 3, "direction": direction}
    check_against_onnxruntime(compile_graph, op, arrays, attrs)
    # an entry alone, cut to its length, gives the same outputs
    (y, *finals), _ = edgeflow_outputs(compile_graph, op, arrays, attrs)
    b, n = 1, lens[1]
    alone = {k: (v[:n, b:b + 1] if k == "X" else v[:, b:b + 1] if k.startswith("initial") else v)
             for k, v in arrays.items() if k != "sequence_lens"}
    (y1, *finals1), _ = edgeflow_outputs(compile_graph, op, alone, attrs)
    np.testing.assert_allclose(y[:n, :, b:b + 1], y1, rtol=1e-5, atol=1e-6)
    assert not y[n:, :, b].any()
    for f, f1 in zip(finals, finals1):
        np.testing.assert_allclose(f[:, b:b + 1], f1, rtol=1e-5, atol=1e-6)


ACTIVATION_CASES = [
    ("rnn", "forward", ["Relu"], [], []),
    ("rnn", "bidirectional", ["Sigmoid", "LeakyRelu"], [0.3], []),
    ("rnn", "reverse", ["Affine"], [0.7], [0.2]),
    ("rnn", "forward", ["ThresholdedRelu"], [0.1], []),
    ("rnn", "forward", ["ScaledTanh"], [1.5], [0.5]),
    ("rnn", "forward", ["HardSigmoid"], [], []),
    ("rnn", "bidirectional", ["Elu", "Softsign"], [0.5], []),
    ("rnn", "forward", ["Softplus"], [], []),
    ("lstm", "forward", ["HardSigmoid", "Tanh", "Softsign"], [0.3], [0.6]),
    ("lstm", "bidirectional", ["Sigmoid", "Relu", "Tanh", "Sigmoid", "Tanh", "Elu"], [], []),
    ("gru", "forward", ["HardSigmoid", "Softsign"], [], []),
    ("gru", "bidirectional", ["Sigmoid", "LeakyRelu", "Sigmoid", "Tanh"], [0.2], []),
]


@pytest.mark.parametrize("op, direction, names, alphas, betas", ACTIVATION_CASES, ids=str)
def test_activations(compile_graph, rng, op, direction, names, alphas, betas):
    """The converter's reading of ONNX's alphas and betas (consumed by the functions that
    take them, in order) against onnxruntime; the op holds one of each per function."""
    from edgeflow.converters.onnx.handlers.rnn import _activations

    class Node:
        def __init__(self, attrs):
            self.attrs = attrs

        def attr(self, key, default=None):
            return self.attrs.get(key, default)
    d = DIRECTIONS[direction]
    onnx_attrs = {"activations": names, "activation_alpha": alphas, "activation_beta": betas}
    attrs = {"hidden_size": 3, "direction": direction, **_activations(Node(onnx_attrs), op, d)}
    arrays = recurrent_arrays(rng, op, 7, 5, 4, 3, direction, OPTIONAL[op])
    got, _ = edgeflow_outputs(compile_graph, op, arrays, attrs)
    expected = onnxruntime_reference(op, arrays, {"hidden_size": 3, "direction": direction,
                                                  **{k: v for k, v in onnx_attrs.items() if v}})
    for a, e in zip(got, expected):
        assert_close(a, e, np.float32, **TOL)


def test_gradients_refuse_the_new_variants(compile_graph, rng):
    arrays = recurrent_arrays(rng, "lstm", 3, 2, 4, 3, "forward", ("B", "initial_h", "initial_c", "P"))
    graph = ef.Graph()
    with graph.as_default():
        x = ef.placeholder("float32", arrays["X"].shape)
        rest = [ef.constant(arrays[n]) for n in ("W", "R", "B", "initial_h", "initial_c", "P")]
        y, _, _ = apply("lstm", [x] + rest, {"hidden_size": 3, **{HAS[n]: True for n in _all_float_inputs("lstm")}})
        with pytest.raises(GraphError, match="peepholes"):
            ef.gradients(ef.reduce_sum(y), [x])


def _lstm_layer(x, h0, c0, weights, direction):
    w, r, b = (ef.constant(a) for a in weights)
    return apply("lstm", [x, w, r, b, h0, c0],
                 {"hidden_size": weights[1].shape[-1], "direction": direction, "has_bias": True,
                  "has_initial_h": True, "has_initial_c": True})


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_stacked_two_layer_lstm_as_pytorch_exports_it(compile_graph, rng, bidirectional):
    """nn.LSTM(num_layers=2): h0/c0 [layers * dirs, batch, H] sliced per layer; between layers
    Y [seq, dirs, batch, H] becomes [seq, batch, dirs * H] (Squeeze, or Transpose + Reshape)."""
    seq, batch, size, hidden = 6, 3, 5, 4
    d = 2 if bidirectional else 1
    direction = "bidirectional" if bidirectional else "forward"
    layers = [[rng.normal(0, 0.6, s).astype(np.float32) for s in
               ((d, 4 * hidden, width), (d, 4 * hidden, hidden), (d, 8 * hidden))]
              for width in (size, d * hidden)]
    feeds = {"x": rng.normal(size=(seq, batch, size)).astype(np.float32),
             "h0": rng.normal(size=(2 * d, batch, hidden)).astype(np.float32),
             "c0": rng.normal(size=(2 * d, batch, hidden)).astype(np.float32)}

    # onnxruntime: the graph torch.onnx.export writes for this module.
    nodes, inits = [], [("axes1", np.array([1], np.int64)), ("flat", np.array([0, 0, -1], np.int64))]
    for k in range(2):
        for name, a in zip("WRB", layers[k]):
            inits.append((f"{name}{k}", a))
        inits += [(f"start{k}", np.array([k * d], np.int64)), (f"end{k}", np.array([(k + 1) * d], np.int64)),
                  (f"axis0_{k}", np.array([0], np.int64))]
        for s in ("h0", "c0"):
            nodes.append(helper.make_node("Slice", [s, f"start{k}", f"end{k}", f"axis0_{k}"], [f"{s}_{k}"]))
        source = "x" if k == 0 else "seq1"
        nodes.append(helper.make_node("LSTM", [source, f"W{k}", f"R{k}", f"B{k}", "", f"h0_{k}", f"c0_{k}"],
                                      [f"Y{k}", f"hn{k}", f"cn{k}"], hidden_size=hidden, direction=direction))
        target = "seq1" if k == 0 else "out"
        if bidirectional:
            nodes.append(helper.make_node("Transpose", [f"Y{k}"], [f"Yt{k}"], perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Reshape", [f"Yt{k}", "flat"], [target]))
        else:
            nodes.append(helper.make_node("Squeeze", [f"Y{k}", "axes1"], [target]))
    nodes += [helper.make_node("Concat", ["hn0", "hn1"], ["hn"], axis=0),
              helper.make_node("Concat", ["cn0", "cn1"], ["cn"], axis=0)]
    session = onnx_model(nodes, {n: a.shape for n, a in feeds.items()}, ["out", "hn", "cn"], inits)
    expected = session.run(None, feeds)

    graph = ef.Graph()
    with graph.as_default():
        x, h0, c0 = (ef.placeholder("float32", a.shape, name=n) for n, a in feeds.items())
        finals, y = [], x
        for k in range(2):
            part = [ef.slice(s, [k * d, 0, 0], [d, -1, -1]) for s in (h0, c0)]
            y, hn, cn = _lstm_layer(y, *part, layers[k], direction)
            if bidirectional:
                y = ef.reshape(ef.transpose(y, [0, 2, 1, 3]), [seq, batch, d * hidden])
            else:
                y = ef.squeeze(y, axis=1)
            finals.append((hn, cn))
        outputs = {"out": y, "hn": ef.concat([f[0] for f in finals], 0),
                   "cn": ef.concat([f[1] for f in finals], 0)}
    out = compile_graph(graph, {"x": x, "h0": h0, "c0": c0}, outputs)(**feeds)
    for name, e in zip(("out", "hn", "cn"), expected):
        assert_close(out[name], e, np.float32, **TOL)


# --- shape and attribute checking at build time ---

def _build(op, shapes, attrs, dtype="float32"):
    graph = ef.Graph()
    with graph.as_default():
        inputs = [ef.placeholder(dtype if i else "float32", s, name=f"i{i}") for i, s in enumerate(shapes)]
        return apply(op, inputs, attrs)


LSTM_OK = [(7, 5, 4), (1, 12, 4), (1, 12, 3), (1, 24), (1, 5, 3), (1, 5, 3)]
LSTM_ATTRS = {"hidden_size": 3, "has_bias": True, "has_initial_h": True, "has_initial_c": True}


def test_lstm_valid_shapes_build():
    y, yh, yc = _build("lstm", LSTM_OK, LSTM_ATTRS)
    assert (y.shape, yh.shape, yc.shape) == ((7, 1, 5, 3), (1, 5, 3), (1, 5, 3))
    # the batch size may come from the initial state when X leaves it unknown
    y, _, _ = _build("lstm", [(None, None, 4)] + LSTM_OK[1:], LSTM_ATTRS)
    assert y.shape == (None, 1, 5, 3)
    y, yh = _build("gru", [(7, 5, 4), (2, 9, 4), (2, 9, 3)], {"hidden_size": 3, "direction": "bidirectional"})
    assert (y.shape, yh.shape) == ((7, 2, 5, 3), (2, 5, 3))


def _replace(shapes, index, shape):
    return [shape if i == index else s for i, s in enumerate(shapes)]


@pytest.mark.parametrize("shapes,attrs,message", [
    (_replace(LSTM_OK, 1, (1, 9, 4)), {}, "W must have shape"),  # 3 gates' worth, not 4
    (_replace(LSTM_OK, 1, (1, 12, 5)), {}, "W must have shape"),  # input size differs from X
    (_replace(LSTM_OK, 2, (1, 12, 4)), {}, "R must have shape"),
    (_replace(LSTM_OK, 3, (1, 12)), {}, "B must have shape"),
    (_replace(LSTM_OK, 1, (2, 12, 4)), {}, "W must have shape"),  # two directions' weights, forward
    (LSTM_OK, {"direction": "bidirectional"}, "must have shape"),
    (_replace(LSTM_OK, 4, (1, 6, 3)), {}, "batch size disagrees"),
    (_replace(LSTM_OK, 5, (1, 5, 4)), {}, "initial_c must have shape"),
    (_replace(LSTM_OK, 4, (5, 3)), {}, "initial_h must have shape"),
    (_replace(LSTM_OK, 0, (7, 5)), {}, "X must be"),
    (LSTM_OK[:5], {}, "inputs are"),  # has_initial_c but no initial_c
    (LSTM_OK, {"has_bias": False}, "inputs are"),
    (LSTM_OK, {"hidden_size": 0}, "hidden_size"),
    (LSTM_OK, {"direction": "backward"}, "direction"),
    (LSTM_OK, {"clip": -1.0}, "clip"),
    (LSTM_OK, {"activations": "sigmoid,tanh"}, "activations must name 3"),
    (LSTM_OK, {"activations": "sigmoid,tanh,gelu"}, "activations must name"),
    (LSTM_OK, {"activations": "sigmoid,tanh,tanh", "activation_alpha": (1.0,)}, "one value per activation"),
    (LSTM_OK + [(5,)], {"has_peepholes": True}, "P must have shape"),
])
def test_lstm_rejects_bad_shapes_and_attributes(shapes, attrs, message):
    with pytest.raises(GraphError, match=message):
        _build("lstm", shapes, {**LSTM_ATTRS, **attrs})


@pytest.mark.parametrize("shapes,attrs,message", [
    ([(7, 5, 4), (1, 12, 4), (1, 9, 3)], {}, "W must have shape"),  # LSTM's weights
    ([(7, 5, 4), (1, 9, 4), (1, 9, 3), (1, 9)], {"has_bias": True}, "B must have shape"),
    ([(7, 5, 4), (1, 9, 4), (1, 9, 3)], {"linear_before_reset": 2}, "linear_before_reset"),
    ([(7, 5, 4), (1, 9, 4), (1, 9, 3), (1, 4, 3)], {"has_initial_h": True}, "batch size"),
])
def test_gru_rejects_bad_shapes_and_attributes(shapes, attrs, message):
    with pytest.raises(GraphError, match=message):
        _build("gru", shapes, {"hidden_size": 3, **attrs})


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_rejects_non_float_or_mixed_dtypes(dtype):
    # X is float32; the weights are `dtype`
    with pytest.raises(GraphError, match="W must be float32"):
        _build("gru", [(7, 5, 4), (1, 9, 4), (1, 9, 3)], {"hidden_size": 3}, dtype)


def test_run_time_batch_mismatch_is_an_input_error(compile_graph, rng):
    graph = ef.Graph()
    with graph.as_default():
        x = ef.placeholder("float32", (None, None, 2), name="X")
        h = ef.placeholder("float32", (1, None, 3), name="h")
        w, r = (ef.constant(rng.normal(size=s).astype(np.float32)) for s in ((1, 9, 2), (1, 9, 3)))
        y, _ = apply("gru", [x, w, r, h], {"hidden_size": 3, "has_initial_h": True})
    run = compile_graph(graph, {"X": x, "h": h}, {"y": y})
    with pytest.raises(ef.errors.InvalidInputError, match="batch size"):
        run(X=np.zeros((4, 2, 2), np.float32), h=np.zeros((1, 3, 3), np.float32))


def _threaded_outputs(op, arrays, attrs, threads_, order=None):
    """The op's outputs from an interpreter of `threads_` threads (every op split), and its
    recurrence kernels; `order` reorders the pieces a split hands the workers, run one
    after the other on this thread."""
    from edgeflow.format import writer
    from edgeflow.interp import threads
    from edgeflow.interp.kernels import rnn
    graph = ef.Graph()
    with graph.as_default():
        x = ef.placeholder(np.float32, arrays["X"].shape, name="X")
        inputs = [x] + [ef.constant(arrays[n]) for n in EDGEFLOW_INPUTS[op][1:] if n in arrays]
        has = {HAS[n]: n in arrays for n in EDGEFLOW_INPUTS[op][3:]}
        tensors = apply(op, inputs, {**attrs, **has})
    data = writer.to_bytes(ef.to_model(graph, {"infer": ({"X": x}, dict(zip(OUTPUTS[op], tensors)))}))
    made = []
    cls = {"lstm": rnn._LSTM, "gru": rnn._GRU}[op]
    with pytest.MonkeyPatch.context() as patch:
        init = cls.__init__
        patch.setattr(cls, "__init__", lambda self, *a: (made.append(self), init(self, *a))[1])
        patch.setattr(threads, "MIN_FLOPS", 1)
        if order is not None:
            patch.setattr(threads.Workers, "run", lambda self, tasks: [tasks[k]() for k in order(len(tasks))])
        interp = ef.Interpreter(data, num_threads=threads_)
        if interp._workers is not None:
            interp._workers.adaptive = False  # always split
        out = interp.get_signature_runner("infer")(X=arrays["X"])
    return [out[n] for n in OUTPUTS[op]], made


@pytest.mark.parametrize("op", ["lstm", "gru"])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("batch,hidden", [(1, 16), (3, 13), (4, 37)])
def test_a_one_way_recurrence_shares_its_steps_between_threads(op, direction, batch, hidden):
    """On 2, 3 or 5 threads a one-way LSTM, or GRU with linear_before_reset, runs each step's
    hidden units in blocks that the threads share (jit.lstm_shared, gru_shared): onnxruntime's
    outputs; those of one thread, bit for bit where the blocks' rows of R fall in the same
    4-row tiles of the product as the whole R's (hidden a multiple of 4); the same bits where
    the pieces run one after the other, the last first (a worker that starts late, or never
    while another runs: the first to run does every block)."""
    from edgeflow.interp.kernels import jit
    assert jit.available()
    rng = np.random.default_rng(hidden)
    present = OPTIONAL[op]
    arrays = recurrent_arrays(rng, op, 6, batch, 5, hidden, direction, present)
    attrs = {"hidden_size": hidden, "direction": direction, "linear_before_reset": 1} if op == "gru" else \
        {"hidden_size": hidden, "direction": direction}
    for name, a, e in zip(OUTPUTS[op], _threaded_outputs(op, arrays, attrs, 2)[0],
                          onnxruntime_reference(op, arrays, attrs)):
        assert_close(a, e, np.float32, **TOL), name
    want, made = _threaded_outputs(op, arrays, attrs, 1)
    assert made[0].shared is None
    for threads_ in (2, 3, 5):  # 5: more than this machine's cores (a waiting thread yields its core)
        got, made = _threaded_outputs(op, arrays, attrs, threads_)
        assert made[0].shared is not None
        late, _ = _threaded_outputs(op, arrays, attrs, threads_, order=lambda n: range(n)[::-1])
        for a, b, c in zip(want, got, late):
            if hidden % 4:
                np.testing.assert_allclose(b, a, **TOL)
            else:
                np.testing.assert_array_equal(b, a)
            np.testing.assert_array_equal(c, b)


@pytest.mark.parametrize("op", ["lstm", "gru"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("threads_", [1, 2])
@pytest.mark.parametrize("batch,hidden", [(2, 16), (3, 13), (8, 37)])
def test_the_compiled_loops_products_run_on_native_gemm_from_three_rows(op, direction, threads_, batch, hidden):
    """From rnn.NATIVE_ROWS batch rows, with R a model's float32 constant, the compiled loops
    (one thread's, the batch split's, the shared steps') take their products h @ R^T from
    native_gemm's tile (jit._product; R packed once), at fewer rows from _matmul_nt; the
    input projections x @ W^T + B's part run as native_gemm's product with the bias in its
    pass (fused_projection): onnxruntime's outputs either way."""
    from edgeflow.interp.kernels import jit, native_gemm, rnn
    assert jit.available() and native_gemm.available()
    rng = np.random.default_rng(batch * hidden)
    arrays = recurrent_arrays(rng, op, 5, batch, 6, hidden, direction, OPTIONAL[op])
    attrs = {"hidden_size": hidden, "direction": direction}
    if op == "gru":
        attrs["linear_before_reset"] = int(batch % 2)  # both kinds of candidate
    got, made = _threaded_outputs(op, arrays, attrs, threads_)
    for name, a, e in zip(OUTPUTS[op], got, onnxruntime_reference(op, arrays, attrs)):
        assert_close(a, e, np.float32, **TOL), name
    kernel = made[0]  # with the directions apart (2 threads), made[1] runs the second
    assert kernel.sequence is not None
    assert all(all(k.fused_bias) for k in made)
    tables = [table for k in made for table in k._natives.values()]
    directions = 2 if direction == "bidirectional" else 1
    if batch < rnn.NATIVE_ROWS:
        assert not tables
    else:
        pieces = 1 if kernel.shared is not None else len(kernel.rows)
        assert len(tables) == directions * pieces  # a table per direction and piece of the batch
        for table in tables:
            assert (table != 0).all()  # every product native: an address and its fields
