"""The split planner: which ops run on the device and which on the cloud server.

Model of execution. An inference runs the device's ops first; then, in one request (one
round trip), sends up every tensor made on the device (graph inputs included) that a
cloud op reads, each tensor once however many cloud ops read it; the cloud runs its
ops; the graph outputs it made come back down. So a placement is valid when no tensor
flows from the cloud to the device: the device side is closed under predecessors. Graph
inputs start on the device. Its cost (`cost`, `breakdown`) under the objective:

    latency      = device compute + cloud compute + upload + download + RTT + overhead
                   (the last two only if some op runs on the cloud)
    device-time  = device compute + upload + download + overhead (if some op runs on
                   the cloud): the device's busy time

`overhead` is the link's fixed cost per call beyond the RTT (Link.overhead_s: the RPC
stack, serializing, the server's dispatch), charged once per round trip; the device's
busy time pays it too, as most of it is the device's own RPC work (on a phone-class CPU,
nearly all). Device-only runs every op on the device (no transfer, no round trip);
cloud-only runs only what must stay there (ops pinned to the device and the ops they need).

Margins. Predicted costs are estimates, and a round trip risks more than its mean (a slow
or lost server), so `plan` keeps to the simple placements unless a split is clearly
better: a placement that uses the cloud is chosen over device-only only when its gain
beats both `margin` (relative, default 10%) and `min_gain_s` (absolute, default 1 ms); a
cut that keeps some ops on each side must beat cloud-only by the same margins too. So a
split that saves 0.03 ms of a 9.6 ms device time is not made (issue 17). `worth` is the
test; margin=0 and min_gain_s=0 give the plain optimum.

Planning is a minimum s-t cut, as in DADS (Hu et al., INFOCOM 2019): source = device,
sink = cloud; op i has an edge source->i weighing its cloud cost (paid when i ends on
the cloud; its outputs' download included when they are graph outputs) and i->sink
weighing its device cost; a tensor t made by p (or a graph input: by the source) and
read by q1..qk gets a node t* with p->t* weighing t's upload and t*->qj infinite, so the
upload is paid once; infinite edges qj->p forbid cloud-to-device flow; pins are
infinite edges from the source or to the sink. The round trip (RTT and overhead) is not
additive: the best placement using the cloud is the cut plus one round trip, which is
exact (when the cut puts nothing on the cloud, device-only is optimal). scipy's maximum flow takes int32
capacities, so each finite capacity is rounded to a unit of (sum of finite
capacities) / 2**30 seconds and infinity is 2**31 - 1: the cut is optimal up to that
rounding (relative error about 1e-9 of the total), and the chosen placement's cost is
then evaluated exactly.

A device memory budget (`CostGraph.device_memory`: weights plus peak activations) makes
the problem harder than a cut; the planner then searches a Lagrangian penalty
lambda * bytes on device ops by bisection and keeps the cheapest placement found within
the budget. That path is a heuristic (it can miss the best placement within the
budget); the unconstrained plan is exact.
"""
import math
from dataclasses import dataclass

import numpy as np

from ..errors import EdgeflowError, InvalidInputError, PlacementError
from .cost_graph import SIDES
from .links import Link

OBJECTIVES = ("latency", "device-time")
DEFAULT_MARGIN = 0.10  # a split must be this much faster (relative) ...
DEFAULT_MIN_GAIN_S = 0.001  # ... and this many seconds faster than the simple placements
_INF = 2**31 - 1  # scipy.sparse.csgraph.maximum_flow works in int32
_UNITS = 2**30  # the finite capacities sum to at most this many units
_BISECTIONS = 24


@dataclass
class Placement:
    """Where each op runs and what that costs.

    `side`: {op name: "device" | "cloud"} in the cost graph's op order. `cut_tensors`:
    [(name, bytes on the wire)] sent up; `download_tensors`: [(name, bytes)] sent down.
    `predicted`: seconds under `objective` of this placement ("split"), of "device_only"
    (every op on the device, pins aside) and of "cloud_only" (only what must stay on the
    device). `breakdown`: this placement's seconds by part (see `breakdown`).
    `device_memory`: weight plus peak activation bytes on the device. `exact`: True when
    the planner proved the placement optimal; False for a forced cut, and when the memory
    budget's heuristic chose it.
    """

    side: dict
    cut_tensors: list
    download_tensors: list
    predicted: dict
    breakdown: dict
    objective: str
    device_memory: int
    exact: bool = True

    @property
    def device_ops(self):
        return [name for name, s in self.side.items() if s == "device"]

    @property
    def cloud_ops(self):
        return [name for name, s in self.side.items() if s == "cloud"]

    def device_operators(self, cost_graph):
        """Indices, in the model's subgraph, of the ops on the device (what
        edgeflow.splitter.partition cuts a model with)."""
        return [op.operator for op in cost_graph.ops if self.side[op.name] == "device"]


# -- evaluating a placement -------------------------------------------------------------
def on_device(cost_graph, sides):
    """[bool per op]: True for ops on the device. `sides` is {op name: side} naming every
    op, or a sequence of sides (or bools) in op order. PlacementError if a device op
    reads a tensor made on the cloud."""
    ops = cost_graph.ops
    if isinstance(sides, dict):
        missing = [op.name for op in ops if op.name not in sides]
        unknown = sorted(set(sides) - {op.name for op in ops})
        if missing or unknown:
            raise InvalidInputError("sides must name every op once"
                                    + (f"; missing {missing}" if missing else "")
                                    + (f"; unknown {unknown}" if unknown else ""))
        sides = [sides[op.name] for op in ops]
    sides = list(sides)
    if len(sides) != len(ops):
        raise InvalidInputError(f"expected {len(ops)} sides, one per op, got {len(sides)}")
    dev = []
    for op, s in zip(ops, sides):
        if isinstance(s, (bool, np.bool_)):
            dev.append(bool(s))
        elif s in SIDES:
            dev.append(s == "device")
        else:
            raise InvalidInputError(f"op {op.name!r}: side must be one of {SIDES}, got {s!r}")
    for op in ops:
        if dev[op.index]:
            for name in op.inputs:
                p = cost_graph.tensors[name].producer
                if p is not None and not dev[p]:
                    raise PlacementError(f"device op {op.name!r} reads {name!r}, made on the cloud "
                                         f"by {ops[p].name!r}: the device side must hold every "
                                         "op a device op needs")
    return dev


def _transfers(cost_graph, dev):
    """([(name, wire bytes)] sent up, [(name, bytes)] sent down) under placement `dev`."""
    up, down = [], []
    for t in cost_graph.tensors.values():
        made_on_device = t.producer is None or dev[t.producer]
        if made_on_device and any(not dev[c] for c in t.consumers):
            up.append((t.name, cost_graph.wire_bytes(t.name)))
        elif not made_on_device and t.is_output:
            down.append((t.name, cost_graph.wire_bytes(t.name)))
    return up, down


def breakdown(cost_graph, link, sides):
    """Seconds of a placement by part: device_s, cloud_s, up_s, down_s, rtt_s,
    overhead_s (the link's per-call cost; it and rtt_s are 0 without a round trip); and
    up_bytes, down_bytes on the wire. `sides` as for `on_device`."""
    return _breakdown(cost_graph, Link.parse(link), on_device(cost_graph, sides))


def _breakdown(cost_graph, link, dev):
    up, down = _transfers(cost_graph, dev)
    up_bytes, down_bytes = sum(b for _, b in up), sum(b for _, b in down)
    return {"device_s": sum(op.device_s for op in cost_graph.ops if dev[op.index]),
            "cloud_s": sum(op.cloud_s for op in cost_graph.ops if not dev[op.index]),
            "up_s": link.up_s(up_bytes), "down_s": link.down_s(down_bytes),
            "rtt_s": link.rtt_s if not all(dev) else 0.0,
            "overhead_s": link.overhead_s if not all(dev) else 0.0,
            "up_bytes": up_bytes, "down_bytes": down_bytes}


def _total(parts, objective):
    if objective == "latency":
        return (parts["device_s"] + parts["cloud_s"] + parts["up_s"] + parts["down_s"] + parts["rtt_s"]
                + parts["overhead_s"])
    return parts["device_s"] + parts["up_s"] + parts["down_s"] + parts["overhead_s"]


def worth(new_s, old_s, margin=DEFAULT_MARGIN, min_gain_s=DEFAULT_MIN_GAIN_S):
    """True when a placement costing `new_s` beats one costing `old_s` by more than both
    margins: the gain exceeds `margin` * old_s and `min_gain_s` seconds."""
    gain = old_s - new_s
    return gain > 0 and gain > margin * old_s and gain > min_gain_s


def cost(cost_graph, link, sides, objective="latency"):
    """Seconds a placement costs under `objective` ("latency" or "device-time"); `sides`
    as for `on_device`. PlacementError if the placement is not valid."""
    _check_objective(objective)
    return _total(breakdown(cost_graph, link, sides), objective)


def _check_objective(objective):
    if objective not in OBJECTIVES:
        raise InvalidInputError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


# -- the placements every plan compares against -------------------------------------------
def _closure(cost_graph, seeds):
    """[bool per op]: the ops `seeds` (op positions) and every op they need."""
    dev = [False] * len(cost_graph.ops)
    todo = list(seeds)
    while todo:
        k = todo.pop()
        if not dev[k]:
            dev[k] = True
            todo.extend(p for name in cost_graph.ops[k].inputs
                        if (p := cost_graph.tensors[name].producer) is not None)
    return dev


def _cloud_only(cost_graph):
    """The smallest valid device side: device-pinned ops and what they need.
    PlacementError if that includes a cloud-pinned op."""
    dev = _closure(cost_graph, [op.index for op in cost_graph.ops if op.pinned == "device"])
    clash = [op.name for op in cost_graph.ops if dev[op.index] and op.pinned == "cloud"]
    if clash:
        raise PlacementError(f"op(s) {clash} are pinned to the cloud but ops pinned to the device "
                             "need them, and nothing flows from the cloud back to the device")
    return dev


# -- the minimum cut ----------------------------------------------------------------------
class _Network:
    """The DADS flow network of a cost graph under a link and objective, built once and
    solved for any extra per-op device penalty (the memory budget's Lagrangian)."""

    def __init__(self, cost_graph, link, objective):
        n = len(cost_graph.ops)
        self.n = n
        cloud = np.array([op.cloud_s if objective == "latency" else 0.0 for op in cost_graph.ops])
        for t in cost_graph.tensors.values():
            if t.is_output and t.producer is not None:
                cloud[t.producer] += link.down_s(cost_graph.wire_bytes(t.name))
        self.device = np.array([op.device_s for op in cost_graph.ops])
        self.cloud = cloud
        rows, cols, caps, inf_rows, inf_cols = [], [], [], [], []
        for op in cost_graph.ops:
            if op.pinned == "device":
                inf_rows.append(0)
                inf_cols.append(op.index + 2)
            elif op.pinned == "cloud":
                inf_rows.append(op.index + 2)
                inf_cols.append(1)
        aux = n + 2
        for t in cost_graph.tensors.values():
            if not t.consumers:
                continue
            source = 0 if t.producer is None else t.producer + 2
            rows.append(source)
            cols.append(aux)
            caps.append(link.up_s(cost_graph.wire_bytes(t.name)))
            for c in t.consumers:
                inf_rows.append(aux)
                inf_cols.append(c + 2)
                if t.producer is not None:
                    inf_rows.append(c + 2)
                    inf_cols.append(t.producer + 2)
            aux += 1
        self.size = aux
        nodes = np.arange(n) + 2
        # Finite edges: source->op (cloud cost), op->sink (device cost), producer->t* (upload).
        self.rows = np.concatenate([np.zeros(n, np.int64), nodes, np.array(rows, np.int64)])
        self.cols = np.concatenate([nodes, np.ones(n, np.int64), np.array(cols, np.int64)])
        self.upload = np.array(caps, np.float64)
        self.inf_rows = np.array(inf_rows, np.int64)
        self.inf_cols = np.array(inf_cols, np.int64)
        self.total = float(self.cloud.sum() + self.device.sum() + self.upload.sum())

    def solve(self, penalty=None):
        """[bool per op]: the source side of a minimum cut (the smallest one)."""
        try:
            from scipy.sparse import coo_array
            from scipy.sparse.csgraph import breadth_first_order, maximum_flow
        except ImportError:
            raise EdgeflowError("the split planner needs scipy's maximum flow: pip install "
                                "'scipy>=1.10'") from None
        device = self.device if penalty is None else self.device + penalty
        finite = np.concatenate([self.cloud, device, self.upload])
        total = float(finite.sum())
        unit = total / _UNITS if total > 0 else 1.0
        data = np.concatenate([np.rint(finite / unit).astype(np.int64),
                               np.full(len(self.inf_rows), _INF, np.int64)])
        rows = np.concatenate([self.rows, self.inf_rows])
        cols = np.concatenate([self.cols, self.inf_cols])
        graph = coo_array((data, (rows, cols)), shape=(self.size, self.size)).tocsr()
        graph.sum_duplicates()
        np.minimum(graph.data, _INF, out=graph.data)
        graph = graph.astype(np.int32)
        graph.eliminate_zeros()
        flow = maximum_flow(graph, 0, 1)
        if flow.flow_value >= _INF:
            raise PlacementError("the pins contradict each other: no placement avoids sending "
                                 "a tensor from the cloud back to the device")
        residual = (graph.astype(np.int64) - flow.flow.astype(np.int64)).tocsr()
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reached = breadth_first_order(residual, 0, directed=True, return_predecessors=False)
        side = np.zeros(self.size, bool)
        side[reached] = True
        return side[2:self.n + 2].tolist()


# -- planning -----------------------------------------------------------------------------
def plan(cost_graph, link, objective="latency", memory_budget=None, together=(), margin=DEFAULT_MARGIN,
         min_gain_s=DEFAULT_MIN_GAIN_S):
    """The best Placement of `cost_graph`'s ops over `link` (a Link or a spec for
    Link.parse) under `objective` ("latency" or "device-time"), honouring pins, groups
    of ops (op positions) that must run on one side (`together`: split training's ops
    that read one variable, see `_keep_together`) and, if given, a device
    `memory_budget` in bytes (see the module docstring: exact without a budget, a
    Lagrangian heuristic with one). A placement using the cloud must beat device-only,
    and a cut with ops on both sides cloud-only too, by `margin` (relative) and
    `min_gain_s` (seconds); see "Margins" in the module docstring. PlacementError if the
    pins contradict each other or even the smallest device side exceeds the budget."""
    link = Link.parse(link)
    _check_objective(objective)
    for what, v in (("margin", margin), ("min_gain_s", min_gain_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InvalidInputError(f"{what} must be a number >= 0, got {v!r}")
    floor = _together_closure(cost_graph, _cloud_only(cost_graph), together)
    network = _Network(cost_graph, link, objective)
    _keep_together(network, together)
    everything = [True] * len(cost_graph.ops)
    may_stay = not any(op.pinned == "cloud" for op in cost_graph.ops)
    best = network.solve()  # optimal among placements using the cloud, when it uses it

    def choose(device_only, candidates):
        return _choose(cost_graph, link, objective, device_only, floor,
                       _cheapest(cost_graph, link, objective, candidates), margin, min_gain_s)

    optimum = choose(everything if may_stay else None, [best])
    if memory_budget is None:
        return _placement(cost_graph, link, objective, optimum, floor, exact=True)

    def fits(dev):
        return sum(cost_graph.device_memory(dev)) <= memory_budget

    need = sum(cost_graph.device_memory(floor))
    if need > memory_budget:
        raise PlacementError(f"even the smallest device side ({sum(floor)} op(s): those pinned to "
                             f"the device and what they need; the graph inputs) needs {need} bytes of "
                             f"device memory; the budget is {memory_budget}")
    # `optimum` is the choice among device-only, cloud-only and `best`: if it fits, or
    # `best` uses the cloud and fits (so it is optimal among what fits but device-only),
    # the plan is exact.
    if fits(optimum):
        return _placement(cost_graph, link, objective, optimum, floor, exact=True)
    stay = everything if may_stay and fits(everything) else None
    if fits(best) and any(not d for d in best):
        return _placement(cost_graph, link, objective, choose(stay, [best]), floor, exact=True)
    candidates = [floor]
    weights = np.array(cost_graph.memory_weights(), np.float64)
    positive = weights[weights > 0]
    if positive.size:
        # At `hi`, an op's penalty outweighs every cost together: only the floor's ops
        # (and free ones) stay on the device. Bisect lambda geometrically below it.
        hi = (network.total + 1e-12) / positive.min() * 2
        lo = hi * 2.0**-40
        for _ in range(_BISECTIONS):
            mid = math.sqrt(lo * hi)
            dev = network.solve(mid * weights)
            if fits(dev):
                candidates.append(dev)
                hi = mid
            else:
                lo = mid
    chosen = choose(stay, [d for d in candidates if not all(d)] or [floor])
    return _placement(cost_graph, link, objective, chosen, floor, exact=False)


def _keep_together(network, together):
    """Each group's ops on one side: infinite edges both ways between consecutive members
    (a cut separating two of them would cost infinity). The cut stays exact."""
    pairs = [(a + 2, b + 2) for group in together for a, b in zip(group, group[1:])]
    if pairs:
        network.inf_rows = np.concatenate([network.inf_rows, [a for a, b in pairs], [b for a, b in pairs]])
        network.inf_cols = np.concatenate([network.inf_cols, [b for a, b in pairs], [a for a, b in pairs]])


def _together_closure(cost_graph, dev, together):
    """`dev` grown until no group of `together` straddles the sides (a group with an op on
    the device goes there whole, with what it needs). PlacementError if a cloud-pinned
    op would have to run on the device."""
    dev = list(dev)
    while True:
        grown = [k for group in together if any(dev[k] for k in group) for k in group if not dev[k]]
        if not grown:
            break
        more = _closure(cost_graph, grown)
        dev = [a or b for a, b in zip(dev, more)]
    clash = [op.name for op in cost_graph.ops if dev[op.index] and op.pinned == "cloud"]
    if clash:
        raise PlacementError(f"op(s) {clash} are pinned to the cloud but share a variable with ops that "
                             "must run on the device")
    return dev


def _cheapest(cost_graph, link, objective, candidates):
    return min(candidates, key=lambda dev: _total(_breakdown(cost_graph, link, dev), objective))


def _choose(cost_graph, link, objective, device_only, floor, split, margin, min_gain_s):
    """Device-only (None when not allowed), cloud-only (`floor`) or `split`, by the
    margins: any use of the cloud must beat device-only, and a cut with ops on both
    sides cloud-only too (module docstring, "Margins")."""
    def total(dev):
        return _total(_breakdown(cost_graph, link, dev), objective)

    if device_only is None:
        base = floor
    elif all(floor) or not worth(total(floor), total(device_only), margin, min_gain_s):
        base = device_only
    else:
        base = floor
    if all(split) or split == floor:
        return base
    if device_only is not None and not worth(total(split), total(device_only), margin, min_gain_s):
        return base
    if not all(floor) and not worth(total(split), total(floor), margin, min_gain_s):
        return base
    return split


def forced(cost_graph, cut_tensor_names, link, objective="latency"):
    """The Placement that cuts the graph at the named tensors (`--cut`): the device runs
    the ops needed to compute them from the graph inputs (and the ops pinned to the
    device, with what they need); the cloud runs the rest from them. A graph input's name
    sends the input itself. PlacementError if the cloud would need any other tensor from
    the device, or a cloud-pinned op would run on the device."""
    link = Link.parse(link)
    _check_objective(objective)
    names = list(cut_tensor_names)
    unknown = [n for n in names if n not in cost_graph.tensors]
    if unknown:
        raise InvalidInputError(f"--cut names unknown tensor(s) {unknown}; tensors are "
                                f"{list(cost_graph.tensors)[:20]}"
                                + (" ..." if len(cost_graph.tensors) > 20 else ""))
    seeds = [cost_graph.tensors[n].producer for n in names if cost_graph.tensors[n].producer is not None]
    seeds += [op.index for op in cost_graph.ops if op.pinned == "device"]
    dev = _closure(cost_graph, seeds)
    clash = [op.name for op in cost_graph.ops if dev[op.index] and op.pinned == "cloud"]
    if clash:
        raise PlacementError(f"cutting at {names} runs cloud-pinned op(s) {clash} on the device")
    up, _ = _transfers(cost_graph, dev)
    leaks = [t for t, _ in up if t not in names]
    if leaks:
        readers = {t: [cost_graph.ops[c].name for c in cost_graph.tensors[t].consumers
                       if not dev[c]] for t in leaks}
        raise PlacementError(f"cutting at {names} does not separate the inputs from the outputs: "
                             f"the cloud also needs {readers} (tensor: cloud ops reading it); add "
                             "those tensors to the cut")
    return _placement(cost_graph, link, objective, dev, _cloud_only(cost_graph), exact=False)


def _placement(cost_graph, link, objective, dev, floor, exact):
    up, down = _transfers(cost_graph, dev)
    parts = _breakdown(cost_graph, link, dev)
    everything = [True] * len(cost_graph.ops)
    predicted = {"split": _total(parts, objective),
                 "device_only": _total(_breakdown(cost_graph, link, everything), objective),
                 "cloud_only": _total(_breakdown(cost_graph, link, floor), objective)}
    return Placement({op.name: "device" if dev[op.index] else "cloud" for op in cost_graph.ops},
                     up, down, predicted, parts, objective, sum(cost_graph.device_memory(dev)), exact)
