"""The OpenCL delegate against the numpy backend: partitions, host<->device copies,
results of converted models, training, and the command line's --accel."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import accel, training_loop
from edgeflow.graph.math_ops import apply

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"


@pytest.fixture(scope="module")
def delegate():
    return accel.OpenCLDelegate()


def close(got, want, rtol):
    """Equal within `rtol`, relative to the largest magnitude of `want`."""
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max() or 1))


@pytest.fixture(scope="module")
def split_model(tmp_path_factory):
    """x -> add -> relu -> cumsum (no OpenCL kernel) -> add -> exp."""
    path = tmp_path_factory.mktemp("split") / "split.efl"
    rng = np.random.default_rng(0)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        h = ef.nn.relu(x + ef.constant(rng.standard_normal(16).astype(np.float32)))
        h = apply("cumsum", [h], {"axis": 1})
        y = ef.exp(0.1 * h - ef.constant(rng.standard_normal(16).astype(np.float32)), name="y")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    return path


def test_two_partitions_and_one_copy_per_edge(split_model, delegate):
    from edgeflow.accel.kernels import CL_KERNELS
    assert "cumsum" not in CL_KERNELS, "pick another op without an OpenCL kernel for this test"
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    runner = ef.Interpreter(split_model, delegates=[delegate]).get_signature_runner("infer")
    runner(x=x)
    plan = runner.last_plan
    assert plan.partitions == 2, plan.placement_summary()
    cumsum = next(i for i in plan.order if plan.subgraph.operators[i].opcode == "cumsum")
    assert plan.placement[cumsum] == "cpu" and "no OpenCL kernel" in plan.fallbacks[cumsum]
    rt = delegate.rt
    before = rt.uploads, rt.downloads
    for _ in range(3):
        got = runner(x=x)["y"]
    # each partition reads one tensor from the host and writes one back; constants went
    # at compile time and the intermediates (add, mul, sub outputs) stay on the device
    assert (rt.uploads - before[0], rt.downloads - before[1]) == (3 * 2, 3 * 2)
    want = ef.Interpreter(split_model).get_signature_runner("infer")(x=x)["y"]
    close(got, want, 1e-5)


def test_random_mlp_matches_numpy(tmp_path, delegate):
    rng = np.random.default_rng(2)
    path = tmp_path / "mlp.efl"
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 32], name="x")
        h = ef.layers.dense(x, 64, activation=ef.nn.relu)
        h = ef.layers.dense(h, 64, activation=ef.tanh)
        y = ef.sigmoid(ef.layers.dense(h, 10), name="y")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got = ef.Interpreter(path, delegates=[delegate]).get_signature_runner("infer")(x=x)["y"]
    close(got, ef.Interpreter(path).get_signature_runner("infer")(x=x)["y"], 1e-5)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from edgeflow.converters import onnx as onnx_converter
    folder = tmp_path_factory.mktemp("converted")
    out = {}
    for name in ("mobilenetv2", "resnet", "transformer"):
        out[name] = folder / f"{name}.efl"
        onnx_converter.convert(str(DATA / f"{name}.onnx"), str(out[name]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenetv2", "resnet", "transformer"])
def test_converted_models_match_numpy(converted, delegate, name):
    from edgeflow.accel.kernels import CL_KERNELS
    io = np.load(DATA / f"{name}_io.npz")
    with_cl = ef.Interpreter(converted[name], delegates=[delegate])
    plain = ef.Interpreter(converted[name])
    for batch in (1, 8):
        case = next(str(c) for c in io["cases"] if str(c).startswith(f"b{batch}"))
        runner = with_cl.get_signature_runner("infer")
        feed = {n: io[f"{case}.{n}"] for n in runner.get_input_details()}
        got = runner(**feed)
        want = plain.get_signature_runner("infer")(**feed)
        for key, value in want.items():
            close(got[key], value, 1e-4)
        plan = runner.last_plan
        print(f"{name} b{batch}: {plan.placement_summary()}")
        has_kernels = any(plan.subgraph.operators[i].opcode in CL_KERNELS for i in plan.order)
        assert not has_kernels or "opencl" in plan.placement.values(), plan.placement_summary()


def build_trainable(path):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 20], name="x")
        label = ef.placeholder(ef.int64, [None], name="label")
        h = ef.layers.dense(x, 32, activation=ef.nn.relu)
        logits = ef.layers.dense(h, 5, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        step = ef.train.Momentum(0.1, 0.9).minimize(loss)
    ef.save(g, path, signatures={"infer": ({"x": x}, {"logits": logits}),
                                 "train": ({"x": x, "label": label}, {"loss": loss}, [step])})


def training_data(n=64):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 20)).astype(np.float32)
    return {"x": x, "label": (x[:, :5].argmax(1)).astype(np.int64)}


@pytest.fixture(scope="module")
def trainable(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "mlp.efl"
    build_trainable(path)
    return path


def test_training_matches_numpy_step_for_step(trainable, delegate):
    data = {k: v[:40] for k, v in training_data().items()}  # 5 steps of 8
    with_cl, plain = ef.Interpreter(trainable, delegates=[delegate]), ef.Interpreter(trainable)
    got = training_loop.fit(with_cl, data, epochs=1, batch_size=8, seed=0)
    want = training_loop.fit(plain, data, epochs=1, batch_size=8, seed=0)
    assert len(got) == 5
    np.testing.assert_allclose([l for _, l in got], [l for _, l in want], rtol=1e-4)
    for name, value in plain.variables().items():
        close(with_cl.variables()[name], value, 1e-4)
    (plan,) = with_cl._plans.values()  # the train signature's one plan
    print(f"train: {plan.placement_summary()}")
    assert "opencl" in plan.placement.values(), plan.placement_summary()


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_run_bench_train_with_opencl(split_model, trainable, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 16), np.float32))
    r = edgeflow("run", split_model, "-i", f"x={x}", "--accel", "opencl", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    want = ef.Interpreter(split_model).get_signature_runner("infer")(x=np.ones((2, 16), np.float32))["y"]
    close(np.load(tmp_path / "out" / "y.npy"), want, 1e-5)

    r = edgeflow("bench", split_model, "--accel", "opencl", "--runs", 5, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert "in 2 partition(s)" in result["placement"]
    assert (result["uploads_per_run"], result["downloads_per_run"]) == (2, 2)
    r = edgeflow("bench", split_model, "--accel", "opencl", "--runs", 5)
    assert "placement:" in r.stdout and "2 upload(s), 2 download(s)" in r.stdout, r.stdout

    np.savez(tmp_path / "data.npz", **training_data())
    r = edgeflow("train", trainable, "--data", tmp_path / "data.npz", "--batch-size", 16,
                 "--accel", "opencl", "-o", tmp_path / "trained.efl")
    assert r.returncode == 0 and "trained 4 steps" in r.stdout, r.stderr


def test_cli_inspect_lists_fallbacks(split_model):
    r = edgeflow("inspect", split_model, "--accel", "opencl", "--json")
    assert r.returncode == 0, r.stderr
    sig = json.loads(r.stdout)["signatures"]["infer"]
    assert "in 2 partition(s), 1 on CPU" in sig["placement"]
    assert [(f["type"], f["reason"]) for f in sig["fallbacks"]] == [("cumsum", "opencl: no OpenCL kernel")]
    text = edgeflow("inspect", split_model, "--accel", "opencl").stdout
    assert "placement:" in text and "cumsum" in text and "no OpenCL kernel" in text


def test_cli_auto_uses_opencl_and_none_does_not(split_model):
    r = edgeflow("bench", split_model, "--accel", "auto", "--runs", 2, "--json")
    assert r.returncode == 0 and "using OpenCL on" in r.stderr, r.stderr
    assert "placement" in json.loads(r.stdout)
    r = edgeflow("bench", split_model, "--runs", 2, "--json")
    assert r.returncode == 0 and "placement" not in json.loads(r.stdout)


def test_cli_opencl_without_a_runtime_is_one_clear_line(split_model):
    # an empty ICD list hides every platform, as on a machine with no runtime
    env = dict(os.environ, OCL_ICD_VENDORS="/nonexistent", OPENCL_VENDOR_PATH="/nonexistent")
    r = subprocess.run([sys.executable, "-m", "edgeflow.cli", "run", str(split_model), "--accel", "opencl"],
                       capture_output=True, text=True, timeout=120, env=env)
    if r.returncode == 0:
        pytest.skip("this OpenCL loader ignores OCL_ICD_VENDORS")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "install an OpenCL runtime" in r.stderr and "pip install" in r.stderr


def test_dtypes_the_kernels_do_not_take_fall_back_with_the_reason(tmp_path, delegate):
    """relu's kernel computes in float32 only; gather's moves int32 elements too."""
    path = tmp_path / "ints.efl"
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.int32, [4, 3], name="x")
        y = apply("gather", [ef.nn.relu(x), ef.constant(np.array([2, 0], np.int32))], {"axis": 0})
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    x = np.arange(-6, 6, dtype=np.int32).reshape(4, 3)
    runner = ef.Interpreter(path, delegates=[delegate]).get_signature_runner("infer")
    np.testing.assert_array_equal(runner(x=x)["y"], np.maximum(x, 0)[[2, 0]])
    plan = runner.last_plan
    where = {plan.subgraph.operators[i].opcode: i for i in plan.order}
    assert plan.placement[where["gather"]] == "opencl", plan.fallbacks
    assert plan.placement[where["relu"]] == "cpu"
    assert "input 0 has dtype int32 (OpenCL's relu takes float32)" in plan.fallbacks[where["relu"]]


@pytest.mark.parametrize("dtype", [ef.dtypes.uint16, ef.dtypes.uint32, ef.dtypes.uint64, ef.dtypes.bfloat16],
                         ids=ef.dtypes.name)
def test_uint16_to_64_and_bfloat16_stay_with_numpy(tmp_path, delegate, dtype):
    """No OpenCL kernel takes them: moves, arithmetic and casts of them run on the CPU."""
    path = tmp_path / "new.efl"
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(dtype, [4, 3], name="x")
        moved = apply("gather", [apply("transpose", [x], {"perm": (1, 0)}), ef.constant(np.array([2, 0], np.int32))],
                      {"axis": 0})
        y = ef.cast(apply("add", [moved, moved]), ef.float32, name="y")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    runner = ef.Interpreter(path, delegates=[delegate]).get_signature_runner("infer")
    got = runner(x=ef.dtypes.array(values, dtype))["y"]
    np.testing.assert_array_equal(got, 2 * values.T[[2, 0]])
    plan = runner.last_plan
    for i in plan.order:
        opcode = plan.subgraph.operators[i].opcode
        assert plan.placement[i] == "cpu", opcode
        assert f"has dtype {ef.dtypes.name(dtype)} (OpenCL's {opcode} takes" in plan.fallbacks[i], plan.fallbacks[i]


def test_ops_whose_operands_are_known_while_preparing_run_on_the_delegate(delegate):
    """A slice whose end and a reduction whose axes come from the input's shape (values known
    once the plan is made) reach the delegate with those values as attributes."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, None], name="x")
        half = apply("div", [ef.shape(x)[1:2], np.array([2], np.int64)])
        top = apply("slice", [x * 2.0, np.array([0], np.int64), half, np.array([1], np.int64)])
        y = apply("reduce_sum", [top, ef.shape(x)[0:1] - 1], {"keepdims": True}, name="y")
    from edgeflow.format import writer
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})})), delegates=[delegate])
    runner = interp.get_signature_runner("infer")
    xv = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    close(runner(x=xv)["y"], (2 * xv)[:, :3].sum(axis=1, keepdims=True), 1e-5)
    plan = runner.last_plan
    placed = {plan.subgraph.operators[i].opcode: plan.placement[i] for i in plan.order}
    assert placed["slice"] == placed["reduce_sum"] == "opencl", plan.fallbacks
