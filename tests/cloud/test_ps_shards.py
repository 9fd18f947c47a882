"""Which parameter-server shard holds which variable (edgeflow/cloud/ps/shards.py): every
served variable in one shard, each shard's update closed, variables whose updates share
state together, shards balanced by bytes, the same answer every time."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cloud.ps import TrainingRoles
from edgeflow.cloud.ps.shards import assign, groups, nbytes
from edgeflow.errors import GraphError
from edgeflow.format import writer


class Anchored(ef.train.Optimizer):
    """SGD whose every update reads the first variable it updates (the anchor) and a step
    counter they all share: their updates share state."""

    def __init__(self, learning_rate):
        super().__init__(learning_rate, "Anchored")
        self.anchor = self.count = None

    def _updates(self, grad, var):
        if self.anchor is None:
            self.anchor = var
            self.count = ef.Variable(np.float32(0), name="anchored_count", trainable=False)
        t = self.count + 1.0
        scale = 1.0 / (t * (1.0 + ef.reduce_mean(self.anchor * self.anchor)))
        return [self.count.assign(t), var.assign_sub(self._lr(var) * scale * grad)]


def roles_of(hidden=16, widths=(), coupled=True):
    """x -> dense(hidden) [Adam] -> dense(w) for w in widths [Adam] -> dense(4) [Anchored if
    coupled, else Adam]: every variable in the cloud."""
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        with ef.device("cloud"):
            h = ef.layers.dense(x, hidden, activation=ef.nn.relu, name="first")
            for k, width in enumerate(widths):
                h = ef.layers.dense(h, width, activation=ef.nn.relu, name=f"mid{k}")
            logits = ef.layers.dense(h, 4, name="last")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        with ef.device("cloud"):
            adam = ef.train.Adam(0.01)
            grads = adam.compute_gradients(loss)
            last = [(gr, v) for gr, v in grads if v.node.name.startswith("last")]
            rest = [(gr, v) for gr, v in grads if not v.node.name.startswith("last")]
            step = ef.group(adam.apply_gradients(rest), (Anchored(0.1) if coupled else ef.train.Adam(0.01))
                            .apply_gradients(last))
    model = ef.to_model(g, {"train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    return TrainingRoles(ef.Interpreter(bytes(writer.to_bytes(model))).model)


@pytest.fixture(scope="module")
def coupled():
    return roles_of()


def test_variables_whose_updates_share_state_are_grouped(coupled):
    names = coupled.served()
    last = [n for n in names if n.startswith("last")]
    assert len(last) == 2 and coupled.slots_of(last[1:]) == ["anchored_count"]
    with pytest.raises(GraphError, match="reads variable"):  # the bias's update reads the kernel
        coupled.check_update_closed(last[1:])
    assert groups(coupled, names) == [[n] for n in names if n not in last] + [last]
    independent = roles_of(coupled=False)
    assert groups(independent, independent.served()) == [[n] for n in independent.served()]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_variable_in_one_closed_shard(coupled, n):
    names = coupled.served()
    shards = assign(coupled, names, n)
    assert 1 <= len(shards) <= n and all(shards)
    assert sorted(x for shard in shards for x in shard) == sorted(names)  # each exactly once
    for shard in shards:
        assert shard == [x for x in names if x in shard]  # in the served order
        coupled.check_update_closed(shard)
    assert sum(any(x.startswith("last") for x in shard) for shard in shards) == 1  # the coupled pair: together
    assert len(shards) == min(n, len(groups(coupled, names)))


def test_the_assignment_is_deterministic_and_balanced_by_bytes():
    roles = roles_of(hidden=32, widths=(24, 16, 8, 8), coupled=False)
    names = roles.served()
    assert assign(roles, names, 3) == assign(roles_of(hidden=32, widths=(24, 16, 8, 8), coupled=False),
                                             list(names), 3)
    sizes = {x: nbytes(roles, [x]) for x in names}
    assert sizes[names[0]] == (8 * 32 * 3) * 4 + 4  # the kernel, Adam's m and v, and its step counter
    for n in (2, 3, 4):
        loads = [sum(sizes[x] for x in shard) for shard in assign(roles, names, n)]
        assert max(loads) - min(loads) <= max(sizes.values())  # greedy, largest first
        assert sum(loads) == nbytes(roles, names)
    assert max(sizes, key=sizes.get) in assign(roles, names, 2)[0]  # the largest goes first, to shard 0


def test_bad_shard_counts_are_refused(coupled):
    from edgeflow.errors import InvalidInputError
    for bad in (0, -1, 1.5, None):
        with pytest.raises(InvalidInputError):
            assign(coupled, coupled.served(), bad)
