"""A network lab for the split benchmarks: a real narrow link and a real slow device on one
Linux host (root, iproute2, tc tbf, a cgroup-v1 `cpu` hierarchy; standard library only).

    from netlab import lab
    with lab(up_mbps=5.85, down_mbps=18.88, rtt_ms=60) as L:
        L.run_in("device", argv, cpu_quota=0.2, cpu_period_us=10000)

Modules: `lab` (namespaces, veths, tbf shaping, cgroup CPU quotas), `relay` (the
user-space packet delay that makes the RTT), `selftest` (measures a lab on this machine:
`sudo .venv/bin/python benchmarks/netlab --quick`).
"""
from .lab import CgroupCPU, Lab, NetlabError, cleanup_stale, lab, stop, tbf_params, wire_seconds

__all__ = ["CgroupCPU", "Lab", "NetlabError", "cleanup_stale", "lab", "stop", "tbf_params", "wire_seconds"]
