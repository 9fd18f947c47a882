"""Build the small ONNX test models in tests/data/onnx/.

Regenerate with .venv/bin/python tests/data/make_models.py [--only NAME,...]; needs torch,
scikit-learn, and transformers for ``bert_mask`` (none of them a dependency of edgeflow, nor
needed by the tests: the tests read only the files written here, with numpy, onnx and
onnxruntime). The first six models were made with torch==2.13.0, the exporter-pattern
fixtures (``attention_mod``, ``bert_mask``, ``bigru``, ``qdq_cnn``) and the control-flow one
(``greedy_decoder``, a torch.jit.script'ed loop) with torch==2.14.1 and transformers 5.24.0; another torch writes other bytes (its version is in each file), so
``--only`` regenerates the models it names and leaves the others' files as they are (the
README still describes them all).

Every model is built with a fixed seed and exported with the TorchScript exporter
(``torch.onnx.export(..., dynamo=False, opset_version=17)``); ``qdq_cnn`` is then quantized
by onnxruntime's ``quantize_static`` and its outputs are onnxruntime's (graph optimizations
off) instead of PyTorch's. For each model ``<name>.onnx``
this writes ``<name>_io.npz``: example inputs and PyTorch's outputs for them. Its array
``cases`` lists the case names (``b1``, ``b8``, or ``b1_s5``... for sequence models); each
tensor is stored under ``"<case>.<tensor name>"`` with the graph's input and output names,
for example ``b8.image`` and ``b8.logits``. ``digits_test.npz`` holds the held-out split of
scikit-learn's digits data set (``X`` float32 [N, 1, 8, 8] in [0, 1], ``y`` int64 [N]) for
the digits CNN. Each exported model is checked with onnx.checker and against onnxruntime,
and tests/data/onnx/README.md is written from the ONNX graphs.
"""

from __future__ import annotations

import collections
import argparse
import io
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OUT = Path(__file__).resolve().parent / "onnx"
OPSET = 17
# Set to an int (e.g. 8) if onnxruntime rejects the IR version the exporter writes.
FORCE_IR_VERSION = None


# ---------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.net(x)


def conv_bn(cin, cout, k, stride=1, groups=1, act=nn.ReLU6):
    layers = [
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            conv_bn(cin, hidden, 1),  # 1x1 expand + BN + ReLU6
            conv_bn(hidden, hidden, 3, stride, groups=hidden),  # 3x3 depthwise + BN + ReLU6
            conv_bn(hidden, cout, 1, act=None),  # 1x1 project + BN (linear bottleneck)
        )

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV2Small(nn.Module):
    # (expand, out channels, stride) per inverted residual block
    CFG = [(1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 32, 2), (4, 32, 1), (4, 48, 2), (4, 48, 1)]

    def __init__(self, num_classes=10):
        super().__init__()
        layers = [conv_bn(3, 16, 3, 2)]
        cin = 16
        for t, c, s in self.CFG:
            layers.append(InvertedResidual(cin, c, s, t))
            cin = c
        layers.append(conv_bn(cin, 128, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + idt)


class ResNetSmall(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 7, 2, 3, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        self.layers = nn.Sequential(
            BasicBlock(16, 16, 1),  # identity skip
            BasicBlock(16, 32, 2),  # 1x1 s2 downsample skip
            BasicBlock(32, 64, 2),
            BasicBlock(64, 64, 1),
        )
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=16, hidden_size=32, num_layers=2, batch_first=True)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):  # x: [batch, seq, 16]
        out, _ = self.lstm(x)
        return self.fc(out[:, -1, :])


class EncoderLayer(nn.Module):
    """A pre-norm transformer encoder layer written out op by op (the same computation as
    nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0, activation="gelu",
    batch_first=True, norm_first=True)). nn.MultiheadAttention itself exports with the
    sequence length baked into its Reshapes, so it cannot serve a dynamic-length model."""

    def __init__(self, d_model, nhead, dim_feedforward):
        super().__init__()
        self.nhead, self.head_dim = nhead, d_model // nhead
        self.norm1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, dim_feedforward)
        self.act = nn.GELU()
        self.ff2 = nn.Linear(dim_feedforward, d_model)

    def _heads(self, t, b):  # [b, s, d] -> [b, h, s, hd]
        return t.reshape(b, -1, self.nhead, self.head_dim).transpose(1, 2)

    def forward(self, x):  # x: [batch, seq, d_model]
        b, d = x.shape[0], x.shape[2]
        h = self.norm1(x)
        q, k, v = self._heads(self.q(h), b), self._heads(self.k(h), b), self._heads(self.v(h), b)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = torch.matmul(torch.softmax(scores, dim=-1), v)  # [b, h, s, hd]
        x = x + self.out(att.transpose(1, 2).reshape(b, -1, d))
        return x + self.ff2(self.act(self.ff1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=100, d_model=64, max_len=64, num_classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model) * 0.1)
        self.layers = nn.Sequential(*[EncoderLayer(d_model, 4, 128) for _ in range(2)])
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):  # tokens: int64 [batch, seq]
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        x = self.layers(x)
        return self.head(x.mean(dim=1))


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------------------- helpers


def randomize_bn(model, gen):
    """Give every BatchNorm non-trivial statistics and affine parameters, so that folding
    them into the convolutions is actually tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=gen) * 0.8 + 0.6)
                m.weight.copy_(torch.rand(n, generator=gen) * 0.8 + 0.6)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)


def export(model, name, example, input_names, output_names, dynamic_axes, constant_folding=True, grad=False):
    """Export to OUT/<name>.onnx. grad=True exports with gradients on: nn.TransformerEncoderLayer
    takes its fused fast path (which does not export) only without them."""
    model.eval()
    path = OUT / f"{name}.onnx"
    buf = io.BytesIO()
    with torch.set_grad_enabled(grad):
        torch.onnx.export(
            model, example, buf, dynamo=False, opset_version=OPSET,
            input_names=input_names, output_names=output_names,
            dynamic_axes=dynamic_axes, do_constant_folding=constant_folding,
        )
    m = onnx.load_from_string(buf.getvalue())
    if FORCE_IR_VERSION is not None:
        m.ir_version = FORCE_IR_VERSION
    m.doc_string = f"edgeflow test model '{name}', made by tests/data/make_models.py"
    onnx.save(m, path)
    return path


def check(path, model, cases, input_names, output_names):
    """onnx.checker, then onnxruntime against PyTorch on every case; write <name>_io.npz."""
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    arrays = {"cases": np.array(list(cases))}
    worst = 0.0
    for case, inputs in cases.items():
        with torch.no_grad():
            outs = model(*[torch.from_numpy(a) for a in inputs])
        outs = outs if isinstance(outs, tuple) else (outs,)
        outs = [o.numpy() for o in outs]
        got = sess.run(output_names, dict(zip(input_names, inputs)))
        for want, have in zip(outs, got):
            assert want.shape == have.shape, (case, want.shape, have.shape)
            worst = max(worst, float(np.max(np.abs(want - have))))
        for n, a in zip(input_names, inputs):
            arrays[f"{case}.{n}"] = a
        for n, a in zip(output_names, outs):
            arrays[f"{case}.{n}"] = a
    np.savez(OUT / f"{path.stem}_io.npz", **arrays)
    print(f"{path.name:20s} ir={m.ir_version} {os.path.getsize(path)/1024:7.1f} KiB  "
          f"max |torch - onnxruntime| = {worst:.3g}  cases={list(cases)}")
    assert worst < 1e-4, f"{path.name}: onnxruntime differs from torch by {worst}"
    return worst


def rng_inputs(seed, *shapes, dtype=np.float32):
    g = np.random.default_rng(seed)
    return [g.standard_normal(s).astype(dtype) for s in shapes]


# ---------------------------------------------------------------------------- builders


def build_mlp():
    torch.manual_seed(1)
    model = MLP().eval()
    ins, outs = ["x"], ["logits"]
    path = export(model, "mlp", (torch.randn(1, 64),), ins, outs,
                  {"x": {0: "batch"}, "logits": {0: "batch"}})
    cases = {f"b{b}": rng_inputs(100 + b, (b, 64)) for b in (1, 8)}
    return path, model, cases, ins, outs


def build_mobilenetv2():
    torch.manual_seed(2)
    model = MobileNetV2Small()
    randomize_bn(model, torch.Generator().manual_seed(20))
    model.eval()
    ins, outs = ["image"], ["logits"]
    path = export(model, "mobilenetv2", (torch.randn(1, 3, 64, 64),), ins, outs,
                  {"image": {0: "batch"}, "logits": {0: "batch"}}, constant_folding=False)
    cases = {f"b{b}": rng_inputs(200 + b, (b, 3, 64, 64)) for b in (1, 8)}
    return path, model, cases, ins, outs


def build_resnet():
    torch.manual_seed(3)
    model = ResNetSmall()
    randomize_bn(model, torch.Generator().manual_seed(30))
    model.eval()
    ins, outs = ["image"], ["logits"]
    path = export(model, "resnet", (torch.randn(1, 3, 64, 64),), ins, outs,
                  {"image": {0: "batch"}, "logits": {0: "batch"}}, constant_folding=True)
    cases = {f"b{b}": rng_inputs(300 + b, (b, 3, 64, 64)) for b in (1, 8)}
    return path, model, cases, ins, outs


def build_lstm():
    torch.manual_seed(4)
    model = LSTMHead().eval()
    ins, outs = ["sequence"], ["logits"]
    path = export(model, "lstm", (torch.randn(2, 7, 16),), ins, outs,
                  {"sequence": {0: "batch", 1: "seq"}, "logits": {0: "batch"}})
    cases = {}
    for b in (1, 8):
        for s in (5, 12):
            cases[f"b{b}_s{s}"] = rng_inputs(400 + 10 * b + s, (b, s, 16))
    return path, model, cases, ins, outs


def build_transformer():
    torch.manual_seed(5)
    model = TinyTransformer().eval()
    with torch.no_grad():  # non-trivial LayerNorm scale and shift, so they are tested too
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(torch.randn_like(m.weight) * 0.2)
                m.bias.add_(torch.randn_like(m.bias) * 0.1)
    ins, outs = ["tokens"], ["logits"]
    path = export(model, "transformer", (torch.randint(0, 100, (2, 7)),), ins, outs,
                  {"tokens": {0: "batch", 1: "seq"}, "logits": {0: "batch"}})
    cases = {}
    for b in (1, 8):
        for s in (6, 16):
            g = np.random.default_rng(500 + 10 * b + s)
            cases[f"b{b}_s{s}"] = [g.integers(0, 100, (b, s), dtype=np.int64)]
    return path, model, cases, ins, outs


DIGITS_TRAIN = 1400  # a fixed shuffle of the 1797 samples: 1400 train, the remaining 397 test


def build_digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    X = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    y = d.target.astype(np.int64)
    # The data set is ordered by writer, and its tail is written by people absent from its
    # head: a plain head/tail split tests generalisation to new writers (~93% here), so the
    # split is a shuffle with a fixed seed instead. `index` keeps the samples' positions.
    order = np.random.default_rng(0).permutation(len(X))
    tr, te = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
    np.savez(OUT / "digits_test.npz", X=Xte, y=yte, index=te.astype(np.int64))

    torch.manual_seed(6)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(60)
    Xt, yt = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    for epoch in range(15):
        model.train()
        perm = torch.randperm(len(Xt), generator=g)
        for i in range(0, len(Xt), 32):
            idx = perm[i : i + 32]
            loss = nn.functional.cross_entropy(model(Xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean())
    print(f"digits CNN: test accuracy {acc:.4f} on {len(yte)} held-out samples")
    assert acc > 0.95, acc

    ins, outs = ["image"], ["logits"]
    path = export(model, "digits_cnn", (torch.from_numpy(Xte[:1]),), ins, outs,
                  {"image": {0: "batch"}, "logits": {0: "batch"}})
    cases = {"b1": [Xte[:1].copy()], "b8": [Xte[1:9].copy()]}
    return path, model, cases, ins, outs, acc


# ------------------------------------------------------- exporter patterns (torch 2.14.1)


def build_attention_mod():
    """nn.TransformerEncoder (its nn.MultiheadAttention inside): the TorchScript exporter
    checks the head size with Mod on two Constants. The sequence length is baked into the
    attention's Reshapes (onnxruntime fails on another), so only the batch is dynamic."""
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    ins, outs = ["x"], ["y"]
    path = export(model, "attention_mod", (torch.randn(2, 5, 16),), ins, outs,
                  {"x": {0: "batch"}, "y": {0: "batch"}}, grad=True)
    cases = {f"b{b}": rng_inputs(700 + b, (b, 5, 16)) for b in (1, 8)}
    return path, model, cases, ins, outs


class BertHidden(nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build_bert_mask():
    """A tiny Hugging Face BertModel (random weights): its attention mask becomes And, IsNaN,
    GatherElements, Where... in the TorchScript export."""
    import transformers

    torch.manual_seed(8)
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    model = BertHidden(transformers.BertModel(config)).eval()
    ins, outs = ["input_ids", "attention_mask"], ["last_hidden_state"]
    example = (torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.int64))
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "last_hidden_state": {0: "batch", 1: "seq"}}
    path = export(model, "bert_mask", example, ins, outs, dyn)
    cases = {}
    for b, s in ((1, 8), (8, 12)):
        g = np.random.default_rng(800 + 10 * b + s)
        mask = np.ones((b, s), dtype=np.int64)
        for row in range(1, b):  # row 0 unpadded, the others padded at the end by 1 to s - 2 tokens
            mask[row, s - 1 - (row - 1) % (s - 2):] = 0
        cases[f"b{b}_s{s}"] = [g.integers(0, 100, (b, s), dtype=np.int64), mask]
    return path, model, cases, ins, outs


class BiGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):  # x: [batch, 6, 8]
        out, _ = self.gru(x)
        return self.fc(out[:, -1])


def build_bigru():
    """A bidirectional GRU with a dynamic batch: the exporter joins the two directions with
    Reshape(y, [0, 0, -1]) while the batch dimension is unknown."""
    torch.manual_seed(9)
    model = BiGRU().eval()
    ins, outs = ["x"], ["logits"]
    path = export(model, "bigru", (torch.randn(3, 6, 8),), ins, outs, {"x": {0: "batch"}, "logits": {0: "batch"}})
    cases = {f"b{b}": rng_inputs(900 + b, (b, 6, 8)) for b in (1, 8)}
    return path, model, cases, ins, outs


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def build_qdq_cnn():
    """A small CNN quantized by onnxruntime's quantize_static: QDQ, int8 per-channel weights,
    uint8 activations, calibrated on 16 random images. Returns what check_qdq needs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    torch.manual_seed(10)
    model = SmallCNN().eval()
    ins, outs = ["image"], ["logits"]
    with tempfile.TemporaryDirectory() as tmp:
        global OUT
        real, OUT = OUT, Path(tmp)
        try:
            fp32 = export(model, "qdq_cnn_fp32", (torch.randn(1, 3, 16, 16),), ins, outs,
                          {"image": {0: "batch"}, "logits": {0: "batch"}})
        finally:
            OUT = real
        calibration = rng_inputs(1000, (16, 3, 16, 16))[0]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter([{"image": calibration[i:i + 1]} for i in range(len(calibration))])

            def get_next(self):
                return next(self.batches, None)

        path = OUT / "qdq_cnn.onnx"
        quantize_static(str(fp32), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    m = onnx.load(path)
    m.doc_string = "edgeflow test model 'qdq_cnn', made by tests/data/make_models.py"
    onnx.save(m, path)
    cases = {f"b{b}": rng_inputs(1000 + b, (b, 3, 16, 16)) for b in (1, 8)}
    return path, model, cases, ins, outs


class GreedyDecoder(nn.Module):
    """nn.Embedding + nn.GRUCell + Linear decoding greedily from a start token until the end
    token or max_len tokens: a `for` loop with `break`, compiled by torch.jit.script. The
    cell's step is written out with the GRUCell's weights (r, z, n gates as nn.GRUCell
    computes them): the scripted nn.GRUCell itself does not export (its input-rank checks
    and gate chunks of unknown size inside the loop)."""

    def __init__(self, vocab: int = 12, hidden: int = 16, end: int = 6, max_len: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)
        self.hidden, self.end, self.max_len = hidden, end, max_len

    def gru(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        n = self.hidden
        gi = nn.functional.linear(x, self.cell.weight_ih, self.cell.bias_ih)
        gh = nn.functional.linear(h, self.cell.weight_hh, self.cell.bias_hh)
        r = torch.sigmoid(gi[:, :n] + gh[:, :n])
        z = torch.sigmoid(gi[:, n:2 * n] + gh[:, n:2 * n])
        c = torch.tanh(gi[:, 2 * n:] + r * gh[:, 2 * n:])
        return (1 - z) * c + z * h

    def forward(self, h: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.zeros([0], dtype=torch.long)
        for _ in range(self.max_len):
            h = self.gru(self.embed(token), h)
            token = self.out(h).argmax(dim=1)
            tokens = torch.cat([tokens, token])
            if bool(token[0] == self.end):
                break
        return tokens, h


def build_greedy_decoder():
    """The TorchScript exporter writes the scripted loop as one Loop (its condition: the
    iteration count and the end-token test) carrying the tokens, which grow each step."""
    torch.manual_seed(13)
    eager = GreedyDecoder().eval()
    x, h = torch.randn(1, 16), torch.randn(1, 16)
    with torch.no_grad():
        assert torch.allclose(eager.gru(x, h), eager.cell(x, h), atol=1e-6), "the written-out cell is not GRUCell's"
    model = torch.jit.script(eager)
    ins, outs = ["h0", "start"], ["tokens", "h"]
    path = export(model, "greedy_decoder", (torch.zeros(1, 16), torch.tensor([3])), ins, outs,
                  {"tokens": {0: "length"}})
    g = np.random.default_rng(1300)
    cases = {f"start{s}": [g.standard_normal((1, 16)).astype(np.float32), np.array([s], np.int64)] for s in range(12)}
    with torch.no_grad():
        lengths = {len(model(*[torch.from_numpy(a) for a in inputs])[0]) for inputs in cases.values()}
    assert min(lengths) < eager.max_len and eager.max_len in lengths, lengths  # early stops and full runs
    return path, model, cases, ins, outs


def check_qdq(path, model, cases, input_names, output_names):
    """onnx.checker; onnxruntime (graph optimizations off: the nodes as written) on every case,
    within a few quantization steps of PyTorch's float model; write <name>_io.npz with
    onnxruntime's outputs."""
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    arrays = {"cases": np.array(list(cases))}
    worst = 0.0
    for case, inputs in cases.items():
        with torch.no_grad():
            want = model(*[torch.from_numpy(a) for a in inputs]).numpy()
        got = sess.run(output_names, dict(zip(input_names, inputs)))
        worst = max(worst, float(np.max(np.abs(want - got[0])) / np.max(np.abs(want))))
        for n, a in zip(input_names, inputs):
            arrays[f"{case}.{n}"] = a
        for n, a in zip(output_names, got):
            arrays[f"{case}.{n}"] = a
    np.savez(OUT / f"{path.stem}_io.npz", **arrays)
    print(f"{path.name:20s} ir={m.ir_version} {os.path.getsize(path)/1024:7.1f} KiB  "
          f"max |torch float - onnxruntime int8| / max |torch| = {worst:.3g}  cases={list(cases)}")
    assert worst < 0.1, f"{path.name}: the quantized model is far from the float one ({worst})"
    return worst


# ---------------------------------------------------------------------------- README


def _shape(vi):
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        dims.append(d.dim_param if d.HasField("dim_param") else str(d.dim_value))
    dt = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return f"`{vi.name}` {dt} [{', '.join(dims)}]"


def describe(path, model):
    m = onnx.load(path)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    ops_s = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    params = sum(p.numel() for p in model.parameters())
    init_vals = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    return {
        "file": path.name,
        "ops": ops_s,
        "nodes": len(m.graph.node),
        "params": params,
        "init": init_vals,
        "size": os.path.getsize(path),
        "inputs": "<br>".join(_shape(v) for v in m.graph.input),
        "outputs": "<br>".join(_shape(v) for v in m.graph.output),
        "ir": m.ir_version,
    }


def write_readme(rows, acc, n_test):
    total = sum(r["size"] for r in rows)
    lines = [
        "# ONNX test models",
        "",
        "Generated by `tests/data/make_models.py` (regenerate with",
        "`.venv/bin/python tests/data/make_models.py [--only NAME,...]`; needs torch, scikit-learn",
        "and transformers, which the tests themselves do not: torch==2.13.0 made the first six",
        "models, torch==2.14.1 with transformers 5.24.0 the exporter-pattern fixtures from",
        "`attention_mod` on). Do not edit by hand: this file is written by that script.",
        "",
        f"All models: TorchScript exporter (`dynamo=False`; `qdq_cnn` then quantized by onnxruntime), "
        f"opset {OPSET}, IR version "
        f"{', '.join(sorted({str(r['ir']) for r in rows}))}, fixed seeds, eval mode. "
        f"Total size {total / 1024:.0f} KiB.",
        "",
        "| file | ops (type count) | nodes | parameters | size | inputs | outputs |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['file']}` | {r['ops']} | {r['nodes']} | {r['params']:,} | "
            f"{r['size'] / 1024:.1f} KiB | {r['inputs']} | {r['outputs']} |"
        )
    lines += [
        "",
        "Parameters are PyTorch's trainable parameters (BatchNorm running statistics not counted).",
        "",
        "## Notes per model",
        "",
        "- `mlp.onnx`: Linear 64 -> 128 -> 64 -> 10 with ReLU.",
        "- `mobilenetv2.onnx`: MobileNetV2-style: stem conv 3x3 s2 + BN + ReLU6 (exported as `Clip`),",
        "  7 inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear project, each with BN;",
        "  residual `Add` where stride 1 and channels match), 1x1 conv to 128, global average pool,",
        "  flatten, linear. Exported with `do_constant_folding=False`, so every",
        "  `BatchNormalization` stays in the graph (with non-trivial statistics) for the converter",
        "  to fold.",
        "- `resnet.onnx`: ResNet-style: stem conv 7x7 s2 + BN + ReLU + maxpool 3x3 s2, 4 basic",
        "  blocks (16 identity, 16->32 s2 and 32->64 s2 with 1x1-s2 conv + BN downsample, 64",
        "  identity), global average pool, fc. Constant folding on: the exporter has folded the BNs",
        "  into the convolutions.",
        "- `lstm.onnx`: 2-layer `nn.LSTM(16, 32, batch_first=True)` + Linear(32, 5) on the last time",
        "  step; dynamic batch and sequence length.",
        "- `transformer.onnx`: `nn.Embedding(100, 64)` + learned positional embedding sliced to the",
        "  sequence length, 2 pre-norm encoder layers (d_model 64, 4 heads, feed-forward 128, GELU,",
        "  no dropout) written out op by op: LayerNorm, q/k/v Linear, Reshape/Transpose to heads,",
        "  MatMul, scale, Softmax, MatMul, out Linear, residual Add, LayerNorm, Linear, GELU (as Erf),",
        "  Linear, residual Add; mean over tokens, Linear(64, 4). Input int64 token ids",
        "  [batch, seq]; dynamic batch and sequence length. (nn.TransformerEncoderLayer's fused fast",
        "  path does not export, and nn.MultiheadAttention exports with the sequence length baked",
        "  into its Reshapes, hence the explicit layer.)",
        f"- `digits_cnn.onnx`: conv 1->16 3x3 + ReLU + maxpool, conv 16->32 3x3 + ReLU + maxpool,",
        f"  fc 128->10, trained on {DIGITS_TRAIN} samples of scikit-learn's digits (a fixed shuffle,",
        f"  `numpy.random.default_rng(0).permutation(1797)`). Test accuracy in PyTorch: {acc:.4f} on",
        f"  the {n_test} held-out samples in `digits_test.npz` (`X` float32 [N, 1, 8, 8] scaled to",
        "  [0, 1], `y` int64 [N], `index` int64 [N]: the samples' positions in `load_digits()`).",
        "",
        "## Exporter patterns",
        "",
        "Each of these holds a pattern torch's exporter writes for real models, which edgeflow once",
        "failed to convert; tests/conversion/test_exporter_patterns.py checks that the pattern is",
        "there and that edgeflow matches onnxruntime and the recorded outputs.",
        "",
        "- `attention_mod.onnx`: `nn.TransformerEncoder` of one `nn.TransformerEncoderLayer(16, 2, 32,",
        "  dropout=0, batch_first=True)`, exported with gradients on (without them PyTorch takes the",
        "  fused fast path, which does not export). Its `nn.MultiheadAttention` checks the head size",
        "  with a `Mod` on two `Constant`s. Dynamic batch; sequence length 5 (the exporter bakes it",
        "  into the attention's Reshapes).",
        "- `bert_mask.onnx`: Hugging Face `BertModel` (transformers 5.24.0, random weights: vocabulary",
        "  100, hidden 16, 1 layer, 2 heads, intermediate 32), returning `last_hidden_state`. Its",
        "  attention mask is built with `And`, `IsNaN`, `GatherElements`, `Where`, and `Flatten` at",
        "  axis 2 of a 2-D tensor. Inputs int64 `input_ids` and `attention_mask` [batch, seq]; the",
        "  cases pad rows at the end by 1 to seq - 2 tokens (mask 0).",
        "- `bigru.onnx`: `nn.GRU(8, 16, batch_first=True, bidirectional=True)` + Linear(32, 5) on the",
        "  last step; dynamic batch, sequence length 6. The exporter joins the two directions with",
        "  `Reshape(y, [0, 0, -1])` while the batch is unknown.",
        "- `qdq_cnn.onnx`: conv 3->8 3x3 + ReLU, conv 8->16 3x3 s2 + ReLU, depthwise 3x3 + ReLU,",
        "  global average pool, Linear(16, 10) on [batch, 3, 16, 16], exported, then quantized by",
        "  `onnxruntime.quantization.quantize_static` (QDQ, int8 per-channel weights, uint8",
        "  activations, MinMax calibration on 16 random images): QuantizeLinear/DequantizeLinear",
        "  around every float op, int8 weights in initializers.",
        "",
        "## Control flow",
        "",
        "- `greedy_decoder.onnx` (torch==2.14.1): `nn.Embedding(12, 16)`, `nn.GRUCell(16, 16)` (its",
        "  step written out with the cell's weights: the scripted GRUCell does not export) and",
        "  `Linear(16, 12)` decoding greedily in a `torch.jit.script`'ed `for` loop with `break`: from",
        "  token `start` [1] and state `h0` [1, 16], until token 6 or 10 tokens. One `Loop` carrying",
        "  the tokens, which grow by one each iteration. Cases `start0` ... `start11`: one per start",
        "  token, some stopping early at the end token, some running to the limit.",
        "",
        "## Reference inputs and outputs",
        "",
        "`<name>_io.npz` holds example inputs and PyTorch's outputs. Its array `cases` names the",
        "cases (`b1`, `b8`; for `lstm`, `transformer` and `bert_mask` `b1_s5`, ...",
        "with two sequence lengths); tensor `T` of case `c` is stored as `c.T` with the graph's",
        "input/output names, e.g. `b8.image`, `b8.logits`. onnxruntime matched PyTorch on every case",
        "to < 1e-4 (max abs), except `qdq_cnn`, whose outputs are onnxruntime's (graph",
        "optimizations off) for the quantized model.",
        "",
        "```python",
        "io = np.load('tests/data/onnx/resnet_io.npz')",
        "for case in io['cases']:",
        "    x, want = io[f'{case}.image'], io[f'{case}.logits']",
        "```",
        "",
    ]
    (OUT / "README.md").write_text("\n".join(lines))


OLD = ("mlp", "mobilenetv2", "resnet", "lstm", "transformer")
PATTERNS = ("attention_mod", "bert_mask", "bigru", "qdq_cnn")
CONTROL = ("greedy_decoder",)
NAMES = (*OLD, "digits_cnn", *PATTERNS, *CONTROL)


def main(argv=None):
    global OUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated, of {','.join(NAMES)} (default all): "
                        "regenerate these, leave the other files as they are")
    only = [n for n in parser.parse_args(argv).only.split(",") if n] or list(NAMES)
    if set(only) - set(NAMES):
        parser.error(f"unknown models {sorted(set(only) - set(NAMES))}")
    real = OUT
    real.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        def make(name, build, check_fn=check):
            """Build `name`; export and check it into tests/data/onnx if chosen, else into a
            scratch folder (the model is built for the README's parameter count)."""
            global OUT
            OUT = real if name in only else Path(scratch)
            try:
                made = build()
                if name in only:
                    check_fn(*made[:5])
            finally:
                OUT = real
            rows_for = describe(real / f"{name}.onnx", made[1])
            return made, rows_for

        for name in OLD:
            _, row = make(name, globals()[f"build_{name}"])
            rows.append(row)
        (path, model, cases, ins, outs, acc), row = make("digits_cnn", build_digits)
        test = np.load(real / "digits_test.npz")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(real / "digits_cnn.onnx"), opts, providers=["CPUExecutionProvider"])
        ort_acc = float((sess.run(None, {"image": test["X"]})[0].argmax(1) == test["y"]).mean())
        print(f"digits CNN: test accuracy in onnxruntime {ort_acc:.4f}")
        if "digits_cnn" in only:
            assert ort_acc == acc, (ort_acc, acc)
        rows.append(row)
        for name in PATTERNS:
            _, row = make(name, globals()[f"build_{name}"], check_qdq if name == "qdq_cnn" else check)
            rows.append(row)
        for name in CONTROL:
            _, row = make(name, globals()[f"build_{name}"])
            rows.append(row)
    n_test = len(test["y"])
    write_readme(rows, ort_acc, n_test)
    total = sum(r["size"] for r in rows)
    print(f"total ONNX size {total / 1024:.0f} KiB; wrote {real / 'README.md'}")


if __name__ == "__main__":
    main()
