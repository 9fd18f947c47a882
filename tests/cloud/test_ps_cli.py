"""`edgeflow serve --parameter-server` and `edgeflow train --mode async|sync|fedavg`, as a
user runs them."""
import signal
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef

from .test_serve_cli import Lines



@pytest.mark.parametrize("mode", ["async", "fedavg"])
def test_serve_and_train_with_a_parameter_server(tmp_path, mode):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        with ef.device("cloud"):
            h = ef.layers.dense(x, 16, activation=ef.nn.relu, name="hidden")
        logits = ef.layers.dense(h, 3, name="logits")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        with ef.device("cloud"):
            step = ef.train.GradientDescent(0.2).minimize(loss)
    (tmp_path / "models").mkdir()
    ef.save(g, tmp_path / "models" / "mlp.efl",
            signatures={"train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((256, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=xs, y=xs[:, :3].argmax(1).astype(np.int64))
    cli = [sys.executable, "-m", "edgeflow.cli"]
    server = subprocess.Popen(cli + ["serve", "--model-dir", str(tmp_path / "models"), "--port", "0",
                                     "--parameter-server", mode, "--state-dir", str(tmp_path / "state")],
                              stderr=subprocess.PIPE, text=True)
    try:
        port = Lines(server.stderr).wait_for(r"serving \d+ models? on [\d.]+:(\d+)").group(1)
        r = subprocess.run(cli + ["train", str(tmp_path / "models" / "mlp.efl"), "--cloud", f"127.0.0.1:{port}",
                                  "--mode", mode, "--data", str(tmp_path / "d.npz"), "--epochs", "4",
                                  "--device-id", "cli"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        first, last = map(float, r.stdout.split("loss ")[1].split()[0:3:2])
        assert last < first, r.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert any((tmp_path / "state" / "ps").iterdir())  # checkpointed on shutdown


@pytest.mark.parametrize("flags", [["--parameter-server", "sync", "--ps-shards", "2"],
                                   ["--ray", "--ps-shards", "2"]])
def test_ps_shards_needs_ray_and_a_parameter_server(tmp_path, flags):
    r = subprocess.run([sys.executable, "-m", "edgeflow.cli", "serve", "--model-dir", str(tmp_path), *flags],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ps-shards needs --ray and --parameter-server" in r.stderr, r.stderr
