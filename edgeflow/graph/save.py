"""Package a graph as a `.efl` model: only what the signatures need, weights included.

A signature is `(inputs, outputs)` or `(inputs, outputs, targets)`: dicts of name ->
Tensor, and a list of Operations run for their effect (a train op). When the model
holds variables, `save` (variables out) and `restore` (variables in) signatures are
added, as in LiteRT's on-device training. The graph's summaries (ef.summary) become
outputs of the `train` signature.
"""
from ..errors import GraphError
from ..format import model as fm
from .control import Body
from .graph import CONST, PLACEHOLDER, Node, Tensor
from .variables import VARIABLE, Operation



def _targets(key, sig):
    targets = list(sig[2]) if len(sig) == 3 else []
    nodes = []
    for t in targets:
        if isinstance(t, Operation):
            nodes.extend(t.nodes)
        elif isinstance(t, Node):
            nodes.append(t)
        else:
            raise GraphError(f"signature {key!r}: targets must be Operations, got {t!r}")
    return nodes


def _check_signature(key, sig):
    if not isinstance(sig, (tuple, list)) or len(sig) not in (2, 3):
        raise GraphError(f"signature {key!r}: expected (inputs, outputs[, targets]) with dicts of "
                         "name -> Tensor and a list of Operations")
    inputs, outputs = sig[0], sig[1]
    for kind, mapping in (("input", inputs), ("output", outputs)):
        for name, t in mapping.items():
            if not isinstance(t, Tensor):
                raise GraphError(f"signature {key!r}: {kind} {name!r} is not a Tensor but {t!r}")
    for name, t in inputs.items():
        if t.node.op != PLACEHOLDER:
            raise GraphError(f"signature {key!r}: input {name!r} must be a placeholder, "
                             f"got the output of {t.node.op} {t.node.name!r}")
    return inputs, outputs, _targets(key, sig)


def needed_nodes(outputs, targets=()):
    """Nodes the outputs and target nodes depend on (targets included)."""
    seen, todo = set(), [t.node for t in outputs] + list(targets)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(t.node for t in node.inputs)
    return seen


def check_fed(key, inputs, outputs, targets):
    fed = {t.node for t in inputs.values()}
    missing = sorted(n.name for n in needed_nodes(list(outputs.values()), targets)
                     if n.op == PLACEHOLDER and n not in fed)
    if missing:
        raise GraphError(f"signature {key!r}: its outputs need placeholder(s) {missing}, which "
                         f"are not among its inputs {sorted(inputs)}")


def to_model(graph, signatures, description="", state_signatures=True):
    """A ModelDef with one subgraph holding everything the signatures need."""
    if not signatures:
        raise GraphError("save: give at least one signature, e.g. {'infer': ({'x': x}, {'y': y})}")
    from .summary import attach
    checked = {key: _check_signature(key, sig) for key, sig in signatures.items()}
    checked, summaries = attach(graph, checked)  # ef.summary's: outputs of `train`
    for key, sig in checked.items():
        check_fed(key, *sig)
    needed = set()
    for inputs, outputs, targets in checked.values():
        needed |= needed_nodes(list(outputs.values()), targets) | {t.node for t in inputs.values()}

    subgraphs = _Subgraphs()
    tensors, index, operators, op_index = _lower(graph.nodes, needed, subgraphs)
    from ..format.metadata import summaries_entry
    metadata = {**_roles(op_index, index, graph.gradient_of), **summaries_entry(summaries)}
    sigs = [fm.SignatureDef(key, {n: index[t] for n, t in ins.items()},
                            {n: index[t] for n, t in outs.items()},
                            targets=list(dict.fromkeys(op_index[n] for n in targets)))
            for key, (ins, outs, targets) in checked.items()]
    variables = [i for i, t in enumerate(tensors) if t.is_variable]
    if state_signatures and variables:
        if fm.SAVE in checked or fm.RESTORE in checked:
            raise GraphError(f"signatures {fm.SAVE!r} and {fm.RESTORE!r} are made for models with variables")
        sigs += _state_signatures(tensors, operators, variables)
    inputs = list(dict.fromkeys(i for s in sigs for i in s.inputs.values()))
    outputs = list(dict.fromkeys(i for s in sigs for i in s.outputs.values()))
    return fm.ModelDef([fm.SubGraphDef("main", tensors, operators, inputs, outputs)] + subgraphs.defs, sigs,
                       metadata=metadata, description=description)


def _lower(nodes, needed, subgraphs):
    """(tensors, tensor index, operators, operator index) of the `needed` nodes, in order;
    the bodies control-flow ops run become subgraphs (their attrs: indices)."""
    tensors, index, operators, op_index = [], {}, [], {}
    for node in nodes:
        if node not in needed:
            continue
        for t in node.outputs:
            index[t] = len(tensors)
            data = {CONST: "value", VARIABLE: "initial"}.get(node.op)
            shape = tuple(-1 if d is None else d for d in t.shape)
            tensors.append(fm.TensorDef(t.name, t.dtype, shape, node.attrs[data] if data else None,
                                        is_variable=node.op == VARIABLE))
        if node.op not in (CONST, PLACEHOLDER, VARIABLE):
            op_index[node] = len(operators)
            attrs = {k: subgraphs.index(v) if isinstance(v, Body) else v for k, v in node.attrs.items()}
            operators.append(fm.OperatorDef(node.op, [index[t] for t in node.inputs],
                                            [index[t] for t in node.outputs], attrs, node.device))
    return tensors, index, operators, op_index


class _Subgraphs:
    """The subgraphs after the main one: each Body that an op runs, lowered once."""

    def __init__(self):
        self.defs, self._index = [], {}

    def index(self, body):
        if id(body) not in self._index:
            self._index[id(body)] = (len(self.defs) + 1, body)  # the body kept alive: ids stay unique
            self.defs.append(None)
            needed = needed_nodes(body.outputs) | {t.node for t in body.inputs}
            tensors, index, operators, _ = _lower(body.nodes, needed, self)
            self.defs[self._index[id(body)][0] - 1] = fm.SubGraphDef(
                body.name, tensors, operators, [index[t] for t in body.inputs], [index[t] for t in body.outputs])
        return self._index[id(body)][0]


def _roles(op_index, index, gradient_of):
    """The "edgeflow.roles" metadata entry (edgeflow.format.metadata.Roles): for each
    backward op, the forward op it differentiates; for each optimizer op, the variable it
    updates; each variable's gradient tensor. Empty for graphs without gradients."""
    from ..format import metadata
    grad, update = {}, {}
    for node, i in op_index.items():
        if node.role is None:
            continue
        kind, of = node.role
        if kind == "update":
            update[i] = index[of.outputs[0]]
        elif of in op_index:
            grad[i] = op_index[of]
        elif of is not None and of.outputs and of.outputs[0] in index:
            grad[i] = -1 - index[of.outputs[0]]
    gradients = {index[v.outputs[0]]: index[g] for v, g in gradient_of.items()
                 if v.outputs[0] in index and g in index}
    return metadata.roles_entry(grad, update, gradients)


def _state_signatures(tensors, operators, variables):
    """`save`: every variable out; `restore`: every variable in, through assign ops."""
    restore_in, targets = {}, []
    for v in variables:
        var = tensors[v]
        restore_in[var.name] = len(tensors)
        tensors.append(fm.TensorDef(f"{fm.RESTORE}/{var.name}", var.dtype, var.shape))
        targets.append(len(operators))
        operators.append(fm.OperatorDef("assign", [v, restore_in[var.name]], [], {}))
    return [fm.SignatureDef(fm.SAVE, {}, {tensors[v].name: v for v in variables}),
            fm.SignatureDef(fm.RESTORE, restore_in, {}, targets=targets)]


def save(graph, path, signatures, description=""):
    """Write `graph` to `path` as a `.efl` file with these signatures.

    `signatures` maps a key ("infer", "train", ...) to `(inputs, outputs)` or
    `(inputs, outputs, targets)`. The write is atomic.
    """
    from ..format import writer
    writer.write(to_model(graph, signatures, description), path)
