"""The parameter server scaled out on Ray: a model's served variables sharded over Ray
actors, as TensorFlow's ps tasks (`edgeflow serve --parameter-server MODE --ray [ADDRESS]
--ps-shards N`).

shards.assign splits the served variables into at most N shards whose updates are
closed. Each shard is a `ParameterShard`: a detached, named Ray actor that Ray restarts
when it dies (replicas.py's conventions), placed on the nodes in turn (shard k on the
k-th live node; if that node goes, the next call creates it on a live one), holding a
HostedParameters of its variables and their slots that checkpoints after every push that
is not a duplicate, before the reply (`checkpoint_dir/<model>.shard<k>-of-<n>.ps.npz`: a
disk every node reaches). The front end's `ShardedParameters` has HostedParameters's
interface, so ParameterService serves either: a push is split by shard and sent to every
shard at once; a pull goes to the shards holding the names asked for. A shard that cannot
be reached (its actor died, its node went) makes the call fail with backends.Unavailable,
UNAVAILABLE on the wire, which ParameterClient retries with the same ids.

Why the guarantees of edgeflow.cloud.ps hold per shard and for the model:

- Each shard runs the unsharded state machine on its part of every push: the same device
  and step ids, versions and sample counts. A shard never loses what it acknowledged: its
  checkpoint is written before the reply, under the lock, so no reply or pull ever told of
  state that is not on disk, and a restarted actor (the same init arguments, the same
  incarnation) resumes exactly there. Devices see no restart.
- Exactly once: a push that some shards took and others did not (one died on the way)
  fails with UNAVAILABLE; the device sends it again with the same ids, the shards that
  took it answer their recorded reply (duplicate) and change nothing, the others apply
  it. So every shard applies every push once, whichever shard failed when.
- Sync and FedAvg: which devices' contributions make step v depends on the order pushes
  arrive in (with more devices than `replicas`, the late ones are dropped), so the front
  end sends a model's pushes one at a time (all shards answer before the next is sent),
  and a push some shards missed is owed: before any other push goes out, it is sent
  again to those shards (it is a duplicate there if they did take it), so every shard
  sees the pushes in one order and takes the same devices into each step. A device
  waiting for the next version (Pull with wait) waits until every shard has it: the
  header's version is the lowest of the shards', `last_step_id` too, so a device whose
  push a shard missed pushes step v again (the other shards answer its recorded reply).
- Async: pushes go to the shards concurrently; each shard applies every push once, its
  staleness counted on that shard's version (the shards may apply concurrent pushes in
  different orders, which async training allows).

Replies are merged by taking the least advanced: "dropped" if a shard dropped the push
(the device pulls again), else "pending" over "applied"; the lowest version and last
step id; `duplicate` only if every shard saw it before. Shards agree in all that unless
a push is in flight or owed. Status is merged likewise: the shards' lowest version and
counts, and each shard's own status under "shards".

Limits: the order of pushes and what is owed live in one front end process. Through
several front ends, the pushes of one sync step or FedAvg round may reach the shards in
different orders, which matters only with more devices than `replicas` (the shards may
drop different late devices). A front end that dies while a shard is away loses what it
owed: the push reaches that shard when its device retries it, but a device that gave up
(past its client's retry_for) computes the step again from a later pull, and that shard
takes the new gradient. And a shard writes its whole checkpoint on every push: the price
of never losing an acknowledged push, in proportion to the shard's bytes.
"""
import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid

from ...errors import EdgeflowError, InvalidInputError
from ...format import reader
from ..backends import Unavailable
from ..replicas import NAMESPACE
from ..steps import state_name
from .roles import TrainingRoles
from .shards import assign
from .state import (RESULT_APPLIED, RESULT_DROPPED, RESULT_PENDING, RESULT_UNSPECIFIED, HostedParameters,
                    package_sha256)

SHARD_CONCURRENCY = 64  # calls a shard actor runs at once: pulls that wait must not hold up pushes
WAIT_SLICE_S = 1.0  # the longest one waiting pull lasts on a shard; the front end asks again
_log = logging.getLogger("edgeflow.cloud.ps")


def shard_name(model_id, sha256, k, n):
    """The Ray actor name of shard `k` of `n` of a model version."""
    return f"ef-ps-{state_name(model_id, 40)}-{sha256[:16]}-{k}-of-{n}"


class ParameterShard:
    """Shard `shard` = (k, n) of a model's parameter server (a threaded Ray actor): a
    HostedParameters of the variables `names`, checkpointed after every push. Ray restarts
    it with the same arguments, so it keeps `settings.incarnation`; without a
    checkpoint_dir it has nothing to resume from, and takes a new incarnation instead."""

    def __init__(self, model_id, data, settings, names, shard):
        if settings.checkpoint_dir:
            os.makedirs(settings.checkpoint_dir, exist_ok=True)
        else:
            settings = dataclasses.replace(settings, incarnation=uuid.uuid4().hex[:16])
        self.hosted = HostedParameters(model_id, data, "<ray>", settings, names, checkpoint_pending=True,
                                       shard=shard)

    def info(self):
        import ray
        return {"settings": self.hosted.settings, "names": self.hosted.names, "specs": self.hosted.specs,
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def push(self, device, step_id, version, count, arrays):
        return self.hosted.push(device, step_id, version, count, arrays)

    def pull(self, names, wait_while_version, incarnation, wait_seconds, device):
        return self.hosted.pull(names, wait_while_version, incarnation, wait_seconds, device)

    def status(self):
        return self.hosted.status()

    def checkpoint(self):
        self.hosted.checkpoint()


class ShardedParameters:
    """A model's parameter server as up to `n` ParameterShard actors, created or found by
    name in the Ray cluster this process is connected to (see the module's docstring).
    HostedParameters's interface: what ParameterService uses."""

    expect = HostedParameters.expect
    check_names = HostedParameters.check_names

    def __init__(self, model_id, data, source, settings, n, timeout_s=60.0):
        if settings.checkpoint_dir:
            settings = dataclasses.replace(settings, checkpoint_dir=os.path.abspath(settings.checkpoint_dir))
        elif n > 1:
            raise InvalidInputError(f"model {model_id!r}: {n} parameter shards need a checkpoint_dir (--state-dir) "
                                    "that every node reaches: a restarted shard resumes from it")
        else:
            _log.warning("model %r: the parameter shard has no checkpoint_dir (--state-dir): restarted, it "
                         "starts from the package's variables", model_id)
        self.id, self.source, self.settings, self.timeout_s = model_id, source, settings, timeout_s
        self.sha256 = package_sha256(data)
        self.mode, self.replicas = settings.mode, settings.replicas
        roles = TrainingRoles(reader.load(data))
        self.names = roles.served(settings.variables)
        self.shard_names = assign(roles, self.names, n)
        if self.mode != "fedavg":
            for names in self.shard_names:
                roles.check_update_closed(names)
        n = len(self.shard_names)
        self.actor_names = [shard_name(model_id, self.sha256, k, n) for k in range(n)]
        self._data = data
        self.shards = [self._create(k) for k in range(n)]
        self._known = [settings.incarnation] * n  # each shard's incarnation, as last heard
        infos, lost, error = self._gather({k: s.info.remote() for k, s in enumerate(self.shards)})
        if lost:
            raise EdgeflowError(f"model {model_id!r}: parameter shard(s) {lost} did not start: {error.cause}")
        for k, info in infos.items():
            theirs = dataclasses.replace(info["settings"], incarnation=settings.incarnation)
            if theirs != settings or info["names"] != self.shard_names[k]:
                raise EdgeflowError(f"model {model_id!r}: the running Ray actor {self.actor_names[k]!r} serves "
                                    f"{info['names']} with {theirs}; expected {self.shard_names[k]} with {settings}; "
                                    f"ray.kill it to start over")
        self.nodes = [infos[k]["node"] for k in range(n)]
        self.slots = [s for k in range(n) for s in infos[k]["specs"] if s not in self.names]
        specs = {name: spec for k in range(n) for name, spec in infos[k]["specs"].items()}
        self.specs = {name: specs[name] for name in self.names + self.slots}
        self.owner = {name: k for k in range(n) for name in infos[k]["specs"]}
        self._known = [infos[k]["settings"].incarnation for k in range(n)]
        self._order = threading.Lock() if self.mode != "async" else contextlib.nullcontext()
        self._owed = None  # (push arguments, {shard: its arrays}) that those shards have not answered
        _log.info("model %r: %d parameter shards on Ray: %s", model_id, n,
                  "; ".join(", ".join(names) for names in self.shard_names))

    # -- calls to the shards -------------------------------------------------------------
    def _create(self, k):
        """Shard k's actor: the running one of its name, or a new one on the k-th (mod their
        number) of the nodes alive. Ray restarts it there when its process dies; when its node
        goes, it cannot (the placement is strict, as Ray's soft placements and SPREAD put
        shards on one node), and the next call that finds it lost creates it again."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
        return ray.remote(ParameterShard).options(
            name=self.actor_names[k], namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            max_restarts=-1, max_concurrency=SHARD_CONCURRENCY, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[k % len(nodes)], soft=False)).remote(
                self.id, self._data, self.settings, self.shard_names[k], (k, len(self.shard_names)))

    def _gather(self, refs):
        """({k: answer}, [k of the shards that did not answer], Unavailable or None) of
        {k: ObjectRef}; a shard's own error (not a lost actor) raised as itself."""
        import ray
        import ray.exceptions as rx
        lost_errors = (rx.RayActorError, rx.ActorUnschedulableError, rx.WorkerCrashedError, rx.ObjectLostError,
                       rx.GetTimeoutError, rx.NodeDiedError, rx.TaskCancelledError)
        answers, lost, error = {}, [], None
        for k, ref in refs.items():
            try:
                answers[k] = ray.get(ref, timeout=self.timeout_s)
            except lost_errors as e:
                lost.append(k)
                lost_error = e
                if not isinstance(e, rx.GetTimeoutError):
                    with contextlib.suppress(Exception):  # dead for good (its node went): a new one
                        self.shards[k] = self._create(k)
            except rx.RayTaskError as e:
                cause = getattr(e, "cause", None)
                error = error or (cause if isinstance(cause, Exception) else EdgeflowError(str(e)))
        if error is not None:
            raise error
        for k, answer in answers.items():  # replies, pull headers, statuses: the shard's incarnation
            said = answer[0] if isinstance(answer, tuple) else answer
            if isinstance(said, dict) and "incarnation" in said:
                self._known[k] = said["incarnation"]
        if not lost:
            return answers, lost, None
        error = Unavailable(f"model {self.id!r}: parameter shard(s) {lost} unavailable ({type(lost_error).__name__}: "
                            f"{str(lost_error).splitlines()[0][:200] if str(lost_error) else ''}); try again")
        error.cause = lost_error
        return answers, lost, error

    def _all(self, refs):
        """{k: answer} of {k: ObjectRef}; Unavailable unless every shard answered."""
        answers, _, error = self._gather(refs)
        if error is not None:
            raise error
        return answers

    def _incarnation(self):
        return self._known[0] if len(set(self._known)) == 1 else ",".join(self._known)

    # -- HostedParameters's interface -----------------------------------------------------
    def push(self, device, step_id, version, count, arrays):
        """Every shard's part of the push; the merged reply (see the module's docstring)."""
        args = device, step_id, version, count
        parts = {k: {name: arrays[name] for name in names} for k, names in enumerate(self.shard_names)}
        with self._order:  # sync, FedAvg: one push at a time, the owed one first
            if self._owed is not None:
                owed_args, owed = self._owed
                try:
                    _, lost, error = self._gather({k: self.shards[k].push.remote(*owed_args, p)
                                                   for k, p in owed.items()})
                except Exception as e:  # a shard refused it: there is nothing to apply
                    _log.info("model %r: an owed push was refused: %s", self.id, e)
                    lost = []
                self._owed = (owed_args, {k: owed[k] for k in lost}) if lost else None
                if lost:
                    raise error
            replies, lost, error = self._gather({k: self.shards[k].push.remote(*args, p) for k, p in parts.items()})
            if lost:
                if self.mode != "async":
                    self._owed = (args, {k: parts[k] for k in lost})
                raise error
        return merge_replies(list(replies.values()), self._incarnation())

    def pull(self, names, wait_while_version=0, incarnation="", wait_seconds=0.0, device="", is_active=None):
        """HostedParameters.pull over the shards holding `names`: with a wait, until each of
        them has passed `wait_while_version` (the lowest version changes) or restarted."""
        by_shard = {}
        for name in names:
            by_shard.setdefault(self.owner[name], []).append(name)
        known = list(self._known)
        waiting = set(by_shard) if wait_seconds > 0 and incarnation == self._incarnation() else set()
        deadline = time.monotonic() + wait_seconds
        while waiting and (is_active is None or is_active()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            answers = self._all({k: self.shards[k].pull.remote([], wait_while_version, known[k],
                                                               min(left, WAIT_SLICE_S), device)
                                 for k in waiting})
            waiting = {k for k, (header, _) in answers.items() if not header["changed"]}
        changed = not waiting
        answers = self._all({k: self.shards[k].pull.remote(part if changed else [], 0, "", 0.0, device)
                             for k, part in by_shard.items()})
        headers = [header for header, _ in answers.values()]
        values = {name: value for _, part in answers.values() for name, value in part.items()}
        header = {**headers[0], "version": min(h["version"] for h in headers), "changed": changed,
                  "last_step_id": min(h["last_step_id"] for h in headers), "incarnation": self._incarnation()}
        return header, {name: values[name] for name in names} if changed else {}

    def status(self):
        """HostedParameters.status merged over the shards; each one's under "shards"."""
        statuses = self._all({k: s.status.remote() for k, s in enumerate(self.shards)})
        statuses = [statuses[k] for k in range(len(self.shards))]
        never = {"last_step_id": -1, "applied": 0, "last_result": "unspecified"}
        devices = sorted({d for s in statuses for d in s["devices"]})
        variables = {name: v for s in statuses for name, v in s["variables"].items()}
        return {"model_id": self.id, "model_sha256": self.sha256, "mode": self.mode, "replicas": self.replicas,
                **{key: min(s[key] for s in statuses) for key in ("version", "updates_applied", "checkpoint_version")},
                "incarnation": self._incarnation(),
                "variables": {name: variables[name] for name in self.specs},
                "devices": {d: min((s["devices"].get(d, never) for s in statuses),
                                   key=lambda r: (r["last_step_id"], r["applied"])) for d in devices},
                "pending_devices": sorted({d for s in statuses for d in s["pending_devices"]}),
                "duplicates": max(s["duplicates"] for s in statuses), "dropped": max(s["dropped"] for s in statuses),
                "shards": statuses}

    def checkpoint(self):
        """Have every shard checkpoint (each already has after every push); a shard that is
        away keeps its last checkpoint."""
        try:
            self._all({k: s.checkpoint.remote() for k, s in enumerate(self.shards)})
        except Exception as e:
            _log.warning("model %r: checkpointing the parameter shards failed: %s", self.id, e)


def merge_replies(replies, incarnation):
    """One reply from the shards' replies to a push: the least advanced (see the module's
    docstring)."""
    for result in (RESULT_DROPPED, RESULT_UNSPECIFIED, RESULT_PENDING, RESULT_APPLIED):
        chosen = [r for r in replies if r["result"] == result]
        if chosen:
            break
    return {"result": result, "duplicate": all(r["duplicate"] for r in replies),
            "version": min(r["version"] for r in replies), "last_step_id": min(r["last_step_id"] for r in replies),
            "incarnation": incarnation, "reason": "; ".join(dict.fromkeys(r["reason"] for r in chosen if r["reason"])),
            "staleness": max(r["staleness"] for r in replies)}
