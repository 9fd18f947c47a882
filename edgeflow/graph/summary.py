"""`ef.summary`: values to log while training, as TensorFlow 1.x's tf.summary.

    loss = ef.losses.softmax_cross_entropy(labels, logits)
    ef.summary.scalar("accuracy", ef.reduce_mean(ef.cast(ef.equal(ef.argmax(logits, 1), labels), ef.float32)))
    ef.summary.histogram("logits", logits)
    ef.save(g, "m.efl", {"train": ({"x": x, "labels": labels}, {"loss": loss}, [step])})

Packaging (`ef.save`, `ef.to_model`) adds each summary to the `train` signature as an
output of its name and records which outputs are summaries, and of what kind, in the
package's "edgeflow.summaries" metadata (edgeflow.format.metadata.summaries). The
training loop's logger (`edgeflow train --logdir`, edgeflow/tensorboard.py) logs scalars
at every step and histograms every N steps; a package without a `train` signature
carries no summary. Optimizers add their learning rate as the scalar "learning_rate"
(`add_learning_rate`), to the `train` signatures that run their updates.
"""
from typing import NamedTuple

from ..errors import GraphError
from .graph import PLACEHOLDER, convert_to_tensor

TRAIN = "train"  # the signature summaries become outputs of

__all__ = ["scalar", "histogram"]


class Summary(NamedTuple):
    """A summary of a graph: its kind ("scalar" or "histogram"), its tensor, the nodes it
    goes with (a learning rate goes only into signatures that run its optimizer's updates;
    none: into every `train` signature), and the optimizer that added it, if one did."""
    kind: str
    tensor: object
    nodes: tuple = ()
    owner: object = None


def scalar(name, tensor):
    """Log `tensor`, which holds one value, as scalar `name` at every train step; the
    tensor is returned."""
    tensor = convert_to_tensor(tensor)
    if any(d != 1 for d in tensor.shape):
        raise GraphError(f"ef.summary.scalar({name!r}): expected a tensor of one value (shape () or "
                         f"all dimensions 1), got {tensor!r}")
    return _add(name, "scalar", tensor)


def histogram(name, tensor):
    """Log a histogram of `tensor`'s values as `name` every N train steps (`edgeflow train
    --histogram-every N`); the tensor is returned."""
    return _add(name, "histogram", tensor)


def _add(name, kind, tensor):
    from .control import Body
    if not isinstance(name, str) or not name:
        raise GraphError(f"ef.summary.{kind}: the name must be a non-empty string, got {name!r}")
    tensor = convert_to_tensor(tensor)
    graph = tensor.graph
    if isinstance(graph, Body):
        raise GraphError(f"ef.summary.{kind}({name!r}): {tensor.name!r} is a tensor of the subgraph "
                         f"{graph.name!r} (a cond branch or loop body); summarize a value of the main graph")
    known = graph.summaries.get(name)
    if known is not None and (known.tensor is not tensor or known.kind != kind):
        raise GraphError(f"ef.summary.{kind}({name!r}): the graph already has a {known.kind} summary "
                         f"{name!r} of {known.tensor.name!r}")
    graph.summaries[name] = Summary(kind, tensor)
    return tensor


def add_learning_rate(graph, learning_rate, nodes, optimizer):
    """Record `learning_rate` (a scalar Tensor of `graph`) as the scalar summary
    "learning_rate" of the `train` signatures that run `nodes` (`optimizer`'s updates):
    one summary per optimizer, "learning_rate_1", ... for the graph's other optimizers."""
    for name, s in graph.summaries.items():
        if s.owner is optimizer:
            graph.summaries[name] = s._replace(nodes=s.nodes + tuple(nodes))
            return name
    name, k = "learning_rate", 0
    while name in graph.summaries:
        k += 1
        name = f"learning_rate_{k}"
    graph.summaries[name] = Summary("scalar", learning_rate, tuple(nodes), optimizer)
    return name


def attach(graph, checked):
    """The checked signatures ({key: (inputs, outputs, target nodes)}) with the graph's
    summaries added to the outputs of `train`, and {key: {output name: kind}} for the
    package's "edgeflow.summaries" entry. GraphError if a summary needs a placeholder the
    signature does not take, or its name is an output of another tensor."""
    from .save import needed_nodes
    if TRAIN not in checked or not graph.summaries:
        return checked, {}
    inputs, outputs, targets = checked[TRAIN]
    outputs, kinds = dict(outputs), {}
    runs = needed_nodes(list(outputs.values()), targets)
    fed = {t.node for t in inputs.values()}
    for name, s in graph.summaries.items():
        if s.nodes and not any(n in runs for n in s.nodes):
            continue  # another optimizer's learning rate
        if name in outputs and outputs[name] is not s.tensor:
            raise GraphError(f"summary {name!r}: the {TRAIN!r} signature's output {name!r} is another "
                             f"tensor ({outputs[name].name!r}); give the summary another name")
        missing = sorted(n.name for n in needed_nodes([s.tensor]) if n.op == PLACEHOLDER and n not in fed)
        if missing:
            raise GraphError(f"summary {name!r} needs placeholder(s) {missing}, which the {TRAIN!r} "
                             f"signature does not take (its inputs: {sorted(inputs)})")
        outputs[name], kinds[name] = s.tensor, s.kind
    return {**checked, TRAIN: (inputs, outputs, targets)}, {TRAIN: kinds}
