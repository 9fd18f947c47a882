"""Re-choosing the cut at run time (Neurosurgeon's adaptivity): a device package planned
for a slow 3G link runs everything on the device; on a fast link (loopback) the device
measures the link, plans again, and moves work to the cloud, with results unchanged."""
import logging
import pathlib

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import metadata, reader, writer
from edgeflow.splitter import Link, partition
from edgeflow.splitter.adaptive import Replanner
from edgeflow.splitter.package import split_file

from edgeflow.cloud import CloudDelegate, Server

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("adaptive")
    onnx_converter.convert(DATA / "mobilenetv2.onnx", root / "m.efl")
    # A slow device (1/20 of this machine) on 3G: uploading the image costs more than
    # running the whole model here, so the plan keeps every op on the device.
    result = split_file(root / "m.efl", root / "out", link="3g", device_speed=0.05)
    assert set(result.placement.side.values()) == {"device"}
    return root / "m.efl", result


def test_moves_the_cut_when_the_measured_link_is_fast(split, caplog):
    original, result = split
    whole = ef.Interpreter(original).get_signature_runner("infer")
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = whole(image=x)["logits"]
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        first = CloudDelegate(server.address)
        device = ef.Interpreter(result.paths["device"], delegates=[first])
        runner = device.get_signature_runner("infer")
        with caplog.at_level(logging.INFO, logger="edgeflow"):
            for _ in range(3 * runner.replanner.every):
                # Not bit for bit: the server in this process changes BLAS's threading, and
                # with it the order of the GEMMs' sums (seen: 3e-8 apart).
                np.testing.assert_allclose(runner(image=x)["logits"], want, rtol=1e-5, atol=1e-6)
    assert runner.replanner.replans == 1  # moved once, then stayed
    assert runner.interpreter is not device and runner.cloud is not first
    assert runner.cloud.calls >= runner.replanner.every and runner.cloud in runner.interpreter.delegates
    assert first.calls == 0  # the first cut never called the cloud
    moved = [r.getMessage() for r in caplog.records if "re-planned" in r.getMessage()]
    assert len(moved) == 1 and "was 31" in moved[0]
    link = runner.replanner.link
    assert link.name == "measured" and link.rtt_s < Link.parse("3g").rtt_s


def test_proposals_follow_the_link(split):
    _, result = split
    info = metadata.split(reader.load(result.paths["device"]))
    planner = Replanner(info)
    assert planner.propose(Link.parse("3g")) is None  # what it was planned for: keep it
    fast = Link(1e9, 1e9, 0.0005)
    proposed = planner.propose(fast)
    assert proposed is not None and len(proposed) < len(planner.current)
    # The new device package runs the same function, with send/recv where the cut moved.
    model = planner.recut(reader.load(result.paths["device"]), proposed)
    sends = [op.attrs["key"] for op in model.subgraphs[0].operators if op.opcode == "send"]
    assert sends and planner.current == proposed
    whole = reader.load(split[0])
    rebuilt = partition.original_model(model)
    assert [op.opcode for op in rebuilt.subgraphs[0].operators] == \
        [op.opcode for op in whole.subgraphs[0].operators]
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    np.testing.assert_array_equal(
        ef.Interpreter(writer.to_bytes(rebuilt)).get_signature_runner("infer")(image=x)["logits"],
        ef.Interpreter(split[0]).get_signature_runner("infer")(image=x)["logits"])
