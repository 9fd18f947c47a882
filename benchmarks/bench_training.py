"""Training steps per second: edgeflow's interpreter (the packaged `train` signature)
vs PyTorch CPU on the same model, batch 32, side by side in one run.

Models: the digits CNN of tests/graph/test_digits_training.py (conv 1->16, pool, conv
16->32, pool, dense 10) and an MLP 64-128-64-10, both trained with Adam and softmax
cross-entropy. PyTorch gets the same initial weights. Thread counts: 1 thread each, and
default threads. Prints medians and the ratio; PyTorch is optional (torch==2.13.0
installs from this machine's disk).

    .venv/bin/python benchmarks/bench_training.py [--steps N]
"""
import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import edgeflow as ef  # noqa: E402


def build(kind, path):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        if kind == "cnn":
            h = ef.layers.conv2d(image, 16, 3, padding="same", activation=ef.nn.relu, name="conv1")
            h = ef.layers.max_pool2d(h, 2, 2)
            h = ef.layers.conv2d(h, 32, 3, padding="same", activation=ef.nn.relu, name="conv2")
            h = ef.layers.max_pool2d(h, 2, 2)
            logits = ef.layers.dense(ef.layers.flatten(h), 10, name="fc")
        else:
            h = ef.layers.flatten(image)
            h = ef.layers.dense(h, 128, activation=ef.nn.relu, name="fc1")
            h = ef.layers.dense(h, 64, activation=ef.nn.relu, name="fc2")
            logits = ef.layers.dense(h, 10, name="fc3")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(0.001).minimize(loss)
    ef.save(g, path, signatures={"train": ({"image": image, "label": label}, {"loss": loss}, [step])})


def torch_model(kind, weights):
    import torch
    from torch import nn
    if kind == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(32 * 2 * 2, 10))
        pairs = [("conv1", 0), ("conv2", 3), ("fc", 7)]
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


def median_rate(step, n):
    for _ in range(5):
        step()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1 / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 32)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not installed: edgeflow rows only")
    print(f"{'model':6} {'threads':>8} {'edgeflow steps/s':>17} {'torch steps/s':>14} "
          f"{'edgeflow time / torch time':>27}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("cnn", "mlp"):
            path = pathlib.Path(tmp) / f"{kind}.efl"
            build(kind, path)
            for threads in (1, None):
                interp = ef.Interpreter(path, num_threads=threads)
                runner = interp.get_signature_runner("train")
                ours = median_rate(lambda: runner(image=x, label=y), args.steps)
                theirs = float("nan")
                if torch is not None:
                    torch.set_num_threads(threads or torch.get_num_threads())
                    model = torch_model(kind, ef.Interpreter(path).variables())
                    opt = torch.optim.Adam(model.parameters(), 0.001)
                    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

                    def torch_step():
                        opt.zero_grad()
                        torch.nn.functional.cross_entropy(model(tx), ty).backward()
                        opt.step()
                    theirs = median_rate(torch_step, args.steps)
                print(f"{kind:6} {threads or 'default':>8} {ours:17.1f} {theirs:14.1f} "
                      f"{theirs / ours:26.2f}x")


if __name__ == "__main__":
    main()
