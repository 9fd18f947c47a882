"""The cloud on a local multi-node Ray cluster (ray.cluster_utils.Cluster, three nodes of
one CPU each): models as Ray Serve replicas behind two gRPC front ends (one in this
process, one `edgeflow serve --ray ADDRESS --processes 2`), and split training whose state lives
in a Ray actor. Against independent references: the unsplit model run in this process,
numpy, and one process training alone."""
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import ray

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.cloud import Client, CloudDelegate, Server
from edgeflow.cloud.metrics import Metrics
from edgeflow.cloud.replicas import NAMESPACE, RayBackend, app_name
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import RemoteError
from edgeflow.format import reader, writer
from edgeflow.splitter import partition

from .conftest import build_model, ray_cluster, reference
from .test_serve_cli import Lines, edgeflow
from .test_split_inference import DATA, feeds_for
from .test_split_training import assert_as_if_never_stopped, digits, split

pytestmark = pytest.mark.slow  # a Ray cluster starts in ~10 s; CI runs these


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(3) as cluster:
        yield cluster


def undeploy(frontend):
    """Delete the Serve applications of `frontend`'s models: front ends leave them running
    for each other, and the next test needs the cluster's CPUs."""
    from ray import serve
    for model in frontend.models.all():
        serve.delete(app_name(model))


def replica_infos(model, n=40):
    """{replica name: info} of the replicas that answered `n` info calls."""
    from ray import serve
    handle = serve.get_deployment_handle("model", app_name=app_name(model))
    infos = [handle.info.remote().result(timeout_s=30) for _ in range(n)]
    return {i["replica"]: i for i in infos}


@pytest.fixture(scope="module")
def split_mobilenet(tmp_path_factory):
    """MobileNetV2 (tests/data/onnx) split in the middle: the original, the device package
    and a served directory holding the cloud package."""
    root = tmp_path_factory.mktemp("ray-split")
    original = root / "mobilenetv2.efl"
    onnx_converter.convert(DATA / "mobilenetv2.onnx", original)
    model = reader.load(original)
    ops = partition.Cut(model, set()).ops
    partition.write_pair(model, set(ops[:len(ops) // 2]), root, model_id="mnv2")
    served = root / "served"
    served.mkdir()
    (served / "mnv2.efl").write_bytes((root / "cloud.efl").read_bytes())
    return original, root / "device.efl", served


def test_split_inference_through_two_front_ends_equals_local(cluster, split_mobilenet, tmp_path):
    original, device_package, served = split_mobilenet
    frontend = Server(served, ray=RayBackend(cluster.address, replicas=2, replica_cpus=1))
    frontend.start()
    # The other front end is two processes on one port (--processes): each finds the replicas.
    other = subprocess.Popen(edgeflow("serve", "--model-dir", served, "--port", 0, "--ray", cluster.address,
                                      "--processes", 2), stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(other.stderr)
        port = lines.wait_for(r"serving \d+ models? on [\d.]+:(\d+) in 2 processes", limit_s=180).group(1)
        local = ef.Interpreter(original).get_signature_runner("infer")
        for k, target in enumerate([frontend.address, f"127.0.0.1:{port}"]):
            device = ef.Interpreter(device_package, delegates=[CloudDelegate(target)]).get_signature_runner("infer")
            for seed in range(3):
                feeds = feeds_for(ef.Interpreter(original), 1 + seed, seed + 10 * k)
                want, got = local(**feeds), device(**feeds)
                for name in want:
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
        # Both replicas served, one per node: each asks for the one CPU a node has.
        infos = replica_infos(frontend.models["mnv2"])
        assert len(infos) == 2 and len({i["node"] for i in infos.values()}) == 2
    finally:
        other.send_signal(signal.SIGTERM)
        other.wait(timeout=60)
        frontend.stop()
        undeploy(frontend)


def test_a_killed_replica_answers_every_request_rightly_or_unavailable(cluster, tmp_path):
    """Eight devices in closed loops; one of the two replicas is SIGKILLed mid-load. Every
    reply is right (against numpy) or UNAVAILABLE, and Serve replaces the replica."""
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    writer.write(build_model(), model_dir / "m.efl")
    frontend = Server(model_dir, ray=RayBackend(cluster.address, replicas=2, replica_cpus=0.5))
    frontend.start()
    model = frontend.models["m"]
    before = replica_infos(model)
    assert len(before) == 2
    stop, counts, wrong, lock = threading.Event(), {"ok": 0, "unavailable": 0, "after_kill": 0}, [], threading.Lock()
    killed = threading.Event()

    def device(seed):
        rng = np.random.default_rng(seed)
        with Client(frontend.address, timeout=60) as client:
            while not stop.is_set():
                x = rng.standard_normal((int(rng.integers(1, 5)), 4)).astype(np.float32)
                try:
                    out = client.run("m", {"x": x}, ["y", "double"])
                except RemoteError as e:
                    with lock:
                        if e.code == "UNAVAILABLE":
                            counts["unavailable"] += 1
                        else:
                            wrong.append(f"{e.code}: {e}")
                    continue
                ok = np.array_equal(out["double"], x * 2) and np.allclose(out["y"], reference(x)["y"], rtol=1e-6)
                with lock:
                    counts["ok"] += 1
                    counts["after_kill"] += killed.is_set()
                    if not ok:
                        wrong.append(f"wrong answer for {x.shape}")

    threads = [threading.Thread(target=device, args=(s,)) for s in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(2)
        victim = next(iter(before.values()))
        os.kill(victim["pid"], signal.SIGKILL)
        killed.set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # Serve starts a new replica in its place
            now = replica_infos(model, 20)
            if len(now) == 2 and victim["replica"] not in now:
                break
            time.sleep(1)
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        frontend.stop()
        undeploy(frontend)
    assert not wrong, wrong[:5]
    assert counts["after_kill"] > 0 and victim["replica"] not in now and len(now) == 2, (counts, now)


def test_split_training_with_the_trainer_actor_killed_loses_and_doubles_no_step(cluster, tmp_path):
    """The trainable cloud package's state lives in a detached Ray actor; kill it at step 11
    (Ray restarts it from its checkpoint): the 40 steps end where one process training
    alone ends, each applied once."""
    out, _ = split(tmp_path, "cloud")
    data, _ = digits()
    data = {k: v[:640] for k, v in data.items()}  # 20 steps per epoch
    state = tmp_path / "state"
    frontend = Server(tmp_path / "served", ray=RayBackend(cluster.address, state_dir=state, checkpoint_every=2))
    frontend.start()
    model = frontend.models["cnn-cloud"]
    killed = []

    def kill_the_actor(epoch, step, loss):
        if step == 11 and not killed:
            killed.append(step)
            ray.kill(ray.get_actor(app_name(model), namespace=NAMESPACE), no_restart=False)
    try:
        device = ef.Interpreter(out / "device.efl",
                                delegates=[CloudDelegate(frontend.address, device_id="k")])
        history = training_loop.fit(device, data, epochs=2, batch_size=32, seed=0,
                                    checkpoint_dir=tmp_path / "device-ckpt", checkpoint_every=2,
                                    on_step=kill_the_actor)
        assert killed and [g for g, _ in history] == list(range(1, 41))
        trainer = ray.get_actor(app_name(model), namespace=NAMESPACE)
        assert ray.get(trainer.info.remote(), timeout=60)["updates"] == 40
    finally:
        frontend.stop()  # the trainer checkpoints
        ray.kill(ray.get_actor(app_name(model), namespace=NAMESPACE), no_restart=True)
    assert_as_if_never_stopped(tmp_path, state / "cnn-cloud", "k", device, data)


class Recorder(Metrics):
    def __init__(self):
        self.batches, self.memory = [], {}

    def batch(self, model, size):
        self.batches.append(size)

    def replica_memory(self, replica, nbytes):
        self.memory[replica] = nbytes


def test_replicas_batch_and_report_to_the_front_ends_metrics(cluster, tmp_path):
    """Sixteen devices at once through a front end whose replicas (autoscaled between 1 and 2)
    batch: each answer is its own (numpy), and every request is counted in one batch the
    front end's metrics heard of."""
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    model = build_model()
    model.metadata = {"edgeflow.model_id": b"batched"}
    writer.write(model, model_dir / "batched.efl")
    metrics = Recorder()
    frontend = Server(model_dir, ray=RayBackend(cluster.address, autoscale=(1, 2), replica_cpus=0.5), max_workers=16,
                      metrics=metrics, batching=dict(slo_ms=1000, max_batch=8, max_wait_ms=20))
    xs = [np.random.default_rng(k).standard_normal((1 + k % 3, 4)).astype(np.float32) for k in range(16)]

    def device(x):
        with Client(frontend.address, timeout=60) as client:
            return client.run("batched", {"x": x}, ["y", "double"])
    with frontend:
        try:
            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(device, xs))
        finally:
            undeploy(frontend)
    for x, out in zip(xs, answers):
        np.testing.assert_array_equal(out["double"], x * 2)
        np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-6)
    assert sum(metrics.batches) == 16 and 1 <= len(metrics.memory) <= 2 and min(metrics.memory.values()) > 0
