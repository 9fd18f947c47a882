"""What a server reports: Prometheus metrics (counted as the test called, scraped over
HTTP), per-model health, and log lines that carry their request's id, as text or JSON."""
import json
import logging
import re
import signal
import subprocess
import sys
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from edgeflow.cloud import Client, Server, logs
from edgeflow.cloud import edgeflow_pb2 as pb
from edgeflow.cloud import edgeflow_pb2_grpc as pb_grpc
from edgeflow.cloud import server as server_module
from edgeflow.cloud import wire
from edgeflow.cloud.identity import RateLimitedLog
from edgeflow.errors import EdgeflowError, RemoteError

from .test_serve_cli import Lines, edgeflow

from edgeflow.cloud.metrics import PrometheusMetrics


def scrape(port):
    """{(sample name, ((label, value), ...)): value} of the metrics served on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def by_labels(samples, name):
    return {labels: value for (n, labels), value in samples.items() if n == name}


def test_calls_are_counted_by_model_method_and_status(model_dir):
    metrics = PrometheusMetrics()
    with Server(model_dir, token="tok", metrics=metrics) as server, \
            Client(f"127.0.0.1:{server.port}", token="tok", timeout=30) as client, \
            Client(f"127.0.0.1:{server.port}", token="wrong", timeout=30) as stranger:
        port = metrics.serve_http(0)
        try:
            bytes_in = bytes_out = 0
            for n in (1, 3, 5):
                x = np.ones((n, 4), np.float32)
                out = client.run("m", {"x": x}, ["y", "double"])
                bytes_in += x.nbytes
                bytes_out += sum(a.nbytes for a in out.values())
            q = np.ones(2, np.float32)
            with pytest.raises(RemoteError) as e:
                client.run("m", {"q": q}, ["y"])  # no feed 'q': refused at its first chunk, received
            assert e.value.code == "INVALID_ARGUMENT"
            bytes_in += q.nbytes
            with pytest.raises(RemoteError, match="no model 'nope'"):
                client.run("nope", {"x": x}, ["y"])
            with pytest.raises(RemoteError) as e:
                stranger.run("m", {"x": x}, ["y"])
            assert e.value.code == "UNAUTHENTICATED"
            client.list_models()
            client.ping()
            samples = scrape(port)
        finally:
            metrics.close()
    calls = {("", "ListModels", "OK"): 1, ("", "Ping", "OK"): 1, ("", "Run", "NOT_FOUND"): 1,
             ("", "Run", "UNAUTHENTICATED"): 1, ("m", "Run", "INVALID_ARGUMENT"): 1, ("m", "Run", "OK"): 3}
    assert by_labels(samples, "edgeflow_requests_total") == {
        (("method", method), ("model", model), ("status", status)): n for (model, method, status), n in calls.items()}
    assert by_labels(samples, "edgeflow_received_bytes_total") == {(("model", "m"),): bytes_in}
    assert by_labels(samples, "edgeflow_sent_bytes_total") == {(("model", "m"),): bytes_out}
    latency = by_labels(samples, "edgeflow_request_seconds_count")
    assert latency == {(("method", "Run"), ("model", "m")): 4, (("method", "Run"), ("model", "")): 2,
                       (("method", "ListModels"), ("model", "")): 1, (("method", "Ping"), ("model", "")): 1}
    assert samples["process_resident_memory_bytes", ()] > 0


def test_the_other_measurements_and_the_exporter_stops():
    metrics = PrometheusMetrics()
    metrics.batch("m", 3)
    metrics.queue("m", 7)
    metrics.step("m")
    metrics.cache("m", True)
    metrics.cache("m", False)
    metrics.cache("m", False)
    metrics.replica_memory("m-0", 1 << 20)
    port = metrics.serve_http(0)
    samples = scrape(port)
    assert samples == {**samples, ("edgeflow_batch_size_bucket", (("le", "2.0"), ("model", "m"))): 0,
                       ("edgeflow_batch_size_bucket", (("le", "4.0"), ("model", "m"))): 1,
                       ("edgeflow_queue_depth", (("model", "m"),)): 7,
                       ("edgeflow_training_steps_total", (("model", "m"),)): 1,
                       ("edgeflow_cache_lookups_total", (("model", "m"), ("result", "hit"))): 1,
                       ("edgeflow_cache_lookups_total", (("model", "m"), ("result", "miss"))): 2,
                       ("edgeflow_replica_resident_memory_bytes", (("replica", "m-0"),)): 1 << 20}
    assert "edgeflow_queue_depth{model=\"m\"} 7.0" in metrics.text()
    assert "edgeflow_queue_depth{" not in PrometheusMetrics().text()  # each has its own registry
    metrics.close()
    with pytest.raises(OSError):
        scrape(port)


def test_each_hosted_model_has_a_health_service(model_dir):
    server = Server(model_dir)
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def check(service):
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status
        for model_id in ("m", "renamed"):
            assert check(f"edgeflow.v1.Edgeflow/{model_id}") == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            check("edgeflow.v1.Edgeflow/nope")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        server.stop()
        with pytest.raises(grpc.RpcError) as e:
            check("edgeflow.v1.Edgeflow/m")
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_failing_requests_log_line_carries_its_request_id(model_dir, caplog, monkeypatch):
    monkeypatch.setattr(server_module, "_bad_log", RateLimitedLog(server_module._log, 0))  # all lines
    caplog.set_level(logging.INFO, logger="edgeflow.cloud")
    caplog.handler.addFilter(logs.RequestFilter())
    with Server(models={"m": model_dir / "m.efl"}) as server, \
            Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        with pytest.raises(RemoteError):
            client.run("m", {"q": np.ones(2, np.float32)}, ["y"], request_id="req-42")
        with grpc.insecure_channel(f"127.0.0.1:{server.port}", wire.CHANNEL_OPTIONS) as channel:
            with pytest.raises(grpc.RpcError):  # no request id sent: the server makes one up
                list(pb_grpc.EdgeflowStub(channel).Run(iter([pb.RunRequest(header=pb.RunHeader(
                    model_id="m", fetches=["nope"]))]), timeout=30))
    sent, made_up = [r for r in caplog.records if r.name == "edgeflow.cloud" and "INVALID_ARGUMENT" in r.message]
    assert (sent.request_id, sent.model) == ("req-42", "m")
    assert logs.TextFormatter().format(sent).endswith(f"{sent.message} [req-42]")
    assert re.fullmatch("[0-9a-f]{16}", made_up.request_id) and made_up.request_id in made_up.message


def test_json_log_lines_parse_with_their_fields():
    logger = logging.getLogger("edgeflow.test_json")
    formatter, lines = logs.JsonFormatter(), []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(json.loads(formatter.format(record)))
    handler.addFilter(logs.RequestFilter())
    logger.addHandler(handler)
    try:
        token = logs.enter(logs.Request("req-7", "m"))
        try:
            try:
                raise ValueError("disk on fire")
            except ValueError:
                logger.error("Run %s failed", "req-7", exc_info=True)
        finally:
            logs.leave(token)
        logger.warning("between requests")
    finally:
        logger.removeHandler(handler)
    failed, between = lines
    assert {k: failed[k] for k in ("level", "logger", "message", "request_id", "model")} == {
        "level": "ERROR", "logger": "edgeflow.test_json", "message": "Run req-7 failed", "request_id": "req-7",
        "model": "m"}
    assert "ValueError: disk on fire" in failed["exception"] and failed["time"].endswith("+00:00")
    assert between["request_id"] is None and "model" not in between and "exception" not in between


def test_serve_help_lists_the_flags():
    r = subprocess.run(edgeflow("serve", "--help"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for flag in ("--metrics-port", "--metrics-host", "--log-format"):
        assert flag in r.stdout


def test_serve_exports_metrics_and_logs_json(model_dir):
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", model_dir, "--port", 0, "--metrics-port", 0,
                                     "--log-format", "json"),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        metrics_port = lines.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics").group(1)
        port = lines.wait_for(r"serving \d+ models on 127\.0\.0\.1:(\d+)").group(1)
        assert all(json.loads(line)["level"] for line in lines.seen)
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            client.run("m", {"x": np.ones((2, 4), np.float32)}, ["y"])
        samples = scrape(metrics_port)
        assert samples["edgeflow_requests_total", (("method", "Run"), ("model", "m"), ("status", "OK"))] == 1
        proc.send_signal(signal.SIGTERM)
        lines.wait_for("stopping")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_prometheus_client_a_one_line_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # importing it fails
    with pytest.raises(EdgeflowError, match=r"^[^\n]*pip install 'edgeflow\[metrics\]'$"):
        PrometheusMetrics()
