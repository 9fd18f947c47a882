"""Random cost graphs, and a brute-force reference for their placements.

The reference scores every one of the 2**n device/cloud assignments at once with numpy,
straight from the execution model's definition (tests/splitter does not trust the planner's
own cost function for this); memory is simulated op by op.
"""
import numpy as np

from edgeflow.splitter import CostGraph, CostOp, CostTensor, Link


def random_graph(rng, n, pin_rate=0.0, param_rate=0.0, compression="none"):
    """A random DAG of `n` ops over 1-2 graph inputs: ops read 1-3 earlier tensors (so
    diamonds and tensors with many readers), some make two outputs, several outputs."""
    tensors = []

    def new_tensor(name):
        dtype = np.float32 if rng.random() < 0.8 else np.int32
        tensors.append(CostTensor(name, dtype, (int(rng.integers(1, 5000)),)))
        return name

    available = [new_tensor(f"in{k}") for k in range(int(rng.integers(1, 3)))]
    ops = []
    for k in range(n):
        reads = rng.choice(len(available), size=min(len(available), int(rng.integers(1, 4))),
                           replace=False)
        recent = available[-1] if rng.random() < 0.6 else None  # mostly chain-like
        inputs = list(dict.fromkeys([available[r] for r in reads] + ([recent] if recent else [])))
        outputs = [new_tensor(f"t{k}")] + ([new_tensor(f"t{k}b")] if rng.random() < 0.2 else [])
        device_s = float(rng.exponential(0.02))
        cloud_s = device_s * float(rng.uniform(0.02, 0.6))
        r = rng.random()
        pinned = ("device" if r < pin_rate / 2 else "cloud" if r < pin_rate else None)
        params = {f"w{k}": int(rng.integers(1, 20000))} if rng.random() < param_rate else {}
        if params and rng.random() < 0.3 and k > 0:  # a weight shared with an earlier op
            params[f"w{int(rng.integers(0, k))}"] = 5000
        ops.append(CostOp(outputs[0], "op", inputs, outputs, device_s, cloud_s, params, pinned))
        available += outputs
    read = {name for op in ops for name in op.inputs}
    for t in tensors:
        produced = any(t.name in op.outputs for op in ops)
        t.is_output = produced and (t.name not in read or rng.random() < 0.1)
    # Shared weights need one size everywhere.
    sizes = {}
    for op in ops:
        for w, b in op.params.items():
            sizes.setdefault(w, b)
        op.params = {w: sizes[w] for w in op.params}
    return CostGraph(ops, tensors, compression)


def random_link(rng, overhead=False):
    """A random Link; with `overhead`, a per-call overhead of 0 or 0.5-5 ms."""
    link = Link(float(rng.uniform(0.5e6, 50e6)), float(rng.uniform(1e6, 100e6)),
                float(rng.choice([0.0, rng.uniform(0.001, 0.2)])))
    if overhead:
        link = Link(link.up_bps, link.down_bps, link.rtt_s, "", float(rng.choice([0.0, rng.uniform(5e-4, 5e-3)])))
    return link


def raw_wire_bytes(t, compression):
    if t.dtype != np.float32 or compression == "none":
        return t.nbytes
    return {"fp16": 2 * t.elements, "int8": t.elements + 4}[compression]


def all_assignments(n):
    """(2**n, n) bools: row b puts op k on the device when bit k of b is set."""
    return (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1 == 1


def brute_force(cg, link, objective):
    """(assignments, valid mask, cost per assignment) over every assignment."""
    n = len(cg.ops)
    A = all_assignments(n)
    valid = np.ones(len(A), bool)
    index = {op.name: k for k, op in enumerate(cg.ops)}
    producer = {t: index[op.name] for op in cg.ops for t in op.outputs}
    for k, op in enumerate(cg.ops):
        for t in op.inputs:
            if t in producer:  # a device op never reads a cloud-made tensor
                valid &= ~(A[:, k] & ~A[:, producer[t]])
        if op.pinned == "device":
            valid &= A[:, k]
        elif op.pinned == "cloud":
            valid &= ~A[:, k]
    device = A @ np.array([op.device_s for op in cg.ops])
    cloud = ~A @ np.array([op.cloud_s for op in cg.ops])
    up = np.zeros(len(A))
    down = np.zeros(len(A))
    for t in cg.tensors.values():
        readers = [k for k, op in enumerate(cg.ops) if t.name in op.inputs]
        on_device = A[:, producer[t.name]] if t.name in producer else np.ones(len(A), bool)
        if readers:
            sent = on_device & (~A[:, readers]).any(axis=1)
            up += sent * (raw_wire_bytes(t, cg.compression) * 8 / link.up_bps)
        if t.is_output and t.name in producer:
            down += ~on_device * (raw_wire_bytes(t, cg.compression) * 8 / link.down_bps)
    uses_cloud = ~A.all(axis=1)
    if objective == "latency":  # a round trip: the RTT and the per-call overhead, once
        total = device + cloud + up + down + uses_cloud * (link.rtt_s + link.overhead_s)
    else:  # the device's busy time: the per-call overhead is its own RPC work
        total = device + up + down + uses_cloud * link.overhead_s
    return A, valid, total


def margin_choice(A, valid, total, margin, min_gain_s):
    """The row the margin rule picks, from brute force's arrays: device-only (all bits,
    when valid), cloud-only (the smallest valid device side: valid sets are closed under
    intersection, so it is unique) or the best valid cut with ops on both sides; a
    placement using the cloud must gain more than `margin` * and `min_gain_s` over
    device-only, a two-sided cut the same over cloud-only too. Also returns how close
    any comparison came to its threshold (seconds), to skip ties."""
    rows = np.flatnonzero(valid)
    full = len(A) - 1
    floor = int(rows[np.argmin(A[rows].sum(axis=1))])
    device_only = full if valid[full] else None
    others = [r for r in rows if r not in (full, floor)]
    split = min(others, key=lambda r: total[r]) if others else None
    closest = [np.inf]

    def beats(new, old):
        threshold = max(margin * total[old], min_gain_s)
        gain = total[old] - total[new]
        closest[0] = min(closest[0], abs(gain - threshold))
        return gain > threshold

    if device_only is None:
        base = floor
    elif floor == full or not beats(floor, full):
        base = full
    else:
        base = floor
    choice = base
    if split is not None and (device_only is None or beats(split, full)) and \
            (floor == full or beats(split, floor)):
        choice = split
    return choice, closest[0]


def simulated_memory(cg, dev):
    """Weights plus the most activation bytes alive at any device step, by simulation:
    at each step, a tensor made on the device (or a graph input) is alive if it exists
    by then and something still needs it on the device: a device reader at this step or
    later, or the upload / output at the end; and at the step that makes it (graph inputs:
    the first)."""
    weights = {}
    for op, d in zip(cg.ops, dev):
        if d:
            weights.update(op.params)
    steps = [k for k, d in enumerate(dev) if d]
    producer = {t: k for k, op in enumerate(cg.ops) for t in op.outputs}
    peak = 0
    for s in range(len(steps) + 1):  # step len(steps): the end, sending
        now = steps[s] if s < len(steps) else len(cg.ops)
        live = 0
        for t in cg.tensors.values():
            p = producer.get(t.name)
            if p is not None and (not dev[p] or p > now):
                continue
            readers = [k for k, op in enumerate(cg.ops) if t.name in op.inputs]
            kept = t.is_output or any(not dev[k] for k in readers)
            if kept or any(dev[k] and k >= now for k in readers) or p == now or (p is None and s == 0):
                live += t.nbytes
        peak = max(peak, live)
    return sum(weights.values()) + peak
