"""Opening cost and size overhead of `.efl` files, against peers on the same weights.

    .venv/bin/python benchmarks/bench_format.py [--sizes-mb 1 256] [--opens 20] [--rounds 3]

(a) Opening a model of four float32 weight matrices chained by matmul (1 MB and 256 MB):
    the median time of `edgeflow.format.reader.load` and of `edgeflow.Interpreter(path)`
    (everything before the first invoke) over `--opens` opens, and the resident-memory
    growth of the first open, before any weight is touched. Peers: `numpy.load(mmap_mode="r")`
    of one .npy file per weight, and `onnxruntime.InferenceSession` on the equivalent ONNX
    model. Each measurement runs in a fresh child process (one peer's memory cannot hide
    another's; imports are not counted), the peers round-robin for `--rounds` rounds; the
    medians over the rounds are quoted. Goals for .efl: under 10 ms and 4 MB at both sizes.
(b) File size over raw tensor bytes for an MLP and a CNN-like tensor set. Goal: under 1% + 4 KB.
"""
import argparse
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import harness  # noqa: E402
from edgeflow import dtypes  # noqa: E402
from edgeflow.format import reader, writer  # noqa: E402
from edgeflow.format.model import (ModelDef, OperatorDef, SignatureDef, SubGraphDef,  # noqa: E402
                                   TensorDef)

MB = 2**20
TIME_GOAL_MS, MEMORY_GOAL_MB = 10.0, 4.0


# --- Models ---------------------------------------------------------------------------

def chain_weights(total_bytes, count=4):
    """`count` square float32 matrices adding up to about `total_bytes`."""
    n = int((total_bytes / count / 4) ** 0.5)
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, n), dtype=np.float32) for _ in range(count)]


def chain_model(weights):
    """x -> matmul(w0) -> ... -> matmul(w{k-1}) -> y, as a ModelDef."""
    n = weights[0].shape[0]
    tensors = [TensorDef("x", dtypes.float32, (-1, n))]
    operators, h = [], 0
    for k, w in enumerate(weights):
        tensors += [TensorDef(f"w{k}", dtypes.float32, w.shape, w),
                    TensorDef(f"h{k}", dtypes.float32, (-1, n))]
        operators.append(OperatorDef("matmul", [h, len(tensors) - 2], [len(tensors) - 1]))
        h = len(tensors) - 1
    return ModelDef([SubGraphDef("chain", tensors, operators, [0], [h])],
                    [SignatureDef("infer", {"x": 0}, {"y": h})])


def chain_onnx(weights, path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = weights[0].shape[0]
    inits = [numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)]
    names = ["x"] + [f"h{k}" for k in range(len(weights))]
    nodes = [helper.make_node("MatMul", [names[k], f"w{k}"], [names[k + 1]])
             for k in range(len(weights))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])
    y = helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, ["batch", n])
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime releases too
    onnx.save(model, path)


# --- (a) opening, measured in a child process -------------------------------------------

def resident_bytes():
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def opener(peer):
    """A function path -> opened model, with the peer's modules already imported."""
    if peer == "efl":
        return reader.load
    if peer == "interpreter":
        from edgeflow.interp import Interpreter
        return Interpreter
    if peer == "npy":
        return lambda folder: [np.load(p, mmap_mode="r")
                               for p in sorted(pathlib.Path(folder).glob("*.npy"))]
    if peer == "onnxruntime":
        import onnxruntime as ort
        ort.set_default_logger_severity(3)
        return lambda path: ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    raise ValueError(peer)


def measure(peer, path, opens):
    """Runs in the child: first-open memory growth, then the median of `opens` opens."""
    open_model = opener(peer)
    gc.collect()
    before = resident_bytes()
    start = time.perf_counter()
    first = open_model(path)  # held, so its memory stays counted
    first_s = time.perf_counter() - start
    growth = resident_bytes() - before
    times = []
    for _ in range(opens):
        start = time.perf_counter()
        opened = open_model(path)
        times.append(time.perf_counter() - start)
        del opened
    del first
    return {"median_ms": 1e3 * harness.median(times), "first_ms": 1e3 * first_s,
            "rss_mb": growth / MB}


def measure_in_child(peer, path, opens):
    done = subprocess.run([sys.executable, __file__, "--opens", str(opens), "--child", peer, str(path)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def peers_available():
    peers = ["efl", "interpreter", "npy"]
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        peers.append("onnxruntime")
    except ImportError:
        print("onnx/onnxruntime not installed: skipping that peer")
    return peers


def bench_opening(folder, sizes_mb, opens, rounds):
    rows = []
    peers = peers_available()
    for total_mb in sizes_mb:
        label = f"{total_mb:g} MB"
        weights = chain_weights(total_mb * MB)
        paths = {"efl": folder / f"{total_mb:g}.efl", "interpreter": folder / f"{total_mb:g}.efl",
                 "npy": folder / f"npy{total_mb:g}", "onnxruntime": folder / f"{total_mb:g}.onnx"}
        writer.write(chain_model(weights), paths["efl"])
        paths["npy"].mkdir()
        for k, w in enumerate(weights):
            np.save(paths["npy"] / f"w{k}.npy", w)
        if "onnxruntime" in peers:
            chain_onnx(weights, paths["onnxruntime"])
        weight_mb = sum(w.nbytes for w in weights) / MB
        del weights
        runs = {peer: [] for peer in peers}
        for _ in range(rounds):  # the peers round-robin: host-load drift spreads over all of them
            for peer in peers:
                runs[peer].append(measure_in_child(peer, paths[peer], opens))
        results = {peer: pooled(r) for peer, r in runs.items()}
        rows += [(f"{label} ({weight_mb:.1f} MB weights)", peer, results[peer], results["efl"])
                 for peer in peers]
    print_opening(rows, opens, rounds)


def pooled(runs):
    """The medians over a peer's child runs (or the first error)."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    return {k: harness.median([r[k] for r in runs]) for k in runs[0]}


def print_opening(rows, opens, rounds):
    print(f"\n(a) Opening a model: median of {opens} opens, and resident memory growth on the first open "
          f"(before any weight is read); medians over {rounds} rounds of child processes")
    print(f"    goals for .efl: < {TIME_GOAL_MS:g} ms and < {MEMORY_GOAL_MB:g} MB at both sizes\n")
    table = []
    for size, peer, r, efl in rows:
        if "error" in r:
            table.append([size, LABELS[peer], f"failed: {r['error']}", "", "", "", ""])
            continue
        rss_ratio = harness.ratio(r["rss_mb"], efl["rss_mb"]) if efl.get("rss_mb", 0) > 0.01 else "-"
        table.append([size, LABELS[peer], f"{r['median_ms']:.3f}", f"{r['first_ms']:.2f}", f"{r['rss_mb']:.2f}",
                      harness.ratio(r["median_ms"], efl.get("median_ms")), rss_ratio])
    harness.print_table(["model", "opener", "median ms", "first open ms", "RSS growth MB", "time / efl",
                         "RSS / efl"], table)


LABELS = {"efl": "edgeflow .efl", "interpreter": "ef.Interpreter", "npy": "numpy .npy", "onnxruntime": "onnxruntime"}


# --- (b) size overhead -----------------------------------------------------------------

def mlp_tensors(sizes=(784, 512, 256, 10)):
    """An MNIST-sized MLP: matmul, add, relu per layer, softmax at the end."""
    rng = np.random.default_rng(1)
    layers = [(rng.standard_normal((a, b), dtype=np.float32),
               rng.standard_normal(b, dtype=np.float32)) for a, b in zip(sizes, sizes[1:])]
    return layered_model("mlp", sizes[0], layers, reshape=False)


def cnn_tensors():
    """A small ResNet-like stack of 3x3 convolutions (HWIO weights, folded batch-norm
    biases) and a classifier head. edgeflow has no conv op yet, so each layer is
    reshape(weights) -> matmul -> add -> relu: the same tensors, one more op each."""
    rng = np.random.default_rng(2)
    channels = [3, 32, 32, 64, 64, 128, 128, 256, 256]
    layers = [(rng.standard_normal((3, 3, cin, cout), dtype=np.float32),
               rng.standard_normal(cout, dtype=np.float32))
              for cin, cout in zip(channels, channels[1:])]
    layers.append((rng.standard_normal((256, 1000), dtype=np.float32),
                   rng.standard_normal(1000, dtype=np.float32)))
    return layered_model("cnn", 27, layers, reshape=True)


def layered_model(name, n_in, layers, reshape):
    tensors = [TensorDef("x", dtypes.float32, (-1, n_in))]
    operators = []

    def add(tname, shape, data=None):
        tensors.append(TensorDef(tname, dtypes.float32, shape, data))
        return len(tensors) - 1

    h = 0
    for k, (w, b) in enumerate(layers):
        wi, bi = add(f"layer{k}/weight", w.shape, w), add(f"layer{k}/bias", b.shape, b)
        if reshape and w.ndim > 2:
            flat = add(f"layer{k}/weight_2d", (-1, w.shape[-1]))
            operators.append(OperatorDef("reshape", [wi], [flat], {"shape": (-1, w.shape[-1])}))
            wi = flat
        n_out = w.shape[-1]
        xw, y = add(f"layer{k}/matmul", (-1, n_out)), add(f"layer{k}/biased", (-1, n_out))
        operators += [OperatorDef("matmul", [h, wi], [xw]), OperatorDef("add", [xw, bi], [y])]
        h = add(f"layer{k}/relu", (-1, n_out))
        operators.append(OperatorDef("relu", [y], [h]))
    probs = add("probs", (-1, layers[-1][0].shape[-1]))
    operators.append(OperatorDef("softmax", [h], [probs]))
    raw = sum(w.nbytes + b.nbytes for w, b in layers)
    model = ModelDef([SubGraphDef(name, tensors, operators, [0], [probs])],
                     [SignatureDef("infer", {"x": 0}, {"probs": probs})])
    return model, raw, 2 * len(layers)


def bench_overhead():
    print("\n(b) File size over raw tensor bytes (goal: < 1% + 4 KB)\n")
    header = f"{'model':<34}{'tensors':>8}{'raw bytes':>13}{'file bytes':>13}{'overhead':>11}" \
             f"{'FlatBuffer':>12}{'allowed':>10}"
    print(header)
    print("-" * len(header))
    for label, (model, raw, n_constants) in (("MLP 784-512-256-10", mlp_tensors()),
                                             ("CNN-like, 8 conv layers + head", cnn_tensors())):
        data = writer.to_bytes(model)
        info = reader.file_info(data)
        overhead, allowed = len(data) - raw, raw // 100 + 4096
        verdict = "meets goal" if overhead < allowed else "MISSES goal"
        print(f"{label:<34}{n_constants:>8}{raw:>13,}{len(data):>13,}{overhead:>11,}"
              f"{info.flatbuffer_bytes:>12,}{allowed:>10,}  {overhead / raw:.3%}, {verdict}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 256], help="model sizes (default 1 256)")
    parser.add_argument("--opens", type=int, default=20, help="timed opens per child process (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="child processes per peer and size (default 3)")
    parser.add_argument("--child", nargs=2, metavar=("PEER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.opens)))
        return
    with tempfile.TemporaryDirectory(prefix="bench_format_") as folder:
        bench_opening(pathlib.Path(folder), args.sizes_mb, args.opens, args.rounds)
    bench_overhead()


if __name__ == "__main__":
    main()
