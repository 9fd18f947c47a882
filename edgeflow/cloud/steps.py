"""The server's side of split training steps: one trainable model's variables, the state a
step keeps between its round trips, exactly-once replies, and checkpoints.

A round (device id, step id, round, feeds, fetches, keep, targets, final) runs on the one
interpreter that holds the model's variables, under a lock: the fed tensors and those
the step kept from its earlier rounds go in, `fetches` come back, `keep` is retained,
and the variable writes `targets` run. Exactly once: the replies of a device's current
step are kept, so a retried round (after a timeout or a dropped connection) gets the same
reply and runs nothing; a step at or before the device's last finished one is refused.
Per-step state is bounded (`max_steps` pending steps, `max_bytes` in all, `timeout_s`
since their last round): the oldest or idlest are dropped, and a later round of a dropped
step is refused, so the device runs the step again from its first round.

Checkpoints (with `state_dir`): after the last round of every step whose id + 1 is a
multiple of `checkpoint_every`, and on close, the variables (optimizer slots included),
each device's last finished step and that step's final reply are written atomically (one
CRC-checked npz: temp file, fsync, rename) before the reply goes out; a new host resumes
from it. A device that is ahead of a restarted server is told the step to resume from
(`StaleStep.resume_from`): it restores its own checkpoint of that step (it checkpoints on
the same steps) and trains on from there, so no step is lost or applied twice.

Devices: a device id is the caller's (the server takes it from the credential; see
edgeflow.cloud.identity) and at most identity.MAX_DEVICE_ID characters. A host keeps at
most `max_devices` devices' records (last finished step, last replies): a new device
beyond them takes the place of the one idle longest, if that one has been idle for
`device_idle_s` (it is forgotten: were it to come back and retry a step it finished, the
step would run again), else it is refused with TooManyDevices (RESOURCE_EXHAUSTED), so
neither memory nor the checkpoint grows with made-up ids.

State folders: `state_folder(state_dir, model_id, sha256)` names a model version's folder
by a sanitised id (plus a hash of the id when sanitising changed it), never by the id
itself, and in it a folder per version (16 hex digits of its package's SHA-256).
"""
import collections
import hashlib
import json
import logging
import os
import re
import threading
import time
import zipfile

import numpy as np

from ..atomic import atomic_file
from ..errors import EdgeflowError, FormatError, InvalidInputError
from .identity import check_device_id

_log = logging.getLogger("edgeflow.cloud")
CHECKPOINT = "steps.npz"


class StaleStep(InvalidInputError):
    """A round the server will not run: `resume_from` is the step the device should run next."""

    def __init__(self, message, resume_from):
        super().__init__(message)
        self.resume_from = resume_from

    def __reduce__(self):  # pickled across processes (a Ray trainer actor's answer)
        return type(self), (str(self), self.resume_from)


class TooManyDevices(EdgeflowError):
    """A new device when the host already keeps `max_devices` devices, none idle long enough
    to forget (the server answers RESOURCE_EXHAUSTED)."""


def state_name(model_id, max_chars=64):
    """A file name for `model_id` that stays in its folder: its characters outside
    [A-Za-z0-9_.-] replaced by '_', no leading '.', at most `max_chars`, and if that changed
    anything, 12 hex digits of the id's SHA-256 appended (distinct ids, distinct names)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_id)[:max_chars]
    if safe.startswith("."):
        safe = "_" + safe[1:]
    if safe != model_id:
        safe += "-" + hashlib.sha256(model_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return safe


def state_folder(state_dir, model_id, sha256=None):
    """The folder under `state_dir` of a model's training state (see state_name); with the
    SHA-256 of a version's package, that version's folder inside it (16 hex digits)."""
    folder = os.path.join(state_dir, state_name(model_id))
    if sha256 is None:
        return folder
    if not re.fullmatch(r"[0-9a-fA-F]{16,64}", sha256):
        raise InvalidInputError(f"expected a package's SHA-256 in hex, got {sha256[:80]!r}")
    return os.path.join(folder, sha256[:16].lower())


class StepHost:
    def __init__(self, interpreter, state_dir=None, checkpoint_every=1, max_steps=64,
                 max_bytes=512 << 20, timeout_s=300.0, name="model", max_devices=256,
                 device_idle_s=3600.0, legacy_state_dir=None):
        if checkpoint_every < 1:
            raise InvalidInputError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.interp, self.name = interpreter, name
        self.state_dir, self.checkpoint_every = state_dir, checkpoint_every
        self.max_steps, self.max_bytes, self.timeout_s = max_steps, max_bytes, timeout_s
        self.lock = threading.Lock()
        self.pending = {}  # (device, step) -> {"tensors": {name: array}, "round": last round, "at": time}
        self.replies = {}  # device -> (step, {round: reply})
        self.finished = {}  # device -> last finished step
        self.max_devices, self.device_idle_s = max_devices, device_idle_s
        self.seen = {}  # device -> when its last round came (time.time(): survives restarts)
        self.updates = 0  # steps whose writes ran (what a test counts)
        self.received = collections.deque(maxlen=1024)  # the tensors recent rounds carried (names)
        if state_dir:
            os.makedirs(state_dir, exist_ok=True)
            if os.path.exists(self._path()):
                self._restore()
            elif legacy_state_dir and os.path.exists(os.path.join(legacy_state_dir, CHECKPOINT)):
                # The layout before state folders were sanitised: read it once; the next
                # checkpoint goes to the new folder.
                self._restore(os.path.join(legacy_state_dir, CHECKPOINT))

    # -- a round -----------------------------------------------------------------------
    def round(self, device, step, round_no, feeds, fetches, keep=(), targets=(), final=False):
        """{name: array} of `fetches`; StaleStep when the round must not run."""
        check_device_id(device)
        if round_no < 1:
            raise InvalidInputError(f"a training step needs a round >= 1, got round {round_no}")
        with self.lock:
            self._admit(device)
            self.received.append(sorted(feeds))
            last_step, done = self.replies.get(device, (None, {}))
            if last_step == step and round_no in done:
                return done[round_no]  # a retry: the same reply, nothing runs again
            finished = self.finished.get(device)
            if finished is not None and step <= finished:
                raise StaleStep(f"device {device!r}: step {step} is already applied (its last "
                                f"finished step is {finished})", finished + 1)
            if finished is not None and step > finished + 1:
                raise StaleStep(f"device {device!r}: this server has applied steps up to {finished}; "
                                f"resume from step {finished + 1} (got step {step})", finished + 1)
            self._expire()
            key = (device, step)
            state = self.pending.get(key)
            if round_no > 1 and (state is None or state["round"] != round_no - 1):
                raise StaleStep(f"device {device!r} step {step}: round {round_no} without round "
                                f"{round_no - 1} (dropped or never sent); run the step again", step)
            kept = state["tensors"] if state else {}
            wanted = list(dict.fromkeys(list(fetches) + [k for k in keep if k not in feeds and k not in kept]))
            out = self.interp.run(wanted, {**kept, **feeds}, list(targets))
            reply = {n: out[n] for n in fetches}
            if final:
                self.pending.pop(key, None)
                self.finished[device] = step
                if targets:
                    self.updates += 1
            else:
                tensors = dict(kept)
                tensors.update((k, feeds[k] if k in feeds else out[k]) for k in keep)
                self.pending[key] = {"tensors": tensors, "round": round_no, "at": time.monotonic()}
            self.replies[device] = (step, {**(done if last_step == step else {}), round_no: reply})
            if final and self.state_dir and (step + 1) % self.checkpoint_every == 0:
                self._checkpoint()
            return reply

    def _admit(self, device):
        """Note that `device` is active; make room for it if it is new (TooManyDevices
        when no device has been idle for device_idle_s)."""
        now = time.time()
        if device not in self.seen and len(self.seen) >= self.max_devices:
            oldest = min(self.seen, key=self.seen.get)
            if now - self.seen[oldest] < self.device_idle_s:
                raise TooManyDevices(f"{self.name}: this server keeps the training state of at most "
                                     f"{self.max_devices} devices, and none has been idle for "
                                     f"{self.device_idle_s:g} s; try again later")
            _log.info("%s: forgot device %r (idle for %.0f s) to make room", self.name, oldest,
                      now - self.seen[oldest])
            self._forget(oldest)
        self.seen[device] = now

    def _forget(self, device):
        self.seen.pop(device, None)
        self.replies.pop(device, None)
        self.finished.pop(device, None)
        for key in [k for k in self.pending if k[0] == device]:
            del self.pending[key]

    def _expire(self):
        """Drop steps idle past timeout_s, then the oldest beyond max_steps or max_bytes."""
        now = time.monotonic()
        for key in [k for k, s in self.pending.items() if now - s["at"] > self.timeout_s]:
            _log.info("%s: dropped abandoned step %s of device %r", self.name, key[1], key[0])
            del self.pending[key]
        by_age = sorted(self.pending, key=lambda k: self.pending[k]["at"])
        total = sum(a.nbytes for s in self.pending.values() for a in s["tensors"].values())
        while by_age and (len(self.pending) >= self.max_steps or total > self.max_bytes):
            key = by_age.pop(0)
            total -= sum(a.nbytes for a in self.pending[key]["tensors"].values())
            _log.info("%s: dropped step %s of device %r (state over its bounds)", self.name, key[1], key[0])
            del self.pending[key]

    # -- checkpoints --------------------------------------------------------------------
    def _path(self):
        return os.path.join(self.state_dir, CHECKPOINT)

    def close(self):
        """Checkpoint (with a state_dir) so that a restart resumes here."""
        if self.state_dir:
            with self.lock:
                self._checkpoint()

    def _checkpoint(self):
        arrays = {f"var/{name}": value for name, value in self.interp.variables().items()}
        finals = {}
        for device, (step, rounds) in self.replies.items():
            if self.finished.get(device) == step and rounds:
                last = max(rounds)
                k = len(finals)  # members are numbered: a device id never names a member
                finals[device] = [step, last, sorted(rounds[last]), k]
                arrays.update((f"reply/{k}/{n}", a) for n, a in rounds[last].items())
        meta = {"finished": self.finished, "finals": finals, "updates": self.updates, "seen": self.seen}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        with atomic_file(self._path()) as f:
            np.savez(f, **arrays)

    def _restore(self, path=None):
        path = path or self._path()
        expected = self.interp.variables()
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}  # reading checks every member's CRC-32
            meta = json.loads(bytes(data.pop("meta")).decode())
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: not a readable step checkpoint ({e})") from None
        values = {k[4:]: v for k, v in data.items() if k.startswith("var/")}
        for name, value in expected.items():
            got = values.get(name)
            if got is None or got.shape != value.shape or got.dtype != value.dtype:
                raise FormatError(f"{path}: variable {name!r} is missing or is not "
                                  f"{value.dtype}{list(value.shape)}: the checkpoint is of another model")
        self.interp.get_signature_runner("restore")(**{n: values[n] for n in expected})
        self.finished = {d: int(s) for d, s in meta["finished"].items()}
        self.updates = int(meta.get("updates", 0))
        for device, (step, round_no, names, *k) in meta["finals"].items():
            member = k[0] if k else device  # checkpoints before numbered members: by device id
            self.replies[device] = (step, {round_no: {n: data[f"reply/{member}/{n}"] for n in names}})
        now = time.time()  # checkpoints before `seen`: every device as if active now
        self.seen = {d: float(meta.get("seen", {}).get(d, now)) for d in set(self.finished) | set(self.replies)}
        _log.info("%s: resumed from %s (%d steps applied)", self.name, path, self.updates)
