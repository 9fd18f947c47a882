"""The network between the device and the server, and what a tensor costs on it.

A `Link` is uplink and downlink bandwidth (bits per second), round trip time, and the
fixed cost of one call beyond the RTT (`overhead_s`: the RPC stack on both ends,
serializing, the server's dispatch; paid once per round trip, however small the
tensors); `LINKS` holds typical 3G, 4G and Wi-Fi figures; `Link.parse` reads "4g",
"up=5.85,down=20,rtt=50ms,overhead=3ms" or "4g,rtt=120ms". Activations that cross it may
be compressed on the wire: "none" (4 bytes per float32), "fp16" (2) or "int8" (1 byte per
element plus a 4-byte scale per tensor), both ways, as edgeflow.cloud's wire encodes them;
only float32 tensors are compressed, other dtypes travel raw.
"""
import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError

COMPRESSIONS = ("none", "fp16", "int8")


@dataclass(frozen=True)
class Link:
    """A network link: bandwidths in bits per second, round trip time and per-call
    overhead (beyond the RTT) in seconds."""

    up_bps: float
    down_bps: float
    rtt_s: float
    name: str = ""
    overhead_s: float = 0.0

    def __post_init__(self):
        for key in ("up_bps", "down_bps"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InvalidInputError(f"Link: {key} must be a positive number of bits per "
                                        f"second, got {v!r}")
        if not (isinstance(self.rtt_s, (int, float)) and math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise InvalidInputError(f"Link: rtt_s must be a number of seconds >= 0, got {self.rtt_s!r}")
        if not (isinstance(self.overhead_s, (int, float)) and math.isfinite(self.overhead_s)
                and self.overhead_s >= 0):
            raise InvalidInputError(f"Link: overhead_s must be a number of seconds >= 0, got {self.overhead_s!r}")

    @property
    def round_trip_s(self):
        """Seconds one round trip costs besides its bytes: RTT plus per-call overhead."""
        return self.rtt_s + self.overhead_s

    def up_s(self, nbytes):
        """Seconds to send `nbytes` up."""
        return nbytes * 8.0 / self.up_bps

    def down_s(self, nbytes):
        """Seconds to receive `nbytes`."""
        return nbytes * 8.0 / self.down_bps

    def describe(self):
        label = f"{self.name}: " if self.name else ""
        return (f"{label}up {self.up_bps / 1e6:g} Mbps, down {self.down_bps / 1e6:g} Mbps, "
                f"RTT {self.rtt_s * 1e3:g} ms" + (f" + {self.overhead_s * 1e3:.3g} ms per call"
                                                  if self.overhead_s else ""))

    @classmethod
    def measured(cls, stats, fallback):
        """A Link from what a cloud client measured (an edgeflow.cloud.LinkStats: its
        up_bytes_per_s, down_bytes_per_s, min_rtt_s and overhead_s), for re-planning at run
        time; figures not measured yet (None) come from `fallback` (a Link or a spec)."""
        fallback = cls.parse(fallback)
        up, down, rtt = stats.up_bytes_per_s, stats.down_bytes_per_s, stats.min_rtt_s
        overhead = getattr(stats, "overhead_s", None)
        return cls(up * 8.0 if up else fallback.up_bps, down * 8.0 if down else fallback.down_bps,
                   rtt if rtt is not None else fallback.rtt_s, "measured",
                   overhead if overhead is not None else fallback.overhead_s)

    @classmethod
    def parse(cls, spec):
        """A Link from a profile name ("3g", "4g", "wifi"), explicit figures
        ("up=5.85,down=20,rtt=50ms,overhead=3ms"), or a name with overrides ("4g,rtt=120ms").

        Bandwidths are in Mbps unless suffixed (bps, kbps, mbps, gbps); the RTT and the
        per-call overhead are in seconds unless suffixed (ms, s). Without a profile name,
        `up` is required, `down` defaults to `up`, `rtt` to 0 and `overhead` to
        DEFAULT_OVERHEAD_S. InvalidInputError on anything else.
        """
        if isinstance(spec, Link):
            return spec
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidInputError(f"link: expected one of {sorted(LINKS)} or "
                                    f"'up=MBPS,down=MBPS,rtt=SECONDS', got {spec!r}")
        base, given = None, {}
        for part in (p.strip() for p in spec.split(",")):
            if "=" not in part:
                if base is not None or part.lower() not in LINKS:
                    raise InvalidInputError(f"link {spec!r}: {part!r} is not a link profile; "
                                            f"known: {sorted(LINKS)}")
                base = LINKS[part.lower()]
                continue
            key, _, value = (s.strip().lower() for s in part.partition("="))
            if key not in ("up", "down", "rtt", "overhead") or key in given:
                raise InvalidInputError(f"link {spec!r}: expected keys up, down, rtt and overhead "
                                        f"once each, got {key!r}")
            seconds = key in ("rtt", "overhead")
            given[key] = _quantity(value, _RTT_UNITS if seconds else _BANDWIDTH_UNITS,
                                   "s" if seconds else "mbps", f"link {spec!r}: {key}")
        if base is None and "up" not in given:
            raise InvalidInputError(f"link {spec!r}: give a profile name ({sorted(LINKS)}) or up=MBPS")
        up = given.get("up", base.up_bps if base else None)
        down = given.get("down", base.down_bps if base else up)
        rtt = given.get("rtt", base.rtt_s if base else 0.0)
        overhead = given.get("overhead", base.overhead_s if base else DEFAULT_OVERHEAD_S)
        name = base.name + ("*" if given else "") if base else ""
        return cls(up, down, rtt, name, overhead)


_BANDWIDTH_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
_RTT_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _quantity(text, units, default, what):
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)", text)
    if not m or (m.group(2) or default) not in units:
        raise InvalidInputError(f"{what}: expected a number with an optional unit "
                                f"({', '.join(units)}), got {text!r}")
    return float(m.group(1)) * units[m.group(2) or default]


# The fixed cost of one Run call beyond the RTT, for plans made before anything is
# measured (a device measures its own: edgeflow.cloud.LinkStats.overhead_s). Issue 17
# measured an empty RPC from a device with 20% of a core at the RTT + 2-3 ms; on this
# project's shared 2-core test machine, with `edgeflow serve` in another process over
# loopback, Client.measure_overhead gives 1.9-2.2 ms beyond a 0.54-0.62 ms best empty
# Ping, and a split's small Run calls took a median 3.4 ms besides their compute.
DEFAULT_OVERHEAD_S = 0.003

# Uplinks are DADS's (Hu et al., "Dynamic Adaptive DNN Surgery for Inference Acceleration
# on the Edge", INFOCOM 2019), which took them from Neurosurgeon's measurements (Kang et
# al., ASPLOS 2017). Downlinks and RTTs are typical figures for those networks (our
# assumption, not the papers'): override them with "4g,down=..,rtt=..".
LINKS = {
    "3g": Link(1.1e6, 3e6, 0.150, "3g", DEFAULT_OVERHEAD_S),
    "4g": Link(5.85e6, 20e6, 0.060, "4g", DEFAULT_OVERHEAD_S),
    "wifi": Link(18.88e6, 50e6, 0.020, "wifi", DEFAULT_OVERHEAD_S),
}


def wire_bytes(dtype, elements, compression="none"):
    """Bytes a tensor takes on the wire under `compression` (see the module docstring)."""
    dtype = np.dtype(dtype)
    if dtype != np.float32 or compression == "none":
        return elements * dtype.itemsize
    if compression == "fp16":
        return elements * 2
    if compression == "int8":
        return elements + 4
    raise InvalidInputError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
