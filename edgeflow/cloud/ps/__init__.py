"""The parameter server: variables pinned to the cloud live here; devices pull and push.

A trainable package (`ef.save` with a `train` signature whose targets are an optimizer's
updates) whose variables were created under `with ef.device("cloud")` carries, in its
"edgeflow.roles" metadata, each variable's gradient tensor and the ops of its optimizer
update (placed "cloud"). `ParameterService` holds, per model, those variables and their
optimizer slots in one Interpreter of the same package, guarded by a lock, and applies
updates by feeding the gradient tensors and running the update ops (`Interpreter.run`).
Devices (edgeflow/cloud/ps/device.py) run the rest: forward and backward to the
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

Modules: roles.py (what a trainable package says about its training), state.py (a
model's hosted state, aggregation and the exactly-once table: no gRPC), service.py (the
gRPC service), client.py (`ParameterClient`), device.py (the device loops of every mode),
shards.py (which shard holds which variable) and sharded.py (the variables sharded over
Ray actors, `ParameterService(..., ray_shards=N)`: the guarantees above hold per shard and
for the model; see its docstring for why). Serve it with
`Server(parameter_server=ParameterService(...))`, or
`edgeflow serve --model-dir DIR --parameter-server sync --aggregate 3 --state-dir state/`
(add `--ray [ADDRESS] --ps-shards N` to shard it over a Ray cluster).
"""

_EXPORTS = {"TrainingRoles": "roles", "HostedParameters": "state", "Settings": "state",
            "package_sha256": "state", "ParameterService": "service", "SERVICE": "service",
            "ParameterClient": "client", "Pulled": "client", "Pushed": "client",
            "train": "device", "train_sync": "device", "train_async": "device", "train_fedavg": "device",
            "steps_per_epoch": "device", "ShardedParameters": "sharded"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
