"""Arena bytes against the lower bound (the most bytes alive at any one op).

    .venv/bin/python benchmarks/bench_arena.py

Measured: the interpreter's arena for an MLP (batch 64, 784-1024-512-256-10) and a wide
branching graph (8 parallel branches merged per block), against the bound and against
the same graph planned with no reuse (every tensor its own bytes, as
preserve_all_tensors=True gives). Goal: within 1.1x of the bound. No timing.
"""
import argparse

import numpy as np

import edgeflow as ef
from edgeflow.format import writer


def mlp(rng, batch=64, sizes=(784, 1024, 512, 256, 10)):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, sizes[0]], name="x")
        h = x
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            w = ef.constant(rng.standard_normal((a, b)).astype(np.float32) * 0.05)
            h = h @ w + ef.constant(np.zeros(b, np.float32))
            h = ef.nn.relu(h) if i < len(sizes) - 2 else ef.nn.softmax(h, name="probs")
    return g, {"infer": ({"x": x}, {"probs": h})}, {"x": (batch, sizes[0])}


def branchy(rng, batch=64, width=8, depth=6, features=256):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, features], name="x")
        h = x
        for _ in range(depth):
            outs = []
            for _ in range(width):
                w = ef.constant(rng.standard_normal((features, features)).astype(np.float32) * 0.05)
                outs.append(ef.tanh(h @ w) * ef.sigmoid(h))
            h = ef.concat(outs, axis=1)
            w = ef.constant(rng.standard_normal((features * width, features)).astype(np.float32) * 0.02)
            h = ef.nn.relu(h @ w)
        y = ef.reduce_mean(h, axis=1, name="y")
    return g, {"infer": ({"x": x}, {"y": y})}, {"x": (batch, features)}


def measure(name, graph, sigs, shapes):
    data = writer.to_bytes(ef.to_model(graph, sigs))
    rows = []
    for preserve in (False, True):
        interp = ef.Interpreter(data, preserve_all_tensors=preserve)
        runner = interp.get_signature_runner("infer")
        runner(**{k: np.zeros(s, np.float32) for k, s in shapes.items()})
        rows.append(runner.last_plan)
    plan, flat = rows
    bound = plan.lower_bound
    print(f"{name:22} {len(plan.order):5} ops  arena {plan.arena.nbytes / 2**20:8.3f} MiB  "
          f"bound {bound / 2**20:8.3f} MiB  ratio {plan.arena.nbytes / bound:5.3f}x  "
          f"no reuse {flat.arena.nbytes / 2**20:8.3f} MiB ({flat.arena.nbytes / plan.arena.nbytes:5.2f}x)")
    return plan.arena.nbytes / bound


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rng = np.random.default_rng(0)
    ratios = [measure("MLP 784-1024-512-256", *mlp(rng)),
              measure("branching 8x6", *branchy(rng))]
    print(f"goal: within 1.1x of the bound -> {'met' if max(ratios) <= 1.1 else 'NOT met'}")


if __name__ == "__main__":
    main()
