"""The server's memory under big and varied requests (issue 16, finding 1).

Starts `edgeflow serve` in its own process with a small model (x -> exp(-relu(x @ W)),
2x), then: (a) one request of 128 MiB; (b) 57 requests of at most 16 MiB with
different batch sizes. Prints the server's RSS idle, its peak (VmHWM) and its RSS after
each. Extra arguments go to `edgeflow serve` (e.g. --memory-budget-mb 512).

    python benchmarks/bench_server_memory.py [--memory-budget-mb N]
"""
import pathlib
import re
import subprocess
import sys
import tempfile
from concurrent import futures

import numpy as np

import edgeflow as ef
from edgeflow.cloud import Client
from edgeflow.errors import RemoteError
from edgeflow.format import writer

W = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)


def build_model():
    """y = exp(-relu(x @ W)), double = 2x: outputs as large as the request, numpy to check."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        y = ef.exp(-ef.nn.relu(ef.matmul(x, ef.constant(W, name="w"))), name="y")
        double = ef.multiply(x, 2.0, name="double")
    return ef.to_model(g, {"infer": ({"x": x}, {"y": y, "double": double})})


def memory(pid):
    """(VmRSS, VmHWM) of process `pid`, in MB."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return tuple(int(re.search(rf"{k}:\s+(\d+) kB", status).group(1)) / 1024 for k in ("VmRSS", "VmHWM"))


def start(model_dir, extra):
    proc = subprocess.Popen([sys.executable, "-m", "edgeflow.cli", "serve", "--model-dir", model_dir,
                             "--port", "0", *extra], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        match = re.search(r"serving \d+ models on 127\.0\.0\.1:(\d+)", line)
        if match:
            return proc, int(match.group(1))
    raise SystemExit("the server did not start")


def scenario(name, model_dir, extra, requests, threads=1):
    proc, port = start(model_dir, extra)
    try:
        with Client(f"127.0.0.1:{port}", timeout=600) as client:
            client.run("m", {"x": np.ones((1, 4), np.float32)}, ["y"])
            idle = memory(proc.pid)[0]

            def one(rows):
                x = np.random.default_rng(rows).standard_normal((rows, 4), dtype=np.float32)
                try:
                    out = client.run("m", {"x": x}, ["y", "double"])
                except RemoteError as e:
                    if "RESOURCE_EXHAUSTED" not in str(e):
                        raise
                    return 1
                assert np.allclose(out["y"], np.exp(-np.maximum(x @ W, 0)), rtol=1e-5)
                assert np.array_equal(out["double"], x * 2)
                return 0

            with futures.ThreadPoolExecutor(threads) as pool:
                refused = sum(pool.map(one, requests))
            rss, peak = memory(proc.pid)
        print(f"{name}: RSS idle {idle:.0f} MB, peak {peak:.0f} MB, after {rss:.0f} MB "
              f"({len(requests)} requests from {threads} threads, {refused} refused)", flush=True)
    finally:
        proc.terminate()
        proc.wait()


def main():
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as d:
        writer.write(build_model(), pathlib.Path(d) / "m.efl")
        scenario("one 128 MiB request", d, extra, [(128 << 20) // 16])
        sizes = np.random.default_rng(0).integers(1, (16 << 20) // 16 + 1, 57)
        scenario("57 requests <= 16 MiB", d, extra, [int(n) for n in sizes])
        scenario("57 requests <= 16 MiB", d, extra, [int(n) for n in sizes], threads=8)


if __name__ == "__main__":
    main()
