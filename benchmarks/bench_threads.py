"""Intra-op threads: a product split over edgeflow's lock workers and its native workers
(edgeflow/interp/native_threads.py) against OpenBLAS's own threads, and whole models at 1
and N threads with either kind of worker, in one process.

    .venv/bin/python benchmarks/bench_threads.py [--runs N] [--threads N] [--part products|models|all]

- products: float32 matrix products of the shapes real models split (MobileNetV2's
  pointwise convs at 224x224, BERT-like projections, ResNet-18's last layer), each as
  one BLAS call on one thread and edgeflow's split of it on N threads (Workers.split: by
  output rows from threads.ROWS_FIRST rows, else by columns) through the lock workers
  and the native ones, interleaved; then, in a pass of its own (its threads spin long
  after each product), the one call on OpenBLAS's N threads (numpy's matmul: the peer);
- models: the real-size models of bench_models.py (the `zoo` extra exports them once) at
  batch 1, edgeflow on 1 thread and on N with each kind of worker always splitting
  (EDGEFLOW_NATIVE_THREADS=0 or 1, EDGEFLOW_ADAPTIVE_THREADS=0), and on N as it runs by
  default (native workers, each split step and each whole run choosing between its split
  and one thread by timing itself: threads.Adaptive), each contender in processes of its
  own, alternating.
Medians; ratios to one thread's time. In the products' interleaved set the native workers
spin for a while after their run, into the next contender's (the lock workers'), which
the models' separate processes avoid.
"""
import argparse
import functools
import os
import pathlib
import tempfile

import numpy as np

import edgeflow as ef
import harness
from edgeflow.interp import threads

# (M, K, N): out (M, N) = a (M, K) @ b (K, N).
PRODUCTS = [(16, 32, 12544), (96, 16, 12544), (24, 144, 3136), (144, 24, 3136), (32, 144, 784),
            (192, 32, 784), (384, 64, 196), (576, 96, 196), (1280, 320, 49),
            (128, 256, 768), (128, 256, 1024), (128, 1024, 256), (1, 512, 1000)]


def workers(n, native):
    os.environ["EDGEFLOW_NATIVE_THREADS"] = "1" if native else "0"
    try:
        return threads.Workers(n, adaptive=False)  # the split itself, every time
    finally:
        del os.environ["EDGEFLOW_NATIVE_THREADS"]


def split_step(w, a, b, out):
    """Workers.split of a @ b as the kernels cut it (math.py's _split_matmul)."""
    m, n = out.shape
    if m >= threads.ROWS_FIRST or n < threads.MIN_COLUMNS * w.n:
        parts = [functools.partial(np.matmul, a[i:j], b, out=out[i:j]) for i, j in threads.pieces(m, w.n)]
    else:
        parts = [functools.partial(np.matmul, a, b[:, i:j], out=out[:, i:j])
                 for i, j in threads.pieces(n, w.n, threads.MIN_COLUMNS)]
    return w.split(parts)


def bench_products(runs, n):
    from threadpoolctl import ThreadpoolController
    locks, native = workers(n, False), workers(n, True)  # native ones load scipy's BLAS: before the controller
    if native.native is None:
        harness.log("native workers unavailable (llvmlite missing, or no BLAS sgemm found): their column stays empty")
    # BLAS's thread count set directly (threadpoolctl's limit() finds the libraries again on
    # each call, some 1 ms): one thread but for the OpenBLAS contender.
    blas = ThreadpoolController().select(user_api="blas").lib_controllers
    had = [lib.get_num_threads() for lib in blas]

    def blas_threads(t):
        for lib in blas:
            lib.set_num_threads(t)
    rows, operands = [], []
    for m, k, cols in PRODUCTS:
        rng = np.random.default_rng(m + k + cols)
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, cols)).astype(np.float32)
        out = np.empty((m, cols), np.float32)
        want = a.astype(np.float64) @ b
        blas_threads(1)
        steps = {"locks": split_step(locks, a, b, out)}
        if native.native is not None:
            steps["native"] = split_step(native, a, b, out)
        for step in steps.values():
            out.fill(np.nan)
            step()
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
        t = harness.medians({"1 thread": functools.partial(np.matmul, a, b, out=out), **steps}, runs, warmup=3)
        rows.append([f"{m}x{k} @ {k}x{cols}", t["1 thread"]] + [t.get(c) for c in ("locks", "native")])
        operands.append((a, b, out))
    # OpenBLAS's own threads last, in a pass of their own: they spin some 0.1 s after each
    # product, and would slow whatever ran next on their core.
    blas_threads(n)
    for row, (a, b, out) in zip(rows, operands):
        row.insert(2, harness.median([t for t in harness.interleaved(
            {"blas": functools.partial(np.matmul, a, b, out=out)}, runs, warmup=3)["blas"]]))
    rows = [[row[0], f"{row[1] * 1e6:.0f}"] + [f"{t * 1e6:.0f} ({t / row[1]:.2f})" if t else "-" for t in row[2:]]
            for row in rows]
    for lib, count in zip(blas, had):
        lib.set_num_threads(count)
    locks.close()
    native.close()
    print(f"\nproducts, us (time against one thread's), {n} threads, medians of {runs} interleaved runs")
    harness.print_table(["product", "1 thread", f"OpenBLAS {n} threads", "lock workers", "native workers"], rows)


def child(efl, threads_, native, adaptive, runs):
    """One contender in a process of its own: median seconds of `runs` invokes at batch 1."""
    os.environ["EDGEFLOW_NATIVE_THREADS"] = native
    os.environ["EDGEFLOW_ADAPTIVE_THREADS"] = adaptive
    import bench_models as models
    inputs = models.batched(models._cached_inputs(pathlib.Path(efl).with_suffix(".onnx")), 1)
    runner = ef.Interpreter(efl, num_threads=int(threads_)).get_signature_runner("infer")
    for _ in range(3):
        runner(**inputs)
    t = harness.interleaved({"run": functools.partial(runner, **inputs)}, runs, warmup=0)["run"]
    print(harness.median(t))


def bench_models(runs, n, names, folder, rounds):
    """Each contender in processes of its own, alternating (`rounds` processes each): in one
    process the native workers of one interpreter spin on a core for a while after its run,
    into the next contender's."""
    import shutil
    import subprocess
    import sys
    import bench_models as models
    from edgeflow.converters import onnx as onnx_converter
    cache = models.default_cache()
    configs = {"1 thread": (1, "1", "1"), "locks": (n, "0", "0"), "native": (n, "1", "0"), "adaptive": (n, "1", "1")}
    rows = []
    for name in names:
        path, _ = models.real_model(name, cache)
        efl = pathlib.Path(folder) / f"{name}.efl"
        shutil.copy(path, efl.with_suffix(".onnx"))
        onnx_converter.convert(path, efl)
        times = {label: [] for label in configs}
        for _ in range(rounds):
            for label, (count, native, adaptive) in configs.items():
                out = subprocess.run([sys.executable, __file__, "--child", str(efl), str(count), native, adaptive,
                                      str(runs)],
                                     check=True, capture_output=True, text=True).stdout
                times[label].append(float(out.split()[-1]))
        t = {label: harness.median(v) for label, v in times.items()}
        one = t["1 thread"]
        rows.append([name, harness.ms(one, 2)] + [f"{harness.ms(t[c], 2)} ({t[c] / one:.2f})"
                                                  for c in ("locks", "native", "adaptive")])
        harness.log("  " + "  ".join(rows[-1]))
    print(f"\nmodels at batch 1, ms (time against one thread's), {n} threads: medians over {rounds} processes "
          f"each, alternating, of the medians of {runs} runs")
    harness.print_table(["model", "1 thread", "lock workers, split", "native workers, split",
                         "native, adaptive (default)"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each contender (default 30)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the split contenders (default 2)")
    parser.add_argument("--part", choices=("products", "models", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=5, help="processes per model contender (default 5)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--models", default="resnet18,mobilenet_v2,mobilenet_v3_small,bert_encoder",
                        help="real-size models of bench_models.py (default resnet18,mobilenet_v2,"
                             "mobilenet_v3_small,bert_encoder)")
    args = parser.parse_args()
    if args.child:
        child(*args.child[:4], int(args.child[4]))
        return
    if args.part in ("products", "all"):
        bench_products(args.runs, args.threads)
    if args.part in ("models", "all"):
        with tempfile.TemporaryDirectory() as folder:
            bench_models(args.runs, args.threads, [m for m in args.models.split(",") if m], folder, args.rounds)


if __name__ == "__main__":
    main()
