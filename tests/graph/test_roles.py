"""The "edgeflow.roles" metadata: which forward op each backward op differentiates and
which variable each optimizer op updates (what a split of a training graph needs)."""
import json

import pytest

import edgeflow as ef
from edgeflow.format.metadata import ROLES as ROLES_METADATA
from edgeflow.interp.plan import needed_operators


@pytest.mark.parametrize("optimizer", [lambda: ef.train.GradientDescent(0.1), lambda: ef.train.Adam(0.01)])
def test_roles_of_a_training_graph(optimizer):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        h = ef.layers.dense(x, 8, activation=ef.nn.relu, name="fc1")
        logits = ef.layers.dense(h, 3, name="fc2")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        step = optimizer().minimize(loss)
    model = ef.to_model(g, {"train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    sub = model.subgraphs[0]
    roles = json.loads(bytes(model.metadata[ROLES_METADATA]).decode())
    grad = {int(k): v for k, v in roles["grad"].items()}
    update = {int(k): v for k, v in roles["update"].items()}
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    loss_index = model.signatures[0].outputs["loss"]
    forward = set(needed_operators(sub, [loss_index], producer))
    train = set(needed_operators(sub, [loss_index], producer, model.signatures[0].targets))
    # Forward ops have no role; every other op of the train step is a gradient or an
    # update (the restore signature's assigns are neither).
    assert not forward & (set(grad) | set(update))
    assert train == forward | set(grad) | set(update)
    # Each gradient op belongs to a forward op (or a variable: the sum of its parts).
    assert all((v in forward) if v >= 0 else sub.tensors[-1 - v].is_variable for v in grad.values())
    names = {sub.operators[i].outputs[0]: i for i in forward}
    fc2 = next(i for t, i in names.items() if sub.tensors[t].name == "fc2/matmul")
    assert sum(1 for v in grad.values() if v == fc2) >= 2  # d/d input and d/d kernel
    # Each write of the train step updates the variable it writes, or writes one of that
    # variable's optimizer slots (Adam's m, v, step), which live with it.
    weights = {i for i, t in enumerate(sub.tensors) if t.is_variable and t.name.count("/") == 1}
    writes = [i for i in train if sub.operators[i].opcode.startswith("assign")]
    assert writes and all(i in update for i in writes)
    for i in writes:
        target = sub.operators[i].inputs[0]
        assert update[i] == target if target in weights else update[i] in weights
    updated = {sub.tensors[v].name for v in update.values()}
    assert updated == {"fc1/kernel", "fc1/bias", "fc2/kernel", "fc2/bias"}


def test_inference_graphs_have_no_roles():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 2], name="x")
        y = ef.exp(x, name="y")
    assert ROLES_METADATA not in ef.to_model(g, {"infer": ({"x": x}, {"y": y})}).metadata
