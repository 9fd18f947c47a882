"""What `edgeflow inspect` reports about a model: signatures, every op with its FLOPs and
bytes per run (OpDef.cost through Plan.flops, the bytes as the split planner's cost model
counts them), tensors, sizes and decoded metadata; `--svg` draws it (edgeflow.cli.draw)."""
import json
import os
import sys
from collections import Counter

import numpy as np

from .. import dtypes
from ..atomic import atomic_file
from ..errors import InvalidInputError
from . import arguments


def _dims(shape):
    return [None if d == -1 else int(d) for d in shape]


def describe(path, delegates=(), input_shapes=None):
    """A JSON-ready summary of the model at `path`: signatures, every op with its FLOPs and
    bytes per run, tensors, sizes and decoded metadata. Each signature is planned at
    `input_shapes` ({input name: shape}) where given, else at its declared shapes with
    dynamic dimensions 1; an op's figures are those of the first signature that runs it.
    With `delegates`, also where each op runs and why the rest fell back to the CPU."""
    from ..format import reader
    from ..interp import Interpreter
    interp = Interpreter(path, delegates=delegates)
    model = interp.model
    sub = model.subgraphs[0]
    consts = [t for t in sub.tensors if t.data is not None and not t.is_variable]
    variables = [t for t in sub.tensors if t.is_variable]
    produced = {t for op in sub.operators for t in op.outputs}

    def kind(i, t):
        if t.is_variable:
            return "variable"
        if t.data is not None:
            return "constant"
        if i in sub.inputs:
            return "input"
        return "output" if i in sub.outputs else ("intermediate" if i in produced else "unused")

    given = dict(input_shapes or {})
    unknown = sorted(set(given) - {n for s in model.signatures for n in s.inputs})
    if unknown:
        raise InvalidInputError(f"--input-shape names no input of any signature: {unknown}; the inputs are "
                                f"{sorted({n for s in model.signatures for n in s.inputs})}")
    ops = _ops(sub)
    signatures = {sig.key: _signature(interp, sig, given, ops, delegates) for sig in model.signatures}
    sides = _sides(model)
    if sides is not None:
        for o in ops:
            o["side"] = sides[o["index"]]
    sizes = reader.file_info(path)
    return {
        "file": os.fspath(path),
        "version": model.version,
        "producer": model.producer,
        "description": model.description,
        "file_bytes": sizes.file_bytes,
        "weight_bytes": sizes.weight_bytes,
        "overhead_bytes": sizes.file_bytes - sizes.weight_bytes,
        "parameters": int(sum(np.prod(t.shape, dtype=np.int64) for t in consts + variables
                              if t.dtype.kind == "f" or t.quantization is not None)),
        "variables": int(sum(np.prod(t.shape, dtype=np.int64) for t in variables)),
        "signatures": signatures,
        "ops_by_type": dict(Counter(op.opcode for op in sub.operators).most_common()),
        "ops": ops,
        "subgraphs": [{"index": k, "name": sg.name, "inputs": len(sg.inputs), "outputs": len(sg.outputs),
                       "ops_by_type": dict(Counter(op.opcode for op in sg.operators).most_common())}
                      for k, sg in enumerate(model.subgraphs[1:], 1)],
        "tensors": [{"index": i, "name": t.name, "dtype": dtypes.name(t.dtype), "shape": _dims(t.shape),
                     "kind": kind(i, t)} for i, t in enumerate(sub.tensors)],
        "metadata": {k: metadata_value(v) for k, v in model.metadata.items()},
        "split": _split(model),
    }


def _ops(sub):
    """Every op of subgraph 0, as describe lists it, before any signature is planned."""
    from ..splitter.profiles import op_name
    return [{"index": i, "name": op_name(sub, i), "type": op.opcode, "inputs": list(op.inputs),
             "outputs": list(op.outputs), "status": "unused", "signature": None, "placement": None,
             "flops": None, "bytes_read": None, "bytes_written": None}
            for i, op in enumerate(sub.operators)]


def _signature(interp, sig, given, ops, delegates):
    """A signature's summary; fills in `ops` (describe's list) for the ops its plan runs
    that no earlier signature's did. A split package's signature (send/recv ops) is
    planned up to the link: what the device computes before it sends."""
    from .. import ops as registry
    from ..interp.interpreter import check_shape
    from ..interp.plan import needed_operators
    from ..splitter.profiles import moved_bytes
    sub = interp.model.subgraphs[0]
    io = {side: {n: {"dtype": dtypes.name(sub.tensors[i].dtype), "shape": _dims(sub.tensors[i].shape)}
                 for n, i in getattr(sig, side).items()} for side in ("inputs", "outputs")}
    shapes = {}
    for name, i in sig.inputs.items():
        if name in given:
            check_shape(sub.tensors[i], given[name], f"--input-shape {name}")
        shapes[i] = tuple(given.get(name, (max(d, 1) for d in sub.tensors[i].shape)))
    out = {**io, "planned_at": {n: list(shapes[i]) for n, i in sig.inputs.items()}}
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    needed = needed_operators(sub, list(sig.outputs.values()), producer, sig.targets)
    remote = {i for i in needed if registry.get(sub.operators[i].opcode).remote}
    targets, outputs = sig.targets, list(sig.outputs.values())
    if remote:  # a split package's signature: it runs with the server
        after = set(remote)
        for i in needed:  # in order: what reads what came back runs after the link
            if any(producer.get(t) in after for t in sub.operators[i].inputs):
                after.add(i)
        sent = [t for i in remote for t in sub.operators[i].inputs]
        outputs = list(dict.fromkeys(t for t in sent + outputs if producer.get(t) not in after))
        targets = [i for i in targets if i not in after]
        out.update(ops=len(needed), remote_ops=len(remote))
        for i in after:
            _mark(ops, i, "remote" if i in remote else "after the link", sig.key)
    plan = interp.plan_for(list(sig.inputs.values()), outputs, shapes, targets)
    if hasattr(plan, "boundary"):  # a StagedPlan: ops from the boundary on are sized when running
        before = set(needed_operators(sub, plan.before.outputs, producer))
        for i in needed:
            if i not in before:
                _mark(ops, i, "at run time", sig.key)
        out["sized_when_running_from_op"] = plan.boundary
        plan = plan.before
    flops = plan.flops()
    for i in plan.order:
        if ops[i]["status"] == "unused":
            read, written = moved_bytes(plan, i)
            ops[i].update(status="runs", signature=sig.key, placement=plan.placement.get(i, "cpu"),
                          flops=flops[i], bytes_read=read, bytes_written=written)
    for i in needed_operators(sub, plan.outputs, producer, targets):
        _mark(ops, i, "folded", sig.key)  # needed, not run: computed once when planned
    out["flops"] = sum(flops.values())
    if remote:
        return out
    out["ops"] = len(needed) if "sized_when_running_from_op" in out else len(plan.order)
    if "sized_when_running_from_op" not in out:
        out.update(arena_bytes=plan.arena.nbytes, arena_lower_bound_bytes=plan.lower_bound)
    if delegates:
        out["placement"] = plan.placement_summary()
        out["fallbacks"] = [{"op": i, "type": sub.operators[i].opcode, "reason": why}
                            for i, why in sorted(plan.fallbacks.items())]
    return out


def _mark(ops, i, status, key):
    if ops[i]["status"] == "unused":
        ops[i].update(status=status, signature=key)


def _sides(model):
    """{op index: "device" | "cloud" | "link"} for a package of `edgeflow split`, else None.
    A device package runs on the device the ops its split signature needs (send/recv: the
    link); the rest of its graph is the cloud's, kept to run alone when the server is
    unreachable. A cloud package's ops are all the cloud's."""
    from .. import ops as registry
    from ..format import metadata
    from ..interp.plan import needed_operators
    role = metadata.role(model)
    sub = model.subgraphs[0]
    if role is None or role == "cloud":
        return None if role is None else {i: "cloud" for i in range(len(sub.operators))}
    info = metadata.split(model) or {}
    sig = next((s for s in model.signatures if s.key == info.get("signature")), None)
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    device = set(range(len(sub.operators))) if sig is None else \
        set(needed_operators(sub, list(sig.outputs.values()), producer, sig.targets))
    return {i: "link" if registry.get(op.opcode).remote else "device" if i in device else "cloud"
            for i, op in enumerate(sub.operators)}


def metadata_value(raw):
    """A metadata entry as JSON: a JSON object or array as itself, other UTF-8 text as a
    string, other bytes as {"bytes": their count, "hex": the first 32 of them}."""
    data = bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"bytes": len(data), "hex": data[:32].hex()}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, (dict, list)) else text


def _split(model):
    """What a device package from `edgeflow split` pairs with and exchanges, or None."""
    from ..format import metadata
    info = metadata.split(model)
    if info is None:
        return None
    rounds = info.get("rounds") or [{"uploads": info.get("uploads", []), "downloads": info.get("downloads", [])}]
    return {"kind": info.get("kind", "infer"), "cloud_model_id": info.get("cloud_model_id"),
            "cloud_sha256": info.get("cloud_sha256"), "labels": info.get("labels"),
            "rounds": [{"uploads": r["uploads"], "downloads": r["downloads"]} for r in rounds]}


def _shape(dims):
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def _mib(n):
    return f"{n:,} B" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def render(info, max_tensors=30):
    """The summary as a readable text report."""
    lines = [f"{info['file']}: edgeflow model v{info['version']} by {info['producer']}"]
    if info["description"]:
        lines.append(f"  {info['description']}")
    lines.append(f"  file {_mib(info['file_bytes'])}, weights {_mib(info['weight_bytes'])}, "
                 f"overhead {_mib(info['overhead_bytes'])}; {info['parameters']:,} parameters"
                 + (f" ({info['variables']:,} in variables)" if info["variables"] else ""))
    lines.append("signatures:")
    for key, sig in info["signatures"].items():
        if "remote_ops" in sig:
            lines.append(f"  {key}: {sig['ops']} ops, {sig['remote_ops']} of them send/recv: runs "
                         f"with the cloud (--cloud HOST:PORT); {_flops(sig['flops'])} on the device before "
                         "the link")
        elif "sized_when_running_from_op" in sig:
            lines.append(f"  {key}: {sig['ops']} ops; sized when running from op "
                         f"{sig['sized_when_running_from_op']} on ({_flops(sig['flops'])} before it)")
        else:
            lines.append(f"  {key}: {sig['ops']} ops, {_flops(sig['flops'])}, arena {_mib(sig['arena_bytes'])} "
                         f"(lower bound {_mib(sig['arena_lower_bound_bytes'])})")
        if any(None in t["shape"] for t in sig["inputs"].values()):
            lines.append("    planned at " + ", ".join(f"{n}{_shape(d)}" for n, d in sig["planned_at"].items())
                         + " (--input-shape NAME=D1,D2,... sets them)")
        for side in ("inputs", "outputs"):
            for name, t in sig[side].items():
                lines.append(f"    {side[:-1]:6} {name}: {t['dtype']}{_shape(t['shape'])}")
        if "placement" in sig:
            lines.append(f"    placement: {sig['placement']}")
            lines.extend(f"    fallback op {f['op']:4} {f['type']:16} {f['reason']}" for f in sig["fallbacks"])
    split = info.get("split")
    if split:
        lines.append(f"split ({split['kind']}): pairs with cloud model {split['cloud_model_id']} "
                     f"(sha256 {str(split['cloud_sha256'])[:16]}...)"
                     + (f", labels on the {split['labels']}" if split.get("labels") else ""))
        for k, r in enumerate(split["rounds"], 1):
            lines.append(f"  round trip {k}: up {', '.join(r['uploads']) or '-'}; "
                         f"down {', '.join(r['downloads']) or '-'}")
    lines += _flops_table(info)
    if info["subgraphs"]:
        lines.append("subgraphs (run by if and while ops):")
        lines.extend(f"  {sg['index']:4} {sg['name']:16} {sg['inputs']} in, {sg['outputs']} out: "
                     + ", ".join(f"{n} {op}" for op, n in sg["ops_by_type"].items()) for sg in info["subgraphs"])
    tensors = info["tensors"]
    lines.append(f"tensors ({len(tensors)}):")
    for t in tensors[:max_tensors]:
        lines.append(f"  {t['index']:4} {t['kind']:12} {t['name']}: {t['dtype']}{_shape(t['shape'])}")
    if len(tensors) > max_tensors:
        lines.append(f"  ... {len(tensors) - max_tensors} more (--json lists all)")
    if info["metadata"]:
        lines.append("metadata:")
        for key, value in info["metadata"].items():
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            lines.append(f"  {key}: " + (text if len(text) <= 100 else text[:99] + "\u2026"))
    return "\n".join(lines)


def _flops(n):
    return next((f"{n / 10 ** e:,.2f} {p}FLOPs" for e, p in ((9, "G"), (6, "M"), (3, "k")) if n >= 10 ** e),
                f"{n} FLOPs")


def _flops_table(info):
    """Lines of the per-op-type table: type, count, FLOPs per run, share of the total."""
    flops = Counter()
    for o in info["ops"]:
        flops[o["type"]] += o["flops"] or 0
    total = sum(flops.values())
    rows = sorted(info["ops_by_type"].items(), key=lambda item: (-flops[item[0]], -item[1], item[0]))
    lines = ["ops by type (FLOPs per run: each op once, as the first signature that runs it is planned):",
             f"  {'type':16} {'count':>5} {'FLOPs':>15} {'share':>6}"]
    lines += [f"  {op:16} {n:5} {flops[op]:15,} {flops[op] / total if total else 0:6.1%}" for op, n in rows]
    lines.append(f"  {'total':16} {len(info['ops']):5} {total:15,}")
    return lines


def add_parser(verbs):
    p = verbs.add_parser("inspect", help="show a model's signatures, ops, tensors and sizes",
                         description="Show a model's signatures, ops by type with their FLOPs, tensors, "
                                     "parameters, bytes, arena size and metadata; --svg draws the graph.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of text (every op with its FLOPs and bytes, metadata decoded)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="plan for this input shape (default: declared, dynamic dimensions 1); FLOPs, "
                        "bytes and arena sizes are for it")
    p.add_argument("--svg", metavar="FILE",
                   help="also draw the graph to FILE: ops coloured by the backend that runs them (see "
                        "--accel) or, in a package of `edgeflow split`, by side; tensors with their shapes "
                        "(needs the 'draw' extra)")
    arguments.add_accel_args(p)
    p.set_defaults(fn=cmd_inspect)


def cmd_inspect(args):
    if args.svg:
        from .draw import require
        require()
    info = describe(args.model, delegates=arguments.delegates(args),
                    input_shapes=arguments.parse_shapes(args.input_shape))
    if args.svg:
        from ..format import reader
        from .draw import model_svg
        with atomic_file(args.svg) as f:
            f.write(model_svg(reader.load(args.model), info).encode("utf-8"))
    print(json.dumps(info, indent=2) if args.json else render(info))
    if args.svg:
        print(f"wrote {args.svg}", file=sys.stderr)
