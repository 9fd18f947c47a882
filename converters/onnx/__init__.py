"""ONNX -> edgeflow: `convert(src, dst)` turns an ONNX model into a `.efl` package.

Initializers become constants, graph inputs placeholders (symbolic dimensions stay
dynamic), and the graph's inputs and outputs the `infer` signature under their ONNX
names. Each node goes through the handler registered for its op type
(converters/onnx/handlers), the nodes of subgraphs (If branches, Loop and Scan bodies) too,
walked the same way (Context.convert in context.py); nodes without one whose inputs are
all constant are computed first (folding.py); a model with other unsupported ops, at any
depth, fails with one UnsupportedOpError that lists them all.
"""
import os
from collections import Counter

from edgeflow.errors import ConversionError, UnsupportedOpError

from ..package import Conversion, check_quantize, package, progress  # noqa: F401 (Conversion: API)

MIN_OPSET = 13


def load(src):
    """An onnx.ModelProto from a path or a ModelProto; ConversionError if malformed."""
    import onnx
    if isinstance(src, onnx.ModelProto):
        model = src
    else:
        try:
            model = onnx.load(os.fspath(src), load_external_data=True)
        except FileNotFoundError:
            raise
        except Exception as e:  # onnx raises DecodeError, ValueError, OSError...
            raise ConversionError(f"{os.fspath(src)}: not a readable ONNX model ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ConversionError(f"invalid ONNX model: {str(e).splitlines()[0]}") from None
    return _at_supported_opset(model)


def _opset(model):
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _at_supported_opset(model):
    if _opset(model) >= MIN_OPSET:
        return model
    from onnx import version_converter
    try:
        return version_converter.convert_version(_hardmax_in_2d(model), MIN_OPSET)
    except Exception as e:
        raise ConversionError(f"the model uses opset {_opset(model)}; edgeflow reads opset "
                              f">= {MIN_OPSET} and ONNX's version converter failed: {e}") from None


def _hardmax_in_2d(model):
    """Hardmax before opset 13 works on the input flattened to 2D at `axis`; ONNX's version
    converter keeps the node as it is (opset 13 reads `axis` as one axis), so each one is
    spelled Reshape(Hardmax(Flatten(x, axis), axis=1), Shape(x)), the same at any opset."""
    from onnx import helper
    if not any(n.op_type == "Hardmax" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    nodes = []
    for n in model.graph.node:
        if n.op_type != "Hardmax" or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), 1)
        x, y = n.input[0], n.output[0]
        nodes += [helper.make_node("Flatten", [x], [f"{y}/2d"], axis=axis, name=f"{n.name}/2d"),
                  helper.make_node("Hardmax", [f"{y}/2d"], [f"{y}/hardmax"], axis=1, name=n.name),
                  helper.make_node("Shape", [x], [f"{y}/shape"], name=f"{n.name}/shape"),
                  helper.make_node("Reshape", [f"{y}/hardmax", f"{y}/shape"], [y], name=f"{n.name}/back")]
    rewritten = type(model)()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    return rewritten


def _shape(value_info):
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ConversionError(f"graph input {value_info.name!r} has type {kind or 'none'}; "
                              "edgeflow takes tensors only")
    dims = value_info.type.tensor_type.shape.dim
    if not value_info.type.tensor_type.HasField("shape"):
        raise ConversionError(f"graph input {value_info.name!r} has no shape; give it one when exporting")
    return [d.dim_value if d.HasField("dim_value") else None for d in dims]


def _dtype(value_info):
    from .context import onnx_dtype
    return onnx_dtype(value_info.type.tensor_type.elem_type)


def unsupported_nodes(model):
    """(op_type, opset, node name) of every node no handler converts, inside subgraphs too;
    a custom domain's op is "domain.op_type" and its opset "domain opset N"."""
    from .context import subgraphs
    from .handlers import HANDLERS
    opset = _opset(model)
    versions = {o.domain: o.version for o in model.opset_import}

    def walk(nodes):
        for n in nodes:
            if n.domain not in ("", "ai.onnx"):  # a custom domain: its own version, not the default's
                yield (f"{n.domain}.{n.op_type}", f"{n.domain} opset {versions.get(n.domain, '?')}",
                       n.name or n.output[0])
            elif n.op_type not in HANDLERS:
                yield n.op_type, opset, n.name or n.output[0]
            for graph in subgraphs(n):
                yield from walk(graph.node)
    return list(walk(model.graph.node))


def _raise_unsupported(found):
    by_type = {}
    for op_type, opset, name, *why in found:
        by_type.setdefault((op_type, opset, why[0] if why else ""), []).append(name)
    lines = [f"  {op} ({opset if isinstance(opset, str) else f'opset {opset}'}){': ' + why if why else ''}: "
             f"{', '.join(names[:8])}"
             + (f" and {len(names) - 8} more" if len(names) > 8 else "")
             for (op, opset, why), names in sorted(by_type.items())]
    raise UnsupportedOpError(f"{len(by_type)} unsupported op type(s) in {len(found)} node(s):\n"
                             + "\n".join(lines), found)


def to_graph(model, show_progress=False, variables=()):
    """(graph, inputs, outputs, context): the ONNX graph as an edgeflow Graph, with its
    inputs and outputs as dicts of ONNX name -> Tensor. Initializers named in `variables`
    become ef.Variables; the others constants."""
    import edgeflow as ef
    from .context import Context, Sequence, onnx_array
    from .handlers import HANDLERS

    if unsupported_nodes(model):  # nodes computed from constants alone need no handler
        from .folding import fold_unsupported
        model = fold_unsupported(model, HANDLERS.keys(), variables)
    found = unsupported_nodes(model)
    if found:
        _raise_unsupported(found)
    g = ef.Graph()
    ctx = Context(g, _opset(model))
    with g.as_default():
        initializers = {init.name for init in model.graph.initializer}
        for init in model.graph.initializer:
            make = ef.Variable if init.name in variables else ef.constant
            ctx.tensors[init.name] = make(onnx_array(init), name=init.name)
        inputs = {}
        for vi in model.graph.input:
            if vi.name not in initializers:
                shape = _shape(vi)  # first: it rejects inputs that are not tensors
                inputs[vi.name] = ctx.tensors[vi.name] = ef.placeholder(_dtype(vi), shape, name=vi.name)
        failed = ctx.convert(progress(model.graph.node, show_progress))
        if failed:
            _raise_unsupported(failed)
        outputs = {vi.name: ctx.tensors[vi.name] for vi in model.graph.output}
    sequences = [name for name, t in outputs.items() if isinstance(t, Sequence)]
    if sequences:
        raise ConversionError(f"graph output(s) {sequences} are sequences: edgeflow has no sequence values")
    return g, inputs, outputs, ctx


def convert(src, dst=None, quantize=None, optimize=True, progress=False, trainable=False,
            loss="cross_entropy", optimizer="sgd:0.01", freeze=(), tie_shared=False):
    """Convert an ONNX model (path or ModelProto) to edgeflow; write it to `dst` if given.

    quantize: None, "fp16" (weights stored as float16) or "int8" (weights stored int8,
    per-channel for conv and matmul weights). optimize: constant folding, BatchNorm
    folding, activation fusion (dead nodes are never written).

    trainable: also make `train`, `save` and `restore` signatures, as onnxruntime's
    training artifacts do: float initializers become variables (except those named in
    `freeze`, and operands whose values set shapes), `loss` ("cross_entropy" on integer
    labels, or "mse") applies to the first graph output against a new `labels` input, and
    `optimizer` ("sgd:LR", "momentum:LR", "adam:LR", "adamw:LR", "adagrad:LR",
    "rmsprop:LR") updates the variables.

    An initializer read by several nodes (each reading is a "parameter slot": a weight or
    bias input of a Gemm, Conv, MatMul, Add...) becomes one variable per slot, each
    starting at the initializer's value: exporters deduplicate equal initializers (torch's
    do: the zero biases of several nn.Linear layers become one), and the original modules
    trained them apart. The first slot keeps the initializer's name, the others are named
    `NAME@NODE`; the Conversion's `notes` list them. `tie_shared` keeps them one shared
    variable instead: True for every such initializer, or an iterable of their names (a
    transformer's tied embeddings are genuinely one parameter). Initializers also read
    inside subgraphs (If, Loop, Scan bodies) stay shared.
    """
    if trainable:
        return _convert_trainable(src, dst, quantize, progress, loss, optimizer, freeze, tie_shared)
    from edgeflow.graph import optimize as passes

    check_quantize(quantize)
    proto = load(src)
    graph, inputs, outputs, _ = to_graph(proto, progress)
    signatures = {"infer": (inputs, outputs)}
    if optimize:
        signatures = passes.optimize(graph, signatures)
    return _package(graph, signatures, f"converted from ONNX ({proto.producer_name or 'unknown producer'}, "
                    f"opset {_opset(proto)})", proto, dst, quantize)


def _package(graph, signatures, description, proto, dst, quantize):
    return package(graph, signatures, description, "edgeflow.converters.onnx", dst, quantize,
                   Counter(n.op_type for n in proto.graph.node), proto.ByteSize(), "ONNX")


OPTIMIZERS = {"sgd": "GradientDescent", "momentum": "Momentum", "adam": "Adam", "adamw": "AdamW",
              "adagrad": "Adagrad", "rmsprop": "RMSProp"}


def make_optimizer(spec):
    """An ef.train optimizer from "name:learning_rate" (momentum uses 0.9)."""
    import edgeflow as ef
    name, _, rate = spec.partition(":")
    if name not in OPTIMIZERS:
        raise ConversionError(f"optimizer must be one of {sorted(OPTIMIZERS)} as NAME:LR, got {spec!r}")
    try:
        lr = float(rate) if rate else 0.01
    except ValueError:
        raise ConversionError(f"optimizer {spec!r}: the learning rate must be a number") from None
    cls = getattr(ef.train, OPTIMIZERS[name])
    return cls(lr, 0.9) if name == "momentum" else cls(lr)


def untie_shared(proto, trainable, tie_shared=False):
    """(model, {initializer: [names of its copies]}): `proto` (not changed) with each
    initializer in `trainable` that several main-graph node inputs read given one copy
    per reading, except those `tie_shared` names (True: all of them); see `convert`. An
    Identity of such an initializer (torch's TorchScript exporter writes `2.bias =
    Identity(0.bias)` for a deduplicated parameter) is a reading too: it becomes a copy
    under its output's name."""
    import onnx
    from onnx import numpy_helper
    nodes = list(proto.graph.node)
    outputs = {o.name for o in proto.graph.output}
    root = {}  # Identity output -> the trainable initializer it aliases
    for node in nodes:
        if node.op_type == "Identity" and node.output[0] not in outputs:
            source = node.input[0]
            if source in trainable or source in root:
                root[node.output[0]] = root.get(source, source)
    readings, in_subgraphs = {}, set()

    def subgraph_reads(node):
        for attr in node.attribute:
            for g in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                for inner in g.node:
                    in_subgraphs.update(root.get(n, n) for n in inner.input)
                    subgraph_reads(inner)
    for k, node in enumerate(nodes):
        subgraph_reads(node)
        if node.op_type == "Identity" and node.output[0] in root:
            readings.setdefault(root[node.output[0]], []).append((k, None))  # an alias: one reading
            continue
        for j, name in enumerate(node.input):
            if name in trainable:
                readings.setdefault(name, []).append((k, j))
    shared = {n: r for n, r in readings.items() if len(r) > 1}
    if tie_shared is True:
        return proto, {}
    tie = set(tie_shared or ())
    unknown = sorted(tie - set(shared))
    if unknown:
        raise ConversionError(f"tie_shared: {unknown} are not initializers that several nodes read "
                              f"(those are {sorted(shared)[:10]})")
    untie = {n: r for n, r in shared.items() if n not in tie and n not in in_subgraphs}
    if not untie:
        return proto, {}
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    taken = {i.name for i in model.graph.initializer} | {v for n in model.graph.node for v in
                                                        (*n.input, *n.output)}
    inits = {i.name: i for i in model.graph.initializer}
    copies, dropped = {}, set()
    for name, found in untie.items():
        value = numpy_helper.to_array(inits[name])
        # The first direct reading keeps the initializer (or, with none, the first alias).
        keep = next((r for r in found if r[1] is not None), found[0])
        for k, j in found:
            if (k, j) == keep:
                continue
            node = model.graph.node[k]
            if j is None:  # an Identity alias becomes an initializer of its own, its name
                copy = node.output[0]
                dropped.add(k)
            else:
                base = copy = f"{name}@{node.name or node.op_type + str(k)}"
                n = 1
                while copy in taken:
                    n += 1
                    copy = f"{base}:{n}"
                taken.add(copy)
                node.input[j] = copy
            model.graph.initializer.append(numpy_helper.from_array(value, copy))
            copies.setdefault(name, []).append(copy)
    # Each Identity alias that became an initializer is dropped.
    kept = [n for k, n in enumerate(model.graph.node) if k not in dropped]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model, copies


def _convert_trainable(src, dst, quantize, progress, loss, optimizer, freeze, tie_shared=False):
    import numpy as np
    import edgeflow as ef
    from onnx import numpy_helper
    from edgeflow.graph.optimize import fold_constants, fuse_swish

    check_quantize(quantize)
    if loss not in ("cross_entropy", "mse"):
        raise ConversionError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}")
    proto = load(src)
    names = {init.name for init in proto.graph.initializer}
    unknown = sorted(set(freeze) - names)
    if unknown:
        raise ConversionError(f"--freeze: no initializer named {unknown}; the model has "
                              f"{sorted(names)[:10]}{' ...' if len(names) > 10 else ''}")
    # A first pass finds the initializers read as values (shapes, scales): those stay constants.
    *_, ctx = to_graph(proto)
    trainable = {init.name for init in proto.graph.initializer
                 if init.name not in freeze and init.name not in ctx.values_read
                 and numpy_helper.to_array(init).dtype.kind == "f"}
    proto, copies = untie_shared(proto, trainable, tie_shared)
    trainable |= {c for names in copies.values() for c in names}
    graph, inputs, outputs, _ = to_graph(proto, progress, variables=trainable)
    fuse_swish(graph, {"infer": (inputs, outputs)})  # before the gradients: they differentiate swish
    first_name, first = next(iter(outputs.items()))
    with graph.as_default():
        if loss == "cross_entropy":
            labels = ef.placeholder(ef.int64, [first.shape[0]], name="labels")
            objective = ef.losses.softmax_cross_entropy(labels, first)
        else:
            labels = ef.placeholder(first.dtype, first.shape, name="labels")
            objective = ef.losses.mean_squared_error(labels, first)
        objective = ef.add(objective, np.zeros((), first.dtype), name="loss")
        train_op = make_optimizer(optimizer).minimize(objective)
    signatures = {"infer": (inputs, outputs),
                  "train": ({**inputs, "labels": labels}, {"loss": objective}, [train_op])}
    signatures = fold_constants(graph, signatures)
    result = _package(graph, signatures, f"trainable, converted from ONNX (loss {loss}, optimizer "
                      f"{optimizer}, {len(trainable)} variables)", proto, dst, quantize)
    for name, names in copies.items():
        result.notes.append(f"initializer {name!r} is read by {len(names) + 1} nodes: {len(names) + 1} "
                            f"variables ({name!r}, {', '.join(map(repr, names))}); --tie-shared-weights "
                            f"{name} keeps one")
    return result
