"""The cloud under many devices: embedded, with adaptive batching, and on Ray replicas.

    .venv/bin/python benchmarks/bench_scale.py [--models mobilenet_v2,bert_encoder]
        [--devices 1,8,32,128] [--servers embedded,batched,ray1,ray2,ray4] [--seconds 6]
        [--slo-ms 500] [--max-batch 32] [--clients 4] [--server-cores N] [--replica-cpus C]
        [--accel opencl] [--cache DIR] [--json OUT]

The models are the real-size MobileNetV2 (224x224) and BERT-like encoder (4 layers, d 256,
sequence 128) that bench_models.py exports (the `zoo` extra, or its cache), each served as
one cut-independent cloud package, and two cloud parts of each: `whole`, a cloud-only
split, which the device feeds its input (588 KB and 128 KB a request), and `late`, the
tail after LATE's tensor (MobileNetV2 from features.14, 75 KB; the encoder's last two
layers, 128 KB). Servers, each an `edgeflow serve` process started in turn on this machine:

- embedded: one process, requests run side by side on its worker threads (BLAS at one
  thread each), no batching;
- batched: the same with Clipper's AIMD batching (`--slo-ms`, `--max-batch`), and 64
  worker threads (a batch holds at most one request per worker thread);
- embedded-pK, batched-pK: the same served by K processes on one port (`--processes K`);
- rayN: `--ray` on a local Ray instance, N Serve replicas per model sharing the server's
  cores (`--replica-cpus`, default the cores / (N x models)), batching inside each replica
  as `batched` does; rayN-pK: K front-end processes (`--processes K`) on a Ray head this
  script starts (`ray start --head`), where one front end would bound the replicas' rate.

Devices are threads in `--clients` client processes, each a closed loop of Run calls on its
own channel. Every phase (server x model x devices) lasts `--seconds`, measured after every device was
answered once and all ran `--warm` seconds;
measured: replies per second, and latency p50/p99 over the phase's replies. By default
server and clients share every core: the figures are what one machine gives, not a
dedicated server's. `--server-cores N` pins the server (and Ray's processes, which it
starts) to the first N cores and the clients to the rest; with `--replica-cpus C` fixed,
rayN's replicas get N x C cores, which shows how replicas scale with the cores they get.
`--accel opencl` runs the embedded and batched servers' models on their OpenCL device
(`edgeflow serve --accel`), a GPU's where there is one, and each Ray replica's on it too.
Each server's phases run back to back; the servers run in turn.
"""
import argparse
import json
import multiprocessing as mp
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import harness
from harness import log

MODELS = ("mobilenet_v2", "bert_encoder")
# The late cloud parts: what a split that leaves the cloud the tail sends (the planner's
# interior cuts of bench_split.py fall between these and the whole model).
LATE = {"mobilenet_v2": "/features/features.13/Add_output_0",  # 96x14x14: features.14 on, the classifier
        "bert_encoder": "/layers.1/norm2/LayerNormalization_output_0"}  # the last two layers
SERVERS = ("embedded", "batched", "ray1", "ray2", "ray4")


def prepare(models, parts, folder, cache):
    """Convert each model into `folder`; {(model, part): (fed tensor, output, fed shape)}: the
    whole model fed its input, the late part fed LATE's tensor."""
    from bench_split import make_model
    from edgeflow.format import reader
    specs = {}
    for name in models:
        feed, fetch, shape = make_model(name, folder / f"{name}.efl", cache)
        specs[name, "whole"] = feed, fetch, shape
        tensor = next(t for t in reader.load(folder / f"{name}.efl").subgraphs[0].tensors if t.name == LATE[name])
        specs[name, "late"] = LATE[name], fetch, tuple(1 if d == -1 else d for d in tensor.shape)
    return {k: v for k, v in specs.items() if k[1] in parts}


SERVER_KINDS = r"(embedded|batched|ray\d+)(-p\d+)?"


def server_env():
    """The servers' and the Ray head's environment: BLAS at one thread, and Ray's token
    authentication off (Ray 2.5x turns it on for `ray start`; every process here is on
    this machine's loopback)."""
    return {**harness.blas_env(1), "RAY_AUTH_MODE": "disabled"}


def start_ray_head(logfile, cores, pinned=None):
    """A Ray head of `cores` CPUs (`ray start --head --block`, pinned to `pinned` core ids if
    given): (its process, which takes the cluster down when it ends, and its address)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(port),
           "--node-ip-address", "127.0.0.1", "--num-cpus", str(cores), "--include-dashboard", "false",
           "--disable-usage-stats"]
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=server_env(),
                            preexec_fn=None if pinned is None else lambda: os.sched_setaffinity(0, pinned))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if "Ray runtime started" in pathlib.Path(logfile.name).read_text(errors="replace"):
            return proc, f"127.0.0.1:{port}"
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    harness.stop(proc, 30)
    raise RuntimeError(f"ray start did not start:\n{pathlib.Path(logfile.name).read_text()[-3000:]}")


def server_command(kind, model_dir, slo_ms, max_batch, models=1, cores=2, replica_cpus=None, accel="none",
                   ray_address=None):
    """The `edgeflow serve` command of server `kind` on `cores` cores (rayN-pK: front ends
    on the cluster at `ray_address`)."""
    cmd = harness.edgeflow_cmd() + ["serve", "--model-dir", str(model_dir), "--port", "0", "--threads", "1"]
    kind, _, processes = kind.partition("-p")
    processes = int(processes or 1)
    if processes > 1:
        cmd += ["--processes", str(processes)]
    if kind == "embedded":  # a request at a time per core (8 at least: the server's default)
        cmd += ["--max-workers", str(max(8, -(-cores // processes)))]
    else:  # a batch holds at most --max-workers requests; Ray's front end threads only wait
        cmd += ["--slo-ms", str(slo_ms), "--max-batch", str(max_batch), "--max-workers", "64"]
    if kind.startswith("ray"):
        n = int(kind[3:])
        cmd += ["--ray", *([ray_address] if ray_address else []), "--replicas", str(n),
                "--replica-cpus", f"{replica_cpus or cores / (n * models):g}"]
    if accel != "none":
        cmd += ["--accel", accel]
    return cmd


def start_server(cmd, logfile, cores=None):
    """The server process (pinned to `cores`, a set of core ids, if given) and its address."""
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=server_env(),
                            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        m = re.search(r"serving \d+ models? on 127\.0\.0\.1:(\d+)", pathlib.Path(logfile.name).read_text(errors="replace"))
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"edgeflow serve did not start:\n{pathlib.Path(logfile.name).read_text()[-3000:]}")


# -- a client process ---------------------------------------------------------------------------
def client_main(address, model, feed, fetch, threads, ready, go, start, warm, seconds, results, cores=None):
    """`threads` devices, each first answered once (then `ready`), in closed loops from the
    time `go` sets (`start`) for `warm` + `seconds` (on `cores`, a set of core ids, if
    given): the latencies of the requests in the last `seconds`."""
    if cores is not None:
        os.sched_setaffinity(0, cores)
    from edgeflow.cloud import Client
    from edgeflow.errors import RemoteError
    lat, errors = [], []

    def device(k):
        with Client(address, timeout=120) as client:
            x = {feed[0]: np.random.default_rng(k).standard_normal(feed[1]).astype(np.float32)}
            client.run(model, x, [fetch])  # a warm channel, the model's first runs done
            ready.put(k)
            go.wait()
            measured, end = start.value + warm, start.value + warm + seconds
            while True:
                t0 = time.time()
                if t0 >= end:
                    break
                try:
                    client.run(model, x, [fetch])
                except RemoteError as e:
                    if t0 >= measured:
                        errors.append(e.code)
                    continue
                t1 = time.time()
                if t0 >= measured and t1 <= end:
                    lat.append(t1 - t0)
    workers = [threading.Thread(target=device, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    results.put((lat, errors))


def phase(address, model, feed, fetch, devices, clients, seconds, cores=None, warm=2.0):
    """(replies per second, p50 s, p99 s, errors) of `devices` devices for `seconds`, after
    each was answered once and all ran `warm` seconds (the server's plans for its batch
    sizes made), the clients on `cores` (a set of core ids) if given."""
    ctx = mp.get_context("spawn")
    results, ready, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = min(clients, devices)
    per = [devices // procs + (k < devices % procs) for k in range(procs)]
    ps = [ctx.Process(target=client_main, args=(address, model, feed, fetch, n, ready, go, start, warm, seconds,
                                                results, cores))
          for n in per]
    for p in ps:
        p.start()
    for _ in range(devices):
        ready.get(timeout=600)
    start.value = time.time() + 0.1
    go.set()
    lat, errors = [], []
    for _ in ps:
        got_lat, got_errors = results.get(timeout=seconds + 600)
        lat += got_lat
        errors += got_errors
    for p in ps:
        p.join()
    lat = np.asarray(lat)
    if not len(lat):
        return 0.0, float("nan"), float("nan"), len(errors)
    return len(lat) / seconds, float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), len(errors)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {','.join(MODELS)}")
    ap.add_argument("--parts", default="whole,late", help="cloud parts: whole (fed the input), late (fed LATE's "
                                                          "tensor: the tail of the model)")
    ap.add_argument("--devices", default="1,8,32,128", help="numbers of concurrent devices")
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"of {','.join(SERVERS)} (rayN: N replicas; "
                                                                 "-pK: K server processes)")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each phase (default 6)")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of load before each phase is measured, every "
                                                           "device answered once before that (default 2)")
    ap.add_argument("--slo-ms", type=float, default=500.0, help="the batching SLO (default 500)")
    ap.add_argument("--max-batch", type=int, default=32, help="largest batch (default 32)")
    ap.add_argument("--clients", type=int, default=4, help="client processes the devices are spread over")
    ap.add_argument("--server-cores", type=int, help="pin the server to the first N cores and the clients to "
                                                     "the rest (default: all share every core)")
    ap.add_argument("--replica-cpus", type=float, help="CPUs each Ray replica gets (default: the server's "
                                                       "cores / (replicas x models))")
    ap.add_argument("--accel", default="none", choices=["none", "opencl"],
                    help="run the servers' models on their OpenCL device (edgeflow serve --accel)")
    ap.add_argument("--cache", help="bench_models.py's exported ONNX files (default its cache)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    servers = [s for s in args.servers.split(",") if s]
    levels = [int(v) for v in args.devices.split(",") if v]
    if any(m not in MODELS for m in models) or not set(args.parts.split(",")) <= {"whole", "late"} \
            or any(not re.fullmatch(SERVER_KINDS, s) for s in servers):
        ap.error(f"--models of {MODELS}; --parts of whole, late; --servers of embedded, batched, rayN (and "
                 "embedded-pK, batched-pK, rayN-pK: K processes)")
    every = sorted(os.sched_getaffinity(0))
    server_cores = client_cores = None
    if args.server_cores:
        if not 0 < args.server_cores < len(every):
            ap.error(f"--server-cores: expected 1 to {len(every) - 1} (this process has {len(every)} cores)")
        server_cores, client_cores = set(every[:args.server_cores]), set(every[args.server_cores:])
    cores = args.server_cores or len(every)
    log(f"server on {cores} of {len(every)} cores, clients " + ("on the rest" if server_cores else "beside it")
        + ("" if args.accel == "none" else f"; models on OpenCL ({args.accel})"))
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_scale-"))
    (work / "models").mkdir()
    parts = [p for p in args.parts.split(",") if p]
    specs = prepare(models, parts, work / "models", args.cache)
    rows = []
    for kind in servers:
        with open(work / f"{kind}.log", "w") as logfile, open(work / f"{kind}.ray.log", "w") as raylog:
            head = ray_address = None
            if kind.startswith("ray") and "-p" in kind:  # several front ends: a cluster they all join
                head, ray_address = start_ray_head(raylog, cores, server_cores)
            command = server_command(kind, work / "models", args.slo_ms, args.max_batch, len(models), cores,
                                     args.replica_cpus, args.accel, ray_address)
            try:
                proc, address = start_server(command, logfile, server_cores)
            except BaseException:
                if head is not None:
                    harness.stop(head, 60)
                raise
            try:
                for (model, part), (feed_name, fetch, shape) in specs.items():
                    for devices in levels:
                        rate, p50, p99, errors = phase(address, model, (feed_name, shape), fetch, devices,
                                                       args.clients, args.seconds, client_cores, args.warm)
                        row = dict(server=kind, accel=args.accel, model=f"{model} ({part})", devices=devices,
                                   rps=rate, p50_ms=p50 * 1e3, p99_ms=p99 * 1e3, errors=errors)
                        rows.append(row)
                        log(f"{kind:9s} {row['model']:22s} {devices:4d} devices: {rate:7.1f} req/s  p50 "
                            f"{p50 * 1e3:8.1f} ms  p99 {p99 * 1e3:8.1f} ms  errors {errors}")
            finally:
                harness.stop(proc, 60)
                if head is not None:
                    harness.stop(head, 60)
    print_table(rows, servers)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    log(f"server logs in {work}")


def print_table(rows, servers):
    base = {(r["model"], r["devices"]): r["rps"] for r in rows if r["server"] == servers[0]}
    print(f"| model | devices | server | req/s | x {servers[0]} | p50 ms | p99 ms | errors |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["model"], r["devices"], servers.index(r["server"]))):
        ratio = r["rps"] / base[r["model"], r["devices"]] if base.get((r["model"], r["devices"])) else float("nan")
        print(f"| {r['model']} | {r['devices']} | {r['server']} | {r['rps']:.1f} | {ratio:.2f}x | "
              f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors']} |")


if __name__ == "__main__":
    sys.exit(main())
