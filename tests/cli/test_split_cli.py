"""`edgeflow profile`, `edgeflow split`, `edgeflow serve` and `edgeflow run --cloud`, as a
user runs them: profile, split, serve the cloud part, run the device part against it."""
import contextlib
import json
import signal
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from cloud.test_serve_cli import Lines  # tests/ is on sys.path (its conftest)


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def serving(model_dir):
    """`edgeflow serve --model-dir model_dir` on a free port, until the block ends: yields
    the match of its "serving N models on HOST:PORT" line (groups N, PORT) and its
    stderr lines so far."""
    server = subprocess.Popen([sys.executable, "-m", "edgeflow.cli", "serve", "--model-dir", str(model_dir),
                               "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(server.stderr)
        yield lines.wait_for(r"serving (\d+) models? on [\d.]+:(\d+)"), lines.seen
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)



@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("split-cli")
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 4)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        h = ef.nn.relu(ef.matmul(x, ef.constant(w1, name="w1")), name="h")
        y = ef.matmul(ef.tanh(h, name="t"), ef.constant(w2, name="w2"), name="y")
    ef.save(g, root / "m.efl", signatures={"infer": ({"x": x}, {"y": y})})
    x = rng.standard_normal((3, 16)).astype(np.float32)
    np.save(root / "x.npy", x)
    return root, x, np.tanh(np.maximum(x @ w1, 0)) @ w2


def test_profile_split_serve_run(model):
    root, x, want = model
    r = edgeflow("profile", root / "m.efl", "-o", root / "p.json", "--runs", 3, "--input-shape", "x=3,16")
    assert r.returncode == 0, r.stderr
    profile = json.loads((root / "p.json").read_text())
    assert set(profile["seconds"]) == {"matmul", "h", "t", "y"} and profile["runs"] == 3
    assert sum(profile["seconds"].values()) == pytest.approx(profile["total"])  # scaled to runs
    assert "ms per run" in r.stdout and "scaled x" in r.stdout
    out = root / "out"
    r = edgeflow("split", root / "m.efl", "-o", out, "--cut", "h", "--link", "wifi",
                 "--device-profile", root / "p.json", "--server-profile", root / "p.json")
    assert r.returncode == 0, r.stderr
    assert "predicted latency" in r.stdout and "wrote" in r.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert [u["name"] for u in plan["upload"]] == ["h"] and [d["name"] for d in plan["download"]] == ["y"]
    assert {o["name"]: o["side"] for o in plan["ops"]} == {"matmul": "device", "h": "device", "t": "cloud",
                                                           "y": "cloud"}
    assert (out / "plan.svg").read_text().startswith("<svg")
    r = edgeflow("inspect", out / "device.efl")
    assert r.returncode == 0, r.stderr
    assert "send/recv: runs with the cloud" in r.stdout and "round trip 1: up h; down y" in r.stdout
    served = root / "served"
    served.mkdir()
    (served / "cloud.efl").write_bytes((out / "cloud.efl").read_bytes())
    with serving(served) as (match, _):
        r = edgeflow("run", out / "device.efl", "--cloud", f"127.0.0.1:{match.group(2)}",
                     "-i", f"x={root / 'x.npy'}", "-o", root / "got")
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(root / "got" / "y.npy"), want, rtol=1e-5, atol=1e-5)


def test_split_plans_without_profiles_and_reports_errors(model):
    root, _, _ = model
    r = edgeflow("split", root / "m.efl", "-o", root / "planned", "--up", "100", "--rtt", "1ms")
    assert r.returncode == 0, r.stderr
    assert "predicted latency" in r.stdout and (root / "planned" / "device.efl").exists()
    for args, message in [(["--cut", "nope"], "unknown tensor"), (["--link", "5g"], "not a link profile"),
                          (["--input-shape", "x=a,b"], "NAME=D1,D2"),
                          (["--memory-budget", "0.000001"], "budget")]:
        r = edgeflow("split", root / "m.efl", "-o", root / "bad", *args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    r = edgeflow("run", root / "m.efl", "--token-file", root / "p.json")
    assert r.returncode == 2 and "need --cloud" in r.stderr


def test_resplitting_keeps_cloud_efl_and_serve_skips_the_device_package(model):
    """Issue 17, finding 2: a re-split (another link, another cut) leaves cloud.efl as it
    was, so the running server serves the new device package; `serve --model-dir out/`
    hosts cloud.efl and skips device.efl (it was served as a model named "device")."""
    root, x, want = model
    out = root / "resplit"
    r = edgeflow("split", root / "m.efl", "-o", out, "--cut", "h", "--link", "3g")
    assert r.returncode == 0, r.stderr
    assert "the same file for every cut and link" in r.stdout and "unchanged" not in r.stdout
    before = (out / "cloud.efl").read_bytes()
    with serving(out) as (match, seen):
        assert match.group(1) == "1", "".join(seen)
        assert any("skipping" in s and "device.efl: a device package" in s for s in seen), "".join(seen)
        r = edgeflow("split", root / "m.efl", "-o", out, "--cut", "t", "--link", "wifi")
        assert r.returncode == 0, r.stderr
        assert "cloud.efl sha256 unchanged" in r.stdout
        assert (out / "cloud.efl").read_bytes() == before
        r = edgeflow("run", out / "device.efl", "--cloud", f"127.0.0.1:{match.group(2)}",
                     "-i", f"x={root / 'x.npy'}", "-o", root / "resplit-got")
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(root / "resplit-got" / "y.npy"), want, rtol=1e-5, atol=1e-5)
