"""A small model for the cost model's tests: x[?,8] -> matmul (pinned to the device) ->
relu -> reshape -> reduce_sum (pinned to the cloud) -> exp; and tanh of the relu."""
import numpy as np
import pytest

import edgeflow as ef

W1 = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """x[?,8] -> m1 = x @ W1 (pinned to the device) -> h = relu -> r = reshape [?,4,4] ->
    s = sum over the last axis (pinned to the cloud) -> y = exp; and z = tanh(h)."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        with ef.device("device"):
            m1 = ef.matmul(x, ef.constant(W1, name="w1"), name="m1")
        h = ef.nn.relu(m1, name="h")
        r = ef.reshape(h, [-1, 4, 4], name="r")
        with ef.device("cloud"):
            s = ef.reduce_sum(r, axis=2, name="s")
        y = ef.exp(s, name="y")
        z = ef.tanh(h, name="z")
    path = tmp_path_factory.mktemp("split") / "m.efl"
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y, "z": z})})
    return path


@pytest.fixture(scope="module")
def numpy_reference():
    """The model's outputs {"y", "z"} for an input x, computed with numpy."""
    def reference(x):
        h = np.maximum(x @ W1, 0)
        return {"y": np.exp(h.reshape(-1, 4, 4).sum(axis=2)), "z": np.tanh(h)}
    return reference
