"""The split planner's cost graph: what each op costs on each side, and what each tensor
costs on the wire.

A `CostGraph` is a signature's ops in execution order (`CostOp`s), each with its time on
the device and on the cloud server, the weights it reads, and an optional pin to a side;
and the activation tensors between them (`CostTensor`s, graph inputs included) with their
sizes. Times come from a `Profile` (edgeflow.splitter.profiles), or, for ops a profile
lacks, are estimated there on the reference device and divided by the side's `speed`
relative to it (`device_speed`, default 1; `server_speed`, default 10: a server CPU core
with a tuned BLAS runs numpy kernels roughly an order of magnitude faster than a
phone-class core). When only the other side has a measured time, it is scaled by the
speed ratio instead. A tensor's bytes on the wire depend on the graph's compression
(edgeflow.splitter.links).
"""
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from .. import dtypes
from ..errors import EdgeflowError, FormatError, GraphError, InvalidInputError
from .links import COMPRESSIONS, wire_bytes
from .profiles import estimated_seconds, op_name

SIDES = ("device", "cloud")
DEFAULT_SERVER_SPEED = 10.0
_log = logging.getLogger("edgeflow")


@dataclass
class CostOp:
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
class CostTensor:
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
    docstring. Built from a model with `CostGraph.from_model`, or directly from CostOp and
    CostTensor lists (copies are kept; producers, consumers and indices are filled in).
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
        """The CostOp called `name`."""
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
                "tensors": [{"name": t.name, "dtype": dtypes.name(t.dtype), "shape": list(t.shape),
                             "is_output": t.is_output, "view_of": t.view_of}
                            for t in self.tensors.values()]}

    @classmethod
    def from_json(cls, data):
        """The CostGraph `to_json` described; FormatError if `data` is not one."""
        try:
            ops = [CostOp(o["name"], o["opcode"], tuple(o["inputs"]), tuple(o["outputs"]),
                          float(o["device_s"]), float(o["cloud_s"]), dict(o["params"]), o["pinned"],
                          int(o["flops"]), o["operator"]) for o in data["ops"]]
            tensors = [CostTensor(t["name"], dtypes.as_dtype(t["dtype"]), tuple(t["shape"]),
                                  bool(t["is_output"]), t["view_of"]) for t in data["tensors"]]
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
            estimate = estimated_seconds(plan, i, flops[i])
            dev = device_profile.seconds.get(name) if device_profile else None
            srv = server_profile.seconds.get(name) if server_profile else None
            device_s = 0.0 if view else dev if dev is not None else \
                srv * ratio if srv is not None else estimate / device_speed
            cloud_s = 0.0 if view else srv if srv is not None else \
                dev / ratio if dev is not None else estimate / server_speed
            ins = tuple(dict.fromkeys(sub.tensors[t].name for t in op.inputs if t in activations))
            params = {sub.tensors[t].name: plan.arrays[t].nbytes for t in op.inputs
                      if t not in activations}
            ops.append(CostOp(name, op.opcode, ins, tuple(sub.tensors[t].name for t in op.outputs),
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
    return CostTensor(sub.tensors[i].name, a.dtype, a.shape, i in outputs, view_of)
