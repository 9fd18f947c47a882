"""The lab's self-test: builds labs at three rates (and one with a 40 ms RTT) and measures
throughput each way, TCP ping-pong RTT, a request after idle, tbf drops and retransmits,
the CPU quota's slowdown (long loops and request-like tasks at two CFS periods) and a gRPC
health check from the device to the cloud namespace. Prints figures; asserts nothing.

    sudo .venv/bin/python benchmarks/netlab [--quick] [--json OUT.json]

Its small tools run inside the namespaces as `python benchmarks/netlab TOOL ARGS...`.
"""
import json
import os
import socket
import subprocess
import sys
import time
from statistics import median

from .lab import CFS_PERIOD_US, FRAME, MTU, NetlabError, lab, read_line, stop, wire_seconds

def _tp_server(bind_ip):
    """Cloud side: accepts connections; protocol: 1 line 'up N' / 'down N' / 'ping N'."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind_ip, 0))
    srv.listen(4)
    srv.settimeout(120)
    print("READY %d" % srv.getsockname()[1], flush=True)
    while True:
        try:
            c, _ = srv.accept()
        except socket.timeout:
            return
        c.settimeout(120)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = c.makefile("rb")
        line = f.readline().decode().split()
        if not line or line[0] == "quit":
            c.close()
            return
        mode, n = line[0], int(line[1])
        if mode == "up":         # receive n bytes, report first/last byte times
            got, t_first, buf = 0, None, bytearray(1 << 16)
            while got < n:
                k = f.readinto1(buf) if hasattr(f, "readinto1") else f.readinto(buf)
                if not k:
                    break
                if t_first is None:
                    t_first, first_k = time.perf_counter(), k
                got += k
            t_last = time.perf_counter()
            c.sendall((json.dumps({"got": got, "first": first_k,
                                   "span": t_last - t_first}) + "\n").encode())
        elif mode == "down":     # send n bytes
            chunk = b"\0" * (1 << 16)
            left = n
            while left > 0:
                c.sendall(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            f.readline()         # wait for the client's "done"
        elif mode == "ping":
            for _ in range(n):
                b = f.read(1)
                if not b:
                    break
                c.sendall(b)
        elif mode == "msg":      # n requests of size bytes, each answered by 1 byte
            size = int(line[2])
            for _ in range(n):
                if len(f.read(size)) != size:
                    break
                c.sendall(b"k")
        c.close()


def _tp_client(server_ip, port, mode, n, size=0):
    c = socket.create_connection((server_ip, int(port)), timeout=120)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n, size = int(n), int(size)
    f = c.makefile("rb")
    c.sendall(("%s %d %d\n" % (mode, n, size)).encode())
    res = {"mode": mode, "n": n}
    t0 = time.perf_counter()
    if mode == "up":
        chunk = b"\0" * (1 << 16)
        left = n
        while left > 0:
            c.sendall(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
        rep = json.loads(f.readline())
        res.update(rep, total=time.perf_counter() - t0)
    elif mode == "down":
        got, t_first, buf = 0, None, bytearray(1 << 16)
        while got < n:
            k = f.readinto1(buf)
            if not k:
                break
            if t_first is None:
                t_first, first_k = time.perf_counter(), k
            got += k
        t_last = time.perf_counter()
        c.sendall(b"done\n")
        res.update(got=got, first=first_k, span=t_last - t_first, total=t_last - t0)
    elif mode == "ping":
        rtts = []
        for _ in range(n):
            t = time.perf_counter()
            c.sendall(b"x")
            if f.read(1) != b"x":
                break
            rtts.append(time.perf_counter() - t)
        res["rtts"] = rtts
    elif mode == "msg":
        msg, ts = b"\1" * size, []
        for i in range(n):
            time.sleep(0.05)     # idle gap: the tbf bucket refills as between requests
            t = time.perf_counter()
            c.sendall(msg)
            if f.read(1) != b"k":
                break
            ts.append(time.perf_counter() - t)
        res["times"] = ts
    c.close()
    print(json.dumps(res), flush=True)


def _spin(n):
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    for i in range(int(n)):
        x += i
    print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}),
          flush=True)


def _task(target_ms, reps, gap_s):
    """Request-like CPU work: `reps` times, idle gap_s then ~target_ms of CPU (a loop
    calibrated on process time); prints [wall ms, cpu ms] of each."""
    def work(k):
        x = 0
        for i in range(k):
            x += i
        return x
    c0 = time.process_time()
    work(1_000_000)
    n = int(float(target_ms) / 1e3 / max(time.process_time() - c0, 1e-4) * 1_000_000)
    ts = []
    for _ in range(int(reps)):
        time.sleep(float(gap_s))
        t, c = time.perf_counter(), time.process_time()
        work(n)
        ts.append(((time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3))
    print(json.dumps({"ms": ts}), flush=True)


_GRPC_SERVER = r"""
import sys, grpc
from concurrent import futures
from grpc_health.v1 import health, health_pb2_grpc
s = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.so_reuseport", 0)])
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), s)
port = s.add_insecure_port(sys.argv[1] + ":0")
s.start(); print("READY", port, flush=True)
s.wait_for_termination(timeout=60)
"""

_GRPC_CLIENT = r"""
import statistics, sys, time, json, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
t0 = time.perf_counter()
ch = grpc.insecure_channel(sys.argv[1], options=[("grpc.enable_http_proxy", 0)])
grpc.channel_ready_future(ch).result(timeout=15)
t1 = time.perf_counter()
stub = health_pb2_grpc.HealthStub(ch)
r = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
ts = []
for _ in range(20):
    t = time.perf_counter(); stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    ts.append(time.perf_counter() - t)
ts.sort()
print(json.dumps({"status": health_pb2.HealthCheckResponse.ServingStatus.Name(r.status),
                  "connect_s": t1 - t0, "rpc_median_ms": statistics.median(ts) * 1e3}))
"""


def _me():
    return [sys.executable, os.path.dirname(os.path.abspath(__file__))]


def _run_json(L, ns, argv, timeout, cpu_quota=None):
    p = L.run_in(ns, argv, cpu_quota=cpu_quota, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(p)
        raise NetlabError("%s timed out after %ss" % (argv[2:], timeout))
    if p.returncode != 0:
        raise NetlabError("%s failed: %s" % (argv, err.decode()[-2000:]))
    return json.loads(out.decode().strip().splitlines()[-1])


def _start_server(L, ns, argv, timeout=15):
    p = L.run_in(ns, argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    line = read_line(p.stdout, timeout)
    if not line.startswith("READY"):
        stop(p)
        raise NetlabError("server %s did not start: %r" % (argv, line))
    return p, int(line.split()[1])


def _measure_link(L, seconds=2.5, pings=100, msg_n=8):
    """Throughput each direction (receiver-side span) and TCP ping-pong RTT."""
    srv, port = _start_server(L, "cloud", _me() + ["_tp_server", L.cloud_ip])
    res = {}
    try:
        for d, mbps in (("up", L.up_mbps), ("down", L.down_mbps)):
            n = int(min(max(mbps * 1e6 / 8 * seconds, 256 << 10), 2 << 20))
            r = _run_json(L, "device", _me() + ["_tp_client", L.cloud_ip, port, d, n],
                          timeout=n * 8 / (mbps * 1e6) * 4 + 20)
            # bytes after the first read over the span between first and last read
            res[d] = {"bytes": r["got"], "mbps": (r["got"] - r["first"]) * 8 / r["span"] / 1e6,
                      "mbps_total": r["got"] * 8 / r["total"] / 1e6, "seconds": r["total"]}
        r = _run_json(L, "device", _me() + ["_tp_client", L.cloud_ip, port, "ping", pings],
                      timeout=60)
        rt = sorted(r["rtts"])
        res["rtt_ms"] = {"min": rt[0] * 1e3, "median": median(rt) * 1e3,
                         "p90": rt[int(len(rt) * 0.9)] * 1e3}
        msg = {}
        for d, mbps in (("up", L.up_mbps),):
            size = int(max(16 << 10, mbps * 1e6 / 8 * 0.15))
            r = _run_json(L, "device", _me() + ["_tp_client", L.cloud_ip, port, "msg",
                                                msg_n, size], timeout=60)
            t = sorted(r["times"])
            ideal = wire_seconds(size, mbps)
            msg[d] = {"size": size, "n": len(t), "ideal_ms": ideal * 1e3,
                      "min_ms": t[0] * 1e3, "median_ms": median(t) * 1e3,
                      "max_ms": t[-1] * 1e3}
        res["msg"] = msg
        res["qdisc"] = L.qdisc_stats()
        res["retrans"] = {k: L.tcp_counters(ns)["RetransSegs"]
                          for k, ns in (("device", L.device_ns), ("cloud", L.cloud_ns))}
    finally:
        stop(srv)
    return res


def _print_msg(r, rtt_ms=0.0):
    m, q = r["msg"]["up"], r["qdisc"]
    print("          %d x %d B request after 50 ms idle: median %.1f ms, max %.1f ms "
          "(wire time %.1f ms%s) | tbf drops up/down %d/%d, tcp retransmits %d/%d"
          % (m["n"], m["size"], m["median_ms"], m["max_ms"], m["ideal_ms"],
             (" + rtt %.0f" % rtt_ms) if rtt_ms else "", q["up"].get("dropped", -1),
             q["down"].get("dropped", -1), r["retrans"]["device"], r["retrans"]["cloud"]))


def selftest(rates=(1.1, 5.85, 18.88), rtt_check_ms=40.0, quota=0.2, quick=False):
    """Verify the lab on this machine and print figures. Returns a dict of results."""
    t_start = time.monotonic()
    results = {"rates": {}}
    secs = 1.2 if quick else 2.5
    print("netlab self-test (HZ-independent tbf, MTU %d, frame %d B; TCP goodput ceiling "
          "= 1448/1514 = 95.6%% of the tbf rate)" % (MTU, FRAME))
    for rate in rates:
        with lab(rate, rate) as L:
            r = _measure_link(L, seconds=secs)
        results["rates"][rate] = r
        p = L.tbf["up"]
        print("  %6.2f Mbit/s  burst %5d B limit %6d B | up %6.3f Mbit/s (%5.1f%%)  down "
              "%6.3f Mbit/s (%5.1f%%) | ping-pong rtt min/med/p90 %.2f/%.2f/%.2f ms"
              % (rate, p["burst"], p["limit"], r["up"]["mbps"],
                 100 * r["up"]["mbps"] / rate, r["down"]["mbps"],
                 100 * r["down"]["mbps"] / rate, r["rtt_ms"]["min"], r["rtt_ms"]["median"],
                 r["rtt_ms"]["p90"]))
        _print_msg(r)
    if rtt_check_ms:
        rate = rates[len(rates) // 2]
        with lab(rate, rate, rtt_ms=rtt_check_ms) as L:
            r = _measure_link(L, seconds=secs)
        results["rtt_lab"] = r
        print("  %6.2f Mbit/s + rtt %.0f ms (tun relay): up %6.3f (%5.1f%%)  down %6.3f "
              "(%5.1f%%) | rtt min/med/p90 %.2f/%.2f/%.2f ms"
              % (rate, rtt_check_ms, r["up"]["mbps"], 100 * r["up"]["mbps"] / rate,
                 r["down"]["mbps"], 100 * r["down"]["mbps"] / rate, r["rtt_ms"]["min"],
                 r["rtt_ms"]["median"], r["rtt_ms"]["p90"]))
        _print_msg(r, rtt_check_ms)
    # CPU quota: the same CPU-bound loop unconstrained vs under `quota` of one core.
    # The unconstrained wall time is inflated when other work shares the 2 cores, so the
    # quota's own figure is also given: wall/cpu of the throttled run (should be 1/quota).
    with lab(100, 100) as L:
        n = 6_000_000 if quick else 10_000_000
        spin = _me() + ["_spin", n]
        pairs = []
        for _ in range(2 if quick else 3):      # interleaved, against drifting host load
            free = _run_json(L, "device", spin, timeout=60)
            p = L.run_in("device", spin, cpu_quota=quota, stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
            out, _ = p.communicate(timeout=120)
            pairs.append((free, json.loads(out), p.cgroup.stat()))
        ratios = sorted(s["wall"] / f["wall"] for f, s, _ in pairs)
        wpc = sorted(s["wall"] / s["cpu"] for f, s, _ in pairs)
        ratio, wall_per_cpu = median(ratios), median(wpc)
        free, slow, st = pairs[-1]
        results["quota"] = {"pairs": [(f, s) for f, s, _ in pairs], "ratio": ratio,
                            "ratios": ratios, "quota_wall_over_cpu": wall_per_cpu,
                            "expected": 1 / quota, "cpu.stat": st}
        print("  cpu quota %.0f%% (cfs period 100 ms), same loop: unconstrained %s s, under "
              "quota %s s wall -> ratio median %.2f (all %s; expected %.1f), throttled "
              "run wall/cpu %.2f; throttled %d of %d periods"
              % (quota * 100, "/".join("%.2f" % f["wall"] for f, _, _ in pairs),
                 "/".join("%.2f" % s["wall"] for _, s, _ in pairs), ratio,
                 "/".join("%.2f" % r for r in ratios), 1 / quota, wall_per_cpu,
                 st.get("nr_throttled", -1), st.get("nr_periods", -1)))
        # Short request-like work (30 ms of CPU after an idle gap) shows the CFS period's
        # effect: the quota is per period, so an idle device starts each request with a
        # full period's quota (20 ms at 100 ms) and runs that part at full speed.
        task = _me() + ["_task", 30, 6 if quick else 10, 0.15]
        lat = {}
        for label, q, per in (("free", None, CFS_PERIOD_US), ("100ms", quota, 100000),
                              ("10ms", quota, 10000)):
            r = L.run_in("device", task, cpu_quota=q, cpu_period_us=per,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            ms = json.loads(r.communicate(timeout=60)[0])["ms"]
            lat[label] = {"wall_ms": median([w for w, c in ms]), "cpu_ms": median([c for w, c in ms]),
                          "slowdown": median([w / c for w, c in ms]),
                          "slowdown_range": (min(w / c for w, c in ms),
                                             max(w / c for w, c in ms))}
        results["quota_task"] = lat
        print("  request-like task (~30 ms CPU after 150 ms idle), median wall/cpu slowdown "
              "(min-max): unconstrained %.2f, %.0f%% quota at cfs period 100 ms %.2f "
              "(%.1f-%.1f), at period 10 ms %.2f (%.1f-%.1f); expected %.1f"
              % (lat["free"]["slowdown"], quota * 100, lat["100ms"]["slowdown"],
                 *lat["100ms"]["slowdown_range"], lat["10ms"]["slowdown"],
                 *lat["10ms"]["slowdown_range"], 1 / quota))
        # gRPC: health server in the cloud namespace, client in the device namespace
        try:
            srv, port = _start_server(L, "cloud", [sys.executable, "-c", _GRPC_SERVER,
                                                   L.cloud_ip])
            try:
                g = _run_json(L, "device", [sys.executable, "-c", _GRPC_CLIENT,
                                            "%s:%d" % (L.cloud_ip, port)], timeout=40)
            finally:
                stop(srv)
            results["grpc"] = g
            print("  grpc health check cloud<-device: %s (connect %.1f ms, rpc median "
                  "%.2f ms)" % (g["status"], g["connect_s"] * 1e3, g["rpc_median_ms"]))
        except (NetlabError, ImportError) as e:
            results["grpc"] = {"error": str(e)}
            print("  grpc check FAILED: %s" % e)
    results["seconds"] = time.monotonic() - t_start
    print("self-test done in %.1f s" % results["seconds"])
    return results


TOOLS = {"_tp_server": lambda a: _tp_server(a[0]), "_tp_client": lambda a: _tp_client(*a[:5]),
         "_spin": lambda a: _spin(a[0]), "_task": lambda a: _task(*a[:3])}


def main(argv):
    """`python benchmarks/netlab [--quick] [--json OUT]`, or one of the TOOLS."""
    if argv[1:2] and argv[1] in TOOLS:
        return TOOLS[argv[1]](argv[2:])
    import argparse
    ap = argparse.ArgumentParser(description="network lab self-test (needs root)")
    ap.add_argument("--quick", action="store_true", help="shorter transfers")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv[1:])
    res = selftest(quick=a.quick)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
