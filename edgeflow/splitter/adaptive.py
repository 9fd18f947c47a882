"""Re-choosing the cut at run time from the link the device measures (Neurosurgeon's
adaptivity).

A device package split with both graphs "full" carries its cost graph and the link it
was planned for. While it runs, the cloud client measures the link: round trips of
empty pings, and throughput of transfers of at least 64 KiB (run calls, or ping loads
when no run has moved that much). Every `every` calls the `Replanner` plans again for
the measured link and, when another cut is predicted to be faster by more than
`min_gain`, cuts the original model there: a new device package in memory, paired with
the same cloud package (which holds the whole graph and so can start from any cut).
"""
import logging
import time

from ..errors import EdgeflowError
from ..format import metadata
from . import partition
from .cost_graph import CostGraph
from .links import Link
from .planner import cost, plan

_log = logging.getLogger("edgeflow")
PROBE_BYTES = 64 << 10  # a throughput sample; smaller transfers measure latency


class Replanner:
    """Plans a device package's cut again from measured link figures.

    `info`: the package's split metadata (edgeflow.format.metadata.split).
    `every`: calls between re-plans; `probe_every_s`: the least time between active
    probes (pings with payloads), which cost bandwidth on a slow link.
    """

    def __init__(self, info, every=10, min_gain=0.05, probe_every_s=30.0):
        if not info.get("adaptive") or "cost_graph" not in info:
            raise EdgeflowError("this device package cannot re-plan: split it with both graphs 'full'")
        self.cost_graph = CostGraph.from_json(info["cost_graph"])
        self.planned_link = Link(info["link"]["up_bps"], info["link"]["down_bps"], info["link"]["rtt_s"],
                                 "planned")
        self.objective = info.get("objective", "latency")
        self.current = set(info["device_ops"])
        self.every, self.min_gain, self.probe_every_s = every, min_gain, probe_every_s
        self.calls, self.replans = 0, 0
        self._probed_at = None
        self.link = self.planned_link

    def due(self):
        self.calls += 1
        return self.calls % self.every == 0

    def measure(self, client):
        """The link measured so far, probing what no call has measured yet (rate-limited)."""
        stats = client.link
        now = time.monotonic()
        if self._probed_at is None or now - self._probed_at >= self.probe_every_s:
            self._probed_at = now
            client.ping()  # round trips: the first may also open the connection
            client.ping()
            if stats.up_bytes_per_s is None:
                client.ping(payload_bytes=PROBE_BYTES)
            if stats.down_bytes_per_s is None:
                client.ping(reply_bytes=PROBE_BYTES)
            stats = client.link
        self.link = Link.measured(stats, self.planned_link)
        return self.link

    def propose(self, link):
        """The device ops (names) of a better cut for `link`, or None to keep the current one."""
        placement = plan(self.cost_graph, link, self.objective)
        proposed = set(placement.device_ops)
        if proposed == self.current:
            return None
        sides = {op.name: "device" if op.name in self.current else "cloud" for op in self.cost_graph.ops}
        now = cost(self.cost_graph, link, sides, self.objective)
        better = placement.predicted["split"]
        return proposed if better < now * (1 - self.min_gain) else None

    def recut(self, device_model, proposed):
        """A new device package (a ModelDef) cutting the original model at `proposed`."""
        info = metadata.split(device_model)
        original = partition.original_model(device_model)
        operators = {op.name: op.operator for op in self.cost_graph.ops}
        cut = partition.Cut(original, {operators[n] for n in proposed}, info["signature"])
        keep = {k: v for k, v in info.items() if k not in ("uploads", "downloads", "device_ops",
                                                           "original_tensors")}
        new = partition.device_package(original, cut, info["cloud_model_id"], info["cloud_sha256"],
                                       "full", extra_metadata=keep)
        self.current = set(proposed)
        self.replans += 1
        return new
