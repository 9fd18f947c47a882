"""GFLOP/s of the OpenCL matmul kernel (edgeflow/accel/kernels/gemm.cl) against numpy's BLAS.

    .venv/bin/python benchmarks/bench_gemm.py [--sizes 256 1024 2048] [--runs 5] [--device NAME]
                                              [--precision fp32 fp16]

Measured: square float32 matrices, one row per size and precision (fp16: operands and
result stored as half on the device, float math); the medians of interleaved runs of
the kernel (to the queue's finish) and of numpy.matmul (the peer), their GFLOP/s and
ratio, and the largest difference from numpy's result.
"""
import argparse

import numpy as np

import harness


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each contender (default 5)")
    parser.add_argument("--device", default=None, help="OpenCL device name substring or index")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "fp16"], default=["fp32", "fp16"])
    args = parser.parse_args()

    from edgeflow.accel import OpenCLDelegate
    from edgeflow.accel.kernels import CL_KERNELS, gemm  # noqa: F401  (registration)

    runtimes = {p: OpenCLDelegate(args.device, precision=p).rt for p in args.precision}
    rt = next(iter(runtimes.values()))
    if gemm.cpu_path(rt):
        print(f"device: {rt.device.name}; CPU path: register blocks of "
              f"{gemm.BLOCK['BM']}x{gemm.BLOCK['BN']} per work-item, no local memory")
    else:
        _, tile, per_item = gemm.matmul_kernel(rt)
        print(f"device: {rt.device.name}; tile {tile}x{tile}, {per_item}x{per_item} per work-item")
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        out = np.empty((n, n), np.float32)
        # one precision at a time: PoCL fails when two delegates' buffers are in flight together
        for precision, rt in runtimes.items():
            da, db, dc = rt.to_device(a), rt.to_device(b), rt.empty((n, n), np.float32)
            step = CL_KERNELS["matmul"].make(rt, [da, db], [dc], {"transpose_a": False, "transpose_b": False,
                                                                   "activation": ""})
            t = harness.medians({"numpy": lambda: np.matmul(a, b, out=out),
                                 "opencl": lambda: (step(), rt.queue.finish())}, args.runs)
            gflops = {k: 2.0 * n ** 3 / s / 1e9 for k, s in t.items()}
            diff = float(np.abs(dc.get().astype(np.float32) - out).max())
            rows.append([n, precision, f"{gflops['opencl']:.1f}", f"{gflops['numpy']:.1f}",
                         harness.ratio(t["numpy"], t["opencl"]), f"{diff:.2e}", f"{diff / np.abs(out).max():.1e}"])
            del da, db, dc
    print(f"medians of {args.runs} interleaved runs")
    harness.print_table(["n", "precision", "opencl GFLOP/s", "numpy GFLOP/s", "opencl/numpy", "max |diff|",
                         "rel diff"], rows)


if __name__ == "__main__":
    main()
