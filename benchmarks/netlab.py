"""Network lab for split-inference benchmarks: a real narrow link and a real slow device.

A *lab* is two network namespaces, "device" and "cloud", joined by a veth pair whose two
ends are shaped with tc tbf (device end egress = uplink rate, cloud end egress = downlink
rate), plus cgroup-v1 CPU quotas for the processes started in them. Linux only, needs
root, iproute2 (`ip`, `tc`), the tbf qdisc and a cgroup-v1 `cpu` hierarchy. Standard
library only; everything it creates is removed on exit (context manager, atexit, SIGTERM),
and leftovers of crashed runs (owner pid gone) are removed by the next lab.

    from netlab import lab
    with lab(up_mbps=5.85, down_mbps=18.88) as L:
        srv = L.run_in(L.cloud_ns, [sys.executable, "server.py", "--bind", L.cloud_ip])
        dev = L.run_in(L.device_ns, [sys.executable, "device.py", L.cloud_ip],
                       cpu_quota=0.2)          # 20% of one core, children inherit it
        dev.wait(timeout=60)
    # namespaces, veth, tbf, cgroups, still-running processes: all gone here

    .venv/bin/python benchmarks/netlab.py [--quick]     # self-test, prints figures

Topology and addresses (a private /30, only inside the lab's own namespaces):

    rtt_ms == 0:  [device ns] efdev 10.77.0.1/30 <--veth--> 10.77.0.2/30 efcld [cloud ns]
    rtt_ms  > 0:  [device ns] efdev 10.77.0.1/30 <--> 10.77.0.2 [wan ns] 10.77.0.5 <-->
                  10.77.0.6/30 efcld [cloud ns]; the wan namespace forwards every packet
                  through a TUN device whose reader (a small process of this module)
                  holds it for rtt_ms/2 before writing it back: added propagation delay.
                  (netem, the usual tool, is not built into this kernel; neither are fq
                  or etf, so nothing in tc can delay packets. See "Delay" below.)

tbf parameters (see `tbf_params`), for a rate R bit/s (Mbit = 1e6 bit):
  * rate R, counted on the Ethernet frame (IP packet + 14 bytes): TCP goodput with the
    1500-byte MTU is at most 1448/1514 = 95.6% of R (MSS 1448 with timestamps);
    `wire_seconds(n, mbps)` converts a payload to its time on the wire.
  * burst (bucket) = one full frame (1514 B) + max(512 B, R * 1 ms): 2026 B at 1.1,
    2245 B at 5.85, 3874 B at 18.88 Mbit/s. tbf must hold at least one full frame or it
    drops/segments full packets. The old rule "burst >= R/HZ" (HZ = 250 here: R*4 ms)
    dates from jiffy timers; tbf now re-arms an hrtimer for the exact time the next
    packet's tokens are due, and the extra R*1 ms only absorbs timer lateness (measured:
    burst = exactly one frame reaches only 91% of 18.88 Mbit/s, one frame + 0.2-1 ms
    reaches the 95.6% ceiling at every rate). Keep the bucket small: after an idle gap
    the first `burst` bytes of a message pass at once, so a message takes
    (wire bytes - burst)/R instead of wire bytes/R (at 1.1 Mbit/s 14.7 ms less, at
    18.88 Mbit/s 1.6 ms less); a R/HZ or bigger bucket would hide small tensors' cost.
  * limit (queue) = max(R * queue_ms, 16 frames), queue_ms = 100 by default: a ~100 ms
    bottleneck buffer (24 KB = 176 ms at 1.1 Mbit/s because of the 16-frame floor).
    tbf's "latency" is the same thing expressed in time (tc prints it).
  * GSO is off on the two shaped ends (gso_max_segs 1), see `Lab._shape`.
  * What was used is in `Lab.tbf` / `Lab.describe()` and printed by the self-test.

Delay: with rtt_ms > 0 the delay is added at packet level by the wan namespace's TUN
relay (userspace, one Python process, FIFO, timed with a deadline queue and select), so
TCP sees a real RTT (slow start, ack clock, BDP, slow start after idle). It costs some
host CPU per packet (a few us), outside the device's cgroup. Measured: a TCP ping-pong
over rtt_ms=40 gives 40.3-40.7 ms median (idle host), ~+0.8 ms with both cores busy,
with occasional few-ms outliers when the relay is not scheduled at once. Set rtt_ms=0
(the default) for the plain two-namespace lab and add the profile's RTT analytically.
The relay keeps up with 100 Mbit/s (95 Mbit/s TCP measured at rtt_ms=5).

CPU quota: run_in(..., cpu_quota=0.2) puts the process in a fresh cgroup-v1 cpu group,
cfs_period_us = cpu_period_us (default 100000), cfs_quota_us = 0.2 * period; children
inherit it. The quota is per period, so a process that was idle starts with a full
period's quota and runs it at full speed: with the 100 ms period a request-like task of
~30 ms CPU after an idle gap is slowed only ~1.5x, not 5x (self-test figure); with
cpu_period_us=10000 it is slowed ~4.6x. Long CPU-bound runs are slowed 5x with either.
Use a short period (10 ms) to emulate a slow device's per-request latency.
"""
import atexit
import collections
import contextlib
import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

__all__ = ["Lab", "Link", "lab", "run_in", "reap", "tbf_params", "wire_seconds", "cleanup_stale",
           "selftest", "CgroupCPU", "NetlabError"]

PREFIX = "efl"                    # namespaces efl-<pid>-<n>-dev, cgroups efl-<pid>-<n>
MTU = 1500
FRAME = MTU + 14                  # what tbf counts for a full packet on a veth
CFS_PERIOD_US = 100000
_SUBNET = "10.77.0"


class NetlabError(RuntimeError):
    pass


# A link profile; lab(*Link(1.1, 5.85, 40)) or lab(**Link(...)._asdict()).
Link = collections.namedtuple("Link", "up_mbps down_mbps rtt_ms", defaults=(0.0,))


# --------------------------------------------------------------------------- helpers

def _sh(*argv, check=True, input=None, timeout=20):
    argv = [str(a) for a in argv]
    r = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise NetlabError("%s -> rc %d: %s" % (shlex.join(argv), r.returncode,
                                                (r.stderr or r.stdout).strip()))
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cpu_cgroup_root():
    """Mount point of the cgroup-v1 hierarchy that has the `cpu` controller."""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "cgroup" and "cpu" in parts[3].split(","):
                return parts[1]
    raise NetlabError("no cgroup-v1 'cpu' hierarchy mounted (cgroup v2 is not supported)")


def tbf_params(rate_mbps, queue_ms=100.0, burst_bytes=None):
    """tbf settings for `rate_mbps` (Mbit/s, 1e6 bit): dict(rate_bit, burst, limit)."""
    if rate_mbps <= 0:
        raise ValueError("rate must be > 0 Mbit/s")
    rate_bit = int(round(rate_mbps * 1e6))
    rate_Bps = rate_bit / 8.0
    if burst_bytes is None:
        burst_bytes = FRAME + max(512, int(rate_Bps * 0.001))
    if burst_bytes < FRAME:
        raise ValueError("tbf burst must hold one full frame (%d bytes)" % FRAME)
    limit = max(int(rate_Bps * queue_ms / 1000.0), 16 * FRAME)
    return {"rate_bit": rate_bit, "burst": int(burst_bytes), "limit": limit,
            "queue_ms": limit / rate_Bps * 1000.0}


def wire_seconds(payload_bytes, mbps, mss=1448, overhead=66):
    """Time `payload_bytes` of one TCP stream occupy a link shaped to `mbps` (Mbit/s)
    in this lab: full segments of `mss` plus `overhead` bytes each (Ethernet 14 + IP 20
    + TCP 32 with timestamps), excluding handshake, acks and slow start."""
    segs = -(-int(payload_bytes) // mss)
    return (payload_bytes + segs * overhead) * 8.0 / (mbps * 1e6)


# --------------------------------------------------------------------------- cgroups

class CgroupCPU:
    """A fresh cgroup-v1 cpu group with a CFS quota of `quota` cores (0.2 = 20% of one)."""
    _n = 0
    _lock = threading.Lock()

    def __init__(self, quota, tag=None, period_us=CFS_PERIOD_US):
        if not (0.01 <= quota <= 64):
            raise ValueError("cpu_quota is a fraction of one core, 0.01 .. 64")
        with CgroupCPU._lock:
            CgroupCPU._n += 1
            n = CgroupCPU._n
        name = "%s-%d-%s%d" % (PREFIX, os.getpid(), (tag + "-") if tag else "q", n)
        self.path = os.path.join(_cpu_cgroup_root(), name)
        self.quota, self.period_us = quota, int(period_us)
        if not (1000 <= self.period_us <= 1000000):
            raise ValueError("cfs period must be 1 ms .. 1 s")
        quota_us = int(round(quota * self.period_us))
        if quota_us < 1000:
            raise ValueError("cfs quota %d us < the kernel's 1 ms minimum: use a longer "
                             "period" % quota_us)
        self._last_stat = {}
        os.mkdir(self.path)
        try:
            self._write("cpu.cfs_period_us", self.period_us)
            self._write("cpu.cfs_quota_us", quota_us)
        except BaseException:
            os.rmdir(self.path)
            raise

    def _write(self, fname, value):
        with open(os.path.join(self.path, fname), "w") as f:
            f.write(str(value))

    def pids(self):
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return []

    def stat(self):
        """cpu.stat as a dict (nr_periods, nr_throttled, throttled_time ns); after the
        group is removed, its last reading (taken just before removal)."""
        try:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                self._last_stat = {k: int(v) for k, v in
                                   (ln.split() for ln in f if ln.strip())}
        except FileNotFoundError:
            pass
        return dict(self._last_stat)

    def remove(self, kill=True, timeout=5.0):
        """rmdir the group; with kill, SIGKILL what is still in it (processes we started)."""
        if not os.path.isdir(self.path):
            return True
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                with contextlib.suppress(OSError):
                    self.stat()
                try:
                    os.rmdir(self.path)
                    return True
                except FileNotFoundError:
                    return True
                except OSError:
                    pass
            elif kill:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


# --------------------------------------------------------------------------- run_in

_registry_lock = threading.Lock()
_cgroups = []          # [(Popen, CgroupCPU)] made by module-level run_in
_labs = set()


class NetnsPopen(subprocess.Popen):
    """Popen of a process started with run_in; `.cgroup` is its CgroupCPU or None."""
    cgroup = None
    namespace = None


def _popen_in(namespace, argv, cpu_quota=None, env=None, tag=None,
              cpu_period_us=CFS_PERIOD_US, **popen_kw):
    """Start argv inside `namespace` (ip netns exec: no extra fork, Popen.pid is the
    process itself), in a fresh quota cgroup if cpu_quota is given. Returns NetnsPopen."""
    if isinstance(argv, str):
        raise TypeError("argv must be a list")
    cmd = ["ip", "netns", "exec", namespace] + [str(a) for a in argv]
    cg = None
    if cpu_quota is not None:
        cg = CgroupCPU(cpu_quota, tag=tag, period_us=cpu_period_us)
        # Join the group before exec so the target (and all its children) start inside it.
        cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
               os.path.join(cg.path, "cgroup.procs")] + cmd
    if env is not None:
        env = {str(k): str(v) for k, v in env.items()}
    try:
        p = NetnsPopen(cmd, env=env, **popen_kw)
    except BaseException:
        if cg is not None:
            cg.remove()
        raise
    p.cgroup = cg
    p.namespace = namespace
    return p


def run_in(namespace, argv, cpu_quota=None, env=None, cpu_period_us=CFS_PERIOD_US,
           **popen_kw):
    """Start `argv` in network namespace `namespace`; with cpu_quota (fraction of one
    core) inside a fresh cgroup-v1 cpu group (period 100 ms, quota = cpu_quota*100 ms,
    inherited by children). Extra keywords go to subprocess.Popen (stdout=..., cwd=...).
    The cgroup is removed by `reap()` once the process has exited, at interpreter exit
    at the latest (still-running members are then killed). Prefer `Lab.run_in`, whose
    processes and groups go away with the lab."""
    p = _popen_in(namespace, argv, cpu_quota, env, cpu_period_us=cpu_period_us, **popen_kw)
    if p.cgroup is not None:
        with _registry_lock:
            _cgroups.append((p, p.cgroup))
    reap()
    return p


def reap(kill=False):
    """Remove the cgroups of module-level run_in processes that have exited (all, killing
    what is left, with kill=True)."""
    with _registry_lock:
        keep = []
        for p, cg in _cgroups:
            if kill:
                _stop(p)
            if p.poll() is not None and cg.remove(kill=kill, timeout=2 if kill else 0):
                continue
            keep.append((p, cg))
        _cgroups[:] = keep


def _stop(p, grace=2.0):
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.terminate()
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(grace)


# --------------------------------------------------------------------------- the lab

class Lab:
    """Namespaces + veth + tbf (+ wan delay relay when rtt_ms > 0). Use `lab(...)`.

    Attributes: device_ns, cloud_ns, wan_ns (None without delay), device_ip, cloud_ip,
    up_mbps, down_mbps, rtt_ms, tbf = {"up": tbf_params, "down": tbf_params}."""
    _n = 0

    def __init__(self, up_mbps, down_mbps, rtt_ms=0.0, queue_ms=100.0, burst_bytes=None):
        if os.geteuid() != 0:
            raise NetlabError("the network lab needs root (namespaces, tc, cgroups)")
        cleanup_stale()
        Lab._n += 1
        base = "%s-%d-%d" % (PREFIX, os.getpid(), Lab._n)
        self.up_mbps, self.down_mbps, self.rtt_ms = float(up_mbps), float(down_mbps), \
            float(rtt_ms or 0.0)
        self.tbf = {"up": tbf_params(up_mbps, queue_ms, burst_bytes),
                    "down": tbf_params(down_mbps, queue_ms, burst_bytes)}
        self.device_ns, self.cloud_ns = base + "-dev", base + "-cld"
        self.wan_ns = base + "-wan" if self.rtt_ms > 0 else None
        self.device_if, self.cloud_if = "efdev", "efcld"
        self._procs = []
        self._relay = None
        self._closed = False
        self._made_ns = []
        _labs.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- construction
    def _ns(self, name):
        _sh("ip", "netns", "add", name)
        self._made_ns.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self):
        dev, cld = self.device_ns, self.cloud_ns
        self._ns(dev)
        self._ns(cld)
        if self.wan_ns is None:
            self.device_ip, self.cloud_ip = _SUBNET + ".1", _SUBNET + ".2"
            _sh("ip", "link", "add", self.device_if, "netns", dev, "type", "veth",
                "peer", "name", self.cloud_if, "netns", cld)
            _sh("ip", "-n", dev, "addr", "add", self.device_ip + "/30", "dev", self.device_if)
            _sh("ip", "-n", cld, "addr", "add", self.cloud_ip + "/30", "dev", self.cloud_if)
            _sh("ip", "-n", dev, "link", "set", self.device_if, "up")
            _sh("ip", "-n", cld, "link", "set", self.cloud_if, "up")
        else:
            self._build_wan()
        self._shape(dev, self.device_if, self.tbf["up"])
        self._shape(cld, self.cloud_if, self.tbf["down"])

    def _build_wan(self):
        dev, cld, wan = self.device_ns, self.cloud_ns, self.wan_ns
        self._ns(wan)
        self.device_ip, wan_d = _SUBNET + ".1", _SUBNET + ".2"
        wan_c, self.cloud_ip = _SUBNET + ".5", _SUBNET + ".6"
        _sh("ip", "link", "add", self.device_if, "netns", dev, "type", "veth",
            "peer", "name", "wdev", "netns", wan)
        _sh("ip", "link", "add", self.cloud_if, "netns", cld, "type", "veth",
            "peer", "name", "wcld", "netns", wan)
        for ns, ifc, ip in ((dev, self.device_if, self.device_ip), (wan, "wdev", wan_d),
                            (wan, "wcld", wan_c), (cld, self.cloud_if, self.cloud_ip)):
            _sh("ip", "-n", ns, "addr", "add", ip + "/30", "dev", ifc)
            _sh("ip", "-n", ns, "link", "set", ifc, "up")
        _sh("ip", "-n", dev, "route", "add", "default", "via", wan_d)
        _sh("ip", "-n", cld, "route", "add", "default", "via", wan_c)
        # wan: forward everything arriving from either veth into the TUN; what the relay
        # writes back comes in on the TUN and is routed by the main table (connected /30s).
        _sh("ip", "-n", wan, "tuntap", "add", "dev", "efdly", "mode", "tun")
        _sh("ip", "-n", wan, "link", "set", "efdly", "up")
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.efdly.rp_filter=0",
                    "net.ipv4.conf.all.send_redirects=0"):
            _sh("ip", "netns", "exec", wan, "sysctl", "-qw", key)
        _sh("ip", "-n", wan, "route", "add", "default", "dev", "efdly", "table", "177")
        for ifc in ("wdev", "wcld"):
            _sh("ip", "-n", wan, "rule", "add", "iif", ifc, "lookup", "177", "pref", "100")
        one_way_us = int(round(self.rtt_ms * 500.0))
        self._relay = _popen_in(wan, [sys.executable, os.path.abspath(__file__),
                                      "_relay", "efdly", str(one_way_us), str(os.getpid())],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = _readline(self._relay.stdout, 10.0)
        if not line.startswith("READY"):
            raise NetlabError("delay relay did not start: %r" % line)

    def _shape(self, ns, ifc, p):
        # No GSO/TSO super-packets on the shaped end: tbf then sees wire-size packets as a
        # real link would, and a full queue pushes back on the sender's TCP (local
        # NET_XMIT_DROP, resent at once) instead of tbf segmenting a 64 KB GSO packet and
        # dropping part of it (real losses; at 1.1 Mbit/s hundreds of retransmits/MB).
        _sh("ip", "-n", ns, "link", "set", ifc, "mtu", MTU, "gso_max_segs", 1)
        _sh("tc", "-n", ns, "qdisc", "replace", "dev", ifc, "root", "tbf",
            "rate", "%dbit" % p["rate_bit"], "burst", p["burst"], "limit", p["limit"])

    # -- use
    def run_in(self, namespace, argv, cpu_quota=None, env=None,
               cpu_period_us=CFS_PERIOD_US, **popen_kw):
        """Like module-level run_in, but the process (and its cgroup) belong to the lab:
        killed/removed when the lab closes if still running. namespace: a name, or
        "device"/"cloud"."""
        namespace = {"device": self.device_ns, "cloud": self.cloud_ns}.get(namespace,
                                                                          namespace)
        if namespace not in (self.device_ns, self.cloud_ns, self.wan_ns):
            raise ValueError("not a namespace of this lab: %r" % namespace)
        p = _popen_in(namespace, argv, cpu_quota, env, cpu_period_us=cpu_period_us,
                      **popen_kw)
        self._procs.append(p)
        return p

    def run_checked(self, namespace, argv, timeout, what, **kw):
        """Run `argv` in the lab to completion; its stdout, or RuntimeError naming `what`
        (with its stderr's tail) if it fails or outlives `timeout` seconds."""
        p = self.run_in(namespace, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise RuntimeError(f"{what} timed out after {timeout} s")
        if p.returncode != 0:
            raise RuntimeError(f"{what} failed (rc {p.returncode}): {err.decode()[-3000:]}")
        return out.decode()

    def qdisc_stats(self):
        """{"up": {...}, "down": {...}}: sent bytes/packets, dropped, overlimits of each tbf."""
        out = {}
        for key, ns, ifc in (("up", self.device_ns, self.device_if),
                             ("down", self.cloud_ns, self.cloud_if)):
            txt = _sh("tc", "-s", "-n", ns, "qdisc", "show", "dev", ifc).stdout
            m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)",
                          txt)
            out[key] = dict(zip(("bytes", "packets", "dropped", "overlimits"),
                                map(int, m.groups()))) if m else {"raw": txt}
        return out

    def tcp_counters(self, namespace):
        """The namespace's Tcp counters of /proc/net/snmp (OutSegs, RetransSegs, ...)."""
        namespace = {"device": self.device_ns, "cloud": self.cloud_ns}.get(namespace,
                                                                          namespace)
        txt = _sh("ip", "netns", "exec", namespace, "cat", "/proc/net/snmp").stdout
        rows = [l.split()[1:] for l in txt.splitlines() if l.startswith("Tcp:")]
        return {k: int(v) for k, v in zip(rows[0], rows[1])}

    def describe(self):
        d = "up %.2f Mbit/s, down %.2f Mbit/s, rtt %s" % (
            self.up_mbps, self.down_mbps,
            ("+%.1f ms (tun relay)" % self.rtt_ms) if self.rtt_ms else "+0 (none added)")
        for k in ("up", "down"):
            p = self.tbf[k]
            d += "\n  tbf %-4s rate %dbit burst %dB limit %dB (~%.0f ms queue)" % (
                k, p["rate_bit"], p["burst"], p["limit"], p["queue_ms"])
        return d

    # -- teardown
    def close(self):
        if self._closed:
            return
        self._closed = True
        errors = []
        for p in self._procs:
            _stop(p)
        if self._relay is not None:
            _stop(self._relay, grace=1.0)
            if self._relay.stdout:
                self._relay.stdout.close()
        for p in self._procs:
            if p.cgroup is not None and not p.cgroup.remove(kill=True):
                errors.append("cgroup %s busy" % p.cgroup.path)
        for ns in reversed(self._made_ns):
            # deleting a veth end in a namespace removes its peer as well
            r = _sh("ip", "netns", "del", ns, check=False)
            if r.returncode != 0:
                errors.append("ip netns del %s: %s" % (ns, r.stderr.strip()))
        _labs.discard(self)
        if errors:
            print("netlab: cleanup problems: " + "; ".join(errors), file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def lab(up_mbps, down_mbps, rtt_ms=0.0, queue_ms=100.0, burst_bytes=None):
    """Context manager: a Lab shaped to up_mbps/down_mbps (Mbit/s, 1e6 bit) with rtt_ms of
    added round-trip delay (0: none, plain veth pair). Everything is removed on exit, also
    on SIGTERM while it is open (if SIGTERM had its default handler)."""
    old = None
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        old = signal.signal(signal.SIGTERM, _sigterm_exit)
    L = None
    try:
        L = Lab(up_mbps, down_mbps, rtt_ms, queue_ms, burst_bytes)
        yield L
    finally:
        if L is not None:
            L.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _sigterm_exit(signum, frame):
    raise SystemExit(128 + signum)


def cleanup_stale():
    """Remove namespaces and cgroups named efl-<pid>-... whose creating pid is gone."""
    pat = re.compile(r"^%s-(\d+)-" % PREFIX)
    r = _sh("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pat.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _sh("ip", "netns", "del", name, check=False)
    try:
        root = _cpu_cgroup_root()
    except NetlabError:
        return
    for name in os.listdir(root):
        m = pat.match(name)
        if m and not _pid_alive(int(m.group(1))):
            cg = CgroupCPU.__new__(CgroupCPU)
            cg.path, cg._last_stat = os.path.join(root, name), {}
            cg.remove(kill=True)


@atexit.register
def _atexit_cleanup():
    for L in list(_labs):
        with contextlib.suppress(Exception):
            L.close()
    with contextlib.suppress(Exception):
        reap(kill=True)


def _readline(stream, timeout):
    """One line from a pipe within `timeout` seconds ('' on timeout/EOF)."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        ch = os.read(fd, 1)
        if not ch:
            break
        buf += ch
    return buf.decode(errors="replace").strip()


# --------------------------------------------------------------------------- delay relay

def _relay_main(ifname, one_way_us, parent_pid, max_s=6 * 3600):
    """Runs inside the wan namespace: read IP packets from TUN `ifname`, write each back
    one_way_us later (FIFO). Exits when the parent dies, on SIGTERM, or after max_s."""
    import fcntl
    TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    delay = one_way_us / 1e6
    q = collections.deque()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("READY", flush=True)
    end = time.monotonic() + max_s
    next_check = 0.0
    now = time.monotonic
    while True:
        t = now()
        if t > next_check:
            if t > end or os.getppid() != parent_pid:
                return
            next_check = t + 1.0
        timeout = max(0.0, q[0][0] - t) if q else 1.0
        r = select.select([fd], [], [], timeout)[0]
        if r:
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                q.append((now() + delay, pkt))
        t = now()
        while q and q[0][0] <= t:
            try:
                os.write(fd, q.popleft()[1])
            except OSError:
                pass


# --------------------------------------------------------------------------- self-test
# Small tools run inside the namespaces: python netlab.py _tp_server|_tp_client|_spin ...

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
import sys, time, json, grpc
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
                  "connect_s": t1 - t0, "rpc_median_ms": ts[len(ts)//2] * 1e3}))
"""


def _me():
    return [sys.executable, os.path.abspath(__file__)]


def _run_json(L, ns, argv, timeout, cpu_quota=None):
    p = L.run_in(ns, argv, cpu_quota=cpu_quota, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(p)
        raise NetlabError("%s timed out after %ss" % (argv[2:], timeout))
    if p.returncode != 0:
        raise NetlabError("%s failed: %s" % (argv, err.decode()[-2000:]))
    return json.loads(out.decode().strip().splitlines()[-1])


def _start_server(L, ns, argv, timeout=15):
    p = L.run_in(ns, argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    line = _readline(p.stdout, timeout)
    if not line.startswith("READY"):
        _stop(p)
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
        res["rtt_ms"] = {"min": rt[0] * 1e3, "median": rt[len(rt) // 2] * 1e3,
                         "p90": rt[int(len(rt) * 0.9)] * 1e3}
        msg = {}
        for d, mbps in (("up", L.up_mbps),):
            size = int(max(16 << 10, mbps * 1e6 / 8 * 0.15))
            r = _run_json(L, "device", _me() + ["_tp_client", L.cloud_ip, port, "msg",
                                                msg_n, size], timeout=60)
            t = sorted(r["times"])
            ideal = wire_seconds(size, mbps)
            msg[d] = {"size": size, "n": len(t), "ideal_ms": ideal * 1e3,
                      "min_ms": t[0] * 1e3, "median_ms": t[len(t) // 2] * 1e3,
                      "max_ms": t[-1] * 1e3}
        res["msg"] = msg
        res["qdisc"] = L.qdisc_stats()
        res["retrans"] = {k: L.tcp_counters(ns)["RetransSegs"]
                          for k, ns in (("device", L.device_ns), ("cloud", L.cloud_ns))}
    finally:
        _stop(srv)
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
        ratio, wall_per_cpu = ratios[len(ratios) // 2], wpc[len(wpc) // 2]
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
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        for label, q, per in (("free", None, CFS_PERIOD_US), ("100ms", quota, 100000),
                              ("10ms", quota, 10000)):
            r = L.run_in("device", task, cpu_quota=q, cpu_period_us=per,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            ms = json.loads(r.communicate(timeout=60)[0])["ms"]
            lat[label] = {"wall_ms": med([w for w, c in ms]), "cpu_ms": med([c for w, c in ms]),
                          "slowdown": med([w / c for w, c in ms]),
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
                _stop(srv)
            results["grpc"] = g
            print("  grpc health check cloud<-device: %s (connect %.1f ms, rpc median "
                  "%.2f ms)" % (g["status"], g["connect_s"] * 1e3, g["rpc_median_ms"]))
        except (NetlabError, ImportError) as e:
            results["grpc"] = {"error": str(e)}
            print("  grpc check FAILED: %s" % e)
    results["seconds"] = time.monotonic() - t_start
    print("self-test done in %.1f s" % results["seconds"])
    return results


def _main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "_relay":
        return _relay_main(argv[2], int(argv[3]), int(argv[4]))
    if cmd == "_tp_server":
        return _tp_server(argv[2])
    if cmd == "_tp_client":
        return _tp_client(*argv[2:7])
    if cmd == "_spin":
        return _spin(argv[2])
    if cmd == "_task":
        return _task(*argv[2:5])
    signal.signal(signal.SIGTERM, _sigterm_exit)
    import argparse
    ap = argparse.ArgumentParser(description="network lab self-test")
    ap.add_argument("--quick", action="store_true", help="shorter transfers")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv[1:])
    res = selftest(quick=a.quick)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
