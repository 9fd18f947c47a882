"""Constant folding before the coverage check: a node edgeflow has no handler for is no
obstacle when all its inputs are constants (exporters emit such nodes: torch's
TorchScript exporter computes attention's head sizes with Mod on Constants). ONNX's
reference evaluator computes those nodes once, and their outputs become initializers,
so only what remains must be supported.
"""
import numpy as np

# Ops whose outputs are not a function of their inputs, or that run subgraphs.
_NOT_FOLDABLE = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}
MAX_ELEMENTS = 1 << 24  # inputs larger than this are not evaluated at conversion time


def fold_unsupported(model, supported, variables=()):
    """`model` with every node whose op type is not in `supported` but whose inputs are
    all constant (initializers, Constant nodes, nodes computed from them) replaced by
    initializers holding its outputs, inside subgraphs too (where the constants of
    enclosing graphs count); the same model when there is none. Initializers named in
    `variables` (trainable weights) are not constants here."""
    from onnx import ModelProto, numpy_helper
    known = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name not in variables}
    known[""] = None  # an omitted optional input
    opset = {o.domain or "": o.version for o in model.opset_import}
    graph = _fold(model.graph, known, supported, opset)
    if graph is model.graph:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(graph)
    return out


def _fold(graph, known, supported, opset, subgraph=False):
    """GraphProto `graph` folded (the same object when nothing folds); `known`: the
    values of the constants it can see, updated with those it computes."""
    from onnx import numpy_helper
    if subgraph:
        for vi in graph.input:  # a subgraph's inputs hide enclosing names
            known.pop(vi.name, None)
        known.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    nodes, initializers, changed = [], [], False
    for node in graph.node:
        inner = [(a, _fold(a.g, dict(known), supported, opset, True)) for a in node.attribute if a.HasField("g")]
        if any(g is not a.g for a, g in inner):
            node = _with_graphs(node, {a.name: g for a, g in inner})
            changed = True
        values = _evaluate(node, [known[name] for name in node.input], opset) if _foldable(node, known) else None
        if values is None:
            nodes.append(node)
            continue
        known.update(zip(node.output, values))
        if node.op_type in supported:
            nodes.append(node)
            continue
        initializers += [numpy_helper.from_array(value, name) for name, value in zip(node.output, values) if name]
        changed = True
    if not changed:
        return graph
    out = type(graph)()
    out.CopyFrom(graph)
    del out.node[:]
    out.node.extend(nodes)
    out.initializer.extend(initializers)
    return out


def _with_graphs(node, graphs):
    """NodeProto `node` with the GraphProto attributes named in `graphs` replaced."""
    out = type(node)()
    out.CopyFrom(node)
    for a in out.attribute:
        if a.name in graphs:
            a.g.CopyFrom(graphs[a.name])
    return out


def _foldable(node, known):
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDABLE:
        return False
    if any(a.g.node or a.graphs for a in node.attribute):
        return False
    if not all(name in known for name in node.input):
        return False
    return sum(np.size(known[name]) for name in node.input if name) <= MAX_ELEMENTS


def _evaluate(node, inputs, opset):
    """The node's output arrays, or None where ONNX's reference evaluator cannot run it."""
    from onnx.reference import ReferenceEvaluator
    try:
        session = ReferenceEvaluator(node, opsets=opset)
        feeds = {name: value for name, value in zip(node.input, inputs) if name}
        values = session.run(None, feeds)
    except Exception:  # an op or variant the reference evaluator lacks: left to the handlers
        return None
    if any(isinstance(v, (list, tuple)) or v is None for v in values):
        return None  # sequences and optionals: left to the handlers
    return [np.asarray(v) for v in values]
