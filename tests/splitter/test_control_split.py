"""A model with a loop, split: the loop is one op of the main graph, so it runs wholly on
one side with its subgraphs (one round trip per call, never one per iteration), and the
cost model counts its body once per iteration."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cloud import CloudDelegate
from edgeflow.format import reader
from edgeflow.splitter import partition
from edgeflow.splitter.cost_graph import CostGraph

from .test_partition import InProcess

STEPS, WIDTH = 6, 32


@pytest.fixture(scope="module")
def loop_model(tmp_path_factory):
    rng = np.random.default_rng(0)
    w_in = rng.standard_normal((8, WIDTH)).astype(np.float32) * 0.3
    u = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.2
    w_out = rng.standard_normal((WIDTH, 3)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        h = ef.nn.relu(ef.matmul(x, ef.constant(w_in)), name="h")
        _, r = ef.while_loop(lambda i, s: i < STEPS, lambda i, s: (i + 1, ef.tanh(ef.matmul(s, ef.constant(u))) + s),
                             [ef.constant(0), h], name="rnn")
        y = ef.matmul(r, ef.constant(w_out), name="y")
    path = tmp_path_factory.mktemp("loop") / "m.efl"
    ef.save(g, path, {"infer": ({"x": x}, {"y": y})})

    def reference(xv):
        s = np.maximum(xv @ w_in, 0)
        for _ in range(STEPS):
            s = np.tanh(s @ u) + s
        return s @ w_out
    return path, reference


def test_the_cost_model_counts_the_body_once_per_iteration(loop_model):
    path, _ = loop_model
    interp = ef.Interpreter(path)
    interp.get_signature_runner("infer")(x=np.ones((4, 8), np.float32))  # the loop's trip count is seen
    graph = CostGraph.from_model(interp, input_shapes={"x": (4, 8)})
    loop = next(op for op in graph.ops if op.opcode == "while")
    assert loop.flops >= STEPS * 2 * 4 * WIDTH * WIDTH  # STEPS matmuls of [4, 32] x [32, 32], at least
    assert loop.flops < STEPS * 2 * 4 * WIDTH * WIDTH * 1.2


@pytest.mark.parametrize("loop_side", ["device", "cloud"])
@pytest.mark.parametrize("graphs", [("full", "full"), ("cut", "cut")])
def test_a_split_loop_runs_on_one_side_in_one_round_trip(loop_model, loop_side, graphs, tmp_path):
    path, reference = loop_model
    model = reader.load(path)
    cut = partition.Cut(model, set())
    main = model.subgraphs[0]
    loop = next(i for i in cut.ops if main.operators[i].opcode == "while")
    before = {i for i in cut.ops if i < loop}
    device = before | ({loop} if loop_side == "device" else set())
    made, sha = partition.write_pair(model, device, tmp_path, model_id="loop", device_graph=graphs[0],
                                     cloud_graph=graphs[1])
    cloud = InProcess(tmp_path / "cloud.efl")
    runner = ef.Interpreter(tmp_path / "device.efl", delegates=[CloudDelegate(cloud)]).get_signature_runner("infer")
    xv = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(runner(x=xv)["y"], reference(xv), rtol=1e-4, atol=1e-5)
    assert len(cloud.requests) == 1  # the loop's iterations stay on their side
    assert (loop in made.cloud) == (loop_side == "cloud")
