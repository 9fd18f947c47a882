"""TFLite -> edgeflow: `convert(src, dst)` turns a `.tflite` model into a `.efl` package.

The reader (reader.py) decodes and checks the whole file; each operator goes through the
handler registered for its op (handlers/), which builds edgeflow's ops on values held in
a layout (context.py: NHWC images become NCHW once, not around every op). TFLite's
signature defs become edgeflow signatures under the same keys and names; a model without
any (most MediaPipe models) gets `infer` over subgraph 0's inputs and outputs, named by
their tensor names. A model with ops no handler converts (custom ops included) fails with
one UnsupportedOpError that lists them all.

Quantized models run in float: integer weights stay integers in the file and are
dequantized once when a plan is made; int8/uint8 activations are rounded to their grid
where TFLite writes them (context.py), so results follow LiteRT's integer kernels to
within their fixed-point rounding. Signature inputs and outputs keep TFLite's dtypes.
"""
from collections import Counter

import numpy as np

from edgeflow.errors import ConversionError, GraphError, UnsupportedOpError

from ..package import check_quantize, package, progress
from . import reader
from .context import QUANTIZED, Context, Op, grid

_FAILURES = (ValueError, IndexError, KeyError, TypeError, OverflowError, ZeroDivisionError)


SUBGRAPH_OPTIONS = ("cond_subgraph_index", "body_subgraph_index", "then_subgraph_index", "else_subgraph_index")


def reachable(model, roots):
    """The subgraphs `roots` and those their control-flow ops run, at any depth."""
    seen, stack = set(), list(roots)
    while stack:
        s = stack.pop()
        if s in seen:
            continue
        if not 0 <= s < len(model.subgraphs):
            raise ConversionError(f"an op runs subgraph {s}; the model has {len(model.subgraphs)}")
        seen.add(s)
        stack.extend(op.options[k] for op in model.subgraphs[s].operators for k in SUBGRAPH_OPTIONS
                     if k in op.options)
    return sorted(seen)


def unsupported_ops(model, subgraphs):
    """(op, version, name, why) of each operator in `subgraphs` (and the subgraphs they
    run) that no handler converts."""
    from .handlers import HANDLERS
    found = []
    for s in reachable(model, subgraphs):
        sg = model.subgraphs[s]
        for k, op in enumerate(sg.operators):
            if op.opcode not in HANDLERS:
                why = "custom op: edgeflow has no implementation" if op.opcode.startswith("CUSTOM:") else ""
                found.append((op.opcode, op.version, Op(k, op, sg).name, why))
    return found


def _raise_unsupported(found):
    by_type = {}
    for opcode, version, name, why in found:
        by_type.setdefault((opcode, version, why), []).append(name)
    lines = [f"  {op} (version {version}){': ' + why if why else ''}: {', '.join(repr(n) for n in names[:8])}"
             + (f" and {len(names) - 8} more" if len(names) > 8 else "")
             for (op, version, why), names in sorted(by_type.items())]
    raise UnsupportedOpError(f"{len(by_type)} unsupported TFLite op type(s) in {len(found)} op(s):\n"
                             + "\n".join(lines), found)


def _subgraph_signatures(model):
    """[(key, subgraph index, {name: tensor}, {name: tensor})]: the model's signature defs,
    or `infer` over subgraph 0 named by its tensors."""
    if model.signatures:
        return [(s.key, s.subgraph, s.inputs, s.outputs) for s in model.signatures]
    sg = model.subgraphs[0]
    return [("infer", 0, {sg.tensors[i].name or f"input_{k}": i for k, i in enumerate(sg.inputs)},
             {sg.tensors[i].name or f"output_{k}": i for k, i in enumerate(sg.outputs)})]


def to_graph(model, show_progress=False):
    """(graph, signatures): the model as an edgeflow Graph with a signature per TFLite
    signature def ({key: ({name: placeholder}, {name: output Tensor})})."""
    import edgeflow as ef

    signatures = _subgraph_signatures(model)
    used = sorted({s for _, s, _, _ in signatures})
    found = unsupported_ops(model, used)
    if found:
        _raise_unsupported(found)
    graph = ef.Graph()
    contexts = {}
    with graph.as_default():
        for s in used:
            sg = model.subgraphs[s]
            ctx = contexts[s] = Context(model, sg)
            for i in sg.inputs:
                _input(ctx, i)
            convert_ops(ctx, s, show_progress)
        result = {}
        for key, s, inputs, outputs in signatures:
            ctx = contexts[s]
            result[key] = ({name: ctx.placeholders[i] for name, i in inputs.items()},
                           {name: _output(ctx, i, name) for name, i in outputs.items()})
    return graph, result


def convert_ops(ctx, s, show_progress=False):
    """Convert subgraph s's operators, in order, into the default graph."""
    from .handlers import HANDLERS
    sg = ctx.subgraph
    ops = [Op(k, op, sg) for k, op in enumerate(sg.operators)]
    for op in progress(ops, show_progress, unit="op"):
        try:
            HANDLERS[op.opcode](ctx, op)
        except UnsupportedOpError as e:
            _raise_unsupported(e.ops)
        except (GraphError, ConversionError) as e:
            raise ConversionError(f"subgraph {s} {op.where()}: {e}") from None
        except _FAILURES as e:
            raise ConversionError(f"subgraph {s} {op.where()}: cannot convert it "
                                  f"({type(e).__name__}: {e})") from None
        missing = [i for i in op.outputs if i not in ctx.values and i not in ctx.arrays]
        if missing:
            raise ConversionError(f"subgraph {s} {op.where()}: gives {len(op.outputs)} outputs, "
                                  f"converted {len(op.outputs) - len(missing)}")


def call_subgraph(model, s, args, depth=0):
    """The outputs (Tensors, TFLite's layout) of subgraph s run on `args` (Tensors in
    TFLite's layout), converted into the default graph: a WHILE's cond and body, an IF's
    branches."""
    if depth > 32:
        raise ConversionError(f"subgraph {s}: control flow nested more than 32 deep (or recursive)")
    sg = model.subgraphs[s]
    if len(args) != len(sg.inputs):
        raise ConversionError(f"subgraph {s} takes {len(sg.inputs)} inputs, given {len(args)}")
    ctx = Context(model, sg, depth)
    for i, t in zip(sg.inputs, args):
        ctx.arrays.pop(i, None)
        ctx.set(i, t, exact=True)
    convert_ops(ctx, s)
    return [ctx.get(i) for i in sg.outputs]


def _input(ctx, i):
    """A placeholder for input tensor i (a quantized one is dequantized inside)."""
    import edgeflow as ef
    from edgeflow.graph.math_ops import apply
    t = ctx.subgraph.tensors[i]
    if i in ctx.placeholders:
        return
    x = ctx.placeholders[i] = ef.placeholder(t.dtype, t.shape, name=t.name or f"input_{i}")
    if t.quantization is not None and t.dtype in QUANTIZED:
        q = t.quantization
        if q.axis is not None:
            raise ConversionError(f"input {t.name!r} is quantized per axis; edgeflow takes per-tensor inputs")
        x = apply("dequantize_linear", [x, *grid(t)], name=f"{t.name}/real")
    ctx.arrays.pop(i, None)
    ctx.set(i, x, exact=True)


def _output(ctx, i, name):
    """Output tensor i in TFLite's layout and dtype (a quantized one is quantized again)."""
    from edgeflow.graph.math_ops import apply
    t = ctx.subgraph.tensors[i]
    x = ctx.get(i)
    if t.quantization is not None and t.dtype in QUANTIZED:
        q = t.quantization
        if q.axis is not None:
            raise ConversionError(f"output {t.name!r} is quantized per axis; edgeflow gives per-tensor outputs")
        x = apply("quantize_linear", [x, *grid(t)], {"dtype": t.dtype}, name=f"{name}/quantized")
    elif x.dtype != t.dtype:
        x = apply("cast", [x], {"dtype": t.dtype}, name=f"{name}/cast")
    return x


def convert(src, dst=None, quantize=None, optimize=True, progress=False):
    """Convert a TFLite model (a path or the file's bytes) to edgeflow; write it to `dst`
    if given.

    quantize: None keeps the model's own storage (float16 weights stay float16, int8
    ones int8), "fp16" or "int8" re-store its float weights. optimize: constant folding
    and activation fusion.
    """
    from edgeflow.graph import optimize as passes
    check_quantize(quantize)
    model = reader.read(src)
    graph, signatures = to_graph(model, progress)
    if optimize:
        signatures = passes.optimize(graph, signatures)
    source_ops = Counter(op.opcode for sg in model.subgraphs for op in sg.operators)
    fp16 = any(t.dtype == np.float16 and t.data is not None for sg in model.subgraphs for t in sg.tensors)
    return package(graph, signatures, f"converted from TFLite (schema version {model.version}"
                   f"{', ' + model.description if model.description else ''})", "edgeflow.converters.tflite",
                   dst, quantize, source_ops, model.size, "TFLite", fp16_exact=fp16)
