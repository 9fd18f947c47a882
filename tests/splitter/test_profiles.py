"""Profiles: saved and loaded, refused when malformed, measured with and without a delegate."""
import json
import time

import numpy as np
import pytest

from edgeflow.errors import FormatError, InvalidInputError
from edgeflow.interp.delegate import Delegate
from edgeflow.interp.kernels import KERNELS
from edgeflow.splitter import Profile, measure_profile


def test_profile_round_trip_and_bad_files(tmp_path):
    p = Profile("pixel-7 (numpy)", {"m1": 1.5e-4, "h": 2e-6}, runs=20, shapes={"x": (3, 8)},
                total=2e-4, scale=1.3)
    path = tmp_path / "p.json"
    p.save(path)
    assert Profile.load(path) == p
    Profile("other", {}, 1).save(path)  # over an existing file; no temporary left behind
    assert Profile.load(path).device == "other"
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]
    older = json.loads(path.read_text())
    del older["total"], older["scale"]  # profiles written before whole runs were timed
    path.write_text(json.dumps(older))
    assert (Profile.load(path).total, Profile.load(path).scale) == (0.0, 1.0)
    good = json.loads(path.read_text())
    bad_docs = [b"\x00\xff", b'{"format": "edgeflow-prof', b"[1, 2]",
                json.dumps({**good, "format": "other"}).encode(),
                json.dumps({**good, "version": 2}).encode(),
                json.dumps({**good, "seconds": {"m1": -1}}).encode(),
                json.dumps({**good, "seconds": {"m1": "fast"}}).encode(),
                json.dumps({**good, "seconds": [1]}).encode(),
                json.dumps({**good, "runs": True}).encode(),
                json.dumps({**good, "shapes": {"x": [1, -2]}}).encode(),
                json.dumps({**good, "total": -1}).encode(),
                json.dumps({**good, "scale": "x2"}).encode(),
                json.dumps({k: v for k, v in good.items() if k != "device"}).encode()]
    for doc in bad_docs:
        path.write_bytes(doc)
        with pytest.raises(FormatError):
            Profile.load(path)


class HostDelegate(Delegate):
    """Claims relu, reshape and tanh, and runs its partitions with the numpy kernels: a
    delegate whose partitions the profiler can only time as a whole."""

    name = "host"

    def unsupported(self, op, ins, outs):
        return None if op.opcode in ("relu", "reshape", "tanh") else "not claimed"

    def compile(self, partition):
        steps = [KERNELS[op.opcode]([partition.arrays[t] for t in op.inputs],
                                    [partition.arrays[t] for t in op.outputs], op.attrs)
                 for _, op in partition.ops if op.opcode != "reshape"]  # reshape: a view
        return lambda: [step() for step in steps]


def test_measured_profile_shares_a_partition_by_estimated_cost(model_path):
    x = np.ones((3, 8), np.float32)
    measured = measure_profile(model_path, inputs={"x": x}, runs=2, delegates=[HostDelegate()])
    # Steps: m1 (CPU), [h, r, z] (one partition), s (CPU), y (CPU). relu and tanh do the
    # same work by the estimate (48 operations, 384 bytes), so they get equal halves of
    # the partition's time; the reshape, none.
    assert sorted(measured.seconds) == ["h", "m1", "r", "s", "y", "z"]
    assert measured.seconds["r"] == 0 and measured.seconds["h"] == measured.seconds["z"] > 0
    assert measured.device.endswith("numpy+host)")


def test_profile_scales_op_medians_to_the_whole_run(model_path, monkeypatch):
    # A device that loses time between ops, as one held to a CPU quota does when a run
    # outlasts its slice: every op timed alone is fast, every whole run 20 ms slower.
    from edgeflow.interp import profiler
    run = profiler.Profiler.run

    def throttled(self, plan):
        run(self, plan)
        time.sleep(0.02)

    monkeypatch.setattr(profiler.Profiler, "run", throttled)
    x = {"x": np.ones((3, 8), np.float32)}
    raw = measure_profile(model_path, inputs=x, runs=3, scale="none")
    scaled = measure_profile(model_path, inputs=x, runs=3)
    assert raw.scale == 1.0 and sum(raw.seconds.values()) < 0.02 <= raw.total
    assert scaled.total >= 0.02 and scaled.scale > 1
    assert sum(scaled.seconds.values()) == pytest.approx(scaled.total)
    with pytest.raises(InvalidInputError, match="scale must be"):
        measure_profile(model_path, inputs=x, runs=1, scale="ops")
