"""The command line as a new user meets it (issue 19's list): bench's and run's inputs, times
in ms, quiet OpenCL builds, quickstart's files, one-line errors, a progress bar on a TTY.
Each runs `python -m edgeflow.cli` as a subprocess."""
import json
import os
import pty
import re
import select
import socket
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgeflow as ef
from edgeflow.cli.bench import ms
from edgeflow.cloud.client import Client, _reason
from edgeflow.errors import RemoteError

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def edgeflow(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})


def one_line_error(r):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines[-1].startswith("edgeflow "), r.stderr
    return lines


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("polish")
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.nn.relu(x @ ef.constant(w, name="w"), name="y")
    ef.save(g, folder / "m.efl", signatures={"infer": ({"x": x}, {"y": y})})
    return folder / "m.efl", w


def test_ms_keeps_three_significant_digits():
    assert [ms(v) for v in (0.0123456, 0.123456, 1.23456, 12.3456, 123.456, 12345.6)] == \
        ["0.0123", "0.123", "1.23", "12.3", "123", "12346"]


def test_bench_threads_input_shape_and_ms(model):
    r = edgeflow("bench", model[0], "--threads", "1", "--input-shape", "x=7,4", "--runs", "3", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["input_shapes"] == {"x": [7, 4]} and result["threads"] == 1
    assert all(result[k] > 0 for k in ("mean_ms", "p50_ms", "min_ms"))
    text = edgeflow("bench", model[0], "--input-shape", "x=2,4", "--runs", "3").stdout
    assert "runs (ms): mean" in text and "1 thread" not in text
    assert "no input(s) ['z']" in one_line_error(edgeflow("bench", model[0], "--input-shape", "z=1,4"))[-1]
    assert "--input-shape expects" in one_line_error(edgeflow("bench", model[0], "--input-shape", "x=a"))[-1]


def test_run_and_bench_take_an_npz_of_named_inputs(model, tmp_path):
    path, w = model
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = edgeflow("run", path, "-i", tmp_path / "in.npz", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), np.maximum(x @ w, 0), rtol=1e-6)
    r = edgeflow("bench", path, "-i", tmp_path / "in.npz", "--runs", "2", "--json")
    assert json.loads(r.stdout)["input_shapes"] == {"x": [5, 4]}, r.stderr


def test_bad_npz_inputs_are_one_line_errors(model, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 4), np.float32))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "in.npz").read_bytes()[:100])
    assert "cannot read" in one_line_error(edgeflow("run", model[0], "-i", tmp_path / "cut.npz"))[-1]
    line = one_line_error(edgeflow("run", model[0], "-i", f"x={tmp_path / 'in.npz'}"))[-1]
    assert f"pass it as -i {tmp_path / 'in.npz'}" in line
    np.save(tmp_path / "one.npy", np.zeros(3))
    os.rename(tmp_path / "one.npy", tmp_path / "one.npz")
    assert "not an .npz archive" in one_line_error(edgeflow("run", model[0], "-i", tmp_path / "one.npz"))[-1]


def test_opencl_compiler_remarks_go_to_the_debug_log(model, tmp_path):
    """PoCL has remarks on edgeflow's kernels at every build (not cached: PYOPENCL_NO_CACHE);
    pyopencl turns them into a CompilerWarning on stderr unless edgeflow logs them."""
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 4), np.float32))
    env = {"PYOPENCL_NO_CACHE": "1"}
    r = edgeflow("run", model[0], "-i", f"x={x}", "--accel", "opencl", env=env)
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    r = edgeflow("--log-level", "debug", "run", model[0], "-i", f"x={x}", "--accel", "opencl", env=env)
    assert r.returncode == 0 and "DEBUG edgeflow.accel.opencl: OpenCL build of gemm.cl" in r.stderr, r.stderr


def test_quickstart_without_dir_prints_no_path_it_removes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "edgeflow.cli", "quickstart"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "removed at the end (--dir DIR keeps them)" in r.stdout
    assert str(tmp_path) not in r.stdout and os.listdir(tmp_path) == []


def test_quickstart_dir_keeps_the_files_it_lists(tmp_path):
    r = edgeflow("quickstart", "--dir", tmp_path / "qs", timeout=300)
    assert r.returncode == 0, r.stderr
    listed = re.search(r"the files are in (.+?): (.+)$", r.stdout, re.M)
    assert listed and listed.group(1) == str(tmp_path / "qs")
    names = listed.group(2).split(", ")
    assert {"quickstart.efl", "cnn.onnx", "split/", "checkpoints/"} <= set(names)
    assert all(os.path.exists(tmp_path / "qs" / n) for n in names)


def test_port_in_use_is_one_line(model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = edgeflow("serve", "--model-dir", model[0].parent, "--port", port, timeout=60)
    lines = one_line_error(r)
    assert lines[-1] == f"edgeflow serve: error: cannot listen on 127.0.0.1:{port}: the port is in use " \
                        "(another server?): choose another --port"
    assert "add_port" not in r.stderr and "GRPC_VERBOSITY" not in r.stderr


def test_an_unreachable_cloud_is_said_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(f"127.0.0.1:{port}")
    try:
        with pytest.raises(RemoteError) as e:
            client.list_models(timeout=10)
    finally:
        client.close()
    assert str(e.value) == f"the server at 127.0.0.1:{port} is unreachable (Connection refused)"


@pytest.mark.parametrize("details, reason", [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: Failed to connect to "
     "remote host: Connection refused", "Connection refused"),
    ("errors resolving nosuch.invalid:9: [field:hostname lookup error:address lookup failed for "
     "nosuch.invalid:9: Domain name not found]", "cannot resolve its host name: Domain name not found"),
    ("Socket closed", "Socket closed"),
])
def test_unreachable_reasons(details, reason):
    assert _reason(details) == reason


def test_onnx_and_tflite_files_passed_to_run_suggest_convert(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    line = one_line_error(edgeflow("run", tmp_path / "m.onnx"))[-1]
    assert line == (f"edgeflow run: error: {tmp_path / 'm.onnx'} is an ONNX model, not an .efl package: convert "
                    f"it first with `edgeflow convert {tmp_path / 'm.onnx'} -o {tmp_path / 'm'}.efl`")
    tflite = os.path.join(DATA, "tflite", "batch_matmul_sig.tflite")
    assert "is a TFLite model" in one_line_error(edgeflow("bench", tflite))[-1]


def test_a_custom_domain_op_names_its_own_domain_version(tmp_path):
    graph = helper.make_graph([helper.make_node("FusedGelu", ["x"], ["y"], domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, tmp_path / "custom.onnx")
    r = edgeflow("convert", tmp_path / "custom.onnx", "-o", tmp_path / "c.efl")
    assert r.returncode == 2 and "com.microsoft.FusedGelu (com.microsoft opset 1): y" in r.stderr, r.stderr
    assert "opset 17" not in r.stderr


def test_train_shows_its_progress_bar_on_a_terminal(tmp_path):
    """Under a real pseudo-terminal that reports no size (as `script` and CI runners give),
    the bar is drawn; with stderr a pipe it is not."""
    rng = np.random.default_rng(0)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 2], name="x")
        y = ef.placeholder(ef.float32, [None, 1], name="y")
        w = ef.Variable(np.zeros((2, 1), np.float32), name="w")
        loss = ef.losses.mean_squared_error(y, x @ w)
        step = ef.train.GradientDescent(0.1).minimize(loss)
    ef.save(g, tmp_path / "lin.efl", signatures={"infer": ({"x": x}, {"pred": x @ w}),
                                                  "train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    xs = rng.standard_normal((64, 2)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=xs, y=xs @ np.array([[1.0], [-2.0]], np.float32))
    argv = [sys.executable, "-m", "edgeflow.cli", "train", str(tmp_path / "lin.efl"), "--data",
            str(tmp_path / "d.npz"), "--batch-size", "8", "--epochs", "2"]
    main, child = pty.openpty()
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(main, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0, seen
    os.close(main)
    assert re.search(rb"training: 100%\|.*\| 16/16", seen), seen
    piped = edgeflow(*argv[3:])
    assert piped.returncode == 0 and "training:" not in piped.stderr, piped.stderr
