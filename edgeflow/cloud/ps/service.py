"""The parameter server: variables pinned to the cloud live here; devices pull and push.

A trainable package (`ef.save` with a `train` signature whose targets are an optimizer's
updates) whose variables were created under `with ef.device("cloud")` carries, in its
"edgeflow.roles" metadata, each variable's gradient tensor and the ops of its optimizer
update (placed "cloud"). `ParameterService` holds, per model, those variables and their
optimizer slots in one Interpreter of the same package, guarded by a lock, and applies
updates by feeding the gradient tensors and running the update ops (`Interpreter.run`).
Devices (edgeflow/cloud/federated.py) run the rest: forward and backward to the
gradients, with their local copies set to the values they pulled.

Modes (one per service):

- "sync": a global step takes `replicas` devices' gradients, averaged weighted by their
  sample counts (the plain mean of SyncReplicasOptimizer when batches are equal, and in
  general the gradient of the union of the batches), then one optimizer update. A push
  computed from an older version is dropped and reported, as SyncReplicasOptimizer drops
  stale gradients; a device that has pushed waits (Pull with wait) for the next version.
  With more devices than `replicas`, the slowest are backups whose pushes come too late
  (SyncReplicasOptimizer's replicas_to_aggregate < total_num_replicas); with fewer, no
  step completes.
- "async": every push is applied at once (its staleness, the versions applied since the
  values it was computed from, is reported; `max_staleness` drops older ones).
- "fedavg": devices train locally and push their values (PushModel); a round takes
  `replicas` devices' models and sets the variables to their average weighted by sample
  count (McMahan et al.'s FedAvg). Optimizer slots stay on the devices.

Exactly once: every push carries (device id, step id). The server keeps, per device, the
last step id taken and the reply it gave; a push with that step id again (a retry after
a timeout, a lost reply or a server restart) gets that reply with `duplicate` set and
changes nothing, and an older step id is refused the same way. In async mode a device's
step ids must follow each other (0, 1, 2, ...); a gap is refused with the step id to
resume from. A FedAvg push's step id is its round; the sync device loop uses the global
step its gradients are for.

Checkpoints (`checkpoint_dir`): every `checkpoint_every` applied updates, and on
`checkpoint()` (Server.stop calls it), one CRC-checked npz per model (the variables and
slots, the sync or FedAvg contributions still pending, the table of devices' last steps
and replies, the version and counters) written atomically (temp file, fsync, rename) by
edgeflow.interp.checkpoint. A new service resumes from it. Whatever was applied after the
last checkpoint is lost with a crash, and the table forgets it too, so devices redo it:
they learn the version (sync, FedAvg) or their last step id (async) and the server's new
incarnation from every reply, and train on from there. No step is lost or applied twice.

Only optimizer updates run here: other writes of the `train` signature (batch-norm moving
statistics, say) run on each device, on its own copy.

Serve it with `Server(parameter_server=ParameterService(...))`, or standalone:

    python -m edgeflow.cloud.ps --model mlp=mlp.efl --mode sync --replicas 3 \
        --checkpoint-dir state/ --port 50052
"""
import argparse
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import random
import re
import threading
import time
import uuid
import zipfile

import grpc
import numpy as np

from .. import ops
from ..errors import EdgeflowError, FormatError, GraphError, InvalidInputError, PlacementError
from ..graph.save import RESTORE, ROLES_METADATA
from ..interp import Interpreter
from ..interp import checkpoint as ckpt
from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from .client import Client

SERVICE = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name  # "edgeflow.ps.v1.ParameterServer"
MODES = {"sync": pb.MODE_SYNC, "async": pb.MODE_ASYNC, "fedavg": pb.MODE_FEDAVG}
MODE_NAMES = {v: k for k, v in MODES.items()}
RESULTS = {pb.RESULT_UNSPECIFIED: "unspecified", pb.RESULT_APPLIED: "applied",
           pb.RESULT_PENDING: "pending", pb.RESULT_DROPPED: "dropped"}
MAX_WAIT_S = 30.0  # the longest a Pull waits for the version to change
DEFAULT_MAX_REQUEST_BYTES = 256 << 20
_MAX_DEVICE_ID = 128
_log = logging.getLogger("edgeflow.cloud.ps")


# -- what a trainable package says about its training ------------------------------------

@dataclasses.dataclass
class VariableRole:
    """One trainable variable: its tensor, the gradient its optimizer applies, the ops of its
    update that write state (assigns), the slots they write, and where they run."""
    name: str
    index: int
    gradient: str  # the gradient tensor's name
    assigns: list  # operator indices
    slots: list  # slot variable names
    placement: str  # "cloud", "device" or ""


class TrainingRoles:
    """The training structure of a trainable package (a ModelDef): its variables, each
    trainable one's gradient, update ops, slots and placement (from "edgeflow.roles"), the
    `train` signature and the `restore` assigns that set variables."""

    def __init__(self, model):
        sub = model.subgraphs[0]
        self.tensors, self.operators = sub.tensors, sub.operators
        signatures = {s.key: s for s in model.signatures}
        for key in ("train", RESTORE):
            if key not in signatures:
                raise FormatError(f"expected a trainable package with a {key!r} signature (ef.save with "
                                  f"'train': (inputs, {{'loss': loss}}, [optimizer.minimize(loss)])); "
                                  f"it has {sorted(signatures)}")
        raw = model.metadata.get(ROLES_METADATA)
        if raw is None:
            raise FormatError(f"the package has no {ROLES_METADATA!r} metadata: expected one made by "
                              "ef.save/ef.to_model from a graph with an optimizer")
        try:
            roles = json.loads(bytes(raw).decode())
            update = {int(op): int(var) for op, var in roles.get("update", {}).items()}
            gradients = {int(var): int(g) for var, g in roles.get("gradients", {}).items()}
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise FormatError(f"metadata {ROLES_METADATA!r} is malformed ({e})") from None
        n_tensors, n_ops = len(self.tensors), len(self.operators)
        if any(not 0 <= i < n_ops or not 0 <= v < n_tensors for i, v in update.items()) or \
                any(not 0 <= v < n_tensors or not 0 <= g < n_tensors for v, g in gradients.items()):
            raise FormatError(f"metadata {ROLES_METADATA!r} names tensors or ops out of range")
        self.variables = {t.name: i for i, t in enumerate(self.tensors) if t.is_variable}
        self.train = signatures["train"]
        self.inputs = {name: self.tensors[i].name for name, i in self.train.inputs.items()}
        self.outputs = {name: self.tensors[i].name for name, i in self.train.outputs.items()}
        restore = signatures[RESTORE]
        writes = {self.operators[op].inputs[0]: op for op in restore.targets}
        self.restore = {}  # variable name -> (restore input tensor name, its assign op)
        for name, i in restore.inputs.items():
            var = self.variables.get(name)
            if var is None or var not in writes or self.operators[writes[var]].inputs[1] != i:
                raise FormatError(f"the {RESTORE!r} signature's input {name!r} does not assign a variable")
            self.restore[name] = (self.tensors[i].name, writes[var])
        self.roles = {}  # name -> VariableRole, for every variable its optimizer updates
        by_var = {}
        for op, var in update.items():
            by_var.setdefault(var, []).append(op)
        for var, op_list in sorted(by_var.items()):
            if var not in gradients or not self.tensors[var].is_variable:
                continue
            assigns = sorted(op for op in op_list if ops.get(self.operators[op].opcode).stateful)
            places = {self.operators[op].placement or "" for op in assigns}
            if len(places) > 1:
                raise PlacementError(f"variable {self.tensors[var].name!r}: its optimizer update is placed "
                                     f"on {sorted(places)}; expected one side")
            slots = sorted({self.tensors[self.operators[op].inputs[0]].name for op in assigns} -
                           {self.tensors[var].name})
            self.roles[self.tensors[var].name] = VariableRole(
                self.tensors[var].name, var, self.tensors[gradients[var]].name, assigns, slots,
                places.pop() if places else "")
        if not self.roles:
            raise FormatError("the package's roles name no variable updated by an optimizer")

    def served(self, which="cloud"):
        """Names of the trainable variables a parameter server holds: those whose updates
        are placed "cloud" (`with ef.device("cloud")`), or "all"."""
        if which == "all":
            return list(self.roles)
        names = [n for n, r in self.roles.items() if r.placement == "cloud"]
        if not names:
            raise PlacementError("no trainable variable is placed in the cloud: create them under "
                                 "`with ef.device(\"cloud\"):`, or serve every one (variables=\"all\")")
        return names

    def check_served(self, names):
        """InvalidInputError unless `names` are trainable variables of this package."""
        unknown = [n for n in names if n not in self.roles]
        if unknown:
            raise InvalidInputError(f"the server holds variable(s) {unknown} that this package does not "
                                    f"train; it trains {sorted(self.roles)} (another package?)")

    def slots_of(self, names):
        return [s for n in names for s in self.roles[n].slots]

    def update_targets(self, names):
        """The assign ops of the updates of variables `names` (their slots' writes included)."""
        return sorted(op for n in names for op in self.roles[n].assigns)

    def device_targets(self, names):
        """The `train` signature's targets, less the updates of the variables `names`."""
        remote = set(self.update_targets(names))
        return [op for op in self.train.targets if op not in remote]

    def check_update_closed(self, names):
        """GraphError unless the updates of `names` need only their gradients, constants and
        the server's variables (those, and their slots)."""
        held = {self.variables[n] for n in list(names) + self.slots_of(names)}
        fed = {i for i, t in enumerate(self.tensors) if t.name in {self.roles[n].gradient for n in names}}
        producer = {t: i for i, op in enumerate(self.operators) for t in op.outputs}
        seen, todo = set(), [t for op in self.update_targets(names) for t in self.operators[op].inputs]
        while todo:
            t = todo.pop()
            if t in seen or t in fed or t in held:
                continue
            seen.add(t)
            tensor = self.tensors[t]
            if tensor.is_variable:
                raise GraphError(f"the optimizer update of the served variables reads variable "
                                 f"{tensor.name!r}, which the server does not hold")
            if t in producer:
                todo.extend(self.operators[producer[t]].inputs)
            elif tensor.data is None:
                raise GraphError(f"the optimizer update of the served variables needs {tensor.name!r} "
                                 "(fed at run time), which the server does not have; expected updates "
                                 "computed from the gradients, the variables and constants")

    def set_variables(self, interp, values):
        """Write {variable name: array} into `interp`'s variables through the package's
        `restore` assigns (only those named)."""
        if not values:
            return
        feeds, targets = {}, []
        for name, value in values.items():
            tensor_name, op = self.restore[name]
            feeds[tensor_name] = value
            targets.append(op)
        interp.run([], feeds, targets)

    def initial(self, name):
        """A variable's value in the package."""
        return np.array(self.tensors[self.variables[name]].data)

    def spec(self, name):
        t = self.tensors[self.variables[name]]
        return t.dtype, tuple(t.shape)


def package_sha256(data):
    return hashlib.sha256(data).hexdigest()


# -- the server's state of one model -------------------------------------------------------

def _reply(result, version, last, incarnation, reason="", staleness=0, duplicate=False):
    return {"result": int(result), "duplicate": duplicate, "version": int(version),
            "last_step_id": int(last), "incarnation": incarnation, "reason": reason,
            "staleness": int(staleness)}


class _Hosted:
    """One trainable model on the server: its interpreter (the variables and slots), the
    devices' table, the pending contributions of the current step, counters."""

    def __init__(self, model_id, data, source, service):
        self.id, self.source, self.service = model_id, source, service
        self.sha256 = package_sha256(data)
        self.interp = Interpreter(data)
        self.roles = TrainingRoles(self.interp.model)
        self.mode, self.replicas = service.mode, service.replicas
        self.names = self.roles.served(service.variables)  # trainable, served
        self.slots = [] if self.mode == "fedavg" else self.roles.slots_of(self.names)
        if self.mode != "fedavg":
            self.roles.check_update_closed(self.names)
        self.targets = self.roles.update_targets(self.names)
        self.specs = {n: self.roles.spec(n) for n in self.names + self.slots}
        self.cond = threading.Condition(threading.Lock())
        self.version = 0  # global step (sync, async) or round (FedAvg)
        self.updates = 0  # optimizer updates or averages applied
        self.devices = {}  # device id -> {"last": step id, "reply": reply dict, "applied": n}
        self.pending = {}  # device id -> (sample count, {name: array}) for the current version
        self.duplicates = self.dropped = 0
        self.checkpoint_version = 0
        self._snapshots = 0  # snapshots taken, so that an older one never overwrites a newer
        self._written = 0
        self._write_lock = threading.Lock()
        self.path = None
        if service.checkpoint_dir:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_id)
            if safe != model_id:
                safe += "-" + hashlib.sha256(model_id.encode()).hexdigest()[:8]
            self.path = os.path.join(service.checkpoint_dir, f"{safe}.ps.npz")
            if os.path.exists(self.path):
                self._restore()

    # -- reading -------------------------------------------------------------------
    def values(self, names):
        return {n: self.interp.get_tensor(self.roles.variables[n]) for n in names}

    def last_step(self, device):
        record = self.devices.get(device)
        return record["last"] if record else -1

    def check_names(self, names, what):
        """InvalidInputError unless `names` are served variables."""
        unknown = [n for n in names if n not in self.specs]
        if unknown:
            raise InvalidInputError(f"{what}: model {self.id!r} serves no variable {unknown}; it serves "
                                    f"{self.names}" + (f" and slots {self.slots}" if self.slots else ""))

    def expect(self, name, dtype, shape):
        """The check of each pushed tensor's header (wire.Assembler's `expect`)."""
        if name not in self.names:
            raise InvalidInputError(f"push: model {self.id!r} has no served trainable variable {name!r}; "
                                    f"expected {self.names}")
        want_dtype, want_shape = self.specs[name]
        if dtype != want_dtype or tuple(shape) != want_shape:
            raise InvalidInputError(f"push: variable {name!r}: expected {want_dtype.name}{list(want_shape)}, "
                                    f"got {dtype.name}{list(shape)}")

    # -- a push ----------------------------------------------------------------------
    def push(self, device, step_id, version, count, arrays):
        """The reply dict to a push (gradients in sync/async mode, values in FedAvg)."""
        snapshot = None
        with self.cond:
            incarnation = self.service.incarnation
            record = self.devices.get(device)
            last = record["last"] if record else -1
            if step_id <= last:
                self.duplicates += 1
                if step_id == last:
                    return {**record["reply"], "duplicate": True}
                return _reply(pb.RESULT_UNSPECIFIED, self.version, last, incarnation, duplicate=True,
                              reason=f"step id {step_id} was taken before (the last from device "
                                     f"{device!r} is {last}); not applied again")
            if self.mode == "async":
                reply = self._push_async(device, step_id, version, last, arrays)
            else:
                reply = self._push_step(device, step_id, version, last, count, arrays)
            self.cond.notify_all()
            if reply["result"] == pb.RESULT_APPLIED and self.path and \
                    self.updates % self.service.checkpoint_every == 0:
                snapshot = self._snapshot()
        if snapshot is not None:
            self._write(snapshot)
        return reply

    def _record(self, device, step_id, reply, applied=0):
        record = self.devices.setdefault(device, {"last": -1, "reply": None, "applied": 0})
        record["last"], record["reply"] = step_id, reply
        record["applied"] += applied
        return reply

    def _drop(self, device, step_id, last, reason, record):
        self.dropped += 1
        reply = _reply(pb.RESULT_DROPPED, self.version, step_id if record else last,
                       self.service.incarnation, reason)
        return self._record(device, step_id, reply) if record else reply

    def _push_async(self, device, step_id, version, last, grads):
        if step_id != last + 1:
            return self._drop(device, step_id, last, f"out of order: expected step id {last + 1} from "
                              f"device {device!r} (the server resumed from a checkpoint, or a step was "
                              f"skipped); resume from step {last + 1}", record=False)
        staleness = max(0, self.version - version)
        limit = self.service.max_staleness
        if limit is not None and staleness > limit:
            return self._drop(device, step_id, last, f"stale: computed from version {version}, the server "
                              f"is at {self.version} (staleness {staleness} > {limit})", record=True)
        self._apply_gradients(grads)
        self.version += 1
        self.updates += 1
        return self._record(device, step_id, _reply(pb.RESULT_APPLIED, self.version, step_id,
                                                    self.service.incarnation, staleness=staleness), 1)

    def _push_step(self, device, step_id, version, last, count, arrays):
        what = "round" if self.mode == "fedavg" else "step"
        if version > self.version:
            return self._drop(device, step_id, last, f"ahead: the server is at {what} {self.version} (it "
                              f"resumed from a checkpoint), the push is for {what} {version}; pull again",
                              record=False)
        if version < self.version:
            return self._drop(device, step_id, last, f"stale: the push is for {what} {version}, the server "
                              f"is at {what} {self.version}", record=True)
        if device in self.pending:
            return self._drop(device, step_id, last, f"device {device!r} has already pushed for {what} "
                              f"{version}", record=True)
        if len(self.pending) + 1 < self.replicas:
            self.pending[device] = (count, arrays)
            return self._record(device, step_id, _reply(pb.RESULT_PENDING, self.version, step_id,
                                                        self.service.incarnation))
        contributions = {**self.pending, device: (count, arrays)}
        contributors = sorted(contributions)  # a fixed order: the same sums after a restart
        average = _weighted_mean([contributions[d] for d in contributors], self.names, self.specs)
        if self.mode == "fedavg":
            self.roles.set_variables(self.interp, average)
        else:
            self._apply_gradients(average)
        self.pending = {}
        self.version += 1
        self.updates += 1
        applied = _reply(pb.RESULT_APPLIED, self.version, step_id, self.service.incarnation)
        for d in contributors:  # a retry of any of them now learns that the step was applied
            if d != device:
                r = self.devices[d]
                r["applied"] += 1
                r["reply"] = {**applied, "last_step_id": r["last"]}
        return self._record(device, step_id, applied, 1)

    def _apply_gradients(self, grads):
        self.interp.run([], {self.roles.roles[n].gradient: grads[n] for n in self.names}, self.targets)

    # -- checkpoints -----------------------------------------------------------------
    def _snapshot(self):
        """(sequence, arrays) of the state now; called under the lock."""
        self._snapshots += 1
        arrays = {f"v/{n}": a for n, a in self.values(self.names + self.slots).items()}
        pending = []
        for k, (device, (count, tensors)) in enumerate(sorted(self.pending.items())):
            pending.append([device, int(count)])
            arrays.update((f"p/{k}/{n}", a) for n, a in tensors.items())
        meta = {"model_sha256": self.sha256, "mode": self.mode, "version": self.version,
                "updates": self.updates, "devices": self.devices, "pending": pending,
                "duplicates": self.duplicates, "dropped": self.dropped}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        return self._snapshots, self.version, arrays

    def _write(self, snapshot):
        sequence, version, arrays = snapshot
        with self._write_lock:
            if sequence <= self._written:
                return
            try:
                ckpt.write(self.path, arrays)
            except OSError as e:  # keep serving; the next checkpoint tries again
                _log.error("%s: cannot write the checkpoint %s: %s", self.id, self.path, e)
                return
            self._written, self.checkpoint_version = sequence, version

    def checkpoint(self):
        if self.path:
            with self.cond:
                snapshot = self._snapshot()
            self._write(snapshot)

    def _restore(self):
        path = self.path
        try:
            with np.load(path, allow_pickle=False) as archive:
                stored = archive["meta"]  # reading a member checks its CRC-32
            meta = json.loads(bytes(stored).decode())
            pending = [(str(d), int(c)) for d, c in meta["pending"]]
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
            raise FormatError(f"{path}: not a readable parameter-server checkpoint ({e}); move it away to "
                              "start training over") from None
        if meta.get("model_sha256") != self.sha256:
            raise FormatError(f"{path}: the checkpoint is of package sha256 {meta.get('model_sha256')}, this "
                              f"server hosts {self.sha256} as {self.id!r}; move it away to start over")
        if meta.get("mode") != self.mode:
            raise EdgeflowError(f"{path}: the checkpoint is of {meta.get('mode')} training; this server "
                                f"trains in {self.mode} mode")
        expected = {f"v/{n}": spec for n, spec in self.specs.items()}
        expected.update((f"p/{k}/{n}", self.specs[n]) for k in range(len(pending)) for n in self.names)
        expected["meta"] = (stored.dtype, stored.shape)
        try:  # every member, checked: names, dtypes, shapes, CRC-32
            arrays = ckpt.read(path, expected)
        except FormatError as e:
            raise FormatError(f"{e}; move it away to start training over") from None
        self.roles.set_variables(self.interp, {n: arrays[f"v/{n}"] for n in self.specs})
        self.pending = {d: (c, {n: arrays[f"p/{k}/{n}"] for n in self.names})
                        for k, (d, c) in enumerate(pending)}
        self.version, self.updates = int(meta["version"]), int(meta["updates"])
        self.devices = {str(d): {"last": int(r["last"]), "reply": r["reply"], "applied": int(r["applied"])}
                        for d, r in meta["devices"].items()}
        self.duplicates, self.dropped = int(meta.get("duplicates", 0)), int(meta.get("dropped", 0))
        self.checkpoint_version = self.version
        _log.info("%s: resumed from %s at version %d (%d updates applied, %d devices)", self.id, path,
                  self.version, self.updates, len(self.devices))


def _weighted_mean(contributions, names, specs):
    """{name: sum_k count_k * array_k / sum_k count_k}, summed in float64 in the given order."""
    total = float(sum(count for count, _ in contributions))
    out = {}
    for name in names:
        acc = np.zeros(specs[name][1], np.float64)
        for count, arrays in contributions:
            acc += float(count) * arrays[name]
        out[name] = (acc / total).astype(specs[name][0])
    return out


# -- the gRPC servicer ---------------------------------------------------------------------

class _Reject(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class ParameterService(pb_grpc.ParameterServerServicer):
    """Serves the cloud variables of trainable packages (see the module's docstring).

    `models`: {id: path or package bytes}. `mode`: "sync", "async" or "fedavg";
    `replicas`: devices per step (sync) or round (FedAvg). `variables`: "cloud" (those
    placed in the cloud) or "all" (every trainable one). `checkpoint_dir`: resume from and
    checkpoint to it every `checkpoint_every` applied updates and on `checkpoint()`.
    `max_staleness` (async): drop gradients computed more than this many versions ago.
    """

    def __init__(self, models, mode="async", replicas=1, variables="cloud", checkpoint_dir=None,
                 checkpoint_every=100, max_staleness=None, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES):
        if mode not in MODES:
            raise InvalidInputError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
        if not isinstance(replicas, int) or replicas < 1:
            raise InvalidInputError(f"replicas: expected an int >= 1, got {replicas!r}")
        if variables not in ("cloud", "all"):
            raise InvalidInputError(f"variables: expected 'cloud' or 'all', got {variables!r}")
        if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise InvalidInputError(f"checkpoint_every: expected an int >= 1, got {checkpoint_every!r}")
        if max_staleness is not None and (not isinstance(max_staleness, int) or max_staleness < 0):
            raise InvalidInputError(f"max_staleness: expected None or an int >= 0, got {max_staleness!r}")
        if not models:
            raise InvalidInputError("ParameterService: give models={id: path or package bytes}")
        self.mode, self.replicas, self.variables = mode, replicas, variables
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, checkpoint_every
        self.max_staleness, self.max_request_bytes = max_staleness, max_request_bytes
        self.incarnation = uuid.uuid4().hex[:16]
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
            self.models[model_id] = _Hosted(model_id, data, where, self)

    def add_to_server(self, server, health=None):
        """Register on a grpc.Server (before it starts); mark the service SERVING on `health`."""
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
        return _status_dict(self._model(model_id, ""))

    # -- RPCs ------------------------------------------------------------------------
    def Status(self, request, context):
        try:
            hosted = self._model(request.model_id, "")
        except _Reject as e:
            context.abort(e.code, str(e))
        with hosted.cond:
            return pb.StatusReply(
                model_id=hosted.id, model_sha256=hosted.sha256, mode=MODES[hosted.mode],
                replicas=hosted.replicas, version=hosted.version, incarnation=self.incarnation,
                updates_applied=hosted.updates, checkpoint_version=hosted.checkpoint_version,
                variables=[pb.VariableInfo(name=n, dtype=d.name, shape=s, trainable=n in hosted.names)
                           for n, (d, s) in hosted.specs.items()],
                devices=[pb.DeviceInfo(device_id=d, last_step_id=r["last"], applied=r["applied"],
                                       last_result=r["reply"]["result"] if r["reply"] else 0)
                         for d, r in sorted(hosted.devices.items())],
                pending_devices=sorted(hosted.pending), duplicates=hosted.duplicates,
                dropped=hosted.dropped)

    def Pull(self, request, context):
        try:
            hosted = self._model(request.model_id, request.model_sha256)
            names = list(request.names) or hosted.names
            hosted.check_names(names, "pull")
            if len(set(names)) != len(names):
                raise InvalidInputError(f"pull: expected distinct names, got {names}")
            if request.encoding not in wire.ENCODINGS.values():
                raise InvalidInputError(f"pull: encoding {request.encoding!r}: expected '', 'fp16' or 'int8'")
            if not 0 <= request.wait_seconds <= MAX_WAIT_S:
                raise InvalidInputError(f"pull: expected 0 <= wait_seconds <= {MAX_WAIT_S}, "
                                        f"got {request.wait_seconds}")
            _check_device(request.device_id, required=False)
        except (_Reject, InvalidInputError) as e:
            self._abort(context, "Pull", e)
        with hosted.cond:
            deadline = time.monotonic() + request.wait_seconds

            def unchanged():
                return hosted.version == request.wait_while_version and self.incarnation == request.incarnation
            while request.wait_seconds > 0 and unchanged() and context.is_active():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                hosted.cond.wait(min(left, 1.0))
            changed = not (request.wait_seconds > 0 and unchanged())
            header = pb.PullHeader(version=hosted.version, incarnation=self.incarnation,
                                   mode=MODES[hosted.mode], replicas=hosted.replicas,
                                   last_step_id=hosted.last_step(request.device_id), changed=changed)
            values = hosted.values(names) if changed else {}
        yield pb.PullReply(header=header)
        for name in names if changed else ():
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
            hosted = self._model(header.model_id, header.model_sha256)
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
            _check_device(header.device_id, required=True)
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
            reply = hosted.push(header.device_id, int(step_id), int(version), int(header.sample_count), arrays)
        except grpc.RpcError:  # the client went away mid-stream
            return pb.PushReply()
        except Exception as e:
            self._abort(context, method, e)
        return pb.PushReply(**reply)

    # -- helpers ---------------------------------------------------------------------
    def _model(self, model_id, sha256):
        hosted = self.models.get(model_id)
        if hosted is None:
            raise _Reject(grpc.StatusCode.NOT_FOUND, f"no trained model {model_id!r}; this parameter server "
                                                     f"trains {sorted(self.models)}")
        if sha256 and sha256.lower() != hosted.sha256:
            raise _Reject(grpc.StatusCode.FAILED_PRECONDITION,
                          f"model {model_id!r}: expected package sha256 {sha256}, this server trains "
                          f"sha256 {hosted.sha256}")
        return hosted

    def _abort(self, context, method, e):
        if isinstance(e, _Reject):
            code, message = e.code, str(e)
        elif isinstance(e, wire.PayloadTooLarge):
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
        elif isinstance(e, (InvalidInputError, GraphError)):
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(e)
        else:  # a bug: log it, answer, keep serving
            _log.exception("%s failed", method)
            code, message = grpc.StatusCode.INTERNAL, (f"internal error ({type(e).__name__}: {e}); "
                                                       "the server logged it")
        _log.info("%s: %s: %s", method, code.name, message)
        context.abort(code, message)


def _check_device(device_id, required):
    if required and not device_id:
        raise InvalidInputError("expected a device id (a non-empty string naming the device)")
    if len(device_id) > _MAX_DEVICE_ID or not device_id.isprintable():
        raise InvalidInputError(f"expected a device id of at most {_MAX_DEVICE_ID} printable characters, "
                                f"got {device_id[:40]!r}...")


def _status_dict(hosted):
    with hosted.cond:
        return {"model_id": hosted.id, "model_sha256": hosted.sha256, "mode": hosted.mode,
                "replicas": hosted.replicas, "version": hosted.version,
                "incarnation": hosted.service.incarnation, "updates_applied": hosted.updates,
                "checkpoint_version": hosted.checkpoint_version,
                "variables": {n: {"dtype": d.name, "shape": s, "trainable": n in hosted.names}
                              for n, (d, s) in hosted.specs.items()},
                "devices": {d: {"last_step_id": r["last"], "applied": r["applied"],
                                "last_result": RESULTS[r["reply"]["result"]] if r["reply"] else "unspecified"}
                            for d, r in sorted(hosted.devices.items())},
                "pending_devices": sorted(hosted.pending), "duplicates": hosted.duplicates,
                "dropped": hosted.dropped}


# -- the client ------------------------------------------------------------------------------

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
    (token, TLS, `timeout` per call, `wait_ready`, `status`).

    A call that fails with UNAVAILABLE or DEADLINE_EXCEEDED is sent again, unchanged (the
    same device and step ids, so the server never applies it twice), after an exponential
    backoff (`backoff` = (first delay, longest delay) in seconds, with jitter), for up to
    `retry_for` seconds in all; then RemoteError. `bytes_pushed`, `bytes_pulled`,
    `retries` count what went over the wire. Thread-safe.
    """

    def __init__(self, target, token=None, root_cert=None, timeout=30.0, retry_for=60.0,
                 backoff=(0.05, 2.0), max_reply_bytes=1 << 30):
        super().__init__(target, token=token, root_cert=root_cert, timeout=timeout,
                         max_reply_bytes=max_reply_bytes)
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
            first = next(replies, None)
            if first is None or first.WhichOneof("kind") != "header":
                raise self._remote_error("INTERNAL", f"malformed Pull reply from {self.target}: expected a "
                                                     "PullHeader first")
            tensors = wire.Assembler(self.max_reply_bytes, what="variable")
            try:
                for reply in replies:
                    if reply.WhichOneof("kind") != "chunk":
                        raise InvalidInputError("expected TensorChunk messages after the header")
                    tensors.add(reply.chunk)
                values = tensors.finish()
            except InvalidInputError as e:
                replies.cancel()
                raise self._remote_error("INTERNAL", f"malformed Pull reply from {self.target}: {e}") from None
            return first.header, values
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
                               mode=_mode(mode))
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


def _mode(mode):
    if mode not in MODES:
        raise InvalidInputError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    return MODES[mode]


# -- standalone server -------------------------------------------------------------------------

def main(argv=None):
    """`python -m edgeflow.cloud.ps`: a parameter server until SIGTERM or SIGINT."""
    import signal
    from .server import Server
    p = argparse.ArgumentParser(prog="python -m edgeflow.cloud.ps",
                                description="Serve the cloud variables of trainable packages to devices "
                                            "that push gradients (sync, async) or models (FedAvg).")
    p.add_argument("--model", action="append", required=True, metavar="ID=PATH",
                   help="a trainable package and its id (repeat for more)")
    p.add_argument("--mode", choices=sorted(MODES), default="async")
    p.add_argument("--replicas", type=int, default=1, help="devices per step (sync) or round (fedavg)")
    p.add_argument("--variables", choices=("cloud", "all"), default="cloud")
    p.add_argument("--checkpoint-dir", help="checkpoint here; resume from it on start")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="K")
    p.add_argument("--max-staleness", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", help="write the port listened on here (atomically) once serving")
    p.add_argument("--token-file", help="require 'authorization: Bearer <token>' with this token")
    p.add_argument("--grace", type=float, default=5.0)
    args = p.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    models = {}
    for item in args.model:
        model_id, sep, path = item.partition("=")
        if not sep or not model_id or not path:
            p.error(f"--model {item!r}: expected ID=PATH")
        models[model_id] = path
    token = pathlib.Path(args.token_file).read_text().strip() if args.token_file else None
    service = ParameterService(models, mode=args.mode, replicas=args.replicas, variables=args.variables,
                               checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                               max_staleness=args.max_staleness)
    server = Server(host=args.host, port=args.port, token=token, parameter_server=service)
    port = server.start()
    if args.port_file:
        from ..atomic import write_text
        write_text(args.port_file, str(port))
    _log.info("parameter server (%s, %d replicas) for %s on %s, incarnation %s", args.mode, args.replicas,
              sorted(models), server.address, service.incarnation)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        pass
    server.stop(args.grace)  # checkpoints the service
    return 0


if __name__ == "__main__":
    import sys
    from edgeflow.cloud.ps import main as _main  # the module proper, not a second copy as __main__
    sys.exit(_main())
