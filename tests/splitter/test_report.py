"""The plan report: JSON, table and SVG say what the placement and the costs say."""
import json

import numpy as np
import pytest

from edgeflow.splitter import CostGraph, CostOp, CostTensor, Link, plan
from edgeflow.splitter import report



@pytest.fixture
def case():
    """x -> a (device-pinned) -> b, c (cheap on the cloud) -> d = b + c; and e = tanh(a),
    an output the device keeps. Names with XML's special characters."""
    t = [CostTensor("x", np.float32, (100,)), CostTensor("a", np.float32, (50,)),
         CostTensor("b<1>", np.float32, (50,)), CostTensor("c&", np.float32, (50,)),
         CostTensor("d", np.float32, (5,), is_output=True),
         CostTensor("e", np.float32, (50,), is_output=True)]
    ops = [CostOp("a", "conv", ["x"], ["a"], 0.002, 0.0002, {"w": 4096}, pinned="device"),
           CostOp("b<1>", "matmul", ["a"], ["b<1>"], 0.050, 0.001),
           CostOp("c&", "matmul", ["a"], ["c&"], 0.050, 0.001),
           CostOp("d", "add", ["b<1>", "c&"], ["d"], 0.001, 0.0001),
           CostOp("e", "tanh", ["a"], ["e"], 0.0001, 0.0001)]
    cg = CostGraph(ops, t)
    link = Link(8e6, 16e6, 0.01, "test")
    return cg, link, plan(cg, link, margin=0, min_gain_s=0)


def test_the_case_splits_as_expected(case):
    cg, link, p = case
    assert p.side == {"a": "device", "b<1>": "cloud", "c&": "cloud", "d": "cloud", "e": "device"}
    assert p.cut_tensors == [("a", 200)] and p.download_tensors == [("d", 20)]


def test_json(case):
    cg, link, p = case
    doc = json.loads(json.dumps(report.to_json(p, cg, link)))
    assert set(doc) == {"objective", "exact", "link", "compression", "predicted_s", "breakdown",
                        "device_memory_bytes", "ops", "upload", "download"}
    assert doc["link"] == {"name": "test", "up_bps": 8e6, "down_bps": 16e6, "rtt_s": 0.01, "overhead_s": 0.0}
    assert {o["name"]: o["side"] for o in doc["ops"]} == p.side
    assert doc["ops"][0] == {"name": "a", "opcode": "conv", "side": "device", "pinned": "device",
                             "device_s": 0.002, "cloud_s": 0.0002, "param_bytes": 4096, "flops": 0}
    assert doc["upload"] == [{"name": "a", "bytes": 200, "seconds": pytest.approx(200 * 8 / 8e6)}]
    assert doc["download"] == [{"name": "d", "bytes": 20, "seconds": pytest.approx(20 * 8 / 16e6)}]
    # device a + e, cloud b + c + d, up 200 B, down 20 B, one RTT
    want = 0.0021 + 0.0021 + 200 * 8 / 8e6 + 20 * 8 / 16e6 + 0.01
    assert doc["predicted_s"]["split"] == pytest.approx(want)
    assert doc["predicted_s"]["device_only"] == pytest.approx(0.1031)
    assert doc["breakdown"]["up_bytes"] == 200 and doc["breakdown"]["rtt_s"] == 0.01


def test_table(case):
    cg, link, p = case
    text = report.table(p, cg, link)
    first, last = {}, {}
    for line in text.splitlines():
        if line.strip():
            first.setdefault(line.split()[0], line.split())
            last[line.split()[0]] = line.split()
    rows = first  # the op table comes first, the predictions last
    assert rows["b<1>"][:3] == ["b<1>", "matmul", "cloud"] and rows["a"][-1] == "device"
    assert rows["a"][3:5] == ["2.000", "0.200"]  # ms on each side
    assert "up 8 Mbps, down 16 Mbps, RTT 10 ms" in text
    assert last["split"][1:] == [f"{p.predicted['split'] * 1e3:.3f}", "1.00x"]
    assert last["device-only"][1:] == ["103.100", f"{0.1031 / p.predicted['split']:.2f}x"]
    assert last["cloud-only"][1] == f"{p.predicted['cloud_only'] * 1e3:.3f}"
    assert any(line.split()[:3] == ["a", "up", "200"] for line in text.splitlines())
