"""Latency of converted models: edgeflow against onnxruntime, in one process.

    .venv/bin/python benchmarks/bench_models.py [--suite real|small] [--models a,b]
                                                [--runs N] [--threads 1,2] [--batches 1,8]
                                                [--cache DIR] [--no-sizes] [--jit auto|on|off]

Two suites. `real` (the default; needs the `zoo` extra): real-size models with random
weights, exported from PyTorch with the TorchScript exporter (benchmarks/zoo.py's
builders and export) with a dynamic batch, the ONNX files cached outside the checkout
(default ~/.cache/edgeflow-bench/<torch version>): ResNet-18, MobileNetV2, EfficientNet-B0
and mobilenet_v3_small at 224x224, a BERT-like encoder (torch.nn.TransformerEncoder, 4
layers, d_model 256, 4 heads, feed-forward 1024, sequence 128), a 2-layer LSTM and a
bidirectional GRU (input 128, hidden 256, sequence 64). `small`: the test models of
tests/data/onnx (0.1-1 ms a run: they measure per-op overhead, not kernels).

Measured, for each model and batch at each thread count (edgeflow's `num_threads` and
onnxruntime's intra-op threads alike; every thread count's runs interleaved with the
others', so that a row at 2 threads and its row at 1 saw the same moments of this shared
machine): the time a new Interpreter takes to make
its plan, and its first run (from making the Interpreter to its first result, the plan
included: what an app waits for), the median latency
of edgeflow and of onnxruntime (the peer), interleaved, their ratio, and the GFLOP/s each
achieves (the plan's FLOP count over the median), edgeflow's as a fraction of numpy's own
float32 matmul peak measured in the same run at the same thread count (`--jit on`: edgeflow's
Interpreters import numba up front, so every kernel with a compiled loop binds it). Then, for the small
suite, each model's file size: .onnx against .efl fp32, fp16, int8.
"""
import argparse
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

import edgeflow as ef
from edgeflow.cli.bench import JIT_MODES, JIT_NAMES
import harness

SMALL = ("mobilenetv2", "resnet", "transformer", "lstm")
REAL = ("resnet18", "mobilenet_v2", "efficientnet_b0", "mobilenet_v3_small", "bert_encoder", "lstm2", "bigru")


def matmul_peak(threads, n=1024, runs=10):
    """numpy's float32 matmul GFLOP/s at n x n with this many BLAS threads."""
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    with threadpool_limits(limits=threads):
        t = harness.medians({"matmul": lambda: np.matmul(a, a, out=out)}, runs, warmup=3)["matmul"]
    return 2 * n ** 3 / t / 1e9


# -- real-size models ---------------------------------------------------------------------------
def _zoo():
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import zoo
    return zoo


def _vision(name):
    """torchvision's `name` (random weights, zoo's randomized BatchNorm), 224x224, any batch."""
    example = _zoo().MODELS[name]()
    example.dynamic = {"image": {0: "batch"}}
    return example


def _bert_encoder():
    """A BERT-sized encoder: 4 post-norm layers of d_model 256, 4 heads, feed-forward 1024,
    GELU, on [batch, 128, 256] embeddings."""
    import torch
    zoo = _zoo()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    with torch.no_grad():  # the layers are deep copies of one: make them differ (else the export shares them)
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)
            else:
                p.copy_(torch.randn_like(p) * 0.02 + (1.0 if p.abs().max() == 1 else 0.0))
    return zoo.Example(model, {"x": zoo._sequence(1, 128, 256)}, ["y"], {"x": {0: "batch"}})


def _lstm2():
    """A 2-layer LSTM (input 128, hidden 256) over 64 steps, its last output classified."""
    import torch
    zoo = _zoo()
    torch.manual_seed(0)

    class LSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(256, 10)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.fc(out[:, -1])
    return zoo.Example(LSTM(), {"x": zoo._sequence(1, 64, 128)}, ["logits"], {"x": {0: "batch"}})


def _bigru():
    """A bidirectional GRU (input 128, hidden 256) over 64 steps, its final states classified."""
    import torch
    zoo = _zoo()
    torch.manual_seed(0)

    class BiGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(128, 256, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(512, 10)

        def forward(self, x):
            _, h = self.gru(x)  # [2, batch, 256]
            return self.fc(h.transpose(0, 1).reshape(x.shape[0], -1))
    return zoo.Example(BiGRU(), {"x": zoo._sequence(1, 64, 128)}, ["logits"], {"x": {0: "batch"}})


BUILDERS = {"resnet18": lambda: _vision("resnet18"), "mobilenet_v2": lambda: _vision("mobilenet_v2"),
            "efficientnet_b0": lambda: _vision("efficientnet_b0"),
            "mobilenet_v3_small": lambda: _vision("mobilenet_v3_small"),
            "bert_encoder": _bert_encoder, "lstm2": _lstm2, "bigru": _bigru}


def default_cache():
    """$EDGEFLOW_BENCH_CACHE, else ~/.cache/edgeflow-bench/<torch version> (torch needed then)."""
    if os.environ.get("EDGEFLOW_BENCH_CACHE"):
        return pathlib.Path(os.environ["EDGEFLOW_BENCH_CACHE"])
    import torch
    return pathlib.Path.home() / ".cache" / "edgeflow-bench" / torch.__version__


def real_model(name, cache):
    """(path of `name`'s ONNX file, exported now if not cached, {input: example at batch 1}).
    A cached file needs no torch: its inputs are shaped from the graph (batch 1)."""
    path = pathlib.Path(cache) / f"{name}.onnx"
    if path.exists():
        return path, _cached_inputs(path)
    example = BUILDERS[name]()
    harness.log(f"exporting {name} to {path}...")
    path.parent.mkdir(parents=True, exist_ok=True)
    _zoo().export(example, "torchscript", path)
    return path, example.inputs


def _cached_inputs(path):
    """{input: zeros at batch 1} of an exported file's graph inputs (float32, the builders')."""
    import onnx
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    return {i.name: np.zeros([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], np.float32)
            for i in graph.input if i.name not in weights}


def batched(inputs, batch, seed=0):
    """Random inputs shaped like `inputs` (batch 1) at `batch`."""
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((batch, *a.shape[1:])).astype(a.dtype) for n, a in inputs.items()}


# -- the benchmark ----------------------------------------------------------------------------------
def first_run(efl, threads, feeds, key="infer", jit=None):
    """(seconds to make the plan, seconds from making the Interpreter to the end of its first
    call: what an app waits for its first result, runner) of a new Interpreter(jit=`jit`)'s
    signature `key` (its first: the tensor API's): the plan is made through the tensor API
    (resize_input_tensor, allocate_tensors), for the same key as the runner's, which then
    finds it cached."""
    start = time.perf_counter()
    interp = ef.Interpreter(efl, num_threads=threads, jit=jit)
    runner = interp.get_signature_runner(key)
    inputs = {name: d["index"] for name, d in runner.get_input_details().items()}
    planning = time.perf_counter()
    for name, value in feeds.items():
        interp.resize_input_tensor(inputs[name], value.shape)
    interp.allocate_tensors()
    planned = time.perf_counter()
    runner(**feeds)
    end = time.perf_counter()
    # A first plan made before numba is loaded binds without it, and numba then loads in the
    # background (kernels/jit.py's `deferred`): waited for here, untimed, so that nothing
    # measured after this runs beside that load.
    from edgeflow.interp.kernels import jit as jit_kernels
    jit_kernels.wait()
    return planned - planning, end - start, runner


def bench_latency(models, runs, threads_list, batches, folder, jit=None):
    """models: [(name, onnx path, {batch: feeds})]; `jit`: the Interpreters'."""
    from edgeflow.converters import onnx as onnx_converter
    peaks = {t: matmul_peak(t) for t in threads_list}
    print("numpy float32 matmul peak (1024^3): "
          + ", ".join(f"{p:.1f} GFLOP/s on {t} thread(s)" for t, p in peaks.items())
          + f"; medians of {runs} interleaved runs; edgeflow's jit {JIT_NAMES[jit]}\n", flush=True)
    rows = []
    for name, onnx_path, feeds_of in models:
        efl = folder / f"{name}.efl"
        start = time.perf_counter()
        onnx_converter.convert(onnx_path, efl)
        harness.log(f"{name}: converted in {time.perf_counter() - start:.1f} s")
        sessions = {threads: harness.ort_session(onnx_path, threads) for threads in threads_list}
        for batch in batches:
            feeds = feeds_of[batch]
            contenders, firsts = {}, {}
            for threads in threads_list:  # every thread count in one interleaved set: the same moments
                plan, first, runner = first_run(efl, threads, feeds, jit=jit)
                firsts[threads] = plan, first, runner
                contenders[("edgeflow", threads)] = lambda runner=runner: runner(**feeds)
                contenders[("ort", threads)] = lambda sess=sessions[threads]: sess.run(None, feeds)
            t = harness.medians(contenders, runs, warmup=2)
            for threads in threads_list:
                plan, first, runner = firsts[threads]
                ef_s, ort_s = t[("edgeflow", threads)], t[("ort", threads)]
                flops = sum(runner.last_plan.flops().values())
                gflops = flops / ef_s / 1e9
                rows.append([name, threads, batch, harness.ms(plan, 1), harness.ms(first, 1), harness.ms(ef_s, 2),
                             harness.ms(ort_s, 2), harness.ratio(ef_s, ort_s),
                             f"{flops / 1e9:.3g}", f"{gflops:.1f}", f"{flops / ort_s / 1e9:.1f}",
                             f"{gflops / peaks[threads]:.0%}"])
                harness.log("  " + "  ".join(str(c) for c in rows[-1]))
    print()
    harness.print_table(["model", "threads", "batch", "plan ms", "first run ms", "edgeflow ms", "onnxruntime ms", "ratio",
                         "GFLOP", "edgeflow GFLOP/s", "ort GFLOP/s", "of sgemm peak"], rows)


def bench_sizes(names, folder):
    rows = []
    for name in names:
        sizes = [harness.convert_onnx(name, folder / f"{name}-{q}.efl", quantize=q).efl_bytes
                 for q in (None, "fp16", "int8")]
        onnx_bytes = (harness.ONNX_DIR / f"{name}.onnx").stat().st_size
        rows.append([name, f"{onnx_bytes:,}", *(f"{s:,}" for s in sizes), f"{sizes[2] / sizes[0]:.3f}"])
    print()
    harness.print_table(["model", ".onnx", ".efl fp32", "fp16", "int8", "int8/fp32"], rows)


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("real", "small"), default="real",
                        help="real-size models (needs the zoo extra) or tests/data/onnx's (default real)")
    parser.add_argument("--models", default="", help=f"of {','.join(REAL)} (real) or {','.join(SMALL)} "
                        "(small); default the whole suite")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each contender (default 10)")
    parser.add_argument("--threads", default="1,2", help="thread counts, for both (default 1,2)")
    parser.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    parser.add_argument("--cache", default=None, help="folder of exported ONNX files (default "
                        "$EDGEFLOW_BENCH_CACHE or ~/.cache/edgeflow-bench/<torch version>)")
    parser.add_argument("--no-sizes", action="store_true", help="skip the small suite's file sizes")
    parser.add_argument("--jit", choices=JIT_MODES, default="auto",
                        help="edgeflow's Interpreter(jit=): auto (default), on (numba imported up front), off")
    args = parser.parse_args()
    suite = REAL if args.suite == "real" else SMALL
    names = [m for m in args.models.split(",") if m] or list(suite)
    unknown = [m for m in names if m not in suite]
    if unknown:
        parser.error(f"unknown {args.suite} model(s) {unknown}: of {','.join(suite)}")
    batches = _ints(args.batches)
    if args.suite == "small" and set(batches) - {1, 8}:
        parser.error("the small suite has recorded inputs at batch 1 and 8 only")
    models = []
    if args.suite == "real":
        cache = pathlib.Path(args.cache) if args.cache else default_cache()
        for name in names:
            path, inputs = real_model(name, cache)
            models.append((name, path, {b: batched(inputs, b) for b in batches}))
    else:
        models = [(n, harness.ONNX_DIR / f"{n}.onnx", {b: harness.onnx_feeds(n, b) for b in batches}) for n in names]
    with tempfile.TemporaryDirectory() as tmp:
        bench_latency(models, args.runs, _ints(args.threads), batches, pathlib.Path(tmp), JIT_MODES[args.jit])
        if args.suite == "small" and not args.no_sizes:
            bench_sizes(names + ["mlp", "digits_cnn"], pathlib.Path(tmp))


if __name__ == "__main__":
    main()
