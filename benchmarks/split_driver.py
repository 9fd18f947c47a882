"""Device side of benchmarks/bench_split.py: time fixed cuts of split models against a server.

Runs as its own process, started by bench_split.py inside the lab's device namespace under
a CPU quota (a slow device). Not meant to be run by hand, but it can be:

    python benchmarks/split_driver.py SPEC.json > RESULT.json

SPEC (JSON): {"server": "HOST:PORT", "runs": 7, "warmup": 2, "gap_s": 0.02,
"timeout_s": 120, "input": "x.npy", "input_name": "image", "reference": "ref.npy",
"output_name": "probs", "anchors": ["device-only", "p000", "planner"], "prune_factor": 1.5,
"cuts": [{"name": "p000", "device": "p000/device.efl", "lower_bound_s": 0.17},
{"name": "device-only", "local": "model.efl"}, ...]}

Each cut is a device package with a FIXED cut (split with device_graph="cut", so the
runner has no re-planner; asserted) talking to the server, or "local": the unsplit model
run on the device alone (no cloud). All cuts share one gRPC client (one connection).

First 11 empty pings (the round trip of an RPC from this device: the floor of any split).
Then the anchors are warmed up (`warmup` runs each: connection, plan preparation, output
checked against the reference). A cut whose `lower_bound_s` (the caller's: RTT plus its
bytes' time on the shaped wire, physics rather than a model) exceeds `prune_factor` x
the anchors' best warm-up time cannot be the fastest cut: it is timed once, cold, at the
end ("pruned"; prune_factor 0 times every cut fully). The other cuts are warmed up, then
all fully timed cuts run `runs` times in round-robin (round r starts at cut r, so
host-load drift and ordering effects spread over all cuts), each run after `gap_s` of
idle time (a device answering separate requests; it also lets the CFS quota refill as it
would between requests). Prints one JSON object on stdout: {"cuts": {name: {"median_s",
"min_s", "max_s", "samples", "call_s", "server_s", "max_abs_diff", "calls", "pruned"}},
"ping_s": [...], ...}; progress goes to stderr.

`call_s` are the client's wall times of the Run call (upload + server + download +
RTT), `server_s` the server's compute time it reports: total - call is the device's own
compute, call - server is the network's share.
"""
import argparse
import json
import os
import sys
import time

import harness


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="SPEC is described in this script's docstring.")
    ap.add_argument("spec", help="the JSON spec of the cuts to time")
    with open(ap.parse_args(argv[1:]).spec) as f:
        spec = json.load(f)
    import numpy as np

    import edgeflow as ef
    from edgeflow.cloud import Client, SplitRunner

    x = np.load(spec["input"])
    ref = np.load(spec["reference"])
    in_name, out_name = spec.get("input_name", "image"), spec.get("output_name", "probs")
    runs, warmup, gap = int(spec.get("runs", 7)), int(spec.get("warmup", 2)), float(spec.get("gap_s", 0.02))
    timeout = float(spec.get("timeout_s", 120))
    tag = spec.get("tag", "")
    t_start = time.monotonic()
    client = None
    if any("device" in c for c in spec["cuts"]):
        client = Client(spec["server"], timeout=timeout)
        client.wait_ready(timeout=60)
    runners = {}
    for c in spec["cuts"]:
        if "device" in c:
            interp = harness.split_device(c["device"], client, timeout)
            runner = interp.get_signature_runner("infer")
            # A fixed cut: the package holds only its part, so nothing can re-plan or fall back.
            assert isinstance(runner, SplitRunner) and runner.replanner is None and runner._local is None, \
                f"{c['name']}: expected a fixed cut (device_graph='cut'), got an adaptive runner"
            runners[c["name"]] = (runner, interp)
        else:
            interp = ef.Interpreter(c["local"])
            runners[c["name"]] = (interp.get_signature_runner("infer"), interp)
    names = [c["name"] for c in spec["cuts"]]
    res = {n: {"samples": [], "warmup_s": [], "call_s": [], "server_s": [], "max_abs_diff": 0.0, "calls": 0,
               "pruned": False} for n in names}

    def once(name):
        runner, interp = runners[name]
        time.sleep(gap)
        t = time.perf_counter()
        out = runner(**{in_name: x})[out_name]
        dt = time.perf_counter() - t
        r = res[name]
        if isinstance(runner, SplitRunner):
            link = client.link
            r["call_s"].append(link.last_call_s)
            r["server_s"].append(link.last_compute_s)
        diff = float(np.abs(np.asarray(out, np.float64) - ref).max())
        r["max_abs_diff"] = max(r["max_abs_diff"], diff)
        return dt

    pings = []
    if client is not None:  # the floor of any split: an empty RPC's round trip from this device
        for _ in range(11):
            time.sleep(gap)
            pings.append(client.ping())

    def warm(group, what):
        for k, name in enumerate(group):
            for _ in range(warmup):
                res[name]["warmup_s"].append(once(name))
            if (k + 1) % 8 == 0 or k + 1 == len(group):
                print(f"  [{tag}] warmed up {k + 1}/{len(group)} {what} ({time.monotonic() - t_start:.0f} s)",
                      file=sys.stderr, flush=True)

    # Anchors first; a cut whose lower bound (RTT + its bytes' wire time: physics, not a
    # model) exceeds prune_factor x the best anchor's warm-up time cannot be the fastest:
    # it is timed once instead of `runs` times.
    anchors = [n for n in names if n in set(spec.get("anchors", []))]
    warm(anchors, "anchors")
    factor = float(spec.get("prune_factor", 0) or 0)
    best_anchor = min((res[n]["warmup_s"][-1] for n in anchors), default=None)
    bounds = {c["name"]: c.get("lower_bound_s", 0.0) for c in spec["cuts"]}
    pruned = [n for n in names if n not in anchors and factor > 0 and best_anchor is not None
              and bounds[n] > factor * best_anchor]
    full = [n for n in names if n not in pruned]
    if pruned:
        print(f"  [{tag}] {len(pruned)} cut(s) timed once: their lower bound exceeds {factor:g} x "
              f"{best_anchor * 1e3:.1f} ms (the best anchor)", file=sys.stderr, flush=True)
    warm([n for n in full if n not in anchors], "cuts")
    for name in names:  # warm-up calls are not timed
        res[name]["call_s"].clear()
        res[name]["server_s"].clear()
    for r in range(runs):
        order = full[r % len(full):] + full[:r % len(full)]
        for name in order:
            res[name]["samples"].append(once(name))
        print(f"  [{tag}] round {r + 1}/{runs} done ({time.monotonic() - t_start:.0f} s)",
              file=sys.stderr, flush=True)
    for k, name in enumerate(pruned):
        res[name]["samples"].append(once(name))
        res[name]["pruned"] = True
        if (k + 1) % 8 == 0 or k + 1 == len(pruned):
            print(f"  [{tag}] timed {k + 1}/{len(pruned)} bounded cuts once ({time.monotonic() - t_start:.0f} s)",
                  file=sys.stderr, flush=True)
    for name in names:
        r = res[name]
        r["median_s"], r["min_s"], r["max_s"] = harness.median(r["samples"]), min(r["samples"]), max(r["samples"])
        r["call_median_s"] = harness.median(r["call_s"])
        r["server_median_s"] = harness.median(r["server_s"])
        runner = runners[name][0]
        r["calls"] = runner.cloud.calls if isinstance(runner, SplitRunner) else 0
    if client is not None:
        client.close()
    json.dump({"cuts": res, "ping_s": pings, "ping_median_s": harness.median(pings), "best_anchor_s": best_anchor,
               "pid": os.getpid(), "seconds": time.monotonic() - t_start}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
