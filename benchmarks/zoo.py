"""A model zoo: real architectures exported from PyTorch, converted, checked and timed.

    .venv/bin/python benchmarks/zoo.py [--models a,b] [--exporters torchscript,dynamo]
                                       [--runs N] [--out results.md] [--cache DIR] [--reexport]

Needs the `zoo` extra (torch, torchvision, transformers, onnxscript). Every model is built
with random weights (a fixed seed; torchvision's `weights=None`, Hugging Face models from
tiny configs), in eval mode, and exported with both of torch's exporters: TorchScript
(`torch.onnx.export(..., dynamo=False)`, its default opset) and dynamo (its default opset).
The ONNX files (and the errors of exports that failed) are kept in a cache folder (default
~/.cache/edgeflow/zoo/<torch version>), so a second run only converts and measures. For
each (model, exporter): edgeflow's ONNX converter, every output checked against
onnxruntime on the same file (max abs error, and relative to the largest magnitude of
onnxruntime's output), and the medians of interleaved runs of both at one thread. A row that fails says where (export, convert, run) and why;
the table ends with converted / matched / total.
"""
import argparse
import contextlib
import io
import os
import pathlib
import re
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

import harness

EXPORTERS = ("torchscript", "dynamo")
RTOL = 1e-4  # matched: max abs error <= RTOL * max |onnxruntime output| (or <= ATOL)
ATOL = 1e-5


@dataclass
class Example:
    """A model to export: the module, its example inputs (name -> array, in forward's
    argument order), its output names, and the input axes to export as dynamic."""

    module: object
    inputs: dict
    outputs: list
    dynamic: dict = field(default_factory=dict)  # input name -> {axis: dim name}


# -- the models -----------------------------------------------------------------------------
def _torch():
    import torch
    return torch


def _rng(seed=0):
    return np.random.default_rng(seed)


def _image(size=224, batch=1):
    return {"image": _rng(1).standard_normal((batch, 3, size, size)).astype(np.float32)}


def _tokens(vocab, batch=2, seq=16, mask=True, names=("input_ids", "attention_mask")):
    """Token ids, and an attention mask whose last row pads its last 5 positions."""
    ids = _rng(2).integers(0, vocab, (batch, seq), dtype=np.int64)
    feeds = {names[0]: ids}
    if mask:
        m = np.ones((batch, seq), dtype=np.int64)
        m[-1, -5:] = 0
        feeds[names[1]] = m
    return feeds


def _randomized(model, seed=0):
    """`model` with non-trivial BatchNorm statistics and affine parameters, and parameters that
    start as all zeros (ViT's head, biases) given small random values: torchvision's
    initialisation would otherwise make some outputs zeros or ~1e-13, and the check compare
    little."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.8 + 0.6)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) * 0.8 + 0.6)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
        for p in model.parameters():
            if p.numel() > 1 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _vision(name, **kwargs):
    def build():
        import torchvision
        _torch().manual_seed(0)
        model = _randomized(getattr(torchvision.models, name)(weights=None, **kwargs))
        return Example(model, _image(), ["logits"])
    return build


def _wrap(model, pick):
    """A module calling `model(*args)` and returning `pick(result)` (a tuple of tensors):
    Hugging Face models return ModelOutput objects, detection models lists of dicts."""
    torch = _torch()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return pick(self.model(*args))
    return Wrapped()


def _segmentation(name):
    def build():
        import torchvision
        _torch().manual_seed(0)
        model = _randomized(getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None))
        return Example(_wrap(model, lambda r: r["out"]), _image(), ["out"])
    return build


def _detection(name, size, **kwargs):
    def build():
        import torchvision
        _torch().manual_seed(0)
        model = _randomized(getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None,
                                                                        **kwargs))

        class Detect(_torch().nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, image):
                r = self.model([image[0]])[0]
                return r["boxes"], r["scores"], r["labels"]
        return Example(Detect(), _image(size), ["boxes", "scores", "labels"])
    return build


def _hf(make_config, make_model, feeds, outputs):
    """A Hugging Face model from a tiny config, called with its inputs positionally by name."""
    def build():
        import transformers
        torch = _torch()
        torch.manual_seed(0)
        model = make_model(transformers, make_config(transformers))
        model.eval()
        names = list(feeds)

        class HF(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(names, args)), return_dict=True)
                return tuple(out[k] for k in outputs)
        return Example(HF(), dict(feeds), list(outputs))
    return build


_BERT = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=128)


def _bert():
    return _hf(lambda t: t.BertConfig(**_BERT), lambda t, c: t.BertModel(c),
               _tokens(1000), ["last_hidden_state", "pooler_output"])()


def _distilbert():
    return _hf(lambda t: t.DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                            max_position_embeddings=128),
               lambda t, c: t.DistilBertModel(c), _tokens(1000), ["last_hidden_state"])()


def _gpt2():
    return _hf(lambda t: t.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=0, eos_token_id=0, use_cache=False),
               lambda t, c: t.GPT2Model(c), _tokens(1000), ["last_hidden_state"])()


def _t5():
    feeds = _tokens(1000)
    feeds["decoder_input_ids"] = _rng(3).integers(0, 1000, (2, 8), dtype=np.int64)
    return _hf(lambda t: t.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                    num_decoder_layers=2, num_heads=4, use_cache=False),
               lambda t, c: t.T5Model(c), feeds, ["last_hidden_state", "encoder_last_hidden_state"])()


def _hf_vit():
    return _hf(lambda t: t.ViTConfig(image_size=224, patch_size=16, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128),
               lambda t, c: t.ViTModel(c), {"pixel_values": _image()["image"]},
               ["last_hidden_state", "pooler_output"])()


def _whisper_encoder():
    frames = 200  # Whisper's encoder takes exactly 2 * max_source_positions frames
    feats = _rng(4).standard_normal((1, 80, frames)).astype(np.float32)
    return _hf(lambda t: t.WhisperConfig(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4,
                                         encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
                                         max_source_positions=frames // 2, max_target_positions=64,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         decoder_start_token_id=1),
               lambda t, c: t.WhisperModel(c).get_encoder(), {"input_features": feats},
               ["last_hidden_state"])()


def _llama():
    return _hf(lambda t: t.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=128, use_cache=False),
               lambda t, c: t.LlamaForCausalLM(c), _tokens(1000), ["logits"])()


def _sequence(batch=2, seq=16, width=64, seed=5):
    return _rng(seed).standard_normal((batch, seq, width)).astype(np.float32)


def _transformer_encoder():
    torch = _torch()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return Example(model, {"x": _sequence()}, ["y"])


def _multihead_attention():
    torch = _torch()
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]
    return Example(SelfAttention(), {"x": _sequence()}, ["y"])


def _bigru():
    """A bidirectional GRU whose final states, batch first, are flattened per example
    (`reshape(batch, -1)`) into a classifier; the batch is dynamic."""
    torch = _torch()
    torch.manual_seed(0)

    class BiGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(16, 64, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(128, 5)

        def forward(self, x):
            _, h = self.gru(x)  # [2, batch, 64]
            return self.fc(h.transpose(0, 1).reshape(x.shape[0], -1))
    return Example(BiGRU(), {"x": _sequence(3, 12, 16)}, ["logits"], {"x": {0: "batch"}})


def _lstm():
    torch = _torch()
    torch.manual_seed(0)

    class LSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(16, 64, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(64, 5)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.fc(out[:, -1])
    return Example(LSTM(), {"x": _sequence(3, 12, 16)}, ["logits"], {"x": {0: "batch", 1: "seq"}})


MODELS = {
    # torchvision classification, 224x224
    "resnet18": _vision("resnet18"),
    "mobilenet_v2": _vision("mobilenet_v2"),
    "mobilenet_v3_small": _vision("mobilenet_v3_small"),
    "efficientnet_b0": _vision("efficientnet_b0"),
    "squeezenet1_1": _vision("squeezenet1_1"),
    "shufflenet_v2_x1_0": _vision("shufflenet_v2_x1_0"),
    "regnet_y_400mf": _vision("regnet_y_400mf"),
    "googlenet": _vision("googlenet", aux_logits=False, init_weights=True),
    "densenet121": _vision("densenet121"),
    "convnext_tiny": _vision("convnext_tiny"),
    "vit_b_16": _vision("vit_b_16"),
    "swin_t": _vision("swin_t"),
    # torchvision segmentation (224x224) and detection (320x320)
    "lraspp_mobilenet_v3": _segmentation("lraspp_mobilenet_v3_large"),
    "deeplabv3_mobilenet_v3": _segmentation("deeplabv3_mobilenet_v3_large"),
    "ssdlite320_mobilenet_v3": _detection("ssdlite320_mobilenet_v3_large", 320),
    "fasterrcnn_mobilenet_v3_320": _detection("fasterrcnn_mobilenet_v3_large_320_fpn", 320,
                                              box_score_thresh=0.0),
    # Hugging Face transformers, tiny configs, random weights
    "bert": _bert,
    "distilbert": _distilbert,
    "gpt2": _gpt2,
    "t5": _t5,
    "hf_vit": _hf_vit,
    "whisper_encoder": _whisper_encoder,
    "llama": _llama,
    # torch.nn
    "transformer_encoder": _transformer_encoder,
    "multihead_attention": _multihead_attention,
    "bigru_dynamic_batch": _bigru,
    "lstm": _lstm,
}


# -- export -----------------------------------------------------------------------------------
def export(example, exporter, path):
    """Export `example` with `exporter` to `path` (written whole, or not at all)."""
    torch = _torch()
    model = example.module.eval()
    args = tuple(torch.from_numpy(a) for a in example.inputs.values())
    names = list(example.inputs)
    dynamic = {n: axes for n, axes in example.dynamic.items()} or None
    tmp = path.with_suffix(".part")
    # Not under no_grad: nn.TransformerEncoderLayer's fused fast path (which does not export)
    # is taken only without gradients, and users export as they train.
    quiet = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, str(tmp), dynamo=False, input_names=names,
                              output_names=example.outputs, dynamic_axes=dynamic)
        else:
            torch.onnx.export(model, args, str(tmp), dynamo=True, input_names=names,
                              output_names=example.outputs, dynamic_axes=dynamic, external_data=False)
    os.replace(tmp, path)


def _first_line(e):
    """The first line of `e`'s innermost cause (torch.export wraps the error that says what
    failed in one that says which step), without terminal colours."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def _why(e):
    """The reason a conversion failed, on one line: the unsupported op types, or the error's
    first line."""
    from edgeflow.errors import UnsupportedOpError
    if isinstance(e, UnsupportedOpError) and e.ops:
        kinds = sorted({op[0] for op in e.ops})
        return "unsupported: " + ", ".join(kinds)
    return _first_line(e)


# -- one row ----------------------------------------------------------------------------------
@dataclass
class Row:
    model: str
    exporter: str
    opset: str = "-"
    ops: str = "-"
    converts: str = "no"
    max_abs: float = None
    max_rel: float = None
    matched: bool = False
    edgeflow_s: float = None
    ort_s: float = None
    note: str = ""

    def cells(self, width=None):
        err = "-" if self.max_abs is None else f"{self.max_abs:.1e} ({self.max_rel:.0e})"
        return [self.model, self.exporter, self.opset, self.ops, self.converts, err,
                "yes" if self.matched else ("no" if self.max_abs is not None else "-"),
                harness.ms(self.edgeflow_s, 2), harness.ms(self.ort_s, 2),
                harness.ratio(self.edgeflow_s, self.ort_s), self.note[:width]]


COLUMNS = ["model", "exporter", "opset", "ops", "converts", "max error (rel)", "matches", "edgeflow ms",
           "onnxruntime ms", "ratio", "note"]


def compare(ours, theirs):
    """(max abs error, max relative error, matched) of edgeflow's outputs against
    onnxruntime's, over every output; integer outputs must be equal."""
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for got, want in zip(ours, theirs):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            raise ValueError(f"output shape {got.shape}, onnxruntime's {want.shape}")
        if want.size == 0:
            continue
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        a = float(np.nanmax(diff)) if not np.isnan(diff).all() else 0.0
        if (np.isnan(got) != np.isnan(want)).any() if want.dtype.kind == "f" else False:
            a = float("inf")
        scale = float(np.nanmax(np.abs(want.astype(np.float64)))) if want.dtype.kind in "fiu" else 1.0
        r = a / scale if scale else a
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        if want.dtype.kind in "iub":
            ok &= a == 0
        else:
            ok &= a <= RTOL * scale or a <= ATOL
    return worst_abs, worst_rel, ok


def measure(name, exporter, build, cache, runs, folder, reexport=False):
    """The Row of `name` exported with `exporter`."""
    import onnx
    import edgeflow as ef
    from edgeflow.converters import onnx as onnx_converter
    from threadpoolctl import threadpool_limits

    row = Row(name, exporter)
    path = cache / f"{name}-{exporter}.onnx"
    try:
        example = build()
    except Exception as e:
        row.note = f"build: {_first_line(e)}"
        return row
    failed = path.with_suffix(".export-error")  # an export that failed fails again: not retried
    if reexport:
        path.unlink(missing_ok=True)
        failed.unlink(missing_ok=True)
    if failed.exists():
        row.note = failed.read_text()
        return row
    if not path.exists():
        try:
            export(example, exporter, path)
        except Exception as e:
            row.note = f"export: {_first_line(e)}"
            failed.write_text(row.note)
            return row
    proto = onnx.load(str(path))
    row.opset = str(next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), "-"))
    row.ops = str(len(proto.graph.node))
    graph_inputs = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    feeds = dict(zip(graph_inputs, example.inputs.values()))
    try:
        sess = harness.ort_session(path, threads=1)
        want = sess.run(None, feeds)
    except Exception as e:
        row.note = f"onnxruntime: {_first_line(e)}"
        return row
    efl = folder / f"{name}-{exporter}.efl"
    try:
        onnx_converter.convert(path, efl)
    except Exception as e:
        row.note = f"convert: {_why(e)}"
        return row
    row.converts = "yes"
    try:
        runner = ef.Interpreter(efl, num_threads=1).get_signature_runner("infer")
        with threadpool_limits(limits=1):
            ours = runner(**feeds)
        names = [o.name for o in sess.get_outputs()]
        row.max_abs, row.max_rel, row.matched = compare([ours[n] for n in names], want)
    except Exception as e:
        row.note = f"run: {_first_line(e)}"
        return row
    if runs:
        with threadpool_limits(limits=1):
            t = harness.medians({"edgeflow": lambda: runner(**feeds), "ort": lambda: sess.run(None, feeds)},
                                runs, warmup=1)
        row.edgeflow_s, row.ort_s = t["edgeflow"], t["ort"]
    return row


# -- the table --------------------------------------------------------------------------------
def summary(rows):
    converted = sum(r.converts == "yes" for r in rows)
    matched = sum(r.matched for r in rows)
    return f"converted {converted} / matched {matched} / total {len(rows)}"


def markdown(rows, runs):
    import torch
    lines = [f"torch {torch.__version__}; medians of {runs} interleaved runs at 1 thread; "
             f"matches: max abs error <= {RTOL:g} x max |onnxruntime output| (or <= {ATOL:g}), "
             "integer outputs equal.", "",
             "| " + " | ".join(COLUMNS) + " |",
             "| " + " | ".join("---" if i < 2 or c == "note" else "---:" for i, c in enumerate(COLUMNS)) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r.cells()) + " |")
    lines += ["", summary(rows), ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help=f"comma-separated, of {','.join(MODELS)} (default all)")
    parser.add_argument("--exporters", default=",".join(EXPORTERS), help="torchscript, dynamo or both")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each contender (0: no timing)")
    parser.add_argument("--reexport", action="store_true", help="export again, ignoring the cache "
                        "(exports that failed are cached too)")
    parser.add_argument("--out", default=None, help="also write the table as markdown to this file")
    parser.add_argument("--cache", default=None, help="folder of exported ONNX files "
                        "(default $EDGEFLOW_ZOO_CACHE or ~/.cache/edgeflow/zoo/<torch version>)")
    args = parser.parse_args()
    import torch
    names = [m for m in args.models.split(",") if m] or list(MODELS)
    unknown = [m for m in names if m not in MODELS]
    exporters = [e for e in args.exporters.split(",") if e]
    if unknown or set(exporters) - set(EXPORTERS):
        parser.error(f"unknown model or exporter: {unknown + sorted(set(exporters) - set(EXPORTERS))}")
    cache = pathlib.Path(args.cache or os.environ.get("EDGEFLOW_ZOO_CACHE")
                         or pathlib.Path.home() / ".cache" / "edgeflow" / "zoo" / torch.__version__)
    cache.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    jobs = [(n, e) for n in names for e in exporters]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, exporter) in enumerate(jobs, 1):
            harness.log(f"[{k}/{len(jobs)}] {name} ({exporter})...")
            start = time.perf_counter()
            try:
                row = measure(name, exporter, MODELS[name], cache, args.runs, pathlib.Path(tmp), args.reexport)
            except Exception as e:  # a bug of this script must not lose the other rows
                traceback.print_exc()
                row = Row(name, exporter, note=f"zoo: {_first_line(e)}")
            rows.append(row)
            harness.log(f"    {row.converts}, {'matches' if row.matched else 'no match'} "
                        f"({time.perf_counter() - start:.0f} s) {row.note}")
            for f in pathlib.Path(tmp).iterdir():
                f.unlink()
    print(f"\ntorch {torch.__version__}; medians of {args.runs} interleaved runs at 1 thread\n")
    harness.print_table(COLUMNS, [r.cells(width=90) for r in rows])
    print(f"\n{summary(rows)}")
    if args.out:
        pathlib.Path(args.out).write_text(markdown(rows, args.runs))


if __name__ == "__main__":
    main()
