"""`edgeflow quickstart`: build a small model, package it, inspect it and run it."""
import os
import tempfile

import numpy as np


def _step(n, text):
    print(f"\n[{n}] {text}")


def build_classifier(path, seed=0):
    """A 2-layer MLP classifier (16 -> 32 -> 4) with softmax, saved to `path`."""
    import edgeflow as ef
    rng = np.random.default_rng(seed)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        w1 = ef.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.25, name="w1")
        b1 = ef.constant(np.zeros(32, np.float32), name="b1")
        w2 = ef.constant(rng.standard_normal((32, 4)).astype(np.float32) * 0.25, name="w2")
        h = ef.nn.relu(x @ w1 + b1, name="hidden")
        logits = ef.matmul(h, w2, name="logits")
        probs = ef.nn.softmax(logits, name="probs")
        label = ef.argmax(probs, axis=1, name="label")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"probs": probs, "label": label})},
            description="quickstart MLP classifier")
    return {"w1": w1.node.attrs["value"], "b1": b1.node.attrs["value"], "w2": w2.node.attrs["value"]}


def main(directory=None):
    import edgeflow as ef
    from .summary import describe, render

    with tempfile.TemporaryDirectory() as tmp:
        directory = directory or tmp
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "quickstart.efl")

        _step(1, "Build a graph with the TensorFlow-style API and package it")
        weights = build_classifier(path)
        print(f"  wrote {path} ({os.path.getsize(path):,} bytes)")

        _step(2, "Inspect the package")
        print("\n".join("  " + line for line in render(describe(path)).splitlines()))

        _step(3, "Run the 'infer' signature on a dynamic batch of 5")
        x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
        runner = ef.Interpreter(path).get_signature_runner("infer")
        out = runner(x=x)
        h = np.maximum(x @ weights["w1"] + weights["b1"], 0) @ weights["w2"]
        ref = np.exp(h - h.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        err = float(np.abs(out["probs"] - ref).max())
        print(f"  probs {out['probs'].shape}, labels {out['label'].tolist()}")
        print(f"  max |edgeflow - numpy| = {err:.2e}")
        if err > 1e-5:
            raise SystemExit(f"quickstart: result differs from numpy by {err}")

        _step(4, "Benchmark it")
        from .bench import bench_model
        r = bench_model(path, runs=200)
        print(f"  {r['ops']} ops: p50 {r['p50_us']:.1f} us per run, arena {r['arena_bytes']:,} bytes")
    print("\nquickstart finished: built, packaged, inspected, ran and benchmarked a model.")
