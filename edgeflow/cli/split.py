"""`edgeflow split`: plan a model's split between the device and a server; write both packages."""
import argparse
import os
import sys

from .arguments import parse_shapes


def add_parser(verbs):
    p = verbs.add_parser("split", help="split a model between the device and a cloud server",
                         description="Plan where each op runs (exact minimum cut for the link and "
                                     "the hardware) and write OUTDIR/device.efl, OUTDIR/cloud.efl, "
                                     "OUTDIR/plan.json and a picture of the plan, OUTDIR/plan.svg. Serve cloud.efl with "
                                     "`edgeflow serve`; run device.efl with --cloud HOST:PORT.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="where to write the packages")
    p.add_argument("--link", help="3g (1.1 Mbps up), 4g (5.85), wifi (18.88), or "
                                  "'up=MBPS,down=MBPS,rtt=SECONDS' (default 4g)")
    p.add_argument("--up", metavar="MBPS", help="uplink bandwidth (overrides --link's)")
    p.add_argument("--down", metavar="MBPS", help="downlink bandwidth (overrides --link's)")
    p.add_argument("--rtt", metavar="SECONDS", help="round-trip time, e.g. 0.05 or 50ms (overrides --link's)")
    p.add_argument("--overhead", metavar="SECONDS",
                   help="fixed cost of a call beyond the RTT, e.g. 3ms (overrides --link's; default 3 ms)")
    p.add_argument("--objective", choices=["latency", "device-time"], default="latency",
                   help="minimize end-to-end latency (default) or the device's busy time")
    p.add_argument("--device-profile", metavar="P", help="op times measured on the device (`edgeflow profile`)")
    p.add_argument("--server-profile", metavar="P", help="op times measured on the server")
    p.add_argument("--device-speed", type=float, default=1.0,
                   help="without a device profile: the device's speed relative to this machine (default 1)")
    p.add_argument("--server-speed", type=float, default=10.0,
                   help="without a server profile: the server's speed relative to this machine (default 10)")
    p.add_argument("--cut", metavar="TENSOR,...", help="cut at these tensors instead of planning; "
                                                        "the device keeps this cut unless --adapt")
    p.add_argument("--adapt", action=argparse.BooleanOptionalAction, default=None,
                   help="let the device move the cut at run time from the link it measures (default: "
                        "yes, unless --cut; needs both graphs full)")
    p.add_argument("--compression", choices=["none", "fp16", "int8"], default="none",
                   help="how float32 tensors travel on the link (default none)")
    p.add_argument("--memory-budget", type=float, metavar="MB",
                   help="device memory for weights and activations, in MiB")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="plan for this input shape (default: declared, dynamic dimensions 1)")
    p.add_argument("--device-graph", choices=["full", "cut"], default="full",
                   help="full: the device package also holds the whole graph, to run alone when the "
                        "server is unreachable and to re-plan (default); cut: only its part")
    p.add_argument("--cloud-graph", choices=["full", "cut"], default="full",
                   help="full: the cloud package holds the whole graph, so the device may move the "
                        "cut at run time (default); cut: only its part")
    p.add_argument("--model-id", help="the cloud package's id on the server (default: "
                                      "MODEL-<hash prefix>)")
    p.add_argument("--signature", "-s", help="the signature to split (default infer)")
    p.add_argument("--train", action="store_true",
                   help="split the 'train' signature for split learning: forward ops by the cut, each "
                        "backward op with its forward op, each variable's update where it lives")
    p.add_argument("--labels", choices=["cloud", "device"], default="cloud",
                   help="with --train: send the labels to the cloud (one round trip per step), or "
                        "keep the loss and labels on the device (U-shaped, two round trips)")
    p.add_argument("--svg", metavar="FILE",
                   help="where to draw the plan: ops by side, the tensors that cross the link with "
                        "their bytes, in a layered layout (default OUTDIR/plan.svg; needs the 'draw' "
                        "extra, without which the picture is skipped)")
    p.add_argument("--no-svg", dest="svg", action="store_false", help="draw no picture")
    p.set_defaults(fn=cmd_split)


def cmd_split(args):
    from ..splitter.package import split_file
    from . import draw
    picture = args.svg is not False
    if args.svg:
        draw.require()  # asked for by name: before the packages are written
    elif picture and not draw.available():
        picture = False
        print(f"no plan picture: it needs igraph ({draw.INSTALL})", file=sys.stderr)
    result = split_file(args.model, args.output, link=_link(args), objective=args.objective,
                        device_profile=args.device_profile, server_profile=args.server_profile,
                        cut=[c for c in (args.cut or "").split(",") if c] or None,
                        input_shapes=parse_shapes(args.input_shape) or None, compression=args.compression,
                        memory_budget=int(args.memory_budget * 2**20) if args.memory_budget else None,
                        device_graph=args.device_graph, cloud_graph=args.cloud_graph,
                        model_id=args.model_id, signature=args.signature or "infer",
                        device_speed=args.device_speed, server_speed=args.server_speed,
                        train=args.train, labels=args.labels, adapt=args.adapt)
    print(result.table)
    print()
    for key in ("device", "cloud", "plan"):
        print(f"wrote {result.paths[key]}")
    if picture:
        from ..atomic import atomic_file
        path = args.svg or os.path.join(args.output, "plan.svg")
        with atomic_file(path) as f:
            f.write(draw.plan_svg(result.placement, result.cost_graph, result.link).encode("utf-8"))
        print(f"wrote {path}")
    then = (f"train with `edgeflow train {result.paths['device']} --cloud HOST:PORT --data D.npz`"
            if args.train else f"run with `edgeflow run {result.paths['device']} --cloud HOST:PORT`")
    sha = result.cloud_sha256
    folder = os.path.dirname(result.paths["cloud"]) or "."
    print(f"cloud model id {result.model_id} (sha256 {sha[:16]}...): serve it with "
          f"`edgeflow serve --model-dir {folder}` (it skips device.efl) or from any folder holding "
          f"cloud.efl; {then}")
    if result.cut_independent:
        print("cloud.efl is the whole model under this id: the same file for every cut and link of "
              "this model, so a server hosting it serves every split of it")
    else:
        print("cloud.efl holds only this cut's cloud ops (--cloud-graph cut): another cut makes another "
              "file, a version the server hosts beside this one")
    previous = result.previous_cloud_sha256
    if previous is not None:
        print(f"cloud.efl sha256 unchanged ({sha[:16]}...): servers already hosting it serve this split"
              if previous == sha else
              f"cloud.efl sha256 changed ({previous[:16]}... -> {sha[:16]}...): host the new file beside "
              f"the old one (a version of model {result.model_id}) while devices split against the old "
              "one are in use")


def _link(args):
    """The link spec: --link (default 4g) with --up, --down, --rtt, --overhead overriding its figures."""
    overrides = [f"{k}={v}" for k, v in (("up", args.up), ("down", args.down), ("rtt", args.rtt),
                                         ("overhead", args.overhead)) if v]
    if overrides:  # over --link, else over 4g unless --up gives the figures
        base = args.link or (None if args.up else "4g")
        return ",".join(([base] if base else []) + overrides)
    return args.link or "4g"
