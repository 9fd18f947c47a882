"""Partitioning a model at a cut: the device package (send/recv) and the cloud package,
run together through an in-process transport, equal the unsplit model exactly.

The transport here calls the cloud package's Interpreter directly; tests/cloud runs the
same pairs through the gRPC server in another process.
"""
import json
import pathlib

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.cloud import CloudDelegate
from edgeflow.errors import EdgeflowError, PlacementError
from edgeflow.format import metadata, reader
from edgeflow.splitter import partition

MODELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"

MODELS = ("mlp", "mobilenetv2", "resnet", "transformer", "lstm")


class InProcess:
    """A stand-in for edgeflow.cloud.client.Client that runs the cloud package here."""

    target = "in-process"

    def __init__(self, path):
        self.interp = ef.Interpreter(path)
        self.requests = []

    def run(self, model_id, feeds, fetches, sha256=None, timeout=None, compression="none"):
        self.requests.append((model_id, sha256, sorted(feeds), list(fetches)))
        return self.interp.run(fetches, feeds)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    paths = {}
    for name in MODELS:
        paths[name] = out / f"{name}.efl"
        onnx_converter.convert(MODELS_DIR / f"{name}.onnx", paths[name])
    return paths


def _feeds(interp, batch, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, d in interp.get_signature_runner("infer").get_input_details().items():
        shape = [batch if s == -1 and k == 0 else (5 if s == -1 else s)
                 for k, s in enumerate(d["shape_signature"])]
        feeds[name] = (rng.standard_normal(shape).astype(np.float32) if d["dtype"] == np.float32
                       else rng.integers(0, 5, shape).astype(d["dtype"]))
    return feeds


def _random_device_side(cut, rng):
    """A random valid device side: random ops, closed under the ops they depend on."""
    return partition.with_needs(cut.model, {i for i in cut.ops if rng.random() < 0.4}, cut.signature.key)


@pytest.mark.parametrize("name", MODELS)
def test_split_pairs_equal_the_whole_model(name, converted, tmp_path):
    model = reader.load(converted[name])
    whole = ef.Interpreter(converted[name]).get_signature_runner("infer")
    ops = partition.Cut(model, set()).ops
    rng = np.random.default_rng(1)
    sides = [set(), set(ops[:len(ops) // 2]), set(ops), _random_device_side(partition.Cut(model, set()), rng)]
    graphs = [("full", "full"), ("cut", "cut"), ("full", "cut"), ("cut", "full")]
    for k, (side, (device_graph, cloud_graph)) in enumerate(zip(sides, graphs)):
        out = tmp_path / f"{k}"
        out.mkdir()
        cut, sha = partition.write_pair(model, side, out, model_id=name, device_graph=device_graph,
                                        cloud_graph=cloud_graph)
        cloud = InProcess(out / "cloud.efl")
        device = ef.Interpreter(out / "device.efl", delegates=[CloudDelegate(cloud)])
        runner = device.get_signature_runner("infer")
        for batch in (1, 3):
            feeds = _feeds(device, batch, seed=batch)
            want = whole(**feeds)
            got = runner(**feeds)
            assert set(got) == set(want)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} cut {k} {key}")
        sent = {s for _, _, feeds_sent, _ in cloud.requests for s in feeds_sent}
        assert sent == set(cut.names(cut.uploads))
        if not cut.cloud:
            assert not cloud.requests  # everything ran on the device
        else:
            assert all(r[0] == name and r[1] == sha for r in cloud.requests)
            assert len(cloud.requests) == 2  # one round trip per run


def test_a_tensor_read_by_several_cloud_ops_is_sent_once(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        h = ef.nn.relu(x * 2.0, name="h")
        a = ef.sigmoid(h, name="a")
        b = ef.tanh(h, name="b")
        y = ef.add(a, b, name="y")
    ef.save(g, tmp_path / "m.efl", signatures={"infer": ({"x": x}, {"y": y, "h": h})})
    model = reader.load(tmp_path / "m.efl")
    names = {model.subgraphs[0].tensors[op.outputs[0]].name: i
             for i, op in enumerate(model.subgraphs[0].operators)}
    cut, _ = partition.write_pair(model, {i for n, i in names.items() if n not in ("a", "b", "y")},
                                  tmp_path, model_id="m")
    assert cut.names(cut.uploads) == ["h"] and cut.names(cut.downloads) == ["y"]
    device = reader.load(tmp_path / "device.efl")
    sends = [op for op in device.subgraphs[0].operators if op.opcode == "send"]
    assert [op.attrs["key"] for op in sends] == ["h"]
    cloud = InProcess(tmp_path / "cloud.efl")
    runner = ef.Interpreter(tmp_path / "device.efl", delegates=[CloudDelegate(cloud)]).get_signature_runner("infer")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    got = runner(x=x)
    h = np.maximum(2 * x, 0)
    np.testing.assert_allclose(got["h"], h, rtol=1e-6)
    np.testing.assert_allclose(got["y"], 1 / (1 + np.exp(-h)) + np.tanh(h), rtol=1e-6)
    assert cloud.requests == [("m", partition.file_sha256(tmp_path / "cloud.efl"), ["h"], ["y"])]


def test_metadata_names_the_cloud_package(converted, tmp_path):
    model = reader.load(converted["mlp"])
    partition.write_pair(model, set(), tmp_path, model_id="mlp-v1")
    info = metadata.split(reader.load(tmp_path / "device.efl"))
    assert info["cloud_model_id"] == "mlp-v1"
    assert info["cloud_sha256"] == partition.file_sha256(tmp_path / "cloud.efl")
    cloud = reader.load(tmp_path / "cloud.efl")
    assert bytes(cloud.metadata["edgeflow.model_id"]).decode() == "mlp-v1"
    json.dumps(info)


def test_bad_cuts_and_missing_cloud(converted, tmp_path):
    model = reader.load(converted["mlp"])
    ops = partition.Cut(model, set()).ops
    with pytest.raises(PlacementError, match="which the cloud computes"):
        partition.Cut(model, {ops[-1]})  # the last op on the device, what it reads on the cloud
    with pytest.raises(PlacementError, match="no signature"):
        partition.Cut(model, set(), signature="nope")
    partition.write_pair(model, set(ops[:1]), tmp_path, model_id="mlp")
    with pytest.raises(PlacementError, match="already split"):
        partition.Cut(reader.load(tmp_path / "device.efl"), set())
    # Without a CloudDelegate, the split signature says what it needs; infer_local runs alone.
    interp = ef.Interpreter(tmp_path / "device.efl")
    feeds = _feeds(interp, 2)
    with pytest.raises(EdgeflowError, match=r"CloudDelegate\('host:port'\)"):
        interp.get_signature_runner("infer")(**feeds)
    want = ef.Interpreter(converted["mlp"]).get_signature_runner("infer")(**feeds)
    got = interp.get_signature_runner("infer_local")(**feeds)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    with pytest.raises(EdgeflowError, match="device package"):
        ef.Interpreter(converted["mlp"], delegates=[CloudDelegate(InProcess(tmp_path / "cloud.efl"))])


def test_no_submodule_shadows_an_op_function():
    """Importing a subpackage sets an attribute of `edgeflow`: none may hide an op (as
    edgeflow.split once hid ef.split)."""
    import importlib
    import pkgutil
    import types
    functions = {k for k in dir(ef) if not isinstance(getattr(ef, k), types.ModuleType)}
    for info in pkgutil.iter_modules(ef.__path__):
        assert info.name not in functions, info.name
        if info.name not in ("cli", "__main__"):
            importlib.import_module(f"edgeflow.{info.name}")
    assert callable(ef.split)


def test_ops_the_planner_folds_away_go_with_the_device_ops_that_read_them(tmp_path):
    """An exporter's shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) is
    folded out of the cost graph; a plan that keeps the Reshape on the device (here: all of
    it) must keep that arithmetic there too. It raised PlacementError before."""
    import onnx
    from onnx import TensorProto, helper
    from edgeflow.splitter.package import split_file
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["h", "shape"], ["flat"]),
             helper.make_node("Relu", ["flat"], ["y"])]
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
             onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    onnx_converter.convert(tmp_path / "m.onnx", tmp_path / "m.efl")
    x = np.random.default_rng(1).standard_normal((2, 4, 8)).astype(np.float32)
    for link, speed in (("3g", 1.0), ("wifi", 0.001)):  # device-only, then cloud-only
        out = tmp_path / link
        result = split_file(tmp_path / "m.efl", out, link=link, input_shapes={"x": (2, 4, 8)}, device_speed=speed)
        want = np.maximum((x @ w).reshape(2, -1), 0)
        if not result.placement.cloud_ops:
            got = ef.Interpreter(out / "device.efl").get_signature_runner("infer_local")(x=x)["y"]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert reader.load(out / "device.efl") is not None
