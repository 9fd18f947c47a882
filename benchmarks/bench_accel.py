"""The OpenCL delegate against edgeflow's numpy kernels and onnxruntime, in one process.

    .venv/bin/python benchmarks/bench_accel.py [--runs N] [--threads N] [--models a,b] [--device NAME]
                                               [--precision fp32 fp16]

Measured, for each converted model of tests/data/onnx (MobileNetV2-style, ResNet-style,
transformer) at batch 1 and 8: the median latency of edgeflow with the OpenCL delegate (a
row per precision: fp32, and fp16 = half storage with float math), edgeflow with numpy
kernels and onnxruntime's CPU provider (the peer), interleaved, all on the same number of
threads (PoCL's CPU device is held to it through POCL_CPU_MAX_CU_NUM and
POCL_MAX_PTHREAD_COUNT); the ratios OpenCL / numpy and OpenCL / onnxruntime; the largest
difference from the numpy result relative to its largest magnitude; where the ops ran;
the host<->device copies per run.
"""
import argparse
import os

import harness

MODELS = ("mobilenetv2", "resnet", "transformer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each contender (default 30)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {','.join(MODELS)}")
    parser.add_argument("--device", help="OpenCL device name substring or index")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "fp16"], default=["fp32", "fp16"],
                        help="the OpenCL delegate's precision(s), a row each (default: both)")
    args = parser.parse_args()
    # PoCL reads these when its platform loads: set them before pyopencl is imported
    os.environ.setdefault("POCL_CPU_MAX_CU_NUM", str(args.threads))
    os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", str(args.threads))
    import tempfile

    import numpy as np

    import edgeflow as ef
    from edgeflow import accel

    if not accel.available():
        raise SystemExit(f"no OpenCL device: {accel.opencl.INSTALL_HINT}")
    delegates = {p: accel.OpenCLDelegate(device=args.device, precision=p) for p in args.precision}
    print(f"OpenCL device: {next(iter(delegates.values())).device_name}; {args.threads} thread(s) for every "
          f"backend; medians of {args.runs} interleaved runs\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [m for m in args.models.split(",") if m]:
            path = f"{tmp}/{name}.efl"
            harness.convert_onnx(name, path)
            runners = {p: ef.Interpreter(path, delegates=[d], num_threads=args.threads).get_signature_runner("infer")
                       for p, d in delegates.items()}
            numpy_runner = ef.Interpreter(path, num_threads=args.threads).get_signature_runner("infer")
            sess = harness.ort_session(harness.ONNX_DIR / f"{name}.onnx", args.threads)
            for batch in (1, 8):
                feeds = harness.onnx_feeds(name, batch)
                want = numpy_runner(**feeds)
                before = {p: accel.transfers([d]) for p, d in delegates.items()}
                contenders = {"numpy": lambda: numpy_runner(**feeds), "ort": lambda: sess.run(None, feeds)}
                contenders.update({p: (lambda r=r: r(**feeds)) for p, r in runners.items()})
                warmup = 3
                t = harness.medians(contenders, args.runs, warmup)
                for precision, runner in runners.items():
                    copies = [(n - b) / (args.runs + warmup)
                              for n, b in zip(accel.transfers([delegates[precision]]), before[precision])]
                    got = runner(**feeds)
                    diff = max(float(np.abs(got[k] - w).max() / (np.abs(w).max() or 1)) for k, w in want.items())
                    rows.append([name, batch, precision, harness.ms(t[precision], 2), harness.ms(t["numpy"], 2),
                                 harness.ms(t["ort"], 2), harness.ratio(t[precision], t["numpy"]),
                                 harness.ratio(t[precision], t["ort"]), f"{diff:.1e}", f"{copies[0]:g}",
                                 f"{copies[1]:g}", runner.last_plan.placement_summary()])
    harness.print_table(["model", "batch", "prec", "opencl ms", "numpy ms", "onnxruntime ms", "cl/numpy", "cl/ort",
                         "rel diff", "up/run", "down/run", "placement"], rows)


if __name__ == "__main__":
    main()
