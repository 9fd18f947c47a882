"""The `edgeflow` command: inspect, run, bench and quickstart (more verbs come with features)."""
import argparse
import json
import os
import sys

import numpy as np

from .interp.inputs import pick_signature
from .errors import EdgeflowError


def _add_inputs_args(p):
    p.add_argument("--signature", "-s", help="signature key (default: the only one, or 'infer')")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array from a .npy file; repeat for each input")


def _parse_inputs(items):
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise EdgeflowError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise EdgeflowError(f"--input {name}: cannot read {path!r} as .npy ({e})") from None
    return out


def _add_accel_args(p):
    p.add_argument("--accel", choices=["none", "opencl", "auto"], default="none",
                   help="run supported ops on an OpenCL device (opencl), on one if there is one "
                        "(auto), or with numpy only (none, the default)")
    p.add_argument("--device", metavar="NAME",
                   help="with --accel: the OpenCL device, a name substring or an index "
                        "(default: EDGEFLOW_OPENCL_DEVICE, else the first GPU, else the first device)")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="with --accel: how the OpenCL device stores float tensors: fp32 (the default), or "
                        "fp16 (half: half the device memory and traffic, math still in float32, results "
                        "within about 1e-3 relative)")


def _delegates(args):
    """The delegates --accel asks for; 'auto' without a device says so on stderr."""
    from .accel import delegates_for
    delegates = delegates_for(args.accel, args.device, args.precision)
    if args.accel == "auto":
        print(f"edgeflow {args.verb}: " + (f"using OpenCL on {delegates[0].device_name}" if delegates
                                            else "no OpenCL device found: running with numpy"),
              file=sys.stderr)
    return delegates


def cmd_inspect(args):
    from .summary import describe, render
    info = describe(args.model, delegates=_delegates(args))
    print(json.dumps(info, indent=2) if args.json else render(info))


def _add_cloud_args(p):
    p.add_argument("--cloud", metavar="HOST:PORT",
                   help="a device package from `edgeflow split`: run (or train) its cloud part on "
                        "this server")
    p.add_argument("--token-file", metavar="FILE", help="with --cloud: the server's bearer token")
    p.add_argument("--root-cert", metavar="PEM", help="with --cloud: use TLS, trusting this certificate")


def _cloud(args):
    """{"cloud", "token", "root_cert"} from --cloud, --token-file, --root-cert ({} without --cloud)."""
    if not args.cloud:
        if args.token_file or args.root_cert:
            raise EdgeflowError("--token-file and --root-cert need --cloud HOST:PORT")
        return {}
    token = _read_file(args.token_file, "rt").strip() if args.token_file else None
    root = _read_file(args.root_cert, "rb") if args.root_cert else None
    return {"cloud": args.cloud, "token": token, "root_cert": root}


def _cloud_delegates(args, device_id=None):
    """[a CloudDelegate] for --cloud (a device package from `edgeflow split`), else []."""
    cloud = _cloud(args)
    if not cloud:
        return []
    from .cloud import CloudDelegate
    return [CloudDelegate(cloud["cloud"], token=cloud["token"], root_cert=cloud["root_cert"],
                          device_id=device_id)]


def _read_file(path, mode):
    with open(path, mode) as f:
        return f.read()


def cmd_run(args):
    from .interp import Interpreter
    interp = Interpreter(args.model, delegates=_cloud_delegates(args) + _delegates(args))
    runner = pick_signature(interp, args.signature)
    outputs = runner(**_parse_inputs(args.input))
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
        print(np.array2string(value, threshold=20, edgeitems=3, precision=5))
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{name}.npy"), value)
    if args.output_dir:
        print(f"wrote {len(outputs)} output(s) to {args.output_dir}/")


def cmd_bench(args):
    from .bench import bench_model, render
    result = bench_model(args.model, runs=args.runs, warmup=args.warmup, signature=args.signature,
                         inputs=_parse_inputs(args.input), top=args.top,
                         delegates=_cloud_delegates(args) + _delegates(args))
    print(json.dumps(result, indent=2) if args.json else render(result))


def cmd_convert(args):
    try:
        from converters import onnx as onnx_converter
    except ImportError as e:
        raise EdgeflowError(f"edgeflow convert needs the 'convert' extra: pip install 'edgeflow[convert]' ({e})")
    if not args.model.lower().endswith(".onnx"):
        raise EdgeflowError(f"{args.model}: expected an .onnx file (TFLite input is not supported yet)")
    out = args.output or os.path.splitext(args.model)[0] + ".efl"
    result = onnx_converter.convert(args.model, out, quantize=args.quantize, optimize=args.optimize,
                                    progress=sys.stderr.isatty(), trainable=args.trainable,
                                    loss=args.loss, optimizer=args.optimizer, freeze=args.freeze)
    print(f"converted {args.model} -> {out}")
    print(f"  ONNX ops     {sum(result.onnx_ops.values()):5}  " + _counts(result.onnx_ops))
    print(f"  edgeflow ops {sum(result.ops.values()):5}  " + _counts(result.ops))
    print(f"  parameters   {result.parameters:,}")
    if args.trainable:
        variables = sum(t.is_variable for t in result.model.subgraphs[0].tensors)
        print(f"  trainable    {variables} variables (with optimizer slots); signatures "
              + ", ".join(s.key for s in result.model.signatures))
    ratio = result.efl_bytes / result.onnx_bytes if result.onnx_bytes else float("nan")
    print(f"  size         {result.onnx_bytes:,} B (.onnx) -> {result.efl_bytes:,} B (.efl"
          f"{', ' + args.quantize if args.quantize else ''}), {ratio:.2f}x")


def _counts(counter):
    return ", ".join(f"{op} {n}" for op, n in counter.most_common())


def _train_with_parameter_server(args, data):
    """edgeflow train --mode sync|async|fedavg: push gradients (or models) to the server."""
    from .cloud.ps import ParameterClient, train
    if not args.cloud:
        raise EdgeflowError(f"--mode {args.mode} needs --cloud HOST:PORT (a parameter server: "
                            "edgeflow serve --parameter-server MODE)")
    cloud = _cloud(args)
    model_id = args.model_id or os.path.splitext(os.path.basename(args.model))[0]
    device_id = args.device_id or f"device-{os.getpid()}"
    n = len(next(iter(data.values()))) if data else 0
    total = args.epochs if args.mode == "fedavg" else args.epochs * -(-n // args.batch_size)
    bar = _progress(total, f"training ({args.mode})")

    def on_step(record):
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}", version=record["version"])
    options = dict(batch_size=args.batch_size, seed=args.seed, on_step=on_step)
    if args.mode == "fedavg":
        options.update(rounds=args.epochs, local_epochs=args.local_epochs)
    else:
        options.update(epochs=args.epochs)
    with ParameterClient(args.cloud, token=cloud["token"], root_cert=cloud["root_cert"]) as client:
        history = train(args.model, data, client, model_id, device_id, args.mode, **options)
    bar.close()
    if history:
        print(f"trained {len(history)} {'rounds' if args.mode == 'fedavg' else 'steps'} as {device_id!r}: "
              f"loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}")


def cmd_train(args):
    from . import training_loop
    from .interp import Interpreter
    if args.mode != "split":
        return _train_with_parameter_server(args, _load_npz(args.data))
    if args.device_id and not args.cloud:
        raise EdgeflowError("--device-id needs --cloud HOST:PORT")
    interp = Interpreter(args.model, delegates=_cloud_delegates(args, args.device_id) + _delegates(args))
    if "train" not in interp.get_signature_list():
        raise EdgeflowError(f"{args.model} has no 'train' signature; make one with ef.save(..., "
                            "signatures={'train': ...}) or edgeflow convert --trainable")
    data = _load_npz(args.data)
    n = len(next(iter(data.values()))) if data else 0
    steps = args.epochs * -(-n // args.batch_size)
    bar = _progress(steps, "training")

    def on_step(epoch, step, loss):
        bar.update(1)
        bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.4f}")
    history = training_loop.fit(interp, data, args.epochs, args.batch_size, args.seed, args.checkpoint_dir,
                          args.checkpoint_every, on_step)
    bar.close()
    if history:
        print(f"trained {len(history)} steps: loss {history[0][1]:.4f} -> {history[-1][1]:.4f}")
    else:
        print("nothing to do: the checkpoint is already at the last epoch")
    if args.output:
        interp.export(args.output)
        print(f"wrote the trained model to {args.output}")


def _load_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except (OSError, ValueError) as e:
        raise EdgeflowError(f"--data: cannot read {path!r} as .npz ({e})") from None


class _Bar:
    """A minimal progress line when tqdm is not installed."""

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.post = total, desc, 0, {}

    def update(self, k):
        self.n += k
        if self.n == self.total or self.n % max(self.total // 20, 1) == 0:
            post = ", ".join(f"{k}={v}" for k, v in self.post.items())
            print(f"{self.desc}: {self.n}/{self.total} {post}", file=sys.stderr)

    def set_postfix(self, **kw):
        self.post = kw

    def close(self):
        """Nothing to release: each update printed its own line."""


def _progress(total, desc):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="step", disable=not sys.stderr.isatty())
    except ImportError:
        return _Bar(total, desc)


def cmd_quickstart(args):
    from .quickstart import main as quickstart
    quickstart(args.dir)


def _shapes(items):
    """{input name: shape} from NAME=D1,D2,... items."""
    out = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            out[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            sep = ""
        if not sep or not name:
            raise EdgeflowError(f"--input-shape expects NAME=D1,D2,..., got {item!r}")
    return out


def cmd_profile(args):
    from .splitter import measure_profile
    from .splitter.cost import DEFAULT_RUNS
    profile = measure_profile(args.model, signature=args.signature or "infer",
                              inputs=_parse_inputs(args.input) or None, runs=args.runs or DEFAULT_RUNS,
                              delegates=_delegates(args), device=args.name,
                              input_shapes=_shapes(args.input_shape) or None)
    profile.save(args.output)
    total = sum(profile.seconds.values())
    print(f"profiled {len(profile.seconds)} ops of {args.model} on {profile.device}: "
          f"{total * 1e3:.3f} ms per run (per-op medians of {profile.runs} runs) -> {args.output}")


def cmd_split(args):
    from .splitter.package import split_file
    link = args.link
    overrides = [f"{k}={v}" for k, v in (("up", args.up), ("down", args.down), ("rtt", args.rtt)) if v]
    if overrides:
        link = ",".join(([link] if link else []) + overrides)
    elif not link:
        link = "4g"
    result = split_file(args.model, args.output, link=link, objective=args.objective,
                        device_profile=args.device_profile, server_profile=args.server_profile,
                        cut=[c for c in (args.cut or "").split(",") if c] or None,
                        input_shapes=_shapes(args.input_shape) or None, compression=args.compression,
                        memory_budget=int(args.memory_budget * 2**20) if args.memory_budget else None,
                        device_graph=args.device_graph, cloud_graph=args.cloud_graph,
                        model_id=args.model_id, signature=args.signature or "infer",
                        device_speed=args.device_speed, server_speed=args.server_speed,
                        train=args.train, labels=args.labels)
    print(result.table)
    print()
    for key in ("device", "cloud", "plan", "svg"):
        print(f"wrote {result.paths[key]}")
    then = (f"train with `edgeflow train {result.paths['device']} --cloud HOST:PORT --data D.npz`"
            if args.train else f"run with `edgeflow run {result.paths['device']} --cloud HOST:PORT`")
    print(f"cloud model id {result.model_id} (sha256 {result.cloud_sha256[:16]}...): serve it with "
          f"`edgeflow serve --model-dir DIR` holding cloud.efl; {then}")


def cmd_serve(args):
    try:
        from .cloud.server import serve
    except ImportError as e:
        raise EdgeflowError(f"edgeflow serve needs the 'cloud' extra: pip install 'edgeflow[cloud]' ({e})")
    serve(args)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="edgeflow", description="Package, inspect, run and benchmark edgeflow models (.efl).")
    parser.add_argument("--version", action="version", version=f"edgeflow {_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("inspect", help="show a model's signatures, ops, tensors and sizes",
                         description="Show a model's signatures, ops by type, tensors, "
                                     "parameters, bytes and arena size.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_accel_args(p)
    p.set_defaults(fn=cmd_inspect)

    p = verbs.add_parser("run", help="run a signature on inputs from .npy files",
                         description="Run a signature; inputs come from .npy files.")
    p.add_argument("model", help="a .efl file")
    _add_inputs_args(p)
    p.add_argument("--output-dir", "-o", help="also save each output as NAME.npy here")
    _add_accel_args(p)
    _add_cloud_args(p)
    p.set_defaults(fn=cmd_run)

    p = verbs.add_parser("bench", help="time a model as TFLite's benchmark_model does",
                         description="Time init, first run and steady-state runs; inputs not "
                                     "given are random, dynamic dimensions 1.")
    p.add_argument("model", help="a .efl file")
    _add_inputs_args(p)
    p.add_argument("--runs", type=_positive, default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=_non_negative, default=3, help="untimed runs first (default 3)")
    p.add_argument("--top", type=_positive, default=10, help="ops to list by time (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_accel_args(p)
    _add_cloud_args(p)
    p.set_defaults(fn=cmd_bench)

    p = verbs.add_parser("convert", help="convert an ONNX model to a .efl package",
                         description="Convert an ONNX model (opset >= 13) to a .efl package: "
                                     "constants folded, BatchNorm folded, activations fused, "
                                     "weights optionally quantized.")
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", help="the .efl file to write (default: MODEL with .efl)")
    p.add_argument("--quantize", choices=["fp16", "int8"],
                   help="store weights as float16, or int8 with per-channel scales")
    p.add_argument("--optimize", action=argparse.BooleanOptionalAction, default=True,
                   help="fold constants and BatchNorm, fuse activations (default: on)")
    p.add_argument("--trainable", action="store_true",
                   help="also make train/save/restore signatures (initializers become variables)")
    p.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy",
                   help="with --trainable: the loss on the first output (default cross_entropy)")
    p.add_argument("--optimizer", default="sgd:0.01", metavar="NAME:LR",
                   help="with --trainable: sgd, momentum, adam, adamw, adagrad or rmsprop, and a "
                        "learning rate (default sgd:0.01)")
    p.add_argument("--freeze", nargs="+", default=[], metavar="NAME",
                   help="with --trainable: initializers to keep constant")
    p.set_defaults(fn=cmd_convert)

    p = verbs.add_parser("train", help="train a model on the device through its train signature",
                         description="Train through the model's 'train' signature on arrays from "
                                     "an .npz file (keys = the signature's input names), with "
                                     "checkpoints to resume from.")
    p.add_argument("model", help="a trainable .efl file")
    p.add_argument("--data", required=True, help=".npz with one array per train input")
    p.add_argument("--epochs", type=_positive, default=1)
    p.add_argument("--batch-size", type=_positive, default=32)
    p.add_argument("--seed", type=int, default=0, help="data order seed (default 0)")
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the last one")
    p.add_argument("--checkpoint-every", type=_positive, default=50, help="steps between checkpoints")
    p.add_argument("-o", "--output", help="export the trained model to this .efl")
    _add_accel_args(p)
    _add_cloud_args(p)
    p.add_argument("--device-id", help="with --cloud: this device's id on the server (default: random); "
                                       "keep it to resume after a restart")
    p.add_argument("--mode", choices=["split", "sync", "async", "fedavg"], default="split",
                   help="with --cloud: split (a device package from `edgeflow split --train`, the "
                        "default), or with a parameter server: sync, async, or fedavg (--epochs rounds "
                        "of --local-epochs each)")
    p.add_argument("--local-epochs", type=_positive, default=1, help="with --mode fedavg: epochs per round")
    p.add_argument("--model-id", help="with sync/async/fedavg: the model's id on the server (default: "
                                      "the file name)")
    p.set_defaults(fn=cmd_train)

    p = verbs.add_parser("quickstart", help="an end-to-end tour: build, convert, run and train models",
                         description="An end-to-end tour: build a small model with the graph "
                                     "API, package, inspect, run and benchmark it; convert an "
                                     "ONNX model; train a model on the device; split a model "
                                     "with a server it starts on 127.0.0.1, for inference and "
                                     "for training.")
    p.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    p.set_defaults(fn=cmd_quickstart)

    p = verbs.add_parser("profile", help="time every op of a model here, for the split planner",
                         description="Run a signature and time every op (medians); write a profile "
                                     "that `edgeflow split --device-profile/--server-profile` reads. "
                                     "Run it on the device and on the server.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("-o", "--output", required=True, help="the profile JSON to write")
    _add_inputs_args(p)
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="random inputs of this shape (default: declared, dynamic dimensions 1)")
    p.add_argument("--runs", type=_positive, help="timed runs (default 20)")
    p.add_argument("--name", help="what to call this machine in the profile (default: its hostname "
                                  "and processor)")
    _add_accel_args(p)
    p.set_defaults(fn=cmd_profile)

    p = verbs.add_parser("split", help="split a model between the device and a cloud server",
                         description="Plan where each op runs (exact minimum cut for the link and "
                                     "the hardware) and write OUTDIR/device.efl, OUTDIR/cloud.efl, "
                                     "OUTDIR/plan.json and OUTDIR/plan.svg. Serve cloud.efl with "
                                     "`edgeflow serve`; run device.efl with --cloud HOST:PORT.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="where to write the packages")
    p.add_argument("--link", help="3g (1.1 Mbps up), 4g (5.85), wifi (18.88), or "
                                  "'up=MBPS,down=MBPS,rtt=SECONDS' (default 4g)")
    p.add_argument("--up", metavar="MBPS", help="uplink bandwidth (overrides --link's)")
    p.add_argument("--down", metavar="MBPS", help="downlink bandwidth (overrides --link's)")
    p.add_argument("--rtt", metavar="SECONDS", help="round-trip time, e.g. 0.05 or 50ms (overrides --link's)")
    p.add_argument("--objective", choices=["latency", "device-time"], default="latency",
                   help="minimize end-to-end latency (default) or the device's busy time")
    p.add_argument("--device-profile", metavar="P", help="op times measured on the device (`edgeflow profile`)")
    p.add_argument("--server-profile", metavar="P", help="op times measured on the server")
    p.add_argument("--device-speed", type=float, default=1.0,
                   help="without a device profile: the device's speed relative to this machine (default 1)")
    p.add_argument("--server-speed", type=float, default=10.0,
                   help="without a server profile: the server's speed relative to this machine (default 10)")
    p.add_argument("--cut", metavar="TENSOR,...", help="cut at these tensors instead of planning")
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
    p.set_defaults(fn=cmd_split)

    p = verbs.add_parser("serve", help="serve cloud packages over gRPC for split models",
                         description="Serve every .efl in a directory over gRPC (service "
                                     "edgeflow.v1.Edgeflow, plus grpc.health.v1) until SIGTERM "
                                     "or Ctrl-C; devices run the rest of their graphs here.")
    p.add_argument("--model-dir", required=True, help="a directory of .efl packages (id: metadata "
                                                       "'edgeflow.model_id', else the file name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; "
                                                        "0.0.0.0 for every interface)")
    p.add_argument("--port", type=_non_negative, default=50051, help="port (default 50051; 0 picks one)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--token-file", metavar="FILE",
                   help="require 'authorization: Bearer <token>' with the token in this file")
    p.add_argument("--max-request-mb", type=float, default=256,
                   help="largest tensor payload of one request, in MiB (default 256)")
    p.add_argument("--max-workers", type=_positive, default=8, help="requests run at once (default 8)")
    p.add_argument("--threads", type=_positive,
                   help="BLAS threads per request (default: the cores / --max-workers, at least 1)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="training state: checkpoints of the models devices train here (split "
                        "training), resumed from on restart")
    p.add_argument("--checkpoint-every", type=_positive, default=1, metavar="K",
                   help="with --state-dir: checkpoint after every K-th training step (default 1)")
    p.add_argument("--parameter-server", choices=["sync", "async", "fedavg"], metavar="MODE",
                   help="also serve the cloud variables of the trainable packages to devices that push "
                        "gradients: sync, async or fedavg (checkpoints in --state-dir)")
    p.add_argument("--replicas", type=_positive, default=1,
                   help="with --parameter-server sync/fedavg: devices per step or round (default 1)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds calls in flight get to finish on shutdown (default 5)")
    p.set_defaults(fn=cmd_serve)
    return parser


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value


def _version():
    from . import __version__
    return __version__


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except BrokenPipeError:  # `edgeflow inspect m.efl | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (EdgeflowError, OSError) as e:
        print(f"edgeflow {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
