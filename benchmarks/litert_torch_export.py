"""Export PyTorch models to `.tflite` with litert-torch (formerly ai-edge-torch), Google's
PyTorch -> LiteRT converter, for bench_tflite.py's `--suite litert-torch`.

    PYTHON_WITH_LITERT_TORCH benchmarks/litert_torch_export.py OUT_DIR [--models a,b]

Writes OUT_DIR/<model>.tflite for each model not there yet (random weights, seeded):
torchvision classifiers at 224x224 and its LR-ASPP MobileNetV3 segmenter at 256x256; from
Hugging Face transformers a BERT-like encoder (4 layers, hidden 256, 4 heads, sequence 128;
inputs token ids and an attention mask), a small ViT (4 layers, hidden 192, 224x224) and a
small GPT-2 language model (4 layers, hidden 256, 64 tokens); torch.nn recurrences as
bench_models.py has them (a 2-layer LSTM, a bidirectional GRU, 50 steps of 64 features);
ResNet-18 and the BERT-like encoder through litert-torch's quantization recipes (int8
weights, int8 weights with dynamically quantized activations, float16 weights).
It runs under a Python with litert-torch, torch, torchvision and transformers installed
(`pip install litert-torch==0.10.0 torch==2.14.1 torchvision==0.29.1`), which edgeflow's
own environment need not have; it imports nothing of edgeflow.
"""
import argparse
import pathlib

VISION = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0",
          "squeezenet1_1", "regnet_y_400mf", "convnext_tiny", "swin_t")
# litert-torch's quantization recipes (ai-edge-quantizer): int8 weights with float
# activations, int8 weights with activations quantized on the fly (LiteRT's integer GEMMs),
# float16 weights
RECIPES = {"_int8_weights": "full_weight_only_recipe", "_int8_dynamic": "full_dynamic_recipe",
           "_fp16": "full_fp16_recipe"}
MODELS = VISION + ("lraspp_mobilenet_v3", "bert_encoder", "vit_encoder", "gpt2_lm", "lstm2", "bigru",
                   "resnet18_int8_weights", "resnet18_int8_dynamic", "resnet18_fp16", "bert_encoder_int8_weights",
                   "bert_encoder_int8_dynamic", "bert_encoder_fp16")


def _module(name):
    """(torch module in eval mode, example inputs)."""
    import torch
    torch.manual_seed(0)
    if name in VISION:
        import torchvision
        return getattr(torchvision.models, name)(weights=None).eval(), (torch.randn(1, 3, 224, 224),)
    if name == "lraspp_mobilenet_v3":
        import torchvision
        segmenter = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)
        return _wrapped(lambda x: segmenter(x)["out"], segmenter), (torch.randn(1, 3, 256, 256),)
    if name in ("lstm2", "bigru"):
        layer = torch.nn.LSTM(64, 128, num_layers=2, batch_first=True) if name == "lstm2" else \
            torch.nn.GRU(64, 128, bidirectional=True, batch_first=True)
        return _wrapped(lambda x: layer(x)[0], layer), (torch.randn(1, 50, 64),)
    import transformers
    if name == "vit_encoder":
        vit = transformers.ViTModel(transformers.ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                                                           intermediate_size=768))
        return _wrapped(lambda x: vit(pixel_values=x).last_hidden_state, vit), (torch.randn(1, 3, 224, 224),)
    if name == "gpt2_lm":
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=128))
        return _wrapped(lambda ids: gpt2(input_ids=ids, use_cache=False).logits, gpt2), \
            (torch.randint(0, 1000, (1, 64)),)
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024)
    bert = transformers.BertModel(config)
    return _wrapped(lambda ids, mask: bert(input_ids=ids, attention_mask=mask).last_hidden_state, bert), \
        (torch.randint(0, config.vocab_size, (1, 128)), torch.ones(1, 128, dtype=torch.long))


def _wrapped(forward, inner):
    """A module in eval mode whose forward is `forward` over `inner`'s (a module's) own: one
    tensor out, the inputs as litert-torch's example gives them."""
    import torch

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return forward(*args)

    return Module().eval()


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
        suffix = next((k for k in RECIPES if name.endswith(k)), "")
        module, example = _module(name[:len(name) - len(suffix)])
        options = {}
        if suffix:
            from litert_torch.generative.quantize import quant_recipes
            options["quant_config"] = getattr(quant_recipes, RECIPES[suffix])()
        part = target.with_suffix(".part")
        litert_torch.convert(module, example, **options).export(str(part))
        part.replace(target)
        print(f"exported {target}", flush=True)


if __name__ == "__main__":
    main()
