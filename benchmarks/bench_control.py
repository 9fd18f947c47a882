"""Control flow: edgeflow's while loop against onnxruntime's Loop, in one process.

    .venv/bin/python benchmarks/bench_control.py [--runs N]

Measured, interleaved, medians; onnxruntime (the peer) on 1 intra-op thread with its
graph optimisations, edgeflow on 1 thread:
1. Per-iteration overhead: a loop whose body is `i + 1` and `x + 1.0` on float32[4],
   run while `i < n` (n an input, so one model serves every trip count);
   microseconds per iteration = (time(n) - time(1)) / (n - 1).
2. A greedy decoder: embedding lookup, a GRU cell, the output projection, argmax,
   stopping when every row has emitted the end token or after MAX_LEN steps; built with
   ef.while_loop and as an ONNX Loop (onnx.helper), the same ops and the same random
   weights. Both must give a numpy reference's tokens before they are timed; tokens/s
   counts steps x batch.
"""
import argparse
import os
import pathlib
import tempfile

import numpy as np

import edgeflow as ef
import harness
from edgeflow.graph.math_ops import apply

TRIPS = (1, 10, 100, 1000)
VOCAB, EMBED, HIDDEN, MAX_LEN = 4000, 256, 512, 48
BOS = 1


def ort_model(graph, opset=17):
    import onnx
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8  # what every onnxruntime release reads
    onnx.checker.check_model(model)
    return model.SerializeToString()


# -- 1. a trivial loop ---------------------------------------------------------------------
def trivial_efl(path, size):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [size], name="x")
        n = ef.placeholder(ef.int32, [], name="n")
        i, y = ef.while_loop(lambda i, x: ef.less(i, n), lambda i, x: (i + 1, x + 1.0),
                             [ef.constant(0, ef.int32), x])
    ef.save(g, path, {"infer": ({"x": x, "n": n}, {"i": i, "y": y})})


def trivial_onnx(size):
    """Loop with no trip count; its body does what edgeflow's cond and body do together:
    i + 1, x + 1 and the condition i + 1 < n (n from the enclosing graph)."""
    from onnx import TensorProto, helper
    h = helper
    body = h.make_graph(
        [h.make_node("Add", ["i_in", "one"], ["i_out"]), h.make_node("Add", ["x_in", "onef"], ["x_out"]),
         h.make_node("Less", ["i_out", "n"], ["cond_out"])], "body",
        [h.make_tensor_value_info("iter", TensorProto.INT64, []),
         h.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         h.make_tensor_value_info("i_in", TensorProto.INT32, []),
         h.make_tensor_value_info("x_in", TensorProto.FLOAT, [size])],
        [h.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         h.make_tensor_value_info("i_out", TensorProto.INT32, []),
         h.make_tensor_value_info("x_out", TensorProto.FLOAT, [size])],
        [h.make_tensor("one", TensorProto.INT32, [], [1]), h.make_tensor("onef", TensorProto.FLOAT, [], [1.0])])
    graph = h.make_graph(
        [h.make_node("Less", ["zero", "n"], ["cond0"]),
         h.make_node("Loop", ["", "cond0", "zero", "x"], ["i", "y"], body=body)], "trivial",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [size]), h.make_tensor_value_info("n", TensorProto.INT32, [])],
        [h.make_tensor_value_info("i", TensorProto.INT32, []), h.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
        [h.make_tensor("zero", TensorProto.INT32, [], [0])])
    return ort_model(graph)


def bench_trivial(folder, runs, size=4):
    path = folder / "trivial.efl"
    trivial_efl(path, size)
    runner = ef.Interpreter(path, num_threads=1).get_signature_runner("infer")
    sess = harness.ort_session(trivial_onnx(size), threads=1)
    x = np.zeros(size, np.float32)
    times = {}
    for n in TRIPS:
        feeds = {"x": x, "n": np.array(n, np.int32)}
        ours, theirs = runner(**feeds), sess.run(None, feeds)
        for got in (ours["i"], theirs[0]):
            assert int(got) == n, (n, got)
        for got in (ours["y"], theirs[1]):
            np.testing.assert_array_equal(got, np.full(size, n, np.float32))
        times[n] = harness.medians({"edgeflow": lambda: runner(**feeds), "ort": lambda: sess.run(None, feeds)},
                                   runs, warmup=2)
    rows = []
    for n in TRIPS:
        t = times[n]
        per = {k: (t[k] - times[1][k]) / (n - 1) if n > 1 else None for k in t}
        rows.append([n, f"{t['edgeflow'] * 1e6:.0f}", f"{t['ort'] * 1e6:.0f}", harness.ratio(t["edgeflow"], t["ort"]),
                     "-" if per["edgeflow"] is None else f"{per['edgeflow'] * 1e6:.2f}",
                     "-" if per["ort"] is None else f"{per['ort'] * 1e6:.2f}", harness.ratio(per["edgeflow"], per["ort"])])
    print(f"1. while loop with a trivial body (i + 1, x + 1.0 on float32[{size}]); per iteration: "
          "(time(trips) - time(1)) / (trips - 1)")
    harness.print_table(["trips", "edgeflow us", "onnxruntime us", "ratio", "edgeflow us/iter",
                         "onnxruntime us/iter", "ratio/iter"], rows)



# -- 2. a greedy decoder -------------------------------------------------------------------
def decoder_weights(seed=0):
    rng = np.random.default_rng(seed)

    def w(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32)
    return {"embedding": w(VOCAB, EMBED, scale=np.sqrt(VOCAB)), "wx": w(EMBED, 3 * HIDDEN, scale=1.5),
            "bx": w(3 * HIDDEN, scale=0.1 * np.sqrt(3 * HIDDEN)), "uzr": w(HIDDEN, 2 * HIDDEN, scale=1.5),
            "un": w(HIDDEN, HIDDEN, scale=1.5), "wo": w(HIDDEN, VOCAB, scale=3.0),
            "bo": np.zeros(VOCAB, np.float32)}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def decode_numpy(wt, h0, eos):
    """The reference: greedy decoding in numpy, float64 on the float32 weights.
    (tokens [batch, MAX_LEN] padded with eos, steps run)."""
    w = {k: v.astype(np.float64) for k, v in wt.items()}
    batch = h0.shape[0]
    tok, h = np.full(batch, BOS), h0.astype(np.float64)
    done, out = np.zeros(batch, bool), np.full((batch, MAX_LEN), eos, np.int64)
    for step in range(MAX_LEN):
        xz, xr, xn = np.split(w["embedding"][tok] @ w["wx"] + w["bx"], 3, axis=1)
        hz, hr = np.split(h @ w["uzr"], 2, axis=1)
        z, r = _sigmoid(xz + hz), _sigmoid(xr + hr)
        n = np.tanh(xn + (r * h) @ w["un"])
        h = n + z * (h - n)
        nxt = np.argmax(h @ w["wo"] + w["bo"], axis=1)
        tok = np.where(done, eos, nxt)
        out[:, step] = tok
        done = done | (tok == eos)
        if done.all():
            return out, step + 1
    return out, MAX_LEN


def decoder_efl(path, wt, eos):
    """The decoder with ef.while_loop: loop variables step, token, h, done and the output
    tokens (a [batch, MAX_LEN] buffer written at column `step`)."""
    g = ef.Graph()
    with g.as_default():
        h0 = ef.placeholder(ef.float32, [None, HIDDEN], name="h0")
        c = {k: ef.constant(v, name=k) for k, v in wt.items()}
        batch = ef.gather(ef.shape(h0), 0)
        columns = ef.range(MAX_LEN, dtype=ef.int64)

        def body(step, tok, h, done, out):
            xz, xr, xn = ef.split(ef.matmul(ef.gather(c["embedding"], tok), c["wx"]) + c["bx"], 3, axis=1)
            hz, hr = ef.split(ef.matmul(h, c["uzr"]), 2, axis=1)
            z, r = ef.sigmoid(xz + hz), ef.sigmoid(xr + hr)
            n = ef.tanh(xn + ef.matmul(r * h, c["un"]))
            h = n + z * (h - n)
            nxt = ef.argmax(ef.matmul(h, c["wo"]) + c["bo"], axis=1)
            tok = ef.where(done, ef.constant(eos, ef.int64), nxt)
            here = ef.expand_dims(ef.equal(columns, step), 0)
            out = ef.where(here, ef.expand_dims(tok, 1), out)
            done = apply("logical_or", [done, ef.equal(tok, ef.constant(eos, ef.int64))])
            return step + ef.constant(1, ef.int64), tok, h, done, out

        def more(step, tok, h, done, out):
            return ef.greater(ef.reduce_max(ef.cast(apply("logical_not", [done]), ef.int32)), 0)
        rows = ef.expand_dims(batch, 0)
        # ef.fill makes int64 int32, even when asked for int64: hence the casts.
        start = [ef.constant(0, ef.int64), ef.cast(ef.fill(rows, BOS), ef.int64), h0, ef.fill(rows, False, ef.bool_),
                 ef.cast(ef.fill(ef.concat([rows, ef.constant([MAX_LEN], ef.int64)], 0), eos), ef.int64)]
        steps, _, _, _, tokens = ef.while_loop(more, body, start, maximum_iterations=MAX_LEN)
    ef.save(g, path, {"infer": ({"h0": h0}, {"tokens": tokens, "steps": steps})})


def decoder_onnx(wt, eos):
    """The same decoder as an ONNX Loop (trip count MAX_LEN, condition: a row not done)."""
    from onnx import TensorProto, helper as h, numpy_helper
    i64 = TensorProto.INT64

    def node(op, ins, outs, **attrs):
        return h.make_node(op, ins, outs if isinstance(outs, list) else [outs], **attrs)
    body = h.make_graph([
        node("Gather", ["embedding", "tok_in"], "x"),
        node("MatMul", ["x", "wx"], "xw"), node("Add", ["xw", "bx"], "xwb"),
        node("Split", ["xwb", "split3"], ["xz", "xr", "xn"], axis=1),
        node("MatMul", ["h_in", "uzr"], "hzr"), node("Split", ["hzr", "split2"], ["hz", "hr"], axis=1),
        node("Add", ["xz", "hz"], "z0"), node("Sigmoid", ["z0"], "z"),
        node("Add", ["xr", "hr"], "r0"), node("Sigmoid", ["r0"], "r"),
        node("Mul", ["r", "h_in"], "rh"), node("MatMul", ["rh", "un"], "rhu"),
        node("Add", ["xn", "rhu"], "n0"), node("Tanh", ["n0"], "n"),
        node("Sub", ["h_in", "n"], "hmn"), node("Mul", ["z", "hmn"], "zh"), node("Add", ["n", "zh"], "h_out"),
        node("MatMul", ["h_out", "wo"], "lo"), node("Add", ["lo", "bo"], "logits"),
        node("ArgMax", ["logits"], "nxt", axis=1, keepdims=0),
        node("Where", ["done_in", "eos", "nxt"], "tok_out"),
        node("Equal", ["columns", "step_in"], "here0"), node("Unsqueeze", ["here0", "axis0"], "here"),
        node("Unsqueeze", ["tok_out", "axis1"], "tok_col"), node("Where", ["here", "tok_col", "out_in"], "out_out"),
        node("Equal", ["tok_out", "eos"], "is_eos"), node("Or", ["done_in", "is_eos"], "done_out"),
        node("Add", ["step_in", "one"], "step_out"),
        node("Not", ["done_out"], "open"), node("Cast", ["open"], "open_i", to=TensorProto.INT32),
        node("ReduceMax", ["open_i"], "any_open", keepdims=0), node("Greater", ["any_open", "zero32"], "cond_out"),
    ], "decode_step",
        [h.make_tensor_value_info("iter", i64, []), h.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         h.make_tensor_value_info("step_in", i64, []), h.make_tensor_value_info("tok_in", i64, ["B"]),
         h.make_tensor_value_info("h_in", TensorProto.FLOAT, ["B", HIDDEN]),
         h.make_tensor_value_info("done_in", TensorProto.BOOL, ["B"]),
         h.make_tensor_value_info("out_in", i64, ["B", MAX_LEN])],
        [h.make_tensor_value_info("cond_out", TensorProto.BOOL, []), h.make_tensor_value_info("step_out", i64, []),
         h.make_tensor_value_info("tok_out", i64, ["B"]), h.make_tensor_value_info("h_out", TensorProto.FLOAT, ["B", HIDDEN]),
         h.make_tensor_value_info("done_out", TensorProto.BOOL, ["B"]),
         h.make_tensor_value_info("out_out", i64, ["B", MAX_LEN])])
    consts = {"split3": np.full(3, HIDDEN, np.int64), "split2": np.full(2, HIDDEN, np.int64),
              "eos": np.array(eos, np.int64), "columns": np.arange(MAX_LEN, dtype=np.int64),
              "axis0": np.array([0], np.int64), "axis1": np.array([1], np.int64), "one": np.array(1, np.int64),
              "zero32": np.array(0, np.int32), "zero": np.array(0, np.int64), "true": np.array(True),
              "max_len": np.array(MAX_LEN, np.int64), "bos": np.array(BOS, np.int64),
              "false": np.array(False), "maxlen1": np.array([MAX_LEN], np.int64)}
    inits = [numpy_helper.from_array(v, k) for k, v in {**wt, **consts}.items()]
    graph = h.make_graph([
        node("Shape", ["h0"], "hshape"), node("Slice", ["hshape", "axis0", "axis1"], "batch"),
        node("Expand", ["bos", "batch"], "tok0"), node("Expand", ["false", "batch"], "done0"),
        node("Concat", ["batch", "maxlen1"], "out_shape", axis=0), node("Expand", ["eos", "out_shape"], "out0"),
        node("Loop", ["max_len", "true", "zero", "tok0", "h0", "done0", "out0"],
             ["steps", "tok_last", "h_last", "done_last", "tokens"], body=body),
    ], "decoder", [h.make_tensor_value_info("h0", TensorProto.FLOAT, ["B", HIDDEN])],
        [h.make_tensor_value_info("tokens", i64, ["B", MAX_LEN]), h.make_tensor_value_info("steps", i64, [])],
        inits)
    return ort_model(graph, opset=17)


def pick_eos(wt, h0):
    """An end token the reference emits late in row 0 (about 3/4 of MAX_LEN), so the loop
    stops on it rather than on MAX_LEN; other rows stop on it or run to MAX_LEN."""
    tokens, _ = decode_numpy(wt, h0, eos=-1)
    row = list(tokens[0])
    for step in range(3 * MAX_LEN // 4, 0, -1):
        if row[step] not in row[:step]:
            return int(row[step])
    return int(row[-1])


def bench_decoder(folder, runs, batches=(1, 8)):
    wt = decoder_weights()
    rng = np.random.default_rng(1)
    inits = {b: rng.standard_normal((b, HIDDEN)).astype(np.float32) for b in batches}
    eos = pick_eos(wt, inits[1])
    path = folder / "decoder.efl"
    decoder_efl(path, wt, eos)
    runner = ef.Interpreter(path, num_threads=1).get_signature_runner("infer")
    sess = harness.ort_session(decoder_onnx(wt, eos), threads=1)
    rows = []
    for b in batches:
        feeds = {"h0": inits[b]}
        want, steps = decode_numpy(wt, inits[b], eos)
        ours, theirs = runner(**feeds), dict(zip(["tokens", "steps"], sess.run(None, feeds)))
        for who, got in (("edgeflow", ours), ("onnxruntime", theirs)):
            if int(got["steps"]) != steps or not np.array_equal(got["tokens"], want):
                raise AssertionError(f"{who} decodes batch {b} differently from numpy: {int(got['steps'])} steps "
                                     f"for {steps}, tokens {got['tokens'][0][:12]} for {want[0][:12]}")
        t = harness.medians({"edgeflow": lambda: runner(**feeds), "ort": lambda: sess.run(None, feeds)}, runs,
                            warmup=2)
        rate = {k: steps * b / v for k, v in t.items()}
        rows.append([b, steps, harness.ms(t["edgeflow"], 2), harness.ms(t["ort"], 2), f"{rate['edgeflow']:.0f}",
                     f"{rate['ort']:.0f}", harness.ratio(t["edgeflow"], t["ort"])])
    print(f"\n2. greedy GRU decoder (vocabulary {VOCAB}, embedding {EMBED}, hidden {HIDDEN}, at most {MAX_LEN} "
          f"steps, end token {eos}); tokens equal numpy's; tokens/s = steps x batch / time")
    harness.print_table(["batch", "steps", "edgeflow ms", "onnxruntime ms", "edgeflow tok/s", "onnxruntime tok/s",
                         "time ratio"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each contender (default 30)")
    args = parser.parse_args()
    import onnxruntime
    print(f"onnxruntime {onnxruntime.__version__} on 1 intra-op thread, graph optimisations on; edgeflow on 1 "
          f"thread; numpy {np.__version__}; {os.cpu_count()} cores; medians of {args.runs} interleaved runs\n")
    with tempfile.TemporaryDirectory() as tmp:
        bench_trivial(pathlib.Path(tmp), args.runs)
        bench_decoder(pathlib.Path(tmp), args.runs)


if __name__ == "__main__":
    main()
