"""The client of the edgeflow cloud service: what a device's Send/Recv kernels call.

    with Client("server:50051", token=..., root_cert=pem) as cloud:
        out = cloud.run("model-id", {"h": h}, ["y"], sha256=expected)   # {"y": array}

Every call has a deadline (`timeout`, per client or per call). A failed call raises
edgeflow.errors.RemoteError whose `.code` is the gRPC status name ("NOT_FOUND",
"INVALID_ARGUMENT", "UNAVAILABLE" when the server cannot be reached, ...) and whose
`.details` is the server's reason. The client measures its link as it goes (`link`:
round-trip time, upload and download throughput of recent transfers), which the
device runtime reads to re-plan the split.
"""
import collections
import dataclasses
import math
import re
import statistics
import threading
import time
import uuid
from typing import Optional

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..errors import InvalidInputError, RemoteError
from . import edgeflow_pb2 as pb
from . import edgeflow_pb2_grpc as pb_grpc
from . import wire

# Smaller transfers measure latency, not throughput. A request under this size goes as one
# RunOnce message, about half the server's work of a streamed Run; a larger one streams,
# which also times its upload apart from the rest of the call.
MIN_SAMPLE_BYTES = wire.ONE_MESSAGE_BYTES
SMALL_CALL_BYTES = 4 << 10  # a call moving less each way times the per-call overhead alone
_SAMPLES = 8  # throughput is over this many recent transfers each way


def _rate(samples):
    seconds = sum(s for _, s in samples)
    return sum(b for b, _ in samples) / seconds if samples and seconds > 0 else None


@dataclasses.dataclass
class LinkStats:
    """What the client has measured of its link to the server.

    `rtts` holds the round trips of recent empty pings. `up` and `down` hold (bytes,
    seconds) of recent transfers of at least MIN_SAMPLE_BYTES: Ping payloads (their
    round trip less the best recent empty one) and Run tensors (upload: from the call's
    start until gRPC has sent the last chunk; download: from the reply header until the
    last chunk). `calls_s` holds (seconds, up bytes, down bytes) of recent Run calls, their
    seconds less the server's compute: what `overhead_s` is read from. Estimates, good
    enough to plan a split on.
    """

    rtts: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=_SAMPLES))
    up: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=_SAMPLES))
    down: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=_SAMPLES))
    calls: int = 0  # Run calls that returned
    bytes_sent: int = 0  # tensor bytes uploaded by those calls
    bytes_received: int = 0
    last_call_s: Optional[float] = None  # the last Run's wall time ...
    last_compute_s: Optional[float] = None  # ... and the part the server spent computing
    calls_s: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=_SAMPLES))

    @property
    def rtt_s(self):
        """The last empty ping's round trip, or None before one."""
        return self.rtts[-1] if self.rtts else None

    @property
    def min_rtt_s(self):
        """The best recent round trip: the latency, with the least queueing in it."""
        return min(self.rtts) if self.rtts else None

    @property
    def overhead_s(self):
        """The fixed cost of a Run call beyond the round trip (the RPC stack, serializing,
        the server's dispatch): the median over recent Run calls of their time less the
        server's compute, their bytes at the measured throughput and the best RTT (>= 0).
        A call whose bytes one way are SMALL_CALL_BYTES or more counts only once that
        way's throughput is measured. None before a Run and an empty ping."""
        rtt = self.min_rtt_s
        if rtt is None:
            return None
        up, down = self.up_bytes_per_s, self.down_bytes_per_s
        values = []
        for seconds, sent, received in self.calls_s:
            if (sent >= SMALL_CALL_BYTES and not up) or (received >= SMALL_CALL_BYTES and not down):
                continue
            values.append(seconds - (sent / up if up else 0.0) - (received / down if down else 0.0) - rtt)
        return max(0.0, statistics.median(values)) if values else None

    @property
    def up_bytes_per_s(self):
        return _rate(self.up)

    @property
    def down_bytes_per_s(self):
        return _rate(self.down)


class Client:
    """Calls an edgeflow server at `target` ("host:port").

    `token`: sent as 'authorization: Bearer <token>'. `root_cert`: PEM of the
    certificate (or CA) the server's TLS certificate must chain to; without it the
    channel is plaintext. `client_cert`, `client_key`: PEM of this device's certificate
    and its private key, for a server that requires client certificates (mutual TLS; the
    server takes the device id from the certificate's CN). `timeout`: the default deadline of every call, in seconds.
    `max_reply_bytes` caps the tensor bytes one reply may carry. Thread-safe: one client
    serves many threads.
    """

    def __init__(self, target, token=None, root_cert=None, timeout=30.0, max_reply_bytes=1 << 30,
                 client_cert=None, client_key=None):
        if token is not None and not (token and token.isascii() and token.isprintable() and " " not in token):
            raise InvalidInputError("Client: expected a token of printable ASCII without spaces")
        if not timeout or timeout <= 0:
            raise InvalidInputError(f"Client: expected a timeout > 0 seconds, got {timeout}")
        self.target, self.timeout, self.max_reply_bytes = target, timeout, max_reply_bytes
        if (client_cert is None) != (client_key is None) or (client_cert is not None and root_cert is None):
            raise InvalidInputError("Client: client_cert and client_key go together, and with root_cert (TLS)")
        if root_cert is not None:
            pem, cert, key = (None if v is None else v.encode() if isinstance(v, str) else bytes(v)
                              for v in (root_cert, client_cert, client_key))
            credentials = grpc.ssl_channel_credentials(pem, private_key=key, certificate_chain=cert)
            self._channel = grpc.secure_channel(target, credentials, wire.CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, wire.CHANNEL_OPTIONS)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = pb_grpc.EdgeflowStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._lock = threading.Lock()
        self._link = LinkStats()
        self._one_message = True  # until a server without RunOnce (UNIMPLEMENTED) says otherwise
        self._streamed = set()  # (model, fetches) whose replies did not fit one message

    # -- calls -----------------------------------------------------------------------
    def run(self, model_id, feeds, fetches, sha256=None, timeout=None, request_id=None,
            compression="none", step=None):
        """{name: array} of the tensors `fetches` of model `model_id`, computed on the server
        from `feeds` ({tensor name: array}). `sha256`: the package hash the caller expects
        (FAILED_PRECONDITION if the server hosts another). `compression` ("none", "fp16",
        "int8") shrinks float32 tensors both ways. `step`: for a round of a split training
        step, {"device_id", "step_id", "round", "keep", "targets", "final"} (see
        edgeflow/cloud/steps.py). RemoteError on failure; `.resume_from` is set when the
        server asks the device to resume from another step."""
        encoding = wire.encoding_named(compression)
        fetches = [fetches] if isinstance(fetches, str) else list(fetches)
        if not all(isinstance(name, str) and name for name in [*feeds, *fetches]):
            raise InvalidInputError(f"run: expected tensor names (non-empty str) as feed keys and fetches, "
                                    f"got {list(feeds)} and {fetches}")
        arrays = {name: wire.as_array(value, f"feed {name!r}") for name, value in feeds.items()}
        request_id = request_id or uuid.uuid4().hex
        timeout = self._deadline(timeout)
        sent = {}
        run_header = pb.RunHeader(model_id=model_id, model_sha256=sha256 or "", request_id=request_id,
                                  fetches=fetches, encoding=encoding, step=pb.TrainStep(**step) if step else None)
        up = sum(wire.encoded_bytes(a, encoding) for a in arrays.values())

        def requests():
            yield pb.RunRequest(header=run_header)
            for name, array in arrays.items():
                for chunk in wire.chunks(name, array, encoding=encoding):
                    yield pb.RunRequest(chunk=chunk)
            sent["at"] = time.perf_counter()  # gRPC asks for more only once the last send is done

        start = time.perf_counter()
        reply = None
        if self._one_message_fits(up, step, model_id, fetches):
            reply = self._run_once(run_header, arrays, encoding, timeout)
        if reply is not None:
            header, outputs = self._read_message(reply, request_id, fetches)
            header_at = None
        else:
            replies = self._stub.Run(requests(), timeout=timeout, metadata=self._metadata)
            try:
                header, outputs, header_at = self._read_reply(replies, request_id, fetches)
            except grpc.RpcError as e:
                raise self._error("Run", e, timeout) from None
        end = time.perf_counter()
        down = sum(wire.encoded_bytes(a, encoding) for a in outputs.values())
        with self._lock:
            link = self._link
            link.calls += 1
            link.bytes_sent += up
            link.bytes_received += down
            link.last_call_s, link.last_compute_s = end - start, header.compute_seconds
            link.calls_s.append((max(0.0, end - start - header.compute_seconds), up, down))
            if up >= MIN_SAMPLE_BYTES and "at" in sent:
                link.up.append((up, sent["at"] - start))
            if down >= MIN_SAMPLE_BYTES and header_at is not None:
                link.down.append((down, end - header_at))
        return {name: outputs[name] for name in fetches}

    def _one_message_fits(self, up, step, model_id, fetches):
        """Whether a request of `up` tensor bytes goes as one RunOnce message (see
        MIN_SAMPLE_BYTES); a training round always streams."""
        return step is None and self._one_message and up < MIN_SAMPLE_BYTES \
            and (model_id, tuple(fetches)) not in self._streamed

    def _run_once(self, header, arrays, encoding, timeout):
        """The RunReplyMessage of `header` and `arrays` sent as one RunOnce message; None where
        the call must stream instead (a server without RunOnce, from now on; a request or reply
        too large for one message, from now on for this model and these fetches)."""
        tensors = [chunk for name, array in arrays.items() for chunk in wire.chunks(name, array, encoding=encoding)]
        try:
            return self._stub.RunOnce(pb.RunMessage(header=header, tensors=tensors), timeout=timeout,
                                      metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older server: Run alone
                self._one_message = False
                return None
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "with Run, which streams" in (e.details() or ""):
                self._streamed.add((header.model_id, tuple(header.fetches)))
                return None
            raise self._error("Run", e, timeout) from None

    def _read_message(self, reply, request_id, fetches):
        """(header, {name: array}) of a RunReplyMessage, checked as _read_reply checks a stream."""
        def malformed(reason):
            return self._remote_error("INTERNAL", f"malformed reply from {self.target}: {reason}")
        if not reply.HasField("header"):
            raise malformed("expected a RunReplyHeader")
        if reply.header.request_id != request_id:
            raise malformed(f"expected request id {request_id!r}, got {reply.header.request_id!r}")
        tensors = wire.Assembler(self.max_reply_bytes, what="output")
        try:
            for chunk in reply.tensors:
                tensors.add(chunk)
            outputs = tensors.finish()
        except wire.PayloadTooLarge as e:
            raise self._remote_error("RESOURCE_EXHAUSTED", f"the reply from {self.target} is too large: {e}; "
                                                           f"raise {type(self).__name__}(max_reply_bytes=...)") from None
        except InvalidInputError as e:
            raise malformed(str(e)) from None
        if sorted(outputs) != sorted(fetches):
            raise malformed(f"expected tensors {sorted(fetches)}, got {sorted(outputs)}")
        return reply.header, outputs

    def _read_reply(self, replies, request_id, fetches):
        def check(header):
            if header.request_id != request_id:
                return f"expected request id {request_id!r}, got {header.request_id!r}"
        header, outputs, header_at = self.read_chunked(replies, "reply", "a RunReplyHeader", "output", check)
        if sorted(outputs) != sorted(fetches):
            raise self._remote_error("INTERNAL", f"malformed reply from {self.target}: expected tensors "
                                                 f"{sorted(fetches)}, got {sorted(outputs)}")
        return header, outputs, header_at

    def read_chunked(self, replies, what, header_kind, tensor_kind, check=None):
        """(header, {name: array}, when the header came) of a reply stream of a header then
        TensorChunks; `check(header)` may return why the header is wrong. RemoteError
        INTERNAL ("malformed `what` from ...") or RESOURCE_EXHAUSTED (over max_reply_bytes)."""
        def malformed(reason):
            replies.cancel()
            return self._remote_error("INTERNAL", f"malformed {what} from {self.target}: {reason}")
        first = next(replies, None)
        if first is None or first.WhichOneof("kind") != "header":
            raise malformed(f"expected {header_kind} first")
        header_at = time.perf_counter()
        wrong = check(first.header) if check else None
        if wrong:
            raise malformed(wrong)
        tensors = wire.Assembler(self.max_reply_bytes, what=tensor_kind)
        try:
            for reply in replies:
                if reply.WhichOneof("kind") != "chunk":
                    raise InvalidInputError("expected TensorChunk messages after the header")
                tensors.add(reply.chunk)
            return first.header, tensors.finish(), header_at
        except wire.PayloadTooLarge as e:
            replies.cancel()
            raise self._remote_error("RESOURCE_EXHAUSTED", f"the {what} from {self.target} is too large: {e}; "
                                                           f"raise {type(self).__name__}(max_reply_bytes=...)") from None
        except InvalidInputError as e:
            raise malformed(str(e)) from None

    def list_models(self, timeout=None):
        """{model id: {"sha256", "file_bytes", "description", "signatures": {key: {"inputs":
        {name: {"tensor", "dtype", "shape"}}, "outputs": {...}}}, "versions": [...]}} of the
        hosted models: the top-level fields are the id's default version's (the one a
        request without a sha256 gets, its newest); "versions" lists every version hosted
        (dicts of the same fields but "versions"), oldest first, the default last."""
        timeout = self._deadline(timeout)
        try:
            reply = self._stub.ListModels(pb.ListModelsRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error("ListModels", e, timeout) from None

        def tensors(infos):
            return {t.name: {"tensor": t.tensor, "dtype": t.dtype, "shape": tuple(t.shape)} for t in infos}
        versions = {}
        for m in reply.models:  # each id's versions oldest first (the server's order)
            versions.setdefault(m.id, []).append(
                {"sha256": m.sha256, "file_bytes": m.file_bytes, "description": m.description,
                 "signatures": {s.key: {"inputs": tensors(s.inputs), "outputs": tensors(s.outputs)}
                                for s in m.signatures}})
        return {model_id: {**found[-1], "versions": found} for model_id, found in versions.items()}

    def ping(self, payload_bytes=0, reply_bytes=0, timeout=None):
        """Send `payload_bytes` and have `reply_bytes` sent back; the round trip in seconds.
        An empty ping adds a round trip to `link`; a one-way load a throughput sample."""
        for what, n in (("payload_bytes", payload_bytes), ("reply_bytes", reply_bytes)):
            if not 0 <= n <= wire.MAX_PING_BYTES:
                raise InvalidInputError(f"ping: expected 0 <= {what} <= {wire.MAX_PING_BYTES}, got {n}")
        request = pb.PingRequest(payload=bytes(payload_bytes), reply_bytes=reply_bytes)
        timeout = self._deadline(timeout)
        start = time.perf_counter()
        try:
            reply = self._stub.Ping(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error("Ping", e, timeout) from None
        seconds = time.perf_counter() - start
        if len(reply.payload) != reply_bytes:
            raise self._remote_error("INTERNAL", f"malformed reply from {self.target}: expected a ping "
                                                 f"payload of {reply_bytes} bytes, got {len(reply.payload)}")
        with self._lock:
            link = self._link
            if not payload_bytes and not reply_bytes:
                link.rtts.append(seconds)
            else:  # a transfer takes at least the latency; what it took beyond is the bytes'
                moving = seconds - (link.min_rtt_s or 0.0)
                if moving < 0.1 * seconds:  # lost in the latency's noise: bytes / seconds is
                    moving = seconds        # at least a lower bound on the throughput
                if payload_bytes >= MIN_SAMPLE_BYTES and reply_bytes < MIN_SAMPLE_BYTES:
                    link.up.append((payload_bytes, moving))
                elif reply_bytes >= MIN_SAMPLE_BYTES and payload_bytes < MIN_SAMPLE_BYTES:
                    link.down.append((reply_bytes, moving))
        return seconds

    def measure(self, nbytes=1 << 20, timeout=None, model_id=None, sha256=None, echo=None):
        """Measure the link now: three empty pings, then `nbytes` up and `nbytes` down;
        with `model_id` (a model the server hosts), also the per-call overhead
        (`measure_overhead`). The updated `link`."""
        for _ in range(3):
            self.ping(timeout=timeout)
        self.ping(payload_bytes=nbytes, timeout=timeout)
        self.ping(reply_bytes=nbytes, timeout=timeout)
        if model_id is not None:
            self.measure_overhead(model_id, sha256, echo, timeout=timeout)
        return self.link

    def measure_overhead(self, model_id, sha256=None, echo=None, calls=3, timeout=None):
        """Time `calls` Run calls that compute nothing -- each feeds one tensor and fetches
        it back -- so that `link.overhead_s` has samples (with the empty pings' RTT: ping
        first). `echo`: (tensor name, array) to send; by default the smallest input of the
        model's signatures, dynamic dimensions 1. The measured overhead in seconds, or None."""
        if echo is None:
            from .. import dtypes
            hosted = self.list_models(timeout).get(model_id, {"signatures": {}})
            shapes = {t["tensor"]: ([max(d, 1) for d in t["shape"]], t["dtype"])
                      for sig in hosted["signatures"].values() for t in sig["inputs"].values()}
            if not shapes:
                raise InvalidInputError(f"measure_overhead: the server at {self.target} hosts no "
                                        f"model {model_id!r} with an input to send; pass echo=(name, array)")
            name = min(shapes, key=lambda n: math.prod(shapes[n][0]))
            echo = (name, np.zeros(shapes[name][0], dtypes.as_dtype(shapes[name][1])))
        name, array = echo
        for _ in range(calls):
            self.run(model_id, {name: array}, [name], sha256=sha256, timeout=timeout)
        return self.link.overhead_s

    @property
    def link(self):
        """A snapshot of the link measurements (a LinkStats)."""
        with self._lock:
            link = self._link
            return dataclasses.replace(link, rtts=collections.deque(link.rtts, _SAMPLES),
                                       up=collections.deque(link.up, _SAMPLES),
                                       down=collections.deque(link.down, _SAMPLES),
                                       calls_s=collections.deque(link.calls_s, _SAMPLES))

    def health(self, service="", timeout=None):
        """The server's health status name ("SERVING", "NOT_SERVING", ...) for `service`
        ("" for the server as a whole, or "edgeflow.v1.Edgeflow")."""
        timeout = self._deadline(timeout)
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise self._error("Health.Check", e, timeout) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_ready(self, timeout=None):
        """Wait until the server is reachable and SERVING; RemoteError (UNAVAILABLE) if it
        is not within `timeout` seconds."""
        timeout = self._deadline(timeout)
        deadline = time.monotonic() + timeout
        status = "unreachable"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._remote_error("UNAVAILABLE", f"the server at {self.target} is not ready "
                                                        f"after {timeout:g} s ({status})")
            try:
                reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=left, wait_for_ready=True)
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise self._error("Health.Check", e, timeout) from None
                continue
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(min(0.05, max(left, 0)))

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- errors ----------------------------------------------------------------------
    def _deadline(self, timeout):
        timeout = self.timeout if timeout is None else timeout
        if timeout <= 0:
            raise InvalidInputError(f"expected a timeout > 0 seconds, got {timeout}")
        return timeout

    def _remote_error(self, code, message, details=None):
        error = RemoteError(message)
        error.code, error.details = code, details if details is not None else message
        found = re.search(r"\[resume_from=(\d+)\]", error.details or "")
        error.resume_from = int(found.group(1)) if found else None  # split training: see steps.py
        return error

    def _error(self, method, e, timeout):
        """RemoteError for a failed gRPC call, with `.code` its status name."""
        code = e.code() if hasattr(e, "code") else None
        name = code.name if code is not None else "UNKNOWN"
        details = (e.details() if hasattr(e, "details") else None) or str(e)
        if code == grpc.StatusCode.UNAVAILABLE:
            message = f"the server at {self.target} is unreachable ({_reason(details)})"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            message = f"{method} on {self.target}: no answer within the {timeout:g} s deadline"
        else:
            message = f"{method} on {self.target} failed: {name}: {details}"
        return self._remote_error(name, message, details)


def _reason(details):
    """The cause in gRPC's UNAVAILABLE details, e.g. "Connection refused" out of "failed to
    connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: Failed to connect to
    remote host: Connection refused"; the details as they are when they have no such tail."""
    cause = details.rpartition("last error: ")[2].rpartition(": ")[2].strip(" []") or details
    if details.startswith(("errors resolving", "DNS resolution failed")):
        return f"cannot resolve its host name: {cause}"
    return cause
