"""A server whose models run on its OpenCL device (`edgeflow serve --accel opencl`): every
request's interpreter shares one delegate, unbatched and in adaptive batches, from many
devices at once. On CI the device is PoCL's CPU; on a GPU server the same code runs on
the GPU. References are the packages run alone with numpy kernels, outside any server."""
import shutil
import subprocess

import numpy as np

from edgeflow.accel import OpenCLDelegate
from edgeflow.cloud import Client, Server

from .test_batching import Recorder, build_invariant, devices, images, unbatched
from .test_serve_cli import Lines, edgeflow

FETCHES = ["p", "e", "s"]


def check(out, x, path):
    ref = unbatched(path, FETCHES, {"x": x})  # numpy kernels: another order of float sums
    for name in FETCHES:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-5)


def test_concurrent_requests_share_the_servers_opencl_delegate(tmp_path):
    path = build_invariant(tmp_path / "conv.efl")
    delegate = OpenCLDelegate()
    with Server(models={"conv": path}, max_workers=8, delegates=[delegate]) as server:
        def work(client, k):
            sent = [images(100 * k + i, 1 + (k + i) % 3) for i in range(3)]
            return [(x, client.run("conv", {"x": x}, FETCHES)) for x in sent]
        results = devices(server, work, n=12)
        hosted = server.models["conv"]
        assert all(d is delegate for d in hosted.delegates)
    assert delegate.rt.uploads > 0 and delegate.rt.downloads > 0  # the ops ran on the device
    for replies in results:
        for x, out in replies:
            check(out, x, path)


def test_batches_run_on_the_opencl_device_and_each_device_gets_its_own_rows(tmp_path):
    path = build_invariant(tmp_path / "conv.efl")
    delegate, metrics = OpenCLDelegate(), Recorder()
    batching = dict(slo_ms=1000, max_batch=64, max_wait_ms=50)
    with Server(models={"conv": path}, max_workers=32, batching=batching, metrics=metrics,
                delegates=[delegate]) as server:
        inputs = [images(k, 1) for k in range(32)]
        results = devices(server, lambda client, k: client.run("conv", {"x": inputs[k]}, FETCHES))
    assert max(metrics.batches) > 1 and sum(metrics.batches) == 32 and delegate.rt.uploads > 0
    for k, out in enumerate(results):
        check(out, inputs[k], path)
        assert not np.allclose(out["e"], np.tanh(inputs[(k + 1) % 32] * 0.5 + 1.0), atol=1e-5)  # its own rows


def test_serve_accel_opencl_runs_the_models_on_the_device(tmp_path):
    path = build_invariant(tmp_path / "conv.efl")
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(path, folder / "conv.efl")
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", folder, "--port", 0, "--accel", "opencl",
                                     "--slo-ms", 100, "--grace", 0),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        device = lines.wait_for(r"models run on OpenCL device '(.+)' \(fp32\)").group(1)
        assert device == OpenCLDelegate().device_name
        port = lines.wait_for(r"serving 1 models on 127\.0\.0\.1:(\d+)").group(1)
        with Client(f"127.0.0.1:{port}", timeout=60) as client:
            x = images(7, 2)
            check(client.run("conv", {"x": x}, FETCHES), x, path)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_with_an_opencl_device_that_is_not_there_exits_2_saying_which_there_are(tmp_path):
    r = subprocess.run(edgeflow("serve", "--model-dir", tmp_path, "--accel", "opencl", "--device",
                                "no-such-device-anywhere"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "no OpenCL device matches 'no-such-device-anywhere'; devices: 0: " in r.stderr
