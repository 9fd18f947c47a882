"""Split training of a digits CNN: the device runs the first conv layer, the server the
rest. Against one process training alone, with the same seed and data order: the same
parameters after every step, in two processes; the labels never reach the server in the
U-shaped mode; a retried round is applied once; and a server killed with SIGKILL and
restarted loses no step and applies none twice."""
import json
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.errors import RemoteError
from edgeflow.format import reader
from edgeflow.splitter import training

from .test_serve_cli import Lines

from sklearn import datasets
from edgeflow.cloud import Client, CloudDelegate, Server

DEVICE_OPS = ("conv1/conv", "relu", "pool1_1")  # the device's forward ops: the first conv layer


def digits():
    d = datasets.load_digits()
    x, y = (d.images / 16).astype(np.float32)[:, None], d.target.astype(np.int64)
    return {"image": x[:1440], "label": y[:1440]}, {"image": x[1440:], "label": y[1440:]}


def build(path):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.conv2d(image, 8, 3, padding="same", activation=ef.nn.relu, name="conv1")
        h = ef.layers.max_pool2d(h, 2, 2, name="pool1")
        h = ef.layers.conv2d(h, 16, 3, padding="same", activation=ef.nn.relu, name="conv2")
        logits = ef.layers.dense(ef.layers.flatten(h), 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, path, signatures={"train": ({"image": image, "label": label}, {"loss": loss}, [step]),
                                 "infer": ({"image": image}, {"logits": logits})})


def split(root, labels):
    build(root / "m.efl")
    model = reader.load(root / "m.efl")
    sub = model.subgraphs[0]
    device = {i for i, op in enumerate(sub.operators) if op.outputs
              and sub.tensors[op.outputs[0]].name in DEVICE_OPS}
    assert len(device) == 3
    out = root / labels
    out.mkdir()
    cut = training.write_pair(model, device, out, model_id=f"cnn-{labels}", labels=labels)
    (root / "served").mkdir(exist_ok=True)
    (root / "served" / f"cnn-{labels}.efl").write_bytes((out / "cloud.efl").read_bytes())
    return out, cut


def accuracy(interp, test):
    logits = interp.get_signature_runner("infer")(image=test["image"])["logits"]
    return float((logits.argmax(1) == test["label"]).mean())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(served, port, state_dir, every):
    proc = subprocess.Popen([sys.executable, "-m", "edgeflow.cli", "serve", "--model-dir", str(served),
                             "--port", str(port), "--state-dir", str(state_dir), "--checkpoint-every",
                             str(every)], stderr=subprocess.PIPE, text=True)
    Lines(proc.stderr).wait_for(r"serving \d+ models? on")
    return proc


def test_two_processes_equal_one_step_by_step(tmp_path):
    out, cut = split(tmp_path, "cloud")
    assert len(cut.rounds) == 1 and cut.names(cut.rounds[0]["uploads"]) == ["label", "pool1_1"]
    data, test = digits()
    port = free_port()
    server = serve(tmp_path / "served", port, tmp_path / "state", 1)
    try:
        local = ef.Interpreter(tmp_path / "m.efl")
        device = ef.Interpreter(out / "device.efl", delegates=[CloudDelegate(f"127.0.0.1:{port}", device_id="d1")])
        runners = local.get_signature_runner("train"), device.get_signature_runner("train")
        cloud_names = json.loads(bytes(reader.load(out / "device.efl").metadata["edgeflow.split"]))["cloud_variables"]
        with Client(f"127.0.0.1:{port}") as client:
            for step in range(45):  # an epoch
                batch = training_loop.batch_at(data, 32, 0, 0, step)
                losses = [float(r(**batch)["loss"]) for r in runners]
                assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-6)
                if step % 11 and step != 44:
                    continue
                want = local.variables()
                assert set(cloud_names) == {n for n in want if not n.startswith("conv1")}
                got = {**device.variables(), **client.run("cnn-cloud", {}, cloud_names)}
                for name in want:  # conv1 and its slots here, the rest on the server
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
        # The same test accuracy: the split's parameters, gathered, against one process's.
        joined = ef.Interpreter(tmp_path / "m.efl")
        joined.get_signature_runner("restore")(**got)
        assert accuracy(joined, test) == accuracy(local, test) > 0.8
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_u_shaped_labels_never_reach_the_server(tmp_path):
    out, cut = split(tmp_path, "device")
    assert len(cut.rounds) == 2
    data, _ = digits()
    local = ef.Interpreter(tmp_path / "m.efl")
    with Server(models={"cnn-device": out / "cloud.efl"}) as server:
        device = ef.Interpreter(out / "device.efl", delegates=[CloudDelegate(server.address, device_id="u")])
        for step in range(3):
            batch = training_loop.batch_at(data, 32, 0, 0, step)
            a = local.get_signature_runner("train")(**batch)["loss"]
            b = device.get_signature_runner("train")(**batch)["loss"]
            assert float(a) == pytest.approx(float(b), rel=1e-6)
        host = server.models["cnn-device"].steps
        assert len(host.received) == 6 and host.updates == 3
        seen = {name for names in host.received for name in names}
        assert "label" not in seen and seen == {"pool1_1", "sum_to_1"}
        # Nothing the server received equals the labels under another name either.
        for names in host.received:
            assert all(n in ("pool1_1", "sum_to_1") for n in names)


def test_a_retried_round_is_applied_once(tmp_path):
    out, cut = split(tmp_path, "cloud")
    data, _ = digits()
    device = ef.Interpreter(out / "device.efl")
    batch = training_loop.batch_at(data, 32, 0, 0, 0)
    feeds = device.run(cut.names(cut.rounds[0]["uploads"]), batch)
    plan = cut.plan_json()[0]
    step = {"device_id": "dup", "step_id": 0, "round": 1, "keep": plan["keep"], "targets": plan["targets"],
            "final": True}
    with Server(models={"cnn-cloud": out / "cloud.efl"}) as server, Client(server.address) as client:
        first = client.run("cnn-cloud", feeds, plan["downloads"], step=step)
        again = client.run("cnn-cloud", feeds, plan["downloads"], step=step)
        host = server.models["cnn-cloud"].steps
        assert host.updates == 1
        for name in first:
            np.testing.assert_array_equal(first[name], again[name])
        with pytest.raises(RemoteError) as info:
            client.run("cnn-cloud", feeds, plan["downloads"], step={**step, "step_id": 5})
        assert info.value.code == "FAILED_PRECONDITION" and info.value.resume_from == 1
        assert host.updates == 1


def test_a_trainable_cloud_package_gives_out_its_variables_not_their_updates(tmp_path):
    out, _ = split(tmp_path, "cloud")
    sub = reader.load(out / "cloud.efl").subgraphs[0]
    kernel = next(t for t in sub.tensors if t.name == "logits/kernel")
    updates = [sub.tensors[op.inputs[1]].name for op in sub.operators if op.opcode in ("assign", "assign_sub")]
    data, _ = digits()
    batch = training_loop.batch_at(data, 32, 0, 0, 0)
    with Server(models={"cnn-cloud": out / "cloud.efl"}) as server, Client(server.address) as client:
        np.testing.assert_array_equal(client.run("cnn-cloud", {}, ["logits/kernel"])["logits/kernel"], kernel.data)
        assert client.run("cnn-cloud", batch, ["pool1_1"])["pool1_1"].shape[0] == 32  # a cut tensor
        for name in updates:  # the optimizer's new values and restore's stay on the server
            with pytest.raises(RemoteError, match=f"fetch '{name}': .*does not give out") as info:
                client.run("cnn-cloud", batch, [name])
            assert info.value.code == "INVALID_ARGUMENT"


def test_a_round_runs_only_the_train_signatures_writes(tmp_path):
    out, cut = split(tmp_path, "cloud")
    sub = reader.load(out / "cloud.efl").subgraphs[0]
    restore = [i for i, op in enumerate(sub.operators)
               if op.opcode == "assign" and sub.tensors[op.inputs[1]].name.startswith("restore/")]
    data, _ = digits()
    device = ef.Interpreter(out / "device.efl")
    feeds = device.run(cut.names(cut.rounds[0]["uploads"]), training_loop.batch_at(data, 32, 0, 0, 0))
    plan = cut.plan_json()[0]
    step = {"device_id": "d", "step_id": 0, "round": 1, "keep": plan["keep"], "targets": restore[:2],
            "final": True}
    with Server(models={"cnn-cloud": out / "cloud.efl"}) as server, Client(server.address) as client:
        with pytest.raises(RemoteError, match=r"step targets \[\d+, \d+\]: .*only its train signature's") as info:
            client.run("cnn-cloud", feeds, plan["downloads"], step=step)
        assert info.value.code == "INVALID_ARGUMENT"
        client.run("cnn-cloud", feeds, plan["downloads"], step={**step, "targets": plan["targets"]})
        assert server.models["cnn-cloud"].steps.updates == 1


@pytest.mark.slow
def test_server_killed_and_restarted_loses_no_step(tmp_path):
    out, _ = split(tmp_path, "cloud")
    data, test = digits()
    data = {k: v[:640] for k, v in data.items()}  # 20 steps per epoch
    port, state = free_port(), tmp_path / "state"
    servers = [serve(tmp_path / "served", port, state, 2)]
    killed = threading.Event()

    def kill_then_restart(epoch, step, loss):
        if step == 11 and not killed.is_set():
            killed.set()
            servers[0].send_signal(signal.SIGKILL)
            servers[0].wait(timeout=30)
            time.sleep(0.5)  # the device's next round finds no server, and retries
            threading.Thread(target=lambda: servers.append(serve(tmp_path / "served", port, state, 2)),
                             daemon=True).start()
    try:
        device = ef.Interpreter(out / "device.efl", delegates=[CloudDelegate(f"127.0.0.1:{port}", device_id="k")])
        history = training_loop.fit(device, data, epochs=2, batch_size=32, seed=0,
                              checkpoint_dir=tmp_path / "device-ckpt", checkpoint_every=2,
                              on_step=kill_then_restart)
        assert killed.is_set() and [g for g, _ in history] == list(range(1, 41))
    finally:
        for s in servers:
            if s.poll() is None:
                s.send_signal(signal.SIGTERM)
                s.wait(timeout=30)
    assert_as_if_never_stopped(tmp_path, state / "cnn-cloud", "k", device, data)


@pytest.mark.slow
def test_u_shaped_training_survives_ten_server_kills(tmp_path):
    """SIGKILL the server 10 times: 5 right after a step's first round (the server loses the
    round the device already has), 5 at a random moment; training ends where it would have."""
    out, cut = split(tmp_path, "device")
    assert len(cut.rounds) == 2
    data, _ = digits()
    data = {k: v[:640] for k, v in data.items()}  # 20 steps per epoch
    port, state = free_port(), tmp_path / "state"
    servers = [serve(tmp_path / "served", port, state, 2)]
    rng = np.random.default_rng(7)
    between = set(rng.choice(np.arange(2, 38), 5, replace=False).tolist())  # steps whose round 1 is lost
    randomly = set(rng.choice(sorted(set(range(2, 38)) - between), 5, replace=False).tolist())
    kills = []

    def kill(reason):
        kills.append(reason)
        servers[-1].send_signal(signal.SIGKILL)
        servers[-1].wait(timeout=30)
        threading.Thread(target=lambda: servers.append(serve(tmp_path / "served", port, state, 2)),
                         daemon=True).start()

    delegate = CloudDelegate(f"127.0.0.1:{port}", device_id="u")
    run = delegate.client.run

    def run_then_kill(*args, step=None, **kwargs):
        reply = run(*args, step=step, **kwargs)
        if step and step["round"] == 1 and step["step_id"] in between:
            between.discard(step["step_id"])
            kill(f"after round 1 of step {step['step_id']}")
        return reply
    delegate.client.run = run_then_kill

    def at_random(epoch, step, loss):
        if step in randomly:
            randomly.discard(step)
            timer = threading.Timer(rng.uniform(0, 0.02), kill, [f"at random after step {step}"])
            timer.start()
            timer.join()  # before the next on_step, so that kills do not overlap
    try:
        device = ef.Interpreter(out / "device.efl", delegates=[delegate])
        history = training_loop.fit(device, data, epochs=2, batch_size=32, seed=0,
                                    checkpoint_dir=tmp_path / "device-ckpt", checkpoint_every=2,
                                    on_step=at_random)
        assert len(kills) == 10 and [g for g, _ in history] == list(range(1, 41))
    finally:
        for s in servers:
            if s.poll() is None:
                s.send_signal(signal.SIGTERM)
                s.wait(timeout=30)
    assert_as_if_never_stopped(tmp_path, state / "cnn-device", "u", device, data)


def assert_as_if_never_stopped(root, state, device_id, device, data):
    """The server applied each of the 40 steps once, and the parameters of both sides are
    those of training in one process without a failure (and so the accuracy)."""
    (path,) = state.glob("*/steps.npz")  # the folder of the one version served
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        cloud = {k[4:]: z[k] for k in z.files if k.startswith("var/")}
    assert meta["updates"] == 40 and meta["finished"] == {device_id: 39}
    local = ef.Interpreter(root / "m.efl")
    training_loop.fit(local, data, epochs=2, batch_size=32, seed=0)
    want = local.variables()
    got = {**device.variables(), **{k: v for k, v in cloud.items() if not k.startswith("conv1")}}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_commands(tmp_path):
    build(tmp_path / "m.efl")
    data, _ = digits()
    np.savez(tmp_path / "d.npz", **{k: v[:320] for k, v in data.items()})
    cli = [sys.executable, "-m", "edgeflow.cli"]
    r = subprocess.run(cli + ["split", str(tmp_path / "m.efl"), "--train", "--labels", "device", "--cut", "pool1_1",
                              "-o", str(tmp_path / "out"), "--model-id", "cnn"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["train"] and plan["labels"] == "device" and len(plan["rounds"]) == 2
    assert all("label" not in rnd["uploads"] for rnd in plan["rounds"])
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "cnn.efl").write_bytes((tmp_path / "out" / "cloud.efl").read_bytes())
    port = free_port()
    server = serve(tmp_path / "served", port, tmp_path / "state", 1)
    try:
        r = subprocess.run(cli + ["train", str(tmp_path / "out" / "device.efl"), "--cloud", f"127.0.0.1:{port}",
                                  "--data", str(tmp_path / "d.npz"), "--epochs", "2", "--device-id", "cli"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        first, last = map(float, r.stdout.split("loss ")[1].split()[0:3:2])
        assert last < first
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize("labels", ["cloud", "device"])
def test_nothing_on_the_device_but_the_data(tmp_path, labels):
    """Cloud-only training: the device sends the batch (and, U-shaped, keeps the loss);
    a round that brings nothing back still makes its call, so every step is applied."""
    build(tmp_path / "m.efl")
    model = reader.load(tmp_path / "m.efl")
    cut = training.write_pair(model, set(), tmp_path, model_id="c", labels=labels)
    assert cut.label_inputs == (["label"] if labels == "device" else [])
    data, _ = digits()
    local = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("train")
    with Server(models={"c": tmp_path / "cloud.efl"}) as server:
        device = ef.Interpreter(tmp_path / "device.efl", delegates=[CloudDelegate(server.address, device_id="c")])
        runner = device.get_signature_runner("train")
        for step in range(3):
            batch = training_loop.batch_at(data, 32, 0, 0, step)
            assert float(runner(**batch)["loss"]) == pytest.approx(float(local(**batch)["loss"]), rel=1e-6)
        host = server.models["c"].steps
        assert host.updates == 3
        assert all("label" not in names for names in host.received) == (labels == "device")


def test_planned_training_splits_take_any_batch_and_keep_device_only_local(tmp_path):
    from edgeflow.splitter.package import split_file
    build(tmp_path / "m.efl")
    data, _ = digits()
    shapes = {"image": (32, 1, 8, 8), "label": (32,)}
    # A slow link: the plan keeps everything (the loss too) on the device: no round trip.
    local = split_file(tmp_path / "m.efl", tmp_path / "local", link="3g", train=True, input_shapes=shapes)
    assert set(local.placement.side.values()) == {"device"}
    assert json.loads((tmp_path / "local" / "plan.json").read_text())["rounds"] == []
    runner = ef.Interpreter(local.paths["device"]).get_signature_runner("train")
    reference = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("train")
    batch = training_loop.batch_at(data, 32, 0, 0, 0)
    assert float(runner(**batch)["loss"]) == float(reference(**batch)["loss"])
    # A forced cut planned at batch 32 still trains a last, partial batch of 9.
    cut = split_file(tmp_path / "m.efl", tmp_path / "cut", cut=["pool1_1"], train=True, input_shapes=shapes)
    with Server(models={cut.model_id: cut.paths["cloud"]}) as server:
        device = ef.Interpreter(cut.paths["device"], delegates=[CloudDelegate(server.address, device_id="b")])
        small = {k: v[:9] for k, v in batch.items()}
        assert float(device.get_signature_runner("train")(**small)["loss"]) == pytest.approx(
            float(ef.Interpreter(tmp_path / "m.efl").get_signature_runner("train")(**small)["loss"]), rel=1e-6)


def test_a_planned_split_sends_the_labels_not_their_one_hot(tmp_path):
    from edgeflow.splitter.package import split_file
    build(tmp_path / "m.efl")
    model = reader.load(tmp_path / "m.efl")
    sub = model.subgraphs[0]
    device = {i for i, op in enumerate(sub.operators) if op.outputs and sub.tensors[op.outputs[0]].name in DEVICE_OPS}
    by_hand = training.TrainingCut(model, device, labels="cloud")
    planned = split_file(tmp_path / "m.efl", tmp_path / "out", cut=["pool1_1"], train=True,
                         input_shapes={"image": (32, 1, 8, 8), "label": (32,)})
    rounds = json.loads(pathlib.Path(planned.paths["plan"]).read_text())["rounds"]
    assert [r["uploads"] for r in rounds] == [by_hand.names(r["uploads"]) for r in by_hand.rounds]
    assert sorted(rounds[0]["uploads"]) == ["label", "pool1_1"]


# -- issue 17, finding 1: after split training, the device gives the jointly trained model --
def build_mlp(path, residual=False):
    """x -> dense -> relu "hidden" [-> hidden + relu(dense "block"(hidden)), a residual
    block] -> dense logits; softmax cross-entropy, Adam."""
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 64], name="x")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.nn.relu(ef.layers.dense(x, 32, name="dense"), name="hidden")
        if residual:
            h = ef.add(h, ef.nn.relu(ef.layers.dense(h, 32, name="block")), name="r")
        logits = ef.layers.dense(h, 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, path, signatures={"train": ({"x": x, "label": label}, {"loss": loss}, [step]),
                                 "infer": ({"x": x}, {"logits": logits})})


def mlp_digits():
    train, test = digits()
    return ({"x": train["image"].reshape(-1, 64), "label": train["label"]},
            {"x": test["image"].reshape(-1, 64), "label": test["label"]})


def test_after_split_training_infer_save_and_export_give_the_jointly_trained_model(tmp_path):
    """The issue's MLP (`split --train --labels cloud --cut hidden`): trained through the
    device package, its `infer`, `save` and `export` equal the model trained locally on
    the same batches (on main, `infer` ran with the cloud part's untrained weights)."""
    from edgeflow.splitter.package import split_file
    build_mlp(tmp_path / "m.efl")
    data, test = mlp_digits()
    result = split_file(tmp_path / "m.efl", tmp_path / "out", cut=["hidden"], train=True, labels="cloud",
                        input_shapes={"x": (32, 64), "label": (32,)})
    local = ef.Interpreter(tmp_path / "m.efl")
    training_loop.fit(local, data, epochs=2, batch_size=32, seed=0)
    want = local.get_signature_runner("infer")(x=test["x"])["logits"]
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        cloud = CloudDelegate(server.address, device_id="joint")
        device = ef.Interpreter(result.paths["device"], delegates=[cloud])
        untrained = device.get_signature_runner("infer")(x=test["x"])["logits"]  # pulls: the initial values
        training_loop.fit(device, data, epochs=2, batch_size=32, seed=0)
        infer = device.get_signature_runner("infer")
        got = infer(x=test["x"])["logits"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert not np.allclose(untrained, want, atol=1e-2)
        assert cloud.cloud_variables and all(n.startswith("logits") for n in cloud.cloud_variables)
        pulls = cloud.pulls
        infer(x=test["x"])  # up to date: no second pull
        assert cloud.pulls == pulls
        saved = device.get_signature_runner("save")()
        for name, value in local.get_signature_runner("save")().items():
            np.testing.assert_allclose(saved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        device.export(tmp_path / "trained.efl")
    exported = ef.Interpreter(tmp_path / "trained.efl")  # no server: the whole trained model
    assert sorted(exported.get_signature_list()) == sorted(local.get_signature_list())
    np.testing.assert_allclose(exported.get_signature_runner("infer")(x=test["x"])["logits"], want,
                               rtol=1e-5, atol=1e-5)
    batch = training_loop.batch_at(data, 32, 0, 5, 0)  # and it trains on, as the local model does
    np.testing.assert_allclose(exported.get_signature_runner("train")(**batch)["loss"],
                               local.get_signature_runner("train")(**batch)["loss"], rtol=1e-5)
    accuracy = float((got.argmax(1) == test["label"]).mean())
    assert accuracy == float((want.argmax(1) == test["label"]).mean()) > 0.8


def test_a_device_that_trained_refuses_stale_weights_when_the_server_is_gone(tmp_path):
    from edgeflow.splitter.package import split_file
    build_mlp(tmp_path / "m.efl")
    data, test = mlp_digits()
    result = split_file(tmp_path / "m.efl", tmp_path / "out", cut=["hidden"], train=True,
                        input_shapes={"x": (32, 64), "label": (32,)})
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        address = server.address
        device = ef.Interpreter(result.paths["device"], delegates=[CloudDelegate(address, device_id="gone")])
        device.get_signature_runner("train")(**training_loop.batch_at(data, 32, 0, 0, 0))
    with pytest.raises(RemoteError, match="holds the trained values"):
        device.get_signature_runner("infer")(x=test["x"])
    # A device that never trained here runs on its own values while the server is away.
    fresh = ef.Interpreter(result.paths["device"], delegates=[CloudDelegate(address, device_id="new")])
    want = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")(x=test["x"])["logits"]
    np.testing.assert_array_equal(fresh.get_signature_runner("infer")(x=test["x"])["logits"], want)


@pytest.mark.slow
def test_the_issues_commands_give_the_locally_trained_accuracy(tmp_path):
    """`edgeflow split --train --labels cloud --cut hidden`, `edgeflow serve`, `edgeflow
    train --cloud ... -o`, then `infer` on the exported file: the locally trained model's
    logits and test accuracy (main wrote the cloud part's untrained weights: 0.56 against
    0.83)."""
    build_mlp(tmp_path / "m.efl")
    data, test = mlp_digits()
    np.savez(tmp_path / "d.npz", **data)
    cli = [sys.executable, "-m", "edgeflow.cli"]
    r = subprocess.run(cli + ["split", str(tmp_path / "m.efl"), "--train", "--labels", "cloud", "--cut", "hidden",
                              "-o", str(tmp_path / "out"), "--model-id", "mlp"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "mlp.efl").write_bytes((tmp_path / "out" / "cloud.efl").read_bytes())
    local = ef.Interpreter(tmp_path / "m.efl")
    training_loop.fit(local, data, epochs=2, batch_size=32, seed=0)
    want = local.get_signature_runner("infer")(x=test["x"])["logits"]
    port = free_port()
    server = serve(tmp_path / "served", port, tmp_path / "state", 50)
    try:
        r = subprocess.run(cli + ["train", str(tmp_path / "out" / "device.efl"), "--cloud", f"127.0.0.1:{port}",
                                  "--data", str(tmp_path / "d.npz"), "--epochs", "2", "--device-id", "cli",
                                  "-o", str(tmp_path / "trained.efl")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # The device's part was trained in that process: the exported file has both parts.
    exported = ef.Interpreter(tmp_path / "trained.efl").get_signature_runner("infer")(x=test["x"])["logits"]
    np.testing.assert_allclose(exported, want, rtol=1e-5, atol=1e-5)
    assert float((exported.argmax(1) == test["label"]).mean()) == float((want.argmax(1) == test["label"]).mean())


# -- issue 17, finding 5: an exporter's deduplicated biases split-train ---------------------
def test_an_onnx_model_with_deduplicated_biases_split_trains_as_it_trains_locally(tmp_path):
    """fc1 and fc2 read one deduplicated zero bias (as torch's exporters write them): with
    the converter's default (a variable per reading), a cut between them split-trains equal
    to local training (main: "variables ... are read by forward ops on both sides")."""
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.splitter.package import split_file
    from conversion.test_trainable import deduplicated_mlp  # tests/ is on sys.path (its conftest)
    onnx_converter.convert(deduplicated_mlp(), tmp_path / "m.efl", trainable=True, optimizer="adam:0.01")
    data, test = mlp_digits()
    data = {"x": data["x"], "labels": data["label"]}
    result = split_file(tmp_path / "m.efl", tmp_path / "out", cut=["r1"], train=True,
                        input_shapes={"x": (32, 64), "labels": (32,)})
    local = ef.Interpreter(tmp_path / "m.efl")
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        device = ef.Interpreter(result.paths["device"], delegates=[CloudDelegate(server.address, device_id="dd")])
        runners = local.get_signature_runner("train"), device.get_signature_runner("train")
        for step in range(10):
            batch = training_loop.batch_at(data, 32, 0, 0, step)
            losses = [float(r(**batch)["loss"]) for r in runners]
            assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        got = device.get_signature_runner("infer")(x=test["x"])["logits"]
    np.testing.assert_allclose(got, local.get_signature_runner("infer")(x=test["x"])["logits"], rtol=1e-5, atol=1e-5)


def test_a_shared_variable_is_a_constraint_of_the_cut(tmp_path):
    """Tied (--tie-shared-weights), fc1 and fc2 read one variable: the planner keeps them on
    one side; a forced cut between them says which variable, which ops, and what to do."""
    from edgeflow.converters import onnx as onnx_converter
    from edgeflow.errors import PlacementError
    from edgeflow.splitter.package import split_file
    from conversion.test_trainable import deduplicated_mlp  # tests/ is on sys.path (its conftest)
    onnx_converter.convert(deduplicated_mlp(), tmp_path / "m.efl", trainable=True, tie_shared=True)
    shapes = {"x": (32, 64), "labels": (32,)}
    with pytest.raises(PlacementError, match=r"splits variable 'zero_bias'.*--cut h2: all on the device.*--cut h1/matmul: all on the cloud.*leave out --cut"):
        split_file(tmp_path / "m.efl", tmp_path / "forced", cut=["r1"], train=True, input_shapes=shapes)
    for link in ("3g", "4g", "wifi"):
        planned = split_file(tmp_path / "m.efl", tmp_path / link.replace("/", "_"), link=link, train=True,
                             input_shapes=shapes, server_speed=50.0)
        sides = {name: side for name, side in planned.placement.side.items() if name in ("h1", "h2")}
        assert len(sides) == 2 and len(set(sides.values())) == 1, planned.placement.side


def test_a_cut_tensor_read_twice_in_the_cloud_downloads_one_gradient(tmp_path):
    """A residual block's input, sent up, read by the block's dense and by its skip add:
    the device gets its gradient once (main: the two parts, summed on the device, doubled
    the download), and training stays equal to local training."""
    build_mlp(tmp_path / "m.efl", residual=True)
    model = reader.load(tmp_path / "m.efl")
    sub = model.subgraphs[0]
    names = {sub.tensors[op.outputs[0]].name: i for i, op in enumerate(sub.operators) if op.outputs}
    device_ops = {i for n, i in names.items() if n.startswith("dense")} | {names["hidden"]}
    (tmp_path / "out").mkdir()
    cut = training.write_pair(model, device_ops, tmp_path / "out", model_id="res", labels="cloud")
    (round_,) = cut.plan_json()
    assert sorted(round_["uploads"]) == ["hidden", "label"]
    train_sig = next(sg for sg in model.signatures if sg.key == "train")
    grads = [t for t in round_["downloads"] if t != sub.tensors[train_sig.outputs["loss"]].name]
    assert len(grads) == 1, round_["downloads"]
    h_shape = sub.tensors[names["hidden"]].shape
    data, _ = mlp_digits()
    local = ef.Interpreter(tmp_path / "m.efl")
    with Server(models={"res": str(tmp_path / "out" / "cloud.efl")}) as server:
        with Client(server.address) as probe:
            device = ef.Interpreter(tmp_path / "out" / "device.efl",
                                    delegates=[CloudDelegate(probe, device_id="res-1")])
            runners = local.get_signature_runner("train"), device.get_signature_runner("train")
            for step in range(10):
                batch = training_loop.batch_at(data, 32, 0, 0, step)
                before = probe.link.bytes_received
                losses = [float(r(**batch)["loss"]) for r in runners]
                assert losses[1] == pytest.approx(losses[0], rel=1e-5)
                # down: one float32 gradient of h (batch x 32) and the loss
                assert probe.link.bytes_received - before == 32 * int(h_shape[-1]) * 4 + 4


def test_split_training_reads_an_ef_data_dataset(tmp_path):
    """fit on the device package (a CloudDelegate) with a shuffled, batched, prefetched
    ef.data.Dataset: the jointly trained model equals one trained locally on numpy's
    permutation of the same data."""
    from edgeflow.splitter.package import split_file
    build_mlp(tmp_path / "m.efl")
    data, _ = mlp_digits()
    result = split_file(tmp_path / "m.efl", tmp_path / "out", cut=["hidden"], train=True, labels="cloud",
                        input_shapes={"x": (32, 64), "label": (32,)})
    local = ef.Interpreter(tmp_path / "m.efl")
    run = local.get_signature_runner("train")
    order = np.random.default_rng([0, 0]).permutation(1440)
    for start in range(0, 1440, 32):
        run(**{name: values[order[start:start + 32]] for name, values in data.items()})
    dataset = ef.data.Dataset.from_tensor_slices(data).shuffle(1440, seed=0).batch(32).prefetch(2)
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        device = ef.Interpreter(result.paths["device"], delegates=[CloudDelegate(server.address, device_id="data")])
        history = training_loop.fit(device, dataset, epochs=1)
        saved = device.get_signature_runner("save")()
    assert [g for g, _ in history] == list(range(1, 46))
    for name, value in local.get_signature_runner("save")().items():
        np.testing.assert_allclose(saved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
