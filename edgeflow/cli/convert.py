"""`edgeflow convert`: convert an ONNX or TFLite model to a .efl package."""
import argparse
import os
import sys

from ..errors import EdgeflowError


def add_parser(verbs):
    p = verbs.add_parser("convert", help="convert an ONNX or TFLite model to a .efl package",
                         description="Convert an ONNX model (opset >= 13) or a TFLite model (.tflite: "
                                     "float, float16 or int8-quantized) to a .efl package: constants "
                                     "folded, BatchNorm folded, activations fused, weights optionally "
                                     "quantized.")
    p.add_argument("model", help="an .onnx or .tflite file")
    p.add_argument("-o", "--output", help="the .efl file to write (default: MODEL with .efl)")
    p.add_argument("--quantize", choices=["fp16", "int8"],
                   help="store weights as float16, or int8 with per-channel scales (default: as the "
                        "source stores them)")
    p.add_argument("--optimize", action=argparse.BooleanOptionalAction, default=True,
                   help="fold constants and BatchNorm, fuse activations (default: on)")
    p.add_argument("--trainable", action="store_true",
                   help="also make train/save/restore signatures (initializers become variables)")
    p.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy",
                   help="with --trainable: the loss on the first output (default cross_entropy)")
    p.add_argument("--optimizer", default="sgd:0.01", metavar="NAME:LR",
                   help="with --trainable: sgd, momentum, adam, adamw, adagrad or rmsprop, and a "
                        "learning rate (default sgd:0.01)")
    p.add_argument("--freeze", nargs="+", default=[], metavar="NAME",
                   help="with --trainable: initializers to keep constant")
    p.add_argument("--tie-shared-weights", nargs="*", metavar="NAME",
                   help="with --trainable: an initializer that several nodes read (exporters "
                        "deduplicate equal ones, e.g. zero biases) becomes one variable per reading "
                        "unless named here (alone: all of them), e.g. a transformer's tied embeddings")
    p.set_defaults(fn=cmd_convert)


def cmd_convert(args):
    kind = os.path.splitext(args.model)[1].lower()
    if kind not in (".onnx", ".tflite"):
        raise EdgeflowError(f"{args.model}: expected an .onnx or a .tflite file")
    try:
        if kind == ".onnx":
            from edgeflow.converters import onnx as converter
        else:
            from edgeflow.converters import tflite as converter
    except ImportError as e:
        raise EdgeflowError(f"edgeflow convert needs the 'convert' extra: pip install 'edgeflow[convert]' ({e})")
    out = args.output or os.path.splitext(args.model)[0] + ".efl"
    if args.tie_shared_weights is not None and not args.trainable:
        raise EdgeflowError("--tie-shared-weights goes with --trainable (it says which initializers stay "
                            "one shared variable)")
    if kind == ".tflite":
        if args.trainable or args.freeze or args.tie_shared_weights is not None:
            raise EdgeflowError("--trainable, --freeze and --tie-shared-weights take ONNX models; a .tflite "
                                "file converts for inference")
        result = converter.convert(args.model, out, quantize=args.quantize, optimize=args.optimize,
                                   progress=sys.stderr.isatty())
    else:
        result = converter.convert(args.model, out, quantize=args.quantize, optimize=args.optimize,
                                   progress=sys.stderr.isatty(), trainable=args.trainable,
                                   loss=args.loss, optimizer=args.optimizer, freeze=args.freeze,
                                   tie_shared=True if args.tie_shared_weights == [] else args.tie_shared_weights)
    source = result.source_format
    print(f"converted {args.model} -> {out}")
    print(f"  {source + ' ops':12} {sum(result.source_ops.values()):5}  " + _counts(result.source_ops))
    print(f"  edgeflow ops {sum(result.ops.values()):5}  " + _counts(result.ops))
    print(f"  parameters   {result.parameters:,}")
    if args.trainable:
        variables = sum(t.is_variable for t in result.model.subgraphs[0].tensors)
        print(f"  trainable    {variables} variables (with optimizer slots); signatures "
              + ", ".join(s.key for s in result.model.signatures))
        for note in result.notes:
            print(f"  note         {note}")
    elif len(result.model.signatures) > 1 or result.model.signatures[0].key != "infer":
        print("  signatures   " + ", ".join(s.key for s in result.model.signatures))
    ratio = result.efl_bytes / result.source_bytes if result.source_bytes else float("nan")
    stored = args.quantize or result.model.metadata.get("quantization", b"").decode()
    print(f"  size         {result.source_bytes:,} B ({kind}) -> {result.efl_bytes:,} B (.efl"
          f"{', ' + stored if stored else ''}), {ratio:.2f}x")


def _counts(counter):
    return ", ".join(f"{op} {n}" for op, n in counter.most_common())
