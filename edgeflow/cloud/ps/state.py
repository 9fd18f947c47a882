"""A parameter server's state of one model, and its rules: aggregation (sync, async,
FedAvg), the exactly-once table of devices' last steps and replies, checkpoints.

Pure: no gRPC here (edgeflow.cloud.ps.service serves it), so it is tested directly. See
edgeflow.cloud.ps for the modes and the exactly-once protocol.
"""
import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
import zipfile

import numpy as np

from ... import dtypes
from ...errors import EdgeflowError, FormatError, InvalidInputError
from ..steps import TooManyDevices
from ...interp import Interpreter
from ...interp import checkpoint as ckpt
from .roles import TrainingRoles

MODES = ("sync", "async", "fedavg")
# A push's result: the values of ps.proto's Result, which replies and checkpoints carry.
RESULT_UNSPECIFIED, RESULT_APPLIED, RESULT_PENDING, RESULT_DROPPED = range(4)
RESULTS = {RESULT_UNSPECIFIED: "unspecified", RESULT_APPLIED: "applied", RESULT_PENDING: "pending",
           RESULT_DROPPED: "dropped"}
_log = logging.getLogger("edgeflow.cloud.ps")


def package_sha256(data):
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a parameter server trains: `mode` ("sync", "async", "fedavg"), `replicas`
    (devices per step or round), `variables` ("cloud" or "all"), `checkpoint_dir` and
    `checkpoint_every` (applied updates), `max_staleness` (async), the `incarnation`
    that tells devices the server restarted, and `max_devices`, the devices whose last
    step a model remembers (a new one beyond them is refused: TooManyDevices)."""
    mode: str = "async"
    replicas: int = 1
    variables: str = "cloud"
    checkpoint_dir: str = None
    checkpoint_every: int = 100
    max_staleness: int = None
    incarnation: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:16])
    max_devices: int = 4096

    def __post_init__(self):
        checks = (
            ("mode", self.mode in MODES, f"one of {', '.join(MODES)}"),
            ("replicas", isinstance(self.replicas, int) and self.replicas >= 1, "an int >= 1"),
            ("variables", self.variables in ("cloud", "all"), "'cloud' or 'all'"),
            ("checkpoint_every", isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1,
             "an int >= 1"),
            ("max_devices", isinstance(self.max_devices, int) and self.max_devices >= 1, "an int >= 1"),
            ("max_staleness", self.max_staleness is None or (isinstance(self.max_staleness, int)
                                                             and self.max_staleness >= 0),
             "None or an int >= 0"))
        for name, ok, expected in checks:
            if not ok:
                raise InvalidInputError(f"{name}: expected {expected}, got {getattr(self, name)!r}")


def _reply(result, version, last, incarnation, reason="", staleness=0, duplicate=False):
    return {"result": int(result), "duplicate": duplicate, "version": int(version),
            "last_step_id": int(last), "incarnation": incarnation, "reason": reason,
            "staleness": int(staleness)}


class HostedParameters:
    """One trainable model on the server: its interpreter (the variables and slots), the
    devices' table, the pending contributions of the current step, counters. Thread-safe.

    `names`: serve only these of the served variables (a shard's, see sharded.py), with
    their slots and updates; `shard` = (k, n) names its checkpoint file
    `<model>.shard<k>-of-<n>.ps.npz`. `checkpoint_pending`: checkpoint after every push that
    is not a duplicate (a pending contribution, a drop), under the lock, so that no reply
    or pull ever tells of state that is not on disk (a restarted shard has all it told).
    """

    def __init__(self, model_id, data, source, settings, names=None, checkpoint_pending=False, shard=None):
        self.id, self.source, self.settings = model_id, source, settings
        self.sha256 = package_sha256(data)
        self.interp = Interpreter(data)
        self.roles = TrainingRoles(self.interp.model)
        self.mode, self.replicas = settings.mode, settings.replicas
        self.names = self.roles.served(settings.variables)  # trainable, served
        if names is not None:
            unknown = sorted(set(names) - set(self.names))
            if unknown:
                raise InvalidInputError(f"model {model_id!r} serves no variable {unknown}; it serves {self.names}")
            self.names = [n for n in self.names if n in set(names)]
        self.checkpoint_pending = checkpoint_pending
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
        if settings.checkpoint_dir:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_id)
            if safe != model_id:
                safe += "-" + hashlib.sha256(model_id.encode()).hexdigest()[:8]
            if shard is not None:
                safe += ".shard{}-of-{}".format(*shard)
            self.path = os.path.join(settings.checkpoint_dir, f"{safe}.ps.npz")
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
            raise InvalidInputError(f"push: variable {name!r}: expected {dtypes.name(want_dtype)}{list(want_shape)}, "
                                    f"got {dtypes.name(dtype)}{list(shape)}")

    # -- a push ----------------------------------------------------------------------
    def push(self, device, step_id, version, count, arrays):
        """The reply dict to a push (gradients in sync/async mode, values in FedAvg)."""
        snapshot = None
        with self.cond:
            incarnation = self.settings.incarnation
            record = self.devices.get(device)
            if record is None and len(self.devices) >= self.settings.max_devices:
                # The table is what makes pushes exactly-once: a device in it is never forgotten.
                raise TooManyDevices(f"model {self.id!r}: this parameter server keeps the steps of at "
                                     f"most {self.settings.max_devices} devices")
            last = record["last"] if record else -1
            if step_id <= last:
                self.duplicates += 1
                if step_id == last:
                    return {**record["reply"], "duplicate": True}
                return _reply(RESULT_UNSPECIFIED, self.version, last, incarnation, duplicate=True,
                              reason=f"step id {step_id} was taken before (the last from device "
                                     f"{device!r} is {last}); not applied again")
            if self.mode == "async":
                reply = self._push_async(device, step_id, version, last, arrays)
            else:
                reply = self._push_step(device, step_id, version, last, count, arrays)
            if self.path and (self.checkpoint_pending or (reply["result"] == RESULT_APPLIED and
                                                          self.updates % self.settings.checkpoint_every == 0)):
                snapshot = self._snapshot()
                if self.checkpoint_pending:  # on disk before a reply or a pull tells of it
                    self._write(snapshot)
                    snapshot = None
            self.cond.notify_all()
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
        reply = _reply(RESULT_DROPPED, self.version, step_id if record else last,
                       self.settings.incarnation, reason)
        return self._record(device, step_id, reply) if record else reply

    def _push_async(self, device, step_id, version, last, grads):
        if step_id != last + 1:
            return self._drop(device, step_id, last, f"out of order: expected step id {last + 1} from "
                              f"device {device!r} (the server resumed from a checkpoint, or a step was "
                              f"skipped); resume from step {last + 1}", record=False)
        staleness = max(0, self.version - version)
        limit = self.settings.max_staleness
        if limit is not None and staleness > limit:
            return self._drop(device, step_id, last, f"stale: computed from version {version}, the server "
                              f"is at {self.version} (staleness {staleness} > {limit})", record=True)
        self._apply_gradients(grads)
        self.version += 1
        self.updates += 1
        return self._record(device, step_id, _reply(RESULT_APPLIED, self.version, step_id,
                                                    self.settings.incarnation, staleness=staleness), 1)

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
            return self._record(device, step_id, _reply(RESULT_PENDING, self.version, step_id,
                                                        self.settings.incarnation))
        contributions = {**self.pending, device: (count, arrays)}
        contributors = sorted(contributions)  # a fixed order: the same sums after a restart
        average = weighted_mean([contributions[d] for d in contributors], self.names, self.specs)
        if self.mode == "fedavg":
            self.roles.set_variables(self.interp, average)
        else:
            self._apply_gradients(average)
        self.pending = {}
        self.version += 1
        self.updates += 1
        applied = _reply(RESULT_APPLIED, self.version, step_id, self.settings.incarnation)
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

    def pull(self, names, wait_while_version=0, incarnation="", wait_seconds=0.0, device="", is_active=None):
        """A Pull's (header, {name: array}): with `wait_seconds` > 0, first wait (while
        `is_active()`) as long as the version is `wait_while_version` and the incarnation
        `incarnation`; if nothing changed, `changed` is False and no values come."""
        with self.cond:
            deadline = time.monotonic() + wait_seconds

            def unchanged():
                return self.version == wait_while_version and self.settings.incarnation == incarnation
            while wait_seconds > 0 and unchanged() and (is_active is None or is_active()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 1.0))
            changed = not (wait_seconds > 0 and unchanged())
            header = {"version": self.version, "incarnation": self.settings.incarnation, "mode": self.mode,
                      "replicas": self.replicas, "last_step_id": self.last_step(device), "changed": changed}
            return header, self.values(names) if changed else {}

    def status(self):
        """The model's state as a dict: what the Status RPC answers."""
        with self.cond:
            return {"model_id": self.id, "model_sha256": self.sha256, "mode": self.mode,
                    "replicas": self.replicas, "version": self.version,
                    "incarnation": self.settings.incarnation, "updates_applied": self.updates,
                    "checkpoint_version": self.checkpoint_version,
                    "variables": {n: {"dtype": dtypes.name(d), "shape": s, "trainable": n in self.names}
                                  for n, (d, s) in self.specs.items()},
                    "devices": {d: {"last_step_id": r["last"], "applied": r["applied"],
                                    "last_result": RESULTS[r["reply"]["result"]] if r["reply"] else "unspecified"}
                                for d, r in sorted(self.devices.items())},
                    "pending_devices": sorted(self.pending), "duplicates": self.duplicates,
                    "dropped": self.dropped}


def weighted_mean(contributions, names, specs):
    """{name: sum_k count_k * array_k / sum_k count_k}, summed in float64 in the given order."""
    total = float(sum(count for count, _ in contributions))
    out = {}
    for name in names:
        acc = np.zeros(specs[name][1], np.float64)
        for count, arrays in contributions:
            acc += float(count) * arrays[name]
        out[name] = (acc / total).astype(specs[name][0])
    return out
