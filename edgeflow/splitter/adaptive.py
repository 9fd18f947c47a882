"""Re-choosing the cut at run time from the link the device measures (Neurosurgeon's
adaptivity).

A device package split with both graphs "full" carries its cost graph and the link it
was planned for. While it runs, the cloud client measures the link: round trips of
empty pings, throughput of transfers of at least 64 KiB (run calls, or ping loads when
no run has moved that much), and the fixed cost of a call beyond the round trip (small
Run calls; when the current cut makes none, a few that echo one small tensor). Every
`every` calls the `Replanner` plans again for the measured link and proposes a `Move`
when another cut is predicted to beat the current one by the margins (`margin`,
relative, and `min_gain_s`, absolute: edgeflow.splitter.planner.worth); the move cuts the
original model there: a new device package in memory, paired with the same cloud
package (which holds the whole graph and so can start from any cut).

The Replanner only plans; edgeflow.cloud.SplitRunner runs it off the call path, swaps
the new cut in between calls, measures the calls before and after, and moves back (and
bars that cut, `reject`) when the move made them slower. A package cut with `--cut`
records it ("forced_cut"), and the runner leaves such a cut alone unless asked to adapt.
"""
import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import EdgeflowError, RemoteError
from ..format import metadata
from . import partition
from .cost_graph import CostGraph
from .links import Link
from .planner import DEFAULT_MARGIN, DEFAULT_MIN_GAIN_S, cost, plan, worth

_log = logging.getLogger("edgeflow")
PROBE_BYTES = 64 << 10  # a throughput sample; smaller transfers measure latency
_SIMILAR = 2.0  # a barred cut may be proposed again once a link figure moves this factor


@dataclass(frozen=True)
class Move:
    """A proposed cut: its device ops (names), the link it was planned for, and the
    seconds predicted (under the package's objective) for the current cut and for it."""

    device_ops: frozenset
    link: Link
    predicted_before_s: float
    predicted_after_s: float


class Replanner:
    """Plans a device package's cut again from measured link figures.

    `info`: the package's split metadata (edgeflow.format.metadata.split).
    `every`: calls between re-plans; `margin`, `min_gain_s`: how much faster (relative,
    and in seconds) a cut must be predicted to be to move to it; `probe_every_s`: the
    least time between active probes (pings with payloads), which cost bandwidth on a
    slow link.
    """

    def __init__(self, info, every=10, margin=DEFAULT_MARGIN, min_gain_s=DEFAULT_MIN_GAIN_S,
                 probe_every_s=30.0):
        if not info.get("adaptive") or "cost_graph" not in info:
            raise EdgeflowError("this device package cannot re-plan: split it with both graphs 'full'")
        self.cost_graph = CostGraph.from_json(info["cost_graph"])
        planned = info["link"]
        # Packages split before the overhead term were planned without one.
        self.planned_link = Link(planned["up_bps"], planned["down_bps"], planned["rtt_s"], "planned",
                                 planned.get("overhead_s", 0.0))
        self.objective = info.get("objective", "latency")
        self.model_id, self.sha256 = info.get("cloud_model_id"), info.get("cloud_sha256")
        self.forced_cut = info.get("forced_cut")
        self.current = frozenset(info["device_ops"])
        self.every, self.margin, self.min_gain_s = every, margin, min_gain_s
        self.probe_every_s = probe_every_s
        self.calls, self.replans = 0, 0
        self.barred = {}  # device ops of a cut moved back from -> the link it was proposed for
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
            if client.link.overhead_s is None and self.model_id is not None:
                try:
                    client.measure_overhead(self.model_id, self.sha256, self._echo())
                except RemoteError as e:  # the planned figure stands in
                    _log.info("measuring the per-call overhead failed: %s", e)
            stats = client.link
        self.link = Link.measured(stats, self.planned_link)
        return self.link

    def _echo(self):
        """(name, zeros) of the cost graph's smallest tensor: a Run that feeds it and
        fetches it back computes nothing (the cloud package holds the whole graph)."""
        t = min(self.cost_graph.tensors.values(), key=lambda t: t.nbytes)
        return t.name, np.zeros(t.shape, t.dtype)

    def predicted(self, link, device_ops=None):
        """Seconds predicted under the objective for a cut (by default the current one)."""
        device_ops = self.current if device_ops is None else device_ops
        sides = {op.name: "device" if op.name in device_ops else "cloud" for op in self.cost_graph.ops}
        return cost(self.cost_graph, link, sides, self.objective)

    def propose(self, link):
        """A Move to a cut predicted to beat the current one by the margins under `link`,
        or None to keep the current one (also when that cut was moved back from under a
        similar link)."""
        placement = plan(self.cost_graph, link, self.objective, margin=self.margin,
                         min_gain_s=self.min_gain_s)
        proposed = frozenset(placement.device_ops)
        if proposed == self.current:
            return None
        now, better = self.predicted(link), placement.predicted["split"]
        if not worth(better, now, self.margin, self.min_gain_s):
            return None
        if proposed in self.barred and _similar(self.barred[proposed], link):
            return None
        return Move(proposed, link, now, better)

    def recut(self, device_model, move):
        """A new device package (a ModelDef) cutting the original model where `move` says.
        `device_model`: any device package of the model (each holds the original)."""
        info = metadata.split(device_model)
        original = partition.original_model(device_model)
        operators = {op.name: op.operator for op in self.cost_graph.ops}
        device_ops = partition.with_needs(original, [operators[n] for n in move.device_ops], info["signature"])
        cut = partition.Cut(original, device_ops, info["signature"])
        keep = {k: v for k, v in info.items() if k not in ("uploads", "downloads", "device_ops",
                                                           "original_tensors")}
        return partition.device_package(original, cut, info["cloud_model_id"], info["cloud_sha256"],
                                        "full", extra_metadata=keep)

    def adopt(self, move):
        """The device now runs `move`'s cut."""
        self.current = move.device_ops
        self.replans += 1

    def reject(self, move, previous):
        """`move` made calls slower: back to the `previous` cut (device op names), and do
        not propose `move`'s cut again until the link changes."""
        self.barred[move.device_ops] = move.link
        self.current = frozenset(previous)


def _similar(a, b):
    """True when no figure of links `a` and `b` differs by the factor _SIMILAR or more."""
    def close(x, y, floor):
        x, y = max(x, floor), max(y, floor)
        return max(x, y) / min(x, y) < _SIMILAR
    return (close(a.up_bps, b.up_bps, 1.0) and close(a.down_bps, b.down_bps, 1.0)
            and close(a.round_trip_s, b.round_trip_s, 1e-4))
