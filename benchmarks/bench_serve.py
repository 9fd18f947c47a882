"""Cloud server throughput and latency with 1, 8 and 32 concurrent devices.

    .venv/bin/python benchmarks/bench_serve.py [--devices 1,8,32] [--seconds 4] [--reps 3]
        [--models mobilenetv2,encoder] [--max-workers 8] [--blas-threads default,1] [--json OUT]

`edgeflow serve` runs as a subprocess on 127.0.0.1 hosting two fixed-cut cloud packages
(partition.write_pair, device_graph="cut"): mobilenetv2-cloud (tests/data/onnx's
MobileNetV2, cut before its first op: 48 KB up, ~1 ms of compute, RPC-bound) and
encoder-head (bench_split.py's encoder + heavy head, cut after the encoder: 8 KB up,
~30 ms of compute). Each device is a client process (spawned) running the device package
in a closed loop. Every phase (model x server x devices) starts at the same instant for
its devices and lasts `--seconds`; the `--reps` repetitions are interleaved. Two servers
compare BLAS threads per request (`--blas-threads default,1`).

Measured per phase: throughput (replies per second: the median over the repetitions, and
their range), latency p50/p99/max over all replies, the server's compute per request
(p50), throughput in units of the peer's (the cloud package run by one interpreter in a
loop in one process, no gRPC, one BLAS thread: one core's bare capacity; the median of 5
interleaved 0.5 s segments' medians), and p50 over the single device's. Server and
clients share this machine's cores: the figures are a lower bound on a dedicated server's.
"""
import argparse
import json
import multiprocessing as mp
import os
import pathlib
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import harness
from harness import log

SHAPE = (1, 3, 64, 64)
MODELS = ("mobilenetv2", "encoder")


def prepare(name, work):
    """Write the model and its fixed cut's package pair; a dict describing them."""
    from edgeflow.format import reader
    from edgeflow.splitter import partition
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    src = d / f"{name}.efl"
    if name == "mobilenetv2":
        harness.convert_onnx("mobilenetv2", src)
        k, model_id, out_name = 0, "mobilenetv2-cloud", "logits"
    else:
        from bench_split import build_encoder_head
        build_encoder_head(str(src))
        k, model_id, out_name = 3, "encoder-head", "probs"  # encoder conv, relu, pool on the device
    model = reader.load(str(src))
    order = partition.Cut(model, set()).ops
    cut, _ = partition.write_pair(model, set(order[:k]), str(d), model_id=model_id, device_graph="cut",
                                  cloud_graph="cut", probe_shapes={"image": SHAPE})
    return {"name": name, "model_id": model_id, "device": str(d / "device.efl"), "cloud": str(d / "cloud.efl"),
            "source": str(src), "output": out_name, "uploads": cut.names(cut.uploads),
            "downloads": cut.names(cut.downloads)}


def bare_peer(infos, device_x, configs, segments=5, seconds=0.5):
    """The peer: each cloud package's part run in a loop in this process (no gRPC), for
    every BLAS configuration (0: the library's default), in `segments` interleaved
    segments of `seconds`; the median of the segments' medians. {(config, model name):
    seconds per request}."""
    import edgeflow as ef
    runs = {}
    for info in infos:
        dev = ef.Interpreter(info["source"])
        feeds = {"image": device_x} if info["uploads"] == ["image"] else dev.run(info["uploads"], {"image": device_x})
        info["up_bytes"] = int(sum(v.nbytes for v in feeds.values()))
        for c in configs:
            cloud = ef.Interpreter(info["cloud"], num_threads=c or None)
            cloud.run(info["downloads"], feeds)
            runs[c, info["name"]] = (cloud, feeds, info["downloads"])
    segment_medians = {k: [] for k in runs}
    for _ in range(segments):
        for k, (cloud, feeds, fetches) in runs.items():
            times, t_end = [], time.perf_counter() + seconds
            while time.perf_counter() < t_end or len(times) < 3:
                t = time.perf_counter()
                cloud.run(fetches, feeds)
                times.append(time.perf_counter() - t)
            segment_medians[k].append(harness.median(times))
    return {k: harness.median(v) for k, v in segment_medians.items()}


# -- a device process -------------------------------------------------------------------
def device_main(index, addresses, infos, x, ready, schedule, results):
    """Connect to every server, warm up, report ready; then run the phases it takes part in."""
    try:
        from edgeflow.cloud import Client
        clients, runners = {}, {}
        for config, address in addresses.items():
            client = clients[config] = Client(address, timeout=60)
            client.wait_ready(timeout=30)
            for info in infos:
                interp = harness.split_device(info["device"], client, timeout=60)
                run = runners[config, info["name"]] = interp.get_signature_runner("infer")
                for _ in range(2):
                    run(image=x)
        ready.put(index)
        phases = schedule.get(timeout=600)
        out = []
        for ph in phases:
            if index >= ph["devices"]:
                continue
            run, client = runners[ph["config"], ph["model"]], clients[ph["config"]]
            while time.time() < ph["start"]:
                time.sleep(min(0.01, max(0.0, ph["start"] - time.time())))
            end = ph["start"] + ph["seconds"]
            lat, srv = [], []
            while True:
                t0 = time.time()
                if t0 >= end:
                    break
                run(image=x)
                t1 = time.time()
                if t1 <= end:
                    lat.append(t1 - t0)
                    srv.append(client.link.last_compute_s)
            out.append({"phase": ph["id"], "lat": lat, "srv": srv})
        for client in clients.values():
            client.close()
        results.put((index, out, None))
    except BaseException as e:  # noqa: BLE001 (report it to the parent)
        import traceback
        results.put((index, [], f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# -- the run ----------------------------------------------------------------------------
def start_server(model_dir, max_workers, blas_threads, logfile):
    cmd = harness.edgeflow_cmd() + ["serve", "--model-dir", str(model_dir), "--host", "127.0.0.1", "--port", "0"]
    if max_workers:
        cmd += ["--max-workers", str(max_workers)]
    env = harness.blas_env(blas_threads) if blas_threads else None
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = pathlib.Path(logfile.name).read_text(errors="replace")
        m = re.search(r"serving \d+ models on 127\.0\.0\.1:(\d+)", text)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"edgeflow serve did not start: {pathlib.Path(logfile.name).read_text()[-2000:]}")


def percentile(v, q):
    return float(np.percentile(np.asarray(v), q)) if len(v) else float("nan")


def config_name(blas_threads):
    return f"BLAS {blas_threads}" if blas_threads else "BLAS default"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="1,8,32", help="numbers of concurrent devices (default 1,8,32)")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each phase (default 4)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each phase, interleaved (default 3)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {','.join(MODELS)}")
    ap.add_argument("--max-workers", type=int, default=0,
                    help="the server's --max-workers (default: edgeflow serve's own default)")
    ap.add_argument("--blas-threads", default="default,1",
                    help="servers to compare, by their OPENBLAS/OMP_NUM_THREADS: 'default' (the library's: "
                         "one per core) and/or numbers (default 'default,1')")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    levels = sorted({int(v) for v in args.devices.split(",") if v.strip()})
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not levels or min(levels) < 1 or any(m not in MODELS for m in models):
        ap.error(f"--devices are positive integers; --models of {MODELS}")
    try:
        configs = [0 if v.strip() == "default" else int(v) for v in args.blas_threads.split(",") if v.strip()]
    except ValueError:
        ap.error("--blas-threads: 'default' or positive integers, comma-separated")
    t_begin = time.monotonic()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_serve-"))
    servers = {}
    workers = []
    try:
        log("preparing the packages")
        infos = [prepare(m, work) for m in models]
        serve_dir = work / "serve"
        serve_dir.mkdir()
        for info in infos:
            os.symlink(info["cloud"], serve_dir / f"{info['model_id']}.efl")
        x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
        bare = bare_peer(infos, x, sorted(set(configs) | {1}))
        for (c, name), sec in bare.items():
            log(f"  {name}, {config_name(c)}: bare interpreter {sec * 1e3:.2f} ms per request ({1 / sec:.1f}/s, "
                "one stream, this process)")
        max_workers = args.max_workers or _default_max_workers()
        for c in configs:
            logfile = open(work / f"server-{c}.log", "w+b")
            proc, port = start_server(serve_dir, args.max_workers, c, logfile)
            servers[c] = (proc, f"127.0.0.1:{port}")
            log(f"server ({config_name(c)}) on 127.0.0.1:{port}, pid {proc.pid}, max_workers {max_workers}")
        log(f"starting {max(levels)} device processes")
        ctx = mp.get_context("spawn")
        ready, results = ctx.Queue(), ctx.Queue()
        schedules = []
        addresses = {c: addr for c, (_, addr) in servers.items()}
        for i in range(max(levels)):
            sq = ctx.Queue()
            p = ctx.Process(target=device_main, args=(i, addresses, infos, x, ready, sq, results), daemon=True)
            p.start()
            workers.append(p)
            schedules.append(sq)
        got = 0
        deadline = time.monotonic() + 300
        while got < len(workers):
            try:
                ready.get(timeout=max(1.0, deadline - time.monotonic()))
                got += 1
            except queue.Empty:
                errors = []
                while not results.empty():
                    errors.append(results.get()[2])
                raise RuntimeError(f"only {got}/{len(workers)} devices got ready: {errors[:2]}")
        log(f"  {got} devices ready ({time.monotonic() - t_begin:.0f} s)")
        phases, t = [], time.time() + 2.0
        for r in range(args.reps):  # repetitions interleaved: host-load drift spreads over all phases
            for info in infos:
                for c in configs:
                    for n in levels:
                        phases.append({"id": len(phases), "rep": r, "config": c, "model": info["name"], "devices": n,
                                       "start": t, "seconds": args.seconds})
                        t += args.seconds + 1.5  # a pause: the previous phase's last replies drain
        for sq in schedules:
            sq.put(phases)
        log(f"  {len(phases)} phases of {args.seconds:g} s, until {time.strftime('%H:%M:%S', time.localtime(t))}")
        per_phase = {ph["id"]: {"lat": [], "srv": [], "devices_reporting": 0} for ph in phases}
        errors = []
        for _ in workers:
            idx, out, err = results.get(timeout=t - time.time() + 120)
            if err:
                errors.append(f"device {idx}: {err}")
            for o in out:
                per_phase[o["phase"]]["lat"] += o["lat"]
                per_phase[o["phase"]]["srv"] += o["srv"]
                per_phase[o["phase"]]["devices_reporting"] += 1
        if errors:
            raise RuntimeError("device processes failed:\n" + "\n".join(errors[:3]))
        rows = []
        for info in infos:
            for c in configs:
                for n in levels:
                    mine = [ph for ph in phases if (ph["model"], ph["config"], ph["devices"]) == (info["name"], c, n)]
                    lat = [v for ph in mine for v in per_phase[ph["id"]]["lat"]]
                    srv = [v for ph in mine for v in per_phase[ph["id"]]["srv"] if v is not None]
                    rates = [len(per_phase[ph["id"]]["lat"]) / ph["seconds"] for ph in mine]
                    rows.append({"model": info["name"], "model_id": info["model_id"], "up_bytes": info["up_bytes"],
                                 "config": config_name(c), "devices": n, "replies": len(lat),
                                 "throughput": float(np.median(rates)), "rates": rates,
                                 "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99),
                                 "max_s": max(lat) if lat else float("nan"), "server_p50_s": percentile(srv, 50),
                                 "bare_s": bare[c, info["name"]], "bare1_s": bare[1, info["name"]]})
        header = (f"bench_serve: edgeflow serve on 127.0.0.1, max_workers {max_workers}; servers compared by their "
                  f"BLAS threads ({', '.join(config_name(c) for c in configs)}; the library default is one per core); "
                  f"devices are client processes in closed loops; {args.reps} x {args.seconds:g} s per phase, the "
                  f"repetitions interleaved (req/s: their median, min-max; latencies: all replies). Server and all "
                  f"clients share this machine's {os.cpu_count()} cores. {time.monotonic() - t_begin:.0f} s in all.")
        print_report(rows, header)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": header, "rows": rows}, f, indent=1)
    finally:
        for p in workers:
            if p.is_alive():
                p.terminate()
        for p in workers:
            p.join(5)
        for proc, _ in servers.values():
            harness.stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _default_max_workers():
    """`edgeflow serve`'s default --max-workers, from its own argument parser."""
    from edgeflow.cli import build_parser
    return build_parser().parse_args(["serve", "--model-dir", "."]).max_workers


def print_report(rows, header):
    print(header)
    print()
    head = (f"{'model (request up)':<26} {'server':<12} {'devices':>7} {'req/s':>6} {'(min-max)':>13} {'p50 ms':>7} "
            f"{'p99 ms':>7} {'max ms':>7} {'server p50':>10}  {'req/s x bare':>12} {'p50 / 1-dev':>11}")
    print(head)
    print("-" * len(head))
    first = {}
    for r in rows:
        key = (r["model"], r["config"])
        first.setdefault(key, r["p50_s"])
        label = f"{r['model_id']} ({r['up_bytes'] / 1024:.0f} KB)"
        spread = f"({min(r['rates']):.1f}-{max(r['rates']):.1f})"
        print(f"{label:<26} {r['config']:<12} {r['devices']:>7} {r['throughput']:>6.1f} {spread:>13} "
              f"{r['p50_s'] * 1e3:>7.1f} {r['p99_s'] * 1e3:>7.1f} {r['max_s'] * 1e3:>7.1f} "
              f"{r['server_p50_s'] * 1e3:>10.2f}  {r['throughput'] * r['bare1_s']:>12.2f} "
              f"{r['p50_s'] / first[key]:>11.2f}")
    print()
    seen = set()
    for r in rows:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        others = ", ".join(f"{x['config']} {x['bare_s'] * 1e3:.2f} ms" for x in rows
                           if x["model"] == r["model"] and x["devices"] == r["devices"] and x["config"] != "BLAS 1")
        print(f"bare: {r['model_id']}'s cloud part run by one interpreter in a loop in one process, no gRPC (median "
              f"of 5 interleaved 0.5 s medians): BLAS 1 {r['bare1_s'] * 1e3:.2f} ms ({1 / r['bare1_s']:.1f}/s)"
              + (f"; {others}" if others else ""))
    print("req/s x bare: throughput in units of the bare interpreter's on one core (1 BLAS thread): above 1, the "
          "server uses more than one core's worth. server p50: the server's compute time per request as it reports "
          "it (interp.run only); p50 - server p50 is gRPC, queueing and the client's own work. p50 / 1-dev: over the "
          "first row's p50 of the same model and server. Server and clients share the cores: at 8 and 32 devices "
          "the clients' CPU competes with the server's.")


if __name__ == "__main__":
    sys.exit(main())
