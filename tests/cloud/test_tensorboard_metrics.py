"""A server's measurements as TensorBoard events (cloud/tensorboard.py, `edgeflow serve
--logdir`), read back with TensorBoard's own reader and checked against what the test
sent; Prometheus on at the same time; split training logged on both sides."""
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.cloud import Client, CloudDelegate, Server
from edgeflow.cloud.metrics import Combined, PrometheusMetrics
from edgeflow.cloud.tensorboard import TensorBoardMetrics
from edgeflow.errors import RemoteError
from edgeflow.format import reader
from edgeflow.splitter import training
from edgeflow.tensorboard import TensorBoardLogger

from .test_serve_cli import Lines, edgeflow


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_requests_batches_and_bytes_are_events_and_prometheus_counts_them_too(model_dir, tmp_path):
    board, prom = TensorBoardMetrics(tmp_path / "tb"), PrometheusMetrics()
    sent, received, lock = [], [], threading.Lock()

    def device(k):
        with Client(address, timeout=30) as client:
            for i in range(3):
                x = np.full((1 + (k + i) % 3, 4), k, np.float32)
                out = client.run("m", {"x": x}, ["y"])
                with lock:
                    sent.append(x.nbytes)
                    received.append(out["y"].nbytes)

    started = time.perf_counter()
    with Server(model_dir, metrics=Combined(prom, board), max_workers=8,
                batching=dict(slo_ms=1000, max_batch=64, max_wait_ms=20)) as server:
        address = f"127.0.0.1:{server.port}"
        threads = [threading.Thread(target=device, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with Client(address, timeout=30) as client:
            with pytest.raises(RemoteError):
                client.run("m", {"q": np.ones(2, np.float32)}, ["y"])  # no feed 'q': refused
            client.ping()
    elapsed = time.perf_counter() - started
    board.close()
    acc = events(tmp_path / "tb")

    seconds = scalars(acc, "requests/m/Run/seconds")
    assert sorted(seconds) == list(range(1, 20))  # 18 answered, 1 refused
    assert all(0 < s <= elapsed for s in seconds.values())
    assert list(scalars(acc, "requests/m/Run/failed").values()) == [1]
    assert len(scalars(acc, "requests/server/Ping/seconds")) == 1
    bytes_in = scalars(acc, "bytes/m/received")
    assert bytes_in[max(bytes_in)] == sum(sent) + 8  # the refused request's 8 bytes were received
    bytes_out = scalars(acc, "bytes/m/sent")
    assert bytes_out[max(bytes_out)] == sum(received)
    batches = scalars(acc, "batch_size/m")
    assert sum(batches.values()) == 18 and sorted(batches) == list(range(1, len(batches) + 1))
    assert scalars(acc, "queue_depth/m")
    # Prometheus got the same measurements
    text = prom.text()
    assert 'edgeflow_requests_total{method="Run",model="m",status="OK"} 18.0' in text
    assert f'edgeflow_batch_size_count{{model="m"}} {float(len(batches))}' in text


def small_model(path):
    """x -> relu(x @ w1 + b1) (the device's layer) -> @ w2 + b2, mean squared error, SGD."""
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.placeholder(ef.float32, [None, 1], name="y")
        w1, b1 = ef.Variable(ef.glorot_uniform([4, 6]), name="w1"), ef.Variable(np.zeros(6, np.float32), name="b1")
        w2, b2 = ef.Variable(ef.glorot_uniform([6, 1]), name="w2"), ef.Variable(np.zeros(1, np.float32), name="b2")
        h = ef.nn.relu(ef.add(ef.matmul(x, w1, name="mm1"), b1, name="z1"), name="h1")
        pred = ef.matmul(h, w2) + b2
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        step = ef.train.GradientDescent(0.05).minimize(loss)
    ef.save(g, path, {"train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    return reader.load(path)


def test_split_training_steps_on_the_server_and_the_device(tmp_path):
    model = small_model(tmp_path / "m.efl")
    sub = model.subgraphs[0]
    device_ops = {i for i, op in enumerate(sub.operators)
                  if op.outputs and sub.tensors[op.outputs[0]].name in ("mm1", "z1", "h1")}
    assert len(device_ops) == 3
    (tmp_path / "pair").mkdir()
    training.write_pair(model, device_ops, tmp_path / "pair", model_id="small")
    rng = np.random.default_rng(1)
    data = {"x": rng.standard_normal((32, 4)).astype(np.float32), "y": rng.standard_normal((32, 1)).astype(np.float32)}
    board = TensorBoardMetrics(tmp_path / "server")
    with Server(models={"small": tmp_path / "pair" / "cloud.efl"}, metrics=board) as server:
        device = ef.Interpreter(tmp_path / "pair" / "device.efl", delegates=[CloudDelegate(server.address, device_id="d")])
        with TensorBoardLogger(tmp_path / "device", histogram_every=2) as logger:
            history = training_loop.fit(device, data, epochs=1, batch_size=8, logger=logger)
    board.close()
    assert len(history) == 4
    assert scalars(events(tmp_path / "server"), "training_steps/small") == {k: k for k in range(1, 5)}
    acc = events(tmp_path / "device")
    assert scalars(acc, "loss") == pytest.approx(dict(history), rel=1e-6)
    assert scalars(acc, "learning_rate") == {k: pytest.approx(0.05) for k in range(1, 5)}
    # the device's own weights; the server holds w2 and b2; a delegate's runner: no gradients
    assert set(acc.Tags()["histograms"]) == {"weights/w1", "weights/b1"}
    h = {e.step: e.histogram_value for e in acc.Histograms("weights/w1")}
    w1 = device.variables()["w1"].astype(np.float64)
    assert set(h) == {2, 4} and h[4].num == w1.size
    np.testing.assert_allclose([h[4].min, h[4].max, h[4].sum, h[4].sum_squares],
                               [w1.min(), w1.max(), w1.sum(), (w1 ** 2).sum()], rtol=1e-6)


@pytest.mark.slow  # a server process that imports tensorboardX: ~6 s on a busy machine
def test_edgeflow_serve_logdir(model_dir, tmp_path):
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", model_dir, "--port", 0, "--logdir", tmp_path / "tb"),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        lines.wait_for(r"TensorBoard events in")
        port = lines.wait_for(r"serving \d+ models on 127\.0\.0\.1:(\d+)").group(1)
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            for n in (1, 2):
                client.run("m", {"x": np.ones((n, 4), np.float32)}, ["y"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    acc = events(tmp_path / "tb")
    assert sorted(scalars(acc, "requests/m/Run/seconds")) == [1, 2]
    assert scalars(acc, "bytes/m/received") == {1: 16, 2: 48}  # float32 rows of 4: 1, then 2 more
