"""Latency of converted models: edgeflow against onnxruntime, in one process.

    .venv/bin/python benchmarks/bench_models.py [--runs N] [--models a,b]

Measured, for each model of tests/data/onnx (MobileNetV2-style, ResNet-style,
transformer, LSTM) at batch 1 and 8, on one thread each and on default threads: the
median latency of edgeflow and of onnxruntime (the peer), interleaved, their ratio, and
edgeflow's GFLOP/s as a fraction of numpy's own float32 matmul peak on this machine.
Then each model's file size: .onnx against .efl fp32, fp16, int8. Goals: under 1.5x
onnxruntime for MobileNetV2 at batch 1, parity for the matmul-heavy transformer.
"""
import argparse
import os
import pathlib
import tempfile

import numpy as np

import edgeflow as ef
import harness

MODELS = ("mobilenetv2", "resnet", "transformer", "lstm")


def matmul_peak(threads, n=1024, runs=10):
    """numpy's float32 matmul GFLOP/s at n x n with this many BLAS threads."""
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    with threadpool_limits(limits=threads):
        t = harness.medians({"matmul": lambda: np.matmul(a, a, out=out)}, runs, warmup=3)["matmul"]
    return 2 * n ** 3 / t / 1e9


def bench_latency(names, runs, folder):
    peaks = {1: matmul_peak(1), None: matmul_peak(os.cpu_count())}
    print(f"numpy float32 matmul peak (1024^3): {peaks[1]:.1f} GFLOP/s on 1 thread, "
          f"{peaks[None]:.1f} GFLOP/s on default threads; medians of {runs} interleaved runs\n")
    rows = []
    for name in names:
        path = folder / f"{name}.efl"
        harness.convert_onnx(name, path)
        for threads in (1, None):
            runner = ef.Interpreter(path, num_threads=threads).get_signature_runner("infer")
            sess = harness.ort_session(harness.ONNX_DIR / f"{name}.onnx", threads)
            for batch in (1, 8):
                feeds = harness.onnx_feeds(name, batch)
                t = harness.medians({"edgeflow": lambda: runner(**feeds), "ort": lambda: sess.run(None, feeds)},
                                    runs, warmup=3)
                gflops = sum(runner.last_plan.flops().values()) / t["edgeflow"] / 1e9
                rows.append([name, batch, threads or "default", harness.ms(t["edgeflow"], 2), harness.ms(t["ort"], 2),
                             harness.ratio(t["edgeflow"], t["ort"]), f"{gflops:.2f}",
                             f"{gflops / peaks[threads]:.1%}"])
    harness.print_table(["model", "batch", "threads", "edgeflow ms", "onnxruntime ms", "ratio", "GFLOP/s",
                         "of peak"], rows)


def bench_sizes(names, folder):
    rows = []
    for name in names:
        sizes = [harness.convert_onnx(name, folder / f"{name}-{q}.efl", quantize=q).efl_bytes
                 for q in (None, "fp16", "int8")]
        onnx_bytes = (harness.ONNX_DIR / f"{name}.onnx").stat().st_size
        rows.append([name, f"{onnx_bytes:,}", *(f"{s:,}" for s in sizes), f"{sizes[2] / sizes[0]:.3f}"])
    print()
    harness.print_table(["model", ".onnx", ".efl fp32", "fp16", "int8", "int8/fp32"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each contender (default 30)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {','.join(MODELS)}")
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        bench_latency(names, args.runs, pathlib.Path(tmp))
        bench_sizes(names + ["mlp", "digits_cnn"], pathlib.Path(tmp))


if __name__ == "__main__":
    main()
