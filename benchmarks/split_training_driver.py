"""Device side of benchmarks/bench_split_training.py: time training steps of split-training
packages (and of the unsplit model trained locally) against a server.

Runs as its own process, started by bench_split_training.py inside the lab's device
namespace under a CPU quota (a slow device). It can be run by hand:

    python benchmarks/split_training_driver.py SPEC.json > RESULT.json

SPEC (JSON): {"server": "HOST:PORT", "batches": "batches.npz" (one array per input of the
`train` signature, batches stacked: image [B, 32, 1, 8, 8] and label [B, 32] for the
digits), "warmup": 3, "steps": 10, "timeout_s": 120, "iface": "efdev",
"cuts": [{"name": "cloud-p003", "device": "p003/device.efl"}, {"name": "device-only",
"local": "m.efl"}, ...]}

Every cut is one device (its own device id, its own step ids) training on the same batch
sequence; a "device" cut is a split-training package (edgeflow.splitter.training) whose
`train` signature talks to the server, a "local" cut the unsplit model's `train` run on
the device alone. All split cuts share one gRPC client (one connection). After `warmup`
untimed steps per cut, `steps` timed steps run round-robin over the split cuts (round r
starts at cut r), back to back; then each "local" cut runs `local_steps` (default 3 x
steps) timed steps back to back, as a training loop does (a CPU-bound loop under the
quota is throttled; interleaved with network waits it would not be), in blocks of
`block` (10) steps: its time per step is the median over blocks of a block's wall time
/ `block` (single steps under a CFS quota are bimodal: most run at full speed inside the
period's slice, a few wait out the period, so their median would hide the throttling), and
its CPU time per step (process time, all threads). The client's connection is closed
before the local loops, so that its gRPC threads do not spend the device's quota.

Per step it records: the wall time of the step; the Run calls' wall time and the server's
compute time in them (the rest of the step is the device's own compute); the tensor bytes
the client sent and received (edgeflow.cloud.client.LinkStats counters); and the bytes that
crossed the device's network interface each way (/proc/net/dev of the device namespace:
IP packets with their Ethernet, IP, TCP, TLS-less HTTP/2 and gRPC framing, acks included).
Prints one JSON object on stdout; progress goes to stderr.
"""
import argparse
import json
import os
import sys
import time

import harness


def iface_bytes(iface):
    """(rx bytes, tx bytes) of `iface` in this process's network namespace, or (0, 0)."""
    try:
        with open("/proc/self/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == iface:
                    v = rest.split()
                    return int(v[0]), int(v[8])
    except OSError:
        pass
    return 0, 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="SPEC is described in this script's docstring.")
    ap.add_argument("spec", help="the JSON spec of the cuts to time")
    with open(ap.parse_args(argv[1:]).spec) as f:
        spec = json.load(f)
    import numpy as np

    import edgeflow as ef
    from edgeflow.cloud import Client

    class TimedClient(Client):
        """A Client that adds up the wall time and server compute of its Run calls."""
        call_s = 0.0
        server_s = 0.0

        def run(self, *a, **k):
            t = time.perf_counter()
            try:
                return super().run(*a, **k)
            finally:
                self.call_s += time.perf_counter() - t
                self.server_s += self._link.last_compute_s or 0.0

    with np.load(spec["batches"]) as z:
        batches = {k: z[k] for k in z.files}
    nb = len(next(iter(batches.values())))
    warmup, steps = int(spec.get("warmup", 3)), int(spec.get("steps", 10))
    timeout = float(spec.get("timeout_s", 120))
    iface = spec.get("iface", "efdev")
    tag = spec.get("tag", "")
    t_start = time.monotonic()
    client = None
    if any("device" in c for c in spec["cuts"]):
        client = TimedClient(spec["server"], timeout=timeout)
        client.wait_ready(timeout=60)
    cuts = {}
    for c in spec["cuts"]:
        if "device" in c:
            interp = harness.split_device(c["device"], client, timeout, device_id=c["name"])
        else:
            interp = ef.Interpreter(c["local"])
        cuts[c["name"]] = {"runner": interp.get_signature_runner("train"), "interp": interp, "next": 0,
                           "time_s": [], "call_s": [], "server_s": [], "sent": [], "received": [],
                           "wire_up": [], "wire_down": [], "calls": [], "loss": []}
    names = [c["name"] for c in spec["cuts"]]

    def step(name, record):
        cut = cuts[name]
        k = cut["next"] % nb
        cut["next"] += 1
        link0 = client._link if client is not None else None
        before = (link0.bytes_sent, link0.bytes_received, link0.calls, client.call_s, client.server_s) \
            if client is not None else (0, 0, 0, 0.0, 0.0)
        rx0, tx0 = iface_bytes(iface)
        t = time.perf_counter()
        out = cut["runner"](**{name: v[k] for name, v in batches.items()})
        dt = time.perf_counter() - t
        rx1, tx1 = iface_bytes(iface)
        after = (link0.bytes_sent, link0.bytes_received, link0.calls, client.call_s, client.server_s) \
            if client is not None else before
        if record:
            cut["time_s"].append(dt)
            cut["sent"].append(after[0] - before[0])
            cut["received"].append(after[1] - before[1])
            cut["calls"].append(after[2] - before[2])
            cut["call_s"].append(after[3] - before[3])
            cut["server_s"].append(after[4] - before[4])
            cut["wire_up"].append(tx1 - tx0)
            cut["wire_down"].append(rx1 - rx0)
        cut["loss"].append(float(np.asarray(out["loss"]).mean()))

    pings = []
    if client is not None:  # an empty RPC's round trip from this device: the floor of a round
        for _ in range(11):
            pings.append(client.ping())
    split = [n for n in names if "device" in next(c for c in spec["cuts"] if c["name"] == n)]
    local = [n for n in names if n not in split]
    for name in split:
        for _ in range(warmup):
            step(name, False)
    print(f"  [{tag}] warmed up {len(split)} split cuts ({time.monotonic() - t_start:.0f} s)", file=sys.stderr,
          flush=True)
    for r in range(steps):
        order = split[r % len(split):] + split[:r % len(split)] if split else []
        for name in order:
            step(name, True)
        if (r + 1) % 5 == 0 or r + 1 == steps:
            print(f"  [{tag}] round {r + 1}/{steps} ({time.monotonic() - t_start:.0f} s)", file=sys.stderr,
                  flush=True)
    # Local training is CPU-bound back to back: timed as a block, so that the CPU quota
    # throttles it as it would a training loop (interleaved with the split cuts' network
    # waits, its quota would refill between steps and it would run at full speed).
    # Timed in blocks of `block` steps: a block's wall time / block is the time per step of
    # a throttled loop (single steps are bimodal under a CFS quota: most run at full speed
    # inside the period's slice, some wait out the rest of the period).
    # The split cuts' connection is closed first: its gRPC threads would otherwise spend the
    # device's quota while the local loop runs (measured: ~2x the time per step).
    local_steps, block = int(spec.get("local_steps", 3 * steps)), int(spec.get("block", 10))
    if client is not None:
        client.close()
        client = None
    blocks, block_cpu = {}, {}
    for name in local:
        for _ in range(warmup):
            step(name, False)
        blocks[name], block_cpu[name] = [], []
        for _ in range(max(1, local_steps // block)):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(block):
                step(name, True)
            blocks[name].append((time.perf_counter() - t) / block)
            block_cpu[name].append((time.process_time() - c) / block)
        print(f"  [{tag}] {name}: {local_steps} steps back to back ({time.monotonic() - t_start:.0f} s)",
              file=sys.stderr, flush=True)
    res = {}
    for name in names:
        c = cuts[name]
        res[name] = {k: c[k] for k in ("time_s", "call_s", "server_s", "sent", "received", "wire_up",
                                       "wire_down", "calls")}
        res[name].update({"median_s": harness.median(c["time_s"]), "min_s": min(c["time_s"]), "max_s": max(c["time_s"]),
                          "call_median_s": harness.median(c["call_s"]), "server_median_s": harness.median(c["server_s"]),
                          "device_median_s": harness.median([a - b for a, b in zip(c["time_s"], c["call_s"])]),
                          "first_loss": c["loss"][0], "last_loss": c["loss"][-1], "steps_run": c["next"]})
        if name in blocks:  # the loop's time per step: the median over blocks
            res[name].update({"step_median_s": res[name]["median_s"], "block_s": blocks[name],
                              "median_s": harness.median(blocks[name]), "min_s": min(blocks[name]),
                              "max_s": max(blocks[name]), "device_median_s": harness.median(blocks[name]),
                              "cpu_median_s": harness.median(block_cpu[name])})
    if client is not None:
        client.close()
    json.dump({"cuts": res, "ping_s": pings, "ping_median_s": harness.median(pings), "pid": os.getpid(),
               "seconds": time.monotonic() - t_start}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
