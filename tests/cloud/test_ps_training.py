"""Parameter-server training end to end on scikit-learn's digits: sync mode with three
device processes equals one process training on the union of their batches; async and
FedAvg converge to within 1 point of local training; a server killed with SIGKILL
mid-training resumes from its checkpoint and training completes with every step applied
exactly once and the uninterrupted run's result."""
import json
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop

from sklearn import datasets

from edgeflow.cloud.ps import (ParameterClient, ParameterService, TrainingRoles, steps_per_epoch,
                               train_async, train_fedavg, train_sync)
from edgeflow.cloud.server import Server

DEVICES = 3
GUARD_S = 120  # hang guards only: no assertion depends on how long anything takes

_DIGITS = {}


def digits():
    """(train {"x", "y"}, (x_test, y_test)): a fixed shuffle, 1257 to train, 540 to test."""
    if not _DIGITS:
        d = datasets.load_digits()
        order = np.random.default_rng(0).permutation(len(d.target))
        x, y = (d.data / 16.0).astype(np.float32)[order], d.target.astype(np.int64)[order]
        _DIGITS["data"] = ({"x": x[:1257], "y": y[:1257]}, (x[1257:], y[1257:]))
    return _DIGITS["data"]


def shard(data, k, n=DEVICES):
    return {name: values[k::n] for name, values in data.items()}


def build_mlp(path, hidden=128, lr=0.001, seed=0):
    """64 -> hidden -> 10, relu, softmax cross-entropy, Adam; its variables in the cloud."""
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(seed)
        x = ef.placeholder(ef.float32, [None, 64], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        with ef.device("cloud"):
            h = ef.layers.dense(x, hidden, activation=ef.nn.relu)
            logits = ef.layers.dense(h, 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        step = ef.train.Adam(lr).minimize(loss)
    ef.save(g, path, signatures={"infer": ({"x": x}, {"logits": logits}),
                                 "train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    return str(path)


def accuracy(path, values):
    """Test accuracy in percent of the package at `path` with its variables set to `values`."""
    interp = ef.Interpreter(path)
    TrainingRoles(interp.model).set_variables(interp, values)
    _, (x, y) = digits()
    return 100.0 * float((interp.get_signature_runner("infer")(x=x)["logits"].argmax(1) == y).mean())


def batch(data, batch_size, seed, index):
    """Batch `index` of the device's endless epochs, from the definition of training_loop.batches'
    order (a permutation per (seed, epoch)), written out here independently."""
    n = len(data["y"])
    per_epoch = -(-n // batch_size)
    epoch, step = divmod(index, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)[step * batch_size:(step + 1) * batch_size]
    return {name: values[order] for name, values in data.items()}


def union_reference(path, devices, steps):
    """[variables before step 0, after step 1, ...]: one process training on the
    concatenation of every device's batch at each step."""
    interp = ef.Interpreter(path)
    run = interp.get_signature_runner("train")
    states = [interp.variables()]
    for v in range(steps):
        parts = [batch(data, size, seed, v) for data, size, seed in devices]
        run(**{name: np.concatenate([p[name] for p in parts]) for name in ("x", "y")})
        states.append(interp.variables())
    return states


def start_threads(loops):
    """Threads running `loops`; (threads, the exceptions they raise)."""
    errors = []

    def capture(loop):
        try:
            loop()
        except BaseException as e:  # reported by join_threads
            errors.append(e)
    threads = [threading.Thread(target=capture, args=(loop,), daemon=True) for loop in loops]
    for t in threads:
        t.start()
    return threads, errors


def join_threads(threads, errors):
    for t in threads:
        t.join(GUARD_S)
    assert not any(t.is_alive() for t in threads), "a device loop hung"
    if errors:
        raise errors[0]


def run_threads(loops):
    join_threads(*start_threads(loops))


# -- sync: three device processes == one process on the union of their batches ----------------

DEVICE_PROCESS = r"""
import json, sys
import numpy as np
from edgeflow.cloud.ps import ParameterClient, train_sync
a = json.loads(sys.argv[1])
data = dict(np.load(a["data"]))
seen = {}
def on_step(record):  # the values this device computed step `step` from
    seen.update({f"{record['step']}/{name}": value for name, value in record["values"].items()})
with ParameterClient(a["target"], timeout=60) as client:
    history = train_sync(a["package"], data, client, "mlp", a["device"], steps=a["steps"],
                         batch_size=a["batch"], seed=a["seed"], on_step=on_step)
np.savez(a["out"], **seen)
print(json.dumps([r["result"] for r in history]))
"""


def test_sync_with_three_device_processes_equals_one_process_on_the_union(tmp_path):
    path = build_mlp(tmp_path / "mlp.efl", hidden=32)
    train, _ = digits()
    steps = 20
    devices = [(shard(train, k), size, 10 + k) for k, size in enumerate((16, 24, 32))]  # unequal batches
    service = ParameterService({"mlp": path}, mode="sync", replicas=DEVICES)
    with Server(parameter_server=service) as server:
        procs = []
        for k, (data, size, seed) in enumerate(devices):
            np.savez(tmp_path / f"data{k}.npz", **data)
            args = {"target": f"127.0.0.1:{server.port}", "package": path,
                    "data": str(tmp_path / f"data{k}.npz"),
                    "device": f"d{k}", "steps": steps, "batch": size, "seed": seed,
                    "out": str(tmp_path / f"seen{k}.npz")}
            procs.append(subprocess.Popen([sys.executable, "-c", DEVICE_PROCESS, json.dumps(args)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=GUARD_S) for p in procs]
        for p, (out, err) in zip(procs, outputs):
            assert p.returncode == 0, err[-3000:]
        with ParameterClient(f"127.0.0.1:{server.port}") as client:
            status = client.status("mlp")
            final = client.pull("mlp", names=list(status["variables"])).values
    for out, _ in outputs:
        assert json.loads(out.strip().splitlines()[-1]).count("dropped") == 0
    assert status["version"] == steps and status["updates_applied"] == steps
    assert {d: (s["applied"], s["last_step_id"]) for d, s in status["devices"].items()} == \
        {f"d{k}": (steps, steps - 1) for k in range(DEVICES)}
    reference = union_reference(path, devices, steps)
    for k in range(DEVICES):  # every device saw, at every global step, the reference's values
        seen = np.load(tmp_path / f"seen{k}.npz")
        assert len(seen.files) == steps * 4
        for key in seen.files:
            v, name = key.split("/", 1)
            np.testing.assert_allclose(seen[key], reference[int(v)][name], rtol=1e-5, atol=1e-5, err_msg=key)
    for name, value in final.items():  # the variables and every Adam slot after the last step
        np.testing.assert_allclose(value, reference[steps][name], rtol=1e-5, atol=1e-5, err_msg=name)


# -- async and FedAvg converge like local training ------------------------------------------

EPOCHS, BATCH = 30, 64
LAST = 5  # accuracy is the mean over the last 5 epochs (rounds): a plateau, not one noisy point


class Interleaved(ParameterClient):
    """A fixed interleaving of asynchronous devices, so that the test is deterministic: in
    device order, each pushes and pulls; once all have, all compute their next gradients.
    Device k's gradients are then 2 - k versions stale, as with free-running devices of
    equal speed."""

    def __init__(self, target, k, barrier, turn):
        super().__init__(target, timeout=60)
        self.k, self.barrier, self.turn = k, barrier, turn
        self.holding = False

    def push(self, *args, **kwargs):
        with self.turn:
            assert self.turn.wait_for(lambda: self.turn.next == self.k, GUARD_S)
        self.holding = True  # until this device has pulled
        return super().push(*args, **kwargs)

    def pull(self, *args, **kwargs):
        pulled = super().pull(*args, **kwargs)
        if self.holding:
            self.holding = False
            with self.turn:
                self.turn.next = (self.k + 1) % DEVICES
                self.turn.notify_all()
        self.barrier.wait(GUARD_S)
        return pulled


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """(package, [test accuracy after each epoch]) of local training on all the data."""
    path = build_mlp(tmp_path_factory.mktemp("local") / "mlp.efl")
    train, _ = digits()
    interp = ef.Interpreter(path)
    per_epoch = steps_per_epoch(train, BATCH)
    curve = []
    training_loop.fit(interp, train, epochs=EPOCHS, batch_size=BATCH, seed=0,
                on_step=lambda epoch, step, loss: curve.append(accuracy(path, interp.variables()))
                if step % per_epoch == 0 else None)
    return path, curve


@pytest.mark.slow
def test_async_converges_within_one_point_of_local_training(local_run):
    path, local = local_run
    train, _ = digits()
    service = ParameterService({"mlp": path}, mode="async")
    per_epoch = steps_per_epoch(shard(train, 0), BATCH)
    epoch_ends = []
    barrier, turn = threading.Barrier(DEVICES), threading.Condition()
    turn.next = 0
    with Server(parameter_server=service) as server:
        def device(k):
            def loop():
                on_step = (lambda r: epoch_ends.append(r["values"]) if r["step"] % per_epoch == 0 else None) \
                    if k == 0 else None
                with Interleaved(f"127.0.0.1:{server.port}", k, barrier, turn) as client:
                    train_async(path, shard(train, k), client, "mlp", f"d{k}", epochs=EPOCHS, batch_size=BATCH,
                                seed=k, on_step=on_step)
            return loop
        run_threads([device(k) for k in range(DEVICES)])
        with ParameterClient(f"127.0.0.1:{server.port}") as client:
            status = client.status("mlp")
            final = client.pull("mlp").values
    assert status["updates_applied"] == DEVICES * EPOCHS * per_epoch
    assert all(d["last_step_id"] == EPOCHS * per_epoch - 1 for d in status["devices"].values())
    curve = [accuracy(path, v) for v in epoch_ends[1:]] + [accuracy(path, final)]  # after epochs 1 .. EPOCHS
    assert len(curve) == EPOCHS
    local_acc, async_acc = np.mean(local[-LAST:]), np.mean(curve[-LAST:])
    print(f"\ndigits, last {LAST} epochs: local {local_acc:.2f}%, async ({DEVICES} devices) {async_acc:.2f}%; "
          f"final epoch: {local[-1]:.2f}% and {curve[-1]:.2f}%")
    assert async_acc >= local_acc - 1.0, (local[-LAST:], curve[-LAST:])


@pytest.mark.slow
def test_fedavg_converges_within_one_point_of_local_training(local_run):
    path, local = local_run
    train, _ = digits()
    rounds, local_epochs = EPOCHS, 4
    service = ParameterService({"mlp": path}, mode="fedavg", replicas=DEVICES)
    round_starts = []
    with Server(parameter_server=service) as server:
        clients = [ParameterClient(f"127.0.0.1:{server.port}", timeout=60) for _ in range(DEVICES)]

        def device(k):
            return lambda: train_fedavg(path, shard(train, k), clients[k], "mlp", f"d{k}", rounds=rounds,
                                        local_epochs=local_epochs, batch_size=BATCH, seed=k,
                                        on_step=(lambda r: round_starts.append(r["values"])) if k == 0 else None)
        run_threads([device(k) for k in range(DEVICES)])
        status = clients[0].status("mlp")
        final = clients[0].pull("mlp").values
        bytes_per_round = sum(c.bytes_pushed + c.bytes_pulled for c in clients) / rounds
        for c in clients:
            c.close()
    assert status["version"] == rounds and status["updates_applied"] == rounds
    assert {d: s["applied"] for d, s in status["devices"].items()} == {f"d{k}": rounds for k in range(DEVICES)}
    curve = [accuracy(path, v) for v in round_starts[1:]] + [accuracy(path, final)]  # after rounds 1 .. rounds
    local_acc, fedavg_acc = np.mean(local[-LAST:]), np.mean(curve[-LAST:])
    print(f"\ndigits, last {LAST}: local {local_acc:.2f}% (epochs), FedAvg {fedavg_acc:.2f}% (rounds of "
          f"{local_epochs} local epochs on {DEVICES} devices); {bytes_per_round / 1e3:.0f} kB per round")
    assert fedavg_acc >= local_acc - 1.0, (local[-LAST:], curve[-LAST:])


# -- SIGKILL the server mid-training ----------------------------------------------------------

def _start_server(path, state, port=0):
    """`edgeflow serve --parameter-server sync` hosting `path` (as "mlp"); (process, port)."""
    models = state / "models"
    if not models.exists():
        models.mkdir()
        (models / "mlp.efl").write_bytes(pathlib.Path(path).read_bytes())
    log_path = state / "server.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    log = open(log_path, "a")
    proc = subprocess.Popen([sys.executable, "-m", "edgeflow.cli", "serve", "--model-dir", str(models),
                             "--parameter-server", "sync", "--aggregate", str(DEVICES),
                             "--state-dir", str(state / "state"), "--checkpoint-every", "5", "--port", str(port)],
                            stdout=log, stderr=log)
    deadline = time.monotonic() + GUARD_S
    while True:
        with open(log_path) as f:
            f.seek(start)
            found = re.search(r"serving \d+ models? on [\d.]+:(\d+)", f.read())
        if found:
            return proc, int(found.group(1))
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)


def _wait_for(client, condition):
    deadline = time.monotonic() + GUARD_S
    while True:
        status = client.status("mlp")
        if condition(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_mid_training_resumes_with_every_step_applied_once(tmp_path):
    path = build_mlp(tmp_path / "mlp.efl", hidden=32)
    train, _ = digits()
    steps, size = 40, 32
    devices = [(shard(train, k), size, 20 + k) for k in range(DEVICES)]
    server, port = _start_server(path, tmp_path)
    target = f"127.0.0.1:{port}"
    release = threading.Event()
    histories = {}
    try:
        def device(k):
            def parked(record):  # d1, d2 stop after their push of step 6; d0 goes on to push step 7
                if k and record["step"] == 6 and not release.is_set():
                    assert release.wait(GUARD_S)

            def loop():
                data, batch_size, seed = devices[k]
                with ParameterClient(target, timeout=30, retry_for=GUARD_S, backoff=(0.05, 0.5)) as client:
                    histories[k] = train_sync(path, data, client, "mlp", f"d{k}", steps=steps,
                                              batch_size=batch_size, seed=seed, on_step=parked)
            return loop
        threads = start_threads([device(k) for k in range(DEVICES)])
        with ParameterClient(target, timeout=30, retry_for=GUARD_S) as watcher:
            before = _wait_for(watcher, lambda s: s["version"] == 7 and s["pending_devices"] == ["d0"])
            assert before["checkpoint_version"] == 5 and before["updates_applied"] == 7
            server.send_signal(signal.SIGKILL)  # steps 5 and 6, and d0's push of step 7, are lost
            server.wait(GUARD_S)
            server, _ = _start_server(path, tmp_path, port)
            after = watcher.status("mlp")
            assert after["incarnation"] != before["incarnation"]
            assert (after["version"], after["updates_applied"]) == (5, 5)  # the checkpoint's
            release.set()
            join_threads(*threads)
            status = watcher.status("mlp")
            final = watcher.pull("mlp", names=list(status["variables"])).values
    finally:
        release.set()
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)  # a graceful stop checkpoints
            server.wait(GUARD_S)
    assert server.returncode == 0, (tmp_path / "server.log").read_text()[-3000:]
    # every step applied exactly once: the counts, and the variables
    assert (status["version"], status["updates_applied"], status["pending_devices"]) == (steps, steps, [])
    assert {d: (s["applied"], s["last_step_id"]) for d, s in status["devices"].items()} == \
        {f"d{k}": (steps, steps - 1) for k in range(DEVICES)}
    for k in range(DEVICES):  # the lost steps were trained again, and only those
        pushed = [r["step"] for r in histories[k] if r["result"] != "dropped"]
        redone = [5, 6, 7] if k == 0 else [5, 6]
        assert pushed == list(range(5 + len(redone))) + list(range(5, steps)), (k, pushed)
    reference = union_reference(path, devices, steps)[steps]
    for name, value in final.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert accuracy(path, final) == accuracy(path, reference)
    resumed = ParameterService({"mlp": path}, mode="sync", replicas=DEVICES, checkpoint_dir=tmp_path / "state" / "ps")
    assert resumed.stats("mlp")["version"] == steps  # the shutdown checkpoint


# -- a device's data as an ef.data.Dataset ---------------------------------------------------

def test_sync_and_fedavg_read_a_device_dataset(tmp_path):
    """Sync: a shuffled, batched, prefetched dataset gives the values of training on the
    batches of numpy's permutation per (seed, epoch), over an epoch's end. FedAvg: two
    devices' datasets of 300 and 100 rows average to their local training weighted 3:1."""
    path = build_mlp(tmp_path / "mlp.efl", hidden=16)
    train, _ = digits()

    def dataset(data, size, seed):
        return ef.data.Dataset.from_tensor_slices(data).shuffle(len(data["y"]), seed=seed).batch(size).prefetch(2)
    data, size, seed, steps = {k: v[:100] for k, v in train.items()}, 32, 7, 6  # 4 batches an epoch
    service = ParameterService({"mlp": path}, mode="sync", replicas=1)
    with Server(parameter_server=service) as server, \
            ParameterClient(f"127.0.0.1:{server.port}", timeout=60) as client:
        history = train_sync(path, dataset(data, size, seed), client, "mlp", "d0", steps=steps)
        final = client.pull("mlp", names=list(client.status("mlp")["variables"])).values
    assert [r["step"] for r in history] == list(range(steps))
    reference = union_reference(path, [(data, size, seed)], steps)[steps]
    for name, value in final.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-6, err_msg=name)

    shards = [({k: v[:300] for k, v in train.items()}, 0), ({k: v[300:400] for k, v in train.items()}, 1)]
    service = ParameterService({"mlp": path}, mode="fedavg", replicas=2)
    with Server(parameter_server=service) as server:
        clients = [ParameterClient(f"127.0.0.1:{server.port}", timeout=60) for _ in shards]
        run_threads([lambda k=k: train_fedavg(path, dataset(shards[k][0], 50, shards[k][1]), clients[k], "mlp",
                                              f"d{k}", rounds=1, local_epochs=2) for k in range(2)])
        final = clients[0].pull("mlp").values
        for c in clients:
            c.close()
    local = []
    for part, seed in shards:  # round 0 starts from the package's values: local training from scratch
        interp = ef.Interpreter(path)
        training_loop.fit(interp, part, epochs=2, batch_size=50, seed=seed)
        local.append(interp.variables())
    for name, value in final.items():
        np.testing.assert_allclose(value, (300 * local[0][name].astype(np.float64) + 100 * local[1][name]) / 400,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
