"""Each verb of the `edgeflow` command, run as a subprocess as a user would."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef

VERBS = ["inspect", "run", "bench", "quickstart", "serve", "profile", "split", "export"]


def edgeflow(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "m.efl"
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.nn.relu(x @ ef.constant(w, name="w") - 1.0, name="y")
        idx = ef.argmax(y, axis=1, name="idx")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y, "idx": idx})}, description="cli test")
    return path, w


def test_help_for_every_verb():
    top = edgeflow("--help")
    assert top.returncode == 0 and all(v in top.stdout for v in VERBS)
    for verb in VERBS:
        r = edgeflow(verb, "--help")
        assert r.returncode == 0 and r.stdout.startswith("usage: edgeflow " + verb), r.stderr


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "edgeflow")
    r = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("edgeflow ")


HEAVY = ["grpc", "scipy", "onnx", "onnxruntime", "pyopencl", "converters",
         "edgeflow.cloud", "edgeflow.splitter", "edgeflow.accel"]


def test_help_imports_no_extra():
    """`edgeflow --help` and every verb's --help build all parsers without loading the
    optional extras (or the packages that need them): a verb imports them when it runs."""
    code = ("import sys\nfrom edgeflow.cli import main\n"
            f"for argv in [[]] + [[v] for v in {VERBS + ['convert', 'train']!r}]:\n"
            "    try:\n        main(argv + ['--help'])\n    except SystemExit:\n        pass\n"
            "print(*sorted(sys.modules), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: edgeflow serve" in r.stdout
    loaded = r.stderr.split()
    assert "edgeflow.cli.serve" in loaded
    assert [m for m in loaded if m.startswith(tuple(HEAVY))] == []


def test_inspect_text_and_json(model):
    path, w = model
    r = edgeflow("inspect", path)
    assert r.returncode == 0, r.stderr
    assert "infer" in r.stdout and "matmul" in r.stdout and "float32(?, 4)" in r.stdout
    info = json.loads(edgeflow("inspect", path, "--json").stdout)
    assert info["signatures"]["infer"]["inputs"] == {"x": {"dtype": "float32", "shape": [None, 4]}}
    assert info["ops_by_type"] == {"matmul": 1, "sub": 1, "relu": 1, "argmax": 1}
    assert info["parameters"] == w.size + 1  # w and the scalar 1.0
    assert info["file_bytes"] == os.path.getsize(path)
    assert info["signatures"]["infer"]["arena_bytes"] > 0


def test_inspect_lists_the_subgraphs_of_control_flow(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        _, r = ef.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, ef.tanh(s) + s), [ef.constant(0), x])
    ef.save(g, tmp_path / "loop.efl", {"infer": ({"x": x}, {"y": r})})
    r = edgeflow("inspect", tmp_path / "loop.efl", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["ops_by_type"] == {"while": 1}
    assert info["subgraphs"] == [
        {"index": 1, "name": "cond", "inputs": 2, "outputs": 1, "ops_by_type": {"less": 1}},
        {"index": 2, "name": "body", "inputs": 2, "outputs": 2, "ops_by_type": {"add": 2, "tanh": 1}}]


def test_run_reads_npy_and_writes_outputs(model, tmp_path):
    path, w = model
    xv = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", xv)
    r = edgeflow("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "y: float32[3, 3]" in r.stdout
    expected = np.maximum(xv @ w - 1.0, 0)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), expected, rtol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "idx.npy"), expected.argmax(1))


def test_bench_reports_statistics(model):
    r = edgeflow("bench", model[0], "--runs", "5", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    for key in ("init_ms", "first_run_ms", "mean_ms", "std_ms", "p50_ms", "p99_ms", "arena_bytes"):
        assert result[key] >= 0
    assert {o["type"] for o in result["top_ops"]} == {"matmul", "sub", "relu", "argmax"}
    assert "top ops by time" in edgeflow("bench", model[0], "--runs", "3").stdout


def _one_line_error(r):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return r.stderr.strip().splitlines()


@pytest.mark.parametrize("args", [
    [], ["frobnicate"], ["inspect"], ["bench", "m.efl", "--runs", "0"], ["run", "m.efl", "--input"],
])
def test_bad_arguments_exit_2(args):
    _one_line_error(edgeflow(*args))


@pytest.mark.parametrize("content", [b"", b"not a model at all", b"\x00" * 64])
@pytest.mark.parametrize("verb", ["inspect", "run", "bench"])
def test_bad_files_exit_2_with_one_line(tmp_path, content, verb):
    bad = tmp_path / "bad.efl"
    bad.write_bytes(content)
    lines = _one_line_error(edgeflow(verb, bad))
    assert len(lines) == 1 and lines[0].startswith(f"edgeflow {verb}: error:")


def test_truncated_model_exits_2(model, tmp_path):
    data = model[0].read_bytes()
    bad = tmp_path / "cut.efl"
    bad.write_bytes(data[: len(data) // 2])
    lines = _one_line_error(edgeflow("run", bad))
    assert len(lines) == 1


def test_missing_file_and_bad_input_exit_2(model, tmp_path):
    assert len(_one_line_error(edgeflow("inspect", tmp_path / "nope.efl"))) == 1
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    lines = _one_line_error(edgeflow("run", model[0], "-i", f"x={tmp_path / 'x.npy'}"))
    assert "expected shape (?, 4)" in lines[0]
    lines = _one_line_error(edgeflow("run", model[0], "-i", "x"))
    assert "NAME=FILE.npy" in lines[0]
    lines = _one_line_error(edgeflow("run", model[0], "-i", f"x={tmp_path / 'missing.npy'}"))
    assert "cannot read" in lines[0]
