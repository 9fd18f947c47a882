"""The parameter server sharded over Ray actors (edgeflow/cloud/ps/sharded.py), two shards
on a local two-node Ray cluster (ray.cluster_utils.Cluster) behind a gRPC front end: sync
training of three devices equals one process training on the union of their batches,
async applies every push once, a FedAvg round is the weighted mean (and equals the
unsharded server's), a push one shard missed reaches it before the next push (so that the
shards take the same devices into a sync step), and a shard actor killed mid-training (Ray
restarts it from its checkpoint) loses and doubles no step; `edgeflow serve --ray ADDRESS
--ps-shards 2`."""
import contextlib
import signal
import subprocess

import numpy as np
import pytest
import ray

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.cloud.backends import Unavailable
from edgeflow.cloud.ps import (ParameterClient, ParameterService, package_sha256, train_async, train_fedavg,
                               train_sync)
from edgeflow.cloud.ps.sharded import ShardedParameters, shard_name
from edgeflow.cloud.ps.state import (RESULT_APPLIED, RESULT_DROPPED, RESULT_PENDING, HostedParameters,
                                     Settings)
from edgeflow.cloud.replicas import NAMESPACE
from edgeflow.cloud.server import Server

from .conftest import ray_cluster
from .test_ps import B0, W0, adam_step, build_linear, grads, package
from .test_ps_training import DEVICES, build_mlp, digits, join_threads, run_threads, shard, start_threads, \
    union_reference
from .test_serve_cli import Lines, edgeflow

pytestmark = pytest.mark.slow  # a Ray cluster starts in ~10 s; CI runs these
SHARDS = 2


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(2) as cluster:
        yield cluster


@contextlib.contextmanager
def sharded(tmp_path, models, **options):
    """A front end serving ParameterService(`models`) on SHARDS shard actors per model:
    (its address, {id: ShardedParameters}); the actors are killed after."""
    service = ParameterService(models, checkpoint_dir=tmp_path / "ps", ray_shards=SHARDS, **options)
    try:
        with Server(parameter_server=service) as server:
            yield f"127.0.0.1:{server.port}", service.models
    finally:
        for hosted in service.models.values():
            for name in hosted.actor_names:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)


def sync_devices(path, target, model_id, devices, steps, on_step=None):
    """Train `devices` [(data, batch size, seed)] in sync mode, one thread each; their
    histories and, per device, {(step, name): the values it computed step from}."""
    histories, seen = {}, [{} for _ in devices]

    def device(k):
        def record(r):
            seen[k].update(((r["step"], name), value) for name, value in r["values"].items())
            if on_step is not None:
                on_step(k, r)

        def loop():
            data, size, seed = devices[k]
            with ParameterClient(target, timeout=60, retry_for=120, backoff=(0.05, 0.5)) as client:
                histories[k] = train_sync(path, data, client, model_id, f"d{k}", steps=steps, batch_size=size,
                                          seed=seed, on_step=record)
        return loop
    join_threads(*start_threads([device(k) for k in range(len(devices))]))
    return histories, seen


def final_state(target, model_id):
    with ParameterClient(target, timeout=60) as client:
        status = client.status(model_id)
        return status, client.pull(model_id, names=list(status["variables"])).values


def assert_every_step_once(status, shards, steps):
    assert (status["version"], status["updates_applied"], status["pending_devices"]) == (steps, steps, [])
    assert {d: (s["applied"], s["last_step_id"]) for d, s in status["devices"].items()} == \
        {f"d{k}": (steps, steps - 1) for k in range(DEVICES)}
    for s in shards:  # every shard applied every step once, and saw each device's every step
        assert (s["version"], s["updates_applied"], s["pending_devices"]) == (steps, steps, [])
        assert {d: r["applied"] for d, r in s["devices"].items()} == {f"d{k}": steps for k in range(DEVICES)}


def test_sync_on_two_shards_equals_one_process_on_the_union(cluster, tmp_path):
    path = build_mlp(tmp_path / "mlp.efl", hidden=32)
    train, _ = digits()
    steps = 20
    devices = [(shard(train, k), size, 10 + k) for k, size in enumerate((16, 24, 32))]  # unequal batches
    with sharded(tmp_path, {"sync": path}, mode="sync", replicas=DEVICES) as (target, hosted):
        sharding = hosted["sync"]
        assert len(sharding.shard_names) == SHARDS and len(set(sharding.nodes)) == SHARDS  # one per node
        histories, seen = sync_devices(path, target, "sync", devices, steps)
        status, final = final_state(target, "sync")
        shards = sharding.status()["shards"]
    assert all(r["result"] != "dropped" for h in histories.values() for r in h)
    assert_every_step_once(status, shards, steps)
    assert sorted(n for s in shards for n, v in s["variables"].items() if v["trainable"]) == sorted(sharding.names)
    reference = union_reference(path, devices, steps)
    for k in range(DEVICES):  # every device saw, at every global step, the reference's values
        assert len(seen[k]) == steps * 4
        for (v, name), value in seen[k].items():
            np.testing.assert_allclose(value, reference[v][name], rtol=1e-5, atol=1e-5, err_msg=f"{v}/{name}")
    for name, value in final.items():  # the variables and every Adam slot after the last step
        np.testing.assert_allclose(value, reference[steps][name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_async_on_two_shards_applies_every_push_once(cluster, tmp_path):
    adam, scaled = package(build_linear()), package(build_linear(device_scale=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    data = {"x": x, "y": (x @ rng.normal(size=(3, 2)) + 0.3).astype(np.float32)}
    with sharded(tmp_path, {"adam": adam, "scaled": scaled}, mode="async") as (target, hosted):
        assert hosted["adam"].shard_names == [["w"], ["b"]]
        with ParameterClient(target, timeout=60) as client:
            g = grads()
            first = client.push("adam", "phone", 0, g, 8, 0, "async")
            again = client.push("adam", "phone", 0, grads(scale=3.0), 8, 0, "async")  # the same step id
            assert (first.result, first.duplicate, first.version) == ("applied", False, 1)
            assert (again.result, again.duplicate, again.version, again.last_step_id) == ("applied", True, 1, 0)
            values = client.pull("adam", names=["w", "b", "w/Adam/step", "b/Adam/step"]).values
            # one device: step for step the same as training the package in one process
            device = ef.Interpreter(scaled)
            history = train_async(device, data, client, "scaled", "phone", epochs=3, batch_size=8, seed=4)
            served = client.pull("scaled", names=list(client.status("scaled")["variables"])).values

        def loop(k):
            def run():
                with ParameterClient(target, timeout=60) as c:
                    train_async(scaled, data, c, "scaled", f"d{k}", steps=6, batch_size=8, seed=k)
            return run
        run_threads([loop(k) for k in range(DEVICES)])  # concurrent devices: every push applied once
        shards = hosted["scaled"].status()["shards"]
        assert [s["updates_applied"] for s in hosted["adam"].status()["shards"]] == [1, 1]
    for name, start in (("w", W0), ("b", B0)):
        np.testing.assert_allclose(values[name], adam_step(start.astype(np.float64), g[name], 0.0, 0.0, 0)[0],
                                   rtol=1e-6, atol=1e-7)
        assert values[f"{name}/Adam/step"] == 1.0
    assert [r["step"] for r in history] == list(range(15)) and {r["result"] for r in history} == {"applied"}
    local = ef.Interpreter(scaled)
    training_loop.fit(local, data, epochs=3, batch_size=8, seed=4)
    want = local.variables()
    for name, value in served.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(device.variables()["scale"], want["scale"], rtol=1e-6)
    for s in shards:
        assert s["updates_applied"] == s["version"] == 15 + DEVICES * 6
        assert {d: (r["applied"], r["last_step_id"]) for d, r in s["devices"].items()} == \
            {"phone": (15, 14), **{f"d{k}": (6, 5) for k in range(DEVICES)}}


def test_fedavg_on_two_shards_is_the_weighted_mean_and_the_unsharded_servers(cluster, tmp_path):
    adam = package(build_linear())
    path = build_mlp(tmp_path / "mlp.efl", hidden=32)
    train, _ = digits()
    rounds = 3

    def fedavg(target):
        clients = [ParameterClient(target, timeout=60) for _ in range(DEVICES)]
        run_threads([lambda k=k: train_fedavg(path, shard(train, k), clients[k], "mlp", f"d{k}", rounds=rounds,
                                              batch_size=64, seed=k) for k in range(DEVICES)])
        for c in clients:
            c.close()
        return final_state(target, "mlp")
    with sharded(tmp_path, {"m": adam, "mlp": path}, mode="fedavg", replicas=DEVICES) as (target, _):
        with ParameterClient(target, timeout=60) as client:
            a, b, c = {"w": W0 + 1, "b": B0 - 1}, {"w": W0 * 3, "b": B0 * 2}, {"w": W0 - 2, "b": B0 * 0.5}
            assert client.push_model("m", "a", 0, a, 100).result == "pending"
            assert client.push_model("m", "a", 0, a, 100).duplicate
            assert client.push_model("m", "b", 0, b, 300).result == "pending"
            done = client.push_model("m", "c", 0, c, 50)
            assert (done.result, done.version) == ("applied", 1)
            assert client.push_model("m", "d", 0, b, 300).result == "dropped"  # round 0 is over
            values = client.pull("m").values
        status, final = fedavg(target)
    for name in ("w", "b"):
        want = (100 * a[name].astype(np.float64) + 300 * b[name] + 50 * c[name]) / 450
        np.testing.assert_allclose(values[name], want, rtol=1e-6)
    assert (status["version"], status["updates_applied"]) == (rounds, rounds)
    with Server(parameter_server=ParameterService({"mlp": path}, mode="fedavg", replicas=DEVICES)) as server:
        _, unsharded = fedavg(f"127.0.0.1:{server.port}")
    assert final.keys() == unsharded.keys()
    for name, value in final.items():
        np.testing.assert_allclose(value, unsharded[name], rtol=1e-6, atol=1e-7, err_msg=name)


class Gone:
    def push(self, *args):
        pass


def test_a_push_a_shard_missed_reaches_it_before_the_next_push(cluster, tmp_path):
    """Sync with a backup device (four devices, three per step): a's push reaches shard 0
    only (shard 1's actor is lost) and is answered UNAVAILABLE; b, d and c push next, then a
    again. Both shards take a, b and d into step 0 and drop c, as one unsharded server that
    got the pushes in shard 0's order; without the owed push shard 1 would take b, d, c."""
    adam = package(build_linear())
    sharding = ShardedParameters("owed", adam, "<bytes>", Settings(mode="sync", replicas=3,
                                                                   checkpoint_dir=str(tmp_path)), SHARDS)
    pushes = [("a", 1, 1.0), ("b", 2, -2.0), ("d", 3, 0.5), ("c", 4, 3.0)]
    try:
        gone = ray.remote(Gone).remote()
        ray.kill(gone, no_restart=True)
        sharding.shards[1] = gone
        with pytest.raises(Unavailable):
            sharding.push("a", 0, 0, 1, grads(1.0))
        replies = {d: sharding.push(d, 0, 0, count, grads(scale)) for d, count, scale in pushes[1:]}
        retry = sharding.push("a", 0, 0, 1, grads(1.0))
        status = sharding.status()
        values = sharding.pull(list(sharding.specs))[1]
    finally:
        for name in sharding.actor_names:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    assert [replies[d]["result"] for d in "bdc"] == [RESULT_PENDING, RESULT_APPLIED, RESULT_DROPPED]
    assert (retry["result"], retry["duplicate"]) == (RESULT_APPLIED, True)
    for s in status["shards"]:
        assert (s["version"], s["updates_applied"]) == (1, 1)
        assert {d: r["applied"] for d, r in s["devices"].items()} == {"a": 1, "b": 1, "c": 0, "d": 1}
    unsharded = HostedParameters("owed", adam, "<bytes>", Settings(mode="sync", replicas=3))
    for d, count, scale in pushes:
        unsharded.push(d, 0, 0, count, grads(scale))
    for name, value in unsharded.values(list(sharding.specs)).items():
        np.testing.assert_array_equal(values[name], value, err_msg=name)


def test_a_shard_killed_mid_sync_training_loses_and_doubles_no_step(cluster, tmp_path):
    """Kill one shard's actor at step 8 and the other's at step 17 (Ray restarts each
    from its checkpoint): devices see no restart, every step is applied once on every
    shard, and training ends where one process on the union of the batches ends."""
    path = build_mlp(tmp_path / "mlp.efl", hidden=32)
    train, _ = digits()
    steps = 25
    devices = [(shard(train, k), 32, 20 + k) for k in range(DEVICES)]
    killed = {}
    with sharded(tmp_path, {"kill": path}, mode="sync", replicas=DEVICES) as (target, hosted):
        actors = hosted["kill"].shards
        pids = [ray.get(a.info.remote(), timeout=60)["pid"] for a in actors]

        def kill(k, record):
            victim = {8: 1, 17: 0}.get(record["step"])
            if k == 0 and victim is not None and victim not in killed:
                killed[victim] = record["step"]
                ray.kill(actors[victim], no_restart=False)  # in the middle of the step's pushes
        histories, _ = sync_devices(path, target, "kill", devices, steps, on_step=kill)
        status, final = final_state(target, "kill")
        shards = hosted["kill"].status()["shards"]
        restarted = [ray.get(a.info.remote(), timeout=60)["pid"] for a in actors]
    assert killed == {1: 8, 0: 17} and all(a != b for a, b in zip(pids, restarted))
    for k in range(DEVICES):  # nothing was lost: no step trained twice
        assert [r["step"] for r in histories[k]] == list(range(steps))
        assert all(r["result"] != "dropped" for r in histories[k])
    assert_every_step_once(status, shards, steps)
    reference = union_reference(path, devices, steps)[steps]
    for name, value in final.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_serve_with_ps_shards_on_a_ray_cluster(cluster, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    sha = package_sha256((models / "cli.efl").read_bytes()) if build_mlp(models / "cli.efl", hidden=8) else None
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", models, "--port", 0, "--parameter-server", "async",
                                     "--ray", cluster.address, "--ps-shards", 2, "--state-dir", tmp_path / "state"),
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc.stderr)
        lines.wait_for(r"on 2 Ray shard\(s\) each", limit_s=120)
        port = lines.wait_for(r"serving \d+ models? on [\d.]+:(\d+)", limit_s=120).group(1)
        with ParameterClient(f"127.0.0.1:{port}", timeout=60) as client:
            gradients = {n: np.full_like(v, 0.5) for n, v in client.pull("cli").values.items()}
            assert client.push("cli", "a", 0, gradients, 1, 0, "async").result == "applied"
            status = client.status("cli")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in range(2):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(shard_name("cli", sha, k, 2), namespace=NAMESPACE))
    assert status["updates_applied"] == 1 and len(status["variables"]) == 4 * 4  # 4 variables, 3 Adam slots each
    assert sorted(p.name for p in (tmp_path / "state" / "ps").iterdir()) == \
        ["cli.shard0-of-2.ps.npz", "cli.shard1-of-2.ps.npz"]
