"""Convolution speed: edgeflow's numpy kernels against onnxruntime, one conv per model.

Three shapes of a mobile network: a 3x3 conv, a 1x1 (pointwise) conv and a stride-2
depthwise 3x3. Each runs through an `edgeflow.Interpreter` and through an onnxruntime
session holding the single Conv node, both on 1 thread (edgeflow's BLAS limited with
threadpoolctl, when installed) and on their default thread counts. Prints median times,
GFLOP/s and edgeflow's time relative to onnxruntime's on as many threads.

numpy's OpenBLAS spins its threads: on a machine busy with other work the default-threads
edgeflow row can be many times slower than its 1-thread row. Compare on an idle machine.
"""
import argparse
import contextlib
import time

import numpy as np

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply

# name: (x shape, w shape, attrs)
CASES = {
    "3x3 32->32 56x56": ((1, 32, 56, 56), (32, 32, 3, 3), {"pads": (1, 1, 1, 1)}),
    "1x1 64->128 28x28": ((1, 64, 28, 28), (128, 64, 1, 1), {}),
    "dw3x3 96 56x56 s2": ((1, 96, 56, 56), (96, 1, 3, 3), {"pads": (1, 1, 1, 1), "strides": (2, 2),
                                                           "group": 96}),
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


def median_seconds(fn, repeats):
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def blas_threads(n):
    """A context limiting numpy's BLAS to n threads (None: as it is)."""
    if n is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(n, user_api="blas")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime not installed: peer columns skipped")

    print(f"median of {args.repeats} runs; ratio = edgeflow time / onnxruntime time on as many threads")
    print(f"{'conv':18} {'MFLOP':>6} {'edgeflow 1 thread':>18} {'ort 1 thread':>18} {'ratio':>6} "
          f"{'edgeflow default':>18} {'ort default':>18} {'ratio':>6}")
    for name, (x_shape, w_shape, attrs) in CASES.items():
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        b = rng.standard_normal(w_shape[0]).astype(np.float32)
        model, y_shape = edgeflow_model(x_shape, w, b, attrs)
        flop = 2 * np.prod(y_shape) * np.prod(w_shape[1:])
        interp = ef.Interpreter(model)
        (inp,) = interp.get_input_details()
        interp.set_tensor(inp["index"], x)
        cells = []
        for threads in (1, 0):
            limit = blas_threads(threads or None)
            if limit is None:
                ours = None
            else:
                with limit:
                    ours = median_seconds(interp.invoke, args.repeats)
            peer = None
            if ort is not None:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = threads
                sess = ort.InferenceSession(onnx_model(x_shape, w, b, attrs), opts,
                                            providers=["CPUExecutionProvider"])
                peer = median_seconds(lambda: sess.run(None, {"x": x}), args.repeats)
            cells += [_cell(ours, flop), _cell(peer, flop),
                      f"{ours / peer:5.2f}x" if ours and peer else f"{'-':>6}"]
        print(f"{name:18} {flop / 1e6:6.1f} " + " ".join(
            f"{c:>{18 if i % 3 < 2 else 6}}" for i, c in enumerate(cells)))


def _cell(seconds, flop):
    return "-" if seconds is None else f"{seconds * 1e3:7.3f}ms {flop / seconds / 1e9:5.1f}GF/s"


if __name__ == "__main__":
    main()
