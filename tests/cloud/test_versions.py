"""One server for every cut and every version of a model (issue 17, finding 2).

Two splits of one model (other links, other cuts) give the same cloud package, which one
server hosts once and which serves both device packages; a new version of the model
(other weights) under the same id is hosted beside the old one, each device served by
the version its package names; `serve --model-dir` skips device packages. Every result
is checked against the model computed in numpy (the independent reference).
"""
import hashlib
import logging
import os
import shutil

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cloud import Client, CloudDelegate, Server
from edgeflow.errors import EdgeflowError, RemoteError
from edgeflow.format import metadata, reader
from edgeflow.splitter import partition, training
from edgeflow.splitter.package import split_file


def weights(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)


def build(path, seed):
    """x -> h = relu(x @ w1) -> t = tanh(h) -> y = t @ w2."""
    w1, w2 = weights(seed)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 6], name="x")
        h = ef.nn.relu(ef.matmul(x, ef.constant(w1, name="w1")), name="h")
        y = ef.matmul(ef.tanh(h, name="t"), ef.constant(w2, name="w2"), name="y")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"y": y})})
    return path


def reference(x, seed):
    w1, w2 = weights(seed)
    return np.tanh(np.maximum(x @ w1, 0)) @ w2


X = np.random.default_rng(7).standard_normal((5, 6)).astype(np.float32)
SPLITS = {"3g": ["h"], "wifi": ["t"]}  # link -> forced cut: different device ops, different uploads


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run_device(path, address, x=X):
    cloud = CloudDelegate(address, timeout=30)
    runner = ef.Interpreter(path, delegates=[cloud]).get_signature_runner("infer")
    got = runner(x=x)["y"]
    assert cloud.calls == 1 and runner.fallbacks == 0  # it ran split, not alone
    return got


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """{(version, link): SplitResult}: version 1 split for 3g and wifi, version 2 (other
    weights) for wifi, all under model id "mlp"."""
    root = tmp_path_factory.mktemp("versions")
    out = {}
    for version, links in ((1, ("3g", "wifi")), (2, ("wifi",))):
        model = build(root / f"mlp-v{version}.efl", seed=version)
        for link in links:
            out[version, link] = split_file(model, root / f"v{version}-{link}", link=link, cut=SPLITS[link],
                                            model_id="mlp")
    return out


def test_two_splits_of_one_model_are_one_cloud_package_served_by_one_server(versions, tmp_path, caplog):
    a, b = versions[1, "3g"], versions[1, "wifi"]
    assert a.placement.side != b.placement.side  # two different cuts
    # Finding 2: the cloud package held a signature of its cut: two cuts, two SHA-256.
    assert open(a.paths["cloud"], "rb").read() == open(b.paths["cloud"], "rb").read()
    assert a.cloud_sha256 == b.cloud_sha256 == sha(a.paths["cloud"])
    # Both folders served as they are, device.efl files included.
    served = tmp_path / "served"
    served.mkdir()
    for link, result in (("3g", a), ("wifi", b)):
        for kind in ("cloud", "device"):
            shutil.copy(result.paths[kind], served / f"{link}-{kind}.efl")
    with caplog.at_level(logging.INFO, logger="edgeflow.cloud"):
        with Server(served) as server:
            assert list(server.models) == ["mlp"] and len(server.models.all()) == 1
            for result in (a, b):
                np.testing.assert_allclose(run_device(result.paths["device"], server.address), reference(X, 1),
                                           rtol=1e-5, atol=1e-6)
    skipped = [r.getMessage() for r in caplog.records if "a device package" in r.getMessage()]
    assert len(skipped) == 2 and all("skipping" in m and "mlp" in m for m in skipped)
    assert any("the same package as" in r.getMessage() for r in caplog.records)


def test_a_new_version_is_hosted_beside_the_old_one(versions, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    old, new = served / "mlp-old.efl", served / "mlp-new.efl"
    shutil.copy(versions[1, "3g"].paths["cloud"], old)
    shutil.copy(versions[2, "wifi"].paths["cloud"], new)
    os.utime(old, (1_000_000_000, 1_000_000_000))  # the older file: new.efl is the default version
    old_sha, new_sha = sha(old), sha(new)
    assert old_sha != new_sha
    with Server(served) as server:
        # Finding 2: "model id 'mlp' is taken": the second file was skipped, and devices of
        # the other version got FAILED_PRECONDITION.
        for (version, link), result in versions.items():
            np.testing.assert_allclose(run_device(result.paths["device"], server.address), reference(X, version),
                                       rtol=1e-5, atol=1e-6, err_msg=f"version {version}, split for {link}")
        with Client(server.address, timeout=30) as client:
            listed = client.list_models()
            assert list(listed) == ["mlp"] and listed["mlp"]["sha256"] == new_sha
            assert [v["sha256"] for v in listed["mlp"]["versions"]] == [old_sha, new_sha]
            # A request naming no version gets the newest; one naming a version, that one.
            np.testing.assert_allclose(client.run("mlp", {"x": X}, ["y"])["y"], reference(X, 2), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(client.run("mlp", {"x": X}, ["y"], sha256=old_sha.upper())["y"],
                                       reference(X, 1), rtol=1e-5, atol=1e-6)
            with pytest.raises(RemoteError) as info:
                client.run("mlp", {"x": X}, ["y"], sha256="0" * 64)
            assert info.value.code == "FAILED_PRECONDITION"
            assert old_sha in info.value.details and new_sha in info.value.details


def test_versions_given_directly_and_device_packages_refused(versions):
    old, new = versions[1, "3g"].paths["cloud"], versions[2, "wifi"].paths["cloud"]
    with Server(models={"mlp": [old, new, open(old, "rb").read()]}) as server:  # oldest first; old twice
        assert [v.sha256 for v in server.models.versions("mlp")] == [sha(old), sha(new)]
        assert server.models["mlp"].sha256 == sha(new)
    with pytest.raises(EdgeflowError, match="device package"):
        Server(models={"mlp": versions[1, "3g"].paths["device"]})


def test_packages_say_their_role(versions, tmp_path):
    result = versions[1, "wifi"]
    assert metadata.role(reader.load(result.paths["cloud"])) == "cloud"
    assert metadata.role(reader.load(result.paths["device"])) == "device"
    plain = reader.load(build(tmp_path / "plain.efl", seed=1))
    assert metadata.role(plain) is None
    # A cloud package split again: its device package is a device package, its cloud package a cloud one.
    again = split_file(result.paths["cloud"], tmp_path / "again", cut=["h"], model_id="mlp")
    assert metadata.role(reader.load(again.paths["device"])) == "device"
    assert open(again.paths["cloud"], "rb").read() == open(result.paths["cloud"], "rb").read()


def test_a_cloud_graph_cut_package_is_one_version_per_cut(versions, tmp_path):
    """--cloud-graph cut keeps only the cloud ops: one file per cut, each a version of the
    id that the server hosts side by side."""
    model = versions[1, "3g"].paths["cloud"]
    cuts = [split_file(model, tmp_path / link, link=link, cut=cut, model_id="mlp", cloud_graph="cut")
            for link, cut in SPLITS.items()]
    assert cuts[0].cloud_sha256 != cuts[1].cloud_sha256 and not cuts[0].cut_independent
    with Server(models={"mlp": [c.paths["cloud"] for c in cuts]}) as server:
        for c in cuts:
            np.testing.assert_allclose(run_device(c.paths["device"], server.address), reference(X, 1),
                                       rtol=1e-5, atol=1e-6)


def test_training_cloud_packages_do_not_depend_on_the_cut(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 6], name="x")
        y = ef.placeholder(ef.float32, [None, 3], name="y")
        h = ef.layers.dense(x, 8, activation=ef.nn.relu, name="d1")
        p = ef.layers.dense(h, 3, name="d2")
        loss = ef.losses.mean_squared_error(y, p)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, tmp_path / "t.efl", signatures={"train": ({"x": x, "y": y}, {"loss": loss}, [step]),
                                               "infer": ({"x": x}, {"p": p})})
    model = reader.load(tmp_path / "t.efl")
    sub = model.subgraphs[0]
    first_layer = {i for i, op in enumerate(sub.operators) if op.outputs
                   and sub.tensors[op.outputs[0]].name.startswith("d1")}
    assert first_layer
    files, devices = [], []
    for k, device in enumerate((set(), first_layer)):
        (tmp_path / str(k)).mkdir()
        training.write_pair(model, device, tmp_path / str(k), model_id="t")
        files.append(open(tmp_path / str(k) / "cloud.efl", "rb").read())
        devices.append(open(tmp_path / str(k) / "device.efl", "rb").read())
    assert devices[0] != devices[1] and files[0] == files[1]
    cloud = reader.load(tmp_path / "0" / "cloud.efl")
    assert metadata.role(cloud) == "cloud" and metadata.model_id(cloud) == "t"
    assert metadata.role(reader.load(tmp_path / "1" / "device.efl")) == "device"


def test_a_weight_the_device_transforms_crosses_to_the_cut_independent_package(tmp_path):
    """A device op computing from weights alone (here a transposed weight that a cloud op
    reads too) sends its output: the whole-model cloud package, with no signature of the
    cut to name it an input, takes it as a feed, and still never gives it out."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        wt = ef.transpose(ef.constant(w, name="w"), name="wt")
        y = ef.matmul(ef.matmul(x, ef.transpose(wt, name="wtt"), name="h"), wt, name="y")
    ef.save(g, tmp_path / "m.efl", signatures={"infer": ({"x": x}, {"y": y})})
    model = reader.load(tmp_path / "m.efl")
    sub = model.subgraphs[0]
    device = {i for i, op in enumerate(sub.operators) if sub.tensors[op.outputs[0]].name in ("wt", "wtt", "h")}
    cut, digest = partition.write_pair(model, device, tmp_path, model_id="m")
    assert cut.names(cut.uploads) == ["h", "wt"]
    with Server(models={"m": tmp_path / "cloud.efl"}) as server:
        np.testing.assert_allclose(run_device(tmp_path / "device.efl", server.address, X[:, :3]), X[:, :3] @ w @ w.T,
                                   rtol=1e-5)
        with Client(server.address, timeout=30) as client:
            with pytest.raises(RemoteError, match="does not give out"):
                client.run("m", {"x": X[:, :3]}, ["wt"], sha256=digest)
