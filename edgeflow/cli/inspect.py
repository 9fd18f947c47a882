"""What `edgeflow inspect` reports about a model: signatures, ops, tensors, sizes."""
import json
import os
from collections import Counter

import numpy as np

from .. import dtypes
from . import arguments


def _dims(shape):
    return [None if d == -1 else int(d) for d in shape]


def describe(path, delegates=()):
    """A JSON-ready summary of the model at `path`; with `delegates`, also where each
    signature's ops run and why the rest fell back to the CPU."""
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

    from .. import ops
    from ..interp.plan import needed_operators
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    signatures = {}
    for sig in model.signatures:
        signatures[sig.key] = {
            "inputs": {n: {"dtype": dtypes.name(sub.tensors[i].dtype), "shape": _dims(sub.tensors[i].shape)}
                       for n, i in sig.inputs.items()},
            "outputs": {n: {"dtype": dtypes.name(sub.tensors[i].dtype), "shape": _dims(sub.tensors[i].shape)}
                        for n, i in sig.outputs.items()},
        }
        needed = needed_operators(sub, list(sig.outputs.values()), producer, sig.targets)
        remote = sum(1 for i in needed if ops.get(sub.operators[i].opcode).remote)
        if remote:  # a split package's signature: its plan needs the server
            signatures[sig.key].update(ops=len(needed), remote_ops=remote)
            continue
        plan = interp.plan_for(list(sig.inputs.values()), list(sig.outputs.values()),
                               {i: tuple(max(d, 1) for d in sub.tensors[i].shape)
                                for i in sig.inputs.values()}, sig.targets)
        signatures[sig.key].update(ops=len(plan.order), arena_bytes=plan.arena.nbytes,
                                   arena_lower_bound_bytes=plan.lower_bound)
        if delegates:
            signatures[sig.key]["placement"] = plan.placement_summary()
            signatures[sig.key]["fallbacks"] = [
                {"op": i, "type": sub.operators[i].opcode, "reason": why}
                for i, why in sorted(plan.fallbacks.items())]
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
        "subgraphs": [{"index": k, "name": sg.name, "inputs": len(sg.inputs), "outputs": len(sg.outputs),
                       "ops_by_type": dict(Counter(op.opcode for op in sg.operators).most_common())}
                      for k, sg in enumerate(model.subgraphs[1:], 1)],
        "tensors": [{"index": i, "name": t.name, "dtype": dtypes.name(t.dtype), "shape": _dims(t.shape),
                     "kind": kind(i, t)} for i, t in enumerate(sub.tensors)],
        "metadata": {k: len(v) for k, v in model.metadata.items()},
        "split": _split(model),
    }


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
                         "with the cloud (--cloud HOST:PORT)")
        else:
            lines.append(f"  {key}: {sig['ops']} ops, arena {_mib(sig['arena_bytes'])} "
                         f"(lower bound {_mib(sig['arena_lower_bound_bytes'])}, dynamic dims = 1)")
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
    lines.append("ops by type:")
    lines.extend(f"  {op:16} {n}" for op, n in info["ops_by_type"].items())
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
    return "\n".join(lines)


def add_parser(verbs):
    p = verbs.add_parser("inspect", help="show a model's signatures, ops, tensors and sizes",
                         description="Show a model's signatures, ops by type, tensors, "
                                     "parameters, bytes and arena size.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    arguments.add_accel_args(p)
    p.set_defaults(fn=cmd_inspect)


def cmd_inspect(args):
    info = describe(args.model, delegates=arguments.delegates(args))
    print(json.dumps(info, indent=2) if args.json else render(info))
