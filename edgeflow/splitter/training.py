"""Splitting a training step between the device and the cloud (split learning).

Placement (issue: split training plan). Forward ops follow the cut; each backward op goes
where its forward op runs (but the sum of a cut tensor's gradient parts runs in the cloud,
where the parts are made), and each variable's update (its optimizer ops and slots) where
the variable lives, which is where the forward ops reading it run; so cloud-resident
variables and their slots never reach the device. The graph records which forward op each
backward op differentiates and which variable each update serves ("edgeflow.roles",
written when the model is packaged).

Labels: `labels="cloud"` sends the label inputs up with the activations (the cloud
computes the loss: one round trip per step, up: activations and labels, down: the loss
and the gradient at the cut). `labels="device"` keeps the loss and the labels on the
device (U-shaped split learning): every forward op that depends on a label input runs on
the device, so the step takes two round trips (activations up, the body's output down;
its gradient up, the gradient at the cut down) and the labels never leave the device.

Rounds. Each op gets a phase: device ops even, cloud ops odd, one more than the phase of
any input made on the other side. Round k is cloud phase 2k - 1: the device sends what
those ops read from it, the server runs them (and the variable writes among them), keeps
what later phases read, and returns what the device reads next. The device package
carries the plan; the cloud package is the whole model, run by tensor names
(`Interpreter.run`) so that the server needs no per-split signatures.
"""
import numpy as np

from .. import ops
from ..errors import PlacementError
from ..format import metadata
from ..format.model import ModelDef, OperatorDef, SignatureDef, SubGraphDef, TensorDef
from . import partition

LABELS = ("cloud", "device")
LOCAL_TRAIN = "train_local"


def roles_of(model):
    """The "edgeflow.roles" metadata as ({op: forward op or -1 - variable}, {op: variable},
    {variable: gradient tensor}); PlacementError if the model has none."""
    roles = metadata.roles(model)
    if roles is None:
        raise PlacementError("the model records no gradient roles (package it with this version "
                             "of edgeflow: ef.save / edgeflow convert --trainable)")
    return roles


class TrainingCut:
    """Sides, phases and rounds of a train signature split at `device_forward_ops` (the
    forward ops, by operator index, that run on the device).

    `rounds`: one dict per round trip: "uploads" (tensor indices the device sends),
    "downloads" (what it receives), "keep" (what the server retains for later rounds),
    "targets" (the cloud's variable writes to run), "fetches" (downloads and kept tensors
    the server computes this round).
    """

    def __init__(self, model, device_forward_ops, signature="train", labels="cloud", label_inputs=None):
        from ..interp.plan import needed_operators
        if labels not in LABELS:
            raise PlacementError(f"labels must be one of {LABELS}, got {labels!r}")
        sigs = {s.key: s for s in model.signatures}
        if signature not in sigs:
            raise PlacementError(f"the model has no signature {signature!r}; it has {sorted(sigs)}")
        self.model, self.signature, self.labels = model, sigs[signature], labels
        sub = self.subgraph = model.subgraphs[self.signature.subgraph]
        if any(ops.get(op.opcode).remote for op in sub.operators):
            raise PlacementError("the model is already split (it has send/recv ops)")
        grad_of, update_of, _ = roles_of(model)
        producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
        outputs = list(self.signature.outputs.values())
        self.ops = needed_operators(sub, outputs, producer, self.signature.targets)
        forward = [i for i in needed_operators(sub, outputs, producer)
                   if i not in grad_of and i not in update_of]
        device_forward = {i for i in forward if i in set(device_forward_ops)}
        inputs = dict(self.signature.inputs)
        if labels == "device":
            names = list(label_inputs) if label_inputs else self._guess_labels(forward, device_forward)
            unknown = [n for n in names if n not in inputs]
            if unknown:
                raise PlacementError(f"label inputs {unknown} are not inputs of {signature!r}: "
                                     f"{sorted(inputs)}")
            tainted = {inputs[n] for n in names}
            for i in forward:  # in execution order: the loss and what leads from the labels
                if any(t in tainted for t in sub.operators[i].inputs):
                    device_forward.add(i)
                    tainted.update(sub.operators[i].outputs)
            self.label_inputs = names
        else:
            self.label_inputs = []
        side = {i: ("device" if i in device_forward else "cloud") for i in forward}
        readers = {}
        for i in forward:
            for t in sub.operators[i].inputs:
                if sub.tensors[t].is_variable:
                    readers.setdefault(t, set()).add(side[i])
        both = {sub.tensors[v].name: v for v, s in readers.items() if len(s) > 1}
        if both:
            from .profiles import op_name
            name, v = next(iter(both.items()))
            by_side = {s_: [op_name(sub, i) for i in forward if v in sub.operators[i].inputs and side[i] == s_]
                       for s_ in ("device", "cloud")}
            raise PlacementError(f"variables {sorted(both)} are read by forward ops on both sides ({name!r}: "
                                 f"{by_side['device']} on the device, {by_side['cloud']} on the cloud); a "
                                 "variable lives on one side: put those ops on one side (edgeflow split "
                                 "plans so without --cut), or, for an ONNX model converted with "
                                 "--tie-shared-weights, convert without it")
        self.variable_side = {v: next(iter(s)) for v, s in readers.items()}
        for i in self.ops:
            if i in side:
                continue
            if i in update_of:
                side[i] = self.variable_side.get(update_of[i], "device")
            elif i in grad_of:
                of = grad_of[i]
                side[i] = side.get(of) if of >= 0 else self.variable_side.get(-1 - of, "device")
                side[i] = side[i] or "device"
            else:
                side[i] = "device"
        # A tensor the device sends that several cloud ops read gets a gradient part from
        # each. Their sum (adds the gradient code files under the tensor's producer, so on
        # the device) runs where the parts are made: the device receives one gradient per
        # cut tensor, not one per reader (a residual block's input: half the download).
        for i in self.ops:
            op = sub.operators[i]
            if side[i] == "device" and i in grad_of and op.opcode == "add" and op.inputs and all(
                    side.get(producer.get(t)) == "cloud" for t in op.inputs):
                side[i] = "cloud"
        self.side = side
        self._phases(producer)

    def _guess_labels(self, forward, device_forward):
        """The train inputs that the model's `infer` signature does not take (without one:
        those no device forward op reads): the labels."""
        infer = next((s for s in self.model.signatures if s.key == "infer"), None)
        if infer is not None:
            guess = [n for n in self.signature.inputs if n not in infer.inputs]
        else:
            read = {t for i in device_forward for t in self.subgraph.operators[i].inputs}
            guess = [n for n, t in self.signature.inputs.items() if t not in read]
        if not guess or len(guess) == len(self.signature.inputs):
            raise PlacementError("cannot tell the label inputs from the features (the model has no "
                                 "'infer' signature taking the features): name them (label_inputs=)")
        return guess

    def _phases(self, producer):
        sub, side = self.subgraph, self.side
        phase = {}
        for i in self.ops:
            p = 0
            for t in sub.operators[i].inputs:
                j = producer.get(t)
                if j in phase:
                    p = max(p, phase[j] + (side[j] != side[i]))
            if (p % 2 == 1) != (side[i] == "cloud"):
                p += 1
            phase[i] = p
        cloud_phases = [p for i, p in phase.items() if side[i] == "cloud"]
        for i in self.ops:  # the cloud's variable writes run in its last round, after every
            if side[i] == "cloud" and ops.get(sub.operators[i].opcode).stateful:  # read, as
                phase[i] = max(cloud_phases)  # in one run (their inputs are kept till then)
        self.phase = phase
        count = (max(cloud_phases) + 1) // 2 if cloud_phases else 0
        rounds = [{"uploads": [], "downloads": [], "keep": [], "targets": [], "fetches": []}
                  for _ in range(count)]
        inputs = set(self.signature.inputs.values())
        consumers = {}
        for i in self.ops:
            for t in sub.operators[i].inputs:
                consumers.setdefault(t, []).append(i)
        outputs = set(self.signature.outputs.values())
        for t, readers in consumers.items():
            p = producer.get(t)
            made_on = "device" if (p is None or p not in side) else side[p]
            if p is not None and p not in side and t not in inputs:
                continue  # a constant or variable: each side holds its own
            if p is None and t not in inputs:
                continue
            cloud_readers = [phase[r] for r in readers if side[r] == "cloud"]
            if made_on == "device" and cloud_readers:
                rounds[(min(cloud_readers) + 1) // 2 - 1]["uploads"].append(t)
            if made_on == "cloud":
                k = (phase[p] + 1) // 2 - 1
                if any(side[r] == "device" for r in readers):
                    rounds[k]["downloads"].append(t)
                if any(phase[r] > phase[p] for r in readers if side[r] == "cloud"):
                    rounds[k]["keep"].append(t)
            elif cloud_readers and len(set(cloud_readers)) > 1:
                rounds[(min(cloud_readers) + 1) // 2 - 1]["keep"].append(t)
        for t in outputs:
            p = producer.get(t)
            if p in side and side[p] == "cloud" and t not in rounds[(phase[p] + 1) // 2 - 1]["downloads"]:
                rounds[(phase[p] + 1) // 2 - 1]["downloads"].append(t)
        for i in self.ops:
            if side[i] == "cloud" and ops.get(sub.operators[i].opcode).stateful:
                rounds[(phase[i] + 1) // 2 - 1]["targets"].append(i)
        for r in rounds:
            r["fetches"] = list(dict.fromkeys(r["downloads"] + [t for t in r["keep"] if t in producer
                                                                 and producer[t] in side]))
        self.rounds = rounds

    def names(self, tensors):
        return [self.subgraph.tensors[t].name for t in tensors]

    def cloud_variables(self):
        """The variables that live on the cloud: read by its forward ops, or written by its
        updates (their optimizer slots): they never reach the device."""
        sub = self.subgraph
        found = {v for v, s in self.variable_side.items() if s == "cloud"}
        found |= {sub.operators[i].inputs[0] for i in self.ops
                  if self.side[i] == "cloud" and ops.get(sub.operators[i].opcode).stateful}
        return sorted(found)

    def plan_json(self):
        """The rounds by tensor names (what the device's requests carry)."""
        return [{"uploads": self.names(r["uploads"]), "downloads": self.names(r["downloads"]),
                 "keep": self.names(r["keep"]), "fetches": self.names(r["fetches"]),
                 "targets": list(r["targets"])} for r in self.rounds]


def device_package(model, cut, cloud_id, cloud_sha256, probe_shapes=None, extra_metadata=None):
    """The device's package: the whole model (its `train_local`, `infer`, `save`, `restore`
    unchanged) plus the split `train`: sends and recvs numbered by round, and copies of the
    device ops that run after a round trip, reading what came down."""
    sub = cut.subgraph
    tensors, operators = list(sub.tensors), list(sub.operators)
    n_original = len(tensors)
    shapes = partition.recv_shapes(model, cut.signature, sub, [t for r in cut.rounds for t in r["uploads"]],
                                   [t for r in cut.rounds for t in r["downloads"]], probe_shapes)
    receipts, receipt_round, remap, targets_extra = [], [], {}, []
    for k, r in enumerate(cut.rounds, 1):
        for t in r["uploads"]:
            src = sub.tensors[t]
            receipts.append(len(tensors))
            receipt_round.append(k)
            tensors.append(TensorDef(f"{src.name}:sent", src.dtype, (0,) + tuple(src.shape)))
            operators.append(OperatorDef("send", [remap.get(t, t)], [receipts[-1]],
                                         {"key": src.name, "round": k}))
        if not r["downloads"]:
            # Nothing comes back (the cloud only applies its updates): a recv of no tensor,
            # run as a target, still makes the round's call.
            targets_extra.append(len(operators))
            tensors.append(TensorDef(f"round{k}:ack", np.dtype(np.float32), (0,)))
            operators.append(OperatorDef("recv", [x for x, q in zip(receipts, receipt_round) if q <= k],
                                         [len(tensors) - 1], {"key": "", "dtype": np.dtype(np.float32),
                                                              "shape": (0,), "round": k}))
        for t in r["downloads"]:
            src = sub.tensors[t]
            remap[t] = len(tensors)
            tensors.append(TensorDef(f"{src.name}:recv", src.dtype, tuple(src.shape)))
            shape, src_input, src_dim = shapes[t]
            operators.append(OperatorDef("recv", [x for x, q in zip(receipts, receipt_round) if q <= k],
                                         [remap[t]], {"key": src.name, "dtype": src.dtype, "shape": shape,
                                                      "round": k, "shape_input": src_input,
                                                      "shape_dim": src_dim}))
        # The device ops of the next phase read what came down: copies that read the recvs.
        for i in cut.ops:
            if cut.side[i] != "device" or cut.phase[i] != 2 * k:
                continue
            op = sub.operators[i]
            outs = []
            for t in op.outputs:
                remap[t] = len(tensors)
                outs.append(remap[t])
                tensors.append(TensorDef(f"{sub.tensors[t].name}:split", sub.tensors[t].dtype,
                                         tuple(sub.tensors[t].shape)))
            operators.append(OperatorDef(op.opcode, [remap.get(t, t) for t in op.inputs], outs,
                                         dict(op.attrs), op.placement))
    sig = cut.signature
    # The split step's own variable writes: the copies of the device's phase >= 2 writes
    # (operators appended after the original ones) and its phase-0 writes.
    targets = []
    for k, op in enumerate(operators[len(sub.operators):], len(sub.operators)):
        if ops.get(op.opcode).stateful:
            targets.append(k)
    targets += [i for i in sig.targets if cut.side.get(i) == "device" and cut.phase.get(i) == 0]
    targets += targets_extra
    signatures = [SignatureDef(sig.key, dict(sig.inputs),
                               {n: remap.get(t, t) for n, t in sig.outputs.items()}, sig.subgraph, targets),
                  SignatureDef(LOCAL_TRAIN, dict(sig.inputs), dict(sig.outputs), sig.subgraph, list(sig.targets))]
    signatures += [s for s in model.signatures if s.key not in (sig.key, LOCAL_TRAIN)]
    meta = {"role": "device", "kind": "train", "cloud_model_id": cloud_id, "cloud_sha256": cloud_sha256,
            "signature": sig.key, "local_signature": LOCAL_TRAIN, "labels": cut.labels,
            "label_inputs": cut.label_inputs, "rounds": cut.plan_json(), "original_tensors": n_original,
            "cloud_variables": cut.names(cut.cloud_variables())}
    meta.update(extra_metadata or {})
    inherited = metadata.without(model.metadata, metadata.SPLIT, metadata.MODEL_ID)
    new_sub = SubGraphDef(sub.name, tensors, operators, list(sub.inputs), list(sub.outputs))
    return ModelDef([new_sub] + list(model.subgraphs[1:]), signatures, {**inherited, **metadata.split_entry(meta)},
                    model.description)


def cloud_package(model, model_id):
    """The server's package: the whole model, under `model_id`, role "cloud"; its variables
    may be fetched (the device gathers the jointly trained model from both sides). It does
    not depend on the cut: every split of a model pairs with the same file."""
    variables = [t.name for t in model.subgraphs[0].tensors if t.is_variable]
    inherited = metadata.without(model.metadata, metadata.SPLIT, metadata.ROLE)
    return ModelDef(list(model.subgraphs), list(model.signatures),
                    {**inherited, **metadata.model_id_entry(model_id), **metadata.fetchable_entry(variables),
                     **metadata.role_entry("cloud")},
                    model.description)


def write_pair(model, device_forward_ops, out_dir, *, model_id, signature="train", labels="cloud",
               label_inputs=None, probe_shapes=None):
    """Write OUT_DIR/cloud.efl then OUT_DIR/device.efl for split training; the cut."""
    import os
    from ..format import writer
    cut = TrainingCut(model, device_forward_ops, signature, labels, label_inputs)
    cloud_path = os.path.join(out_dir, "cloud.efl")
    writer.write(cloud_package(model, model_id), cloud_path)
    sha = partition.file_sha256(cloud_path)
    writer.write(device_package(model, cut, model_id, sha, probe_shapes), os.path.join(out_dir, "device.efl"))
    return cut


def whole_model(device_model):
    """The model a split training device package was made from, with the device package's
    current variable values: the split `train` signature, its send/recv ops and their
    tensors dropped, `train_local` named `train` again, the split metadata removed. What
    `Interpreter.export` of a split training package writes (through its CloudDelegate)
    once the cloud's variables are pulled: the jointly trained model, as if trained
    locally."""
    info = metadata.split(device_model) or {}
    if info.get("kind") != "train" or "original_tensors" not in info:
        return device_model
    sub = device_model.subgraphs[0]
    n_tensors = info["original_tensors"]
    n_ops = next((k for k, op in enumerate(sub.operators) if any(t >= n_tensors for t in op.outputs)),
                 len(sub.operators))
    key = info.get("signature", "train")
    signatures = []
    for s in device_model.signatures:
        if s.key == key:
            continue
        if s.key == LOCAL_TRAIN:
            s = SignatureDef(key, dict(s.inputs), dict(s.outputs), s.subgraph, list(s.targets))
        signatures.append(s)
    whole = SubGraphDef(sub.name, list(sub.tensors[:n_tensors]), list(sub.operators[:n_ops]),
                        list(sub.inputs), list(sub.outputs))
    return ModelDef([whole] + list(device_model.subgraphs[1:]), signatures,
                    metadata.without(device_model.metadata, metadata.SPLIT), device_model.description)
