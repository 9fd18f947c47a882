"""Training steps per second: edgeflow's interpreter (the packaged `train` signature)
against PyTorch CPU on the same model and initial weights.

    .venv/bin/python benchmarks/bench_training.py [--steps N]

Measured, at batch 32 with Adam and softmax cross-entropy, on 1 thread each and on
default threads: the median step time of edgeflow and of PyTorch (the peer; optional,
from the `zoo` extra), interleaved, as steps per second and their ratio. Models: the
digits CNN of tests/graph/test_digits_training.py (benchmarks/harness.py) and an MLP
64-128-64-10.
"""
import argparse
import pathlib
import tempfile

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
    model = torch_model(kind, ef.Interpreter(path).variables())
    opt = torch.optim.Adam(model.parameters(), LEARNING_RATE)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(tx), ty).backward()
        opt.step()
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps of each contender (default 100)")
    args = parser.parse_args()
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
