"""The gRPC server that runs the cloud part of split models (`edgeflow serve`).

`Server` hosts cloud packages, from a model directory or given directly, in this
process (a device can run one on loopback); `serve(args)` is the command. Every request
is checked before anything runs, and a bad one gets a status saying what was expected:
INVALID_ARGUMENT (a tensor's name, dtype, shape or bytes; malformed chunks; fetches),
NOT_FOUND (model id), FAILED_PRECONDITION (package hash), RESOURCE_EXHAUSTED (request
bytes over the cap, more memory than the budget leaves (see budget.py), too many training
devices), UNAUTHENTICATED (token, client certificate),
PERMISSION_DENIED (a model the caller's token may not use, a step under another device's
id); anything unexpected is logged and answered INTERNAL. A message that is not even a
protobuf of the method's type gets INVALID_ARGUMENT. Refusals are logged at most once per
kind every few seconds (with a count of those left out). The server keeps serving after
each. gRPC's standard health service (grpc.health.v1) answers without a token.

Versions (edgeflow.cloud.models.HostedModels): a model id may have several versions, one
per package SHA-256; a request naming a sha256 runs on that version (FAILED_PRECONDITION
if none has it), one without on the newest. ListModels lists every version, each id's
oldest first: the last of an id is its default.

Identities (edgeflow.cloud.identity): a caller is who its credential says (a per-device
token, or a client certificate's CN), never what its request claims; a training step
runs under the caller's device id, and only on a trainable package.
"""
import errno
import logging
import math
import os
import socket
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .. import dtypes
from ..errors import EdgeflowError, GraphError, InvalidInputError
from . import edgeflow_pb2 as pb
from . import edgeflow_pb2_grpc as pb_grpc
from . import logs, wire
from .identity import Authenticator, Refused, RateLimitedLog, Tokens, is_loopback
from .backends import Local, Unavailable
from .metrics import NO_METRICS
from .budget import DEFAULT_WAIT_S, MemoryBudget, OverBudget, Reservation, default_bytes, heap_trimmer
from .models import load_models
from .steps import StaleStep, TooManyDevices

DEFAULT_PORT = 50051
DEFAULT_MAX_REQUEST_BYTES = 256 << 20
SERVICE = pb.DESCRIPTOR.services_by_name["Edgeflow"].full_name  # "edgeflow.v1.Edgeflow"
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_PING_BLOCK = os.urandom(wire.MAX_PING_BYTES)  # incompressible ping replies
DEFAULT_MAX_DEVICES = 256  # devices whose training state one model keeps (StepHost.max_devices)
_log = logging.getLogger("edgeflow.cloud")
_bad_log = RateLimitedLog(_log)  # refused and failed requests: one line per kind per interval


class _Reject(Exception):
    """A request refused with this status code and message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _Call:
    """One call, as a context manager: its logs.Request is current while it runs, and when
    it ends, whichever way, it is reported to `metrics` once: `status` as set where the
    call is answered (`abort`, or "OK"); one left without was cancelled, or failed
    unexpectedly (UNKNOWN, as gRPC answers it)."""

    def __init__(self, metrics, method):
        self.metrics, self.method, self.request = metrics, method, logs.Request()
        self.status, self.bytes_in, self.bytes_out = None, 0, 0  # tensor bytes, as on the wire

    def __enter__(self):
        self._start, self._token = time.perf_counter(), logs.enter(self.request)
        return self

    def __exit__(self, kind, error, traceback):
        logs.leave(self._token)
        status = self.status or ("CANCELLED" if kind in (None, GeneratorExit) else "UNKNOWN")
        self.metrics.request(self.request.model or "", self.method, status, time.perf_counter() - self._start,
                             self.bytes_in, self.bytes_out)

    def abort(self, context, code, message):
        self.status = code.name
        context.abort(code, message)


class _Servicer(pb_grpc.EdgeflowServicer):
    def __init__(self, models, max_request_bytes, backend, auth=None, budget=None, metrics=NO_METRICS):
        self.models = models
        self.max_request_bytes = max_request_bytes
        self.backend = backend  # where checked requests run (backends.py)
        self.auth = auth or Authenticator()
        self.budget = budget  # a MemoryBudget: what requests reserve before they allocate
        self.metrics = metrics  # each call is reported: model, method, status, seconds, bytes

    def Run(self, requests, context):
        held = []  # the request's memory Reservation, once its model is known
        with _Call(self.metrics, "Run") as call:
            try:
                for part in self._run(lambda: _stream_parts(requests), context, held, call):
                    yield pb.RunReply(header=part) if isinstance(part, pb.RunReplyHeader) else pb.RunReply(chunk=part)
            finally:
                for reservation in held:
                    reservation.close()

    def RunOnce(self, request, context):
        """Run in one message each way (small requests and replies: see edgeflow.proto)."""
        held, fired, lock = [], [], threading.Lock()

        def release():  # once gRPC has sent the reply: until then its bytes are the request's
            with lock:  # the handler's thread and gRPC's may both come here
                fired.append(True)
                for reservation in held:
                    reservation.close()
        # gRPC calls back when the call ends: after the reply is sent, or at a cancellation,
        # which may come while the handler still runs (then the handler releases the rest).
        later = context.add_callback(release)
        with _Call(self.metrics, "Run") as call:  # the same operation as Run, in metrics too
            try:
                size = sum(len(chunk.data) for chunk in request.tensors)
                if size > wire.ONE_MESSAGE_BYTES:
                    call.abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"the request's tensors ({size} bytes) are more than one message of RunOnce "
                               f"carries (at most {wire.ONE_MESSAGE_BYTES} bytes of tensors): send them with Run, "
                               "which streams them")
                parts, size = [], 0
                for part in self._run(lambda: _message_parts(request), context, held, call):
                    size += len(part.data) if isinstance(part, pb.TensorChunk) else 0
                    if size > wire.ONE_REPLY_BYTES:  # given up: the outputs' memory goes with it
                        call.abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"the reply's tensors (over {wire.ONE_REPLY_BYTES} bytes) do not fit one "
                                   "message of RunOnce: ask with Run, which streams them")
                    parts.append(part)
                if call.status != "OK":  # refused (aborted already), cancelled, or the client went away
                    return pb.RunReplyMessage()
                return pb.RunReplyMessage(header=parts[0], tensors=parts[1:])
            finally:
                if not later or fired:
                    release()

    def _run(self, parts, context, held, call):
        """The reply of a Run or RunOnce whose (RunHeader, TensorChunks) `parts()` gives: its
        RunReplyHeader, then the fetched tensors' TensorChunks; or the call aborted with the
        status that says why."""
        request_id = ""
        try:
            identity = self.auth.identify(context)
            model, header, feeds = self._read(parts, context, held, identity, call)
            request_id = header.request_id
            if not context.is_active():  # cancelled or past its deadline while uploading
                left = context.time_remaining()
                call.status = "DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED"
                return
            start = time.perf_counter()
            if header.HasField("step"):  # a round of a split training step
                outputs = self.backend.round(model, identity.device_for(header.step.device_id), header.step,
                                             feeds, list(header.fetches))
                held[0].force(sum(a.nbytes for a in outputs.values()) * wire.encode_copies(header.encoding))
            else:
                outputs = self.backend.run(model, list(header.fetches), feeds, held[0], header.encoding)
            feeds = None  # copied into the plan: what they held is free
            held[0].give(held[0].feed_bytes)
            seconds = time.perf_counter() - start
        except grpc.RpcError:  # the client went away mid-stream; nobody to answer
            return
        except (_Reject, Refused) as e:
            code, message = e.code, str(e)
        except Unavailable as e:  # a replica died or none answered in time: the device retries
            code, message = grpc.StatusCode.UNAVAILABLE, str(e)
        except (wire.PayloadTooLarge, TooManyDevices, OverBudget) as e:
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
        except StaleStep as e:  # the device resumes from the step named (parsed by the client)
            code, message = grpc.StatusCode.FAILED_PRECONDITION, f"{e} [resume_from={e.resume_from}]"
        except (InvalidInputError, GraphError) as e:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(e)
        except Exception as e:  # a bug or a kernel failure: log it, answer, keep serving
            _bad_log.log(("Run failed", type(e).__name__), logging.ERROR, "Run %s failed", call.request.id,
                         exc_info=True)
            code, message = grpc.StatusCode.INTERNAL, f"internal error ({type(e).__name__}: {e}); " \
                                                      "the server logged it"
        else:
            yield pb.RunReplyHeader(request_id=request_id, model_id=model.id, model_sha256=model.sha256,
                                    compute_seconds=seconds)
            for name in header.fetches:
                for chunk in wire.chunks(name, outputs[name], encoding=header.encoding):
                    call.bytes_out += len(chunk.data)
                    yield chunk
            call.status = "OK"
            return
        _bad_log.log(("Run", code.name), logging.INFO, "Run %s: %s: %s", call.request.id, code.name,
                     message[:1000])
        call.abort(context, code, message)

    def _read(self, parts, context, held, identity, call):
        """The model, header and {name: array} feeds of a request whose (RunHeader,
        TensorChunks) `parts()` gives, all checked (the model and the step header against the
        caller's `identity`); the feeds' bytes are reserved (in a Reservation appended to
        `held`) as they arrive. `call` (a _Call) gets the request id, the model and the bytes
        received."""
        header, chunks = parts()
        call.request.id = header.request_id[:64] or call.request.id
        versions = self.models.versions(header.model_id)
        if not versions:
            raise _Reject(grpc.StatusCode.NOT_FOUND, f"no model {header.model_id[:200]!r}; this server hosts "
                                                     f"{sorted(m for m in self.models if identity.may_use(m))}")
        call.request.model = header.model_id  # a hosted id: metrics label only those
        identity.check_model(header.model_id)
        model = self.models.version(header.model_id, header.model_sha256)
        if model is None:
            raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                          f"model {header.model_id!r}: expected package sha256 {header.model_sha256[:64]}, "
                          f"this server hosts sha256 {', '.join(v.sha256 for v in versions)} (serve the "
                          "cloud package this device package was split against beside them)")
        model.check_fetches(list(header.fetches), allow_none=header.HasField("step"))
        if header.HasField("step"):
            if not model.trainable:
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                              f"model {model.id!r} is not a trainable split package (no 'train' signature "
                              "that updates variables): a Run on it may not carry a training step")
            identity.device_for(header.step.device_id)  # before the upload: the caller's id, valid
            model.check_targets([int(t) for t in header.step.targets])
        if header.encoding not in wire.ENCODINGS.values():
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, f"encoding {header.encoding!r}: expected "
                                                            "'', 'fp16' or 'int8'")
        left = context.time_remaining()
        budget = self.budget
        held.append(Reservation(budget, model.id, None if budget is None or left is None
                                else max(0.0, min(budget.wait_s, left))))
        held[0].add(_STREAM_BYTES, "a request")
        tensors = _Reserving(self.max_request_bytes, model.check_feed, held[0])
        for chunk in chunks:
            call.bytes_in += len(chunk.data)
            tensors.add(chunk)
        return model, header, tensors.finish()

    def ListModels(self, request, context):
        with _Call(self.metrics, "ListModels") as call:
            try:
                identity = self.auth.identify(context)
            except Refused as e:
                call.abort(context, e.code, str(e))
            reply = pb.ListModelsReply(models=[_model_info(m) for m in self.models.all() if identity.may_use(m.id)])
            call.status = "OK"
            return reply

    def Ping(self, request, context):
        with _Call(self.metrics, "Ping") as call:
            if request.reply_bytes > wire.MAX_PING_BYTES:
                call.abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                           f"expected reply_bytes <= {wire.MAX_PING_BYTES}, got {request.reply_bytes}")
            call.status = "OK"
            return pb.PingReply(payload=_PING_BLOCK[:request.reply_bytes])


def _stream_parts(requests):
    """(RunHeader, TensorChunks) of a Run stream; _Reject where its messages are out of order."""
    requests = iter(requests)
    first = next(requests, None)
    if first is None or first.WhichOneof("kind") != "header":
        raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                      "expected a Run stream to start with a RunHeader (model_id, fetches), got "
                      + ("nothing" if first is None else f"a {first.WhichOneof('kind') or 'empty'} message"))

    def chunks():
        for message in requests:
            if message.WhichOneof("kind") != "chunk":
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                              "expected TensorChunk messages after the RunHeader, got "
                              f"a {message.WhichOneof('kind') or 'empty'} message")
            yield message.chunk
    return first.header, chunks()


def _message_parts(request):
    """(RunHeader, TensorChunks) of a RunOnce message; _Reject without a header."""
    if not request.HasField("header"):
        raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                      "expected a RunMessage with a RunHeader (model_id, fetches), got none")
    return request.header, request.tensors


# What gRPC and protobuf hold for one request while it streams, besides its tensors: a
# chunk as received, parsed and copied, and a reply chunk as sliced, serialized and sent.
_STREAM_BYTES = 8 * wire.CHUNK_BYTES
_DECODE_COPIES = {"": 1, "fp16": 1.5, "int8": 2.25}  # a feed's buffer and decoding, per decoded byte


class _Reserving(wire.Assembler):
    """An Assembler that reserves each feed's bytes (its buffer and its decoding) in a
    Reservation before they are written."""

    def __init__(self, max_bytes, expect, reservation):
        super().__init__(max_bytes, expect, "feed")
        self.reservation = reservation
        reservation.feed_bytes = 0

    def _start(self, chunk):
        part = super()._start(chunk)
        copies = 2 if part.dtype == dtypes.bool_ else _DECODE_COPIES[part.encoding]
        nbytes = math.ceil(math.prod(part.shape) * part.dtype.itemsize * copies)
        self.reservation.add(nbytes, f"feed {part.name!r}")
        self.reservation.feed_bytes += nbytes
        return part


def _tensor_info(name, tensor):
    return pb.TensorInfo(name=name, tensor=tensor.name, dtype=dtypes.name(tensor.dtype), shape=tensor.shape)


def _model_info(model):
    return pb.ModelInfo(
        id=model.id, sha256=model.sha256, file_bytes=model.file_bytes,
        description=model.model.description,
        signatures=[pb.SignatureInfo(key=key, inputs=[_tensor_info(n, t) for n, t in ins],
                                     outputs=[_tensor_info(n, t) for n, t in outs])
                    for key, ins, outs in model.signatures()])


class _Undecodable:
    """What a request message that is not a protobuf of its method's type decodes to."""

    def __init__(self, error):
        self.error = error


def _tolerant(deserializer, method):
    """`deserializer`, returning an _Undecodable instead of raising (which grpc logs as an
    ERROR with a traceback for every bad message, and answers INTERNAL)."""
    if deserializer is None:
        return None

    def deserialize(data):
        try:
            return deserializer(data)
        except Exception as e:  # protobuf's DecodeError, or worse
            _bad_log.log(("undecodable", method), logging.INFO, "%s: a request message is not a valid "
                         "protobuf (%s: %s); answered INVALID_ARGUMENT", method, type(e).__name__, e)
            return _Undecodable(e)
    return deserialize


def _undecodable(method, error):
    return f"{method}: expected a protobuf message of the method's request type, got bytes that do not " \
           f"parse ({type(error).__name__})"


class _Guard(grpc.ServerInterceptor):
    """Every call but health checks: refuses one without a valid token (UNAUTHENTICATED,
    when the server has tokens), and answers INVALID_ARGUMENT to request messages that do
    not parse, logging them rate-limited. Health checks stay open, so that load balancers
    and `wait_ready` need no token. (The servicers take the caller's identity from the
    call's context: Authenticator.identify.) The calls it answers are reported to `metrics`
    (method: the method's short name), since the servicers never see them."""

    def __init__(self, auth, metrics=NO_METRICS):
        self.auth, self.metrics = auth, metrics

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method.startswith(_HEALTH_PREFIX):
            return handler
        method = details.method
        try:
            self.auth.check_token(details.invocation_metadata)
        except Refused as e:
            _bad_log.log(("refused", e.code.name), logging.INFO, "%s: %s: %s", method, e.code.name, e)
            return _rejecting(handler, e.code, str(e), method, self.metrics)
        kind = handler.request_streaming, handler.response_streaming
        behavior = {(False, False): handler.unary_unary, (False, True): handler.unary_stream,
                    (True, False): handler.stream_unary, (True, True): handler.stream_stream}[kind]
        if handler.request_streaming:
            def guarded(requests, context):
                return behavior(_checked(requests, method), context)
        else:
            def guarded(request, context):
                if isinstance(request, _Undecodable):
                    with _Call(self.metrics, _label(method)) as call:
                        call.abort(context, grpc.StatusCode.INVALID_ARGUMENT, _undecodable(method, request.error))
                return behavior(request, context)
        return _MAKE[kind](guarded, request_deserializer=_tolerant(handler.request_deserializer, method),
                           response_serializer=handler.response_serializer)


def _checked(requests, method):
    """The messages of a request stream; InvalidInputError (INVALID_ARGUMENT) at one that
    did not parse."""
    for request in requests:
        if isinstance(request, _Undecodable):
            raise InvalidInputError(_undecodable(method, request.error))
        yield request


_MAKE = {(False, False): grpc.unary_unary_rpc_method_handler,
         (False, True): grpc.unary_stream_rpc_method_handler,
         (True, False): grpc.stream_unary_rpc_method_handler,
         (True, True): grpc.stream_stream_rpc_method_handler}


def _label(method):
    """The metrics' name of gRPC method `method` ("/edgeflow.v1.Edgeflow/Run" -> "Run"; RunOnce
    is Run in one message: "Run" too)."""
    name = method.rsplit("/", 1)[-1]
    return "Run" if name == "RunOnce" else name


def _rejecting(handler, code, message, method="", metrics=NO_METRICS):
    """A handler of the same kind as `handler` that aborts every call with `code`."""
    def reject(request, context):
        with _Call(metrics, _label(method)) as call:
            call.abort(context, code, message)
    return _MAKE[handler.request_streaming, handler.response_streaming](
        reject, request_deserializer=_tolerant(handler.request_deserializer, method),
        response_serializer=handler.response_serializer)


_BIND_ERRORS = {errno.EADDRINUSE: "the port is in use (another server?): choose another --port",
                errno.EACCES: "permission denied (ports below 1024 need privileges)",
                errno.EADDRNOTAVAIL: "no network interface of this machine has that address"}


def bind_socket(host, port, reuse_port=False):
    """A plain socket bound to (host, port), with SO_REUSEADDR as gRPC binds (TIME_WAIT is
    fine) and SO_REUSEPORT if `reuse_port`; EdgeflowError, in one line, when it cannot be."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EdgeflowError(f"cannot listen on {host}:{port}: unknown host ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise EdgeflowError(f"cannot listen on {host}:{port}: {_BIND_ERRORS.get(e.errno, e.strerror)}") from None
    return sock


def _check_can_listen(host, port):
    """EdgeflowError, in one line, when (host, port) cannot be bound; asked with a plain
    socket before gRPC binds, because gRPC logs its own multi-line error to stderr first."""
    bind_socket(host, port).close()


class Server:
    """Hosts cloud packages over gRPC.

    `model_dir`: every `*.efl` in it but device packages (a bad file is logged and
    skipped; files with one id and different bytes are versions of that model, the newest
    file by modification time its default); `models`: {id: path or package bytes, or a
    list of them, oldest version first} hosted as well (a bad one raises). `models` on the
    server is a models.HostedModels. `token`: callers must
    send 'authorization: Bearer <token>': one shared token (a str), or a
    identity.Tokens (per-device tokens: `Tokens.parse(token file text)`). `tls`:
    (cert_pem, key_pem) bytes to serve TLS; `tls_client_ca`: PEM of the CA client
    certificates must be signed by (mutual TLS; the device id is the certificate's CN).
    `max_devices`: devices whose training state each trained model keeps.
    `max_request_bytes` caps the tensor bytes of one Run request. `memory_budget_bytes`
    (default: half the machine's memory) bounds what the models keep and the requests in
    flight use, `model_memory_bytes` what one model may (default: the whole budget); a
    request that does not fit waits up to `memory_wait_s` seconds, then gets
    RESOURCE_EXHAUSTED (see budget.py). `metrics` (a metrics.Metrics, e.g. a
    PrometheusMetrics) gets every call's model, method, status, seconds and bytes.
    `batching`: dict(slo_ms=, max_batch=, max_wait_ms=) runs the requests of many devices
    for a model as adaptive batches (batching.py); `cache_entries` > 0 answers repeated
    requests from a cache of that many replies (cache.py). `delegates` (an
    edgeflow.accel.OpenCLDelegate: the server's GPU) run every model's interpreters, shared
    by the requests' threads; `ray` (a replicas.RayBackend) runs the models on Ray's
    replicas instead, which make their own. `reuse_port`: bind with SO_REUSEPORT, beside
    other processes serving the same port (processes.py). `start()`
    binds and returns the port (`port=0` picks a free one); use it as a context manager to
    stop it.

    Health (grpc.health.v1): from `start()` the server as a whole (""), the Edgeflow
    service ("edgeflow.v1.Edgeflow") and each hosted model, `health_service(id)`
    ("edgeflow.v1.Edgeflow/<id>", so that a load balancer can route by model) are SERVING;
    `stop()` turns them all NOT_SERVING. A service not named so is NOT_FOUND.
    """

    def __init__(self, model_dir=None, host="127.0.0.1", port=0, token=None, tls=None, max_workers=8,
                 models=None, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES, state_dir=None,
                 checkpoint_every=1, parameter_server=None, threads=None,
                 tls_client_ca=None, max_devices=DEFAULT_MAX_DEVICES, memory_budget_bytes=None,
                 model_memory_bytes=None, memory_wait_s=DEFAULT_WAIT_S, batching=None, cache_entries=0,
                 ray=None, metrics=None, delegates=(), reuse_port=False):
        if model_dir is None and not models and parameter_server is None:
            raise EdgeflowError("Server: give a model_dir, models={id: path or bytes} or a parameter_server")
        if tls is not None and (len(tls) != 2 or not all(tls)):
            raise EdgeflowError("Server: tls expects (certificate PEM, private key PEM)")
        if token is not None and not token:
            raise EdgeflowError("Server: the token is empty")
        if tls_client_ca is not None and tls is None:
            raise EdgeflowError("Server: tls_client_ca (client certificates) needs tls=(cert, key)")
        tokens = None if token is None else token if isinstance(token, Tokens) else Tokens(shared=token)
        self.auth = Authenticator(tokens, client_certificates=tls_client_ca is not None)
        self.tls_client_ca, self.max_devices = tls_client_ca, max_devices
        # Requests run `max_workers` at a time: BLAS gets a share of the cores per request,
        # not all of them each (oversubscribed, 32 devices saw 3 s p99 instead of 1 s).
        self.threads = threads or max(1, (os.cpu_count() or 1) // max_workers)
        self._blas = None
        self.models = load_models(model_dir, models, delegates)
        self.budget = MemoryBudget(memory_budget_bytes or default_bytes(), model_memory_bytes, memory_wait_s,
                                   on_pressure=heap_trimmer())
        for model in self.models.all():
            model.use_budget(self.budget)
        self.host, self.port, self.token, self.tls = host, port, token, tls
        self.max_workers, self.max_request_bytes = max_workers, max_request_bytes
        self.state_dir, self.checkpoint_every = state_dir, checkpoint_every
        self.parameter_server = parameter_server  # an edgeflow.cloud.ParameterService, served too
        self.metrics = metrics or NO_METRICS
        self.backend = self._backend(batching, cache_entries, ray)
        self.reuse_port = reuse_port
        self._server = None
        self._health = None

    def _backend(self, batching, cache_entries, ray):
        """Where requests run: this process or Ray's replicas, behind batching and the
        prediction cache when asked for (backends.py)."""
        if ray is not None:  # a replicas.RayBackend: it batches inside each replica
            backend = ray
            ray.attach(self.models, self.metrics, batching)
        else:
            backend = Local(self.models, self.state_dir, self.checkpoint_every, self.max_devices, self.metrics)
            if batching:
                from .batching import Batching
                backend = Batching(backend, metrics=self.metrics, **batching)
        if cache_entries:
            from .cache import Cached
            backend = Cached(backend, cache_entries, metrics=self.metrics)
        return backend

    @property
    def address(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self):
        """Bind and start serving; the port listened on."""
        if self._server is not None:
            raise EdgeflowError(f"the server on {self.address} is already started")
        server = grpc.server(futures.ThreadPoolExecutor(self.max_workers, thread_name_prefix="edgeflow-rpc"),
                             options=wire.CHANNEL_OPTIONS + [("grpc.so_reuseport", int(self.reuse_port))],
                             interceptors=[_Guard(self.auth, self.metrics)])
        pb_grpc.add_EdgeflowServicer_to_server(
            _Servicer(self.models, self.max_request_bytes, self.backend, self.auth, self.budget, self.metrics),
            server)
        try:  # process-wide, while serving: per-request limits would race between threads
            from threadpoolctl import threadpool_limits
            self._blas = threadpool_limits(self.threads)
        except ImportError:
            _log.warning("threadpoolctl is not installed: BLAS threads are not limited")
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if self.parameter_server is not None:
            self.parameter_server.add_to_server(server, self._health, self.auth)
        if self.port and not self.reuse_port:  # (a port shared on purpose is bound by its siblings)
            _check_can_listen(self.host, self.port)
        try:
            if self.tls:
                cert, key = (v.encode() if isinstance(v, str) else bytes(v) for v in self.tls)
                ca = self.tls_client_ca
                ca = ca.encode() if isinstance(ca, str) else None if ca is None else bytes(ca)
                port = server.add_secure_port(self.address, grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=ca, require_client_auth=ca is not None))
            else:
                port = server.add_insecure_port(self.address)
        except RuntimeError as e:  # grpc's "Failed to bind to address ...; set GRPC_VERBOSITY=..."
            server.stop(None)
            raise EdgeflowError(f"cannot listen on {self.address}: {str(e).split(';')[0]}") from None
        server.start()
        self.port, self._server = port, server
        if self.token and not self.tls and not is_loopback(self.host):
            _log.warning("tokens are required but sent in plaintext: %s is not a loopback address and "
                         "there is no TLS (give --tls-cert and --tls-key); anyone on the path can read "
                         "them", self.host)
        for service in ("", SERVICE, *map(health_service, self.models)):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return port

    def stop(self, grace=None):
        """Stop: health turns NOT_SERVING, new calls are refused, calls in flight get
        `grace` seconds to finish (None: they are cancelled now)."""
        if self._server is None:
            return
        self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self._server = None
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None
        if self.parameter_server is not None:  # its variables, slots and devices' steps (before Ray goes)
            self.parameter_server.checkpoint()
        self.backend.close()  # training state: checkpoint, to resume from

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def health_service(model_id):
    """The health service name saying whether the server serves model `model_id`."""
    return f"{SERVICE}/{model_id}"
