"""Profiles: saved and loaded, refused when malformed, measured with and without a delegate."""
import json

import numpy as np
import pytest

from edgeflow.errors import FormatError
from edgeflow.interp.delegate import Delegate
from edgeflow.interp.kernels import KERNELS
from edgeflow.splitter import Profile, measure_profile


def test_profile_round_trip_and_bad_files(tmp_path):
    p = Profile("pixel-7 (numpy)", {"m1": 1.5e-4, "h": 2e-6}, runs=20, shapes={"x": (3, 8)})
    path = tmp_path / "p.json"
    p.save(path)
    assert Profile.load(path) == p
    Profile("other", {}, 1).save(path)  # over an existing file; no temporary left behind
    assert Profile.load(path).device == "other"
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]
    good = json.loads(path.read_text())
    bad_docs = [b"\x00\xff", b'{"format": "edgeflow-prof', b"[1, 2]",
                json.dumps({**good, "format": "other"}).encode(),
                json.dumps({**good, "version": 2}).encode(),
                json.dumps({**good, "seconds": {"m1": -1}}).encode(),
                json.dumps({**good, "seconds": {"m1": "fast"}}).encode(),
                json.dumps({**good, "seconds": [1]}).encode(),
                json.dumps({**good, "runs": True}).encode(),
                json.dumps({**good, "shapes": {"x": [1, -2]}}).encode(),
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
