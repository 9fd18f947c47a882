"""The client of a parameter server: pulls values, pushes gradients (sync, async) or models
(FedAvg), retrying what the network lost with the same ids so nothing applies twice.

    with ParameterClient("server:50052", token=...) as cloud:
        pulled = cloud.pull("mlp", device_id="phone-17")
        cloud.push("mlp", "phone-17", step_id, gradients, samples, pulled.version, "async")
"""
import dataclasses
import random
import threading
import time

import grpc

from ...errors import InvalidInputError
from .. import ps_pb2 as pb
from .. import ps_pb2_grpc as pb_grpc
from .. import wire
from ..client import Client
from .service import MODE_NAMES, PB_MODES
from .state import RESULTS


@dataclasses.dataclass
class Pulled:
    """A Pull's answer: the values (empty when `changed` is False) at `version`."""
    version: int
    incarnation: str
    mode: str
    replicas: int
    last_step_id: int
    changed: bool
    values: dict


@dataclasses.dataclass
class Pushed:
    """A push's answer. `result`: "applied", "pending", "dropped" or "unspecified" (a
    duplicate of an older step); `duplicate`: a retry of a push already taken."""
    result: str
    duplicate: bool
    version: int
    last_step_id: int
    incarnation: str
    reason: str
    staleness: int


_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ParameterClient(Client):
    """Pulls and pushes to a parameter server at `target` ("host:port"); the rest as Client
    (token, TLS and client certificates, `timeout` per call, `wait_ready`, `status`).

    A call that fails with UNAVAILABLE or DEADLINE_EXCEEDED is sent again, unchanged (the
    same device and step ids, so the server never applies it twice), after an exponential
    backoff (`backoff` = (first delay, longest delay) in seconds, with jitter), for up to
    `retry_for` seconds in all; then RemoteError. `bytes_pushed`, `bytes_pulled`,
    `retries` count what went over the wire. Thread-safe.
    """

    def __init__(self, target, token=None, root_cert=None, timeout=30.0, retry_for=60.0,
                 backoff=(0.05, 2.0), max_reply_bytes=1 << 30, client_cert=None, client_key=None):
        super().__init__(target, token=token, root_cert=root_cert, timeout=timeout,
                         max_reply_bytes=max_reply_bytes, client_cert=client_cert, client_key=client_key)
        if not retry_for >= 0 or not 0 < backoff[0] <= backoff[1]:
            raise InvalidInputError(f"ParameterClient: expected retry_for >= 0 and 0 < backoff[0] <= "
                                    f"backoff[1], got {retry_for} and {backoff}")
        self.retry_for, self.backoff = retry_for, tuple(backoff)
        self._ps = pb_grpc.ParameterServerStub(self._channel)
        self._count_lock = threading.Lock()
        self.bytes_pushed = self.bytes_pulled = self.retries = 0

    def _retrying(self, method, timeout, attempt):
        give_up = time.monotonic() + self.retry_for
        delay = self.backoff[0]
        while True:
            try:
                return attempt()
            except grpc.RpcError as e:
                if e.code() not in _RETRYABLE or time.monotonic() + delay > give_up:
                    raise self._error(method, e, timeout) from None
            with self._count_lock:
                self.retries += 1
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, self.backoff[1])

    def _count(self, pushed=0, pulled=0):
        with self._count_lock:
            self.bytes_pushed += pushed
            self.bytes_pulled += pulled

    def status(self, model_id, timeout=None):
        """The server's state of `model_id` as a dict: mode, replicas, version, incarnation,
        updates_applied, checkpoint_version, variables, devices ({id: {last_step_id,
        applied, last_result}}), pending_devices, duplicates, dropped."""
        timeout = self._deadline(timeout)

        def attempt():
            return self._ps.Status(pb.StatusRequest(model_id=model_id), timeout=timeout,
                                   metadata=self._metadata)
        r = self._retrying("Status", timeout, attempt)
        return {"model_id": r.model_id, "model_sha256": r.model_sha256, "mode": MODE_NAMES.get(r.mode, ""),
                "replicas": r.replicas, "version": r.version, "incarnation": r.incarnation,
                "updates_applied": r.updates_applied, "checkpoint_version": r.checkpoint_version,
                "variables": {v.name: {"dtype": v.dtype, "shape": tuple(v.shape), "trainable": v.trainable}
                              for v in r.variables},
                "devices": {d.device_id: {"last_step_id": d.last_step_id, "applied": d.applied,
                                          "last_result": RESULTS.get(d.last_result, "unspecified")}
                            for d in r.devices},
                "pending_devices": list(r.pending_devices), "duplicates": r.duplicates, "dropped": r.dropped}

    def pull(self, model_id, names=None, device_id="", sha256=None, wait_while=None, incarnation="",
             wait=0.0, compression="none", timeout=None):
        """A Pulled with the values of `names` (default: every served trainable variable).
        With `wait` > 0 seconds and `wait_while` (a version), the server first waits while
        its version is `wait_while` and its incarnation `incarnation`; if nothing changes,
        `changed` is False and no values come."""
        encoding = wire.encoding_named(compression)
        timeout = self._deadline(timeout)
        if wait and wait_while is None:
            raise InvalidInputError("pull: wait needs wait_while (the version to wait past)")
        request = pb.PullRequest(model_id=model_id, model_sha256=sha256 or "", device_id=device_id,
                                 names=list(names or ()), wait_while_version=wait_while or 0,
                                 incarnation=incarnation, wait_seconds=wait if wait_while is not None else 0,
                                 encoding=encoding)

        def attempt():
            replies = self._ps.Pull(request, timeout=timeout + request.wait_seconds, metadata=self._metadata)
            header, values, _ = self.read_chunked(replies, "Pull reply", "a PullHeader", "variable")
            return header, values
        header, values = self._retrying("Pull", timeout, attempt)
        self._count(pulled=sum(wire.encoded_bytes(a, encoding) for a in values.values()))
        return Pulled(header.version, header.incarnation, MODE_NAMES.get(header.mode, ""), header.replicas,
                      header.last_step_id, header.changed, values)

    def push(self, model_id, device_id, step_id, gradients, sample_count, version, mode, sha256=None,
             compression="none", timeout=None):
        """Push `gradients` ({variable name: array}) of step `step_id`, computed from the
        values at `version` on `sample_count` samples; a Pushed."""
        header = pb.PushHeader(model_id=model_id, model_sha256=sha256 or "", device_id=device_id,
                               step_id=step_id, version=version, sample_count=sample_count,
                               mode=_pb_mode(mode))
        return self._push_stream("Push", self._ps.Push, pb.PushRequest, header, gradients, compression,
                                 timeout)

    def push_model(self, model_id, device_id, round_id, values, sample_count, sha256=None,
                   compression="none", timeout=None):
        """Push a device's locally trained `values` for FedAvg round `round_id`; a Pushed."""
        header = pb.PushModelHeader(model_id=model_id, model_sha256=sha256 or "", device_id=device_id,
                                    round_id=round_id, sample_count=sample_count)
        return self._push_stream("PushModel", self._ps.PushModel, pb.PushModelRequest, header, values,
                                 compression, timeout)

    def _push_stream(self, method, call, message, header, tensors, compression, timeout):
        encoding = wire.encoding_named(compression)
        arrays = {n: wire.as_array(a, f"{method} tensor {n!r}") for n, a in tensors.items()}
        timeout = self._deadline(timeout)

        def requests():
            yield message(header=header)
            for name, array in arrays.items():
                for chunk in wire.chunks(name, array, encoding=encoding):
                    yield message(chunk=chunk)

        r = self._retrying(method, timeout, lambda: call(requests(), timeout=timeout, metadata=self._metadata))
        self._count(pushed=sum(wire.encoded_bytes(a, encoding) for a in arrays.values()))
        return Pushed(RESULTS.get(r.result, "unspecified"), r.duplicate, r.version, r.last_step_id,
                      r.incarnation, r.reason, r.staleness)


def _pb_mode(mode):
    if mode not in PB_MODES:
        raise InvalidInputError(f"mode: expected one of {', '.join(PB_MODES)}, got {mode!r}")
    return PB_MODES[mode]
