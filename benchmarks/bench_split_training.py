"""Split training (split learning): time and bytes per training step on a real slow device
and a real narrow link, and bytes per epoch against FedAvg.

    sudo .venv/bin/python benchmarks/bench_split_training.py [--model digits|resnet18]
        [--bench timing,bytes] [--links 4g,wifi] [--steps 20] [--warmup 3] [--devices 1,8,32]
        [--json OUT.json]
    .venv/bin/python benchmarks/bench_split_training.py --bench bytes     # no root needed
    .venv/bin/python benchmarks/bench_split_training.py --report OUT.json # re-print

Models (`--model`):
- digits (default): the digits CNN of tests/cloud/test_split_training.py (harness.digits_cnn
  with channels 8, 16), trained on the first 1257 samples of sklearn's digits, batch 32.
  Every prefix k = 0..8 of its 8 forward ops (in `infer` order) is a cut, written with
  edgeflow.splitter.training.write_pair in two label modes: "cloud pK" (the device sends
  the cut tensor and the labels: one round trip; p0 is raw data) and "U pK" (U-shaped, the
  labels stay on the device: two round trips).
- resnet18: torchvision's ResNet-18 at 224x224 as benchmarks/bench_models.py exports it
  (cached, `--cache`; no torch needed once cached), converted with `convert --trainable
  --optimizer sgd:0.01` (softmax cross-entropy on its logits), batch 8 of random images
  and labels; the cuts are the layer boundaries (the prefixes after which one tensor
  crosses, as Neurosurgeon and DADS search), labels in the cloud. A step on the device
  under the quota takes seconds: use e.g. `--steps 3 --warmup 1 --local-steps 3 --block 3`.
"device-only" is the unsplit `train` run on the device alone.

Benchmark 1, timing (root: benchmarks/netlab). Per link of edgeflow.splitter.LINKS (4g,
wifi) a lab with a tbf-shaped link and real RTT; the device is a process under a CPU
quota of 20% of one core (10 ms CFS period), one BLAS thread; the cloud `edgeflow serve
--state-dir` hosting every cut. benchmarks/split_training_driver.py trains every cut as
its own device on the same batches, round-robin, and records per step the wall time, the
Run calls' time and the server's compute, the tensor bytes and the bytes on the device's
interface; device-only runs back to back (median over blocks of `--block` steps). The
planner's cut (split_file(train=True) from `edgeflow profile -s train` profiles taken in
the lab, per-op medians scaled to whole runs) is measured beside them and its cost
model's prediction printed for every prefix.

Benchmark 2, bytes per epoch: one epoch split evenly among N = 1, 8, 32 devices, split
learning (every cut) against FedAvg (one round per epoch, edgeflow.cloud.ps.ParameterService);
tensor payload bytes both ways, summed over the devices. digits (no root; an in-process
server on 127.0.0.1): measured and checked against the analytic figure of each. resnet18:
an epoch of `--epoch-samples` (10,000) images, analytic from each cut's step tensors (the
timing benchmark checks them against the bytes its steps measure; the digits run checks
FedAvg's analytic bytes against its measured ones).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import harness
from harness import edgeflow_cmd, log, median, ms, blas_env

HERE = pathlib.Path(__file__).resolve().parent

BATCH = 32
TRAIN_SAMPLES = 1257
SHAPE = (BATCH, 1, 8, 8)
QUOTA = 0.2
PORT = 50061
LINK_NAMES = ("4g", "wifi")
MODES = ("cloud", "device")
MODE_TAG = {"cloud": "cloud", "device": "U"}
MODELS = ("digits", "resnet18")


# -- the model and the data --------------------------------------------------------------
class Workload:
    """What is trained: the model file, its train feeds and the batches it trains on.

    digits: the digits CNN of tests/cloud/test_split_training.py on the first 1257 samples
    of sklearn's digits, batch 32, every prefix a cut. resnet18: torchvision's ResNet-18
    as bench_models.py exports it (cached ONNX), converted with `--trainable --optimizer
    sgd:0.01` (softmax cross-entropy over its 1000 logits), at 224x224 and batch 8 on
    random images and labels, the narrow prefixes (layer boundaries) as cuts."""

    def __init__(self, name, batch=None, cache=None, epoch_samples=None):
        self.name = name
        self.real = name != "digits"
        self.batch = batch or (8 if self.real else BATCH)
        self.label = "labels" if self.real else "label"
        self.image_shape = (3, 224, 224) if self.real else (1, 8, 8)
        self.classes = 1000 if self.real else 10
        self.cache = cache
        # bytes per epoch: the digits' whole training set; for a real model an epoch of
        # `epoch_samples` images (analytic from the measured per-step bytes)
        self.epoch_samples = epoch_samples or (10_000 if self.real else TRAIN_SAMPLES)

    @property
    def shape(self):
        return (self.batch, *self.image_shape)

    def build(self, path):
        if not self.real:
            harness.digits_cnn(path, channels=(8, 16), second_pool=False, learning_rate=0.01)
            return
        import bench_models
        from edgeflow.converters import onnx as onnx_converter
        onnx_path, _ = bench_models.real_model(self.name, self.cache or bench_models.default_cache())
        onnx_converter.convert(onnx_path, path, trainable=True, optimizer="sgd:0.01")

    def data(self, n=None):
        """{image, label name: arrays}: sklearn's digits, or `n` random images (4 batches)."""
        if not self.real:
            from sklearn import datasets
            d = datasets.load_digits()
            n = n or TRAIN_SAMPLES
            x, y = (d.images / 16).astype(np.float32)[:, None], d.target.astype(np.int64)
            return {"image": x[:n], self.label: y[:n]}
        rng = np.random.default_rng(0)
        n = n or 4 * self.batch
        return {"image": rng.standard_normal((n, *self.image_shape)).astype(np.float32),
                self.label: rng.integers(0, self.classes, n).astype(np.int64)}

    def describe(self, n_ops, params):
        if not self.real:
            return f"digits CNN ({n_ops} forward ops, {params:,} B of trainable variables), batch {self.batch}"
        return (f"{self.name} at {'x'.join(map(str, self.image_shape[1:]))} ({n_ops} forward ops, {params:,} B of "
                f"trainable variables; convert --trainable --optimizer sgd:0.01), batch {self.batch}, random data")


class Prepared:
    """The model, its forward order, every prefix cut's package pair in both label modes,
    and the analytic bytes of each cut's rounds."""

    def __init__(self, work, wl, modes=MODES, cuts="all"):
        from edgeflow.format import reader
        from edgeflow.splitter import CostGraph, partition, training
        self.wl = wl
        self.modes = modes
        self.dir = work
        self.path = work / "m.efl"
        wl.build(self.path)
        self.model = reader.load(str(self.path))
        sub = self.model.subgraphs[0]
        self.order = partition.Cut(self.model, set(), "infer").ops
        self.n = len(self.order)
        names = {op.operator: op.name for op in CostGraph.from_model(str(self.path), "infer").ops}
        self.labels_of = ["(input)"] + [names[i] for i in self.order]
        self.data = wl.data()
        slots = ("/Adam/", "/Momentum/")
        self.params = sum(int(np.prod(t.shape)) * 4 for t in sub.tensors
                          if t.is_variable and not any(m in t.name for m in slots))
        if cuts == "narrow":  # the layer boundaries: one tensor crosses (bench_split.narrow_prefixes)
            self.prefixes = [0] + [k for k in range(1, self.n)
                                   if len(partition.Cut(self.model, set(self.order[:k])).uploads) == 1]
        else:
            self.prefixes = list(range(self.n + 1))
        self.cuts = {}  # (mode, k) -> {"name", "dir", "device", "cloud", "model_id", "rounds"}
        for mode in modes:
            for k in self.prefixes:
                name = f"{MODE_TAG[mode]}-p{k}"
                d = work / "cuts" / name
                d.mkdir(parents=True, exist_ok=True)
                # U-shaped: the label inputs are guessed (the train inputs `infer` does not take)
                cut = training.write_pair(self.model, set(self.order[:k]), str(d), model_id=f"{wl.name}-{name}",
                                          labels=mode)
                if mode == "device":
                    named = training.TrainingCut(self.model, set(self.order[:k]), labels=mode,
                                                 label_inputs=[wl.label]).plan_json()
                    if named != cut.plan_json():
                        raise RuntimeError(f"{name}: the guessed label inputs give other rounds than "
                                           f"label_inputs=['label']: {cut.plan_json()} vs {named}")
                self.cuts[(mode, k)] = {"name": name, "dir": d, "device": str(d / "device.efl"),
                                        "cloud": str(d / "cloud.efl"), "model_id": f"{wl.name}-{name}",
                                        "rounds": cut.plan_json()}
        self._bytes_cache = {}

    def round_bytes(self, mode, k, b, rounds=None):
        """(bytes up, bytes down, round trips) of one step of cut (mode, k) (or of `rounds`,
        a plan.json's, keyed by `mode`, `k`) on a batch of b samples: the tensors its rounds
        carry, at their shapes for that batch."""
        key = (mode, k, b)
        if key not in self._bytes_cache:
            import edgeflow as ef
            rounds = self.cuts[(mode, k)]["rounds"] if rounds is None else rounds
            feeds = {k: v[:b] for k, v in self.data.items()}
            names = [t for r in rounds for t in r["uploads"] + r["downloads"] if t not in feeds]
            interp = ef.Interpreter(str(self.path))
            got = interp.run(list(dict.fromkeys(names)), feeds) if names else {}
            size = {**{n: v.nbytes for n, v in feeds.items()}, **{n: np.asarray(v).nbytes for n, v in got.items()}}
            up = sum(size[t] for r in rounds for t in r["uploads"])
            down = sum(size[t] for r in rounds for t in r["downloads"])
            self._bytes_cache[key] = (up, down, len(rounds))
        return self._bytes_cache[key]

    def full_batches(self):
        """{input: [batches, batch, ...]}: the data's full batches in a fixed shuffled order."""
        from edgeflow import training_loop
        b = self.wl.batch
        out = [x for _, x in training_loop.batches(self.data, b, 0, 0) if len(x[self.wl.label]) == b]
        return {k: np.stack([x[k] for x in out]) for k in self.data}


# -- benchmark 1: time per training step in the lab --------------------------------------
def profile(L, prep, args):
    dev_p, srv_p = prep.dir / "device_profile.json", prep.dir / "server_profile.json"
    wl = prep.wl
    base = edgeflow_cmd() + ["profile", str(prep.path), "-s", "train", "--input-shape",
                             "image=" + ",".join(map(str, wl.shape)), "--input-shape", f"{wl.label}={wl.batch}",
                             "--runs", str(args.profile_runs)]
    out = L.run_checked("device", base + ["-o", str(dev_p), "--name", "device (20% of a core)"], 1800,
                      "device profile", cpu_quota=QUOTA, cpu_period_us=args.cpu_period_us, env=blas_env())
    log("  " + out.strip())
    out = L.run_checked("cloud", base + ["-o", str(srv_p), "--name", "server (1 core)"], 900, "server profile",
                      env=blas_env())
    log("  " + out.strip())
    return str(dev_p), str(srv_p)


class captured_warnings:
    """Collects what the edgeflow loggers warn about inside the block (still logged)."""

    def __enter__(self):
        import logging
        self.messages = []
        outer = self

        class H(logging.Handler):
            def emit(self, record):
                outer.messages.append(record.getMessage())
        self.handler = H(logging.WARNING)
        logging.getLogger("edgeflow").addHandler(self.handler)
        return self.messages

    def __exit__(self, *exc):
        import logging
        logging.getLogger("edgeflow").removeHandler(self.handler)
        return False


def training_link(link, mode):
    """The link split_file(train=True) plans on (edgeflow.splitter.package.split_file): a
    cut tensor pays its upload and its gradient's download (up and down in series), and
    U-shaped steps take two round trips."""
    from edgeflow.splitter import Link
    trips = 2 if mode == "device" else 1
    return Link(1 / (1 / link.up_bps + 1 / link.down_bps), link.down_bps, link.rtt_s * trips,
                f"{link.name} (a training step)", link.overhead_s * trips)


def plan_cuts(prep, link_name, profiles):
    """{mode: {"k", "prefix", "device_only", "rounds", "device", "cloud", "model_id",
    "predicted": {k: s}, "device_only_s", ...}}: what split_file(train=True) plans at the
    batch and the package pair it writes, and the cost model's prediction for every prefix
    on its training link. k: the forward ops it puts on the device; prefix: whether they
    are the first k of the op order (a cut measured beside it)."""
    from edgeflow.splitter import Link, cost
    from edgeflow.splitter.package import split_file
    link = Link.parse(link_name)
    out = {}
    wl = prep.wl
    for mode in prep.modes:
        tag = MODE_TAG[mode]
        model_id = f"planned-{link_name}-{tag}"
        with captured_warnings() as warned:
            r = split_file(str(prep.path), str(prep.dir / model_id), link=link_name, train=True, labels=mode,
                           input_shapes={"image": wl.shape, wl.label: (wl.batch,)}, device_profile=profiles[0],
                           server_profile=profiles[1], model_id=model_id)
        plan_link = training_link(link, mode)
        got = (r.link.up_bps, r.link.down_bps, r.link.rtt_s)
        if any(abs(x - y) > 1e-9 * max(abs(y), 1) for x, y in zip(got, (plan_link.up_bps, plan_link.down_bps,
                                                                           plan_link.rtt_s))):
            raise RuntimeError(f"split_file planned on {r.link}, the script's copy of its link is {plan_link}")
        dev = set(r.placement.device_operators(r.cost_graph))
        k = next((k for k in range(prep.n + 1) if set(prep.order[:k]) == dev), None)
        prefix = k is not None
        if not prefix:  # e.g. a cut inside a residual block: measured as its own package only
            k = len(dev & set(prep.order))
        with open(r.paths["plan"]) as f:
            rounds = json.load(f)["rounds"]
        problem = None
        if k == prep.n and rounds:
            problem = f"all {prep.n} forward ops on the device but plan.json has {len(rounds)} round(s)"
        elif k < prep.n and not rounds:
            problem = f"{k} of {prep.n} forward ops on the device but plan.json has no rounds"
        pred = {}
        for j in range(prep.n + 1):
            ops_j = set(prep.order[:j])
            sides = {op.name: "device" if op.operator in ops_j else "cloud" for op in r.cost_graph.ops}
            pred[j] = cost(r.cost_graph, plan_link, sides)
        prefix_rounds = prep.cuts[(mode, k)]["rounds"] if prefix and (mode, k) in prep.cuts else None
        out[mode] = {"k": k, "prefix": prefix and (mode, k) in prep.cuts, "device_only": not rounds,
                     "rounds": rounds, "problem": problem,
                     "same_rounds_as_prefix": rounds == prefix_rounds, "device": r.paths["device"],
                     "cloud": r.paths["cloud"], "model_id": r.model_id, "predicted": pred,
                     "predicted_split_s": r.placement.predicted["split"],
                     "device_only_s": r.placement.predicted["device_only"],
                     "cloud_only_s": r.placement.predicted["cloud_only"],
                     "warnings": list(dict.fromkeys(warned))}
    return out


def run_link(link_name, prep, args, work, state):
    import netlab
    from edgeflow.splitter import Link
    link = Link.parse(link_name)
    with netlab.lab(link.up_bps / 1e6, link.down_bps / 1e6, rtt_ms=link.rtt_s * 1e3) as L:
        log(f"[{link_name}] lab: {L.describe()}")
        if state.get("profiles") is None:
            log(f"[{link_name}] profiling the train signature at image={prep.wl.shape}, "
                f"{prep.wl.label}=({prep.wl.batch},) (device: "
                f"{QUOTA:.0%} quota, "
                f"period {args.cpu_period_us} us; server: cloud namespace)")
            state["profiles"] = profile(L, prep, args)
        plans = plan_cuts(prep, link_name, state["profiles"])
        for mode in prep.modes:
            p = plans[mode]
            log(f"[{link_name}] planner ({mode} labels): prefix {p['k']}, predicted "
                f"{p['predicted_split_s'] * 1e3:.2f} ms, {len(p['rounds'])} round(s) in plan.json"
                + (f"; PROBLEM: {p['problem']}" if p["problem"] else ""))
        serve_dir, state_dir = work / f"serve-{link_name}", work / f"state-{link_name}"
        for d in (serve_dir, state_dir):
            shutil.rmtree(d, ignore_errors=True)
        serve_dir.mkdir()
        batches = work / "batches.npz"
        if not batches.exists():
            np.savez(batches, **prep.full_batches())
        cuts = [{"name": "device-only", "local": str(prep.path)}]
        # A cut whose tensors alone take longer on this link than --prune-factor x the
        # predicted device-only step cannot win: listed with that bound, not timed (raw
        # data, p0, is always timed).
        pruned = []
        bound_s = args.prune_factor * plans[prep.modes[0]]["device_only_s"] if args.prune_factor else None
        for (mode, k), c in prep.cuts.items():
            up, down, trips = prep.round_bytes(mode, k, prep.wl.batch)
            lower = trips * link.rtt_s + up * 8 / link.up_bps + down * 8 / link.down_bps
            if bound_s is not None and k > 0 and lower > bound_s:
                pruned.append({"name": c["name"], "k": k, "mode": mode, "lower_bound_s": lower,
                               "up": up, "down": down})
            else:
                cuts.append({"name": c["name"], "device": c["device"]})
                os.symlink(c["cloud"], serve_dir / f"{c['model_id']}.efl")  # the server hosts timed cuts only
        if pruned:
            log(f"[{link_name}] not timed (their tensors alone take over {args.prune_factor:g} x the predicted "
                f"device-only step, {bound_s:.1f} s): {', '.join(p_['name'] for p_ in pruned)}")
        for mode in prep.modes:  # the planner's own packages: device-only ones run as local loops
            p = plans[mode]
            name = f"plan-{MODE_TAG[mode]}"
            if p["device_only"]:
                cuts.append({"name": name, "local": p["device"]})
            else:
                os.symlink(p["cloud"], serve_dir / f"{p['model_id']}.efl")
                cuts.append({"name": name, "device": p["device"]})
        spec = {"server": f"{L.cloud_ip}:{PORT}", "batches": str(batches), "warmup": args.warmup,
                "steps": args.steps, "timeout_s": 600 if prep.wl.real else 120,
                "local_steps": args.local_steps or 3 * args.steps, "block": args.block, "iface": L.device_if, "cuts": cuts, "tag": link_name}
        spec_path = work / f"spec-{link_name}.json"
        spec_path.write_text(json.dumps(spec))
        server_log = open(work / f"server-{link_name}.log", "wb")
        server = L.run_in("cloud", edgeflow_cmd() + ["serve", "--model-dir", str(serve_dir), "--state-dir",
                                                      str(state_dir), "--checkpoint-every", "10", "--host",
                                                      L.cloud_ip, "--port", str(PORT)],
                          stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=blas_env())
        t = time.monotonic()
        try:
            log(f"[{link_name}] {len(cuts)} cuts x ({args.warmup} warm-up + {args.steps} timed steps)")
            p = L.run_in("device", [sys.executable, str(HERE / "split_training_driver.py"), str(spec_path)],
                         cpu_quota=QUOTA, cpu_period_us=args.cpu_period_us, env=blas_env(),
                         stdout=subprocess.PIPE, stderr=None, stdin=subprocess.DEVNULL)
            try:
                out, _ = p.communicate(timeout=args.driver_timeout)
            except subprocess.TimeoutExpired:
                netlab.stop(p)
                raise RuntimeError(f"the device driver on {link_name} timed out")
            if p.returncode != 0:
                raise RuntimeError(f"the device driver on {link_name} failed (rc {p.returncode}); server log: "
                                   f"{(work / f'server-{link_name}.log').read_text()[-2000:]}")
            throttled = p.cgroup.stat() if p.cgroup is not None else {}
        finally:
            netlab.stop(server)
            server_log.close()
        doc = json.loads(out.decode().strip().splitlines()[-1])
        qd = L.qdisc_stats()
        log(f"[{link_name}] measured in {time.monotonic() - t:.0f} s; device cgroup throttled "
            f"{throttled.get('nr_throttled', '?')} of {throttled.get('nr_periods', '?')} periods; tbf drops "
            f"up/down {qd['up'].get('dropped', '?')}/{qd['down'].get('dropped', '?')}")
    rows = []
    for name, m in doc["cuts"].items():
        plan_of = None
        if name == "device-only":
            mode, k = "local", prep.n
        elif name.startswith("plan-"):
            plan_of = next(md for md in prep.modes if name == f"plan-{MODE_TAG[md]}")
            mode, k = "plan", plans[plan_of]["k"]
        else:
            tag, _, kk = name.partition("-p")
            mode, k = ("cloud" if tag == "cloud" else "device"), int(kk)
        if mode in MODES:
            up, down, trips = prep.round_bytes(mode, k, prep.wl.batch)
            # k = n: the cost model's all-on-device is device-only, not this package (loss in the cloud)
            predicted = plans[mode]["predicted"][k] if k < prep.n else None
        elif mode == "plan":
            p = plans[plan_of]
            up, down, trips = prep.round_bytes(f"plan-{link_name}-{plan_of}", k, prep.wl.batch, p["rounds"])
            predicted = p["predicted"][k]
        else:
            up, down, trips = 0, 0, 0
            predicted = plans["cloud"]["device_only_s"]
        rows.append({"name": name, "mode": mode, "plan_of": plan_of, "k": k,
                     "label": prep.labels_of[k] if mode != "local" else "",
                     "median_s": m["median_s"], "min_s": m["min_s"], "max_s": m["max_s"],
                     "device_s": m["device_median_s"], "call_s": m["call_median_s"],
                     "server_s": m["server_median_s"], "sent": median(m["sent"]), "received": median(m["received"]),
                     "wire_up": median(m["wire_up"]), "wire_down": median(m["wire_down"]),
                     "calls": median(m["calls"]), "analytic_up": up, "analytic_down": down, "round_trips": trips,
                     "predicted_s": predicted,
                     "loss": (m["first_loss"], m["last_loss"]), "steps": len(m["time_s"]),
                     "step_median_s": m.get("step_median_s"), "cpu_s": m.get("cpu_median_s")})
    sums = [sum(json.load(open(f))["seconds"].values()) for f in state["profiles"]]
    return {"link": link_name, "rtt_s": link.rtt_s, "profile_sums_s": sums, "up_mbps": link.up_bps / 1e6,
            "pruned": pruned, "prune_factor": args.prune_factor,
            "batch": prep.wl.batch, "modes": list(prep.modes), "quota": QUOTA,
            "cpu_period_us": args.cpu_period_us,
            "down_mbps": link.down_bps / 1e6,
            "rows": rows, "plans": plans, "ping_s": doc["ping_median_s"], "throttled": throttled,
            "tbf_dropped": (qd["up"].get("dropped"), qd["down"].get("dropped"))}


def free_step(prep, steps=60, warmup=5):
    """Median seconds of a local training step in this process: no quota, no network."""
    import edgeflow as ef
    b = prep.full_batches()
    runner = ef.Interpreter(str(prep.path)).get_signature_runner("train")
    nb = len(b["image"])
    ts = []
    for i in range(steps + warmup):
        t = time.perf_counter()
        runner(**{k: v[i % nb] for k, v in b.items()})
        if i >= warmup:
            ts.append(time.perf_counter() - t)
    return median(ts)


# -- benchmark 2: bytes per epoch ----------------------------------------------------------
def shares(data, n):
    idx = np.array_split(np.arange(len(data["image"])), n)
    return [{k: v[i] for k, v in data.items()} for i in idx]


def split_epoch_analytic(prep, mode, k, n_devices):
    """(up, down, calls) of an epoch of `epoch_samples` split evenly among n devices, from
    the tensors each step's rounds carry at that step's batch (cached per batch size)."""
    up = down = calls = 0
    b = prep.wl.batch
    for share in np.array_split(np.arange(prep.wl.epoch_samples), n_devices):
        m = len(share)
        for start in range(0, m, b):
            u, d, trips = prep.round_bytes(mode, k, min(b, m - start))
            up, down, calls = up + u, down + d, calls + trips
    return up, down, calls


def split_epoch_measured(prep, server, mode, k, n_devices):
    from edgeflow import training_loop
    from edgeflow.cloud import Client
    c = prep.cuts[(mode, k)]
    up = down = calls = 0
    with Client(server.address, timeout=60) as client:
        for i, share in enumerate(shares(prep.data, n_devices)):
            runner = harness.split_device(c["device"], client, device_id=f"n{n_devices}-d{i}").get_signature_runner(
                "train")
            for _, b in training_loop.batches(share, prep.wl.batch, 0, 0):
                runner(**b)
        link = client.link
        up, down, calls = link.bytes_sent, link.bytes_received, link.calls
    return up, down, calls


def fedavg_measured(prep, n_devices, rounds=2):
    """Run FedAvg for `rounds` rounds with n devices (threads, one ParameterClient each);
    (bytes of the last round, bytes of the initial pull, total), summed over devices."""
    from edgeflow.cloud import Server
    from edgeflow.cloud.ps import ParameterClient, ParameterService, train_fedavg
    svc = ParameterService({"cnn": str(prep.path)}, mode="fedavg", replicas=n_devices, variables="all")
    per_round = [[0, 0] for _ in range(rounds)]
    first_pull = [0]
    total = [0, 0]
    errors = []
    lock = threading.Lock()
    with Server(parameter_server=svc) as server:
        def device(i, share):
            try:
                with ParameterClient(server.address, timeout=120) as client:
                    marks = []

                    def on_step(rec):
                        marks.append((client.bytes_pushed, client.bytes_pulled))
                    # the first pull happens inside train_fedavg before any push: measured as what was
                    # pulled before the first push minus nothing pushed
                    train_fedavg(str(prep.path), share, client, "cnn", f"fed-{n_devices}-{i}", rounds=rounds,
                                 local_epochs=1, batch_size=prep.wl.batch, seed=0, on_step=on_step)
                    with lock:
                        # marks[r] = counters right after round r's push: pulls so far = r + 1
                        first_pull[0] += marks[0][1]
                        for r in range(rounds):
                            prev = marks[r - 1] if r else (0, 0)
                            per_round[r][0] += marks[r][0] - prev[0]
                            per_round[r][1] += marks[r][1] - prev[1]
                        total[0] += client.bytes_pushed
                        total[1] += client.bytes_pulled
            except Exception as e:  # noqa: BLE001
                errors.append(f"device {i}: {type(e).__name__}: {e}")
        threads = [threading.Thread(target=device, args=(i, s)) for i, s in enumerate(shares(prep.data, n_devices))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        server_updates = str(svc.stats("cnn"))[:300]
    if errors:
        raise RuntimeError("FedAvg: " + "; ".join(errors[:3]))
    return {"round_push": per_round[-1][0], "round_pull": per_round[-1][1], "first_pull": first_pull[0],
            "total_push": total[0], "total_pull": total[1], "rounds": rounds, "stats": server_updates}


def bytes_bench(prep, args):
    """Bytes per epoch, split learning (every cut) against FedAvg: analytic for every N,
    measured for `--measure-devices` (the digits only: a real model's epoch is analytic,
    from the per-step bytes its timing run measures)."""
    import contextlib
    from edgeflow.cloud import Server
    devices = [int(x) for x in args.devices.split(",")]
    measure_n = {int(x) for x in args.measure_devices.split(",") if x} if not prep.wl.real else set()
    results = {"devices": devices, "params_bytes": prep.params, "split": {}, "fedavg": {},
               "epoch_samples": prep.wl.epoch_samples, "batch": prep.wl.batch, "model": prep.wl.name}
    t0 = time.monotonic()
    models = {c["model_id"]: c["cloud"] for c in prep.cuts.values()}
    with (Server(models=models) if measure_n else contextlib.nullcontext()) as server:
        for (mode, k), c in prep.cuts.items():
            for n in devices:
                up, down, calls = split_epoch_analytic(prep, mode, k, n)
                row = {"up": up, "down": down, "calls": calls, "measured": None}
                if n in measure_n:
                    row["measured"] = split_epoch_measured(prep, server, mode, k, n)
                results["split"][f"{c['name']}/{n}"] = row
            log(f"  bytes: {c['name']} done ({time.monotonic() - t0:.0f} s)")
    for n in devices:
        analytic = {"round_push": n * prep.params, "round_pull": n * prep.params, "first_pull": n * prep.params}
        row = {"analytic": analytic, "measured": None}
        if n in measure_n:
            row["measured"] = fedavg_measured(prep, n)
        results["fedavg"][str(n)] = row
        log(f"  bytes: FedAvg with {n} devices done ({time.monotonic() - t0:.0f} s)")
    results["seconds"] = time.monotonic() - t0
    return results


# -- printing -------------------------------------------------------------------------------
def kb(b):
    return "-" if b is None else f"{b / 1024:.1f}"


def print_timing(t, n_ops=8, free_step_s=None):
    rows = {r["name"]: r for r in t["rows"]}
    batch, modes = t.get("batch", BATCH), tuple(t.get("modes", MODES))
    dev, raw = rows["device-only"], rows["cloud-p0"]
    print()
    print(f"Link {t['link']}: {t['up_mbps']:g}/{t['down_mbps']:g} Mbit/s up/down (tc tbf), RTT "
          f"{t['rtt_s'] * 1e3:.0f} ms (relay); empty RPC from the device {ms(t['ping_s'])} ms. Per training step "
          f"(batch {batch}), medians of {raw['steps']} steps (device-only and plan rows of device-only packages: "
          f"{dev['steps']} steps back to back after the split cuts' connection is closed, median over blocks of 10 of "
          f"the block's time per step; device-only's median single step was {ms(dev.get('step_median_s'))} ms, its "
          f"CPU time per step {ms(dev.get('cpu_s'))} ms); bytes: tensor payload (client counters) and "
          f"on the wire (device interface, both ways, all framing and acks).")
    head = (f"  {'cut':<11} {'last device op':<16} {'trips':>5} {'tensor up':>9} {'down':>7} {'wire up':>8} "
            f"{'down':>7}  {'pred ms':>7} {'meas ms':>7} {'min':>6} {'max':>6}  {'dev ms':>6} {'rpc ms':>6} "
            f"{'srv ms':>6}  {'/dev-only':>9} {'/raw':>6}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    order = ["device-only"] + [r["name"] for r in t["rows"] if r["mode"] == "cloud"] + \
        [r["name"] for r in t["rows"] if r["mode"] == "device"] + [r["name"] for r in t["rows"] if r["mode"] == "plan"]
    plans = t["plans"]
    best = {}
    for m in modes:
        cands = [rows["device-only"]] + [r for r in t["rows"] if r["mode"] == m]
        best[m] = min(cands, key=lambda r: r["median_s"])
    for name in order:
        r = rows[name]
        label = "(none)" if r["mode"] == "local" else r["label"]
        if name == "cloud-p0":
            label = "(raw data)"
        if r["mode"] == "plan" and plans[r["plan_of"]]["device_only"]:
            label = "(device-only)"
        mark = ""
        if (r["mode"] == "local" and any(plans[m]["device_only"] for m in modes)) or \
                (r["mode"] in modes and not plans[r["mode"]]["device_only"] and r["k"] == plans[r["mode"]]["k"]):
            mark += " P"
        if any(best[m]["name"] == name for m in modes):
            mark += " *"
        print(f"  {name:<11} {label[-16:]:<16} {r['round_trips']:>5} {kb(r['sent']):>9} {kb(r['received']):>7} "
              f"{kb(r['wire_up']):>8} {kb(r['wire_down']):>7}  {ms(r['predicted_s']):>7} {ms(r['median_s']):>7} "
              f"{ms(r['min_s']):>6} {ms(r['max_s']):>6}  {ms(r['device_s']):>6} {ms(r['call_s']):>6} "
              f"{ms(r['server_s']):>6}  {r['median_s'] / dev['median_s']:>9.2f} {r['median_s'] / raw['median_s']:>6.2f}"
              f"{mark}")
    splits = [r for r in t["rows"] if r["mode"] in modes]
    dev_ms = max(r["device_s"] for r in splits)
    period = t.get("cpu_period_us", 10000) / 1000
    print("  KB = 1024 B. trips: round trips per step. pred: split_file's training cost model (each forward op "
          "with its backward ops and its variables' updates, from the train profiles; a cut tensor pays its upload "
          "and its gradient's download, labels and the loss are not costed) for that device side, on split_file's "
          "training link; device-only's prediction is its no-network cost, which is also the model's cost of "
          f"k = {n_ops} (so none is printed for the p{n_ops} packages, which keep the loss in the cloud). "
          "dev ms: the step less its Run calls; rpc: the Run calls' wall time; srv: the server's compute in them. "
          "/dev-only, /raw: this step time over device-only's, over raw data's (< 1: faster). "
          "P: the planner's choice (device-only when split_file wrote a device-only package); *: the fastest "
          "measured option for a label mode (device-only included). plan-cloud / plan-U: the package split_file "
          "itself wrote, measured.")
    slice_ms = t.get("quota", QUOTA) * period
    if dev_ms * 1e3 <= 2 * slice_ms:
        print(f"  Caveat: a split cut's device compute (dev ms, at most {ms(dev_ms)} ms a step here, between network "
              f"waits) mostly fits in the quota's {slice_ms:g} ms slice per {period:g} ms period and runs at full "
              "speed"
              + (f" (an unthrottled local step is {ms(free_step_s)} ms)" if free_step_s else "")
              + f"; on a device that is {QUOTA:.0%} of a core at all times it would take ~"
              + (f"{dev['median_s'] / dev['cpu_s']:.1f}x as long (device-only back to back: its wall time over its "
                 "CPU time)." if dev.get("cpu_s") else f"{1 / QUOTA:g}x as long."))
    same = [r for r in splits if r["sent"] == r["analytic_up"] and r["received"] == r["analytic_down"]]
    print(f"  tensor bytes per step measured (client counters) = analytic (the rounds' tensors at their shapes) "
          f"for {len(same)} of {len(splits)} split cuts"
          + ("" if len(same) == len(splits) else ": MISMATCH " + ", ".join(
              f"{r['name']} {r['sent']}/{r['received']} vs {r['analytic_up']}/{r['analytic_down']}"
              for r in splits if r not in same)[:400]))
    if t.get("pruned"):
        print(f"  not timed: their tensors alone (RTT + bytes on the shaped link, a lower bound) take longer than "
              f"{t['prune_factor']:g} x the predicted device-only step: "
              + ", ".join(f"{p['name']} >= {ms(p['lower_bound_s'])} ms" for p in t["pruned"]))
    bs = min(splits, key=lambda r: r["median_s"])
    print(f"  best split (some work in the cloud): {bs['name']} {ms(bs['median_s'])} ms; its step time over "
          f"device-only's {bs['median_s'] / dev['median_s']:.2f}, over raw data's "
          f"{bs['median_s'] / raw['median_s']:.2f}")
    for m in modes:
        p = plans[m]
        pk = p["k"]
        own = rows[f"plan-{MODE_TAG[m]}"]
        b = best[m]
        what = "labels cloud" if m == "cloud" else "U-shaped"
        if p["device_only"]:
            pr = dev
            text = (f"{pk}/{n_ops} forward ops on the device; split_file wrote a device-only package (plan.json "
                    f"rounds []), predicted {ms(p['predicted_split_s'])} ms: device-only, measured "
                    f"{ms(dev['median_s'])} ms (its own device.efl, back to back: {ms(own['median_s'])} ms, "
                    f"{own['median_s'] / dev['median_s']:.2f} x device-only's).")
        else:
            pr = own
            prefix = rows.get(f"{MODE_TAG[m]}-p{pk}") if p.get("prefix", True) else None
            if prefix is None:
                beside = "not one of the prefix cuts measured"
                also = ""
            else:
                same = ("the same rounds as" if p["same_rounds_as_prefix"] else "OTHER rounds than")
                beside = f"{same} the prefix cut {prefix['name']}, {kb(prefix['sent'])} KB up"
                also = f" ({prefix['name']}: {ms(prefix['median_s'])} ms)"
            text = (f"{pk}/{n_ops} forward ops on the device, predicted {ms(p['predicted_split_s'])} ms; the package "
                    f"split_file wrote ({own['round_trips']} round trip(s), {kb(own['sent'])} KB up per step; "
                    f"{beside}) measured {ms(own['median_s'])} ms{also}.")
        if p.get("problem"):
            text += f" PROBLEM: {p['problem']}."
        print(f"  planner, {what}: {text} Best measured: {b['name']} {ms(b['median_s'])} ms. planner/best "
              f"{pr['median_s'] / b['median_s']:.2f}; planner/device-only {pr['median_s'] / dev['median_s']:.2f}, "
              f"planner/raw data {pr['median_s'] / raw['median_s']:.2f}")
    ps = t.get("profile_sums_s")
    if ps:
        pred = dev["predicted_s"]
        print(f"  profiles (edgeflow profile -s train at batch {batch}, per-op medians scaled to whole runs, summed): "
              f"{ps[0] * 1e3:.3f} ms on the device under the quota, {ps[1] * 1e3:.3f} ms on the server; the cost "
              f"model's device-only step (forward ops with their backward ops and updates) {ms(pred)} ms, measured "
              f"{ms(dev['median_s'])} ms ({dev['median_s'] / pred:.1f} x the prediction)")
    print(f"  device cgroup: throttled {t['throttled'].get('nr_throttled', '?')} of "
          f"{t['throttled'].get('nr_periods', '?')} periods; tbf drops up/down {t['tbf_dropped'][0]}/"
          f"{t['tbf_dropped'][1]}")
    warned = sorted({w for m in modes for w in plans[m].get("warnings", [])})
    for w in warned:
        print(f"  split_file warned: {w}")


def print_bytes(b, names):
    devices = b["devices"]
    model, samples, batch = b.get("model", "digits"), b.get("epoch_samples", TRAIN_SAMPLES), b.get("batch", BATCH)
    unit, uname = (1024, "KB") if model == "digits" else (1024 ** 2, "MB")

    def size(x):  # in this table's unit
        return "-" if x is None else f"{x / unit:,.1f}"
    what = "digits samples" if model == "digits" else f"{model} images (analytic, from the tensors of each step)"
    print()
    print(f"Bytes per epoch ({samples:,} {what} split evenly among N devices, batch {batch}; tensor "
          f"payload both ways, summed over devices; {uname} = {unit:,} B). FedAvg: 1 local epoch per round = 1 round "
          f"per epoch; the model is {b['params_bytes']:,} B of trainable variables.")
    head = f"  {'':<22}" + "".join(f" {'N=' + str(n):>22}" for n in devices)
    print(head)
    sub = f"  {'':<22}" + "".join(f" {'up/down ' + uname:>15} {'vs FA':>6}" for _ in devices)
    print(sub)
    print("  " + "-" * (len(sub) - 2))
    fa_total = {n: b["fedavg"][str(n)]["analytic"]["round_push"] + b["fedavg"][str(n)]["analytic"]["round_pull"]
                for n in devices}
    mism = []
    for name in names:
        cells = ""
        for n in devices:
            r = b["split"][f"{name}/{n}"]
            if r["measured"] is not None and tuple(r["measured"][:2]) != (r["up"], r["down"]):
                mism.append((name, n, r["measured"], (r["up"], r["down"])))
            cells += f" {size(r['up']) + '/' + size(r['down']):>15} {(r['up'] + r['down']) / fa_total[n]:>6.1f}"
        label = "split " + name + (" (raw data)" if name == "cloud-p0" else "")
        print(f"  {label:<22}{cells}")
    cells = ""
    for n in devices:
        a = b["fedavg"][str(n)]["analytic"]
        cells += f" {size(a['round_push']) + '/' + size(a['round_pull']):>15} {1.0:>6.1f}"
    print(f"  {'FedAvg (per round)':<22}{cells}")
    cells = ""
    for n in devices:
        a = b["fedavg"][str(n)]["analytic"]
        cells += f" {'+' + size(a['first_pull']) + ' once':>15} {'':>6}"
    print(f"  {'FedAvg first pull':<22}{cells}")
    print("  vs FA: the split's bytes (up + down) over FedAvg's per round (push + pull), same N.")
    # measured vs analytic
    if not any(r["measured"] for r in b["split"].values()):
        print("  split: analytic only (the timing benchmark checks each cut's bytes per step against its "
              "measured tensor bytes); FedAvg: analytic (2 x the variables per device per round; measured equal "
              "on the digits)")
        return
    lines = []
    for n in devices:
        split_meas = [r for key, r in b["split"].items() if key.endswith(f"/{n}") and r["measured"] is not None]
        ok = sum(1 for r in split_meas if tuple(r["measured"][:2]) == (r["up"], r["down"]))
        calls = sorted({r["calls"] for key, r in b["split"].items() if key.endswith(f"/{n}")})
        fm = b["fedavg"][str(n)]["measured"]
        fa = b["fedavg"][str(n)]["analytic"]
        if fm is None:
            ftxt = "FedAvg analytic only"
        else:
            same = (fm["round_push"], fm["round_pull"], fm["first_pull"]) == \
                (fa["round_push"], fa["round_pull"], fa["first_pull"])
            ftxt = (f"FedAvg measured (round 2 of 2: push {fm['round_push']:,} B, pull {fm['round_pull']:,} B; "
                    f"first pull {fm['first_pull']:,} B) {'= analytic' if same else '!= analytic'}")
        lines.append(f"  N={n}: split measured for {len(split_meas)} of {len(names)} cuts, {ok} equal to the "
                     f"analytic bytes (Run calls per epoch: {calls}); {ftxt}")
    print("\n".join(lines))
    if mism:
        print(f"  MISMATCH measured vs analytic (name, N, measured (up, down, calls), analytic): {mism[:6]}")


def print_fedavg_time(doc):
    """Time per step against FedAvg, per link and N: split learning's measured step (the
    planner's package) against FedAvg's, which is the device-only step measured plus its
    round's model push and pull on the same link (analytic, RTT included) spread over the
    round's steps (one local epoch of the device's share)."""
    b = doc["bytes"]
    params, batch, samples = b["params_bytes"], b.get("batch", BATCH), b.get("epoch_samples", TRAIN_SAMPLES)
    print()
    print(f"Time per step against FedAvg (batch {batch}, an epoch of {samples:,} samples split evenly among N "
          f"devices, one FedAvg round per epoch; FedAvg's step = the device-only step measured + (push + pull of "
          f"{params / 2 ** 20:.1f} MB + 2 RTT on the link) / the round's steps, analytic):")
    head = f"  {'link':<5} {'split (planner) s':>17} {'device-only s':>13}" + "".join(
        f" {'FedAvg N=' + str(n) + ' s':>16}" for n in b["devices"])
    print(head)
    print("  " + "-" * (len(head) - 2))
    for t in doc.get("timing", []):
        rows = {r["name"]: r for r in t["rows"]}
        plan = rows.get("plan-cloud") or rows.get("plan-U")
        dev = rows["device-only"]
        exchange = params * 8 / (t["up_mbps"] * 1e6) + params * 8 / (t["down_mbps"] * 1e6) + 2 * t["rtt_s"]
        cells = ""
        for n in b["devices"]:
            steps = max(1, -(-(samples // n) // batch))
            cells += f" {(dev['median_s'] + exchange / steps):>16.2f}"
        print(f"  {t['link']:<5} {plan['median_s']:>17.2f} {dev['median_s']:>13.2f}{cells}")


def print_report(doc):
    print(doc.get("header", ""))
    if doc.get("free_step_s"):
        print(f"A local training step (device-only) in the benchmark's own process, no quota, no network: "
              f"{doc['free_step_s'] * 1e3:.2f} ms (median of {doc.get('free_steps', 60)}).")
    for t in doc.get("timing", []):
        print_timing(t, doc.get("n_ops", 8), doc.get("free_step_s"))
    if doc.get("bytes"):
        print_bytes(doc["bytes"], doc["cut_names"])
        if doc.get("timing"):
            print_fedavg_time(doc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="digits",
                    help="digits (default): the digits CNN, every prefix a cut, both label modes; resnet18: "
                         "ResNet-18 at 224x224 (bench_models.py's cached export, --cache), batch 8, the layer "
                         "boundaries as cuts, labels in the cloud")
    ap.add_argument("--cache", help="folder of bench_models.py's exported ONNX files (default "
                                    "$EDGEFLOW_BENCH_CACHE or ~/.cache/edgeflow-bench/<torch version>)")
    ap.add_argument("--batch", type=int, help="training batch (default 32 for digits, 8 for resnet18)")
    ap.add_argument("--modes", help="label modes: cloud (labels sent with the cut tensor) and/or U (labels stay on "
                                    "the device) (default both for digits, cloud for resnet18)")
    ap.add_argument("--cuts", choices=("all", "narrow"),
                    help="all: every prefix of the forward order; narrow: those after which one tensor crosses "
                         "(default all for digits, narrow for resnet18)")
    ap.add_argument("--epoch-samples", type=int,
                    help="samples per epoch of the bytes benchmark (default 1257 digits; 10000 images)")
    ap.add_argument("--bench", default="timing,bytes", help="timing, bytes or both (default timing,bytes)")
    ap.add_argument("--links", default=",".join(LINK_NAMES), help="link profiles (default 4g,wifi)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per split cut (default 20; device-only: 3x)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per cut first (default 3)")
    ap.add_argument("--cpu-period-us", type=int, default=10000, help="CFS period of the device's quota")
    ap.add_argument("--profile-runs", type=int, help="runs of `edgeflow profile` (default 300; 3 for resnet18)")
    ap.add_argument("--local-steps", type=int, help="device-only steps back to back (default 3 x --steps)")
    ap.add_argument("--block", type=int, default=10, help="device-only steps per timed block (default 10)")
    ap.add_argument("--devices", default="1,8,32", help="device counts of the bytes benchmark")
    ap.add_argument("--measure-devices", default="1,8,32",
                    help="device counts whose bytes are also measured (default all; '' for analytic only)")
    ap.add_argument("--prune-factor", type=float,
                    help="do not time a cut whose tensors alone take longer on the link than this x the "
                         "predicted device-only step (default 0 = time every cut for digits, 1.5 for resnet18)")
    ap.add_argument("--driver-timeout", type=float, default=900)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--report", help="print the tables of a --json file and exit")
    ap.add_argument("--keep", help="work in this directory and keep it")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print_report(json.load(f))
        return 0
    benches = {s.strip() for s in args.bench.split(",") if s.strip()}
    if not benches <= {"timing", "bytes"}:
        ap.error("--bench takes timing and/or bytes")
    links = [s.strip() for s in args.links.split(",") if s.strip()]
    from edgeflow.splitter import LINKS
    for k in links:
        if k not in LINKS:
            ap.error(f"unknown link {k!r}; known: {sorted(LINKS)}")
    real = args.model != "digits"
    if args.prune_factor is None:
        args.prune_factor = 1.5 if real else 0.0
    if args.profile_runs is None:
        args.profile_runs = 3 if real else 300
    tags = {v: k for k, v in MODE_TAG.items()}
    modes_arg = args.modes or ("cloud" if real else "cloud,U")
    try:
        modes = tuple(tags[m.strip()] for m in modes_arg.split(",") if m.strip())
    except KeyError:
        ap.error(f"--modes takes cloud and/or U, got {modes_arg!r}")
    wl = Workload(args.model, batch=args.batch, cache=args.cache, epoch_samples=args.epoch_samples)
    t0 = time.monotonic()
    work = pathlib.Path(args.keep) if args.keep else pathlib.Path(tempfile.mkdtemp(prefix="bench_split_training-"))
    work.mkdir(parents=True, exist_ok=True)
    doc = {"timing": [], "bytes": None}
    try:
        log(f"preparing: {args.model}, the package pair of every {args.cuts or ('narrow' if real else 'all')} "
            f"prefix cut ({', '.join(modes_arg.split(','))})")
        prep = Prepared(work, wl, modes, args.cuts or ("narrow" if real else "all"))
        log(f"  {prep.n} forward ops, {len(prep.cuts)} cut packages ({time.monotonic() - t0:.0f} s)")
        doc["n_ops"] = prep.n
        doc["cut_names"] = [c["name"] for c in prep.cuts.values()]
        if "timing" in benches:
            state = {"profiles": None}
            for link_name in links:
                doc["timing"].append(run_link(link_name, prep, args, work, state))
            doc["free_steps"] = 5 if real else 60
            doc["free_step_s"] = free_step(prep, doc["free_steps"], 1 if real else 5)
        if "bytes" in benches:
            log("bytes per epoch: split learning (every cut) and FedAvg")
            doc["bytes"] = bytes_bench(prep, args)
        doc["header"] = (
            f"bench_split_training: {wl.describe(prep.n, prep.params)}" + (f"; timing on {', '.join(links)}: device = {QUOTA:.0%} of one core (cgroup quota, "
                                f"CFS period {args.cpu_period_us / 1000:g} ms, 1 BLAS thread), server = edgeflow "
                                f"serve (1 BLAS thread, no quota) on the same 2-core host, link = tc tbf + real RTT "
                                f"(delay relay); {args.warmup} warm-up + {args.steps} timed steps per cut"
                                if "timing" in benches else "")
            + f"; {time.monotonic() - t0:.0f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1, default=float)
        print_report(doc)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
