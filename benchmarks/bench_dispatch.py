"""Interpreter dispatch cost per op: a chain of 1,000 tiny adds.

    .venv/bin/python benchmarks/bench_dispatch.py [--ops N] [--size N] [--runs N]

Measured, interleaved, median per run and per op: edgeflow's invoke loop and its
signature runner, against onnxruntime on the same chain (1 thread, no graph
optimisation: the peer) and the floor (the same numpy ufunc calls in a bare Python loop).
Goal: under 2 us per op.
"""
import argparse

import numpy as np

import edgeflow as ef
import harness
from edgeflow.format import writer


def chain_model(n_ops, size):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [size], name="x")
        c = ef.constant(np.full(size, 1e-3, np.float32), name="c")
        h = x
        for _ in range(n_ops):
            h = ef.add(h, c)
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": h})}))


def onnx_chain(n_ops, size):
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"h{i}", "c"],
                              ["y" if i == n_ops - 1 else f"h{i + 1}"]) for i in range(n_ops)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
        [onnx.numpy_helper.from_array(np.full(size, 1e-3, np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime release reads
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--size", type=int, default=4, help="elements per tensor")
    parser.add_argument("--runs", type=int, default=200, help="timed runs of each contender (default 200)")
    args = parser.parse_args()
    n = args.ops
    xv = np.ones(args.size, np.float32)
    interp = ef.Interpreter(chain_model(n, args.size))
    (inp,) = interp.get_input_details()
    interp.set_tensor(inp["index"], xv)
    runner = interp.get_signature_runner("infer")
    c, out = np.full(args.size, 1e-3, np.float32), np.empty(args.size, np.float32)

    def bare_loop():
        h = xv
        for _ in range(n):
            np.add(h, c, out)
            h = out
    sess = harness.ort_session(onnx_chain(n, args.size), threads=1, optimize=False)
    t = harness.medians({"edgeflow invoke": interp.invoke, "edgeflow signature runner": lambda: runner(x=xv),
                         "bare numpy loop (floor)": bare_loop,
                         "onnxruntime (1 thread, no graph opt)": lambda: sess.run(None, {"x": xv})}, args.runs)
    base = t["edgeflow invoke"]
    print(f"chain of {n} adds on float32[{args.size}], median of {args.runs} interleaved runs; goal: edgeflow "
          f"under 2 us per op")
    harness.print_table(["runner", "per run ms", "per op us", "vs edgeflow"],
                        [[name, f"{s * 1e3:.3f}", f"{s / n * 1e6:.3f}", harness.ratio(s, base)]
                         for name, s in t.items()])


if __name__ == "__main__":
    main()
