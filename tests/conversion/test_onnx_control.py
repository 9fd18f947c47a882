"""ONNX control flow (If, Loop, Scan) and the sequence ops, converted by
converters/onnx/handlers/control.py: hand-built models checked against onnxruntime, and a
greedy decoder exported from a torch.jit.script'ed loop (tests/data/make_models.py)."""
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.converters.onnx.handlers import HANDLERS
from edgeflow.errors import ConversionError, UnsupportedOpError
from edgeflow.format import writer

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(13)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "main", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])


def body(nodes, name, inputs, outputs, initializers=()):
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))


def convert(proto):
    converted = onnx_converter.convert(proto)
    return ef.Interpreter(writer.to_bytes(converted.model)).get_signature_runner("infer"), converted


def check(proto, feeds_list, rtol=1e-5, atol=1e-6):
    """Each feed dict run by onnxruntime and by the converted model: same outputs."""
    runner, converted = convert(proto)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in proto.graph.output]
    for feeds in feeds_list:
        want = dict(zip(names, session.run(None, feeds)))
        got = runner(**feeds)
        for name in names:
            assert got[name].dtype == want[name].dtype, name
            assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
    return converted


# -- If -------------------------------------------------------------------------------------

def test_if_whose_branches_give_different_shapes():
    """then: x[:2] * 2; else: concat(x, x) - a [2] or a [6] tensor, decided when running."""
    then = body([const("two", np.float32(2)), const("s", np.array([0], np.int64)), const("e", np.array([2], np.int64)),
                 helper.make_node("Slice", ["x", "s", "e"], ["head"]),
                 helper.make_node("Mul", ["head", "two"], ["then_out"])],
                "then", [], [vi("then_out", F, [2])])
    other = body([helper.make_node("Concat", ["x", "x"], ["else_out"], axis=0)], "else", [], [vi("else_out", F, [6])])
    proto = model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                  [vi("c", B, []), vi("x", F, [3])], [vi("y", F, [None])])
    x = RNG.standard_normal(3).astype(np.float32)
    converted = check(proto, [{"c": np.array(True), "x": x}, {"c": np.array(False), "x": x}])
    assert converted.ops["if"] == 1


def test_if_on_a_constant_condition_inlines_the_branch_taken():
    then = body([helper.make_node("Neg", ["x"], ["a"])], "then", [], [vi("a", F, [3])])
    other = body([helper.make_node("Abs", ["x"], ["b"])], "else", [], [vi("b", F, [3])])
    proto = model([const("c", np.array([False])), helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                  [vi("x", F, [3])], [vi("y", F, [3])])
    converted = check(proto, [{"x": np.array([-1, 2, -3], np.float32)}])
    assert "if" not in converted.ops and converted.ops["abs"] == 1


# -- Loop -----------------------------------------------------------------------------------

def _counting_body():
    """(i, cond, acc) -> (cond, acc + x * i, acc): x read from the main graph."""
    return body([helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["xi"]),
                 helper.make_node("Add", ["acc", "xi"], ["acc_out"]), helper.make_node("Identity", ["cond"], ["cond_out"]),
                 helper.make_node("Identity", ["acc"], ["seen"])],
                "count", [vi("i", I64, []), vi("cond", B, []), vi("acc", F, [3])],
                [vi("cond_out", B, []), vi("acc_out", F, [3]), vi("seen", F, [3])])


def test_loop_whose_trip_count_is_a_graph_input_with_scan_outputs():
    proto = model([helper.make_node("Loop", ["n", "", "a0"], ["acc", "seen"], body=_counting_body())],
                  [vi("n", I64, []), vi("x", F, [3]), vi("a0", F, [3])], [vi("acc", F, [3]), vi("seen", F, [None, 3])])
    x, a0 = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    check(proto, [{"n": np.array(n, np.int64), "x": x, "a0": a0} for n in (0, 1, 5)])


def test_loop_that_stops_when_a_value_passes_a_threshold():
    """No trip count: y doubles (and the steps are stacked) while sum(y) < limit."""
    loop_body = body([const("two", np.float32(2)), helper.make_node("Mul", ["y", "two"], ["y_out"]),
                      helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
                      helper.make_node("Less", ["total", "limit"], ["more"]),
                      helper.make_node("Identity", ["y_out"], ["step"])],
                     "double", [vi("i", I64, []), vi("c", B, []), vi("y", F, [2])],
                     [vi("more", B, []), vi("y_out", F, [2]), vi("step", F, [2])])
    proto = model([helper.make_node("ReduceSum", ["y0"], ["s0"], keepdims=0), helper.make_node("Less", ["s0", "limit"], ["go"]),
                   helper.make_node("Loop", ["", "go", "y0"], ["y", "steps"], body=loop_body)],
                  [vi("y0", F, [2]), vi("limit", F, [])], [vi("y", F, [2]), vi("steps", F, [None, 2])])
    y0 = np.array([0.5, 0.25], np.float32)
    check(proto, [{"y0": y0, "limit": np.array(v, np.float32)} for v in (0.1, 1.0, 100.0, 5000.0)])


def test_loop_carrying_a_tensor_that_grows():
    """acc = concat(acc, [i]) each iteration: its length changes, so the body is built with
    that dimension unknown."""
    loop_body = body([helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Unsqueeze", ["fi", "zero"], ["v"]),
                      helper.make_node("Concat", ["acc", "v"], ["acc_out"], axis=0), helper.make_node("Identity", ["c"], ["c_out"])],
                     "grow", [vi("i", I64, []), vi("c", B, []), vi("acc", F, [None])],
                     [vi("c_out", B, []), vi("acc_out", F, [None])],
                     [numpy_helper.from_array(np.array([0], np.int64), "zero")])
    proto = model([helper.make_node("Loop", ["n", "", "a0"], ["acc"], body=loop_body)],
                  [vi("n", I64, []), vi("a0", F, [2])], [vi("acc", F, [None])])
    check(proto, [{"n": np.array(n, np.int64), "a0": np.array([7, 8], np.float32)} for n in (0, 3)])


def test_if_nested_in_a_loop_reading_names_two_levels_up():
    """The branches read `w` (main graph) and `h` (the loop body): outer-scope names at two
    levels, resolved to the enclosing graphs' tensors."""
    then = body([helper.make_node("Add", ["h", "w"], ["t"])], "then", [], [vi("t", F, [3])])
    other = body([helper.make_node("Mul", ["h", "w"], ["e"])], "else", [], [vi("e", F, [3])])
    loop_body = body([const("two", np.int64(2)), helper.make_node("Mod", ["i", "two"], ["r"]),
                      helper.make_node("Equal", ["r", "zero"], ["even"]),
                      helper.make_node("If", ["even"], ["h_out"], then_branch=then, else_branch=other),
                      helper.make_node("Identity", ["c"], ["c_out"])],
                     "alternate", [vi("i", I64, []), vi("c", B, []), vi("h", F, [3])],
                     [vi("c_out", B, []), vi("h_out", F, [3]), vi("h", F, [3])])
    proto = model([helper.make_node("Loop", ["n", "", "h0"], ["h", "hs"], body=loop_body)],
                  [vi("n", I64, []), vi("h0", F, [3]), vi("w", F, [3])], [vi("h", F, [3]), vi("hs", F, [None, 3])],
                  [numpy_helper.from_array(np.int64(0), "zero")])
    h0, w = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    check(proto, [{"n": np.array(n, np.int64), "h0": h0, "w": w} for n in (0, 1, 4)])


def test_loops_nested_with_the_outer_counter_read_inside():
    """An inner Loop runs i times (the outer loop's counter) adding j to the total."""
    inner = body([helper.make_node("Add", ["t", "j"], ["t_out"]), helper.make_node("Identity", ["c2"], ["c2_out"])],
                 "inner", [vi("j", I64, []), vi("c2", B, []), vi("t", I64, [])], [vi("c2_out", B, []), vi("t_out", I64, [])])
    outer = body([helper.make_node("Loop", ["i", "", "t"], ["t_out"], body=inner), helper.make_node("Identity", ["c"], ["c_out"])],
                 "outer", [vi("i", I64, []), vi("c", B, []), vi("t", I64, [])], [vi("c_out", B, []), vi("t_out", I64, [])])
    proto = model([helper.make_node("Loop", ["n", "", "t0"], ["t"], body=outer)],
                  [vi("n", I64, []), vi("t0", I64, [])], [vi("t", I64, [])])
    check(proto, [{"n": np.array(n, np.int64), "t0": np.array(0, np.int64)} for n in (0, 1, 6)])


def test_an_unsupported_op_inside_a_loop_body_is_reported_by_name(monkeypatch):
    monkeypatch.delitem(HANDLERS, "Mul")
    loop_body = body([helper.make_node("Mul", ["y", "y"], ["y_out"], name="square_in_body"),
                      helper.make_node("Identity", ["c"], ["c_out"])],
                     "b", [vi("i", I64, []), vi("c", B, []), vi("y", F, [2])], [vi("c_out", B, []), vi("y_out", F, [2])])
    proto = model([helper.make_node("Loop", ["n", "", "y0"], ["y"], body=loop_body)],
                  [vi("n", I64, []), vi("y0", F, [2])], [vi("y", F, [2])])
    with pytest.raises(UnsupportedOpError, match="square_in_body") as e:
        onnx_converter.convert(proto)
    assert [op[:3] for op in e.value.ops] == [("Mul", 17, "square_in_body")]


def test_an_unsupported_op_on_constants_inside_a_loop_body_is_folded(monkeypatch):
    """Mul of the main graph's initializer by a body constant: computed while converting."""
    monkeypatch.delitem(HANDLERS, "Mul")
    loop_body = body([const("three", np.float32(3)), helper.make_node("Mul", ["w", "three"], ["w3"]),
                      helper.make_node("Add", ["y", "w3"], ["y_out"]), helper.make_node("Identity", ["c"], ["c_out"])],
                     "b", [vi("i", I64, []), vi("c", B, []), vi("y", F, [2])], [vi("c_out", B, []), vi("y_out", F, [2])])
    proto = model([helper.make_node("Loop", ["n", "", "y0"], ["y"], body=loop_body)],
                  [vi("n", I64, []), vi("y0", F, [2])], [vi("y", F, [2])],
                  [numpy_helper.from_array(np.array([1.5, -0.5], np.float32), "w")])
    converted = check(proto, [{"n": np.array(3, np.int64), "y0": np.array([1, 2], np.float32)}])
    assert "mul" not in converted.ops


# -- Scan -----------------------------------------------------------------------------------

def test_scan_rnn_cell_reversed_with_axes():
    """h = tanh(x_t W + h R): x scanned along axis 1 in reverse, the states stacked along
    axis 1 of the output, reversed back."""
    cell = body([helper.make_node("MatMul", ["x_t", "W"], ["xw"]), helper.make_node("MatMul", ["h", "R"], ["hr"]),
                 helper.make_node("Add", ["xw", "hr"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_out"]),
                 helper.make_node("Identity", ["h_out"], ["y_t"])],
                "cell", [vi("h", F, [2, 4]), vi("x_t", F, [2, 3])], [vi("h_out", F, [2, 4]), vi("y_t", F, [2, 4])])
    proto = model([helper.make_node("Scan", ["h0", "x"], ["h", "ys"], body=cell, num_scan_inputs=1,
                                    scan_input_axes=[1], scan_input_directions=[1],
                                    scan_output_axes=[-2], scan_output_directions=[1])],
                  [vi("h0", F, [2, 4]), vi("x", F, [2, None, 3])], [vi("h", F, [2, 4]), vi("ys", F, [2, None, 4])],
                  [numpy_helper.from_array(RNG.standard_normal((3, 4)).astype(np.float32), "W"),
                   numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32) * 0.5, "R")])
    h0 = RNG.standard_normal((2, 4)).astype(np.float32)
    check(proto, [{"h0": h0, "x": RNG.standard_normal((2, t, 3)).astype(np.float32)} for t in (1, 5)])


def test_scan_with_two_inputs_in_both_directions_and_no_state():
    cell = body([helper.make_node("Sub", ["a", "b"], ["d"])], "diff", [vi("a", F, [3]), vi("b", F, [3])], [vi("d", F, [3])])
    proto = model([helper.make_node("Scan", ["x", "x"], ["d"], body=cell, num_scan_inputs=2,
                                    scan_input_directions=[0, 1])],
                  [vi("x", F, [4, 3])], [vi("d", F, [4, 3])])
    check(proto, [{"x": RNG.standard_normal((4, 3)).astype(np.float32)}])


# -- a greedy decoder ---------------------------------------------------------------------

VOCAB, HIDDEN, END, MAX_LEN = 6, 8, 0, 7


def greedy_decoder():
    """An RNN cell decoding greedily: from the start token, h = tanh(E[tok] W + h R),
    tok = argmax(h O), until the end token or MAX_LEN tokens. Outputs: the tokens and the
    final state."""
    rng = np.random.default_rng(5)
    weights = {"E": rng.standard_normal((VOCAB, HIDDEN)), "W": rng.standard_normal((HIDDEN, HIDDEN)) * 0.6,
               "R": rng.standard_normal((HIDDEN, HIDDEN)) * 0.6, "O": rng.standard_normal((HIDDEN, VOCAB))}
    step = body([helper.make_node("Gather", ["E", "tok"], ["emb"]), helper.make_node("MatMul", ["emb", "W"], ["ew"]),
                 helper.make_node("MatMul", ["h", "R"], ["hr"]), helper.make_node("Add", ["ew", "hr"], ["pre"]),
                 helper.make_node("Tanh", ["pre"], ["h_out"]), helper.make_node("MatMul", ["h_out", "O"], ["logits"]),
                 helper.make_node("ArgMax", ["logits"], ["tok_out"], axis=0, keepdims=0),
                 helper.make_node("Equal", ["tok_out", "end"], ["done"]), helper.make_node("Not", ["done"], ["go"]),
                 helper.make_node("Identity", ["tok_out"], ["emitted"])],
                "step", [vi("i", I64, []), vi("c", B, []), vi("tok", I64, []), vi("h", F, [HIDDEN])],
                [vi("go", B, []), vi("tok_out", I64, []), vi("h_out", F, [HIDDEN]), vi("emitted", I64, [])])
    proto = model([helper.make_node("Loop", ["max_len", "true", "start", "h0"], ["last", "h", "tokens"], body=step)],
                  [vi("start", I64, []), vi("h0", F, [HIDDEN])],
                  [vi("tokens", I64, [None]), vi("h", F, [HIDDEN])],
                  [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
                  + [numpy_helper.from_array(np.int64(END), "end"), numpy_helper.from_array(np.int64(MAX_LEN), "max_len"),
                     numpy_helper.from_array(np.array(True), "true")])
    return proto, {k: v.astype(np.float32) for k, v in weights.items()}


def decode(weights, start, h):
    """The greedy decoder in numpy."""
    tokens, tok = [], start
    for _ in range(MAX_LEN):
        h = np.tanh(weights["E"][tok] @ weights["W"] + h @ weights["R"])
        tok = int(np.argmax(h @ weights["O"]))
        tokens.append(tok)
        if tok == END:
            break
    return np.array(tokens, np.int64), h


def test_greedy_decoder_stops_at_the_end_token_or_the_length_limit():
    proto, weights = greedy_decoder()
    feeds = [{"start": np.array(s, np.int64), "h0": RNG.standard_normal(HIDDEN).astype(np.float32)}
             for s in range(VOCAB) for _ in range(6)]
    lengths = {len(decode(weights, int(f["start"]), f["h0"])[0]) for f in feeds}
    assert 1 in lengths or 2 in lengths, lengths  # some stop early at the end token ...
    assert MAX_LEN in lengths, lengths            # ... and some run to the limit
    converted = check(proto, feeds, rtol=1e-4, atol=1e-5)
    assert converted.ops["while"] == 1
    runner, _ = convert(proto)
    for f in feeds[:8]:
        tokens, h = decode(weights, int(f["start"]), f["h0"])
        got = runner(**f)
        np.testing.assert_array_equal(got["tokens"], tokens)
        np.testing.assert_allclose(got["h"], h, rtol=1e-4, atol=1e-5)


# -- sequences ------------------------------------------------------------------------------

def test_sequence_ops_on_sequences_made_in_the_graph():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1),  # 4 parts of [2, 1]
             helper.make_node("SequenceErase", ["parts", "one"], ["three"]),
             helper.make_node("SequenceInsert", ["three", "y", "zero"], ["four"]),
             helper.make_node("SequenceAt", ["four", "minus_one"], ["last"]),
             helper.make_node("SequenceAt", ["four", "k"], ["kth"]),  # a position known when running
             helper.make_node("SequenceLength", ["four"], ["length"]),
             helper.make_node("ConcatFromSequence", ["four"], ["joined"], axis=1),
             helper.make_node("ConcatFromSequence", ["four"], ["stacked"], axis=-1, new_axis=1),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["uneven"], axis=1),
             helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
             helper.make_node("ConcatFromSequence", ["pair"], ["doubled"], axis=0),
             helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
             helper.make_node("SequenceAt", ["rows", "one"], ["row"]),
             helper.make_node("SequenceAt", ["uneven", "one"], ["piece"])]
    proto = model(nodes, [vi("x", F, [2, 4]), vi("y", F, [2, 1]), vi("k", I64, [])],
                  [vi("last", F, [2, 1]), vi("kth", F, [2, 1]), vi("length", I64, []), vi("joined", F, [2, 4]),
                   vi("stacked", F, [2, 1, 4]), vi("doubled", F, [4, 4]), vi("row", F, [4]), vi("piece", F, [2, 3])],
                  [numpy_helper.from_array(np.int64(v), n) for n, v in (("one", 1), ("zero", 0), ("minus_one", -1))]
                  + [numpy_helper.from_array(np.array([1, 3], np.int64), "sizes")])
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 1)).astype(np.float32)
    converted = check(proto, [{"x": x, "y": y, "k": np.array(k, np.int64)} for k in (0, 2, -1)])
    assert "gather" in converted.ops  # SequenceAt at a position known when running


def test_sequences_inside_a_loop_body_and_from_an_if_on_a_constant():
    then = body([helper.make_node("SequenceConstruct", ["x", "x"], ["s"])], "then", [],
                [helper.make_tensor_sequence_value_info("s", F, [3])])
    other = body([helper.make_node("SequenceConstruct", ["x"], ["s2"])], "else", [],
                 [helper.make_tensor_sequence_value_info("s2", F, [3])])
    loop_body = body([helper.make_node("SplitToSequence", ["acc"], ["pieces"], axis=0, keepdims=0),
                      helper.make_node("SequenceInsert", ["pieces", "x"], ["more"]),
                      helper.make_node("ConcatFromSequence", ["more"], ["summed"], axis=0, new_axis=1),
                      helper.make_node("ReduceSum", ["summed", "zero"], ["acc_out"], keepdims=1),
                      helper.make_node("Identity", ["c"], ["c_out"])],
                     "b", [vi("i", I64, []), vi("c", B, []), vi("acc", F, [1, 3])],
                     [vi("c_out", B, []), vi("acc_out", F, [1, 3])])
    proto = model([const("yes", np.array(True)), helper.make_node("If", ["yes"], ["seq"], then_branch=then, else_branch=other),
                   helper.make_node("ConcatFromSequence", ["seq"], ["a0"], axis=0, new_axis=1),
                   helper.make_node("Slice", ["a0", "zero", "one"], ["first"]),
                   helper.make_node("Loop", ["n", "", "first"], ["acc"], body=loop_body)],
                  [vi("x", F, [3]), vi("n", I64, [])], [vi("acc", F, [1, 3])],
                  [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one")])
    x = RNG.standard_normal(3).astype(np.float32)
    check(proto, [{"x": x, "n": np.array(n, np.int64)} for n in (0, 3)])


def test_what_sequences_cannot_be():
    """A loop-carried sequence, or a sequence as a graph output: edgeflow has no sequence values."""
    loop_body = body([helper.make_node("SequenceInsert", ["s", "x"], ["s_out"]), helper.make_node("Identity", ["c"], ["c_out"])],
                     "b", [vi("i", I64, []), vi("c", B, []), helper.make_tensor_sequence_value_info("s", F, [3])],
                     [vi("c_out", B, []), helper.make_tensor_sequence_value_info("s_out", F, [3])])
    carried = model([helper.make_node("SequenceConstruct", ["x"], ["s0"]),
                     helper.make_node("Loop", ["n", "", "s0"], ["s"], body=loop_body),
                     helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)],
                    [vi("x", F, [3]), vi("n", I64, [])], [vi("y", F, [None])])
    with pytest.raises(UnsupportedOpError, match="loop-carried value is a sequence"):
        onnx_converter.convert(carried)
    out = model([helper.make_node("SequenceConstruct", ["x"], ["s"])], [vi("x", F, [3])],
                [helper.make_tensor_sequence_value_info("s", F, [3])])
    with pytest.raises(ConversionError, match="sequences: edgeflow has no sequence values"):
        onnx_converter.convert(out)


# -- a greedy decoder exported from PyTorch (tests/data/make_models.py) ----------------------

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"


@pytest.mark.parametrize("optimize", [True, False])
def test_torch_scripted_greedy_decoder_matches_pytorch_and_onnxruntime(tmp_path, optimize):
    """nn.Embedding + GRUCell + Linear in a torch.jit.script'ed `for` loop with `break` at the
    end token: one Loop carrying tokens that grow each iteration."""
    proto = onnx.load(str(DATA / "greedy_decoder.onnx"))
    assert [n.op_type for n in proto.graph.node if n.op_type != "Constant"] == ["Loop"]
    path = tmp_path / "greedy_decoder.efl"
    converted = onnx_converter.convert(DATA / "greedy_decoder.onnx", path, optimize=optimize)
    assert converted.ops["while"] == 1
    runner = ef.Interpreter(path).get_signature_runner("infer")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime warns that the tokens outgrow their declared shape
    session = ort.InferenceSession(str(DATA / "greedy_decoder.onnx"), options, providers=["CPUExecutionProvider"])
    io = np.load(DATA / "greedy_decoder_io.npz")
    lengths = set()
    for case in (str(c) for c in io["cases"]):
        feeds = {"h0": io[f"{case}.h0"], "start": io[f"{case}.start"]}
        ours = runner(**feeds)
        theirs = dict(zip(["tokens", "h"], session.run(["tokens", "h"], feeds)))
        np.testing.assert_array_equal(ours["tokens"], io[f"{case}.tokens"], err_msg=case)
        np.testing.assert_array_equal(ours["tokens"], theirs["tokens"], err_msg=case)
        np.testing.assert_allclose(ours["h"], io[f"{case}.h"], rtol=1e-4, atol=1e-5, err_msg=case)
        np.testing.assert_allclose(ours["h"], theirs["h"], rtol=1e-4, atol=1e-5, err_msg=case)
        lengths.add(len(ours["tokens"]))
    assert min(lengths) < 10 and 10 in lengths  # early stops at the end token, and runs to the limit


def test_a_loop_trains_on_the_device_after_convert_trainable(tmp_path):
    """convert --trainable on a Loop whose body reads an initializer: the weight becomes a
    variable the loop captures, and one SGD step moves it by the finite-difference gradient."""
    w = (RNG.standard_normal((4, 4)) * 0.5).astype(np.float32)
    step = body([helper.make_node("MatMul", ["h_in", "W"], ["hw"]), helper.make_node("Tanh", ["hw"], ["h_out"]),
                 helper.make_node("Identity", ["c_in"], ["c_out"])], "step",
                [vi("i", I64, []), vi("c_in", B, []), vi("h_in", F, ["b", 4])], [vi("c_out", B, []), vi("h_out", F, ["b", 4])])
    proto = model([helper.make_node("Loop", ["M", "", "x"], ["h"], body=step)], [vi("x", F, ["b", 4])],
                  [vi("h", F, ["b", 4])], [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(3, np.int64), "M")])
    onnx_converter.convert(proto, tmp_path / "rnn.efl", trainable=True, loss="mse", optimizer="sgd:0.1")
    interp = ef.Interpreter(tmp_path / "rnn.efl")
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    y = np.tanh(RNG.standard_normal((5, 4))).astype(np.float32)

    def loss(wv):
        h = x.astype(np.float64)
        for _ in range(3):
            h = np.tanh(h @ wv)
        return ((h - y) ** 2).mean()
    first = float(interp.get_signature_runner("train")(x=x, labels=y)["loss"])
    np.testing.assert_allclose(first, loss(w.astype(np.float64)), rtol=1e-5)
    h = 1e-6
    grad = np.array([(loss(w + h * e.reshape(4, 4)) - loss(w - h * e.reshape(4, 4))) / (2 * h)
                     for e in np.eye(16)]).reshape(4, 4)
    np.testing.assert_allclose(interp.get_signature_runner("save")()["W"], w - 0.1 * grad, rtol=1e-4, atol=1e-6)
