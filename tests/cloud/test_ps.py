"""The parameter server (edgeflow/cloud/ps/): updates against numpy, exactly-once pushes,
sync aggregation and staleness, FedAvg averages, checkpoints and resumption, typed errors."""
import contextlib
import threading

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.errors import (EdgeflowError, FormatError, GraphError, InvalidInputError, PlacementError,
                             RemoteError)

import grpc

from edgeflow.cloud import ps
from edgeflow.cloud.ps import train_async
from edgeflow.cloud.server import Server
from edgeflow.format import writer

W0 = np.array([[0.5, -1.0], [0.25, 0.0], [-0.5, 1.5]], np.float32)
B0 = np.array([0.1, -0.2], np.float32)
LR = 0.1


def build_linear(optimizer=None, device_scale=False, lr=LR, w0=W0):
    """y = x @ w + b (w, b in the cloud), times a device-side `scale` if asked; MSE loss."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        y = ef.placeholder(ef.float32, [None, 2], name="y")
        with ef.device("cloud"):
            w = ef.Variable(w0, name="w")
            b = ef.Variable(B0, name="b")
            pred = ef.matmul(x, w) + b
        if device_scale:
            pred = pred * ef.Variable(np.ones(2, np.float32), name="scale")
        loss = ef.losses.mean_squared_error(y, pred)
        step = (optimizer or ef.train.Adam(lr)).minimize(loss)
    return ef.to_model(g, {"infer": ({"x": x}, {"pred": pred}),
                           "train": ({"x": x, "y": y}, {"loss": loss}, [step])})


def package(model):
    return bytes(writer.to_bytes(model))


@pytest.fixture(scope="module")
def adam_package():
    return package(build_linear())


def adam_step(w, g, m, v, t, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
    """One step of torch.optim.Adam in numpy (the independent reference)."""
    t = t + 1
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), m, v, t


@contextlib.contextmanager
def serving(service, **client_options):
    with Server(parameter_server=service) as server:
        with ps.ParameterClient(f"127.0.0.1:{server.port}", timeout=30, **client_options) as client:
            yield client


def grads(scale=1.0):
    return {"w": np.full((3, 2), 0.5 * scale, np.float32) + np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
            "b": np.array([1.0, -2.0], np.float32) * scale}


# -- the package's roles ---------------------------------------------------------------------

def test_roles_read_placement_gradients_and_slots(adam_package):
    roles = ps.TrainingRoles(ef.Interpreter(package(build_linear(device_scale=True))).model)
    assert roles.served() == ["w", "b"]  # the assigns of cloud variables carry placement "cloud"
    assert roles.roles["w"].placement == "cloud" and roles.roles["scale"].placement == ""
    assert roles.served("all") == ["w", "b", "scale"]
    assert roles.slots_of(["w"]) == ["w/Adam/m", "w/Adam/step", "w/Adam/v"]
    assert set(roles.device_targets(["w", "b"])) == set(roles.roles["scale"].assigns)
    interp = ef.Interpreter(adam_package)
    roles = ps.TrainingRoles(interp.model)
    roles.set_variables(interp, {"w": W0 * 2})  # through the restore assigns, only those named
    assert np.array_equal(interp.variables()["w"], W0 * 2) and np.array_equal(interp.variables()["b"], B0)


def test_packages_a_server_cannot_train_are_refused():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        w = ef.Variable(W0, name="w")  # not in the cloud
        loss = ef.reduce_mean(ef.matmul(x, w) * ef.matmul(x, w))
        step = ef.train.GradientDescent(0.1).minimize(loss)
    local = package(ef.to_model(g, {"train": ({"x": x}, {"loss": loss}, [step])}))
    with pytest.raises(PlacementError, match="ef.device"):
        ps.ParameterService({"m": local})
    ps.ParameterService({"m": local}, variables="all")  # every trainable variable, by choice
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        lr = ef.placeholder(ef.float32, [], name="lr")
        with ef.device("cloud"):
            w = ef.Variable(W0, name="w")
        loss = ef.reduce_mean(ef.matmul(x, w) * ef.matmul(x, w))
        step = ef.train.GradientDescent(lr).minimize(loss)
    fed_lr = package(ef.to_model(g, {"train": ({"x": x, "lr": lr}, {"loss": loss}, [step])}))
    with pytest.raises(GraphError, match="'lr'"):
        ps.ParameterService({"m": fed_lr})
    with pytest.raises(FormatError, match="'train' signature"):
        ps.ParameterService({"m": package(ef.to_model(g, {"infer": ({"x": x}, {"loss": loss})}))})
    for bad in ({"mode": "gossip"}, {"replicas": 0}, {"checkpoint_every": 0}, {"variables": "some"},
                {"max_staleness": -1}):
        with pytest.raises(InvalidInputError):
            ps.ParameterService({"m": local}, **bad)


# -- async: each push applied once, at once ----------------------------------------------------

def test_duplicate_push_is_applied_once(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="async")
    with serving(service) as client:
        g = grads()
        first = client.push("m", "phone", 0, g, 8, 0, "async")
        again = client.push("m", "phone", 0, grads(scale=3.0), 8, 0, "async")  # same device and step id
        assert (first.result, first.duplicate, first.version) == ("applied", False, 1)
        assert (again.result, again.duplicate, again.version, again.last_step_id) == ("applied", True, 1, 0)
        older = client.push("m", "phone", 0, g, 8, 0, "async")
        assert older.duplicate
        status = client.status("m")
        assert status["updates_applied"] == 1 and status["version"] == 1 and status["duplicates"] == 2
        assert status["devices"]["phone"] == {"last_step_id": 0, "applied": 1, "last_result": "applied"}
        values = client.pull("m", names=["w", "b", "w/Adam/m", "w/Adam/v", "w/Adam/step"]).values
    for name, start in (("w", W0), ("b", B0)):
        want, m, v, t = adam_step(start.astype(np.float64), g[name], 0.0, 0.0, 0)
        np.testing.assert_allclose(values[name], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(values["w/Adam/m"], 0.1 * g["w"], rtol=1e-6)
    np.testing.assert_allclose(values["w/Adam/v"], 0.001 * g["w"] ** 2, rtol=2e-5)  # float32 1 - 0.999
    assert values["w/Adam/step"] == 1.0


def test_async_applies_in_order_and_reports_staleness(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="async", max_staleness=1)
    with serving(service) as client:
        gap = client.push("m", "a", 1, grads(), 4, 0, "async")  # step 0 never came
        assert (gap.result, gap.last_step_id) == ("dropped", -1) and "resume from step 0" in gap.reason
        assert client.push("m", "a", 0, grads(), 4, 0, "async").result == "applied"
        assert client.push("m", "b", 0, grads(), 4, 0, "async").staleness == 1
        stale = client.push("m", "c", 0, grads(), 4, 0, "async")  # 2 versions behind
        assert stale.result == "dropped" and "staleness 2 > 1" in stale.reason
        assert client.push("m", "c", 1, grads(), 4, 2, "async").result == "applied"
        status = client.status("m")
        assert status["updates_applied"] == 3 and status["dropped"] == 2
        assert {d: s["last_step_id"] for d, s in status["devices"].items()} == {"a": 0, "b": 0, "c": 1}


def test_a_lost_reply_is_retried_with_the_same_step_id(adam_package):
    class LosesFirstReply(ps.ParameterService):
        lost = 0

        def Push(self, requests, context):
            reply = super().Push(requests, context)
            if not self.lost:  # the update ran, but the reply never reaches the device
                self.lost += 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (injected)")
            return reply

    service = LosesFirstReply({"m": adam_package}, mode="async")
    with serving(service, backoff=(0.01, 0.05)) as client:
        pushed = client.push("m", "phone", 0, grads(), 8, 0, "async")
        assert (pushed.result, pushed.duplicate) == ("applied", True) and client.retries == 1
        assert client.status("m")["updates_applied"] == 1
        w = client.pull("m").values["w"]
    np.testing.assert_allclose(w, adam_step(W0.astype(np.float64), grads()["w"], 0.0, 0.0, 0)[0], rtol=1e-6)


def test_an_unreachable_server_raises_after_the_retries():
    with ps.ParameterClient("127.0.0.1:1", timeout=1, retry_for=0.2, backoff=(0.05, 0.1)) as client:
        with pytest.raises(RemoteError) as e:
            client.pull("m")
    assert e.value.code == "UNAVAILABLE" and client.retries >= 1


# -- sync: N replicas per step, weighted, stale dropped ----------------------------------------

def test_sync_averages_replicas_by_sample_count_and_drops_stale(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="sync", replicas=2)
    with serving(service) as client:
        first = client.push("m", "a", 0, grads(1.0), 1, 0, "sync")
        assert (first.result, first.version) == ("pending", 0)
        assert client.status("m")["pending_devices"] == ["a"]
        second = client.push("m", "b", 0, grads(-2.0), 3, 0, "sync")
        assert (second.result, second.version) == ("applied", 1)
        retry = client.push("m", "a", 0, grads(1.0), 1, 0, "sync")  # learns the step was applied
        assert (retry.result, retry.duplicate, retry.version) == ("applied", True, 1)
        late = client.push("m", "c", 0, grads(5.0), 2, 0, "sync")
        assert late.result == "dropped" and "stale" in late.reason and late.last_step_id == 0
        ahead = client.push("m", "c", 7, grads(5.0), 2, 7, "sync")
        assert ahead.result == "dropped" and "ahead" in ahead.reason and ahead.last_step_id == 0
        status = client.status("m")
        assert (status["updates_applied"], status["version"], status["dropped"]) == (1, 1, 2)
        assert {d: s["applied"] for d, s in status["devices"].items()} == {"a": 1, "b": 1, "c": 0}
        values = client.pull("m").values
    mean = {n: (1 * grads(1.0)[n] + 3 * grads(-2.0)[n]) / 4 for n in ("w", "b")}
    for name, start in (("w", W0), ("b", B0)):
        np.testing.assert_allclose(values[name], adam_step(start.astype(np.float64), mean[name], 0, 0, 0)[0],
                                   rtol=1e-6, atol=1e-7)


def test_pull_waits_for_a_new_version(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="sync", replicas=1)
    with serving(service) as client:
        now = client.pull("m", device_id="a")
        assert (now.version, now.last_step_id, now.mode, now.replicas, sorted(now.values)) == \
            (0, -1, "sync", 1, ["b", "w"])
        idle = client.pull("m", wait_while=0, incarnation=now.incarnation, wait=0.05)
        assert not idle.changed and idle.values == {}
        restarted = client.pull("m", wait_while=0, incarnation="an older one", wait=5)
        assert restarted.changed and sorted(restarted.values) == ["b", "w"]
        out = {}
        waiter = threading.Thread(target=lambda: out.setdefault("p", client.pull(
            "m", device_id="a", wait_while=0, incarnation=now.incarnation, wait=25)))
        waiter.start()
        client.push("m", "a", 0, grads(), 2, 0, "sync")
        waiter.join()
        assert out["p"].changed and out["p"].version == 1 and out["p"].last_step_id == 0


# -- FedAvg rounds ---------------------------------------------------------------------------

def test_fedavg_round_is_the_sample_weighted_average(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="fedavg", replicas=2)
    with serving(service) as client:
        a = {"w": W0 + 1, "b": B0 - 1}
        b = {"w": W0 * 3, "b": B0 * 2}
        assert client.push_model("m", "a", 0, a, 100).result == "pending"
        assert client.push_model("m", "a", 0, a, 100).duplicate
        done = client.push_model("m", "b", 0, b, 300)
        assert (done.result, done.version) == ("applied", 1)
        assert client.push_model("m", "c", 0, b, 300).result == "dropped"  # round 0 is over
        values = client.pull("m").values
        assert client.status("m")["variables"].keys() == {"w", "b"}  # slots stay on the devices
        with pytest.raises(RemoteError) as e:
            client.push("m", "a", 1, grads(), 1, 1, "fedavg")
        assert e.value.code == "FAILED_PRECONDITION" and "PushModel" in e.value.details
    for name in ("w", "b"):
        want = (100 * a[name].astype(np.float64) + 300 * b[name]) / 400
        np.testing.assert_allclose(values[name], want, rtol=1e-6)


# -- checkpoints --------------------------------------------------------------------------------

def test_restart_resumes_pending_steps_and_recognises_retries(adam_package, tmp_path):
    options = dict(mode="sync", replicas=2, checkpoint_dir=tmp_path, checkpoint_every=1)
    with serving(ps.ParameterService({"m": adam_package}, **options)) as client:
        assert client.push("m", "a", 0, grads(1.0), 2, 0, "sync").result == "pending"
    # Server.stop checkpointed, the pending push included
    with serving(ps.ParameterService({"m": adam_package}, **options)) as client:
        status = client.status("m")
        assert (status["version"], status["pending_devices"], status["checkpoint_version"]) == (0, ["a"], 0)
        assert client.push("m", "a", 0, grads(9.0), 2, 0, "sync").duplicate  # a retry after the restart
        assert client.push("m", "b", 0, grads(3.0), 2, 0, "sync").result == "applied"
        values = client.pull("m").values
    restarted = ps.ParameterService({"m": adam_package}, **options)
    assert restarted.stats("m")["version"] == 1 and restarted.stats("m")["updates_applied"] == 1
    with serving(restarted) as client:
        assert client.push("m", "b", 0, grads(3.0), 2, 0, "sync").duplicate
        assert client.status("m")["updates_applied"] == 1
        again = client.pull("m").values
    mean = {n: (grads(1.0)[n] + grads(3.0)[n]) / 2 for n in ("w", "b")}
    for name, start in (("w", W0), ("b", B0)):
        want = adam_step(start.astype(np.float64), mean[name], 0, 0, 0)[0]
        np.testing.assert_allclose(values[name], want, rtol=1e-6, atol=1e-7)
        assert np.array_equal(again[name], values[name])


def test_bad_checkpoints_are_refused(adam_package, tmp_path):
    options = dict(mode="async", checkpoint_dir=tmp_path, checkpoint_every=1)
    with serving(ps.ParameterService({"m": adam_package}, **options)) as client:
        client.push("m", "a", 0, grads(), 1, 0, "async")
    (path,) = tmp_path.glob("*.ps.npz")
    good = path.read_bytes()
    with pytest.raises(FormatError, match="package sha256"):  # another package, same id
        ps.ParameterService({"m": package(build_linear(lr=0.5))}, **options)
    with pytest.raises(EdgeflowError, match="async"):
        ps.ParameterService({"m": adam_package}, **{**options, "mode": "sync"})
    for bad in (good[:len(good) // 2], good[:200] + bytes([good[200] ^ 0xFF]) + good[201:]):
        path.write_bytes(bad)
        with pytest.raises(FormatError, match="move it away"):
            ps.ParameterService({"m": adam_package}, **options)
    path.write_bytes(good)
    assert ps.ParameterService({"m": adam_package}, **options).stats("m")["version"] == 1


# -- requests the server refuses, and keeps serving -----------------------------------------

def test_bad_requests_get_typed_statuses(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="async")
    sha = ps.package_sha256(adam_package)
    with serving(service) as client:
        def code(call):
            with pytest.raises(RemoteError) as e:
                call()
            return e.value.code, e.value.details
        assert code(lambda: client.pull("nope"))[0] == "NOT_FOUND"
        assert code(lambda: client.status("nope"))[0] == "NOT_FOUND"
        assert code(lambda: client.pull("m", sha256="0" * 64))[0] == "FAILED_PRECONDITION"
        assert client.pull("m", sha256=sha).version == 0
        assert code(lambda: client.pull("m", names=["w/Adam/x"]))[0] == "INVALID_ARGUMENT"
        assert code(lambda: client.push("m", "a", 0, grads(), 1, 0, "sync")) == (
            "FAILED_PRECONDITION", "model 'm' trains in async mode; the device pushed in sync mode")
        assert code(lambda: client.push_model("m", "a", 0, grads(), 1))[0] == "FAILED_PRECONDITION"
        status, details = code(lambda: client.push("m", "a", 0, {"w": grads()["w"]}, 1, 0, "async"))
        assert status == "INVALID_ARGUMENT" and "missing ['b']" in details
        status, details = code(lambda: client.push("m", "a", 0, {**grads(), "w": np.zeros((2, 3), np.float32)},
                                                   1, 0, "async"))
        assert status == "INVALID_ARGUMENT" and "expected float32[3, 2]" in details
        assert code(lambda: client.push("m", "a", 0, {**grads(), "b": np.array([np.nan, 1], np.float32)},
                                        1, 0, "async"))[0] == "INVALID_ARGUMENT"
        assert code(lambda: client.push("m", "", 0, grads(), 1, 0, "async"))[0] == "INVALID_ARGUMENT"
        assert code(lambda: client.push("m", "a", 0, grads(), 0, 0, "async"))[0] == "INVALID_ARGUMENT"
        assert code(lambda: client.push("m", "a", -1, grads(), 1, 0, "async"))[0] == "INVALID_ARGUMENT"
        status = client.status("m")
        assert status["updates_applied"] == 0 and status["devices"] == {}  # nothing ran
        assert client.health(ps.SERVICE) == "SERVING"
        assert client.push("m", "a", 0, grads(), 1, 0, "async").result == "applied"  # still serving


# -- the device loop ------------------------------------------------------------------------

def test_device_variables_train_locally_and_all_match_one_process():
    """Cloud variables on the server, a device-side variable on the device: async training
    from one device equals training the same package in one process, step for step."""
    model = package(build_linear(device_scale=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    data = {"x": x, "y": (x @ rng.normal(size=(3, 2)) + 0.3).astype(np.float32)}
    local = ef.Interpreter(model)
    training_loop.fit(local, data, epochs=3, batch_size=8, seed=4)
    device = ef.Interpreter(model)
    with serving(ps.ParameterService({"m": model}, mode="async")) as client:
        history = train_async(device, data, client, "m", "phone", epochs=3, batch_size=8, seed=4)
        served = client.pull("m", names=list(client.status("m")["variables"])).values
    assert [r["step"] for r in history] == list(range(15)) and {r["result"] for r in history} == {"applied"}
    want = local.variables()
    for name, value in served.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(device.variables()["scale"], want["scale"], rtol=1e-6)
    assert not np.array_equal(want["scale"], np.ones(2))


def test_compressed_pushes_and_pulls(adam_package):
    service = ps.ParameterService({"m": adam_package}, mode="fedavg", replicas=1)
    with serving(service) as client:
        values = {"w": W0 * 3, "b": B0 * 2}
        assert client.push_model("m", "a", 0, values, 10, compression="fp16").result == "applied"
        assert client.bytes_pushed == (6 + 2) * 2  # halves on the wire
        pulled = client.pull("m", compression="int8").values
        assert client.bytes_pulled == 6 + 2
    for name, value in values.items():
        np.testing.assert_allclose(pulled[name], value, atol=np.abs(value).max() / 127)


def test_importing_the_interpreter_does_not_import_grpc():
    import subprocess
    import sys
    code = "import sys, edgeflow, edgeflow.interp, edgeflow.cloud; print('grpc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def _grpc_server(service, port=0):
    """The service alone on a grpc.Server: stopping it checkpoints nothing, as a crash."""
    from concurrent import futures
    from edgeflow.cloud import wire
    server = grpc.server(futures.ThreadPoolExecutor(4), options=wire.CHANNEL_OPTIONS)
    service.add_to_server(server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


def test_async_device_retrains_the_steps_a_crash_lost(tmp_path):
    model = package(build_linear())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    data = {"x": x, "y": (x @ rng.normal(size=(3, 2))).astype(np.float32)}
    options = dict(mode="async", checkpoint_dir=tmp_path, checkpoint_every=5)
    server, port = _grpc_server(ps.ParameterService({"m": model}, **options))
    stopped, crashed = threading.Event(), threading.Event()

    def on_step(record):
        if record["step"] == 7 and not stopped.is_set():  # steps 5, 6, 7 are not checkpointed
            stopped.set()
            assert crashed.wait(30)
    out = {}
    with ps.ParameterClient(f"127.0.0.1:{port}", timeout=10, retry_for=60, backoff=(0.01, 0.1)) as client:
        device = threading.Thread(target=lambda: out.setdefault("history", train_async(
            model, data, client, "m", "phone", epochs=3, batch_size=8, seed=4, on_step=on_step)))
        device.start()
        assert stopped.wait(30)
        server.stop(None)
        crashed.set()  # the device's calls fail, and are retried until the new server is up
        server, _ = _grpc_server(ps.ParameterService({"m": model}, **options), port)
        device.join(60)
        status = client.status("m")
        served = client.pull("m", names=list(status["variables"])).values
    server.stop(None)
    assert [r["step"] for r in out["history"]] == list(range(8)) + list(range(5, 15))
    assert (status["updates_applied"], status["devices"]["phone"]["applied"]) == (15, 15)
    local = ef.Interpreter(model)
    training_loop.fit(local, data, epochs=3, batch_size=8, seed=4)
    for name, value in local.variables().items():
        np.testing.assert_allclose(served[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
