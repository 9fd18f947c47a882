"""`edgeflow convert`: convert an ONNX model to a .efl package."""
import argparse
import os
import sys

from ..errors import EdgeflowError


def add_parser(verbs):
    p = verbs.add_parser("convert", help="convert an ONNX model to a .efl package",
                         description="Convert an ONNX model (opset >= 13) to a .efl package: "
                                     "constants folded, BatchNorm folded, activations fused, "
                                     "weights optionally quantized.")
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", help="the .efl file to write (default: MODEL with .efl)")
    p.add_argument("--quantize", choices=["fp16", "int8"],
                   help="store weights as float16, or int8 with per-channel scales")
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
    p.set_defaults(fn=cmd_convert)


def cmd_convert(args):
    try:
        from edgeflow.converters import onnx as onnx_converter
    except ImportError as e:
        raise EdgeflowError(f"edgeflow convert needs the 'convert' extra: pip install 'edgeflow[convert]' ({e})")
    if not args.model.lower().endswith(".onnx"):
        raise EdgeflowError(f"{args.model}: expected an .onnx file (TFLite input is not supported yet)")
    out = args.output or os.path.splitext(args.model)[0] + ".efl"
    result = onnx_converter.convert(args.model, out, quantize=args.quantize, optimize=args.optimize,
                                    progress=sys.stderr.isatty(), trainable=args.trainable,
                                    loss=args.loss, optimizer=args.optimizer, freeze=args.freeze)
    print(f"converted {args.model} -> {out}")
    print(f"  ONNX ops     {sum(result.onnx_ops.values()):5}  " + _counts(result.onnx_ops))
    print(f"  edgeflow ops {sum(result.ops.values()):5}  " + _counts(result.ops))
    print(f"  parameters   {result.parameters:,}")
    if args.trainable:
        variables = sum(t.is_variable for t in result.model.subgraphs[0].tensors)
        print(f"  trainable    {variables} variables (with optimizer slots); signatures "
              + ", ".join(s.key for s in result.model.signatures))
    ratio = result.efl_bytes / result.onnx_bytes if result.onnx_bytes else float("nan")
    print(f"  size         {result.onnx_bytes:,} B (.onnx) -> {result.efl_bytes:,} B (.efl"
          f"{', ' + args.quantize if args.quantize else ''}), {ratio:.2f}x")


def _counts(counter):
    return ", ".join(f"{op} {n}" for op, n in counter.most_common())
