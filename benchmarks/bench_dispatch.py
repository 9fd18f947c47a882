"""Interpreter dispatch cost per op: a chain of 1,000 tiny adds.

Side by side in one run: edgeflow's invoke loop, onnxruntime on the same chain, and the
floor (the same 1,000 numpy ufunc calls in a bare Python loop). Goal: under 2 us per op.
Prints medians over repeated invocations.
"""
import argparse
import time

import numpy as np

import edgeflow as ef
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


def median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--size", type=int, default=4, help="elements per tensor")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    n = args.ops
    xv = np.ones(args.size, np.float32)

    interp = ef.Interpreter(chain_model(n, args.size))
    (inp,) = interp.get_input_details()
    interp.set_tensor(inp["index"], xv)
    interp.invoke()
    rows = [("edgeflow invoke", median_seconds(interp.invoke, args.repeats))]
    runner = interp.get_signature_runner("infer")
    rows.append(("edgeflow signature runner", median_seconds(lambda: runner(x=xv), args.repeats)))

    c, out = np.full(args.size, 1e-3, np.float32), np.empty(args.size, np.float32)

    def bare_loop():
        h = xv
        for _ in range(n):
            np.add(h, c, out)
            h = out
    rows.append(("bare numpy loop (floor)", median_seconds(bare_loop, args.repeats)))
    try:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(onnx_chain(n, args.size), opts, providers=["CPUExecutionProvider"])
        rows.append(("onnxruntime (1 thread, no graph opt)",
                     median_seconds(lambda: sess.run(None, {"x": xv}), args.repeats)))
    except ImportError:
        print("onnxruntime not installed: peer row skipped")

    base = rows[0][1]
    print(f"chain of {n} adds on float32[{args.size}], median of {args.repeats} runs")
    print(f"{'runner':40} {'per run':>12} {'per op':>10} {'vs edgeflow':>12}")
    for name, t in rows:
        print(f"{name:40} {t * 1e3:9.3f} ms {t / n * 1e6:7.3f} us {t / base:11.2f}x")
    print(f"goal: edgeflow under 2 us per op -> {'met' if base / n < 2e-6 else 'NOT met'}")


if __name__ == "__main__":
    main()
