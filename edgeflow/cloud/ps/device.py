"""The device's side of parameter-server training (edgeflow.cloud.ps): the loops of every
mode that pull the cloud variables, train on local data and push gradients or models.

    from edgeflow.cloud.ps import ParameterClient, train

    with ParameterClient("server:50052") as cloud:
        history = train("mlp.efl", {"x": x, "y": y}, cloud, "mlp", "phone-17", mode="sync", steps=300)

The device runs the package's `train` graph with its local copies of the cloud variables
set to the values it pulled: in sync and async modes forward and backward to the
gradients of the cloud variables (whose updates run on the server), plus the updates of
the device's own variables, if any; in FedAvg mode the whole train step, `local_epochs`
times over its data, from the round's global values (the optimizer slots of the cloud
variables start afresh each round, so a round is a function of the global values and the
round number alone).

Every loop is driven by what the server says, so it resumes by itself: sync trains the
server's global step v on batch v of the device's data; async trains the step after the
last one the server took from this device; FedAvg trains the server's round. A server
that restarted from an older checkpoint is noticed (a dropped push, or the version and
incarnation of a Pull) and the lost steps are trained again; a device that restarts
picks up where the server is. Batch i of the data is batch (i mod steps per epoch) of
epoch (i div steps per epoch), as edgeflow.training_loop.Batches reads it: `data` is a dict
of arrays (shuffled by (seed, epoch), cut into batches of batch_size) or a finite
ef.data.Dataset of batches (one pass an epoch; batch_size and seed are its own).

Each loop returns its history: one dict per push, {"step", "version", "loss", "result",
"duplicate"}; `on_step(record)` gets each as it happens, with the pulled "values" too.
"""
import hashlib

import numpy as np

from ...errors import InvalidInputError, RemoteError
from ...interp import Interpreter
from ...splitter.partition import file_sha256
from ...training_loop import Batches
from .roles import TrainingRoles

__all__ = ["train", "train_sync", "train_async", "train_fedavg", "steps_per_epoch"]
WAIT_S = 5.0  # how long one Pull waits for the other replicas before it asks again


def steps_per_epoch(data, batch_size):
    """Batches in an epoch of `data` (a dict of arrays or a dataset of batches)."""
    return Batches(data, batch_size).per_epoch


class _Device:
    """A device's package, its roles and its connection to the parameter server."""

    def __init__(self, package, client, model_id, device_id, data, batch_size, seed, check_package=True):
        if not device_id or not isinstance(device_id, str):
            raise InvalidInputError(f"expected a device id (a non-empty str), got {device_id!r}")
        if isinstance(package, Interpreter):  # its bytes are not at hand: the server cannot check them
            self.interp, self.sha256 = package, None
        elif isinstance(package, (bytes, bytearray, memoryview)):
            self.interp = Interpreter(bytes(package))
            self.sha256 = hashlib.sha256(package).hexdigest() if check_package else None
        else:
            self.interp = Interpreter(package)  # mapped, not read
            self.sha256 = file_sha256(package) if check_package else None
        self.roles = TrainingRoles(self.interp.model)
        self.client, self.model_id, self.device_id = client, model_id, device_id
        self.batch = Batches(data, batch_size, seed, inputs=self.interp.get_signature_runner("train")
                             .get_input_details())  # batch(i): batch i of the endless epochs
        self.names = None  # the served variables, as the server says
        self._fetches = None

    def pull(self, previous=None, wait=0.0):
        """The server's values (a Pulled); with `previous`, wait for them to change (the
        answer keeps previous's values when nothing changed)."""
        if previous is None:
            pulled = self.client.pull(self.model_id, device_id=self.device_id, sha256=self.sha256)
        else:
            pulled = self.client.pull(self.model_id, device_id=self.device_id, sha256=self.sha256,
                                      wait_while=previous.version, incarnation=previous.incarnation, wait=wait)
            if not pulled.changed:
                pulled.values = previous.values
        if self.names is None:
            self.names = list(pulled.values)
            self.roles.check_served(self.names)
            self._grads = [self.roles.roles[n].gradient for n in self.names]
            self._fetches = list(dict.fromkeys(self._grads + list(self.roles.outputs.values())))
            self._targets = self.roles.device_targets(self.names)
        return pulled

    def set_values(self, values):
        self.roles.set_variables(self.interp, values)

    def gradients(self, batch):
        """({variable: gradient}, loss) of the served variables on `batch`; the device's own
        variables' updates run too."""
        feeds = {self.roles.inputs[name]: value for name, value in batch.items()}
        out = self.interp.run(self._fetches, feeds, self._targets)
        return {n: out[g] for n, g in zip(self.names, self._grads)}, _loss(out, self.roles)

    def values(self):
        return {n: self.interp.get_tensor(self.roles.variables[n]) for n in self.names}


def _loss(out, roles):
    name = roles.outputs.get("loss")
    return float(np.asarray(out[name]).mean()) if name in out else float("nan")


def _record(history, on_step, step, version, loss, pushed, values):
    record = {"step": step, "version": version, "loss": loss, "result": pushed.result,
              "duplicate": pushed.duplicate}
    history.append(record)
    if on_step is not None:
        on_step({**record, "values": values})


def _total(steps, epochs, per_epoch, what):
    if (steps is None) == (epochs is None):
        raise InvalidInputError(f"{what}: give steps or epochs (one of them)")
    total = steps if steps is not None else epochs * per_epoch
    if not isinstance(total, int) or total < 0:
        raise InvalidInputError(f"{what}: expected a whole number of steps >= 0, got {total!r}")
    return total


def train_sync(package, data, client, model_id, device_id, steps=None, epochs=None, batch_size=32, seed=0,
               on_step=None, compression="none", check_package=True, wait_s=WAIT_S):
    """Synchronous data-parallel training: for each global step v < `steps` (or `epochs`
    of this device's data), pull the values of version v, push the gradients of batch v,
    and wait until the server has the other replicas' and applied the step."""
    device = _Device(package, client, model_id, device_id, data, batch_size, seed, check_package)
    total = _total(steps, epochs, device.batch.per_epoch, "train_sync")
    history = []
    pulled = device.pull()
    _expect_mode(pulled, "sync")
    while pulled.version < total:
        v = pulled.version
        if pulled.last_step_id < v:  # this device has not contributed to step v (or the server lost it)
            device.set_values(pulled.values)
            b = device.batch(v)
            grads, loss = device.gradients(b)
            pushed = client.push(model_id, device_id, v, grads, len(next(iter(b.values()))), v, "sync",
                                 sha256=device.sha256, compression=compression)
            _record(history, on_step, v, v, loss, pushed, pulled.values)
            if pushed.result == "dropped":  # stale, or ahead of a restarted server: take its values
                pulled = device.pull()
                continue
        pulled = device.pull(pulled, wait_s)
    device.batch.close()
    return history


def train_async(package, data, client, model_id, device_id, steps=None, epochs=None, batch_size=32, seed=0,
                on_step=None, compression="none", check_package=True):
    """Asynchronous training: this device's steps 0 .. `steps` - 1 (or `epochs` of its
    data), each on the latest values, pushed and applied at once."""
    device = _Device(package, client, model_id, device_id, data, batch_size, seed, check_package)
    total = _total(steps, epochs, device.batch.per_epoch, "train_async")
    history = []
    pulled = device.pull()
    _expect_mode(pulled, "async")
    while pulled.last_step_id + 1 < total:
        step = pulled.last_step_id + 1  # where the server says this device is
        device.set_values(pulled.values)
        b = device.batch(step)
        grads, loss = device.gradients(b)
        pushed = client.push(model_id, device_id, step, grads, len(next(iter(b.values()))), pulled.version,
                             "async", sha256=device.sha256, compression=compression)
        _record(history, on_step, step, pulled.version, loss, pushed, pulled.values)
        pulled = device.pull()
    device.batch.close()
    return history


def train_fedavg(package, data, client, model_id, device_id, rounds, local_epochs=1, batch_size=32, seed=0,
                 on_step=None, compression="none", check_package=True, wait_s=WAIT_S):
    """Federated averaging: for each round r < `rounds`, start from the round's global
    values (optimizer slots reset), train `local_epochs` epochs on the local data
    (epochs r * local_epochs ...), push the values with the local sample count, and wait
    for the server's average."""
    if not isinstance(rounds, int) or rounds < 0 or not isinstance(local_epochs, int) or local_epochs < 1:
        raise InvalidInputError(f"train_fedavg: expected rounds >= 0 and local_epochs >= 1, got {rounds} "
                                f"and {local_epochs}")
    device = _Device(package, client, model_id, device_id, data, batch_size, seed, check_package)
    runner = device.interp.get_signature_runner("train")
    per_epoch = device.batch.per_epoch
    history = []
    pulled = device.pull()
    _expect_mode(pulled, "fedavg")
    slots = device.roles.slots_of(device.names)
    fresh = {s: device.roles.initial(s) for s in slots}
    while pulled.version < rounds:
        r = pulled.version
        if pulled.last_step_id < r:
            device.set_values({**pulled.values, **fresh})
            losses, samples = [], 0
            for i in range(r * local_epochs * per_epoch, (r + 1) * local_epochs * per_epoch):
                b = device.batch(i)
                samples += len(next(iter(b.values())))
                losses.append(float(np.asarray(runner(**b).get("loss", np.nan)).mean()))
            pushed = client.push_model(model_id, device_id, r, device.values(), samples // local_epochs,
                                       sha256=device.sha256, compression=compression)
            _record(history, on_step, r, r, float(np.mean(losses)) if losses else float("nan"), pushed,
                    pulled.values)
            if pushed.result == "dropped":
                pulled = device.pull()
                continue
        pulled = device.pull(pulled, wait_s)
    device.batch.close()
    return history


def train(package, data, client, model_id, device_id, mode, **options):
    """train_sync, train_async or train_fedavg, by `mode` ("sync", "async", "fedavg")."""
    loops = {"sync": train_sync, "async": train_async, "fedavg": train_fedavg}
    if mode not in loops:
        raise InvalidInputError(f"mode: expected one of {', '.join(loops)}, got {mode!r}")
    return loops[mode](package, data, client, model_id, device_id, **options)


def _expect_mode(pulled, mode):
    if pulled.mode != mode:
        error = RemoteError(f"the parameter server trains this model in {pulled.mode} mode"
                            + (f" with {pulled.replicas} replicas" if pulled.mode != "async" else "")
                            + f"; this device was started in {mode} mode")
        error.code, error.details = "FAILED_PRECONDITION", str(error)
        raise error
