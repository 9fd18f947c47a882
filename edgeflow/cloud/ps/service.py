"""The parameter server's gRPC service (edgeflow.ps.v1.ParameterServer, ps.proto): checks
each request and answers it from the models' HostedParameters (edgeflow.cloud.ps.state),
or, with `ray_shards`, their ShardedParameters (the variables on Ray actors: sharded.py),
through the same narrow interface (id, sha256, mode, replicas, names, specs, expect,
check_names, push, pull, status, checkpoint).

Serve it with `Server(parameter_server=ParameterService(...))`, or
`edgeflow serve --model-dir DIR --parameter-server sync|async|fedavg`.

A push counts under the caller's identity (edgeflow.cloud.identity): with per-device tokens
or client certificates, the device id is the credential's (a push naming another gets
PERMISSION_DENIED), so one client fills one replica slot of a sync step, not all of them;
with one shared token (or none) the device ids pushes name are trusted as sent.
"""
import logging
import os
import pathlib

import grpc
import numpy as np

from ...errors import EdgeflowError, GraphError, InvalidInputError
from .. import ps_pb2 as pb
from .. import ps_pb2_grpc as pb_grpc
from .. import wire
from ..backends import Unavailable
from ..identity import ANONYMOUS, Authenticator, Refused, RateLimitedLog
from ..steps import TooManyDevices
from .state import RESULTS, HostedParameters, Settings

SERVICE = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name  # "edgeflow.ps.v1.ParameterServer"
PB_MODES = {"sync": pb.MODE_SYNC, "async": pb.MODE_ASYNC, "fedavg": pb.MODE_FEDAVG}
MODE_NAMES = {v: k for k, v in PB_MODES.items()}
_RESULT_CODES = {v: k for k, v in RESULTS.items()}
MAX_WAIT_S = 30.0  # the longest a Pull waits for the version to change
DEFAULT_MAX_REQUEST_BYTES = 256 << 20
_log = logging.getLogger("edgeflow.cloud.ps")
_bad_log = RateLimitedLog(_log)


class _Reject(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class ParameterService(pb_grpc.ParameterServerServicer):
    """Serves the cloud variables of trainable packages (see edgeflow.cloud.ps).

    `models`: {id: path or package bytes}. `mode`: "sync", "async" or "fedavg";
    `replicas`: devices per step (sync) or round (FedAvg). `variables`: "cloud" (those
    placed in the cloud) or "all" (every trainable one). `checkpoint_dir`: resume from and
    checkpoint to it every `checkpoint_every` applied updates and on `checkpoint()`.
    `max_staleness` (async): drop gradients computed more than this many versions ago.
    `max_devices`: devices each model keeps the last step of (a new one beyond them:
    RESOURCE_EXHAUSTED). `ray_shards`: an int N >= 1 shards each model's variables over N
    Ray actors (sharded.py; this process must be connected to Ray, the checkpoint_dir
    reachable from every node); None keeps them in this process.
    """

    def __init__(self, models, mode="async", replicas=1, variables="cloud", checkpoint_dir=None,
                 checkpoint_every=100, max_staleness=None, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
                 max_devices=4096, ray_shards=None):
        self.settings = Settings(mode, replicas, variables, checkpoint_dir, checkpoint_every, max_staleness,
                                 max_devices=max_devices)
        if not models:
            raise InvalidInputError("ParameterService: give models={id: path or package bytes}")
        if ray_shards is not None and not (isinstance(ray_shards, int) and ray_shards >= 1):
            raise InvalidInputError(f"ray_shards: expected None or an int >= 1, got {ray_shards!r}")
        self.max_request_bytes = max_request_bytes
        self.auth = Authenticator()  # who calls: the Server's, once added to one
        if checkpoint_dir:
            os.makedirs(checkpoint_dir, exist_ok=True)
        self.models = {}
        for model_id, source in models.items():
            if isinstance(source, (bytes, bytearray, memoryview)):
                data, where = bytes(source), "<bytes>"
            else:
                try:
                    data, where = pathlib.Path(source).read_bytes(), str(source)
                except OSError as e:
                    raise EdgeflowError(f"model {model_id!r}: cannot read {str(source)!r} "
                                        f"({e.strerror})") from None
            if ray_shards is None:
                self.models[model_id] = HostedParameters(model_id, data, where, self.settings)
            else:
                from .sharded import ShardedParameters
                self.models[model_id] = ShardedParameters(model_id, data, where, self.settings, ray_shards)

    def add_to_server(self, server, health=None, auth=None):
        """Register on a grpc.Server (before it starts); mark the service SERVING on `health`.
        `auth`: the server's identity.Authenticator (callers' identities)."""
        if auth is not None:
            self.auth = auth
        pb_grpc.add_ParameterServerServicer_to_server(self, server)
        if health is not None:
            from grpc_health.v1 import health_pb2
            health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)

    def checkpoint(self):
        """Checkpoint every model now (a no-op without checkpoint_dir)."""
        for hosted in self.models.values():
            hosted.checkpoint()

    def stats(self, model_id):
        """The model's status as a dict (what Status answers)."""
        return self._model(model_id, "", ANONYMOUS).status()

    # -- RPCs ------------------------------------------------------------------------
    def Status(self, request, context):
        try:
            s = self._model(request.model_id, "", self.auth.identify(context)).status()
        except Exception as e:
            self._abort(context, "Status", e)
        return pb.StatusReply(
            model_id=s["model_id"], model_sha256=s["model_sha256"], mode=PB_MODES[s["mode"]],
            replicas=s["replicas"], version=s["version"], incarnation=s["incarnation"],
            updates_applied=s["updates_applied"], checkpoint_version=s["checkpoint_version"],
            variables=[pb.VariableInfo(name=n, **v) for n, v in s["variables"].items()],
            devices=[pb.DeviceInfo(device_id=d, last_step_id=r["last_step_id"], applied=r["applied"],
                                   last_result=_RESULT_CODES[r["last_result"]]) for d, r in s["devices"].items()],
            pending_devices=s["pending_devices"], duplicates=s["duplicates"], dropped=s["dropped"])

    def Pull(self, request, context):
        try:
            identity = self.auth.identify(context)
            hosted = self._model(request.model_id, request.model_sha256, identity)
            names = list(request.names) or hosted.names
            hosted.check_names(names, "pull")
            if len(set(names)) != len(names):
                raise InvalidInputError(f"pull: expected distinct names, got {names}")
            if request.encoding not in wire.ENCODINGS.values():
                raise InvalidInputError(f"pull: encoding {request.encoding!r}: expected '', 'fp16' or 'int8'")
            if not 0 <= request.wait_seconds <= MAX_WAIT_S:
                raise InvalidInputError(f"pull: expected 0 <= wait_seconds <= {MAX_WAIT_S}, "
                                        f"got {request.wait_seconds}")
            device = identity.device_for(request.device_id, required=False)
            header, values = hosted.pull(names, request.wait_while_version, request.incarnation,
                                         request.wait_seconds, device, context.is_active)
        except Exception as e:
            self._abort(context, "Pull", e)
        yield pb.PullReply(header=pb.PullHeader(**{**header, "mode": PB_MODES[header["mode"]]}))
        for name in names if header["changed"] else ():
            for chunk in wire.chunks(name, values[name], encoding=request.encoding):
                yield pb.PullReply(chunk=chunk)

    def Push(self, requests, context):
        return self._push(requests, context, "Push")

    def PushModel(self, requests, context):
        return self._push(requests, context, "PushModel")

    def _push(self, requests, context, method):
        try:
            requests = iter(requests)
            first = next(requests, None)
            if first is None or first.WhichOneof("kind") != "header":
                raise InvalidInputError(f"expected a {method} stream to start with its header, got "
                                        + ("nothing" if first is None else
                                           f"a {first.WhichOneof('kind') or 'empty'} message"))
            header = first.header
            identity = self.auth.identify(context)
            hosted = self._model(header.model_id, header.model_sha256, identity)
            if method == "Push":
                mode = MODE_NAMES.get(header.mode, "unspecified")
                step_id, version = header.step_id, header.version
                if hosted.mode == "fedavg":
                    raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"model {hosted.id!r} trains by FedAvg rounds: devices push their models "
                                  "with PushModel, not gradients with Push")
                if mode != hosted.mode:
                    raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"model {hosted.id!r} trains in {hosted.mode} mode"
                                  + (f" with {hosted.replicas} replicas" if hosted.mode != "async" else "")
                                  + f"; the device pushed in {mode} mode")
            else:
                if hosted.mode != "fedavg":
                    raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"model {hosted.id!r} trains in {hosted.mode} mode; PushModel is for "
                                  "FedAvg, push gradients with Push")
                step_id = version = header.round_id
            device = identity.device_for(header.device_id, required=True)  # the caller's own
            if step_id < 0:
                raise InvalidInputError(f"{method}: expected a step id >= 0, got {step_id}")
            if header.sample_count < 1:
                raise InvalidInputError(f"{method}: expected sample_count >= 1, got {header.sample_count}")
            tensors = wire.Assembler(self.max_request_bytes, hosted.expect, "variable")
            for message in requests:
                if message.WhichOneof("kind") != "chunk":
                    raise InvalidInputError(f"expected TensorChunk messages after the {method} header, got "
                                            f"a {message.WhichOneof('kind') or 'empty'} message")
                tensors.add(message.chunk)
            arrays = tensors.finish()
            missing = [n for n in hosted.names if n not in arrays]
            if missing:
                raise InvalidInputError(f"{method}: expected a tensor for every served variable "
                                        f"{hosted.names}; missing {missing}")
            bad = [n for n, a in arrays.items() if not np.all(np.isfinite(a))]
            if bad:
                raise InvalidInputError(f"{method}: {bad} hold NaN or infinite values; expected finite ones")
            reply = hosted.push(device, int(step_id), int(version), int(header.sample_count), arrays)
        except grpc.RpcError:  # the client went away mid-stream
            return pb.PushReply()
        except Exception as e:
            self._abort(context, method, e)
        return pb.PushReply(**reply)

    # -- helpers ---------------------------------------------------------------------
    def _model(self, model_id, sha256, identity):
        hosted = self.models.get(model_id)
        if hosted is None:
            raise _Reject(grpc.StatusCode.NOT_FOUND, f"no trained model {model_id[:200]!r}; this parameter "
                                                     f"server trains {sorted(m for m in self.models if identity.may_use(m))}")
        identity.check_model(model_id)
        if sha256 and sha256.lower() != hosted.sha256:
            raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                          f"model {model_id!r}: expected package sha256 {sha256}, this server trains "
                          f"sha256 {hosted.sha256}")
        return hosted

    def _abort(self, context, method, e):
        if isinstance(e, (_Reject, Refused)):
            code, message = e.code, str(e)
        elif isinstance(e, Unavailable):  # a shard actor died (sharded.py): the device retries
            code, message = grpc.StatusCode.UNAVAILABLE, str(e)
        elif isinstance(e, (wire.PayloadTooLarge, TooManyDevices)):
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
        elif isinstance(e, (InvalidInputError, GraphError)):
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(e)
        else:  # a bug: log it, answer, keep serving
            _bad_log.log(("failed", method, type(e).__name__), logging.ERROR, "%s failed", method, exc_info=True)
            code, message = grpc.StatusCode.INTERNAL, (f"internal error ({type(e).__name__}: {e}); "
                                                       "the server logged it")
        _bad_log.log((method, code.name), logging.INFO, "%s: %s: %s", method, code.name, message)
        context.abort(code, message)

