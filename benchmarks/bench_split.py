"""Split inference on a real slow device and a real narrow link: the planner's cut against
every cut measured, against device-only and against cloud-only.

    sudo .venv/bin/python benchmarks/bench_split.py [--links 3g,4g,wifi] [--models encoder,mobilenetv2]
        [--quotas 0.05,0.2] [--cuts all|narrow] [--runs 7] [--warmup 2] [--rtt real|analytic]
        [--per-cut] [--json OUT.json]
    .venv/bin/python benchmarks/bench_split.py --report OUT.json [--per-cut]   # re-print

Per link profile of edgeflow.splitter.LINKS, a lab of benchmarks/netlab (root): device and
cloud namespaces joined by a tbf-shaped veth pair, the profile's RTT as real packet delay
(`--rtt analytic`: none, the RTT added to every measured call). The device is a process
under a CPU quota (`--quotas`, fractions of one core: 0.2 by default, 0.05 for a slower
phone class; 10 ms CFS period, `--cpu-period-us`), one BLAS thread; the cloud is
`edgeflow serve`, one BLAS thread, hosting every cut's cloud package. Per model and quota,
once: `edgeflow profile` on both sides, so the planner plans from measured op times. Then
per link: the planner's FIXED cut (split_file, device_graph="cut") and every prefix cut of
the `infer` op order (`--cuts all`; partition.write_pair; prefix 0 is cloud-only, the whole
order device-only) or those after which one tensor crosses (`--cuts narrow`, the layer
boundaries of Neurosurgeon's and DADS's search; the default with a real-size model), timed
by benchmarks/split_driver.py in the device namespace: `--runs` runs per cut after
`--warmup`, round-robin over the cuts, each after 20 ms idle, outputs checked against the
unsplit model's. ~13-14 minutes with the defaults.

Printed per model, quota and link: the planner's cut, its predicted and measured latency
(medians), the best measured cut, planner/best (goal <= 1.05), device-only and
cloud-only and the planner's speed-ups over them; then the cost model's predictions
against the measurements. Small models: `encoder`, a DADS-style encoder (48 KB image ->
8 KB) and a heavy head (8 convs of 256 channels at 16x16); `mobilenetv2` and `resnet` of
tests/data/onnx (64x64). Requests under ~2 ms of CPU fit in one quota slice and run at
full speed, which is why MobileNetV2's device-only time measures well under its profile.
Real-size models (the ONNX files benchmarks/bench_models.py exports with the `zoo` extra
and caches, `--cache`): `resnet18` and `mobilenet_v2` at 224x224, `bert_encoder` (4
layers, d 256, sequence 128).
"""
import argparse
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import harness
import netlab
from harness import edgeflow_cmd, log, median, ms, blas_env

HERE = pathlib.Path(__file__).resolve().parent
SHAPE = (1, 3, 64, 64)  # the small models' input
SMALL_MODELS = ("encoder", "mobilenetv2", "resnet")
# Real-size models (Neurosurgeon's and DADS's kind), exported by bench_models.py and cached
# outside the checkout: 224x224 images, a 4-layer BERT-like encoder at sequence 128.
REAL_MODELS = ("resnet18", "mobilenet_v2", "bert_encoder")
ALL_MODELS = SMALL_MODELS + REAL_MODELS
DEFAULT_MODELS = ("encoder", "mobilenetv2")
LINK_NAMES = ("3g", "4g", "wifi")
PORT = 50051
QUOTAS = (0.2,)  # of one core: the device's CPU (--quotas)
GOAL = 1.05


# -- models -----------------------------------------------------------------------------
def build_encoder_head(path, channels=256, layers=8, encoder_channels=8):
    """DADS's case for a split (as edgeflow.cli.quickstart.build_encoder_classifier, scaled):
    a cheap encoder (conv 3x3 stride 2, 2x2 max-pool) that shrinks the 64x64 image 6x,
    then a compute-heavy head of `layers` 3x3 convs of `channels` at 16x16, a global
    max-pool and a dense classifier. Every op is a chain link: the prefixes are all cuts."""
    import edgeflow as ef
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 3, 64, 64], name="image")
        h = ef.layers.conv2d(image, encoder_channels, 3, strides=2, padding="same", activation=ef.nn.relu,
                             name="encoder")
        h = ef.layers.max_pool2d(h, 2, 2, name="pool")  # 8 x 16 x 16 floats: 8 KB
        for i in range(layers):
            h = ef.layers.conv2d(h, channels, 3, padding="same", activation=ef.nn.relu, name=f"head{i}")
        h = ef.layers.flatten(ef.layers.max_pool2d(h, 16, 16, name="gpool"), name="features")
        probs = ef.nn.softmax(ef.layers.dense(h, 10, name="logits"), name="probs")
    ef.save(g, path, signatures={"infer": ({"image": image}, {"probs": probs})})


def make_model(name, path, cache=None):
    """Write model `name` to `path`; (input name, output name, input shape)."""
    if name == "encoder":
        build_encoder_head(path)
        return "image", "probs", SHAPE
    if name in REAL_MODELS:
        import bench_models
        from edgeflow.converters import onnx as onnx_converter
        onnx_path, inputs = bench_models.real_model(name, cache or bench_models.default_cache())
        onnx_converter.convert(onnx_path, path)
        (input_name, example), = inputs.items()
        import edgeflow as ef
        outputs = ef.Interpreter(str(path)).get_signature_runner("infer").get_output_details()
        return input_name, next(iter(outputs)), tuple(example.shape)
    harness.convert_onnx(name, path)
    return "image", "logits", SHAPE


def narrow_prefixes(model, order):
    """The prefixes k of the op order after which one tensor alone crosses to the rest (a
    layer boundary: between residual blocks, not inside one), with 0 (cloud-only); the
    cuts that Neurosurgeon's and DADS's layer-level search considers."""
    from edgeflow.splitter import partition
    return [0] + [k for k in range(1, len(order)) if len(partition.Cut(model, set(order[:k])).uploads) == 1]


# -- preparing a model ------------------------------------------------------------------
class Prepared:
    """A model, its reference input/output and its prefix-cut packages (link-independent)."""

    def __init__(self, name, work, cuts="all", cache=None):
        from edgeflow.format import reader
        from edgeflow.splitter import partition
        import edgeflow as ef
        self.name, self.dir = name, work / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{name}.efl"
        self.input_name, self.output_name, self.shape = make_model(name, self.path, cache)
        self.shapes = {self.input_name: self.shape}
        x = np.random.default_rng(7).standard_normal(self.shape).astype(np.float32)
        ref = ef.Interpreter(str(self.path)).get_signature_runner("infer")(**{self.input_name: x})
        self.x_path, self.ref_path = self.dir / "x.npy", self.dir / "ref.npy"
        np.save(self.x_path, x)
        np.save(self.ref_path, np.asarray(ref[self.output_name], np.float64))
        self.model = reader.load(str(self.path))
        self.order = partition.Cut(self.model, set()).ops  # operator indices, execution order
        self.cuts = []  # prefix k: {"k", "name", "device", "cloud", "model_id"}
        prefixes = range(len(self.order)) if cuts == "all" else narrow_prefixes(self.model, self.order)
        for k in prefixes:  # k == len(order) is device-only: the model itself
            d = self.dir / f"p{k:03d}"
            d.mkdir(exist_ok=True)
            mid = f"{name}-p{k:03d}"
            partition.write_pair(self.model, set(self.order[:k]), str(d), model_id=mid, device_graph="cut",
                                 cloud_graph="cut", probe_shapes=self.shapes)
            self.cuts.append({"k": k, "name": f"p{k:03d}", "device": str(d / "device.efl"),
                              "cloud": str(d / "cloud.efl"), "model_id": mid})
        self.profiles = None
        self.cost_graph = None

    def op_label(self, k):
        """Name of the last device op of prefix k (as profiles and plans name it)."""
        if k == 0:
            return "(input)"
        return next(op.name for op in self.cost_graph.ops if op.operator == self.order[k - 1])

    def load_cost_graph(self):
        from edgeflow.splitter import CostGraph, Profile
        dp, sp = (Profile.load(p) for p in self.profiles)
        self.cost_graph = CostGraph.from_model(str(self.path), "infer", self.shapes, dp, sp)

    def sides(self, device_operators):
        dev = set(device_operators)
        return {op.name: "device" if op.operator in dev else "cloud" for op in self.cost_graph.ops}


def profile_model(L, prep, period_us, quota, runs=20):
    """Device profile under the quota in the device namespace, server profile in the cloud one."""
    dev_p, srv_p = prep.dir / f"device_profile_{quota:g}.json", prep.dir / "server_profile.json"
    shape = f"{prep.input_name}=" + ",".join(map(str, prep.shape))
    base = edgeflow_cmd() + ["profile", str(prep.path), "--input-shape", shape, "--runs", str(runs)]
    t = time.monotonic()
    out = L.run_checked("device", base + ["-o", str(dev_p), "--name", f"device ({quota:.0%} of a core)"], 1800,
                      f"device profile of {prep.name}", cpu_quota=quota, cpu_period_us=period_us,
                      env=blas_env())
    log(f"  {out.strip()}  [{time.monotonic() - t:.0f} s]")
    out = L.run_checked("cloud", base + ["-o", str(srv_p), "--name", "server (1 core)"], 300,
                      f"server profile of {prep.name}", env=blas_env())
    log(f"  {out.strip()}")
    prep.profiles = (str(dev_p), str(srv_p))
    prep.load_cost_graph()


# -- one link ---------------------------------------------------------------------------
def plan_for_link(prep, link_name, quota):
    from edgeflow.splitter.package import split_file
    out = prep.dir / f"plan-{link_name}-{quota:g}"
    res = split_file(str(prep.path), str(out), link=link_name, device_profile=prep.profiles[0],
                     server_profile=prep.profiles[1], input_shapes=prep.shapes, device_graph="cut",
                     cloud_graph="cut", model_id=f"{prep.name}-{link_name}-planner")
    return res


def run_link(link_name, preps, args, work):
    from edgeflow.splitter import Link
    link = Link.parse(link_name)
    real_rtt = args.rtt == "real"
    results = []
    with netlab.lab(link.up_bps / 1e6, link.down_bps / 1e6, rtt_ms=link.rtt_s * 1e3 if real_rtt else 0) as L:
        log(f"[{link_name}] lab: {L.describe()}")
        for prep in preps:
            if prep.profiles is None:
                log(f"[{link_name}] profiling {prep.name} (device: {args.quota:.0%} quota, period "
                    f"{args.period_us} us)")
                profile_model(L, prep, args.period_us, args.quota)
        serve_dir = work / f"serve-{link_name}"
        shutil.rmtree(serve_dir, ignore_errors=True)
        serve_dir.mkdir()
        plans = {}
        for prep in preps:
            res = plan_for_link(prep, link_name, args.quota)
            plans[prep.name] = res
            for c in prep.cuts:
                os.symlink(c["cloud"], serve_dir / f"{c['model_id']}.efl")
            if res.placement.cloud_ops:
                os.symlink(res.paths["cloud"], serve_dir / f"{res.model_id}.efl")
        server_log = open(work / f"server-{link_name}.log", "wb")
        server = L.run_in("cloud", edgeflow_cmd() + ["serve", "--model-dir", str(serve_dir), "--host", L.cloud_ip,
                                                      "--port", str(PORT)],
                          stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=blas_env())
        try:
            for prep in preps:
                results.append(measure(L, prep, link, link_name, plans[prep.name], args, work))
        finally:
            netlab.stop(server)
            server_log.close()
        qd = L.qdisc_stats()
        log(f"[{link_name}] tbf: up {qd['up'].get('bytes', 0):,} B sent, {qd['up'].get('dropped', 0)} dropped; "
            f"down {qd['down'].get('bytes', 0):,} B, {qd['down'].get('dropped', 0)} dropped")
    for r in results:
        r["rtt_mode"], r["rtt_s"], r["prune_factor"], r["quota"] = args.rtt, link.rtt_s, args.prune_factor, args.quota
    return results


def measure(L, prep, link, link_name, plan, args, work):
    from edgeflow.splitter import breakdown, cost
    n = len(prep.order)
    placement = plan.placement
    planner_ops = set(placement.device_operators(plan.cost_graph))
    rtt_lab = L.rtt_ms / 1e3

    def lower_bound(device_operators):
        """Seconds a cut takes at least in this lab: the lab's RTT (if it calls the cloud)
        plus its tensor bytes' time on the tbf-shaped wire, less the tbf bucket (which
        passes at once after idle). The gRPC framing, headers, slow start, both sides'
        compute are all left out: a true lower bound, not a prediction."""
        parts = breakdown(prep.cost_graph, link, prep.sides(device_operators))
        if len(device_operators) == n:
            return 0.0
        up = max(0, parts["up_bytes"] - L.tbf["up"]["burst"]) * 8 / L.tbf["up"]["rate_bit"]
        down = max(0, parts["down_bytes"] - L.tbf["down"]["burst"]) * 8 / L.tbf["down"]["rate_bit"]
        return rtt_lab + up + down

    cuts = [{"name": c["name"], "device": c["device"], "lower_bound_s": lower_bound(prep.order[:c["k"]])}
            for c in prep.cuts]
    cuts.append({"name": "device-only", "local": str(prep.path), "lower_bound_s": 0.0})
    cuts.append({"name": "planner", **({"device": plan.paths["device"]} if placement.cloud_ops
                                       else {"local": str(prep.path)})})
    spec = {"server": f"{L.cloud_ip}:{PORT}", "runs": args.runs, "warmup": args.warmup, "gap_s": 0.02,
            "timeout_s": 120, "input": str(prep.x_path), "reference": str(prep.ref_path),
            "input_name": prep.input_name, "output_name": prep.output_name, "cuts": cuts,
            "anchors": ["device-only", "p000", "planner"], "prune_factor": args.prune_factor,
            "tag": f"{prep.name} {link_name}"}
    spec_path = prep.dir / f"spec-{link_name}.json"
    spec_path.write_text(json.dumps(spec))
    log(f"[{link_name}] {prep.name}: {len(cuts)} cuts x ({args.warmup} warm-up + {args.runs} timed runs); "
        f"planner: {len(planner_ops)}/{n} ops on the device, {placement.breakdown['up_bytes']:,} B up, "
        f"predicted {placement.predicted['split'] * 1e3:.1f} ms")
    t = time.monotonic()
    p = L.run_in("device", [sys.executable, str(HERE / "split_driver.py"), str(spec_path)],
                 cpu_quota=args.quota, cpu_period_us=args.period_us, env=blas_env(),
                 stdout=subprocess.PIPE, stderr=None, stdin=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=args.driver_timeout)
    except subprocess.TimeoutExpired:
        netlab.stop(p)
        raise RuntimeError(f"the device driver for {prep.name} on {link_name} timed out")
    if p.returncode != 0:
        raise RuntimeError(f"the device driver for {prep.name} on {link_name} failed (rc {p.returncode})")
    doc = json.loads(out.decode().strip().splitlines()[-1])
    got = doc["cuts"]
    throttled = p.cgroup.stat() if p.cgroup is not None else {}
    log(f"[{link_name}] {prep.name}: measured in {time.monotonic() - t:.0f} s; device cgroup throttled "
        f"{throttled.get('nr_throttled', '?')} of {throttled.get('nr_periods', '?')} periods")
    rtt_add = 0.0 if args.rtt == "real" else link.rtt_s

    def row(name, device_operators, label):
        m = got[name]
        sides = prep.sides(device_operators)
        parts = breakdown(prep.cost_graph, link, sides)
        calls = m["calls"] > 0
        return {"name": name, "label": label, "device_ops": len(device_operators), "ops": n,
                "up_bytes": parts["up_bytes"], "down_bytes": parts["down_bytes"],
                "predicted_s": cost(prep.cost_graph, link, sides), "parts": parts,
                "measured_s": m["median_s"] + (rtt_add if calls else 0.0),
                "min_s": m["min_s"] + (rtt_add if calls else 0.0), "max_s": m["max_s"] + (rtt_add if calls else 0.0),
                "call_s": m.get("call_median_s"), "server_s": m.get("server_median_s"),
                "max_abs_diff": m["max_abs_diff"], "cloud_calls": m["calls"], "pruned": m["pruned"],
                "runs": len(m["samples"]), "samples": [v + (rtt_add if calls else 0.0) for v in m["samples"]]}

    rows = [row(c["name"], prep.order[:c["k"]], prep.op_label(c["k"])) for c in prep.cuts]
    rows.append(row("device-only", prep.order, prep.op_label(n)))
    prow = row("planner", sorted(planner_ops, key=prep.order.index), "")
    prow["device_only"] = not placement.cloud_ops
    prow["predicted_split_s"] = placement.predicted["split"]
    same = [r["name"] for r, c in zip(rows, prep.cuts + [None]) if
            set(prep.order[:(c["k"] if c else n)]) == planner_ops]
    result = {"model": prep.name, "link": link_name, "ops": n, "cuts": rows, "planner": prow,
              "device_only": rows[-1], "cloud_only": rows[0],
              "predicted": dict(placement.predicted), "ping_s": doc["ping_median_s"],
              "pruned": sum(1 for r in rows if r["pruned"]), "best_anchor_s": doc["best_anchor_s"]}
    settle(result, same[0] if same else None)
    result["mismatches"] = [r["name"] for r in rows + [prow] if not r["max_abs_diff"] < 1e-4]
    return result


def settle(result, same=None):
    """Find the prefix cut the planner's package equals (`same`, else device-only when the
    planner keeps everything on the device: its device side then lacks only the shape ops
    the cost graph folds away) and pool the two: one cut measured twice (two package pairs,
    interleaved), its latency the median of both sets of samples, the two medians apart a
    measure of the noise. Then the best distinct cut. Idempotent: `--report` re-settles
    older result files."""
    rows, prow = result["cuts"], result["planner"]
    result["device_only"] = next(r for r in rows if r["name"] == "device-only")  # one object again
    result["cloud_only"] = rows[0]  # after a JSON round trip
    if prow.get("device_only", prow["cloud_calls"] == 0 and prow["up_bytes"] == 0):
        same = "device-only"
    same = same or prow.get("same_as")
    prow["same_as"] = same
    prow["label"] = next(r["label"] for r in rows if r["name"] == same) if same else "(not a prefix)"
    if same:
        twin = next(r for r in rows if r["name"] == same)
        if "twin_s" not in prow:
            prow["twin_s"] = (prow["measured_s"], twin["measured_s"])
        if not twin["pruned"]:
            pooled = median(prow["samples"] + twin["samples"])
            prow["measured_s"] = twin["measured_s"] = pooled
    distinct = rows + ([] if same else [prow])
    best = min(distinct, key=lambda r: r["measured_s"])
    result["best"] = prow if same and best["name"] == same else best


# -- printing ---------------------------------------------------------------------------
def tag(r):
    """A result's model and the device's CPU quota: "resnet18 @ 20%"."""
    return f"{r['model']} @ {r.get('quota', 0.2):.0%}"


def kb(b):
    return f"{b / 1024:.1f} KB"


def cut_desc(r):
    return f"{r['device_ops']}/{r['ops']} ({r['label']}, {kb(r['up_bytes'])} up)"


def short(label, width=24):
    return label if len(label) <= width else "..." + label[-(width - 3):]


def print_report(results, per_cut=False, header=""):
    if header:
        print(header)
    print()
    print(f"Planner's split vs every cut, measured (median ms; goal plan/best <= {GOAL}); x dev, x cloud = "
          "speed-up of the planner's split over device-only, cloud-only")
    head = (f"{'model @ device':<17} {'link':<4}  {'planner cut (ops on device, last, up)':<38} {'pred':>6} {'meas':>6}  "
            f"{'best measured cut':<38} {'best':>6} {'plan/best':>9}  {'dev-only':>8} {'cloud-only':>10} "
            f"{'x dev':>6} {'x cloud':>7}")
    print(head)
    print("-" * len(head))

    def desc(x):
        return f"{x['device_ops']}/{x['ops']} {short(x['label'], 18)} {kb(x['up_bytes'])}"

    for r in results:
        p, b, d, c = r["planner"], r["best"], r["device_only"], r["cloud_only"]
        ratio = p["measured_s"] / b["measured_s"]
        bdesc = "(the planner's cut)" if b is p or b["name"] == "planner" else desc(b)
        print(f"{tag(r):<17} {r['link']:<4}  {desc(p):<38} {ms(p['predicted_s']):>6} {ms(p['measured_s']):>6}  "
              f"{bdesc:<38} {ms(b['measured_s']):>6} {ratio:>8.3f}{' ' if ratio <= GOAL else '!'}  "
              f"{ms(d['measured_s']):>8} {ms(c['measured_s']):>10} {d['measured_s'] / p['measured_s']:>5.2f}x "
              f"{c['measured_s'] / p['measured_s']:>6.2f}x")
    print()
    print("Cost model, predicted / measured (median ms), and how the measurement went")
    head = (f"{'model @ device':<17} {'link':<4}  {'device-only':>15} {'cloud-only':>15} {'planner':>15}  {'rank':>6}  "
            f"{'cuts (once)':>11}  {'twice':>13}  {'cloud-only call/server':>22}  {'empty RPC/RTT':>13}")
    print(head)
    print("-" * len(head))
    for r in results:
        p, d, c = r["planner"], r["device_only"], r["cloud_only"]
        allm = sorted(x["measured_s"] for x in r["cuts"] + ([] if p.get("same_as") else [p]))
        rank = sum(1 for v in allm if v < p["measured_s"]) + 1
        twin = p.get("twin_s")
        twice = f"{ms(twin[0])}/{ms(twin[1])}" if twin else "-"
        print(f"{tag(r):<17} {r['link']:<4}  {ms(d['predicted_s']):>7}/{ms(d['measured_s']):<7} "
              f"{ms(c['predicted_s']):>7}/{ms(c['measured_s']):<7} {ms(p['predicted_s']):>7}/{ms(p['measured_s']):<7}  "
              f"{rank:>2}/{len(allm):<3}  {len(r['cuts']):>5} ({r.get('pruned', 0):>2})  {twice:>13}  "
              f"{ms(c['call_s']):>10}/{ms(c['server_s']):<11}  {ms(r.get('ping_s')):>6}/{ms(r.get('rtt_s')):<6}")
    print("rank: the planner's cut among the distinct cuts measured (1 = fastest). cuts (once): all cuts, and in "
          "brackets those whose lower bound (lab RTT + their bytes' time on the shaped wire) exceeds "
          "--prune-factor x the best of device-only/cloud-only/planner: timed once, cold, not --runs times. "
          "twice: the planner's cut is also a prefix cut: both packages' medians (the table pools them). "
          "call/server: the Run call's wall time and the server's compute in it. empty RPC: an empty gRPC "
          "ping from the device process.")
    bad = [(r["model"], r["link"], r["mismatches"]) for r in results if r["mismatches"]]
    if bad:
        print(f"OUTPUT MISMATCH vs the unsplit model (max abs diff >= 1e-4): {bad}")
    else:
        print("Every cut's outputs matched the unsplit model's (max abs diff < 1e-4).")
    modes = {r.get("rtt_mode") for r in results}
    if "analytic" in modes:
        print("RTT: not in the lab; the profile's RTT was added to every measured call.")
    if per_cut:
        for r in results:
            print()
            print(f"{r['model']} on {r['link']}: every cut (prefix k = the first k ops on the device); "
                  f"call = the Run call's wall time, server = its compute")
            print(f"  {'cut':<12} {'last device op':<44} {'up':>10} {'pred ms':>8} {'meas ms':>8} {'min':>7} "
                  f"{'max':>7} {'call':>7} {'server':>7} {'runs':>4}")
            once = f" (cold: bound > {r.get('prune_factor', 0):g}x best anchor)"
            for x in r["cuts"] + [r["planner"]]:
                mark = (once if x["pruned"] else "") + (" *" if x["name"] == r["best"]["name"] else "")
                label = x["label"] if x["name"] != "planner" else f"= {x.get('same_as') or 'not a prefix'}"
                print(f"  {x['name']:<12} {short(label, 44):<44} {kb(x['up_bytes']):>10} {ms(x['predicted_s']):>8} "
                      f"{ms(x['measured_s']):>8} {ms(x['min_s']):>7} {ms(x['max_s']):>7} {ms(x['call_s']):>7} "
                      f"{ms(x['server_s']):>7} {x['runs']:>4}{mark}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", default=",".join(LINK_NAMES), help="link profiles (default 3g,4g,wifi)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"of {','.join(ALL_MODELS)}")
    ap.add_argument("--quotas", default=",".join(f"{q:g}" for q in QUOTAS),
                    help="the device's CPU, fractions of one core, comma-separated (default 0.2; "
                         "0.05,0.2 for two phone classes)")
    ap.add_argument("--cuts", choices=("all", "narrow"), default=None,
                    help="all: every prefix of the op order; narrow: the prefixes after which one tensor "
                         "crosses (layer boundaries; the default with a real-size model)")
    ap.add_argument("--cache", help="folder of bench_models.py's exported ONNX files (default "
                                    "$EDGEFLOW_BENCH_CACHE or ~/.cache/edgeflow-bench/<torch version>)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per cut (default 7)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per cut first (default 2)")
    ap.add_argument("--cpu-period-us", type=int, default=10000,
                    help="CFS period of the device's quota (default 10000: see the docstring)")
    ap.add_argument("--rtt", choices=("real", "analytic"), default="real",
                    help="real: packet delay in the lab (default); analytic: no delay, the RTT added")
    ap.add_argument("--prune-factor", type=float, default=0,
                    help="a shortcut that lets a timing decide: time a cut once when its lower bound (RTT + "
                         "wire time of its bytes) exceeds this x the best warm-up time of device-only/"
                         "cloud-only/planner (default 0: time every cut fully)")
    ap.add_argument("--per-cut", action="store_true", help="also print every cut's figures")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--report", help="print the tables of a --json file and exit (no measuring)")
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    ap.add_argument("--driver-timeout", type=float, default=900, help="seconds per model and link")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        for r in doc["results"]:
            settle(r)
        print_report(doc["results"], args.per_cut, doc.get("header", ""))
        return 0
    links = [s.strip() for s in args.links.split(",") if s.strip()]
    models = [s.strip() for s in args.models.split(",") if s.strip()]
    for m in models:
        if m not in ALL_MODELS:
            ap.error(f"unknown model {m!r}; known: {ALL_MODELS}")
    from edgeflow.splitter import LINKS
    for k in links:
        if k not in LINKS:
            ap.error(f"unknown link {k!r}; known: {sorted(LINKS)}")
    if args.runs < 1 or args.warmup < 1:
        ap.error("--runs and --warmup must be >= 1")
    try:
        quotas = [float(q) for q in args.quotas.split(",") if q.strip()]
    except ValueError:
        ap.error(f"--quotas: expected fractions of a core such as 0.05,0.2, got {args.quotas!r}")
    if not quotas or not all(0 < q <= 1 for q in quotas):
        ap.error(f"--quotas: expected fractions in (0, 1], got {args.quotas!r}")
    cuts = args.cuts or ("narrow" if any(m in REAL_MODELS for m in models) else "all")
    t0 = time.monotonic()
    work = pathlib.Path(args.keep) if args.keep else pathlib.Path(tempfile.mkdtemp(prefix="bench_split-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        preps = []
        for m in models:
            log(f"preparing {m}: model, reference output, every prefix cut's package pair")
            preps.append(Prepared(m, work, cuts, args.cache))
            log(f"  {m}: {len(preps[-1].order)} ops -> {len(preps[-1].order) + 1} cuts")
        results = []
        for quota in quotas:  # each device class profiled once, then every link
            # The kernel's smallest quota is 1 ms: a 5% device needs a 20 ms period.
            args.quota, args.period_us = quota, max(args.cpu_period_us, math.ceil(1000 / quota))
            for prep in preps:
                prep.profiles = None
            for link_name in links:
                results += run_link(link_name, preps, args, work)
        rtt = " + real RTT (delay relay)" if args.rtt == "real" else ", RTT added to the measured calls"
        header = (f"bench_split: {', '.join(models)} on {', '.join(links)}; device = {', '.join(f'{q:.0%}' for q in quotas)} of one core "
                  f"(cgroup quota, CFS period {args.cpu_period_us / 1000:g} ms or the 1 ms quota's, 1 BLAS thread); server = edgeflow "
                  f"serve, 1 BLAS thread, no quota, on the same 2-core host; link = tc tbf on a veth pair{rtt}; "
                  f"{args.runs} timed runs per cut after {args.warmup} warm-up, prune factor {args.prune_factor:g}; "
                  f"{time.monotonic() - t0:.0f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": header, "results": results}, f, indent=1, default=float)
        print_report(results, args.per_cut, header)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
