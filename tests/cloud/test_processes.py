"""`edgeflow serve --processes N`: N server processes on one port (SO_REUSEPORT), each
answering what one server answers; a process that dies is replaced; state kept in one
process (split training, the parameter server) is refused without a Ray cluster.
References: conftest's numpy expression of the test model."""
import signal
import socket
import subprocess
import threading

import numpy as np
import psutil
import pytest

import edgeflow as ef
from edgeflow.cloud import Client
from edgeflow.cloud.processes import reserve_port
from edgeflow.errors import EdgeflowError
from edgeflow.format import writer

from .conftest import build_model, reference
from .test_serve_cli import Lines, edgeflow


def listening_on(pid, port):
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
               for c in psutil.Process(pid).net_connections("tcp"))


def ask_from_many_devices(port, n=12):
    """n devices, each on a channel of its own, run the model once: [(x, reply)]."""
    results, errors = [None] * n, []

    def device(k):
        try:
            x = np.random.default_rng(k).standard_normal((1 + k % 3, 4)).astype(np.float32)
            with Client(f"127.0.0.1:{port}", timeout=60) as client:
                results[k] = x, client.run("m", {"x": x}, ["y", "double"])
        except Exception as e:  # noqa: BLE001 (checked below)
            errors.append(e)
    threads = [threading.Thread(target=device, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:2]
    return results


def check(results):
    for x, out in results:
        ref = reference(x)
        np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6)
        np.testing.assert_array_equal(out["double"], ref["double"])


def test_processes_share_a_port_answer_alike_and_one_that_dies_is_replaced(tmp_path):
    writer.write(build_model(), tmp_path / "m.efl")
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", tmp_path, "--port", 0, "--processes", 2, "--grace", 0),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        port = int(lines.wait_for(r"serving 1 models on 127\.0\.0\.1:(\d+) in 2 processes").group(1))
        children = psutil.Process(proc.pid).children()
        servers = [c for c in children if listening_on(c.pid, port)]
        assert len(servers) == 2, children  # both bound the one port
        check(ask_from_many_devices(port))

        servers[0].send_signal(signal.SIGKILL)
        lines.wait_for(rf"server process \d \(pid {servers[0].pid}\) exited with code -9: starting another")
        lines.wait_for(rf"process \d/2: listening with 1 models on 127\.0\.0\.1:{port}")
        now = [c for c in psutil.Process(proc.pid).children() if listening_on(c.pid, port)]
        assert len(now) == 2 and servers[0].pid not in {c.pid for c in now}
        check(ask_from_many_devices(port))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert not any(psutil.pid_exists(c.pid) and psutil.Process(c.pid).status() != psutil.STATUS_ZOMBIE
                   for c in servers[1:])  # the processes stopped with it


def trainable_package(path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.placeholder(ef.float32, [None, 2], name="y")
        with ef.device("cloud"):
            out = ef.layers.dense(x, 2, name="dense")
            loss = ef.reduce_mean((out - y) * (out - y))
            step = ef.train.GradientDescent(0.1).minimize(loss)
    ef.save(g, path, signatures={"train": ({"x": x, "y": y}, {"loss": loss}, [step])})


@pytest.mark.parametrize("flags, trainable, reason", [
    ([], True, "t.efl: split training keeps a model's variables in one process: use --processes 1, --ray ADDRESS"),
    (["--parameter-server", "sync"], True, "--parameter-server keeps the variables in one process"),
    (["--ray"], False, "--processes with --ray: give the cluster's ADDRESS"),
])
def test_state_kept_in_one_process_is_refused(tmp_path, flags, trainable, reason):
    writer.write(build_model(), tmp_path / "m.efl")
    if trainable:
        trainable_package(tmp_path / "t.efl")
    r = subprocess.run(edgeflow("serve", "--model-dir", tmp_path, "--port", 0, "--processes", 2, *flags),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert reason in r.stderr and r.stderr.count("\n") == 1


def test_a_port_another_program_listens_on_cannot_be_reserved():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(EdgeflowError, match=f"cannot listen on 127.0.0.1:{port}: "):
            reserve_port("127.0.0.1", port)
    sock = reserve_port("127.0.0.1", 0)  # port 0: one picked, held for the processes
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
