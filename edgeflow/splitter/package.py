"""`edgeflow split` as a function: plan a model's split and write the pair of packages.

    result = split_file("model.efl", "out/", link="4g")
    # out/device.efl, out/cloud.efl, out/plan.json; result.table is the report

The cost graph is built from the model (with measured profiles where given), the
placement planned (or forced at `cut` tensors), and the model cut into a device package
and a cloud package (edgeflow.splitter.partition). The device package carries the cost graph
and the link it was planned for, so that a device can re-plan from the link it measures
when both packages hold the whole graph (the defaults). The cloud package (by default the
whole model under its id) is the same file for every cut and link: one server, hosting
it once, serves every split of the model.
"""
import json
import os
from dataclasses import dataclass

from ..atomic import write_text
from ..errors import InvalidInputError, PlacementError
from ..format import reader
from . import partition, planner, report
from .cost_graph import DEFAULT_SERVER_SPEED, CostGraph
from .links import Link
from .profiles import Profile


@dataclass
class SplitResult:
    placement: planner.Placement
    cost_graph: CostGraph
    link: Link
    model_id: str
    cloud_sha256: str
    paths: dict  # "device", "cloud", "plan" -> path
    cut_independent: bool = True  # cloud.efl is the whole model: the same file for every cut and link
    previous_cloud_sha256: str = None  # of the cloud.efl this split replaced in its folder, if any

    @property
    def table(self):
        return report.table(self.placement, self.cost_graph, self.link)


def _training_costs(model, model_path, cost_graph, train_shapes, profiles, device_speed, server_speed):
    """The forward graph's costs for a training step: each forward op carries the time of
    its backward ops and of the updates of the variables it reads (from the train
    signature's cost graph: profiles of `train` where given, estimates otherwise). Without
    a shape for every train input (the labels' too), each op's time is tripled instead."""
    from dataclasses import replace
    from .training import roles_of
    train = next((s for s in model.signatures if s.key == "train"), None)
    if train is None or (train_shapes and set(train_shapes) != set(train.inputs)):
        return CostGraph([replace(op, device_s=3 * op.device_s, cloud_s=3 * op.cloud_s)
                          for op in cost_graph.ops], list(cost_graph.tensors.values()), cost_graph.compression)
    steps = CostGraph.from_model(model_path, "train", train_shapes or None, *profiles,
                                 device_speed=device_speed, server_speed=server_speed,
                                 compression=cost_graph.compression)
    grad_of, update_of, _ = roles_of(model)
    sub = model.subgraphs[train.subgraph]
    forward = {op.operator for op in cost_graph.ops}
    readers = {}
    for i in forward:
        for t in sub.operators[i].inputs:
            if sub.tensors[t].is_variable:
                readers.setdefault(t, []).append(i)
    extra = {}
    for op in steps.ops:
        i = op.operator
        if i in grad_of:
            owners = [grad_of[i]] if grad_of[i] >= 0 else readers.get(-1 - grad_of[i], [])
        elif i in update_of:
            owners = readers.get(update_of[i], [])
        else:
            continue
        for f in (o for o in owners if o in forward):
            d, c = extra.get(f, (0.0, 0.0))
            extra[f] = (d + op.device_s / len(owners), c + op.cloud_s / len(owners))
    return CostGraph([replace(op, device_s=op.device_s + extra.get(op.operator, (0, 0))[0],
                              cloud_s=op.cloud_s + extra.get(op.operator, (0, 0))[1]) for op in cost_graph.ops],
                     list(cost_graph.tensors.values()), cost_graph.compression)


def _shared_variables(model, cost_graph):
    """{variable name: [op positions]} of the variables that several forward ops of the
    cost graph read: for split training those ops run on one side (a variable lives
    where its readers run), a constraint of the cut."""
    variables = {t.name for t in model.subgraphs[0].tensors if t.is_variable}
    readers = {}
    for op in cost_graph.ops:
        for name in op.params:
            if name in variables:
                readers.setdefault(name, []).append(op.index)
    return {v: ops for v, ops in readers.items() if len(ops) > 1}


def _check_shared(shared, placement, cost_graph, cut):
    """PlacementError if the forced `cut` puts ops that read one variable on both sides."""
    for variable, members in shared.items():
        sides = {cost_graph.ops[k].name: placement.side[cost_graph.ops[k].name] for k in members}
        if len(set(sides.values())) > 1:
            device = [n for n, side in sides.items() if side == "device"]
            cloud = [n for n, side in sides.items() if side == "cloud"]
            raise PlacementError(
                f"--cut {','.join(cut)} splits variable {variable!r}: ops {device} would read it on the "
                f"device and {cloud} on the cloud, and a variable lives on one side. Cut after them "
                f"(--cut {','.join(cost_graph.ops[members[-1]].outputs)}: all on the device) or before "
                f"them (--cut {','.join(cost_graph.ops[members[0]].inputs)}: all on the cloud), "
                "or leave out --cut to let the planner keep them together; if the model was converted "
                "from ONNX with --tie-shared-weights and they are an exporter's deduplicated copies "
                "(e.g. equal zero biases), convert without it to give each op its own variable")


def _write_training(model, model_path, out_dir, placement, cost_graph, link, device_ops, model_id,
                    labels, input_shapes):
    from . import training
    os.makedirs(out_dir, exist_ok=True)
    model_id = model_id or default_model_id(model_path)
    device_ops = _with_the_loss(model, device_ops, {op.operator for op in cost_graph.ops})
    previous = _previous_cloud(out_dir)
    cut = training.write_pair(model, device_ops, out_dir, model_id=model_id, labels=labels,
                              probe_shapes=input_shapes)
    sha = partition.file_sha256(os.path.join(out_dir, "cloud.efl"))
    paths = {k: os.path.join(out_dir, f) for k, f in
             (("device", "device.efl"), ("cloud", "cloud.efl"), ("plan", "plan.json"))}
    plan_json = report.to_json(placement, cost_graph, link)
    plan_json.update({"model_id": model_id, "cloud_sha256": sha, "cloud_cut_independent": True,
                      "train": True, "labels": labels,
                      "rounds": cut.plan_json(), "source": os.fspath(model_path)})
    write_text(paths["plan"], json.dumps(plan_json, indent=1) + "\n")
    return SplitResult(placement, cost_graph, link, model_id, sha, paths, True, previous)


def _previous_cloud(out_dir):
    """The SHA-256 of OUT_DIR/cloud.efl before a split overwrites it, or None."""
    path = os.path.join(out_dir, "cloud.efl")
    try:
        return partition.file_sha256(path) if os.path.isfile(path) else None
    except OSError:
        return None


def _with_the_loss(model, device_ops, planned):
    """`device_ops` and, when the device has everything the loss needs (the logits are on
    the device), the train step's forward ops that the plan did not cover (the loss): no
    round trip when the plan is device-only. Otherwise the loss is the cloud's, and the
    labels travel as they are (not their one-hot)."""
    from ..interp.plan import needed_operators
    from .training import roles_of
    sig = next(s for s in model.signatures if s.key == "train")
    sub = model.subgraphs[sig.subgraph]
    grad_of, update_of, _ = roles_of(model)
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    device, loss = set(device_ops), set()
    for i in needed_operators(sub, list(sig.outputs.values()), producer):
        if i in planned or i in grad_of or i in update_of:
            continue
        if all(producer.get(t) is None or producer[t] in device | loss for t in sub.operators[i].inputs):
            loss.add(i)
    outputs = [producer[t] for t in sig.outputs.values() if t in producer]
    return device | loss if outputs and all(o in device | loss for o in outputs) else device


def default_model_id(path):
    """`<file stem>-<first 12 hex digits of the file's SHA-256>`: one id per model version."""
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return f"{stem}-{partition.file_sha256(path)[:12]}"


def split_file(model_path, out_dir, *, link="4g", objective="latency", device_profile=None,
               server_profile=None, cut=None, input_shapes=None, compression="none",
               memory_budget=None, device_graph="full", cloud_graph="full", model_id=None,
               signature="infer", device_speed=1.0, server_speed=DEFAULT_SERVER_SPEED, pins=None,
               train=False, labels="cloud", adapt=None):
    """Plan and write OUT_DIR/{device.efl, cloud.efl, plan.json}; a SplitResult.

    `train`: split the model's `train` signature for split learning (edgeflow.splitter.training),
    with the labels sent to the cloud (`labels="cloud"`) or kept on the device ("device",
    U-shaped). The cut is planned on the forward graph (`signature`, "infer"), each op
    costing its own time, its backward ops' and its variables' updates' (see
    `_training_costs`), and each cut tensor paying its upload and its gradient's download
    (the link's up and down in series).

    `device_profile`/`server_profile`: Profile objects or paths to profile JSON. `cut`:
    tensor names to cut at instead of planning. `device_graph`/`cloud_graph`: "full" keeps
    the whole graph in that package too (fallback and re-planning), "cut" only its part.
    `adapt`: whether the device may move the cut at run time (both graphs "full"); by
    default it may unless the cut was forced with `cut` (the package records both).
    """
    link = Link.parse(link)
    profiles = [Profile.load(p) if isinstance(p, (str, os.PathLike)) else p
                for p in (device_profile, server_profile)]
    model = reader.load(model_path)
    planned_sig = next((s for s in model.signatures if s.key == signature), None)
    train_shapes = dict(input_shapes or {})
    if train and input_shapes and planned_sig is not None:  # the labels' shapes are the train signature's
        input_shapes = {k: v for k, v in input_shapes.items() if k in planned_sig.inputs}
    cost_graph = CostGraph.from_model(model_path, signature, input_shapes, *profiles,
                                      device_speed=device_speed, server_speed=server_speed,
                                      compression=compression, pins=pins)
    plan_link = link
    if train:
        cost_graph = _training_costs(model, model_path, cost_graph, train_shapes, profiles,
                                     device_speed, server_speed)
        trips = 2 if labels == "device" else 1
        plan_link = Link(1 / (1 / link.up_bps + 1 / link.down_bps), link.down_bps, link.rtt_s * trips,
                         f"{link.name} (a training step)", link.overhead_s * trips)
    shared = _shared_variables(model, cost_graph) if train else {}
    if cut:
        placement = planner.forced(cost_graph, list(cut), plan_link, objective)
        _check_shared(shared, placement, cost_graph, list(cut))
    else:
        placement = planner.plan(cost_graph, plan_link, objective, memory_budget,
                                 together=list(shared.values()))
    device_ops = partition.with_needs(model, placement.device_operators(cost_graph), signature)
    if train:
        return _write_training(model, model_path, out_dir, placement, cost_graph, plan_link, device_ops,
                               model_id, labels, input_shapes)
    os.makedirs(out_dir, exist_ok=True)
    model_id = model_id or default_model_id(model_path)
    if not model_id or any(c.isspace() for c in model_id):
        raise InvalidInputError(f"model id must be a non-empty word, got {model_id!r}")
    adaptive = device_graph == "full" and cloud_graph == "full"
    extra = {"compression": compression, "objective": objective, "cloud_graph": cloud_graph,
             "link": {"up_bps": link.up_bps, "down_bps": link.down_bps, "rtt_s": link.rtt_s,
                      "overhead_s": link.overhead_s},
             "adaptive": adaptive, "forced_cut": list(cut) if cut else None,
             "adapt": adaptive and (not cut if adapt is None else bool(adapt)),
             "original_tensors": len(model.subgraphs[0].tensors),
             "source_sha256": partition.file_sha256(model_path)}
    if adaptive:
        extra["cost_graph"] = cost_graph.to_json()
    previous = _previous_cloud(out_dir)
    cut_, sha = partition.write_pair(model, device_ops, out_dir, model_id=model_id, signature=signature,
                                     device_graph=device_graph, cloud_graph=cloud_graph,
                                     probe_shapes=input_shapes, extra_metadata=extra)
    paths = {k: os.path.join(out_dir, f) for k, f in
             (("device", "device.efl"), ("cloud", "cloud.efl"), ("plan", "plan.json"))}
    plan_json = report.to_json(placement, cost_graph, link)
    plan_json.update({"model_id": model_id, "cloud_sha256": sha, "device_graph": device_graph,
                      "cloud_graph": cloud_graph, "source": os.fspath(model_path),
                      "device_sha256": partition.file_sha256(paths["device"]),
                      "cloud_cut_independent": cloud_graph == "full"})
    write_text(paths["plan"], json.dumps(plan_json, indent=1) + "\n")
    return SplitResult(placement, cost_graph, link, model_id, sha, paths, cloud_graph == "full", previous)

