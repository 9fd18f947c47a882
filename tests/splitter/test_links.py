"""Links: profiles, parsing, figures measured by the cloud client; bytes on the wire."""
from types import SimpleNamespace

import numpy as np
import pytest

from edgeflow.errors import InvalidInputError
from edgeflow.splitter import LINKS, Link, wire_bytes


def test_links():
    assert (LINKS["3g"].up_bps, LINKS["4g"].up_bps, LINKS["wifi"].up_bps) == (1.1e6, 5.85e6, 18.88e6)
    assert Link.parse("4g") == LINKS["4g"]
    link = Link.parse("up=2,down=8mbps,rtt=30ms")
    assert (link.up_bps, link.down_bps, link.rtt_s) == (2e6, 8e6, pytest.approx(0.03))
    link = Link.parse("WiFi, rtt=0.1")
    assert (link.up_bps, link.down_bps, link.rtt_s) == (18.88e6, LINKS["wifi"].down_bps, 0.1)
    link = Link.parse("up=500kbps")
    assert (link.up_bps, link.down_bps, link.rtt_s) == (5e5, 5e5, 0.0)
    assert Link(8e6, 16e6, 0).up_s(1000) == pytest.approx(1e-3)
    assert Link(8e6, 16e6, 0).down_s(1000) == pytest.approx(0.5e-3)
    for bad in ("5g", "rtt=1", "up=fast", "up=-1", "up=1,up=2", "4g,3g", "speed=3", ""):
        with pytest.raises(InvalidInputError):
            Link.parse(bad)
    with pytest.raises(InvalidInputError, match="up_bps"):
        Link(0, 1, 0)
    # What the cloud client measured (bytes per second), the rest from a profile.
    stats = SimpleNamespace(up_bytes_per_s=250_000.0, down_bytes_per_s=None, min_rtt_s=0.042)
    link = Link.measured(stats, "4g")
    assert (link.up_bps, link.down_bps, link.rtt_s) == (2e6, LINKS["4g"].down_bps, 0.042)
    assert link.overhead_s == LINKS["4g"].overhead_s  # not measured: the profile's


def test_the_per_call_overhead():
    assert LINKS["4g"].overhead_s == 0.003 and Link(1e6, 1e6, 0.01).overhead_s == 0.0
    link = Link.parse("up=2,rtt=30ms,overhead=2.5ms")
    assert (link.rtt_s, link.overhead_s) == (pytest.approx(0.03), pytest.approx(0.0025))
    assert Link.parse("up=2").overhead_s == 0.003  # a spec gets the default ...
    assert Link.parse("4g,overhead=0").overhead_s == 0.0  # ... unless it says otherwise
    assert link.round_trip_s == pytest.approx(0.0325)
    assert "+ 2.5 ms per call" in link.describe()
    for bad in ("up=1,overhead=-1ms", "up=1,overhead=fast", "up=1,overhead=1,overhead=2"):
        with pytest.raises(InvalidInputError):
            Link.parse(bad)
    with pytest.raises(InvalidInputError, match="overhead_s"):
        Link(1, 1, 0, "", float("nan"))
    stats = SimpleNamespace(up_bytes_per_s=None, down_bytes_per_s=None, min_rtt_s=0.01, overhead_s=0.004)
    assert Link.measured(stats, "4g").overhead_s == 0.004


def test_wire_bytes():
    assert wire_bytes(np.float32, 1000, "none") == 4000
    assert wire_bytes(np.float32, 1000, "fp16") == 2000
    assert wire_bytes(np.float32, 1000, "int8") == 1004
    for c in ("none", "fp16", "int8"):
        assert wire_bytes(np.int32, 1000, c) == 4000
        assert wire_bytes(np.int64, 10, c) == 80
    with pytest.raises(InvalidInputError, match="compression"):
        wire_bytes(np.float32, 10, "zip")
