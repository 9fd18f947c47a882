"""Training steps per second: edgeflow's interpreter (the packaged `train` signature)
against PyTorch CPU on the same model and initial weights.

    .venv/bin/python benchmarks/bench_training.py [--suite small|real] [--steps N]
                                                  [--models a,b] [--threads 1,2] [--cache DIR]

`small` (the default): at batch 32 with Adam and softmax cross-entropy, on 1 thread each
and on default threads, the median step time of edgeflow and of PyTorch (the peer;
optional, from the `zoo` extra), interleaved, as steps per second and their ratio. Models:
the digits CNN of tests/graph/test_digits_training.py (benchmarks/harness.py) and an MLP
64-128-64-10.

`real` (needs the `zoo` extra): torchvision's ResNet-18 and MobileNetV2 at 224x224, batch
8, 1000 classes, exported as benchmarks/bench_models.py does (same cache) and converted
with `convert(trainable=True, optimizer="adam:0.001")` (the CLI's `convert --trainable
--optimizer adam:0.001`); the peer is the same torchvision model, its BatchNorms folded
into the convolutions as the export folds them (torch.fx's fuse) and in eval mode (no
dropout: the export has none), trained with torch.optim.Adam(lr=0.001) on cross-entropy.
Per thread count (edgeflow's num_threads, torch.set_num_threads): the first step
(edgeflow's includes making its plan), the median step time of interleaved steps, their
ratio, and memory: each contender runs again alone in a child process (warm-up step, then
--mem-steps steps), which reports its peak RSS (/proc's VmHWM, the process's high water
mark) and that peak less its RSS just before the first step (psutil): the memory the
steps themselves take.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

import edgeflow as ef
import harness

LEARNING_RATE = 0.01


def build_mlp(path):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.dense(ef.layers.flatten(image), 128, activation=ef.nn.relu, name="fc1")
        h = ef.layers.dense(h, 64, activation=ef.nn.relu, name="fc2")
        logits = ef.layers.dense(h, 10, name="fc3")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(LEARNING_RATE).minimize(loss)
    ef.save(g, path, signatures={"train": ({"image": image, "label": label}, {"loss": loss}, [step])})


def torch_model(kind, weights):
    import torch
    from torch import nn
    if kind == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(32 * 2 * 2, 10))
        pairs = [("conv1", 0), ("conv2", 3), ("logits", 7)]
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                              nn.Linear(64, 10))
        pairs = [("fc1", 1), ("fc2", 3), ("fc3", 5)]
    with torch.no_grad():
        for name, k in pairs:
            w = weights[f"{name}/kernel"]
            model[k].weight.copy_(torch.from_numpy(w if w.ndim == 4 else w.T))
            model[k].bias.copy_(torch.from_numpy(weights[f"{name}/bias"]))
    return model


def torch_step(kind, path, x, y, threads):
    """One PyTorch training step of the model at `path`'s initial weights on `threads`
    threads, as a callable."""
    import torch
    torch.set_num_threads(threads)
    return _adam_step(torch_model(kind, ef.Interpreter(path).variables()), x, y, LEARNING_RATE)


def _adam_step(model, x, y, lr):
    """A callable making one Adam step of torch `model` on softmax cross-entropy of (x, y)."""
    import torch
    opt = torch.optim.Adam(model.parameters(), lr)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(tx), ty).backward()
        opt.step()
    return step


# -- real-size models ---------------------------------------------------------------------------
REAL = ("resnet18", "mobilenet_v2")
REAL_BATCH, REAL_CLASSES, REAL_LR = 8, 1000, 0.001


def _bench_models():
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import bench_models
    return bench_models


def real_data(batch=REAL_BATCH, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, 3, 224, 224)).astype(np.float32),
            rng.integers(0, REAL_CLASSES, batch).astype(np.int64))


def convert_trainable(name, cache, efl):
    """Export (cached) and convert `name` with a train signature (Adam, lr 0.001)."""
    from edgeflow.converters import onnx as onnx_converter
    onnx_path, _ = _bench_models().real_model(name, cache)
    onnx_converter.convert(onnx_path, efl, trainable=True, optimizer=f"adam:{REAL_LR}")


def edgeflow_real_step(efl, threads, x, y):
    runner = ef.Interpreter(efl, num_threads=threads).get_signature_runner("train")
    return lambda: runner(image=x, labels=y)


def torch_real_step(name, threads, x, y):
    """A train step of torchvision's `name` as exported (BatchNorm folded, no dropout)."""
    import torch
    from torch.fx.experimental.optimization import fuse
    torch.set_num_threads(threads)
    model = fuse(_bench_models().BUILDERS[name]().module.eval())  # the exported weights
    model.eval()
    return _adam_step(model, x, y, REAL_LR)


def peak_rss():
    """This process's peak RSS in bytes: /proc's VmHWM (of this program alone), else getrusage's
    ru_maxrss (which on Linux also counts the parent's RSS it was forked with)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def child(args):
    """Run one contender's steps alone; print its memory as JSON (see the module doc)."""
    import psutil
    x, y = real_data()
    if args.child == "edgeflow":
        step = edgeflow_real_step(args.efl, args.threads, x, y)
    else:
        step = torch_real_step(args.model, args.threads, x, y)
    before = psutil.Process().memory_info().rss
    for _ in range(1 + args.mem_steps):
        step()
    peak = peak_rss()
    print(json.dumps({"peak": peak, "steps": peak - before}))


def memory(contender, name, efl, threads, steps):
    cmd = [sys.executable, __file__, "--child", contender, "--model", name, "--efl", str(efl),
           "--threads", str(threads), "--mem-steps", str(steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=harness.blas_env(threads))
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_real(names, threads_list, steps, mem_steps, cache):
    import torch
    x, y = real_data()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            efl = pathlib.Path(tmp) / f"{name}-train.efl"
            start = time.perf_counter()
            convert_trainable(name, cache, efl)
            harness.log(f"{name}: converted (trainable) in {time.perf_counter() - start:.1f} s")
            for threads in threads_list:
                contenders = {"edgeflow": edgeflow_real_step(efl, threads, x, y),
                              "torch": torch_real_step(name, threads, x, y)}
                first = {}
                for k, fn in contenders.items():
                    start = time.perf_counter()
                    fn()
                    first[k] = time.perf_counter() - start
                torch.set_num_threads(threads)
                t = harness.medians(contenders, steps, warmup=1)
                mem = {k: memory(k, name, efl, threads, mem_steps) for k in contenders}
                mib = {k: (f"{m['peak'] / 2**20:,.0f}", f"{m['steps'] / 2**20:,.0f}") for k, m in mem.items()}
                rows.append([name, threads, harness.ms(first["edgeflow"], 0), harness.ms(first["torch"], 0),
                             harness.ms(t["edgeflow"], 0), harness.ms(t["torch"], 0),
                             harness.ratio(t["edgeflow"], t["torch"]), *mib["edgeflow"], *mib["torch"],
                             harness.ratio(mem["edgeflow"]["peak"], mem["torch"]["peak"])])
                harness.log("  " + "  ".join(str(c) for c in rows[-1]))
    print(f"\nbatch {REAL_BATCH}, 224x224, Adam lr {REAL_LR}; medians of {steps} interleaved steps; memory in "
          f"MiB from child processes ({mem_steps} steps after one warm-up)")
    harness.print_table(["model", "threads", "edgeflow 1st ms", "torch 1st ms", "edgeflow ms/step", "torch ms/step",
                         "ratio", "edgeflow peak", "(steps)", "torch peak", "(steps)", "peak ratio"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("small", "real"), default="small",
                        help="the digits CNN and an MLP, or ResNet-18 and MobileNetV2 (default small)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps of each contender (default 100 small, 5 real)")
    parser.add_argument("--models", default=",".join(REAL), help=f"real suite: of {','.join(REAL)}")
    parser.add_argument("--threads", default="1,2", help="real suite: thread counts (default 1,2)")
    parser.add_argument("--mem-steps", type=int, default=2, help="real suite: steps of each memory child")
    parser.add_argument("--cache", default=None, help="real suite: folder of exported ONNX files "
                        "(default bench_models.py's)")
    parser.add_argument("--child", choices=("edgeflow", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--efl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.threads = int(args.threads)
        return child(args)
    if args.suite == "real":
        names = [m for m in args.models.split(",") if m]
        if set(names) - set(REAL):
            parser.error(f"unknown model(s) {sorted(set(names) - set(REAL))}: of {','.join(REAL)}")
        cache = pathlib.Path(args.cache) if args.cache else _bench_models().default_cache()
        return bench_real(names, [int(t) for t in args.threads.split(",") if t], args.steps or 5,
                          args.mem_steps, cache)
    args.steps = args.steps or 100
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 32)
    try:
        import torch
        torch_threads = {1: 1, None: torch.get_num_threads()}
    except ImportError:
        torch_threads = None
        print("torch not installed: edgeflow rows only")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, build in (("cnn", harness.digits_cnn), ("mlp", build_mlp)):
            path = pathlib.Path(tmp) / f"{kind}.efl"
            build(path)
            for threads in (1, None):
                runner = ef.Interpreter(path, num_threads=threads).get_signature_runner("train")
                contenders = {"edgeflow": lambda: runner(image=x, label=y)}
                if torch_threads:
                    contenders["torch"] = torch_step(kind, path, x, y, torch_threads[threads])
                t = harness.medians(contenders, args.steps, warmup=5)
                rows.append([kind, threads or "default", f"{1 / t['edgeflow']:.1f}",
                             f"{1 / t['torch']:.1f}" if torch_threads else "-",
                             harness.ratio(t["edgeflow"], t.get("torch"))])
    print(f"batch 32, medians of {args.steps} interleaved steps")
    harness.print_table(["model", "threads", "edgeflow steps/s", "torch steps/s", "edgeflow time / torch time"],
                        rows)


if __name__ == "__main__":
    main()
