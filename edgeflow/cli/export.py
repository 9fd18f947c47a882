"""`edgeflow export`: write a signature of a .efl package as an ONNX model."""
import os
from collections import Counter

from ..errors import EdgeflowError


def add_parser(verbs):
    p = verbs.add_parser("export", help="export a .efl package (e.g. one trained on the device) to ONNX",
                         description="Write one signature of a .efl package as an ONNX model (opset 24) that "
                                     "onnxruntime runs and Netron opens: the signature's ops as ONNX nodes, fused "
                                     "ops as their ONNX op, variables at their current (trained) values, int8 "
                                     "weights through DequantizeLinear, if/while as If/Loop. An op with no ONNX "
                                     "form fails the export, listing every such op.",
                         epilog="example: edgeflow export trained.efl -o trained.onnx -s infer")
    p.add_argument("model", help="a .efl file")
    p.add_argument("-o", "--output", help="the .onnx file to write (default: MODEL with .onnx)")
    p.add_argument("-s", "--signature",
                   help="the signature to export (default: infer, else the first that does not train)")
    p.set_defaults(fn=cmd_export)


def cmd_export(args):
    try:
        from edgeflow.converters.onnx import export as exporter
    except ImportError as e:
        raise EdgeflowError(f"edgeflow export needs the 'convert' extra: pip install 'edgeflow[convert]' ({e})")
    out = args.output or os.path.splitext(args.model)[0] + ".onnx"
    proto = exporter.export(args.model, out, args.signature)
    graph = proto.graph
    counts = Counter(n.op_type for n in graph.node)
    print(f"exported {args.model} (signature {graph.name}) -> {out}")
    print(f"  opset        {exporter.OPSET}")
    print("  inputs       " + ", ".join(_describe(v) for v in graph.input))
    print("  outputs      " + ", ".join(_describe(v) for v in graph.output))
    print(f"  ONNX nodes   {sum(counts.values()):5}  " + ", ".join(f"{op} {n}" for op, n in counts.most_common()))
    print(f"  size         {os.path.getsize(out):,} B")


def _describe(value_info):
    from onnx import helper
    t = value_info.type.tensor_type
    dims = ", ".join(d.dim_param or str(d.dim_value) for d in t.shape.dim)
    return f"{value_info.name} {helper.tensor_dtype_to_np_dtype(t.elem_type)}[{dims}]"
