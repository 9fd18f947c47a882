"""`convert --trainable`: an ONNX inference model becomes a package that trains on the device."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import ConversionError

import onnx
from onnx import numpy_helper

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"


def _mlp_weights():
    model = onnx.load(str(DATA / "mlp.onnx"))
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type == "Gemm":
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs.get("transB") == 1 and not attrs.get("transA")
            layers.append((node.input[1], node.input[2]))
    return inits, layers


def _numpy_sgd(inits, layers, batches, lr):
    """Softmax cross-entropy MLP (ReLU between Gemms) trained by SGD, backprop by hand."""
    params = {k: v.copy() for k, v in inits.items()}
    for x, y in batches:
        acts, h = [x], x
        for k, (w, b) in enumerate(layers):
            h = h @ params[w].T + params[b]
            if k < len(layers) - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        p = np.exp(h - h.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = (p - np.eye(p.shape[1])[y]) / len(x)
        grads = {}
        for k in reversed(range(len(layers))):
            w, b = layers[k]
            grads[w], grads[b] = d.T @ acts[k], d.sum(0)
            d = d @ params[w]
            if k > 0:
                d = d * (acts[k] > 0)
        for name, grad in grads.items():
            params[name] -= lr * grad
    return params


def test_trainable_mlp_matches_numpy_backprop(tmp_path):
    result = onnx_converter.convert(DATA / "mlp.onnx", tmp_path / "t.efl", trainable=True, optimizer="sgd:0.1")
    assert {s.key for s in result.model.signatures} == {"infer", "train", "save", "restore"}
    interp = ef.Interpreter(tmp_path / "t.efl")
    train = interp.get_signature_runner("train")
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((6, 64)).astype(np.float32), rng.integers(0, 10, 6)) for _ in range(3)]
    for x, y in batches:
        train(x=x, labels=y)
    inits, layers = _mlp_weights()
    expected = _numpy_sgd(inits, layers, [(x.astype(np.float64), y) for x, y in batches], 0.1)
    state = interp.variables()
    for name in [n for pair in layers for n in pair]:
        np.testing.assert_allclose(state[name], expected[name], rtol=1e-4, atol=1e-5)


def test_freeze_and_errors(tmp_path):
    inits, layers = _mlp_weights()
    frozen = layers[0][0]
    result = onnx_converter.convert(DATA / "mlp.onnx", trainable=True, freeze=[frozen], optimizer="adam:0.01")
    tensors = {t.name: t for t in result.model.subgraphs[0].tensors}
    assert not tensors[frozen].is_variable and tensors[layers[1][0]].is_variable
    with pytest.raises(ConversionError, match="no initializer named"):
        onnx_converter.convert(DATA / "mlp.onnx", trainable=True, freeze=["nope"])
    with pytest.raises(ConversionError, match="optimizer must be one of"):
        onnx_converter.convert(DATA / "mlp.onnx", trainable=True, optimizer="lbfgs:1")


def test_digits_cnn_fine_tunes_on_the_device(tmp_path):
    """The converted digits CNN trains on the device: its loss on the data falls, and its
    accuracy stays above 95%."""
    data = np.load(DATA / "digits_test.npz")
    x, y = data["X"], data["y"]
    r = subprocess.run([sys.executable, "-m", "edgeflow", "convert", str(DATA / "digits_cnn.onnx"), "-o",
                        str(tmp_path / "d.efl"), "--trainable", "--optimizer", "sgd:0.05"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "trainable" in r.stdout
    interp = ef.Interpreter(tmp_path / "d.efl")
    train, infer = interp.get_signature_runner("train"), interp.get_signature_runner("infer")

    def full_loss():
        logits = infer(image=x)["logits"].astype(np.float64)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        return float(-logp[np.arange(len(y)), y].mean())
    before = full_loss()
    for _ in range(3):
        for i in range(0, len(x), 32):
            train(image=x[i:i + 32], labels=y[i:i + 32])
    assert full_loss() < before
    assert float((infer(image=x)["logits"].argmax(1) == y).mean()) > 0.95
