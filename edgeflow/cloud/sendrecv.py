"""The device side of a split: a delegate whose send/recv kernels talk to the cloud service.

    device = Interpreter("device.efl", delegates=[CloudDelegate("host:port", token=...)])
    device = connect("device.efl", "host:port", token=...)  # the same

The `CloudDelegate` claims the package's send and recv ops (edgeflow/ops/comm.py). A send
copies its tensor aside under its rendezvous key; the first recv of a run makes one call to the
server with every tensor sent and fetches every tensor the run receives; later recvs of
the run take theirs from that reply. Each request names the cloud package's model id
and SHA-256, so a device package paired with another cloud package is refused.

`SplitRunner` serves the split signature: when the server cannot be reached and the
package also holds the whole graph (`infer_local`), it runs on the device alone and says
so once (then tries the cloud again after `retry_s`); when the cloud package hosts the
whole graph too, it re-chooses the cut from the link it measures, in the background and
never over a cut forced with `--cut` unless asked (`adapt`; see edgeflow.splitter.adaptive).
"""
import collections
import logging
import statistics
import threading
import time

import numpy as np

from ..errors import EdgeflowError, RemoteError
from ..format import metadata
from ..interp import Interpreter
from ..interp.delegate import Delegate
from ..interp.interpreter import SignatureRunner

_log = logging.getLogger("edgeflow")
UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


class _Exchange:
    """One round trip of a plan: tensors sent so far, the keys it receives, the reply."""

    def __init__(self, round_no):
        self.round, self.sent, self.fetches, self.reply = round_no, {}, [], {}


class CloudDelegate(Delegate):
    """Runs a device package's send/recv ops through a cloud `Client` (edgeflow.cloud.client).

    `cloud`: "host:port" (with `token`, `root_cert` for TLS, `client_cert` and `client_key`
    for a server that requires client certificates, `timeout` per call) or a
    Client. What the split chose -- the cloud package's `model_id` and `sha256`, the
    split `signature` and its `local_signature` fallback, `compression`, a training
    package's `rounds` -- comes from the package's "edgeflow.split" metadata unless given
    here. One delegate serves one Interpreter.

    For a split training package each round trip is a round of a training step,
    identified by (device_id, step_id, round): a round that fails because the server is
    unreachable or slow is retried, with backoff, for up to `retry_s` seconds, and the
    server answers a retry without running it again. `step_id` counts up after each step;
    a trainer sets it to its global step. `device_id` defaults to a random one; with a
    per-device token or a client certificate, give the credential's device id (a server
    refuses a step under any other: PERMISSION_DENIED).

    The jointly trained model. After split training the server holds the trained values of
    the cloud's variables (and their optimizer slots: the package's "cloud_variables"),
    the device those of its own. So before the interpreter runs any other signature
    (`infer`, `save`, `train_local`...) and before `Interpreter.export`, the delegate
    pulls the cloud's variables into the interpreter (`pull_variables`: one call, fetched
    uncompressed) when they are stale: never pulled yet, or split train steps ran since.
    Inference then runs on the device alone with the jointly trained weights, equal to
    the same model trained locally, and `export` (`edgeflow train -o`) writes the whole
    model as if trained locally (`edgeflow.splitter.training.whole_model`: its `train`
    signature is the whole step again; keep device.efl to go on training split).
    Running `restore` makes the device's values current (no pull after it; the server
    keeps its own). If the pull fails because the server is unreachable: after train
    steps in this process, RemoteError (the device's copies are stale); before any, a
    warning, and the device's own values are used (tried again after `retry_s`).
    `Interpreter.variables()` and `save_checkpoint` give the device's values as they are
    (call `interpreter.sync_variables()` first for the whole trained model).
    """

    name = "cloud"

    def __init__(self, cloud, token=None, root_cert=None, timeout=None, device_id=None, *,
                 model_id=None, sha256=None, signature=None, local_signature=None, compression=None,
                 rounds=None, client_cert=None, client_key=None):
        if isinstance(cloud, str):
            from .client import Client
            cloud = Client(cloud, token=token, root_cert=root_cert, client_cert=client_cert, client_key=client_key,
                           **({"timeout": timeout} if timeout else {}))
        self.client, self.timeout = cloud, timeout
        self.target = getattr(cloud, "target", "the cloud")
        self._given = {"cloud_model_id": model_id, "cloud_sha256": sha256, "signature": signature,
                       "local_signature": local_signature, "compression": compression, "rounds": rounds}
        self.model_id = self.sha256 = self.local_signature = self.rounds = None
        self.signature, self.compression = "infer", "none"  # compression of float32 tensors on the wire
        self.device_id, self.step_id, self.retry_s = device_id, 0, 60.0
        self.calls = 0
        self._compiling = None  # (plan arrays, {round: _Exchange}) of the plan being compiled
        self._interpreter = None
        self.cloud_variables = []  # the variables the server holds (a split training package)
        self.pulls = 0
        self._fresh = False  # the interpreter holds the server's current values of them
        self._trained = False  # split train steps ran through this delegate
        self._pull_after = 0.0  # an unreachable server is asked again after this (monotonic)

    def prepare(self, interpreter):
        if self._interpreter is not None:
            raise EdgeflowError("a CloudDelegate serves one Interpreter; make one per interpreter")
        self._interpreter = interpreter
        info = metadata.split(interpreter.model) or {}
        info = {**info, **{k: v for k, v in self._given.items() if v is not None}}
        if info.get("role", "device") != "device" or "cloud_model_id" not in info:
            raise EdgeflowError("CloudDelegate needs a device package made by `edgeflow split` (this "
                                f"model has no {metadata.SPLIT!r} metadata)")
        self.model_id, self.sha256 = info["cloud_model_id"], info.get("cloud_sha256")
        self.signature = info.get("signature", "infer")
        self.local_signature = info.get("local_signature")
        self.compression = info.get("compression", "none")
        if info.get("kind") == "train" or self._given["rounds"] is not None:
            import uuid
            self.rounds = info["rounds"]
            self.local_signature = None  # training never falls back: the server holds state
            self.device_id = self.device_id or uuid.uuid4().hex
            self.cloud_variables = list(info.get("cloud_variables", []))

    def wrap_runner(self, interpreter, key, runner):
        if key != self.signature:
            if self.rounds is None or not self.cloud_variables:
                return runner
            return _Restoring(self, runner) if key == "restore" else _Pulling(self, runner)
        local = self.local_signature
        fallback = interpreter.get_signature_runner(local) if local in interpreter.get_signature_list() else None
        return SplitRunner(interpreter, self, runner, fallback)

    def rebound(self):
        """A delegate like this one (its client, timeout, device and step ids) for another
        interpreter: that of a re-cut package reads its own split metadata."""
        other = CloudDelegate(self.client, timeout=self.timeout, device_id=self.device_id)
        other.step_id, other.retry_s = self.step_id, self.retry_s
        return other

    # -- the jointly trained model ---------------------------------------------------
    def pull_variables(self):
        """Fetch the cloud's variables (the package's "cloud_variables": the server's
        current values, uncompressed) into the interpreter; {name: array}."""
        values = self.client.run(self.model_id, {}, self.cloud_variables, sha256=self.sha256,
                                 timeout=self.timeout)
        self._interpreter.set_variables(values)
        self._fresh, self.pulls = True, self.pulls + 1
        return values

    def sync_variables(self, interpreter):
        """Pull the cloud's variables if they are stale (see the class docstring)."""
        if self._fresh or not self.cloud_variables or self.rounds is None:
            return
        if not self._trained and time.monotonic() < self._pull_after:
            return
        try:
            self.pull_variables()
        except RemoteError as e:
            if getattr(e, "code", None) not in UNREACHABLE:
                raise
            if self._trained:
                error = RemoteError(f"the cloud at {self.target} holds the trained values of "
                                  f"{len(self.cloud_variables)} variable(s) ({', '.join(self.cloud_variables[:4])}"
                                  f"{' ...' if len(self.cloud_variables) > 4 else ''}) and cannot be reached "
                                  f"({e}); the device's copies are stale: try again when it is back")
                error.code = e.code
                raise error from None
            _log.warning("%s: running with the device's own values of the cloud's variables", e)
            self._pull_after = time.monotonic() + self.retry_s

    def exported(self, model):
        """A split training package exports as the whole model (its `train_local` as `train`)."""
        if self.rounds is None:
            return model
        from ..splitter.training import whole_model
        return whole_model(model)

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
            self._fresh, self._trained = False, True  # the server's variables moved on
        return reply


class _Pulling:
    """A signature runner that first brings the cloud's variables up to date."""

    def __init__(self, cloud, runner):
        self._cloud, self._runner = cloud, runner

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def __call__(self, **inputs):
        self._cloud.sync_variables(self._cloud._interpreter)
        return self._runner(**inputs)


class _Restoring(_Pulling):
    """`restore`: the values it sets are the current ones (nothing to pull after it)."""

    def __call__(self, **inputs):
        out = self._runner(**inputs)
        self._cloud._fresh = True
        return out


def connect(model, cloud, token=None, root_cert=None, timeout=None, device_id=None, delegates=(),
            adapt=None, **interpreter_options):
    """An Interpreter of the device package `model` whose send/recv ops reach `cloud`
    ("host:port" or a Client) through a CloudDelegate, ahead of `delegates`. `adapt`:
    whether the split signature may move its cut at run time (see SplitRunner)."""
    delegate = CloudDelegate(cloud, token, root_cert, timeout, device_id)
    delegate.adapt = adapt  # read by SplitRunner
    return Interpreter(model, delegates=[delegate, *delegates], **interpreter_options)


class SplitRunner:
    """Calls the split signature, falling back to `infer_local` while the cloud is
    unreachable, and re-choosing the cut from the measured link when both packages hold
    the whole graph (edgeflow.splitter.adaptive).

    `adapt`: True lets the cut move, False keeps it; None (the default) takes the
    delegate's `adapt` attribute (`connect(..., adapt=...)`), else the package's choice:
    `edgeflow split` lets the cut move unless it was forced with `--cut` (and no
    `--adapt`). Re-planning never runs on the call path: every `replanner.every` calls a
    background thread measures the link, plans, and builds (and plans ahead) the new
    cut's interpreter; the first call after it is ready swaps it in. Each move is logged
    with its predicted seconds and the median measured call time over the `every` calls
    before and after it (`moves`, one dict per move); when the calls after it are slower
    than before by more than the replanner's margins (`margin` x before and
    `min_gain_s`; latency objective), the runner moves back and the replanner bars that
    cut until the link changes.
    """

    def __init__(self, interp, cloud, split_runner, local_runner, retry_s=30.0, adapt=None):
        self._interp, self._split, self._local = interp, split_runner, local_runner
        self.cloud, self.retry_s = cloud, retry_s  # the CloudDelegate of the current cut
        self._local_until = 0.0
        self.fallbacks = 0
        self._warned = False
        self.interpreter = interp  # the one running the current cut
        self.replanner = None
        self.moves = []
        self._clock = time.perf_counter
        self._thread = self._ready = self._watch = None
        info = metadata.split(interp.model) or {}
        if adapt is None:
            adapt = getattr(cloud, "adapt", None)
        if adapt is None:
            adapt = info.get("adapt", not info.get("forced_cut"))
        self.adapt = bool(adapt)
        if self.adapt and info.get("adaptive") and "cost_graph" in info and local_runner is not None:
            from ..splitter.adaptive import Replanner
            self.replanner = Replanner(info)
            self._times = collections.deque(maxlen=self.replanner.every)  # the current cut's calls

    @property
    def key(self):
        return self._split.key

    @property
    def last_plan(self):
        return self._split.last_plan

    @property
    def replanning(self):
        """True while a re-plan runs in the background."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def join(self, timeout=None):
        """Wait for a background re-plan to finish (tests, tools; calls never wait)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def get_input_details(self):
        return self._split.get_input_details()

    def get_output_details(self):
        return self._split.get_output_details()

    def __call__(self, **inputs):
        if self._ready is not None:
            self._adopt()
        if self._local is not None and time.monotonic() < self._local_until:
            return self._run_local(inputs)
        start = self._clock()
        try:
            out = self._split(**inputs)
        except RemoteError as e:
            if self._local is None or getattr(e, "code", None) not in UNREACHABLE:
                raise
            if not self._warned:
                _log.warning("%s: running on the device only", e)
                self._warned = True
            self._local_until = time.monotonic() + self.retry_s
            return self._run_local(inputs)
        if self.replanner is not None:
            self._after(self._clock() - start, inputs)
        return out

    # -- re-planning, off the call path ---------------------------------------------------
    def _after(self, seconds, inputs):
        if self._watch is not None:  # measuring a move: no re-plan until it is judged
            self._watch["after"].append(seconds)
            if len(self._watch["after"]) >= self.replanner.every:
                self._judge()
            return
        self._times.append(seconds)
        if self.replanner.due() and self._thread is None and self._ready is None:
            shapes = {name: np.shape(value) for name, value in inputs.items()}
            self._thread = threading.Thread(target=self._replan, args=(shapes,), daemon=True,
                                            name="edgeflow-replan")
            self._thread.start()

    def _replan(self, shapes):
        """In the background: measure, plan, and build the new cut's interpreter."""
        from ..format import writer
        try:
            link = self.replanner.measure(self.cloud.client)
            move = self.replanner.propose(link)
            if move is None:
                return
            model = self.replanner.recut(self._interp.model, move)
            others = [d for d in self.interpreter.delegates if d is not self.cloud]
            cloud = self.cloud.rebound()
            interp = Interpreter(writer.to_bytes(model), delegates=[cloud, *others],
                                 num_threads=self.interpreter.num_threads)
            sig = interp._signatures[self.cloud.signature]
            runner = SignatureRunner(interp, sig)
            try:  # plan ahead for the last call's shapes: the first call after the swap runs at once
                interp.plan_for(list(sig.inputs.values()), list(sig.outputs.values()),
                                {sig.inputs[n]: shape for n, shape in shapes.items() if n in sig.inputs},
                                sig.targets)
            except EdgeflowError as e:
                _log.info("planning the new cut ahead failed (%s): its first call plans it", e)
            self._ready = (move, interp, runner, cloud)
        except RemoteError as e:
            _log.info("re-planning skipped: measuring the link failed (%s)", e)
        except Exception as e:  # a bug or a bad package: keep the cut, say why
            _log.warning("re-planning failed, keeping the cut: %s: %s", type(e).__name__, e)
        finally:
            self._thread = None

    def _adopt(self):
        """Between calls: swap in the cut a background re-plan made."""
        move, interp, runner, cloud = self._ready
        self._ready = None
        before = statistics.median(self._times) if self._times else None
        previous = (self.interpreter, self._split, self.cloud, self.replanner.current)
        self.interpreter, self._split, self.cloud = interp, runner, cloud
        self._watch = {"move": move, "previous": previous, "before": before, "after": []}
        self._times.clear()
        self.replanner.adopt(move)
        _log.info("re-planned the split for the measured link (%s): %d ops on the device, was %d; "
                  "predicted %.3f ms, was %.3f ms; measured %s before (median of %d calls)",
                  move.link.describe(), len(move.device_ops), len(previous[3]),
                  move.predicted_after_s * 1e3, move.predicted_before_s * 1e3, _ms(before),
                  self.replanner.every)

    def _judge(self):
        """After `every` calls on a new cut: log what it measured; move back if slower."""
        watch, self._watch = self._watch, None
        move, before = watch["move"], watch["before"]
        after = statistics.median(watch["after"])
        planner = self.replanner
        slower = (planner.objective == "latency" and before is not None
                  and after - before > max(planner.margin * before, planner.min_gain_s))
        self.moves.append({"device_ops": len(move.device_ops), "was": len(watch["previous"][3]),
                           "link": move.link.describe(), "predicted_before_s": move.predicted_before_s,
                           "predicted_after_s": move.predicted_after_s, "measured_before_s": before,
                           "measured_after_s": after, "moved_back": slower})
        _log.info("the moved cut (%d ops on the device, was %d): measured %s per call, was %s "
                  "(predicted %.3f ms, was %.3f ms)%s", len(move.device_ops), len(watch["previous"][3]),
                  _ms(after), _ms(before), move.predicted_after_s * 1e3, move.predicted_before_s * 1e3,
                  ": slower than predicted, moving back" if slower else "")
        if slower:
            self.interpreter, self._split, self.cloud, device_ops = watch["previous"]
            planner.reject(move, device_ops)
        else:
            self._times.extend(watch["after"])

    def _run_local(self, inputs):
        self.fallbacks += 1
        return self._local(**inputs)


def _ms(seconds):
    return "?" if seconds is None else f"{seconds * 1e3:.3f} ms"
