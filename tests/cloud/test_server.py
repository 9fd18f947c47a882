"""The server in-process on loopback: results equal numpy, every bad request gets its
status with the reason, and the server answers the next good request."""
import hashlib
import re
import socket
import threading

import numpy as np
import pytest

from edgeflow.errors import InvalidInputError, RemoteError

from .conftest import TABLE, build_model, reference

import grpc
from edgeflow.cloud import Client, Server, wire
from edgeflow.cloud import edgeflow_pb2 as pb
from edgeflow.cloud import edgeflow_pb2_grpc as pb_grpc

RNG = np.random.default_rng(0)


def x_of(n):
    return RNG.standard_normal((n, 4)).astype(np.float32)


def assert_serves(client, model_id="m"):
    """The server still answers a good request, correctly."""
    x = x_of(3)
    out = client.run(model_id, {"x": x}, ["y"])
    np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-6)


def test_results_equal_numpy(client):
    x, idx = x_of(5), np.array([4, 0, 2], np.int32)
    out = client.run("m", {"x": x, "idx": idx}, ["y", "double", "picked", "h"])
    assert list(out) == ["y", "double", "picked", "h"]
    ref = reference(x, idx)
    for name in out:
        assert out[name].dtype == ref[name].dtype
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-6)


def test_an_intermediate_fed_runs_only_the_rest(client):
    h = np.abs(x_of(2)[:, :3])  # a value h could not take from x's ops
    np.testing.assert_allclose(client.run("m", {"h": h}, "y")["y"], np.exp(-h), rtol=1e-6)


def test_a_large_tensor_round_trips_exactly_in_chunks(client):
    x = x_of((6 << 20) // 16)  # 6 MiB up, 6 MiB down: six chunks each way
    assert x.nbytes > wire.MAX_MESSAGE_BYTES and x.nbytes > 5 * wire.CHUNK_BYTES
    out = client.run("m", {"x": x}, ["double"])["double"]
    np.testing.assert_array_equal(out, x * 2)  # doubling is exact
    link = client.link
    assert link.up and link.down and link.bytes_sent >= x.nbytes and link.bytes_received >= x.nbytes


def test_list_models_skips_the_corrupt_file(client, model_dir):
    models = client.list_models()
    assert sorted(models) == ["m", "renamed"]  # corrupt.efl skipped; named.efl's id from metadata
    for model_id, name in (("m", "m.efl"), ("renamed", "named.efl")):
        data = (model_dir / name).read_bytes()
        assert models[model_id]["sha256"] == hashlib.sha256(data).hexdigest()
        assert models[model_id]["file_bytes"] == len(data)
    infer = models["m"]["signatures"]["infer"]
    assert infer["inputs"] == {"x": {"tensor": "x", "dtype": "float32", "shape": (-1, 4)},
                               "idx": {"tensor": "idx", "dtype": "int32", "shape": (-1,)}}
    assert infer["outputs"]["picked"] == {"tensor": "picked", "dtype": "float32", "shape": (-1, 2)}
    assert models["m"]["description"] == "cloud test model"
    assert_serves(client, "renamed")


def test_sha256_checked_when_given(client, model_dir):
    digest = hashlib.sha256((model_dir / "m.efl").read_bytes()).hexdigest()
    x = np.ones((1, 4), np.float32)
    out = client.run("m", {"x": x}, ["y"], sha256=digest.upper())  # hex in either case
    np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-6)
    with pytest.raises(RemoteError) as e:
        client.run("m", {"x": np.ones((1, 4), np.float32)}, ["y"], sha256="0" * 64)
    assert e.value.code == "FAILED_PRECONDITION"
    assert "0" * 64 in e.value.details and digest in e.value.details
    assert_serves(client)


BAD_RUNS = {
    "unknown model": (dict(model_id="nope"), "NOT_FOUND", r"no model 'nope'; this server hosts \['m', 'renamed'\]"),
    "wrong dtype": (dict(feeds={"x": np.ones((2, 4))}), "INVALID_ARGUMENT",
                    "feed 'x': expected dtype float32 .*got float64"),
    "wrong shape": (dict(feeds={"x": np.ones((2, 5), np.float32)}), "INVALID_ARGUMENT",
                    r"feed 'x': expected shape \(\?, 4\) .*got \(2, 5\)"),
    "wrong rank": (dict(feeds={"x": np.ones(4, np.float32)}), "INVALID_ARGUMENT", "expected shape"),
    "unknown feed": (dict(feeds={"q": np.ones(2, np.float32)}), "INVALID_ARGUMENT",
                     "model 'm' has no tensor 'q'; its signatures take x: float32"),
    "unknown fetch": (dict(fetches=["nope"]), "INVALID_ARGUMENT",
                      "fetch 'nope': model 'm' has no tensor 'nope'; its signatures output"),
    "fetch twice": (dict(fetches=["y", "y"]), "INVALID_ARGUMENT", "asked for twice"),
    "no fetches": (dict(fetches=[]), "INVALID_ARGUMENT", "expected at least one fetch"),
    "feed missing": (dict(feeds={"idx": np.zeros(1, np.int32)}), "INVALID_ARGUMENT", "which no input feeds"),
    "fetch a weight": (dict(fetches=["y", "w"]), "INVALID_ARGUMENT",
                       "fetch 'w': model 'm' does not give out this tensor .*a weight"),
    "fetch a table": (dict(fetches=["table"]), "INVALID_ARGUMENT", "fetch 'table': .*does not give out"),
    "feed a weight": (dict(feeds={"x": np.ones((2, 4), np.float32), "w": np.zeros((4, 3), np.float32)}),
                      "INVALID_ARGUMENT", "feed 'w': tensor 'w' of model 'm' is a weight"),
    "index out of range": (dict(feeds={"idx": np.array([7], np.int32)}, fetches=["picked"]), "INVALID_ARGUMENT",
                           r"gather: an index is out of range \[-5, 5\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_requests_get_their_status_and_the_server_keeps_serving(client, case):
    kw, code, reason = BAD_RUNS[case]
    call = dict(model_id="m", feeds={"x": np.ones((2, 4), np.float32)}, fetches=["y"])
    call.update(kw)
    with pytest.raises(RemoteError, match=reason) as e:
        client.run(**call)
    assert e.value.code == code
    assert e.value.code in str(e.value)
    assert_serves(client)


def test_a_package_may_opt_in_to_give_out_a_weight(tmp_path):
    from edgeflow.format import metadata, writer
    model = build_model()
    model.metadata = metadata.fetchable_entry(["table"])
    writer.write(model, tmp_path / "open.efl")
    with Server(tmp_path) as server, Client(server.address, timeout=30) as client:
        np.testing.assert_array_equal(client.run("open", {}, ["table"])["table"], TABLE)
        with pytest.raises(RemoteError, match="fetch 'w': .*does not give out"):
            client.run("open", {"x": x_of(1)}, ["w"])


def test_an_unexpected_failure_is_internal_logged_and_the_server_keeps_serving(model_dir, caplog):
    with Server(models={"m": model_dir / "m.efl"}) as server, \
            Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        hosted = server.models["m"]
        working = hosted.interpreter

        def broken():
            hosted.interpreter = working  # fails once
            raise RuntimeError("disk on fire")
        hosted.interpreter = broken
        with pytest.raises(RemoteError, match=r"internal error \(RuntimeError: disk on fire\)") as e:
            client.run("m", {"x": x_of(1)}, ["y"], request_id="req-7")
        assert e.value.code == "INTERNAL"
        assert any("req-7" in r.getMessage() and r.exc_info for r in caplog.records)
        assert_serves(client)


def raw_run(server, messages, timeout=10):
    """Send these RunRequest messages as they are; the replies, or the RpcError."""
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", wire.CHANNEL_OPTIONS) as channel:
        try:
            return list(pb_grpc.EdgeflowStub(channel).Run(iter(messages), timeout=timeout))
        except grpc.RpcError as e:
            return e


def header(**kw):
    return pb.RunRequest(header=pb.RunHeader(**{"model_id": "m", "fetches": ["double"], **kw}))


def chunk(**kw):
    return pb.RunRequest(chunk=pb.TensorChunk(**kw))


MALFORMED = {
    "empty stream": ([], "expected a Run stream to start with a RunHeader"),
    "chunk first": ([chunk(name="x")], "start with a RunHeader .*got a chunk message"),
    "second header": ([header(), header()], "expected TensorChunk messages after the RunHeader"),
    "byte size lies": ([header(), chunk(name="x", dtype="float32", shape=[1, 4], total_bytes=12, data=bytes(12))],
                       r"expected total_bytes 16 \(shape \(1, 4\) of float32\), got 12"),
    "incomplete tensor": ([header(), chunk(name="x", dtype="float32", shape=[1, 4], total_bytes=16, data=bytes(8))],
                          "feed 'x' is incomplete: the stream ended after 8 of its 16 bytes"),
    "chunks out of order": ([header(), chunk(name="x", dtype="float32", shape=[1, 4], total_bytes=16, data=bytes(4)),
                             chunk(name="x", offset=8, data=bytes(8))],
                            "expected the chunk at offset 4, got one at offset 8"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_streams_get_invalid_argument(server, client, case):
    messages, reason = MALFORMED[case]
    e = raw_run(server, messages)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert re.search(reason, e.details()), e.details()
    assert_serves(client)


def test_a_message_over_the_limit_is_refused(server, client):
    data = bytes(wire.MAX_MESSAGE_BYTES + 1024)
    e = raw_run(server, [header(), chunk(name="x", dtype="uint8", shape=[len(data)], total_bytes=len(data),
                                         data=data)])
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
    assert_serves(client)


def test_a_request_over_the_server_cap_is_refused(model_dir):
    with Server(model_dir, max_request_bytes=1 << 20) as server, \
            Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        with pytest.raises(RemoteError, match=r"limit of 1048576 bytes") as e:
            client.run("m", {"x": x_of(1 << 17)}, ["y"])  # 2 MiB
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert_serves(client)


def test_a_call_past_its_deadline_is_deadline_exceeded(model_dir):
    import contextlib
    with Server(models={"m": model_dir / "m.efl"}) as server, \
            Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        hosted, release = server.models["m"], threading.Event()
        working = hosted.interpreter

        @contextlib.contextmanager
        def stuck():  # the model runs only once the client has given up
            release.wait(30)
            with working() as interp:
                yield interp
        hosted.interpreter = stuck
        try:
            with pytest.raises(RemoteError, match="no answer within the 0.2 s deadline") as e:
                client.run("m", {"x": x_of(2)}, ["y"], timeout=0.2)
            assert e.value.code == "DEADLINE_EXCEEDED"
        finally:
            release.set()
            hosted.interpreter = working
        assert_serves(client)
        with pytest.raises(InvalidInputError, match="timeout > 0"):
            client.run("m", {"x": x_of(2)}, ["y"], timeout=0)


def test_ping_and_link_measurements(client):
    seconds = client.ping()
    assert seconds > 0 and client.link.rtt_s == seconds and client.link.min_rtt_s <= seconds
    n = 256 << 10
    client.ping(payload_bytes=n)
    client.ping(reply_bytes=n)
    link = client.link
    assert link.up[-1][0] == n and link.down[-1][0] == n
    assert link.up_bytes_per_s > 0 and link.down_bytes_per_s > 0
    client.ping(payload_bytes=1000)  # too small to say anything about throughput
    assert client.link.up == link.up
    measured = client.measure(nbytes=128 << 10)
    assert len(measured.rtts) >= 3 and measured.up[-1][0] == measured.down[-1][0] == 128 << 10
    with pytest.raises(InvalidInputError, match="reply_bytes"):
        client.ping(reply_bytes=wire.MAX_PING_BYTES + 1)


def test_ping_reply_over_the_limit_is_invalid_argument(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.EdgeflowStub(channel).Ping(pb.PingRequest(reply_bytes=wire.MAX_PING_BYTES + 1), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and str(wire.MAX_PING_BYTES) in e.value.details()


def test_concurrent_clients_get_their_own_results(server, client):
    results, errors = {}, []

    def work(k):
        try:
            own = Client(f"127.0.0.1:{server.port}", timeout=60) if k % 2 else client  # shared and own
            rng = np.random.default_rng(100 + k)
            for step in range(5):
                x = rng.standard_normal((k + 1, 4)).astype(np.float32)
                results[k, step] = (x, own.run("m", {"x": x}, ["y", "h"]))
            if own is not client:
                own.close()
        except Exception as e:  # reported below, with the thread that failed
            errors.append((k, e))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 40
    for x, out in results.values():
        ref = reference(x)
        np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6)
        np.testing.assert_allclose(out["h"], ref["h"], rtol=1e-6)


def test_health(client):
    assert client.health() == "SERVING"
    assert client.health("edgeflow.v1.Edgeflow") == "SERVING"
    client.wait_ready(timeout=5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_unavailable():
    with Client(f"127.0.0.1:{free_port()}", timeout=10) as client:
        with pytest.raises(RemoteError, match="unreachable") as e:
            client.run("m", {"x": x_of(1)}, ["y"])
        assert e.value.code == "UNAVAILABLE"
        with pytest.raises(RemoteError, match="not ready after 0.3 s") as e:
            client.wait_ready(timeout=0.3)
        assert e.value.code == "UNAVAILABLE"


def test_models_given_directly_and_stop(model_dir):
    data = (model_dir / "m.efl").read_bytes()
    server = Server(models={"inline": data, "path": model_dir / "named.efl"})
    port = server.start()
    with Client(f"127.0.0.1:{port}", timeout=30) as client:
        assert sorted(client.list_models()) == ["inline", "path"]  # given ids win over metadata
        assert client.list_models()["inline"]["sha256"] == hashlib.sha256(data).hexdigest()
        assert_serves(client, "inline")
        server.stop(grace=1)
        with pytest.raises(RemoteError) as e:
            client.ping(timeout=5)
        assert e.value.code == "UNAVAILABLE"


def test_server_arguments_are_checked(model_dir, tmp_path):
    from edgeflow.errors import EdgeflowError, FormatError
    with pytest.raises(EdgeflowError, match="expected a directory"):
        Server(tmp_path / "missing")
    with pytest.raises(EdgeflowError, match="give a model_dir"):
        Server()
    with pytest.raises(FormatError):  # a bad package given directly raises, it is not skipped
        Server(models={"bad": b"not a model"})
    with pytest.raises(EdgeflowError, match="tls expects"):
        Server(model_dir, tls=(b"cert", None))
    busy = Server(model_dir)
    port = busy.start()
    try:
        with pytest.raises(EdgeflowError, match=f"cannot listen on 127.0.0.1:{port}"):
            Server(model_dir, port=port).start()
    finally:
        busy.stop()


def test_a_reply_over_the_client_cap_is_resource_exhausted(server, client):
    with Client(f"127.0.0.1:{server.port}", timeout=30, max_reply_bytes=1000) as small:
        with pytest.raises(RemoteError, match="limit of 1000 bytes") as e:
            small.run("m", {"x": x_of(100)}, ["double"])  # 1600 bytes back
        assert e.value.code == "RESOURCE_EXHAUSTED"
        np.testing.assert_array_equal(small.run("m", {"x": x_of(10)}, ["double"])["double"].shape, (10, 4))
    assert_serves(client)


class _Liar(pb_grpc.EdgeflowServicer):
    """A server that answers Run with a reply of the wrong shape of stream."""

    def __init__(self, replies):
        self.replies = replies

    def Run(self, requests, context):
        header = next(iter(requests)).header
        for reply in self.replies(header):
            yield reply


LIES = {
    "another request id": lambda h: [pb.RunReply(header=pb.RunReplyHeader(request_id="other"))],
    "no header": lambda h: [pb.RunReply(chunk=pb.TensorChunk(name="y"))],
    "a tensor cut short": lambda h: [pb.RunReply(header=pb.RunReplyHeader(request_id=h.request_id)),
                                     pb.RunReply(chunk=pb.TensorChunk(name="y", dtype="float32", shape=[2],
                                                                      total_bytes=8, data=bytes(4)))],
    "a missing fetch": lambda h: [pb.RunReply(header=pb.RunReplyHeader(request_id=h.request_id))],
}


def assert_malformed_reply(servicer):
    """A client of a server running `servicer` gets RemoteError INTERNAL "malformed reply"."""
    from concurrent import futures
    fake = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_EdgeflowServicer_to_server(servicer, fake)
    port = fake.add_insecure_port("127.0.0.1:0")
    fake.start()
    try:
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            with pytest.raises(RemoteError, match="malformed reply") as e:
                client.run("m", {"x": x_of(1)}, ["y"])
            assert e.value.code == "INTERNAL"
    finally:
        fake.stop(None)


@pytest.mark.parametrize("case", sorted(LIES))
def test_a_malformed_reply_is_a_remote_error(case):
    assert_malformed_reply(_Liar(LIES[case]))


def test_an_empty_batch_gets_an_empty_result_or_invalid_argument(tmp_path):
    """A batch of 0 through a conv net gives empty logits (the ops with empty outputs run
    nothing); a reshape that cannot infer its -1 from no elements is INVALID_ARGUMENT, not INTERNAL."""
    import edgeflow as ef
    from .test_split_training import build
    build(tmp_path / "cnn.efl")
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 6], name="x")
        y = ef.reshape(x, [-1, 2, 3], name="y")
        z = ef.reshape(x, [2, 0, -1], name="z")  # no size of -1 makes 0 elements unambiguous
    ef.save(g, tmp_path / "shapes.efl", signatures={"infer": ({"x": x}, {"y": y, "z": z})})
    with Server(tmp_path) as server, Client(server.address, timeout=30) as client:
        out = client.run("cnn", {"image": np.zeros((0, 1, 8, 8), np.float32)}, ["logits/bias_add"])
        assert out["logits/bias_add"].shape == (0, 10) and out["logits/bias_add"].dtype == np.float32
        assert client.run("shapes", {"x": np.zeros((0, 6), np.float32)}, ["y"])["y"].shape == (0, 2, 3)
        with pytest.raises(RemoteError, match="cannot reshape") as info:
            client.run("shapes", {"x": np.zeros((0, 6), np.float32)}, ["z"])
        assert info.value.code == "INVALID_ARGUMENT"
        assert client.run("shapes", {"x": np.ones((1, 6), np.float32)}, ["y"])["y"].shape == (1, 2, 3)
