"""A small model directory, an in-process server on loopback, and a self-signed certificate."""
import contextlib
import datetime
import ipaddress
import os
import time

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import writer


# Ray's APIs start a local Ray instance when called unconnected (its auto-init, read when ray
# is imported). Serve's router threads in this process call them after a cluster fixture
# shut down, and the next module's ray.init(address=...) then failed: "ray.init twice".
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 4
TABLE = np.arange(10, dtype=np.float32).reshape(5, 2)


def reference(x, idx=None):
    """What the model computes, in numpy: the independent reference."""
    h = np.maximum(x @ W, 0)
    out = {"h": h, "y": np.exp(-h), "double": x * 2}
    if idx is not None:
        out["picked"] = TABLE[idx]
    return out


def budget_settles(server, model_id, timeout=10):
    """Wait until `server`'s budget holds only what model `model_id`'s cached interpreters
    keep (a one-message reply's reservation goes once gRPC has sent it, which may be after
    the client has it); that value."""
    model = server.models[model_id]
    deadline = time.monotonic() + timeout
    while server.budget.used != sum(model._charged.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(model._charged.values())


def build_model():
    """x -> h = relu(x @ W) -> y = exp(-h); double = 2x (exact); picked = TABLE[idx]."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        idx = ef.placeholder(ef.int32, [None], name="idx")
        h = ef.nn.relu(ef.matmul(x, ef.constant(W, name="w")), name="h")
        y = ef.exp(-h, name="y")
        double = ef.multiply(x, 2.0, name="double")
        picked = ef.gather(ef.constant(TABLE, name="table"), idx, name="picked")
    return ef.to_model(g, {"infer": ({"x": x, "idx": idx}, {"y": y, "double": double, "picked": picked})},
                       description="cloud test model")


@pytest.fixture(scope="package")
def model_dir(tmp_path_factory):
    """m.efl (id "m" from its name), named.efl (id "renamed" from its metadata), and a
    corrupt file the server must skip."""
    d = tmp_path_factory.mktemp("models")
    model = build_model()
    writer.write(model, d / "m.efl")
    model.metadata = {"edgeflow.model_id": b"renamed"}
    writer.write(model, d / "named.efl")
    (d / "corrupt.efl").write_bytes((d / "m.efl").read_bytes()[:100])
    return d


@pytest.fixture(scope="package")
def server(model_dir):
    from edgeflow.cloud import Server
    with Server(model_dir) as s:
        yield s


@pytest.fixture(scope="package")
def client(server):
    from edgeflow.cloud import Client
    with Client(f"127.0.0.1:{server.port}", timeout=30) as c:
        yield c


def self_signed():
    """(certificate PEM, key PEM): a new self-signed certificate for localhost and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@pytest.fixture(scope="package")
def certificate():
    return self_signed()


def _started_cluster(cluster_class, nodes, attempts=5):
    """A Cluster of `nodes` one-CPU nodes, started again (up to `attempts` times) where Ray
    gives up on a node's start: it waits a fixed 30 s for a raylet to register, which 2
    cores busy with the rest of the suite have exceeded ("The current node timed out during
    startup"; three times in a row once, in stop 43's CI, while the same module alone
    passed in 64 s). The processes a failed start left are this process's new children:
    killed."""
    import psutil
    me = psutil.Process()
    for attempt in range(attempts):
        before = {p.pid for p in me.children(recursive=True)}
        cluster = cluster_class()
        try:
            cluster.add_node(num_cpus=1, include_dashboard=False)  # the head
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            return cluster
        except Exception:
            try:
                cluster.shutdown()
            except Exception:  # a half-started cluster may not shut down cleanly: its processes go below
                pass
            leftover = [p for p in me.children(recursive=True) if p.pid not in before]
            for p in leftover:
                p.kill()
            psutil.wait_procs(leftover, timeout=10)
            if attempt == attempts - 1:
                raise


@contextlib.contextmanager
def ray_cluster(nodes):
    """A local Ray cluster (ray.cluster_utils.Cluster) of `nodes` nodes of one CPU each,
    this process connected to it in edgeflow's namespace; all of it shut down after."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster
    from edgeflow.cloud.replicas import NAMESPACE
    # Ray waits 30 s for its GCS server to write its port; on 2 cores busy with the rest of
    # the suite that took longer once (CI: "Timed out waiting for file .../gcs_server_port").
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "180")
    cluster = _started_cluster(Cluster, nodes)
    if ray.is_initialized():  # an instance something auto-started (ray imported before this conftest)
        ray.shutdown()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield cluster
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()

