"""The metadata entries edgeflow writes into a `.efl` file, read and written in one place.

    roles = metadata.roles(model)        # Roles or None: "edgeflow.roles"
    info = metadata.split(model)         # dict or None: "edgeflow.split"
    name = metadata.model_id(model)      # str or None: "edgeflow.model_id"
    extra = metadata.fetchable(model)    # set of names, or None: "edgeflow.fetchable"
    role = metadata.role(model)          # "cloud", "device" or None: "edgeflow.role"
    kinds = metadata.summaries(model)    # {signature: {output: kind}} or None: "edgeflow.summaries"
    model.metadata.update(metadata.roles_entry(grad, update, gradients))

One strictness everywhere: a malformed entry raises FormatError naming the key and what
was expected. The verifier calls `check` on every file it loads, so a hostile entry fails
at load, before anything reads it.
"""
import json
from typing import NamedTuple

from ..errors import FormatError, InvalidInputError

ROLES = "edgeflow.roles"
SPLIT = "edgeflow.split"
MODEL_ID = "edgeflow.model_id"
FETCHABLE = "edgeflow.fetchable"
ROLE = "edgeflow.role"
SUMMARIES = "edgeflow.summaries"
ROLES_OF_PACKAGES = ("cloud", "device")
SUMMARY_KINDS = ("scalar", "histogram")

_ENCODINGS = ("none", "fp16", "int8")
_KINDS = ("infer", "train")


class Roles(NamedTuple):
    """What "edgeflow.roles" records of a training graph (operator and tensor indices of
    subgraph 0): `grad` {backward op: the forward op it differentiates, or -1 - variable
    for the sum of a variable's gradient parts}; `update` {optimizer op: the variable it
    updates}; `gradients` {variable: the gradient tensor its optimizer applies}."""
    grad: dict
    update: dict
    gradients: dict


def _fail(key, expected, detail=""):
    raise FormatError(f"metadata {key!r}: expected {expected}" + (f" ({detail})" if detail else ""))


def _json(model, key, expected):
    raw = model.metadata.get(key)
    if raw is None:
        return None
    try:
        value = json.loads(bytes(raw).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        _fail(key, expected, f"not UTF-8 JSON: {type(e).__name__}: {e}"[:200])
    if not isinstance(value, dict):
        _fail(key, expected, f"got a JSON {type(value).__name__}")
    return value


def _int_map(key, field, value):
    expected = f'"{field}": an object of integer keys to integers'
    if not isinstance(value, dict):
        _fail(key, expected)
    out = {}
    for k, v in value.items():
        try:
            index = int(k)
        except ValueError:
            _fail(key, expected, f"key {k[:40]!r}")
        if isinstance(v, bool) or not isinstance(v, int):
            _fail(key, expected, f"value {v!r:.40} of key {k[:40]!r}")
        out[index] = v
    return out


def roles(model):
    """The model's Roles (indices checked against subgraph 0), or None if it has none."""
    expected = 'a JSON object {"grad", "update", "gradients"} of operator and tensor indices'
    data = _json(model, ROLES, expected)
    if data is None:
        return None
    found = Roles(*(_int_map(ROLES, f, data.get(f, {})) for f in Roles._fields))
    if model.subgraphs:
        n_ops, n_tensors = len(model.subgraphs[0].operators), len(model.subgraphs[0].tensors)
        ops = list(found.grad) + list(found.update)
        tensors = list(found.update.values()) + list(found.gradients) + list(found.gradients.values())
        tensors += [-1 - v for v in found.grad.values() if v < 0]
        if any(not 0 <= i < n_ops for i in ops + [v for v in found.grad.values() if v >= 0]) or \
                any(not 0 <= t < n_tensors for t in tensors):
            _fail(ROLES, f"operator indices in [0, {n_ops}) and tensor indices in [0, {n_tensors})",
                  "it names some out of range")
    return found


def roles_entry(grad, update, gradients):
    """{ROLES: bytes} recording these roles (see Roles), or {} when there are none."""
    if not grad and not update:
        return {}
    data = {"grad": {str(k): v for k, v in grad.items()}, "update": {str(k): v for k, v in update.items()},
            "gradients": {str(k): v for k, v in gradients.items()}}
    return {ROLES: json.dumps(data, sort_keys=True).encode()}


def split(model):
    """The "edgeflow.split" entry of a device package (a dict: "role", "cloud_model_id",
    "cloud_sha256", "signature", "local_signature", "compression", "kind", "rounds", ...),
    or None if the model is not one."""
    expected = "a JSON object describing a device package (from edgeflow split)"
    info = _json(model, SPLIT, expected)
    if info is None:
        return None
    for field, ok, what in (
            ("role", lambda v: v == "device", '"device"'),
            ("cloud_model_id", lambda v: isinstance(v, str) and v, "a non-empty string"),
            ("cloud_sha256", lambda v: isinstance(v, str), "a string"),
            ("signature", lambda v: isinstance(v, str) and v, "a non-empty string"),
            ("local_signature", lambda v: v is None or isinstance(v, str), "a string or null"),
            ("compression", lambda v: v in _ENCODINGS, f"one of {list(_ENCODINGS)}"),
            ("kind", lambda v: v in _KINDS, f"one of {list(_KINDS)}"),
            ("original_tensors", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
             "an integer >= 0"),
            ("adapt", lambda v: isinstance(v, bool), "true or false"),
            ("forced_cut", lambda v: v is None or (isinstance(v, list) and all(isinstance(n, str) for n in v)),
             "null or a list of tensor names")):
        if field in info and not ok(info[field]):
            _fail(SPLIT, f'"{field}": {what}', f"got {info[field]!r:.60}")
        if field not in info and field in ("role", "cloud_model_id", "cloud_sha256", "signature"):
            _fail(SPLIT, f'a "{field}" field')
    if info.get("kind") == "train":
        _check_rounds(info.get("rounds"))
    return info


def _check_rounds(rounds):
    expected = '"rounds": a list of objects {"uploads", "downloads", "keep", "fetches": ' \
               '[names], "targets": [operator indices]}'
    if not isinstance(rounds, list):
        _fail(SPLIT, expected)
    for r in rounds:
        if not isinstance(r, dict) or \
                any(not isinstance(r.get(f), list) or not all(isinstance(n, str) for n in r[f])
                    for f in ("uploads", "downloads", "keep", "fetches")) or \
                not isinstance(r.get("targets"), list) or \
                not all(isinstance(t, int) and not isinstance(t, bool) for t in r["targets"]):
            _fail(SPLIT, expected, f"got {r!r:.80}")


def split_entry(info):
    """{SPLIT: bytes} recording a device package's split `info`."""
    return {SPLIT: json.dumps(info, sort_keys=True).encode()}


def model_id(model):
    """The model's id on a server ("edgeflow.model_id", UTF-8), or None."""
    raw = model.metadata.get(MODEL_ID)
    if raw is None:
        return None
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        _fail(MODEL_ID, "UTF-8 text")


def model_id_entry(name):
    """{MODEL_ID: bytes} naming the model `name`."""
    return {MODEL_ID: name.encode("utf-8")}


def fetchable(model):
    """The tensors a server may also give out besides the package's outputs and cut tensors
    ("edgeflow.fetchable": {"tensors": [names of subgraph 0's tensors, or "*" for all]}),
    as a set of names (None if the package opts in to nothing more)."""
    expected = 'a JSON object {"tensors": ["*" or names of subgraph 0\'s tensors]}'
    data = _json(model, FETCHABLE, expected)
    if data is None:
        return None
    names = data.get("tensors")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        _fail(FETCHABLE, expected, f"got {names!r:.60}")
    known = {t.name for t in model.subgraphs[0].tensors} if model.subgraphs else set()
    unknown = [n for n in names if n != "*" and n not in known]
    if unknown:
        _fail(FETCHABLE, expected, f"no tensor {unknown[0][:40]!r}")
    return set(names)


def fetchable_entry(names):
    """{FETCHABLE: bytes} letting a server give out the tensors `names` ("*": every one)."""
    return {FETCHABLE: json.dumps({"tensors": sorted(names)}).encode()}


def role(model):
    """What a package of a split is for: "cloud" (a server hosts it), "device" (a device
    runs it), or None (a plain model). "edgeflow.role" (UTF-8) says it; a device package
    written before that entry existed says it in "edgeflow.split", which wins over an
    "edgeflow.role" the package inherited from the model it was split from."""
    raw = model.metadata.get(ROLE)
    info = split(model)
    try:
        value = None if raw is None else bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        value = ""
    if raw is not None and value not in ROLES_OF_PACKAGES:
        _fail(ROLE, f"one of {list(ROLES_OF_PACKAGES)}", f"got {bytes(raw)[:40]!r}")
    return "device" if info is not None else value


def role_entry(name):
    """{ROLE: bytes} saying the package is for the "cloud" or the "device"."""
    if name not in ROLES_OF_PACKAGES:
        raise InvalidInputError(f"role must be one of {ROLES_OF_PACKAGES}, got {name!r}")
    return {ROLE: name.encode("utf-8")}


def summaries(model):
    """Which outputs of which signatures are summaries (ef.summary), and of what kind:
    {signature key: {output name: "scalar" or "histogram"}} from "edgeflow.summaries", or
    None. A scalar's tensor holds one value (every declared dimension 1). Signatures the
    package lacks are left out: a package derived from the model (an inference split's
    device package) keeps the entry but not its `train` signature."""
    expected = ('a JSON object {signature key: {output name: "scalar" or "histogram"}}, each '
                'output one of the signature\'s, each scalar holding one value')
    data = _json(model, SUMMARIES, expected)
    if data is None:
        return None
    signatures = {s.key: s for s in model.signatures}
    found = {}
    for key, kinds in data.items():
        if not isinstance(kinds, dict) or any(k not in SUMMARY_KINDS for k in kinds.values()):
            _fail(SUMMARIES, expected, f"got {kinds!r:.60} for {key[:40]!r}")
        sig = signatures.get(key)
        if sig is None:
            continue
        tensors = model.subgraphs[sig.subgraph].tensors if sig.subgraph < len(model.subgraphs) else []
        for name, kind in kinds.items():
            if name not in sig.outputs:
                _fail(SUMMARIES, expected, f"signature {key[:40]!r} has no output {name[:40]!r}")
            index = sig.outputs[name]
            if kind == "scalar" and 0 <= index < len(tensors) and any(d != 1 for d in tensors[index].shape):
                _fail(SUMMARIES, expected, f"scalar {name[:40]!r} has shape {tuple(tensors[index].shape)}")
        found[key] = dict(kinds)
    return found


def summaries_entry(by_signature):
    """{SUMMARIES: bytes} recording `by_signature` ({signature key: {output name: kind}}),
    or {} when no signature has a summary."""
    data = {key: dict(kinds) for key, kinds in by_signature.items() if kinds}
    if not data:
        return {}
    for kinds in data.values():
        bad = [k for k in kinds.values() if k not in SUMMARY_KINDS]
        if bad:
            raise InvalidInputError(f"summary kinds must be one of {SUMMARY_KINDS}, got {bad[0]!r}")
    return {SUMMARIES: json.dumps(data, sort_keys=True).encode()}


def without(metadata, *keys):
    """A copy of a metadata dict less `keys` (entries a derived package must not inherit)."""
    return {k: v for k, v in metadata.items() if k not in keys}


def check(model):
    """FormatError unless every entry edgeflow reads is well formed."""
    roles(model)
    split(model)
    model_id(model)
    fetchable(model)
    role(model)
    summaries(model)
