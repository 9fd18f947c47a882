"""Cutting a model in two: a device package with send/recv ops, and a cloud package.

Given a model and the set of ops that run on the device (a placement from the planner,
or a forced cut), each tensor that crosses the cut becomes a `send` on the device side,
named by a rendezvous key (the tensor's name), and each output the cloud computes a
`recv` (see edgeflow/ops/comm.py). A tensor several cloud ops read is sent once.

The device package's `infer` signature runs the device part and exchanges the cut
tensors through send/recv; with `device_graph="full"` it also keeps the whole graph as
`infer_local` (the weights are shared, not copied), so that it can run alone when the
cloud is unreachable and can be cut again at run time. The cloud package holds the
cloud part (`cloud_graph="cut"`), or the whole graph (`"full"`, the default): the model
itself under its id, the same file whatever the cut and the link, so that one server
serves every split of a model and the device can choose another cut without a new
package: the server computes any tensors from any fed tensors (`Interpreter.run`).
Each package says its role in metadata "edgeflow.role" ("cloud" or "device").

The device package's metadata "edgeflow.split" names the cloud package it pairs with
(model id and SHA-256 of its file), and the server refuses a mismatched pair.
"""
import copy
import hashlib

from .. import ops
from ..errors import PlacementError
from ..format import metadata, writer
from ..format.model import ModelDef, OperatorDef, SignatureDef, SubGraphDef, TensorDef

LOCAL_SIGNATURE = "infer_local"


class Cut:
    """The ops of one signature, and which of them run on the device.

    `ops` are the operator indices the signature's outputs need (in execution order);
    `uploads` the tensors the device sends (produced on the device, or graph inputs, and
    read by a cloud op); `downloads` the signature outputs the cloud computes.
    """

    def __init__(self, model, device_ops, signature="infer"):
        from ..interp.plan import needed_operators
        sigs = {s.key: s for s in model.signatures}
        if signature not in sigs:
            raise PlacementError(f"the model has no signature {signature!r}; it has {sorted(sigs)}")
        self.model, self.signature = model, sigs[signature]
        sub = model.subgraphs[self.signature.subgraph]
        self.subgraph = sub
        remote = [op.opcode for op in sub.operators if ops.get(op.opcode).remote]
        if remote:
            raise PlacementError("the model is already split (it has send/recv ops); split the "
                                 "original model")
        producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
        outputs = list(self.signature.outputs.values())
        self.ops = needed_operators(sub, outputs, producer, self.signature.targets)
        self.device = {i for i in self.ops if i in set(device_ops)}
        cloud = [i for i in self.ops if i not in self.device]
        for i in self.device:
            for t in sub.operators[i].inputs:
                if producer.get(t) in cloud:
                    raise PlacementError(
                        f"op {i} ({sub.operators[i].opcode}) on the device reads "
                        f"{sub.tensors[t].name!r}, which the cloud computes: a split runs the "
                        "device part first, so the device side must hold every op its ops depend on")
        cloud_reads = {t for i in cloud for t in sub.operators[i].inputs}
        inputs = set(self.signature.inputs.values())
        self.uploads = [t for t in dict.fromkeys(t for i in cloud for t in sub.operators[i].inputs)
                        if (t in inputs or producer.get(t) in self.device) and t in cloud_reads]
        self.downloads = [t for t in outputs if producer.get(t) in cloud]
        self.cloud = cloud

    def names(self, tensors):
        return [self.subgraph.tensors[t].name for t in tensors]


def cloud_package(model, cut, model_id, graph="full"):
    """The ModelDef the server hosts, with metadata "edgeflow.role" = "cloud".

    graph="full" (the default): the whole model as it is, under `model_id`: its bytes
    depend only on the model and the id, never on the cut or the link (`cut` may be
    None), so every split and re-split of a model pairs with one cloud package, and the
    server checks each request's feeds and fetches against the model itself (a request
    feeds tensors computed from a signature's inputs and fetches those or the outputs:
    edgeflow.cloud.models.exposed). graph="cut": only the cloud ops, with the uploaded
    tensors as inputs and a signature `infer` mapping the names of what the device sends
    to the names of what it fetches: smaller, but one package (one SHA-256) per cut."""
    if graph == "full":
        new = copy.copy(model)
        new.subgraphs, new.signatures = list(model.subgraphs), list(model.signatures)
        inherited = model.metadata
    elif graph == "cut":
        if cut is None:
            raise PlacementError("a cloud package of graph 'cut' needs the cut")
        sub, _ = _extract(cut.subgraph, cut.cloud, as_inputs=cut.uploads)
        names = {t.name: i for i, t in enumerate(sub.tensors)}
        inputs = {cut.subgraph.tensors[t].name: names[cut.subgraph.tensors[t].name] for t in cut.uploads}
        outputs = {cut.subgraph.tensors[t].name: names[cut.subgraph.tensors[t].name] for t in cut.downloads}
        new = ModelDef(subgraphs=[sub] + list(model.subgraphs[1:]), metadata={}, description=model.description,
                       signatures=[SignatureDef("infer", inputs, outputs, 0)])
        inherited = {}
    else:
        raise PlacementError(f"cloud graph must be 'full' or 'cut', got {graph!r}")
    new.metadata = {**metadata.without(inherited, metadata.SPLIT, metadata.ROLE, metadata.MODEL_ID),
                    **metadata.model_id_entry(model_id), **metadata.role_entry("cloud")}
    return new


def device_package(model, cut, cloud_id, cloud_sha256, graph="full", probe_shapes=None,
                   extra_metadata=None):
    """The ModelDef the device runs: its ops, a `send` per uploaded tensor, a `recv` per
    downloaded output; the whole graph too (as `infer_local`) when graph="full"."""
    sub = cut.subgraph
    if graph == "full":
        tensors, operators = list(sub.tensors), list(sub.operators)
        index = {t: t for t in range(len(tensors))}
        new_sub = SubGraphDef(sub.name, tensors, operators, list(sub.inputs), list(sub.outputs))
    elif graph == "cut":
        new_sub, index = _extract(sub, sorted(cut.device, key=cut.ops.index),
                                  keep=list(cut.signature.inputs.values()) + cut.uploads)
        tensors, operators = new_sub.tensors, new_sub.operators
    else:
        raise PlacementError(f"device graph must be 'full' or 'cut', got {graph!r}")
    shapes = recv_shapes(model, cut.signature, sub, cut.uploads, cut.downloads, probe_shapes)
    receipts = []
    for t in cut.uploads:
        src = sub.tensors[t]
        receipts.append(len(tensors))
        tensors.append(TensorDef(f"{src.name}:sent", src.dtype, (0,) + tuple(src.shape)))
        operators.append(OperatorDef("send", [index[t]], [receipts[-1]], {"key": src.name}))
    received = {}
    for t in cut.downloads:
        src = sub.tensors[t]
        received[t] = len(tensors)
        tensors.append(TensorDef(f"{src.name}:recv", src.dtype, tuple(src.shape)))
        shape, src_input, src_dim = shapes[t]
        operators.append(OperatorDef("recv", list(receipts), [received[t]], {
            "key": src.name, "dtype": src.dtype, "shape": shape,
            "shape_input": src_input, "shape_dim": src_dim}))
    sig = cut.signature
    signatures = [SignatureDef("infer", {n: index[t] for n, t in sig.inputs.items()},
                               {n: received.get(t, index.get(t)) for n, t in sig.outputs.items()})]
    if graph == "full":
        signatures.append(SignatureDef(LOCAL_SIGNATURE, dict(sig.inputs), dict(sig.outputs)))
    meta = {
        "role": "device", "cloud_model_id": cloud_id, "cloud_sha256": cloud_sha256,
        "signature": "infer", "local_signature": LOCAL_SIGNATURE if graph == "full" else None,
        "uploads": cut.names(cut.uploads), "downloads": cut.names(cut.downloads),
        "device_ops": [sub.tensors[sub.operators[i].outputs[0]].name for i in cut.ops
                       if i in cut.device],
    }
    if graph == "full":  # the original tensors come first: original_model() strips the rest
        meta["original_tensors"] = len(sub.tensors)
    meta.update(extra_metadata or {})
    # A cut graph renumbers the ops: the original's training roles would name the wrong ones.
    inherited = metadata.without(model.metadata, metadata.SPLIT, metadata.MODEL_ID, metadata.ROLE,
                                 *((metadata.ROLES,) if graph == "cut" else ()))
    return ModelDef(subgraphs=[new_sub] + list(model.subgraphs[1:]), signatures=signatures,
                    metadata={**inherited, **metadata.split_entry(meta), **metadata.role_entry("device")},
                    description=model.description)


def original_model(device_model):
    """The unsplit model inside a device package that holds the whole graph (the device
    graph "full"): its send/recv ops and their tensors removed, `infer_local` as the
    signature that was split. PlacementError if the package holds only its part."""
    info = metadata.split(device_model)
    if not info or info.get("local_signature") is None or "original_tensors" not in info:
        raise PlacementError("the device package holds only its part of the graph (split with "
                             "--device-graph full to re-plan on the device)")
    sub = device_model.subgraphs[0]
    local = next(s for s in device_model.signatures if s.key == info["local_signature"])
    kept = [op for op in sub.operators if not ops.get(op.opcode).remote]
    new_sub = SubGraphDef(sub.name, list(sub.tensors[:info["original_tensors"]]), kept,
                          list(sub.inputs), list(sub.outputs))
    return ModelDef([new_sub] + list(device_model.subgraphs[1:]), [SignatureDef(info["signature"], dict(local.inputs), dict(local.outputs),
                                             0, list(local.targets))],
                    metadata.without(device_model.metadata, metadata.SPLIT, metadata.ROLE),
                    device_model.description)


def with_needs(model, device_ops, signature="infer"):
    """`device_ops` (operator indices) and every op they need, transitively: the planner
    places only the ops of its cost graph, which folds away shape computations (Shape ->
    Gather -> Concat) whose values are known when planning; a device op reading one needs
    it on the device too."""
    sig = next((s for s in model.signatures if s.key == signature), None)
    if sig is None:
        raise PlacementError(f"the model has no signature {signature!r}")
    sub = model.subgraphs[sig.subgraph]
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    found, todo = set(device_ops), list(device_ops)
    while todo:
        for t in sub.operators[todo.pop()].inputs:
            p = producer.get(t)
            if p is not None and p not in found:
                found.add(p)
                todo.append(p)
    return found


def write_pair(model, device_ops, out_dir, *, model_id, signature="infer", device_graph="full",
               cloud_graph="full", probe_shapes=None, extra_metadata=None):
    """Write OUT_DIR/cloud.efl then OUT_DIR/device.efl (which names the cloud file's
    SHA-256); returns (cut, cloud sha256)."""
    import os
    cut = Cut(model, device_ops, signature)
    cloud_path = os.path.join(out_dir, "cloud.efl")
    writer.write(cloud_package(model, cut, model_id, cloud_graph), cloud_path)
    sha = file_sha256(cloud_path)
    writer.write(device_package(model, cut, model_id, sha, device_graph, probe_shapes, extra_metadata),
                 os.path.join(out_dir, "device.efl"))
    return cut, sha


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract(sub, op_indices, as_inputs=(), keep=()):
    """A subgraph of ops `op_indices` (in that order) and the tensors they touch, renumbered;
    tensors in `as_inputs` become plain inputs (their producers are not included)."""
    used = list(dict.fromkeys(list(keep) + list(as_inputs) + [t for i in op_indices for t in
                                                                  sub.operators[i].inputs + sub.operators[i].outputs]))
    index = {t: k for k, t in enumerate(used)}
    tensors = [sub.tensors[t] for t in used]
    operators = [OperatorDef(op.opcode, [index[t] for t in op.inputs], [index[t] for t in op.outputs],
                             dict(op.attrs), op.placement)
                 for op in (sub.operators[i] for i in op_indices)]
    inputs = [index[t] for t in dict.fromkeys(list(as_inputs) + [t for t in sub.inputs if t in index])]
    outputs = [index[t] for t in sub.outputs if t in index]
    return SubGraphDef(sub.name, tensors, operators, inputs, outputs), index


def recv_shapes(model, signature, sub, uploads, downloads, probe_shapes):
    """For each downloaded tensor: (shape with -1 where dynamic, receipt index per dim,
    receipt dimension per dim), found by inferring shapes at two probe input sizes and
    matching each dynamic dimension to a dimension of an uploaded tensor (receipts are
    numbered in the order of `uploads`)."""
    out = {}
    dynamic = [t for t in downloads if -1 in sub.tensors[t].shape]
    for t in downloads:
        out[t] = (tuple(sub.tensors[t].shape), (), ())
    if not dynamic:
        return out
    probes = _probe(model, signature, sub, uploads, downloads, probe_shapes)
    for t in dynamic:
        declared = sub.tensors[t].shape
        shape, src, dim = [], [], []
        for d, size in enumerate(declared):
            if size >= 0:
                shape.append(size), src.append(-1), dim.append(-1)
                continue
            seen = [p[t][d] for p in probes]
            if len(set(seen)) == 1 and len(probes) > 1:
                shape.append(seen[0]), src.append(-1), dim.append(-1)
                continue
            match = [(k, j) for k, u in enumerate(uploads) for j in range(len(probes[0][u]))
                     if all(p[u][j] == s for p, s in zip(probes, seen))]
            if not match:
                name = sub.tensors[t].name
                raise PlacementError(
                    f"dimension {d} of {name!r} varies with the input shape but equals no dimension "
                    "of a tensor the device sends; give static input shapes (--input-shape)")
            shape.append(-1), src.append(match[0][0]), dim.append(match[0][1])
        out[t] = (tuple(shape), tuple(src), tuple(dim))
    return out


def _probe(model, sig, sub, uploads, downloads, probe_shapes):
    """Inferred shapes of uploads and downloads at two sets of input shapes whose dynamic
    dimensions differ (distinct primes, the k-th dynamic dimension of every input the same
    prime, so that a match is not a coincidence). A model that takes only some sizes is
    probed once at `probe_shapes` instead: its recv shapes are then fixed to those."""
    from ..interp import Interpreter
    interp = Interpreter(writer.to_bytes(model))
    inputs = list(sig.inputs.values())
    wanted = list(dict.fromkeys(uploads + downloads))

    def at(shapes):
        plan = interp.plan_for(inputs, wanted, shapes)
        return {t: plan.arrays[t].shape for t in wanted}
    probes = []
    for primes in ((3, 5, 7, 11), (13, 17, 19, 23)):
        shapes = {}
        for t in inputs:
            dims, k = list(sub.tensors[t].shape), 0
            for d, size in enumerate(dims):
                if size < 0:
                    dims[d] = primes[k % len(primes)]
                    k += 1
            shapes[t] = tuple(dims)
        probes.append(shapes)
    try:
        return [at(shapes) for shapes in probes]
    except Exception as e:  # noqa: BLE001 (a model that takes only some sizes)
        given = {t: tuple(probe_shapes[sub.tensors[t].name]) for t in inputs
                 if sub.tensors[t].name in (probe_shapes or {})}
        if len(given) != len(inputs):
            raise PlacementError(f"could not infer the shapes the cut sends at input shapes "
                                 f"{[probes[0][t] for t in inputs]}: {e}; give every input's shape "
                                 "(--input-shape)") from None
        return [at(given)]

