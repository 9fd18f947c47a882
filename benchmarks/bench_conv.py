"""Convolution speed: edgeflow's numpy kernels against onnxruntime, one conv per model.

    .venv/bin/python benchmarks/bench_conv.py [--runs N]

Measured: convolutions of mobile networks (a 3x3 conv, a 1x1 pointwise conv, depthwise
3x3 and 5x5 ones on wide planes and on a 7x7 one, and a stem of 3 input channels), each as
a one-op `edgeflow.Interpreter` model and as an onnxruntime session holding the single
Conv node (the peer; it converts NCHW to its blocked layout and back around the node,
which a whole model does once), interleaved, on 1 thread
each and on their default thread counts: median times, GFLOP/s, and edgeflow's time over
onnxruntime's on as many threads. numpy's OpenBLAS spins its threads: on a busy machine
the default-threads row can be many times slower than the 1-thread row.
"""
import argparse

import numpy as np

import edgeflow as ef
import harness
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply

# name: (x shape, w shape, attrs)
CASES = {
    "3x3 32->32 56x56": ((1, 32, 56, 56), (32, 32, 3, 3), {"pads": (1, 1, 1, 1)}),
    "1x1 64->128 28x28": ((1, 64, 28, 28), (128, 64, 1, 1), {}),
    "dw3x3 96 56x56 s2": ((1, 96, 56, 56), (96, 1, 3, 3), {"pads": (1, 1, 1, 1), "strides": (2, 2),
                                                           "group": 96}),
    "dw3x3 144 56x56": ((1, 144, 56, 56), (144, 1, 3, 3), {"pads": (1, 1, 1, 1), "group": 144}),
    "dw3x3 960 7x7": ((1, 960, 7, 7), (960, 1, 3, 3), {"pads": (1, 1, 1, 1), "group": 960}),
    "dw5x5 240 28x28": ((1, 240, 28, 28), (240, 1, 5, 5), {"pads": (2, 2, 2, 2), "group": 240}),
    "stem 3->32 224 s2": ((1, 3, 224, 224), (32, 3, 3, 3), {"pads": (1, 1, 1, 1), "strides": (2, 2)}),
}


def edgeflow_model(x_shape, w, b, attrs):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, x_shape, name="x")
        y = apply("conv", [x, w, b], attrs)
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})})), y.shape


def onnx_model(x_shape, w, b, attrs):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime release reads
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="timed runs of each contender (default 100)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for name, (x_shape, w_shape, attrs) in CASES.items():
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        b = rng.standard_normal(w_shape[0]).astype(np.float32)
        model, y_shape = edgeflow_model(x_shape, w, b, attrs)
        peer_model = onnx_model(x_shape, w, b, attrs)
        flop = 2 * np.prod(y_shape) * np.prod(w_shape[1:])
        contenders = {}
        for threads in (1, None):
            interp = ef.Interpreter(model, num_threads=threads)
            (inp,) = interp.get_input_details()
            interp.set_tensor(inp["index"], x)
            sess = harness.ort_session(peer_model, threads)
            contenders["edgeflow", threads] = interp.invoke
            contenders["ort", threads] = lambda sess=sess: sess.run(None, {"x": x})
        t = harness.medians(contenders, args.runs)
        row = [name, f"{flop / 1e6:.1f}"]
        for threads in (1, None):
            ours, peer = t["edgeflow", threads], t["ort", threads]
            row += [f"{ours * 1e3:.3f}ms {flop / ours / 1e9:5.1f}GF/s", f"{peer * 1e3:.3f}ms {flop / peer / 1e9:5.1f}GF/s",
                    harness.ratio(ours, peer)]
        rows.append(row)
    print(f"median of {args.runs} interleaved runs; ratio = edgeflow time / onnxruntime time on as many threads")
    harness.print_table(["conv", "MFLOP", "edgeflow 1 thread", "ort 1 thread", "ratio", "edgeflow default",
                         "ort default", "ratio"], rows)


if __name__ == "__main__":
    main()
