"""`edgeflow serve` as its own process: it comes up healthy, serves with a token and TLS,
skips a corrupt package, and stops on SIGTERM; bad arguments exit 2 with a reason."""
import queue
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from .conftest import reference

from edgeflow.cloud import Client


def edgeflow(*args):
    return [sys.executable, "-m", "edgeflow.cli", *map(str, args)]


class Lines:
    """The stderr lines of a process, read by a thread as they come."""

    def __init__(self, stream):
        self.queue, self.seen = queue.Queue(), []
        threading.Thread(target=lambda: [self.queue.put(line) for line in stream] + [self.queue.put(None)],
                         daemon=True).start()

    def wait_for(self, pattern, limit_s=60):
        """The match of the first new line matching `pattern` (`limit_s` only keeps a hung
        process from hanging the test)."""
        while True:
            try:
                line = self.queue.get(timeout=limit_s)
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no line matching {pattern!r}; stderr:\n{''.join(self.seen)}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match


def test_serve_in_its_own_process(model_dir, certificate, tmp_path):
    cert, key = certificate
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "token").write_text("tok-123\n")
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", model_dir, "--port", 0, "--token-file",
                                     tmp_path / "token", "--tls-cert", tmp_path / "cert.pem",
                                     "--tls-key", tmp_path / "key.pem", "--max-workers", 2),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        match = lines.wait_for(r"serving (\d+) models on 127\.0\.0\.1:(\d+) with TLS, token required")
        assert match.group(1) == "2"
        assert any("skipping" in line and "corrupt.efl" in line for line in lines.seen)
        with Client(f"localhost:{match.group(2)}", token="tok-123", root_cert=cert, timeout=30) as client:
            client.wait_ready(timeout=30)
            x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
            np.testing.assert_allclose(client.run("m", {"x": x}, ["y"])["y"], reference(x)["y"], rtol=1e-6)
            assert sorted(client.list_models()) == ["m", "renamed"]
        proc.send_signal(signal.SIGTERM)
        lines.wait_for("stopping")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, reason", [
    (["--model-dir", "{tmp}/missing"], "expected a directory of .efl files"),
    (["--model-dir", "{tmp}", "--tls-cert", "{tmp}/c.pem"], "--tls-cert and --tls-key go together"),
    (["--model-dir", "{tmp}", "--token-file", "{tmp}/none"], "--token-file: cannot read"),
    (["--model-dir", "{tmp}", "--max-request-mb", "0"], "expected --max-request-mb > 0"),
    (["--model-dir", "{tmp}", "--tls-client-ca", "{tmp}/ca.pem"], "--tls-client-ca needs --tls-cert"),
    (["--model-dir", "{tmp}", "--token-file", "{tmp}/tokens.txt"], "tokens.txt', line 3: expected 'TOKEN DEVICE_ID"),
])
def test_bad_arguments_exit_2_with_the_reason(tmp_path, args, reason):
    (tmp_path / "tokens.txt").write_text("# per-device tokens\ntok-1 phone-1 m\ntok-2\n")
    r = subprocess.run(edgeflow("serve", *[a.format(tmp=tmp_path) for a in args]), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "edgeflow serve: error:" in r.stderr and reason in r.stderr


def test_serve_help():
    r = subprocess.run(edgeflow("serve", "--help"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: edgeflow serve")
    for flag in ("--model-dir", "--host", "--port", "--tls-cert", "--tls-key", "--token-file", "--tls-client-ca",
                 "--max-devices"):
        assert flag in r.stdout
