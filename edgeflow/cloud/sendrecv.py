"""The device side of a split: send/recv kernels that talk to the cloud service.

`Interpreter(device_package, cloud="host:port", token=...)` attaches a `CloudDelegate`,
which claims the package's send and recv ops (edgeflow/ops/comm.py). A send copies its
tensor aside under its rendezvous key; the first recv of a run makes one call to the
server with every tensor sent and fetches every tensor the run receives; later recvs of
the run take theirs from that reply. Each request names the cloud package's model id
and SHA-256, so a device package paired with another cloud package is refused.

`SplitRunner` serves the split signature: when the server cannot be reached and the
package also holds the whole graph (`infer_local`), it runs on the device alone and says
so once (then tries the cloud again after `retry_s`); when the cloud package hosts the
whole graph too, it re-chooses the cut from the link it measures (see edgeflow.splitter.adaptive).
"""
import logging
import time

import numpy as np

from ..errors import EdgeflowError, RemoteError
from ..interp.delegate import Delegate

_log = logging.getLogger("edgeflow")
UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


class _Exchange:
    """One round trip of a plan: tensors sent so far, the keys it receives, the reply."""

    def __init__(self, round_no):
        self.round, self.sent, self.fetches, self.reply = round_no, {}, [], {}


class CloudDelegate(Delegate):
    """Runs send/recv ops through a cloud `Client` (edgeflow.cloud.client).

    For a split training package (`rounds` from its metadata) each round trip is a round
    of a training step, identified by (device_id, step_id, round): a round that fails
    because the server is unreachable or slow is retried, with backoff, for up to
    `retry_s` seconds, and the server answers a retry without running it again. `step_id`
    counts up after each step; a trainer sets it to its global step.
    """

    name = "cloud"

    def __init__(self, client, model_id, sha256=None, timeout=None):
        self.client, self.model_id, self.sha256, self.timeout = client, model_id, sha256, timeout
        self._compiling = None  # (plan arrays, {round: _Exchange}) of the plan being compiled
        self.signature, self.local_signature = "infer", None
        self.compression = "none"  # of float32 tensors on the wire, as the split chose
        self.calls = 0
        self.rounds = None  # a training package's rounds (edgeflow.splitter.training)
        self.device_id, self.step_id, self.retry_s = None, 0, 60.0

    def unsupported(self, op, ins, outs):
        return None if op.opcode in ("send", "recv") else "runs on the device"

    def compile(self, partition):
        if self._compiling is None or self._compiling[0] is not partition.arrays:
            self._compiling = (partition.arrays, {})  # a new plan: its own exchanges
        exchanges = self._compiling[1]
        steps = []
        for _, op in partition.ops:
            key, round_no = op.attrs["key"], op.attrs.get("round", 1)
            exchange = exchanges.setdefault(round_no, _Exchange(round_no))
            if op.opcode == "send":
                steps.append(self._sender(exchange, key, partition.arrays[op.inputs[0]]))
            elif key:
                exchange.fetches.append(key)
                steps.append(self._receiver(exchange, key, partition.arrays[op.outputs[0]]))
            else:  # a round that brings nothing back still makes its call
                steps.append(self._receiver(exchange, None, None))

        def run():
            for step in steps:
                step()
        return run

    @staticmethod
    def _sender(exchange, key, source):
        def send():
            exchange.reply = {}  # a new run: nothing left over from a failed one
            exchange.sent[key] = np.array(source)  # its arena bytes may be reused before recv
        return send

    def _receiver(self, exchange, key, out):
        def recv():
            if key is None or key not in exchange.reply:
                sent, exchange.sent = exchange.sent, {}
                exchange.reply = self._call(exchange, sent)
                self.calls += 1
            if key is None:
                return
            value = exchange.reply.pop(key, None)
            if value is None:
                raise RemoteError(f"the cloud's reply has no tensor {key!r}")
            if value.shape != out.shape or value.dtype != out.dtype:
                raise RemoteError(f"the cloud returned {value.dtype}{list(value.shape)} for {key!r}, "
                                  f"expected {out.dtype}{list(out.shape)}")
            np.copyto(out, value)
        return recv


    def _call(self, exchange, sent):
        """The reply to one round trip; a training round is retried while the server is
        unreachable or slow (the same request: the server answers it once)."""
        if self.rounds is None:
            return self.client.run(self.model_id, sent, exchange.fetches, sha256=self.sha256,
                                   timeout=self.timeout, compression=self.compression)
        plan = self.rounds[exchange.round - 1]
        final = exchange.round == len(self.rounds)
        step = {"device_id": self.device_id, "step_id": self.step_id, "round": exchange.round,
                "keep": plan["keep"], "targets": plan["targets"], "final": final}
        deadline, pause = time.monotonic() + self.retry_s, 0.1
        while True:
            try:
                reply = self.client.run(self.model_id, sent, exchange.fetches, sha256=self.sha256,
                                        timeout=self.timeout, compression=self.compression, step=step)
                break
            except RemoteError as e:
                if getattr(e, "code", None) not in UNREACHABLE or time.monotonic() + pause > deadline:
                    raise
                _log.info("step %d round %d: %s; retrying in %.1f s", self.step_id, exchange.round, e, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        if final:
            self.step_id += 1
        return reply


def attach(interp, cloud, token=None, root_cert=None, timeout=None, device_id=None):
    """Make `interp` (an Interpreter of a device package) exchange tensors with `cloud`
    ("host:port" or a Client); returns the CloudDelegate."""
    from ..splitter.partition import split_info
    info = split_info(interp.model)
    if info is None or info.get("role") != "device":
        raise EdgeflowError("cloud= needs a device package made by `edgeflow split` (this model "
                            "has no 'edgeflow.split' metadata)")
    if isinstance(cloud, str):
        from .client import Client
        client = Client(cloud, token=token, root_cert=root_cert,
                        **({"timeout": timeout} if timeout else {}))
    else:
        client = cloud
    delegate = CloudDelegate(client, info["cloud_model_id"], info["cloud_sha256"], timeout)
    delegate.signature, delegate.local_signature = info["signature"], info.get("local_signature")
    delegate.compression = info.get("compression", "none")
    if info.get("kind") == "train":
        import uuid
        delegate.rounds = info["rounds"]
        delegate.local_signature = None  # training never falls back: the server holds state
        delegate.device_id = device_id or uuid.uuid4().hex
    interp.delegates.insert(0, delegate)
    return delegate


class SplitRunner:
    """Calls the split signature, falling back to `infer_local` while the cloud is
    unreachable, and re-choosing the cut from the measured link when both packages hold
    the whole graph (`adapt`, edgeflow.splitter.adaptive)."""

    def __init__(self, interp, split_runner, local_runner, target, retry_s=30.0, adapt=True):
        self._interp, self._split, self._local = interp, split_runner, local_runner
        self._target, self.retry_s = target, retry_s
        self._local_until = 0.0
        self.fallbacks = 0
        self._warned = False
        self.interpreter = interp  # the one running the current cut
        self.replanner = None
        if adapt:
            from ..splitter.partition import split_info
            info = split_info(interp.model)
            if info.get("adaptive") and "cost_graph" in info and local_runner is not None:
                from ..splitter.adaptive import Replanner
                self.replanner = Replanner(info)

    @property
    def key(self):
        return self._split.key

    @property
    def last_plan(self):
        return self._split.last_plan

    def get_input_details(self):
        return self._split.get_input_details()

    def get_output_details(self):
        return self._split.get_output_details()

    def __call__(self, **inputs):
        if self._local is not None and time.monotonic() < self._local_until:
            return self._run_local(inputs)
        try:
            out = self._split(**inputs)
        except RemoteError as e:
            if self._local is None or getattr(e, "code", None) not in UNREACHABLE:
                raise
            if not self._warned:
                _log.warning("the cloud at %s is unreachable (%s): running on the device only",
                             self._target, e)
                self._warned = True
            self._local_until = time.monotonic() + self.retry_s
            return self._run_local(inputs)
        if self.replanner is not None and self.replanner.due():
            self._replan()
        return out

    def _replan(self):
        """Plan again for the measured link; move the cut if another is clearly faster."""
        from ..format import writer
        from ..interp.interpreter import Interpreter, SignatureRunner
        current = self.interpreter
        client = current.cloud.client
        try:
            link = self.replanner.measure(client)
        except RemoteError as e:
            _log.info("re-planning skipped: measuring the link failed (%s)", e)
            return
        proposed = self.replanner.propose(link)
        if proposed is None:
            return
        before = len(self.replanner.current)
        model = self.replanner.recut(current.model, proposed)
        others = [d for d in current.delegates if d is not current.cloud]
        interp = Interpreter(writer.to_bytes(model), delegates=others, num_threads=current.num_threads,
                             cloud=client, cloud_timeout=current.cloud.timeout)
        self._split = SignatureRunner(interp, interp._signatures[current.cloud.signature])
        self.interpreter = interp
        _log.info("re-planned the split for the measured link (%s): %d ops on the device, was %d",
                  link.describe(), len(proposed), before)

    def _run_local(self, inputs):
        self.fallbacks += 1
        return self._local(**inputs)
