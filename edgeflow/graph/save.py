"""Package a graph as a `.efl` model: only what the signatures need, weights included."""
from ..errors import GraphError
from ..format import model as fm
from .graph import CONST, PLACEHOLDER, Tensor


def _check_signature(key, sig):
    if not isinstance(sig, (tuple, list)) or len(sig) not in (2, 3):
        raise GraphError(f"signature {key!r}: expected (inputs, outputs) dicts of name -> Tensor")
    inputs, outputs = sig[0], sig[1]
    for kind, mapping in (("input", inputs), ("output", outputs)):
        for name, t in mapping.items():
            if not isinstance(t, Tensor):
                raise GraphError(f"signature {key!r}: {kind} {name!r} is not a Tensor but {t!r}")
    for name, t in inputs.items():
        if t.node.op != PLACEHOLDER:
            raise GraphError(f"signature {key!r}: input {name!r} must be a placeholder, "
                             f"got the output of {t.node.op} {t.node.name!r}")
    return inputs, outputs


def _needed_nodes(outputs):
    """Nodes the outputs depend on, in graph (hence topological) order."""
    seen, todo = set(), [t.node for t in outputs]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(t.node for t in node.inputs)
    return seen


def to_model(graph, signatures, description=""):
    """A ModelDef with one subgraph holding everything the signatures need."""
    if not signatures:
        raise GraphError("save: give at least one signature, e.g. {'infer': ({'x': x}, {'y': y})}")
    checked = {key: _check_signature(key, sig) for key, sig in signatures.items()}
    for key, (inputs, outputs) in checked.items():
        fed = {t.node for t in inputs.values()}
        for node in _needed_nodes(list(outputs.values())):
            if node.op == PLACEHOLDER and node not in fed:
                raise GraphError(f"signature {key!r}: its outputs need placeholder {node.name!r}, "
                                 f"which is not among its inputs {sorted(inputs)}")
    every_output = [t for _, outs in checked.values() for t in outs.values()]
    needed = _needed_nodes(every_output)
    needed |= {t.node for ins, _ in checked.values() for t in ins.values()}

    tensors, index, operators = [], {}, []
    for node in graph.nodes:
        if node not in needed:
            continue
        for t in node.outputs:
            index[t] = len(tensors)
            data = node.attrs["value"] if node.op == CONST else None
            shape = tuple(-1 if d is None else d for d in t.shape)
            tensors.append(fm.TensorDef(t.name, t.dtype, shape, data))
        if node.op not in (CONST, PLACEHOLDER):
            operators.append(fm.OperatorDef(node.op, [index[t] for t in node.inputs],
                                            [index[t] for t in node.outputs], dict(node.attrs),
                                            node.device))

    def unique(ts):
        return list(dict.fromkeys(index[t] for t in ts))

    sub = fm.SubGraphDef(
        "main", tensors, operators,
        inputs=unique(t for ins, _ in checked.values() for t in ins.values()),
        outputs=unique(every_output))
    sigs = [fm.SignatureDef(key, {n: index[t] for n, t in ins.items()},
                            {n: index[t] for n, t in outs.items()})
            for key, (ins, outs) in checked.items()]
    return fm.ModelDef([sub], sigs, description=description)


def save(graph, path, signatures, description=""):
    """Write `graph` to `path` as a `.efl` file with these signatures.

    `signatures` maps a key ("infer", ...) to `(inputs, outputs)`, each a dict of
    signature name -> Tensor. The write is atomic.
    """
    from ..format import writer
    writer.write(to_model(graph, signatures, description), path)
