"""Op times for the split planner: measured on a machine (a `Profile`, the interpreter's
profiler run there and saved as JSON), or estimated on a reference device from an op's
arithmetic and the bytes it moves:

    estimate = flops / REFERENCE_FLOPS_PER_S + bytes / REFERENCE_BYTES_PER_S + REFERENCE_OP_OVERHEAD_S

Reshape-like ops cost nothing (they alias their input's bytes and run no kernel). Ops go
by `op_name` in profiles and plans.
"""
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field

import numpy as np

from ..atomic import write_text
from ..errors import FormatError, InvalidInputError

# The reference device of the estimates: one phone-class CPU core running numpy kernels.
REFERENCE_FLOPS_PER_S = 10e9
REFERENCE_BYTES_PER_S = 5e9
REFERENCE_OP_OVERHEAD_S = 20e-6  # the interpreter's per-op dispatch, numpy call included

_PROFILE_KIND = "edgeflow-profile"
_PROFILE_VERSION = 1


@dataclass
class Profile:
    """Seconds per op on one machine, keyed by op name (its first output's name);
    `shapes` records the input shapes it was measured at ({input name: [dims]}). `total`
    is the median whole run in seconds (0 when not measured) and `scale` the factor the
    per-op medians were multiplied by to add up to it (1.0 when they were not)."""

    device: str
    seconds: dict
    runs: int = 0
    shapes: dict = field(default_factory=dict)
    total: float = 0.0
    scale: float = 1.0

    def save(self, path):
        """Write as JSON atomically: a temp file in the same folder, fsynced, renamed."""
        text = json.dumps({"format": _PROFILE_KIND, "version": _PROFILE_VERSION,
                           "device": self.device, "runs": self.runs, "seconds": self.seconds,
                           "total": self.total, "scale": self.scale,
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
        total, scale = doc.get("total", 0.0), doc.get("scale", 1.0)  # absent in older profiles
        for key, v in (("total", total), ("scale", scale)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise FormatError(f"{path}: {key} is {v!r}; expected a number >= 0")
        return cls(device, {k: float(v) for k, v in seconds.items()}, runs,
                   {k: tuple(v) for k, v in shapes.items()}, float(total), float(scale))


def op_name(subgraph, index):
    """The name an op goes by in profiles and plans: its first output's, else opcode#index."""
    op = subgraph.operators[index]
    return subgraph.tensors[op.outputs[0]].name if op.outputs else f"{op.opcode}#{index}"


DEFAULT_RUNS = 20


SCALES = ("runs", "none")


def measure_profile(model, signature="infer", inputs=None, runs=DEFAULT_RUNS, delegates=(), device=None,
                    input_shapes=None, scale="runs"):
    """Profile a model's signature on this machine: the median seconds of each op over
    `runs` invocations, after one unprofiled warm-up.

    `scale="runs"` (the default) multiplies the per-op medians by one factor so that they
    add up to the median whole run. Timing ops alone misses what a whole run pays between
    and across them: on a device held to a CPU quota, each short op fits in one quota
    slice and the median never sees the throttling (a BERT-like encoder at 5% of a core:
    144 ms by op medians, 580-720 ms per run), and the interpreter's dispatch between
    ops. `scale="none"` keeps the medians as measured.

    `model`: a path or the file's bytes. `inputs`: {name: array}; missing ones are random
    at `input_shapes` ({name: shape}) or the signature's shapes (dynamic dimensions 1). With `delegates`, a delegated
    partition is timed as a whole and its time shared among its ops in proportion to
    their estimated cost.
    """
    from ..interp.inputs import random_inputs
    from ..interp import Interpreter
    if runs < 1:
        raise InvalidInputError(f"runs must be >= 1, got {runs}")
    if scale not in SCALES:
        raise InvalidInputError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    interp = Interpreter(model, delegates=delegates)
    runner = interp.get_signature_runner(signature)
    feeds = random_inputs(runner, inputs or {}, shapes=input_shapes)
    runner(**feeds)
    profiler = interp.enable_profiling()
    samples = {}  # op -> its seconds in each run: the median resists a busy machine's outliers
    whole = []  # each run's wall time
    for _ in range(runs):
        before = {i: r.total_ns for i, r in profiler.records.items()}
        t0 = time.perf_counter()
        runner(**feeds)
        whole.append(time.perf_counter() - t0)
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
        weights = [estimated_seconds(plan, j, flops[j]) for j in group]
        total = sum(weights)
        for j, w in zip(group, weights):
            seconds[op_name(sub, j)] = median * (w / total if total > 0 else 1 / len(group))
    total, factor = float(np.median(whole)), 1.0
    op_sum = sum(seconds.values())
    if scale == "runs" and op_sum > 0:
        factor = total / op_sum
        seconds = {name: s * factor for name, s in seconds.items()}
    if device is None:
        names = "+".join(["numpy"] + [d.name for d in delegates])
        device = f"{platform.node() or 'host'} ({platform.machine()}, {names})"
    return Profile(device, seconds, runs, {n: tuple(v.shape) for n, v in feeds.items()},
                   total, factor)


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


def moved_bytes(plan, i):
    """(bytes read, bytes written) by op `i` of `plan`: its inputs' (weights included) and
    its outputs', at the plan's shapes; (0, 0) for a reshape-like op (a view of its input)."""
    from .. import ops
    op = plan.subgraph.operators[i]
    if ops.get(op.opcode).view:
        return 0, 0
    return (sum(plan.arrays[t].nbytes for t in op.inputs), sum(plan.arrays[t].nbytes for t in op.outputs))


def estimated_seconds(plan, i, flops):
    """Reference-device seconds of op `i` of `plan`, doing `flops` (0 for reshape-like ops)."""
    from .. import ops
    op = plan.subgraph.operators[i]
    if ops.get(op.opcode).view:
        return 0.0
    return flops / REFERENCE_FLOPS_PER_S + sum(moved_bytes(plan, i)) / REFERENCE_BYTES_PER_S \
        + REFERENCE_OP_OVERHEAD_S
