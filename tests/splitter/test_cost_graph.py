"""Cost graphs built from real models: estimated and measured op times, pins, device memory,
a planned split that runs, training costs."""
import logging

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import InvalidInputError
from edgeflow.splitter import CostGraph, Profile, forced, measure_profile, partition, plan
from edgeflow.splitter.profiles import (REFERENCE_BYTES_PER_S, REFERENCE_FLOPS_PER_S,
                                       REFERENCE_OP_OVERHEAD_S)



def test_from_model_estimates(model_path):
    cg = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)})
    assert [op.name for op in cg.ops] == ["m1", "h", "r", "z", "s", "y"]  # the interpreter's order
    assert [op.opcode for op in cg.ops] == ["matmul", "relu", "reshape", "tanh", "reduce_sum", "exp"]
    assert [op.pinned for op in cg.ops] == ["device", None, None, None, "cloud", None]
    t = cg.tensors
    assert [(n, t[n].nbytes) for n in t] == [("x", 96), ("m1", 192), ("h", 192), ("r", 192),
                                             ("z", 192), ("s", 48), ("y", 48)]
    assert t["x"].producer is None and t["h"].consumers == (2, 3) and t["r"].consumers == (4,)
    assert [n for n in t if t[n].is_output] == ["z", "y"] and t["r"].view_of == "h"
    m1, h, r = cg.op("m1"), cg.op("h"), cg.op("r")
    assert m1.params == {"w1": 8 * 16 * 4} and m1.flops == 2 * 8 * 3 * 16  # w1: float32[8, 16]
    # Hand-counted: m1 reads x (96 B) and w1 (512 B) and writes 192 B; relu reads and
    # writes 192 B and does one operation per element.
    flop_s, byte_s, overhead = REFERENCE_FLOPS_PER_S, REFERENCE_BYTES_PER_S, REFERENCE_OP_OVERHEAD_S
    want_m1 = 768 / flop_s + (96 + 512 + 192) / byte_s + overhead
    want_h = 48 / flop_s + 384 / byte_s + overhead
    assert m1.device_s == pytest.approx(want_m1) and m1.cloud_s == pytest.approx(want_m1 / 10)
    assert h.device_s == pytest.approx(want_h) and h.cloud_s == pytest.approx(want_h / 10)
    assert r.device_s == 0 and r.cloud_s == 0  # a reshape is a view: no kernel runs
    slow = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)}, device_speed=0.5,
                                server_speed=20)
    assert slow.op("m1").device_s == pytest.approx(2 * want_m1)
    assert slow.op("m1").cloud_s == pytest.approx(want_m1 / 20)
    default = CostGraph.from_model(model_path)  # the dynamic batch becomes 1
    assert default.tensors["x"].shape == (1, 8)


def test_from_model_pins_and_bad_arguments(model_path):
    cg = CostGraph.from_model(model_path, pins={"z": "cloud", "m1": None})
    assert cg.op("z").pinned == "cloud" and cg.op("m1").pinned is None
    with pytest.raises(InvalidInputError, match="unknown op"):
        CostGraph.from_model(model_path, pins={"nope": "cloud"})
    with pytest.raises(InvalidInputError, match="no input"):
        CostGraph.from_model(model_path, input_shapes={"q": (1, 8)})
    with pytest.raises(InvalidInputError, match="expected shape"):
        CostGraph.from_model(model_path, input_shapes={"x": (1, 9)})
    with pytest.raises(InvalidInputError, match="no signature"):
        CostGraph.from_model(model_path, signature="train")
    with pytest.raises(InvalidInputError, match="device_speed"):
        CostGraph.from_model(model_path, device_speed=0)


def test_from_model_with_measured_profiles(model_path, tmp_path, caplog):
    measured = measure_profile(model_path, inputs={"x": np.ones((3, 8), np.float32)}, runs=3)
    assert sorted(measured.seconds) == ["h", "m1", "s", "y", "z"]  # the reshape runs no kernel
    assert all(s > 0 for s in measured.seconds.values()) and measured.runs == 3
    assert measured.shapes == {"x": (3, 8)}
    measured.save(tmp_path / "device.json")
    device = Profile.load(tmp_path / "device.json")
    cg = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)}, device_profile=device)
    for name, s in device.seconds.items():
        assert cg.op(name).device_s == s
        assert cg.op(name).cloud_s == pytest.approx(s / 10)  # no server profile: the speed ratio
    with caplog.at_level(logging.WARNING, logger="edgeflow"):
        CostGraph.from_model(model_path, device_profile=device)  # planned at batch 1
    assert "measured at input shapes {'x': (3, 8)}, the plan is for {'x': (1, 8)}" in caplog.text
    server = Profile("server", {"m1": 1e-6})
    cg = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)}, server_profile=server,
                              server_speed=4)
    assert cg.op("m1").cloud_s == 1e-6 and cg.op("m1").device_s == pytest.approx(4e-6)
    with pytest.raises(InvalidInputError, match="no signature"):
        measure_profile(model_path, signature="nope")


def test_device_memory_hand_computed(model_path):
    cg = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)})
    assert [op.name for op in cg.ops] == ["m1", "h", "r", "z", "s", "y"]
    # Everything on the device: live bytes at steps m1 h r z s y are x+m1=288, m1+h=384,
    # h=192 (r is a view of h), h+z=384, h+z+s=432, z+s+y=288, then z+y=240 at the end.
    # Weights: w1, 512.
    assert cg.device_memory([True] * 6) == (512, 432)
    # Device runs m1, h, r: h is kept to the end to be sent (z reads it, and s reads r).
    assert cg.device_memory([True, True, True, False, False, False]) == (512, 384)
    # Device runs m1, h, z: h is sent (r reads it on the cloud) and z, an output, stays:
    # x+m1=288, m1+h=384, h+z=384, h+z=384 at the end.
    assert cg.device_memory([True, True, False, True, False, False]) == (512, 384)
    # With bigger inputs the peak moves: at batch 30, x is 960 B, the others 10x too.
    big = CostGraph.from_model(model_path, input_shapes={"x": (30, 8)})
    assert big.device_memory([True] * 6) == (512, 4320)
    assert cg.device_memory([False] * 6) == (0, 96)  # only the input, to send


def test_a_planned_split_runs_and_matches_numpy(model_path, numpy_reference):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    interp = ef.Interpreter(model_path)
    cg = CostGraph.from_model(model_path, input_shapes={"x": (3, 8)})
    placements = [plan(cg, link) for link in ("3g", "4g", "wifi", "up=1000,rtt=0")]
    placements.append(forced(cg, ["h"], "4g"))
    sub = interp.model.subgraphs[0]
    for p in placements:
        assert p.side["m1"] == "device" and p.side["s"] == "cloud"
        device_ops = p.device_operators(cg)
        assert sorted(sub.tensors[sub.operators[i].outputs[0]].name for i in device_ops) == \
            sorted(p.device_ops)
        # The partitioner, on its own, sends the same tensors and gets the same ones back.
        cut = partition.Cut(interp.model, device_ops)
        assert sorted(sub.tensors[t].name for t in cut.uploads) == sorted(n for n, _ in p.cut_tensors)
        assert sorted(sub.tensors[t].name for t in cut.downloads) == \
            sorted(n for n, _ in p.download_tensors)
        sent = [n for n, _ in p.cut_tensors]
        on_device = [n for n in ("y", "z") if n not in dict(p.download_tensors)]
        device_part = interp.run(sent + on_device, {"x": x})
        cloud_part = interp.run([n for n, _ in p.download_tensors], {n: device_part[n] for n in sent})
        want = numpy_reference(x)
        for name in ("y", "z"):
            got = cloud_part[name] if name in cloud_part else device_part[name]
            np.testing.assert_allclose(got, want[name], rtol=1e-5)


def test_training_costs_fold_backward_and_updates_into_the_forward_ops(tmp_path):
    """A training split plans on the forward graph: each forward op then costs its own
    time, its backward ops' and its variables' updates' (from the train step's graph)."""
    import json

    import edgeflow as ef
    from edgeflow.format import reader
    from edgeflow.splitter.package import _training_costs

    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 8], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        logits = ef.layers.dense(ef.layers.dense(x, 16, activation=ef.nn.relu, name="a"), 3, name="b")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, tmp_path / "m.efl", signatures={"train": ({"x": x, "y": y}, {"loss": loss}, [step]),
                                               "infer": ({"x": x}, {"logits": logits})})
    shapes = {"x": (4, 8), "y": (4,)}
    forward = CostGraph.from_model(tmp_path / "m.efl", "infer", {"x": (4, 8)})
    train = CostGraph.from_model(tmp_path / "m.efl", "train", shapes)
    model = reader.load(tmp_path / "m.efl")
    folded = _training_costs(model, tmp_path / "m.efl", forward, shapes, (None, None), 1.0, 10.0)
    roles = json.loads(bytes(model.metadata["edgeflow.roles"]).decode())
    planned = {op.operator for op in forward.ops}
    sub = model.subgraphs[0]
    # What the folded graph must hold: the planned forward ops, the backward ops of planned
    # ops, every update (all variables here are read by planned ops) and the variables'
    # gradient sums; not the loss's own ops nor their backward ops.
    def counted(op):
        i = op.operator
        if str(i) in roles["update"]:
            return True
        if str(i) in roles["grad"]:
            f = roles["grad"][str(i)]
            return f in planned or (f < 0 and sub.tensors[-1 - f].is_variable)
        return i in planned
    want = sum(op.device_s for op in train.ops if counted(op))
    assert sum(op.device_s for op in folded.ops) == pytest.approx(want, rel=1e-9)
    for a, b in zip(forward.ops, folded.ops):
        assert b.device_s >= a.device_s and b.cloud_s >= a.cloud_s
