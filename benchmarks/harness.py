"""What every benchmark shares: the models it measures (the digits CNN, the converted test
models of tests/data/onnx), its peers' sessions, interleaved timing with medians, tables
with ratio columns, and the one way a benchmark opens a split device package.

Imported by the scripts beside it (`import harness`); numpy and the standard library at
import time, everything else where it is used.
"""
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
ONNX_DIR = ROOT / "tests" / "data" / "onnx"
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# -- timing -------------------------------------------------------------------------------
def median(values):
    """The median of `values`, None when there are none."""
    return statistics.median(values) if len(values) else None


def interleaved(contenders, runs, warmup=1):
    """Time every callable of {name: fn} `runs` times, round-robin (round r starts at the
    r-th contender, so host-load drift and ordering spread over all of them), after
    `warmup` untimed calls each, which come after numba's background load (an Interpreter's
    first plan in the default mode binds without it: kernels/jit.py's `deferred`) has
    ended, so that they make the plans again with the loops. {name: [seconds of each run]}."""
    names = list(contenders)
    for name in names:
        contenders[name]()  # a provisional plan's first run starts the load
    if "edgeflow.interp.kernels.jit" in sys.modules:
        sys.modules["edgeflow.interp.kernels.jit"].wait()
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    times = {name: [] for name in names}
    for r in range(runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def medians(contenders, runs, warmup=1):
    """{name: median seconds} of `interleaved(contenders, runs, warmup)`."""
    return {name: median(t) for name, t in interleaved(contenders, runs, warmup).items()}


# -- tables -------------------------------------------------------------------------------
def ratio(a, b):
    """`a / b` as "1.23x"; "-" when either is missing or b is 0."""
    return "-" if a is None or not b else f"{a / b:.2f}x"


def ms(seconds, digits=1):
    """Seconds as milliseconds; "-" when missing."""
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def print_table(columns, rows):
    """Print `rows` (lists of cells) under `columns` (titles): the first column left-aligned,
    the others right-aligned, each as wide as its widest cell."""
    cells = [[str(c) for c in row] for row in [columns, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -- models -------------------------------------------------------------------------------
def digits_cnn(path, channels=(16, 32), second_pool=True, learning_rate=0.01):
    """Write the digits CNN (8x8 images, 10 classes) to `path`: conv1 3x3 + relu, 2x2
    max-pool, conv2 3x3 + relu, [2x2 max-pool,] flatten, dense logits; softmax
    cross-entropy, Adam. Signatures `train` (image, label -> loss) and `infer` (image ->
    logits). Layer names conv1, pool1, conv2, pool2, logits; seed 0.

    channels=(16, 32) with the second pool is tests/graph/test_digits_training.py's;
    channels=(8, 16) without it is tests/cloud/test_split_training.py's."""
    import edgeflow as ef
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.conv2d(image, channels[0], 3, padding="same", activation=ef.nn.relu, name="conv1")
        h = ef.layers.max_pool2d(h, 2, 2, name="pool1")
        h = ef.layers.conv2d(h, channels[1], 3, padding="same", activation=ef.nn.relu, name="conv2")
        if second_pool:
            h = ef.layers.max_pool2d(h, 2, 2, name="pool2")
        logits = ef.layers.dense(ef.layers.flatten(h), 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(learning_rate).minimize(loss)
    ef.save(g, path, signatures={"train": ({"image": image, "label": label}, {"loss": loss}, [step]),
                                 "infer": ({"image": image}, {"logits": logits})})


def convert_onnx(name, path, **options):
    """Convert tests/data/onnx/<name>.onnx to `path`; the converter's result."""
    from edgeflow.converters import onnx as onnx_converter
    return onnx_converter.convert(ONNX_DIR / f"{name}.onnx", path, **options)


def onnx_feeds(name, batch):
    """The recorded inputs of tests/data/onnx/<name>.onnx at batch 1 or 8: {input: array}."""
    import onnx
    io = np.load(ONNX_DIR / f"{name}_io.npz")
    case = next(str(c) for c in io["cases"] if str(c).startswith(f"b{batch}"))
    graph = onnx.load(str(ONNX_DIR / f"{name}.onnx")).graph
    inits = {i.name for i in graph.initializer}
    return {i.name: io[f"{case}.{i.name}"] for i in graph.input if i.name not in inits}


def ort_session(model, threads=None, optimize=True):
    """An onnxruntime CPU session of `model` (a path or serialized bytes) on `threads`
    intra-op threads (None or 0: its default), without graph optimisations if not `optimize`.

    Its worker threads do not spin-wait after a run (`session.intra_op.allow_spinning` 0):
    in interleaved runs they would hold the cores for the next contender's run (measured on
    ResNet-18 at 2 threads, batch 1, this 2-core machine: edgeflow 48.9 ms after spinning
    onnxruntime runs, 34.0 ms after non-spinning ones; onnxruntime's own median 17.5 and 17.4 ms)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])


# -- processes and the cloud --------------------------------------------------------------
def edgeflow_cmd():
    """The `edgeflow` command of this interpreter's environment."""
    exe = pathlib.Path(sys.executable).with_name("edgeflow")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "edgeflow.cli"]


def stop(proc, wait_s=10):
    """End a server process: SIGTERM, then SIGKILL if it is still there after `wait_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def blas_env(threads=1):
    """This environment with numpy's BLAS held to `threads` threads (one: a device is one
    core, and a shared host's BLAS threads make a server's times vary 3x) and the checkout
    importable."""
    env = dict(os.environ)
    for k in BLAS_THREAD_VARS:
        env[k] = str(threads)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def split_device(path, cloud, timeout=None, device_id=None):
    """The interpreter of a split device package talking to `cloud` (an address or an
    edgeflow.cloud.Client): the one place the benchmarks connect a device to the cloud."""
    import edgeflow as ef
    from edgeflow.cloud import CloudDelegate
    return ef.Interpreter(path, delegates=[CloudDelegate(cloud, timeout=timeout, device_id=device_id)])
