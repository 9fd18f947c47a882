"""Bearer tokens and TLS: refused calls get UNAUTHENTICATED or UNAVAILABLE, health stays
open, and the server answers the next good call."""
import numpy as np
import pytest

from edgeflow.errors import InvalidInputError, RemoteError

from .conftest import reference, self_signed

from edgeflow.cloud import Client, Server

TOKEN = "s3cret-token_0123456789"


def good_call(client):
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(client.run("m", {"x": x}, ["y"])["y"], reference(x)["y"], rtol=1e-6)


@pytest.fixture(scope="module")
def token_server(model_dir):
    with Server(model_dir, token=TOKEN) as server:
        yield server


@pytest.mark.parametrize("token, reason", [(None, "expected the metadata 'authorization: Bearer <token>'"),
                                           ("wrong", "wrong token"),
                                           (TOKEN + "x", "wrong token"),
                                           (TOKEN[:-1], "wrong token")])
def test_a_missing_or_wrong_token_is_unauthenticated(token_server, token, reason):
    with Client(f"127.0.0.1:{token_server.port}", token=token, timeout=30) as client:
        for call in (lambda: good_call(client), client.list_models, client.ping):
            with pytest.raises(RemoteError, match=reason) as e:
                call()
            assert e.value.code == "UNAUTHENTICATED"
        assert client.health() == "SERVING"  # health checks need no token
    with Client(f"127.0.0.1:{token_server.port}", token=TOKEN, timeout=30) as client:
        good_call(client)
        assert sorted(client.list_models()) == ["m", "renamed"]
        assert client.ping() > 0


def test_a_token_must_be_sendable_as_metadata():
    with pytest.raises(InvalidInputError, match="printable ASCII"):
        Client("127.0.0.1:1", token="two words")


def test_tls_with_a_self_signed_certificate(model_dir, certificate):
    cert, key = certificate
    with Server(model_dir, tls=(cert, key), token=TOKEN) as server:
        with Client(f"localhost:{server.port}", token=TOKEN, root_cert=cert, timeout=30) as client:
            client.wait_ready(timeout=30)
            good_call(client)
            big = np.arange(1 << 20, dtype=np.float32).reshape(-1, 4)  # 4 MiB through TLS, in chunks
            np.testing.assert_array_equal(client.run("m", {"x": big}, ["double"])["double"], big * 2)
        with Client(f"localhost:{server.port}", token=TOKEN, timeout=30) as plaintext:
            with pytest.raises(RemoteError) as e:
                plaintext.ping()
            assert e.value.code == "UNAVAILABLE"
        other_cert, _ = self_signed()  # same name, another key: the server's does not chain to it
        with Client(f"localhost:{server.port}", token=TOKEN, root_cert=other_cert, timeout=30) as untrusting:
            with pytest.raises(RemoteError, match="unreachable") as e:
                untrusting.ping()
            assert e.value.code == "UNAVAILABLE"
        with Client(f"localhost:{server.port}", root_cert=cert, timeout=30) as no_token:
            with pytest.raises(RemoteError) as e:
                no_token.ping()
            assert e.value.code == "UNAUTHENTICATED"

