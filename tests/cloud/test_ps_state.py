"""A parameter server's state of one model (edgeflow/cloud/ps/state.py), without gRPC:
sync aggregation against numpy, and the exactly-once table of devices' steps."""
import subprocess
import sys

import numpy as np

import edgeflow as ef
from edgeflow.cloud.ps.state import (RESULT_APPLIED, RESULT_DROPPED, RESULT_PENDING, HostedParameters,
                                     Settings)
from edgeflow.format import writer

W0 = np.array([[0.5, -1.0], [0.25, 0.0], [-0.5, 1.5]], np.float32)
LR = 0.1


def sgd_package():
    """pred = x @ w (w in the cloud), MSE loss, plain gradient descent."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        y = ef.placeholder(ef.float32, [None, 2], name="y")
        with ef.device("cloud"):
            w = ef.Variable(W0, name="w")
            pred = ef.matmul(x, w)
            step = ef.train.GradientDescent(LR).minimize(ef.losses.mean_squared_error(y, pred))
    return bytes(writer.to_bytes(ef.to_model(g, {"train": ({"x": x, "y": y}, {}, [step])})))


def hosted(mode, replicas=1):
    return HostedParameters("m", sgd_package(), "<bytes>", Settings(mode=mode, replicas=replicas))


def grad(k):
    return {"w": np.full((3, 2), k, np.float32) + np.arange(6, dtype=np.float32).reshape(3, 2)}


def test_the_state_imports_no_grpc():
    code = "import sys, edgeflow.cloud.ps.state; print(sorted(m for m in sys.modules if 'grpc' in m or 'protobuf' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_sync_step_is_the_sample_weighted_mean_and_each_push_counts_once():
    state = hosted("sync", replicas=2)
    first = state.push("a", 0, 0, 1, grad(1))
    assert first["result"] == RESULT_PENDING and state.version == 0
    assert state.push("a", 0, 0, 1, grad(100)) == {**first, "duplicate": True}  # a retry: ignored
    applied = state.push("b", 0, 0, 3, grad(2))
    assert applied["result"] == RESULT_APPLIED and state.version == 1 and state.updates == 1
    want = W0 - LR * (1 * grad(1)["w"] + 3 * grad(2)["w"]) / 4  # SGD on the weighted mean, in numpy
    np.testing.assert_allclose(state.values(["w"])["w"], want, rtol=1e-6)
    # a's retry now learns the step was applied; b's retry changes nothing
    assert state.push("a", 0, 0, 1, grad(1))["result"] == RESULT_APPLIED
    assert state.push("b", 0, 0, 3, grad(2)) == {**applied, "duplicate": True}
    stale = state.push("a", 1, 0, 1, grad(1))  # computed from version 0, the server is at 1
    assert stale["result"] == RESULT_DROPPED and "stale" in stale["reason"]
    np.testing.assert_allclose(state.values(["w"])["w"], want, rtol=1e-6)
    status = state.status()
    assert (status["version"], status["updates_applied"], status["duplicates"], status["dropped"]) == (1, 1, 3, 1)
    assert {d: s["applied"] for d, s in status["devices"].items()} == {"a": 1, "b": 1}


def test_async_steps_follow_each_other_per_device():
    state = hosted("async")
    assert state.push("a", 0, 0, 1, grad(1))["result"] == RESULT_APPLIED
    gap = state.push("a", 2, 1, 1, grad(1))
    assert gap["result"] == RESULT_DROPPED and "resume from step 1" in gap["reason"] and gap["last_step_id"] == 0
    assert state.push("a", 0, 0, 1, grad(5))["duplicate"]
    assert state.push("b", 0, 0, 1, grad(2))["staleness"] == 1  # one update since its values
    want = W0 - LR * grad(1)["w"] - LR * grad(2)["w"]
    np.testing.assert_allclose(state.values(["w"])["w"], want, rtol=1e-6)
    assert state.version == 2 and state.last_step("a") == 0 and state.last_step("c") == -1
