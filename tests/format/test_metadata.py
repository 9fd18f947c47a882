"""edgeflow's metadata entries (edgeflow/format/metadata.py): what is written reads back
typed, and a malformed entry fails when the file is loaded, naming the key."""
import json

import pytest

from edgeflow.errors import FormatError, GraphError, InvalidInputError
from edgeflow.format import metadata, reader, writer

from .models import mlp_model

# mlp_model((3, 4, 2)): 12 tensors (x w0 b0 xw0 y0 r0 w1 b1 xw1 y1 r1 probs), 7 operators.
N_TENSORS, N_OPS = 12, 7
ROUND = {"uploads": ["r0"], "downloads": ["probs"], "keep": [], "fetches": ["probs"], "targets": [3]}
SPLIT = {"role": "device", "cloud_model_id": "m", "cloud_sha256": "ab" * 32, "signature": "infer",
         "local_signature": None, "compression": "fp16"}


def model_with(entries):
    model = mlp_model((3, 4, 2))
    model.metadata.update(entries)
    return model


@pytest.fixture
def unchecked(monkeypatch):
    """`to_bytes` without the writer's final verification, to write hostile entries."""
    monkeypatch.setattr(writer.verifier, "verify", lambda *args, **kwargs: None)
    return writer.to_bytes


def test_entries_read_back_typed():
    entries = {**metadata.roles_entry({4: 1, 5: -1 - 6}, {6: 1}, {1: 9}),
               **metadata.split_entry({**SPLIT, "kind": "train", "rounds": [ROUND]}),
               **metadata.model_id_entry("mlp-v1"), **metadata.fetchable_entry(["*"])}
    loaded = reader.load(writer.to_bytes(model_with(entries)))
    assert metadata.roles(loaded) == metadata.Roles(grad={4: 1, 5: -7}, update={6: 1}, gradients={1: 9})
    assert metadata.split(loaded) == {**SPLIT, "kind": "train", "rounds": [ROUND]}
    assert metadata.model_id(loaded) == "mlp-v1"
    assert metadata.fetchable(loaded) == {"*"}
    # the bytes are JSON that other tools can read: string keys, sorted
    assert json.loads(bytes(loaded.metadata[metadata.ROLES])) == {
        "grad": {"4": 1, "5": -7}, "update": {"6": 1}, "gradients": {"1": 9}}


def test_absent_entries_are_none():
    loaded = reader.load(writer.to_bytes(model_with({})))
    assert (metadata.roles(loaded), metadata.split(loaded), metadata.model_id(loaded),
            metadata.fetchable(loaded)) == (None, None, None, None)
    assert metadata.roles_entry({}, {}, {}) == {}


def _split(**change):
    return json.dumps({**SPLIT, **change}).encode()


MALFORMED = {
    "roles not UTF-8": (metadata.ROLES, b"\xff{}", "not UTF-8 JSON"),
    "roles not JSON": (metadata.ROLES, b"{grad", "not UTF-8 JSON"),
    "roles a list": (metadata.ROLES, b"[1]", "got a JSON list"),
    "roles nested without end": (metadata.ROLES, b"[" * 100_000, "not UTF-8 JSON"),
    "roles key not an index": (metadata.ROLES, b'{"update": {"x": 1}}', "key 'x'"),
    "roles value a string": (metadata.ROLES, b'{"update": {"0": "1"}}', "value '1'"),
    "roles value a bool": (metadata.ROLES, b'{"gradients": {"1": true}}', "value True"),
    "roles field not an object": (metadata.ROLES, b'{"grad": [1, 2]}', '"grad": an object'),
    "roles op out of range": (metadata.ROLES, b'{"update": {"%d": 1}}' % N_OPS, r"\[0, 7\)"),
    "roles tensor out of range": (metadata.ROLES, b'{"update": {"0": %d}}' % N_TENSORS, r"\[0, 12\)"),
    "roles variable out of range": (metadata.ROLES, b'{"grad": {"0": -13}}', "out of range"),
    "split a string": (metadata.SPLIT, b'"device"', "got a JSON str"),
    "split without role": (metadata.SPLIT, json.dumps({"cloud_model_id": "m"}).encode(), '"role" field'),
    "split of the cloud": (metadata.SPLIT, _split(role="cloud"), r'"role": "device"'),
    "split without model id": (metadata.SPLIT, _split(cloud_model_id=""), '"cloud_model_id"'),
    "split compression unknown": (metadata.SPLIT, _split(compression="zip"), '"compression": one of'),
    "split kind unknown": (metadata.SPLIT, _split(kind="both"), '"kind": one of'),
    "split tensors negative": (metadata.SPLIT, _split(original_tensors=-1), '"original_tensors"'),
    "split training without rounds": (metadata.SPLIT, _split(kind="train"), '"rounds": a list'),
    "split round without keep": (metadata.SPLIT, _split(kind="train", rounds=[{**ROUND, "keep": None}]),
                                 '"rounds": a list'),
    "split round target a name": (metadata.SPLIT, _split(kind="train", rounds=[{**ROUND, "targets": ["x"]}]),
                                  '"rounds": a list'),
    "model id not UTF-8": (metadata.MODEL_ID, b"\xc3\x28", "UTF-8 text"),
    "fetchable a list": (metadata.FETCHABLE, b'["x"]', "got a JSON list"),
    "fetchable names not strings": (metadata.FETCHABLE, b'{"tensors": [1]}', "got \\[1\\]"),
    "fetchable unknown tensor": (metadata.FETCHABLE, b'{"tensors": ["nope"]}', "no tensor 'nope'"),
    "role unknown": (metadata.ROLE, b"server", "one of \\['cloud', 'device'\\]"),
    "role not UTF-8": (metadata.ROLE, b"\xff", "one of"),
    "summaries a list": (metadata.SUMMARIES, b'["probs"]', "got a JSON list"),
    "summaries kind unknown": (metadata.SUMMARIES, b'{"infer": {"probs": "image"}}', "got \\{'probs': 'image'\\}"),
    "summaries not an object": (metadata.SUMMARIES, b'{"infer": ["probs"]}', "got \\['probs'\\]"),
    "summaries no such output": (metadata.SUMMARIES, b'{"infer": {"nope": "histogram"}}', "no output 'nope'"),
    "summaries scalar of many": (metadata.SUMMARIES, b'{"infer": {"probs": "scalar"}}', "scalar 'probs' has shape"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_entry_fails_at_load_naming_its_key(case, unchecked, monkeypatch):
    key, raw, message = MALFORMED[case]
    data = unchecked(model_with({key: raw}))
    with pytest.raises(FormatError, match=f"metadata '{key}': expected") as error:
        reader.load(data)
    assert error.match(message)
    monkeypatch.undo()  # the writer verifies again
    with pytest.raises(GraphError, match=f"metadata '{key}'"):  # nor can one be written
        writer.to_bytes(model_with({key: raw}))


def test_other_entries_are_left_alone():
    loaded = reader.load(writer.to_bytes(model_with({"vendor.notes": b"\xff anything"})))
    assert bytes(loaded.metadata["vendor.notes"]) == b"\xff anything"


def test_a_package_says_its_role():
    """Issue 17, finding 2: "edgeflow.role"; a device package's "edgeflow.split" wins over
    a role it inherited (a cloud package split again)."""
    assert metadata.role(reader.load(writer.to_bytes(model_with({})))) is None
    for role in ("cloud", "device"):
        loaded = reader.load(writer.to_bytes(model_with(metadata.role_entry(role))))
        assert metadata.role(loaded) == role
    split = {**metadata.split_entry(SPLIT)}
    assert metadata.role(reader.load(writer.to_bytes(model_with(split)))) == "device"
    inherited = {**split, **metadata.role_entry("cloud")}
    assert metadata.role(reader.load(writer.to_bytes(model_with(inherited)))) == "device"
    with pytest.raises(InvalidInputError):
        metadata.role_entry("server")
