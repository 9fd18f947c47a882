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
    initializers holding its outputs; the same model when there is none. Initializers
    named in `variables` (trainable weights) are not constants here."""
    from onnx import numpy_helper
    known = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name not in variables}
    known[""] = None  # an omitted optional input
    opset = {o.domain or "": o.version for o in model.opset_import}
    folded = {}  # index of an unsupported node -> its outputs' values
    for index, node in enumerate(model.graph.node):
        if not _foldable(node, known):
            continue
        values = _evaluate(node, [known[name] for name in node.input], opset)
        if values is None:
            continue
        known.update(zip(node.output, values))
        if node.op_type not in supported:
            folded[index] = values
    return _replace(model, folded) if folded else model


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
        return [np.asarray(v) for v in session.run(None, feeds)]
    except Exception:  # an op or variant the reference evaluator lacks: left to the handlers
        return None


def _replace(model, folded):
    from onnx import ModelProto, numpy_helper
    out = ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(n for i, n in enumerate(model.graph.node) if i not in folded)
    for index, values in folded.items():
        for name, value in zip(model.graph.node[index].output, values):
            if name:
                out.graph.initializer.append(numpy_helper.from_array(value, name))
    return out
