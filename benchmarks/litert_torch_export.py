"""Export PyTorch models to `.tflite` with litert-torch (formerly ai-edge-torch), Google's
PyTorch -> LiteRT converter, for bench_tflite.py's `--suite litert-torch`.

    PYTHON_WITH_LITERT_TORCH benchmarks/litert_torch_export.py OUT_DIR [--models a,b]

Writes OUT_DIR/<model>.tflite for each model not there yet (random weights, seeded): the
torchvision classifiers at 224x224 and a BERT-like encoder from Hugging Face transformers
(4 layers, hidden 256, 4 heads, sequence 128; inputs token ids and an attention mask).
It runs under a Python with litert-torch, torch, torchvision and transformers installed
(`pip install litert-torch==0.10.0 torch==2.14.1 torchvision==0.29.1`), which edgeflow's
own environment need not have; it imports nothing of edgeflow.
"""
import argparse
import pathlib

VISION = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0",
          "squeezenet1_1", "regnet_y_400mf", "convnext_tiny")
MODELS = VISION + ("bert_encoder",)


def _module(name):
    """(torch module in eval mode, example inputs)."""
    import torch
    torch.manual_seed(0)
    if name in VISION:
        import torchvision
        return getattr(torchvision.models, name)(weights=None).eval(), (torch.randn(1, 3, 224, 224),)
    import transformers
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024)
    bert = transformers.BertModel(config).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    return Encoder().eval(), (torch.randint(0, config.vocab_size, (1, 128)), torch.ones(1, 128, dtype=torch.long))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder of the .tflite files")
    parser.add_argument("--models", default="", help=f"of {','.join(MODELS)} (default all)")
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m] or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}: of {','.join(MODELS)}")
    import litert_torch
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = out / f"{name}.tflite"
        if target.exists():
            continue
        module, example = _module(name)
        part = target.with_suffix(".part")
        litert_torch.convert(module, example).export(str(part))
        part.replace(target)
        print(f"exported {target}", flush=True)


if __name__ == "__main__":
    main()
