"""Identities come from credentials (issue 16, finding 2): per-device tokens and client
certificates name the device; a training step runs only on a trainable package and only
under the caller's own id; ids are bounded in length and number; the parameter server
counts a replica per identity. And finding 7: garbage payloads get INVALID_ARGUMENT and
log one line per interval; a token without TLS on a public address is warned about."""
import datetime
import logging

import grpc
import numpy as np
import pytest

from edgeflow.cloud import Client, Server, ps
from edgeflow.cloud.identity import RateLimitedLog, Tokens, is_loopback
from edgeflow.cloud.steps import StepHost, TooManyDevices
from edgeflow.errors import EdgeflowError, InvalidInputError, RemoteError
from edgeflow.interp import Interpreter

from .conftest import self_signed
from .test_ps import B0, W0, build_linear, package

TOKENS = """\
# TOKEN          DEVICE_ID   MODELS
tok-a-0123456789 a           t          # may use the trainable package only
tok-b-0123456789 b           t,m
tok-c-0123456789 c                      # every model
"""


@pytest.fixture(scope="module")
def trainable():
    data = package(build_linear())
    model = Interpreter(data).model
    train = next(s for s in model.signatures if s.key == "train")
    return data, [int(t) for t in train.targets], model.subgraphs[0].tensors[train.outputs["loss"]].name


def batch(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((4, 3)).astype(np.float32),
            "y": rng.standard_normal((4, 2)).astype(np.float32)}


def first_loss(feeds):
    """The loss a step on the initial variables reports, in numpy (the reference)."""
    return np.mean((feeds["x"] @ W0 + B0 - feeds["y"]) ** 2)


def step(client, trainable, device, step_id, feeds, model="t"):
    """One single-round training step: the loss (before the update)."""
    loss = trainable[2]
    return client.run(model, feeds, [loss], step={"device_id": device, "step_id": step_id, "round": 1,
                                                  "keep": [], "targets": trainable[1], "final": True})[loss]


def code_of(call):
    with pytest.raises(RemoteError) as e:
        call()
    return e.value.code


# -- the token file ---------------------------------------------------------------------------

def test_a_token_file_of_one_bare_token_is_one_shared_identity():
    tokens = Tokens.parse("\n  s3cret  \n")
    assert not tokens.per_device and tokens.shared == "s3cret"
    identity = tokens.identify("Bearer s3cret")
    assert identity.device is None and identity.models is None
    assert identity.device_for("any-id") == "any-id"  # a shared identity's calls name their device


def test_a_token_file_maps_tokens_to_devices_and_models():
    tokens = Tokens.parse(TOKENS)
    assert tokens.per_device and len(tokens) == 3
    a, c = tokens.identify("Bearer tok-a-0123456789"), tokens.identify(b"Bearer tok-c-0123456789")
    assert (a.device, a.models, c.device, c.models) == ("a", frozenset({"t"}), "c", None)
    assert a.may_use("t") and not a.may_use("m") and c.may_use("m")
    for got in (None, "Bearer tok-a-012345678", "Bearer tok-a-0123456789x", "tok-a-0123456789", "Bearer "):
        with pytest.raises(EdgeflowError, match="token"):
            tokens.identify(got)


@pytest.mark.parametrize("text, reason", [("", "empty"), ("# only a comment\n", "empty"),
                                          ("tok a m extra\n", "fields"), ("tok a\ntok b\n", "twice"),
                                          ("tok " + "d" * 200 + "\n", "device id"),
                                          ("shared\ntok a\n", "fields")])
def test_a_bad_token_file_says_which_line(text, reason):
    with pytest.raises(EdgeflowError, match=reason):
        Tokens.parse(text)


def test_a_clients_token_file_may_be_its_line_of_the_servers():
    from edgeflow.cli.arguments import token_line
    assert token_line("# mine\ntok-b-0123456789 b t,m  # phone b\n", "f") == ("tok-b-0123456789", "b")
    assert token_line("s3cret\n", "f") == ("s3cret", None)
    with pytest.raises(EdgeflowError, match="holds no token"):
        token_line("# nothing\n", "f")


# -- steps under the caller's own id -----------------------------------------------------------

@pytest.fixture(scope="module")
def per_device(trainable, model_dir):
    with Server(model_dir, models={"t": trainable[0]}, token=Tokens.parse(TOKENS)) as server:
        clients = {d: Client(f"127.0.0.1:{server.port}", token=f"tok-{d}-0123456789", timeout=30) for d in "abc"}
        yield server, clients
        for c in clients.values():
            c.close()


def test_another_device_cannot_finish_a_victims_step(per_device, trainable):
    server, clients = per_device
    victim, attacker = batch(1), batch(2)
    # Finding 2: a step under the victim's id from another client ran, and the victim's retry got its reply.
    assert code_of(lambda: step(clients["a"], trainable, "b", 0, attacker)) == "PERMISSION_DENIED"
    got = step(clients["b"], trainable, "b", 0, victim)
    np.testing.assert_allclose(got, first_loss(victim), rtol=1e-5)  # its own step, on untouched variables
    again = step(clients["b"], trainable, "", 0, victim)  # a retry (an empty id: the credential's)
    np.testing.assert_array_equal(again, got)
    host = server.models["t"].steps
    assert host.finished == {"b": 0} and host.updates == 1


def test_a_token_may_use_only_its_models(per_device):
    _, clients = per_device
    x = np.ones((1, 4), np.float32)
    assert code_of(lambda: clients["a"].run("m", {"x": x}, ["y"])) == "PERMISSION_DENIED"
    assert sorted(clients["a"].list_models()) == ["t"]
    assert sorted(clients["c"].list_models()) == ["m", "renamed", "t"]
    assert clients["b"].run("m", {"x": x}, ["double"])["double"].tolist() == [[2.0] * 4]
    with pytest.raises(RemoteError, match=r"hosts \['t'\]"):  # NOT_FOUND names only what it may use
        clients["a"].run("nope", {"x": x}, ["y"])


def test_a_step_header_only_on_a_trainable_package(server, trainable):
    with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        x = np.ones((2, 4), np.float32)
        # Finding 2: an inference-only model took training steps (and kept state for them).
        assert code_of(lambda: client.run("m", {"x": x}, ["y"], step={
            "device_id": "d", "step_id": 0, "round": 1, "final": True})) == "INVALID_ARGUMENT"
        assert server.models["m"].steps is None


def test_device_ids_are_bounded_in_length_and_number(trainable, tmp_path):
    with Server(models={"t": trainable[0]}, state_dir=str(tmp_path), max_devices=3) as server:
        with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
            for long_id in ("x" * 129, "x" * (1 << 20), "two words"):
                assert code_of(lambda: step(client, trainable, long_id, 0, batch(0))) == "INVALID_ARGUMENT"
            codes = []
            for k in range(12):  # spoofed ids under a shared identity: the first 3 are kept
                try:
                    step(client, trainable, f"spoof-{k}", 0, batch(k))
                    codes.append("OK")
                except RemoteError as e:
                    codes.append(e.code)
            assert codes == ["OK"] * 3 + ["RESOURCE_EXHAUSTED"] * 9
        host = server.models["t"].steps
        assert sorted(host.seen) == sorted(host.finished) == ["spoof-0", "spoof-1", "spoof-2"]
    with np.load(next(tmp_path.glob("*/*/steps.npz"))) as z:  # the checkpoint holds the 3 kept devices only
        assert len([k for k in z.files if k.startswith("reply/")]) == 3


def test_an_idle_device_makes_room_and_a_busy_table_refuses(trainable):
    host = StepHost(Interpreter(trainable[0]), max_devices=2, device_idle_s=3600)
    for device in ("a", "b"):
        host.round(device, 0, 1, batch(0), [trainable[2]], targets=trainable[1], final=True)
    with pytest.raises(TooManyDevices, match="at most 2 devices"):
        host.round("c", 0, 1, batch(0), [trainable[2]], targets=trainable[1], final=True)
    host.seen["a"] -= 7200  # "a" idle for two hours: forgotten for "c"
    host.round("c", 0, 1, batch(0), [trainable[2]], targets=trainable[1], final=True)
    assert sorted(host.finished) == ["b", "c"] and len(host.replies) == 2
    with pytest.raises(InvalidInputError, match="device id"):
        host.round("", 0, 1, batch(0), [trainable[2]])


# -- mutual TLS --------------------------------------------------------------------------------

def _ca_and_client(common_name):
    """(CA certificate PEM, client certificate PEM, client key PEM) signed by a new CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, key, issuer, signer, ca):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(signer, hashes.SHA256()))
    ca_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgeflow test CA")])
    ca = cert(ca_name, ca_key, ca_name, ca_key, True)
    client = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), client_key, ca_name,
                  ca_key, False)
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), client.public_bytes(pem),
            client_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def test_mutual_tls_takes_the_device_id_from_the_client_certificate(trainable, certificate):
    cert, key = certificate
    ca, client_cert, client_key = _ca_and_client("phone-1")
    with Server(models={"t": trainable[0]}, tls=(cert, key), tls_client_ca=ca) as server:
        target = f"localhost:{server.port}"
        with Client(target, root_cert=cert, client_cert=client_cert, client_key=client_key, timeout=30) as phone:
            assert code_of(lambda: step(phone, trainable, "phone-2", 0, batch(3))) == "PERMISSION_DENIED"
            np.testing.assert_allclose(step(phone, trainable, "phone-1", 0, batch(3)),
                                       first_loss(batch(3)), rtol=1e-5)
            assert server.models["t"].steps.finished == {"phone-1": 0}
        with Client(target, root_cert=cert, timeout=30) as no_certificate:  # refused in the handshake
            assert code_of(no_certificate.ping) == "UNAVAILABLE"
        other_ca, other_cert, other_key = _ca_and_client("phone-1")  # a certificate of another CA
        with Client(target, root_cert=cert, client_cert=other_cert, client_key=other_key, timeout=30) as forged:
            assert code_of(forged.ping) == "UNAVAILABLE"
    with pytest.raises(EdgeflowError, match="needs tls"):
        Server(models={"t": trainable[0]}, tls_client_ca=ca)


# -- the parameter server counts a replica per identity ----------------------------------------

def test_one_client_fills_one_sync_replica_slot(trainable):
    service = ps.ParameterService({"t": trainable[0]}, mode="sync", replicas=2)
    grads = {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}
    with Server(parameter_server=service, token=Tokens.parse(TOKENS)) as server:
        with ps.ParameterClient(f"127.0.0.1:{server.port}", token="tok-a-0123456789", timeout=30) as a:
            # Finding 2: made-up ids filled every replica slot, and the step applied one client's gradients.
            with pytest.raises(RemoteError) as e:
                a.push("t", "b", 0, grads, 4, 0, "sync")
            assert e.value.code == "PERMISSION_DENIED"
            assert a.push("t", "a", 0, grads, 4, 0, "sync").result == "pending"
            again = a.push("t", "a", 1, grads, 4, 0, "sync")  # a second push for the step: not a second replica
            assert again.result == "dropped" and "already pushed" in again.reason
        status = service.stats("t")
        assert status["version"] == 0 and status["pending_devices"] == ["a"] and sorted(status["devices"]) == ["a"]


def test_the_parameter_servers_device_table_is_bounded(trainable):
    state = ps.HostedParameters("t", trainable[0], "<bytes>", ps.Settings(mode="async", max_devices=2))
    grads = {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}
    for device in ("a", "b"):
        assert state.push(device, 0, 0, 1, grads)["result"] == 1  # applied
    with pytest.raises(TooManyDevices, match="at most 2 devices"):  # made-up ids no longer grow it
        state.push("c", 0, 0, 1, grads)
    assert state.push("a", 1, 2, 1, grads)["result"] == 1 and sorted(state.devices) == ["a", "b"]


# -- finding 7: garbage payloads, plaintext tokens ----------------------------------------------

def test_garbage_payloads_get_invalid_argument_and_log_one_line(server, caplog):
    caplog.set_level(logging.INFO)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        ping = channel.unary_unary("/edgeflow.v1.Edgeflow/Ping")
        run = channel.stream_stream("/edgeflow.v1.Edgeflow/Run")
        for call in [lambda: ping(b"\xff\xff\xff\xff", timeout=30)] * 20 + \
                    [lambda: list(run(iter([b"\xff\xff\xff"]), timeout=30))] * 20:
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # was INTERNAL
    records = [r for r in caplog.records if "not a valid protobuf" in r.getMessage() or r.name.startswith("grpc")]
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info]  # was 40 ERROR tracebacks
    assert 1 <= len(records) <= 2  # one line per method and interval
    with Client(f"127.0.0.1:{server.port}", timeout=30) as client:  # and the server serves on
        assert client.ping() > 0


def test_rate_limited_log_counts_what_it_left_out(caplog):
    caplog.set_level(logging.INFO)
    log = RateLimitedLog(logging.getLogger("edgeflow.test"), interval_s=3600)
    assert [log.log("k", logging.INFO, "bad %d", n) for n in range(5)] == [True] + [False] * 4
    assert log.log("other", logging.INFO, "other")
    log._kinds["k"][0] -= 7200
    assert log.log("k", logging.INFO, "bad again")
    assert [r.getMessage() for r in caplog.records] == [
        "bad 0", "other", "bad again (and 4 more like it in the last 3600 s, not logged)"]


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("127.0.0.1", False), ("localhost", False)])
def test_a_token_without_tls_on_a_public_address_is_warned_about(model_dir, caplog, host, warned):
    caplog.set_level(logging.WARNING, logger="edgeflow.cloud")
    with Server(model_dir, host=host, token="s3cret"):
        pass
    assert any("plaintext" in r.getMessage() for r in caplog.records) == warned
    assert is_loopback("::1") and not is_loopback("example.com")
