"""Latency of converted models: edgeflow vs onnxruntime, side by side in one process.

For each model of tests/data/onnx (MobileNetV2-style, ResNet-style, transformer, LSTM):
median latency at batch 1 and 8 with one thread each and with default threads, the
ratio edgeflow / onnxruntime, and edgeflow's achieved GFLOP/s as a fraction of numpy's
own float32 matmul peak on this machine. Then the file size of each model: .onnx vs
.efl fp32, fp16, int8. Goals: under 1.5x onnxruntime for MobileNetV2 at batch 1, parity
for the matmul-heavy transformer.

    .venv/bin/python benchmarks/bench_models.py [--runs N] [--models a,b]
"""
import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "onnx"

import edgeflow as ef  # noqa: E402
from converters import onnx as onnx_converter  # noqa: E402

MODELS = ("mobilenetv2", "resnet", "transformer", "lstm")


def median_time(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak(threads, n=1024, runs=10):
    """numpy's float32 matmul GFLOP/s at n x n with this many BLAS threads."""
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    with threadpool_limits(limits=threads):
        t = median_time(lambda: np.matmul(a, a, out=out), runs)
    return 2 * n ** 3 / t / 1e9


def feeds_for(name, batch):
    io = np.load(DATA / f"{name}_io.npz")
    case = next(str(c) for c in io["cases"] if str(c).startswith(f"b{batch}"))
    import onnx
    graph = onnx.load(str(DATA / f"{name}.onnx")).graph
    inits = {i.name for i in graph.initializer}
    return {i.name: io[f"{case}.{i.name}"] for i in graph.input if i.name not in inits}


def ort_session(name, threads):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(DATA / f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])


def bench_latency(names, runs, folder):
    peaks = {1: matmul_peak(1), None: matmul_peak(os.cpu_count())}
    print(f"numpy float32 matmul peak (1024^3): {peaks[1]:.1f} GFLOP/s on 1 thread, "
          f"{peaks[None]:.1f} GFLOP/s on default threads\n")
    print(f"{'model':12} {'batch':>5} {'threads':>8} {'edgeflow':>11} {'onnxruntime':>12} "
          f"{'ratio':>7} {'GFLOP/s':>8} {'of peak':>8}")
    for name in names:
        path = folder / f"{name}.efl"
        onnx_converter.convert(DATA / f"{name}.onnx", path)
        for threads in (1, None):
            interp = ef.Interpreter(path, num_threads=threads)
            runner = interp.get_signature_runner("infer")
            sess = ort_session(name, threads)
            for batch in (1, 8):
                feeds = feeds_for(name, batch)
                ours = median_time(lambda: runner(**feeds), runs)
                theirs = median_time(lambda: sess.run(None, feeds), runs)
                gflops = sum(runner.last_plan.flops().values()) / ours / 1e9
                print(f"{name:12} {batch:5} {threads or 'default':>8} {ours * 1e3:8.2f} ms "
                      f"{theirs * 1e3:9.2f} ms {ours / theirs:6.2f}x {gflops:8.2f} "
                      f"{gflops / peaks[threads]:7.1%}")


def bench_sizes(names, folder):
    print(f"\n{'model':12} {'.onnx':>10} {'.efl fp32':>10} {'fp16':>10} {'int8':>10} "
          f"{'int8/fp32':>10}")
    for name in names:
        sizes = []
        for quantize in (None, "fp16", "int8"):
            out = folder / f"{name}-{quantize}.efl"
            sizes.append(onnx_converter.convert(DATA / f"{name}.onnx", out, quantize=quantize).efl_bytes)
        onnx_bytes = (DATA / f"{name}.onnx").stat().st_size
        print(f"{name:12} {onnx_bytes:10,} {sizes[0]:10,} {sizes[1]:10,} {sizes[2]:10,} "
              f"{sizes[2] / sizes[0]:10.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        bench_latency(names, args.runs, pathlib.Path(tmp))
        bench_sizes(names + ["mlp", "digits_cnn"], pathlib.Path(tmp))


if __name__ == "__main__":
    main()
