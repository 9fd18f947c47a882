"""The lab: two network namespaces ("device", "cloud") joined by a veth pair whose ends are
shaped with tc tbf (device egress = uplink, cloud egress = downlink), optionally through a
third "wan" namespace whose relay (netlab.relay) adds the round-trip delay, and cgroup-v1
CPU quotas for the processes started in them. Needs root, iproute2 and a cgroup-v1 `cpu`
hierarchy; everything it makes is removed on exit (context manager, atexit, SIGTERM), and
what a crashed run of this process's kind left (owner pid gone) by the next lab.

    with lab(up_mbps=5.85, down_mbps=18.88, rtt_ms=60) as L:
        server = L.run_in("cloud", [sys.executable, "server.py", L.cloud_ip])
        device = L.run_in("device", [sys.executable, "device.py", L.cloud_ip], cpu_quota=0.2)

Addresses (a private /30, only inside the lab's namespaces): device efdev 10.77.0.1,
cloud efcld 10.77.0.2; with a delay, device 10.77.0.1 <-> 10.77.0.2 [wan] 10.77.0.5 <->
10.77.0.6 cloud.
"""
import atexit
import contextlib
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time

from . import relay

PREFIX = "efl"                    # namespaces efl-<pid>-<n>-dev, cgroups efl-<pid>-<n>
MTU = 1500
FRAME = MTU + 14                  # what tbf counts for a full packet on a veth
CFS_PERIOD_US = 100000
_SUBNET = "10.77.0"


class NetlabError(RuntimeError):
    """A lab could not be built, used or removed."""




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
    """tbf settings for `rate_mbps` (Mbit/s, 1e6 bit): dict(rate_bit, burst, limit, queue_ms).

    tbf counts the Ethernet frame (IP packet + 14 B), so TCP goodput at MTU 1500 is at most
    1448/1514 = 95.6% of the rate. The bucket holds one full frame (less and tbf drops full
    packets) plus max(512 B, 1 ms at the rate), which absorbs hrtimer lateness (one frame
    alone reaches only 91% of 18.88 Mbit/s): kept small because after idle the first
    `burst` bytes of a message pass at once. The queue holds `queue_ms` at the rate, at
    least 16 frames."""
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
    """A fresh cgroup-v1 cpu group with a CFS quota of `quota` cores (0.2 = 20% of one).

    The quota is granted per period, so a process idle between requests runs the first
    quota's worth of each at full speed: at the 100 ms default a ~30 ms request is slowed
    only ~1.5x, not 5x; at a 10 ms period ~4.6x (self-test figures). Long CPU-bound runs
    are slowed 5x with either: use a short period to emulate a slow device's latency."""
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


# --------------------------------------------------------------------------- processes

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



def stop(p, grace=2.0):
    """Terminate `p` (a Popen), and kill it if it outlives `grace` seconds."""
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
        self._relay = _popen_in(wan, [sys.executable, relay.__file__, "efdly", str(one_way_us),
                                      str(os.getpid())],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = read_line(self._relay.stdout, 10.0)
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
        """Start `argv` in `namespace` ("device", "cloud" or a namespace name of this lab);
        with `cpu_quota` (a fraction of one core) in a fresh cgroup with that CFS quota per
        `cpu_period_us`, inherited by its children. Extra keywords go to subprocess.Popen.
        The process and its cgroup go when the lab closes."""
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
            stop(p)
        if self._relay is not None:
            stop(self._relay, grace=1.0)
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


def read_line(stream, timeout):
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
