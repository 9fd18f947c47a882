"""The OpenCL delegate vs the numpy backend vs onnxruntime, side by side in one process.

For each converted model of tests/data/onnx (MobileNetV2-style, ResNet-style,
transformer): median latency at batch 1 and 8 of edgeflow with the OpenCL delegate (one
row per precision: fp32, and fp16 = half storage with float math), edgeflow with numpy
kernels, and onnxruntime's CPU provider, all on the same number of threads (PoCL's CPU
device is limited through POCL_CPU_MAX_CU_NUM and POCL_MAX_PTHREAD_COUNT); the ratios
OpenCL / numpy and OpenCL / onnxruntime; the largest difference from the numpy result
relative to its largest magnitude; where the ops ran; and the host<->device copies per run.

Goals, on PoCL's CPU device: faster than the numpy backend on every conv model
(MobileNetV2, ResNet), and within 1.5x of onnxruntime on MobileNetV2.

    .venv/bin/python benchmarks/bench_accel.py [--runs N] [--threads N] [--models a,b] [--device NAME]
                                               [--precision fp32 fp16]
"""
import argparse
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = ("mobilenetv2", "resnet", "transformer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", help="OpenCL device name substring or index")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "fp16"], default=["fp32", "fp16"],
                        help="the OpenCL delegate's precision(s), a row each (default: both)")
    args = parser.parse_args()
    # PoCL reads these when its platform loads: set them before pyopencl is imported
    os.environ.setdefault("POCL_CPU_MAX_CU_NUM", str(args.threads))
    os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", str(args.threads))

    import numpy as np

    import edgeflow as ef
    from bench_models import feeds_for, median_time, ort_session
    from converters import onnx as onnx_converter
    from edgeflow import accel

    if not accel.available():
        sys.exit(f"no OpenCL device: {accel.opencl.INSTALL_HINT}")
    delegates = {p: accel.OpenCLDelegate(device=args.device, precision=p) for p in args.precision}
    print(f"OpenCL device: {next(iter(delegates.values())).device_name}; {args.threads} thread(s) for every "
          "backend\n")
    print(f"{'model':12} {'batch':>5} {'prec':>4} {'opencl':>11} {'numpy':>11} {'onnxruntime':>12} "
          f"{'cl/numpy':>9} {'cl/ort':>7} {'rel diff':>8} {'up/run':>7} {'down/run':>8}  placement")
    with tempfile.TemporaryDirectory() as tmp:
        for name in [m for m in args.models.split(",") if m]:
            path = pathlib.Path(tmp) / f"{name}.efl"
            onnx_converter.convert(ROOT / "tests" / "data" / "onnx" / f"{name}.onnx", path)
            runners = {p: ef.Interpreter(path, delegates=[d], num_threads=args.threads).get_signature_runner("infer")
                       for p, d in delegates.items()}
            np_runner = ef.Interpreter(path, num_threads=args.threads).get_signature_runner("infer")
            sess = ort_session(name, args.threads)
            for batch in (1, 8):
                feeds = feeds_for(name, batch)
                theirs = median_time(lambda: sess.run(None, feeds), args.runs)
                numpy_s = median_time(lambda: np_runner(**feeds), args.runs)
                want = np_runner(**feeds)
                for precision, cl_runner in runners.items():
                    delegate = delegates[precision]
                    got = cl_runner(**feeds)
                    diff = max(float(np.abs(got[k] - w).max() / (np.abs(w).max() or 1)) for k, w in want.items())
                    before = accel.transfers([delegate])
                    ours = median_time(lambda: cl_runner(**feeds), args.runs, warmup=3)
                    copies = [(n - b) / (args.runs + 3) for n, b in zip(accel.transfers([delegate]), before)]
                    print(f"{name:12} {batch:5} {precision:>4} {ours * 1e3:8.2f} ms {numpy_s * 1e3:8.2f} ms "
                          f"{theirs * 1e3:9.2f} ms {ours / numpy_s:8.2f}x {ours / theirs:6.2f}x {diff:8.1e} "
                          f"{copies[0]:7g} {copies[1]:8g}  {cl_runner.last_plan.placement_summary()}")


if __name__ == "__main__":
    main()
