"""Small requests go as one RunOnce message each way, larger ones stream (Run): the same
answers (conftest's numpy reference), the same checks; a server without RunOnce, or a reply
too large for one message, is asked again with Run; a server refuses a one-message request
over the limit."""
import time

import grpc
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cloud import Client, Server, client as client_module, server as server_module, wire
from edgeflow.cloud import edgeflow_pb2 as pb
from edgeflow.cloud import edgeflow_pb2_grpc as pb_grpc
from edgeflow.errors import RemoteError

from .conftest import budget_settles, reference
from .test_server import assert_malformed_reply


class Counting:
    """A client's stub, counting the calls of each method."""

    def __init__(self, stub):
        self.stub, self.calls = stub, []

    def __getattr__(self, name):
        method = getattr(self.stub, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)
        return call


def counted(client):
    client._stub = Counting(client._stub)
    return client._stub.calls


def x_of(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


def test_small_requests_go_in_one_message_and_larger_ones_stream_and_time_the_link(server):
    sample_rows = client_module.MIN_SAMPLE_BYTES // 16  # 16 bytes a row of x
    assert client_module.MIN_SAMPLE_BYTES == wire.ONE_MESSAGE_BYTES
    sequence = [(1, "RunOnce"), (sample_rows - 1, "RunOnce"), (sample_rows, "Run"), (sample_rows - 1, "RunOnce"),
                (5 * sample_rows, "Run")]
    with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        calls = counted(client)
        for rows, method in sequence:
            x = x_of(rows, rows)
            out = client.run("m", {"x": x}, ["y", "double"])
            assert calls[-1] == method, (rows, calls)
            np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-6)
            np.testing.assert_array_equal(out["double"], reference(x)["double"])
        assert [n for n, _ in client.link.up] == [16 * sample_rows, 80 * sample_rows]  # the streamed ones


def test_a_one_message_request_over_the_limit_is_refused_and_the_server_keeps_serving(server, client):
    """The client never sends one; a server refuses it (gRPC received it whole, outside the
    memory budget: the limit keeps that small)."""
    x = x_of(wire.ONE_MESSAGE_BYTES // 16 + 1)
    message = pb.RunMessage(header=pb.RunHeader(model_id="m", fetches=["double"]), tensors=list(wire.chunks("x", x)))
    e = raw_run_once(server, message)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "send them with Run" in e.details(), e
    np.testing.assert_array_equal(client.run("m", {"x": x}, ["double"])["double"], 2 * x)  # streamed


def test_cancelled_one_message_calls_give_back_what_they_reserved(model_dir):
    """Runs that take 3 ms and deadlines of 0.2 to 12 ms: calls cancelled before, while and
    after the server runs them (gRPC calls back at the cancellation, which may come before
    the handler reserves) and calls answered; none keeps its reservation."""
    server = Server(model_dir, memory_budget_bytes=1 << 30)
    run = server.backend.run

    def slow(*args, **kwargs):
        time.sleep(0.003)
        return run(*args, **kwargs)
    server.backend.run = slow
    with server, Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        x = x_of(1000)
        client.run("m", {"x": x}, ["y"])  # the plan cached
        outcomes = set()
        for k in range(60):
            try:
                client.run("m", {"x": x}, ["y", "double"], timeout=0.0002 * (1 + k % 60))
                outcomes.add("answered")
            except RemoteError as e:
                assert e.code == "DEADLINE_EXCEEDED", e
                outcomes.add(e.code)
        assert outcomes == {"answered", "DEADLINE_EXCEEDED"}
        kept = budget_settles(server, "m")
        assert server.budget.used == kept


def test_a_server_without_run_once_is_asked_with_run_from_then_on(model_dir, monkeypatch):
    monkeypatch.delattr(server_module._Servicer, "RunOnce")  # the generated base: UNIMPLEMENTED
    with Server(model_dir) as server, Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        calls = counted(client)
        for seed in range(2):
            x = x_of(2, seed)
            np.testing.assert_allclose(client.run("m", {"x": x}, ["y"])["y"], reference(x)["y"], rtol=1e-6)
        assert calls == ["RunOnce", "Run", "Run"]


def tiling_model(path, copies):
    """y = x tiled `copies` times along its rows: a small request, a large reply."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.tile(x, [copies, 1], name="y")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    return path


def test_a_reply_too_large_for_one_message_streams_for_that_model_from_then_on(tmp_path):
    copies = wire.ONE_REPLY_BYTES // 16 + 1  # one row back: just over one message's reply
    path = tiling_model(tmp_path / "tile.efl", copies)
    with Server(models={"tile": path}) as server, Client(f"127.0.0.1:{server.port}", timeout=60) as client:
        calls = counted(client)
        for seed in range(2):
            x = x_of(1, seed)
            np.testing.assert_array_equal(client.run("tile", {"x": x}, ["y"])["y"], np.tile(x, (copies, 1)))
        assert calls == ["RunOnce", "Run", "Run"]
        small = tiling_model(tmp_path / "small.efl", 2)
    with Server(models={"tile": small}) as server, Client(f"127.0.0.1:{server.port}", timeout=60) as client:
        calls = counted(client)
        x = x_of(3)
        np.testing.assert_array_equal(client.run("tile", {"x": x}, ["y"])["y"], np.tile(x, (2, 1)))
        assert calls == ["RunOnce"]


def raw_run_once(server, message):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", wire.CHANNEL_OPTIONS) as channel:
        try:
            return pb_grpc.EdgeflowStub(channel).RunOnce(message, timeout=10)
        except grpc.RpcError as e:
            return e


def test_one_message_without_a_header_or_with_a_bad_tensor_is_invalid_argument(server, client):
    e = raw_run_once(server, pb.RunMessage())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "expected a RunMessage with a RunHeader" in e.details()
    lying = pb.TensorChunk(name="x", dtype="float32", shape=[1, 4], total_bytes=12, data=bytes(12))
    e = raw_run_once(server, pb.RunMessage(header=pb.RunHeader(model_id="m", fetches=["double"]), tensors=[lying]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "expected total_bytes 16" in e.details()
    e = raw_run_once(server, pb.RunMessage(header=pb.RunHeader(model_id="nope", fetches=["y"])))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    x = x_of(2)
    np.testing.assert_allclose(client.run("m", {"x": x}, ["y"])["y"], reference(x)["y"], rtol=1e-6)


class _Liar(pb_grpc.EdgeflowServicer):
    """A server that answers RunOnce with a wrong reply."""

    def __init__(self, reply):
        self.reply = reply

    def RunOnce(self, request, context):
        return self.reply(request.header)


LIES = {
    "another request id": lambda h: pb.RunReplyMessage(header=pb.RunReplyHeader(request_id="other")),
    "no header": lambda h: pb.RunReplyMessage(tensors=[pb.TensorChunk(name="y")]),
    "a tensor cut short": lambda h: pb.RunReplyMessage(
        header=pb.RunReplyHeader(request_id=h.request_id),
        tensors=[pb.TensorChunk(name="y", dtype="float32", shape=[2], total_bytes=8, data=bytes(4))]),
    "a missing fetch": lambda h: pb.RunReplyMessage(header=pb.RunReplyHeader(request_id=h.request_id)),
}


@pytest.mark.parametrize("case", sorted(LIES))
def test_a_malformed_one_message_reply_is_a_remote_error(case):
    assert_malformed_reply(_Liar(LIES[case]))
