"""The split planner's cost model: what each op costs on each side, and what each tensor
costs on the wire.

A `CostGraph` is a signature's ops in execution order, each with its time on the device
and on the cloud server, the weights it reads, and an optional pin to a side; and the
activation tensors between them (graph inputs included) with their sizes. Times come
from a `Profile` (the interpreter's profiler run on each side, saved as JSON), or,
for ops a profile lacks, are estimated from the op's arithmetic and the bytes it moves:

    estimate = (flops / REFERENCE_FLOPS_PER_S + bytes / REFERENCE_BYTES_PER_S
                + REFERENCE_OP_OVERHEAD_S) / speed

where `speed` is the side's speed relative to the reference device (`device_speed`,
default 1; `server_speed`, default 10: a server CPU core with a tuned BLAS runs
numpy kernels roughly an order of magnitude faster than a phone-class core). When
only the other side has a measured time, it is scaled by the speed ratio instead.
Reshape-like ops cost nothing (they alias their input's bytes and run no kernel).

A `Link` is the network: uplink and downlink bandwidth (bits per second) and round
trip time. Activations that cross it may be compressed on the wire: "none" (4 bytes
per float32), "fp16" (2) or "int8" (1 byte per element plus a 4-byte scale per
tensor), both ways, as edgeflow.cloud's wire encodes them; only float32 tensors are
compressed, other dtypes travel raw.
"""
import json
import logging
import math
import os
import platform
import re
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..atomic import write_text
from ..errors import EdgeflowError, FormatError, GraphError, InvalidInputError

SIDES = ("device", "cloud")
COMPRESSIONS = ("none", "fp16", "int8")

# The reference device of the estimates: one phone-class CPU core running numpy kernels.
REFERENCE_FLOPS_PER_S = 10e9
REFERENCE_BYTES_PER_S = 5e9
REFERENCE_OP_OVERHEAD_S = 20e-6  # the interpreter's per-op dispatch, numpy call included
DEFAULT_SERVER_SPEED = 10.0
_log = logging.getLogger("edgeflow")


# -- the network ---------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """A network link: bandwidths in bits per second, round trip time in seconds."""

    up_bps: float
    down_bps: float
    rtt_s: float
    name: str = ""

    def __post_init__(self):
        for key in ("up_bps", "down_bps"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InvalidInputError(f"Link: {key} must be a positive number of bits per "
                                        f"second, got {v!r}")
        if not (isinstance(self.rtt_s, (int, float)) and math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise InvalidInputError(f"Link: rtt_s must be a number of seconds >= 0, got {self.rtt_s!r}")

    def up_s(self, nbytes):
        """Seconds to send `nbytes` up."""
        return nbytes * 8.0 / self.up_bps

    def down_s(self, nbytes):
        """Seconds to receive `nbytes`."""
        return nbytes * 8.0 / self.down_bps

    def describe(self):
        label = f"{self.name}: " if self.name else ""
        return (f"{label}up {self.up_bps / 1e6:g} Mbps, down {self.down_bps / 1e6:g} Mbps, "
                f"RTT {self.rtt_s * 1e3:g} ms")

    @classmethod
    def measured(cls, stats, fallback):
        """A Link from what a cloud client measured (an edgeflow.cloud.Link: its
        up_bytes_per_s, down_bytes_per_s and min_rtt_s), for re-planning at run time;
        figures not measured yet (None) come from `fallback` (a Link or a spec)."""
        fallback = cls.parse(fallback)
        up, down, rtt = stats.up_bytes_per_s, stats.down_bytes_per_s, stats.min_rtt_s
        return cls(up * 8.0 if up else fallback.up_bps, down * 8.0 if down else fallback.down_bps,
                   rtt if rtt is not None else fallback.rtt_s, "measured")

    @classmethod
    def parse(cls, spec):
        """A Link from a profile name ("3g", "4g", "wifi"), explicit figures
        ("up=5.85,down=20,rtt=50ms"), or a name with overrides ("4g,rtt=120ms").

        Bandwidths are in Mbps unless suffixed (bps, kbps, mbps, gbps); the RTT is in
        seconds unless suffixed (ms, s). Without a profile name, `up` is required, `down`
        defaults to `up` and `rtt` to 0. InvalidInputError on anything else.
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
            if key not in ("up", "down", "rtt") or key in given:
                raise InvalidInputError(f"link {spec!r}: expected keys up, down and rtt once "
                                        f"each, got {key!r}")
            given[key] = _quantity(value, _RTT_UNITS if key == "rtt" else _BANDWIDTH_UNITS,
                                   "s" if key == "rtt" else "mbps", f"link {spec!r}: {key}")
        if base is None and "up" not in given:
            raise InvalidInputError(f"link {spec!r}: give a profile name ({sorted(LINKS)}) or up=MBPS")
        up = given.get("up", base.up_bps if base else None)
        down = given.get("down", base.down_bps if base else up)
        rtt = given.get("rtt", base.rtt_s if base else 0.0)
        name = base.name + ("*" if given else "") if base else ""
        return cls(up, down, rtt, name)


_BANDWIDTH_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
_RTT_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _quantity(text, units, default, what):
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)", text)
    if not m or (m.group(2) or default) not in units:
        raise InvalidInputError(f"{what}: expected a number with an optional unit "
                                f"({', '.join(units)}), got {text!r}")
    return float(m.group(1)) * units[m.group(2) or default]


# Uplinks are DADS's (Hu et al., "Dynamic Adaptive DNN Surgery for Inference Acceleration
# on the Edge", INFOCOM 2019), which took them from Neurosurgeon's measurements (Kang et
# al., ASPLOS 2017). Downlinks and RTTs are typical figures for those networks (our
# assumption, not the papers'): override them with "4g,down=..,rtt=..".
LINKS = {
    "3g": Link(1.1e6, 3e6, 0.150, "3g"),
    "4g": Link(5.85e6, 20e6, 0.060, "4g"),
    "wifi": Link(18.88e6, 50e6, 0.020, "wifi"),
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


# -- profiles --------------------------------------------------------------------------
_PROFILE_KIND = "edgeflow-profile"
_PROFILE_VERSION = 1


@dataclass
class Profile:
    """Mean seconds per op on one machine, keyed by op name (its first output's name);
    `shapes` records the input shapes it was measured at ({input name: [dims]})."""

    device: str
    seconds: dict
    runs: int = 0
    shapes: dict = field(default_factory=dict)

    def save(self, path):
        """Write as JSON atomically: a temp file in the same folder, fsynced, renamed."""
        text = json.dumps({"format": _PROFILE_KIND, "version": _PROFILE_VERSION,
                           "device": self.device, "runs": self.runs, "seconds": self.seconds,
                           "shapes": {k: [int(d) for d in v] for k, v in self.shapes.items()}},
                          indent=1, sort_keys=True)
        write_text(path, text)

    @classmethod
    def load(cls, path):
        """The Profile in `path`; FormatError if it is not one."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormatError(f"{path}: not a profile (bad JSON: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != _PROFILE_KIND:
            raise FormatError(f"{path}: not an edgeflow profile (expected a JSON object with "
                              f"format {_PROFILE_KIND!r})")
        if doc.get("version") != _PROFILE_VERSION:
            raise FormatError(f"{path}: profile version {doc.get('version')!r}, expected "
                              f"{_PROFILE_VERSION}")
        device, runs, seconds = doc.get("device"), doc.get("runs"), doc.get("seconds")
        if not isinstance(device, str) or not isinstance(runs, int) or isinstance(runs, bool) \
                or runs < 0 or not isinstance(seconds, dict):
            raise FormatError(f"{path}: a profile needs device (string), runs (int >= 0) and "
                              f"seconds ({{op name: seconds}})")
        for name, s in seconds.items():
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) \
                    or s < 0:
                raise FormatError(f"{path}: op {name!r} has time {s!r}; expected seconds >= 0")
        shapes = doc.get("shapes", {})
        if not isinstance(shapes, dict) or not all(
                isinstance(v, list) and all(type(d) is int and d >= 0 for d in v)
                for v in shapes.values()):
            raise FormatError(f"{path}: shapes must map input names to lists of dimensions")
        return cls(device, {k: float(v) for k, v in seconds.items()}, runs,
                   {k: tuple(v) for k, v in shapes.items()})


def op_name(subgraph, index):
    """The name an op goes by in profiles and plans: its first output's, else opcode#index."""
    op = subgraph.operators[index]
    return subgraph.tensors[op.outputs[0]].name if op.outputs else f"{op.opcode}#{index}"


DEFAULT_RUNS = 20


def measure_profile(model, signature="infer", inputs=None, runs=DEFAULT_RUNS, delegates=(), device=None,
                    input_shapes=None):
    """Profile a model's signature on this machine: the median seconds of each op over
    `runs` invocations, after one unprofiled warm-up.

    `model`: a path or the file's bytes. `inputs`: {name: array}; missing ones are random
    at `input_shapes` ({name: shape}) or the signature's shapes (dynamic dimensions 1). With `delegates`, a delegated
    partition is timed as a whole and its time shared among its ops in proportion to
    their estimated cost.
    """
    from ..interp.inputs import random_inputs
    from ..interp import Interpreter
    if runs < 1:
        raise InvalidInputError(f"runs must be >= 1, got {runs}")
    interp = Interpreter(model, delegates=delegates)
    runner = interp.get_signature_runner(signature)
    feeds = random_inputs(runner, inputs or {}, shapes=input_shapes)
    runner(**feeds)
    profiler = interp.enable_profiling()
    samples = {}  # op -> its seconds in each run: the median resists a busy machine's outliers
    for _ in range(runs):
        before = {i: r.total_ns for i, r in profiler.records.items()}
        runner(**feeds)
        for i, rec in profiler.records.items():
            samples.setdefault(i, []).append((rec.total_ns - before.get(i, 0)) / 1e9)
    plan = runner.last_plan
    sub = plan.subgraph
    seconds = {}
    starts, flops = set(plan.step_ops), None
    for i in profiler.records:
        median = float(np.median(samples[i]))
        group = _partition_of(plan, i, starts)
        if len(group) == 1:
            seconds[op_name(sub, i)] = median
            continue
        flops = flops or plan.flops()
        weights = [_estimate(plan, j, flops[j]) for j in group]
        total = sum(weights)
        for j, w in zip(group, weights):
            seconds[op_name(sub, j)] = median * (w / total if total > 0 else 1 / len(group))
    if device is None:
        names = "+".join(["numpy"] + [d.name for d in delegates])
        device = f"{platform.node() or 'host'} ({platform.machine()}, {names})"
    return Profile(device, seconds, runs, {n: tuple(v.shape) for n, v in feeds.items()})


def _partition_of(plan, i, starts):
    """The ops the step starting at op `i` runs: [i], or a delegate partition's ops."""
    owner = plan.placement.get(i, "cpu")
    if owner == "cpu":
        return [i]
    pos = plan.order.index(i)
    group = [i]
    for j in plan.order[pos + 1:]:
        if j in starts or plan.placement.get(j) != owner:
            break
        group.append(j)
    return group


def _moved_bytes(plan, i):
    op = plan.subgraph.operators[i]
    return sum(plan.arrays[t].nbytes for t in (*op.inputs, *op.outputs))


def _estimate(plan, i, flops):
    """Reference-device seconds of op `i` of `plan`, doing `flops` (0 for reshape-like ops)."""
    from .. import ops
    op = plan.subgraph.operators[i]
    if ops.get(op.opcode).view:
        return 0.0
    return flops / REFERENCE_FLOPS_PER_S + _moved_bytes(plan, i) / REFERENCE_BYTES_PER_S \
        + REFERENCE_OP_OVERHEAD_S


# -- the cost graph ---------------------------------------------------------------------
@dataclass
class Op:
    """One op of a CostGraph. `inputs`/`outputs` name activation tensors; `params` maps
    the names of the weights it reads (constants, variables) to their bytes. `index` is
    its position in CostGraph.ops (set by CostGraph); `operator` its index in the model's
    subgraph, when it comes from one."""

    name: str
    opcode: str
    inputs: tuple
    outputs: tuple
    device_s: float
    cloud_s: float
    params: dict = field(default_factory=dict)
    pinned: Optional[str] = None  # "device", "cloud" or None
    flops: int = 0
    operator: Optional[int] = None
    index: int = -1

    @property
    def param_bytes(self):
        return sum(self.params.values())


@dataclass
class Tensor:
    """An activation tensor of a CostGraph: a graph input (`producer` None) or an op's
    output. `view_of` names the tensor whose bytes it shares (reshape-like ops).
    `producer` (an op position) and `consumers` (op positions) are set by CostGraph."""

    name: str
    dtype: np.dtype
    shape: tuple
    is_output: bool = False
    view_of: Optional[str] = None
    producer: Optional[int] = None
    consumers: tuple = ()

    @property
    def elements(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.elements * np.dtype(self.dtype).itemsize


class CostGraph:
    """Ops (in an execution order) and activation tensors, with costs; see the module
    docstring. Built from a model with `CostGraph.from_model`, or directly from Op and
    Tensor lists (copies are kept; producers, consumers and indices are filled in).
    GraphError if the ops are not in dependency order or a name is unknown or repeated."""

    def __init__(self, ops, tensors, compression="none"):
        if compression not in COMPRESSIONS:
            raise InvalidInputError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.compression = compression
        self.ops = [replace(op, index=k, inputs=tuple(op.inputs), outputs=tuple(op.outputs),
                            params=dict(op.params)) for k, op in enumerate(ops)]
        tensors = list(tensors.values()) if isinstance(tensors, dict) else list(tensors)
        self.tensors = {}
        for t in tensors:
            if t.name in self.tensors:
                raise GraphError(f"tensor name {t.name!r} appears twice; a split needs unique names")
            self.tensors[t.name] = replace(t, dtype=np.dtype(t.dtype), producer=None, consumers=(),
                                           shape=tuple(int(d) for d in t.shape))
        made_by = {name: op.index for op in self.ops for name in op.outputs}
        self._by_name, consumers = {}, {name: [] for name in self.tensors}
        for op in self.ops:
            if op.name in self._by_name:
                raise GraphError(f"op name {op.name!r} appears twice; a split needs unique names")
            self._by_name[op.name] = op.index
            if op.pinned not in (None, *SIDES):
                raise InvalidInputError(f"op {op.name!r}: pinned must be 'device', 'cloud' or "
                                        f"None, got {op.pinned!r}")
            for s, what in ((op.device_s, "device_s"), (op.cloud_s, "cloud_s")):
                if not (math.isfinite(s) and s >= 0):
                    raise InvalidInputError(f"op {op.name!r}: {what} must be seconds >= 0, got {s!r}")
            for name in op.inputs:
                t = self.tensors.get(name)
                if t is None:
                    raise GraphError(f"op {op.name!r} reads unknown tensor {name!r}")
                if made_by.get(name, -1) >= op.index:
                    raise GraphError(f"op {op.name!r} reads {name!r} before it is made: ops must "
                                     "come in dependency order")
                if op.index not in consumers[name]:
                    consumers[name].append(op.index)
            for name in op.outputs:
                t = self.tensors.get(name)
                if t is None:
                    raise GraphError(f"op {op.name!r} makes unknown tensor {name!r}")
                if t.producer is not None:
                    raise GraphError(f"tensor {name!r} is made by two ops")
                t.producer = op.index
        for name, t in self.tensors.items():
            t.consumers = tuple(consumers[name])
            if t.view_of is not None and t.view_of not in self.tensors:
                raise GraphError(f"tensor {name!r} is a view of unknown tensor {t.view_of!r}")

    def __repr__(self):
        return (f"CostGraph({len(self.ops)} ops, {len(self.tensors)} tensors, "
                f"compression={self.compression!r})")

    def with_compression(self, compression):
        """The same graph with another wire compression."""
        return CostGraph(self.ops, self.tensors, compression)

    @property
    def inputs(self):
        """The graph inputs: tensors no op makes (they start on the device)."""
        return [t for t in self.tensors.values() if t.producer is None]

    def op(self, name):
        """The Op called `name`."""
        if name not in self._by_name:
            raise InvalidInputError(f"no op {name!r}; ops are {list(self._by_name)}")
        return self.ops[self._by_name[name]]

    def wire_bytes(self, name):
        """Bytes tensor `name` takes on the link, either way (after compression)."""
        t = self.tensors[name]
        return wire_bytes(t.dtype, t.elements, self.compression)

    def memory_weights(self):
        """Per-op device memory for the planner's memory budget (an additive stand-in for
        `device_memory`): the op's outputs' bytes (views: none) plus its weights' bytes,
        a weight read by several ops shared among them equally."""
        readers = {}
        for op in self.ops:
            for p in op.params:
                readers[p] = readers.get(p, 0) + 1
        return [sum(self.tensors[t].nbytes for t in op.outputs if self.tensors[t].view_of is None)
                + sum(b / readers[p] for p, b in op.params.items()) for op in self.ops]

    def device_memory(self, on_device):
        """(weight bytes, peak activation bytes) the device holds under a placement
        (`on_device`: a bool per op, in op order).

        Weights: each distinct weight a device op reads. Activations: the device runs its
        ops in order; a tensor lives from the step that makes it (graph inputs: from the
        start) to its last device reader, or to the end when it is sent up or is an
        output; views share their source's bytes. The peak of the live bytes at any step
        is what a perfect arena would need: an estimate, as the interpreter's arena can
        fragment a little.
        """
        weights = {}
        for op, dev in zip(self.ops, on_device):
            if dev:
                weights.update(op.params)
        steps = [k for k, dev in enumerate(on_device) if dev]
        position = {k: s for s, k in enumerate(steps)}
        end = len(steps)

        def root(name):
            seen = 0
            while self.tensors[name].view_of is not None and seen < len(self.tensors):
                name, seen = self.tensors[name].view_of, seen + 1
            return name

        life = {}  # root tensor -> [birth step, death step]
        for t in self.tensors.values():
            p = t.producer
            if p is not None and not on_device[p]:
                continue
            birth = 0 if p is None else position[p]
            deaths = [position[c] for c in t.consumers if on_device[c]]
            if t.is_output or any(not on_device[c] for c in t.consumers):
                deaths.append(end)
            r = root(t.name)
            span = life.setdefault(r, [birth, birth])
            span[0] = min(span[0], birth)
            span[1] = max([span[1], *deaths])
        live = np.zeros(end + 1, np.int64)
        for r, (birth, death) in life.items():
            live[birth:death + 1] += self.tensors[r].nbytes
        return int(sum(weights.values())), int(live.max(initial=0))

    # -- as JSON (a device package carries its cost graph, to re-plan at run time) ---
    def to_json(self):
        """A JSON-ready dict from which `from_json` rebuilds this graph."""
        return {"compression": self.compression,
                "ops": [{"name": op.name, "opcode": op.opcode, "inputs": list(op.inputs),
                         "outputs": list(op.outputs), "device_s": op.device_s, "cloud_s": op.cloud_s,
                         "params": op.params, "pinned": op.pinned, "flops": op.flops,
                         "operator": op.operator} for op in self.ops],
                "tensors": [{"name": t.name, "dtype": np.dtype(t.dtype).name, "shape": list(t.shape),
                             "is_output": t.is_output, "view_of": t.view_of}
                            for t in self.tensors.values()]}

    @classmethod
    def from_json(cls, data):
        """The CostGraph `to_json` described; FormatError if `data` is not one."""
        try:
            ops = [Op(o["name"], o["opcode"], tuple(o["inputs"]), tuple(o["outputs"]),
                      float(o["device_s"]), float(o["cloud_s"]), dict(o["params"]), o["pinned"],
                      int(o["flops"]), o["operator"]) for o in data["ops"]]
            tensors = [Tensor(t["name"], np.dtype(t["dtype"]), tuple(t["shape"]), bool(t["is_output"]),
                              t["view_of"]) for t in data["tensors"]]
            return cls(ops, tensors, data["compression"])
        except (KeyError, TypeError, ValueError, EdgeflowError) as e:
            raise FormatError(f"not a cost graph: {type(e).__name__}: {e}") from None

    # -- from a model --------------------------------------------------------------
    @classmethod
    def from_model(cls, model, signature="infer", input_shapes=None, device_profile=None,
                   server_profile=None, device_speed=1.0, server_speed=DEFAULT_SERVER_SPEED,
                   compression="none", pins=None):
        """The CostGraph of a model's signature at given input shapes.

        `model`: a path, the file's bytes, or an Interpreter. `input_shapes`: {input name:
        shape}; by default the declared shapes with dynamic dimensions 1. Profiles give
        measured times; ops they lack are estimated (module docstring). Ops are pinned by
        their `placement` in the file (`with ef.device(...)` when built) and by `pins`
        ({op name: "device" | "cloud"}), which wins over the file.
        """
        from .. import ops as registry
        from ..interp import Interpreter
        from ..interp.interpreter import check_shape
        for what, speed in (("device_speed", device_speed), ("server_speed", server_speed)):
            if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
                raise InvalidInputError(f"{what} must be a positive factor, got {speed!r}")
        interp = model if isinstance(model, Interpreter) else Interpreter(model)
        sig = next((s for s in interp.model.signatures if s.key == signature), None)
        if sig is None:
            raise InvalidInputError(f"no signature {signature!r}; the model has "
                                    f"{sorted(s.key for s in interp.model.signatures)}")
        sub = interp.model.subgraphs[sig.subgraph]
        shapes = {}
        input_shapes = dict(input_shapes or {})
        unknown = sorted(set(input_shapes) - set(sig.inputs))
        if unknown:
            raise InvalidInputError(f"signature {signature!r} has no input(s) {unknown}; its "
                                    f"inputs are {sorted(sig.inputs)}")
        for name, i in sig.inputs.items():
            if name in input_shapes:
                shape = tuple(int(d) for d in input_shapes[name])
                check_shape(sub.tensors[i], shape, f"input {name!r}")
            else:
                shape = tuple(max(d, 1) for d in sub.tensors[i].shape)
            shapes[i] = shape
        plan = interp.plan_for(list(sig.inputs.values()), list(sig.outputs.values()), shapes,
                               sig.targets)
        planned = {name: shapes[i] for name, i in sig.inputs.items()}
        for profile in (device_profile, server_profile):
            shared = {k: tuple(v) for k, v in (profile.shapes if profile else {}).items() if k in planned}
            if profile is not None and shared and shared != {k: planned[k] for k in shared}:
                _log.warning("profile of %s was measured at input shapes %s, the plan is for %s: "
                             "its times may not apply", profile.device, profile.shapes, planned)
        flops = plan.flops()
        made = {t for i in plan.order for t in sub.operators[i].outputs}
        activations = set(sig.inputs.values()) | made
        outputs = set(sig.outputs.values())
        ratio = server_speed / device_speed
        pins = dict(pins or {})

        ops, tensors = [], [_tensor(sub, plan, i, outputs) for i in sig.inputs.values()]
        for i in plan.order:
            op = sub.operators[i]
            name = op_name(sub, i)
            view = registry.get(op.opcode).view
            estimate = _estimate(plan, i, flops[i])
            dev = device_profile.seconds.get(name) if device_profile else None
            srv = server_profile.seconds.get(name) if server_profile else None
            device_s = 0.0 if view else dev if dev is not None else \
                srv * ratio if srv is not None else estimate / device_speed
            cloud_s = 0.0 if view else srv if srv is not None else \
                dev / ratio if dev is not None else estimate / server_speed
            ins = tuple(dict.fromkeys(sub.tensors[t].name for t in op.inputs if t in activations))
            params = {sub.tensors[t].name: plan.arrays[t].nbytes for t in op.inputs
                      if t not in activations}
            ops.append(Op(name, op.opcode, ins, tuple(sub.tensors[t].name for t in op.outputs),
                          device_s, cloud_s, params, pins.pop(name, op.placement or None),
                          flops[i], operator=i))
            source = sub.tensors[op.inputs[0]].name if view and op.inputs[0] in activations else None
            tensors += [_tensor(sub, plan, t, outputs, source) for t in op.outputs]
        if pins:
            raise InvalidInputError(f"pins name unknown op(s) {sorted(pins)}; ops are "
                                    f"{[o.name for o in ops]}")
        return cls(ops, tensors, compression)


def _tensor(sub, plan, i, outputs, view_of=None):
    a = plan.arrays[i]
    return Tensor(sub.tensors[i].name, a.dtype, a.shape, i in outputs, view_of)
