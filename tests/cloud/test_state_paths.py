"""Ids never reach paths (issue 16, finding 4): a model's training state lives in a folder
named by its sanitised id under --state-dir, whatever the package's metadata id says."""
import hashlib
import os

import numpy as np
import pytest

from edgeflow.cloud import Client, Server, ps
from edgeflow.cloud.steps import StepHost, state_folder, state_name
from edgeflow.format import writer
from edgeflow.interp import Interpreter

from .test_identity import batch, step, trainable  # noqa: F401 (a fixture)
from .test_ps import build_linear, package


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("model_id", ["../../escaped", "..", ".", "/etc/x", "a/../../b", "a\\..\\b", "\x00",
                                      "é" * 300, ".hidden"])
def test_a_state_name_is_one_plain_file_name(model_id, tmp_path):
    name = state_name(model_id)
    assert name and "/" not in name and "\\" not in name and not name.startswith(".") and len(name) <= 77
    assert os.path.dirname(os.path.abspath(state_folder(str(tmp_path), model_id))) == str(tmp_path)


def test_names_are_distinct_and_plain_ids_keep_theirs():
    assert state_name("mnist-cnn_v2.1") == "mnist-cnn_v2.1"  # the old layout's folder: nothing moves
    names = {state_name(i) for i in ("a/b", "a_b", "a:b", "a b", "A/b")}
    assert len(names) == 5 and "a_b" in names


def test_a_metadata_id_with_dots_writes_nothing_outside_the_state_dir(tmp_path, trainable):  # noqa: F811
    model = build_linear()
    model.metadata["edgeflow.model_id"] = b"../../escaped"
    (tmp_path / "models").mkdir()
    writer.write(model, tmp_path / "models" / "m.efl")
    state = tmp_path / "a" / "b"
    with Server(tmp_path / "models", state_dir=str(state)) as server:
        assert list(server.models) == ["../../escaped"]
        with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
            step(client, trainable, "d", 0, batch(0), model="../../escaped")
    # Finding 4: the server wrote <tmp>/escaped/steps.npz, outside --state-dir.
    sha = hashlib.sha256((tmp_path / "models" / "m.efl").read_bytes()).hexdigest()
    assert files_under(tmp_path) == ["a/b/" + state_name("../../escaped") + f"/{sha[:16]}/steps.npz", "models/m.efl"]


@pytest.mark.parametrize("layout", ["the id itself", "one folder per id"])
def test_a_checkpoint_of_the_old_layout_is_read_once(tmp_path, trainable, layout):  # noqa: F811
    state = tmp_path / "state"
    # The layouts before versions: the id itself, then (issue 16) the sanitised id.
    old_folder = state / "my model" if layout == "the id itself" else state / state_name("my model")
    old = StepHost(Interpreter(trainable[0]), str(old_folder))
    old.round("d", 0, 1, batch(0), [trainable[2]], targets=trainable[1], final=True)
    old.close()
    with Server(models={"my model": trainable[0]}, state_dir=str(state)) as server:
        with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
            step(client, trainable, "d", 1, batch(1), model="my model")  # step 1 follows the old step 0
        host = server.models["my model"].steps
        assert host.finished == {"d": 1} and host.updates == 2
        np.testing.assert_array_equal(old.interp.variables()["w"].shape, host.interp.variables()["w"].shape)
    sha = hashlib.sha256(trainable[0]).hexdigest()
    assert (state / state_name("my model") / sha[:16] / "steps.npz").exists()


def test_a_parameter_server_checkpoint_stays_in_its_folder(tmp_path):
    folder = tmp_path / "a" / "ps"
    service = ps.ParameterService({"../../escaped": package(build_linear())}, checkpoint_dir=str(folder))
    service.checkpoint()
    assert [os.path.dirname(f) for f in files_under(tmp_path)] == ["a/ps"]


def test_each_version_of_a_model_trains_in_its_own_folder(tmp_path, trainable):  # noqa: F811
    """Issue 17, finding 2: two versions of one id (two weight sets) train separately, each
    in the folder of its sha256; a checkpoint of the one-folder-per-id layout is not given
    to either, since it does not say which version it trained."""
    state = tmp_path / "state"
    legacy = StepHost(Interpreter(trainable[0]), str(state_folder(str(state), "t")))
    legacy.round("d", 0, 1, batch(0), [trainable[2]], targets=trainable[1], final=True)
    legacy.close()
    other = package(build_linear(w0=np.full((3, 2), 0.25, np.float32)))
    shas = [hashlib.sha256(d).hexdigest() for d in (trainable[0], other)]
    with Server(models={"t": [trainable[0], other]}, state_dir=str(state)) as server:
        with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
            for sha in shas:  # step 0 of device "d" on each version: neither resumed from the old step 0
                loss = trainable[2]
                client.run("t", batch(0), [loss], sha256=sha, step={
                    "device_id": "d", "step_id": 0, "round": 1, "keep": [], "targets": trainable[1], "final": True})
        hosts = [server.models.version("t", sha).steps for sha in shas]
        assert [h.updates for h in hosts] == [1, 1] and hosts[0] is not hosts[1]
        w = [h.interp.variables()["w"] for h in hosts]
        assert not np.allclose(w[0], w[1])
    for sha in shas:
        assert (state / state_name("t") / sha[:16] / "steps.npz").exists()


def test_a_version_folder_needs_a_hex_sha256(tmp_path):
    from edgeflow.errors import InvalidInputError
    assert state_folder("s", "m", "AB" * 32) == os.path.join("s", "m", "ab" * 8)
    with pytest.raises(InvalidInputError):
        state_folder("s", "m", "../" * 8)
