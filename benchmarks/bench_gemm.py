"""GFLOP/s of the OpenCL matmul kernel (edgeflow/accel/kernels/gemm.cl) vs numpy's BLAS,
square float32 matrices, medians of several runs, side by side; one row per size and
precision (fp16: operands and result stored as half on the device, float math).

    python benchmarks/bench_gemm.py [--sizes 256 1024 2048] [--repeats 5] [--device NAME]
                                    [--precision fp32 fp16]
"""
import argparse
import time

import numpy as np


def median_seconds(fn, repeats):
    fn()  # warm: builds, first-touch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None)
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
    print(f"{'n':>6} {'precision':>9} {'opencl GFLOP/s':>15} {'numpy GFLOP/s':>14} {'opencl/numpy':>13} "
          f"{'max |diff|':>11} {'rel diff':>9}")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        out = np.empty((n, n), np.float32)
        flops = 2.0 * n ** 3
        t_np = median_seconds(lambda: np.matmul(a, b, out=out), args.repeats)
        for precision, rt in runtimes.items():
            da, db, dc = rt.to_device(a), rt.to_device(b), rt.empty((n, n), np.float32)
            step = CL_KERNELS["matmul"].make(rt, [da, db], [dc], {"transpose_a": False, "transpose_b": False,
                                                                   "activation": ""})

            def on_device():
                step()
                rt.queue.finish()
            t_cl = median_seconds(on_device, args.repeats)
            diff = float(np.abs(dc.get().astype(np.float32) - out).max())
            print(f"{n:>6} {precision:>9} {flops / t_cl / 1e9:>15.1f} {flops / t_np / 1e9:>14.1f} "
                  f"{t_np / t_cl:>13.2f} {diff:>11.2e} {diff / np.abs(out).max():>9.1e}")
            del da, db, dc


if __name__ == "__main__":
    main()
