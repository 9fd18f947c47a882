"""`edgeflow serve`: serve cloud packages over gRPC until SIGTERM or Ctrl-C."""
import argparse

from ..errors import EdgeflowError
from .arguments import add_accel_args, non_negative, positive

EXAMPLES = """\
examples:
  embedded, one process (the default):
    edgeflow serve --model-dir models/ --slo-ms 100 --max-workers 64 --metrics-port 9100
  on a GPU server: batches on the OpenCL device (per-row cost falls with the batch), from
  4 processes on one port (one Python process serves a few hundred requests/s)
    edgeflow serve --model-dir models/ --accel opencl --slo-ms 500 --max-workers 64 --processes 4
  on a local Ray instance this process starts (replicas share this machine's cores):
    edgeflow serve --model-dir models/ --ray --replicas 2 --state-dir state/
  on a Ray cluster:
    ray start --head --port 6379              # on the head node
    ray start --address HEAD:6379             # on each other node
    edgeflow serve --model-dir models/ --ray HEAD:6379 --autoscale 1:8 --host 0.0.0.0
                                              # front ends on any nodes: they share the replicas
"""


def add_parser(verbs):
    p = verbs.add_parser("serve", help="serve cloud packages over gRPC for split models",
                         description="Serve every .efl in a directory over gRPC (service "
                                     "edgeflow.v1.Edgeflow, plus grpc.health.v1) until SIGTERM "
                                     "or Ctrl-C; devices run the rest of their graphs here.",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True,
                   help="a directory of .efl packages: cloud packages and plain models (id: metadata "
                        "'edgeflow.model_id', else the file name); device packages are skipped. Files "
                        "of one id with different bytes are versions of that model, served side by "
                        "side: a device gets the version its package names (its sha256), a request "
                        "naming none the newest file (by modification time)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; "
                                                        "0.0.0.0 for every interface)")
    p.add_argument("--port", type=non_negative, default=50051, help="port (default 50051; 0 picks one)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-client-ca", metavar="PEM",
                   help="with --tls-cert: require client certificates signed by this CA (mutual TLS); "
                        "a device's id is its certificate's common name (CN)")
    p.add_argument("--token-file", metavar="FILE",
                   help="require 'authorization: Bearer <token>': the file holds one shared token, or "
                        "one line per device, 'TOKEN DEVICE_ID [MODEL,...]' (the models it may use; "
                        "default all), '#' starting a comment")
    p.add_argument("--max-request-mb", type=float, default=256,
                   help="largest tensor payload of one request, in MiB (default 256)")
    p.add_argument("--memory-budget-mb", type=float, metavar="MB",
                   help="memory the hosted models and the requests in flight may use together, in MiB "
                        "(default: half the machine's or the container's memory); a request that would "
                        "pass it waits, then gets RESOURCE_EXHAUSTED")
    p.add_argument("--model-memory-mb", type=float, metavar="MB",
                   help="memory one model may use, in MiB (default: the whole --memory-budget-mb)")
    p.add_argument("--memory-wait", type=float, default=10.0, metavar="S",
                   help="seconds a request waits for memory before RESOURCE_EXHAUSTED (default 10)")
    p.add_argument("--max-workers", type=positive, default=8, help="requests run at once (default 8)")
    p.add_argument("--processes", type=positive, default=1, metavar="N",
                   help="serve from N processes on one port (SO_REUSEPORT; the kernel spreads the devices' "
                        "connections over them), each with its own models, batching and --max-workers: one "
                        "process's Python work caps it at a few hundred requests/s whatever the cores "
                        "(default 1; with --metrics-port P, process k exports on P+k-1)")
    p.add_argument("--threads", type=positive,
                   help="BLAS threads per request (default: the cores / --max-workers, at least 1)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="training state: checkpoints of the models devices train here (split "
                        "training), resumed from on restart")
    p.add_argument("--max-devices", type=positive, metavar="N",
                   help="devices whose training state each model keeps: split training (default 256; a "
                        "new one beyond them replaces one idle for an hour, or is refused with "
                        "RESOURCE_EXHAUSTED) and the parameter server (default 4096; a new one is refused)")
    p.add_argument("--checkpoint-every", type=positive, default=1, metavar="K",
                   help="with --state-dir: checkpoint after every K-th training step (default 1)")
    p.add_argument("--parameter-server", choices=["sync", "async", "fedavg"], metavar="MODE",
                   help="also serve the cloud variables of the trainable packages to devices that push "
                        "gradients: sync, async or fedavg (checkpoints in --state-dir)")
    p.add_argument("--aggregate", type=positive, metavar="N",
                   help="with --parameter-server sync/fedavg: devices per step or round (default 1; "
                        "--replicas N means the same without --ray)")
    ray = p.add_argument_group("scale-out on Ray", "Run the models on a Ray cluster behind this front end "
                               "(the same protocol, checks and statuses); start more front ends on other "
                               "nodes with the same --ray ADDRESS and --model-dir: they share the replicas "
                               "and the training state. Needs the 'ray' extra.")
    ray.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                     help="run the models as Ray Serve replicas and keep each trainable model's state in "
                          "a Ray actor: on the cluster at ADDRESS ('auto', HOST:PORT of `ray start --head`, "
                          "ray://...), or without ADDRESS on a local Ray instance started here")
    ray.add_argument("--replicas", type=positive, metavar="N",
                     help="with --ray: replicas of each model (default 1)")
    ray.add_argument("--autoscale", metavar="MIN:MAX",
                     help="with --ray: scale each model's replicas between MIN and MAX on the requests "
                          "each has in flight (--target-ongoing), instead of --replicas")
    ray.add_argument("--target-ongoing", type=positive, default=4, metavar="N",
                     help="with --autoscale: requests in flight per replica to scale at (default 4)")
    ray.add_argument("--replica-cpus", type=float, default=1.0, metavar="C",
                     help="with --ray: CPUs Ray reserves for each replica (default 1); it places replicas "
                          "on the nodes by them")
    ray.add_argument("--ps-shards", type=positive, metavar="N",
                     help="with --ray and --parameter-server: shard each model's cloud variables over N Ray "
                          "actors (default 1; --state-dir, on a disk every node reaches, holds their "
                          "checkpoints), as TensorFlow's ps tasks; devices push and pull per shard")
    batching = p.add_argument_group("batching and caching", "Run requests of many devices for one model "
                                    "as one batch (Clipper's adaptive batching), and answer repeated "
                                    "inputs from a cache of replies.")
    batching.add_argument("--slo-ms", type=float, metavar="MS",
                          help="turn adaptive batching on: requests for the same model, fetches and input "
                               "shapes (past the batch axis) run as one batch, whose size (in rows) grows "
                               "while a batch runs within MS milliseconds and shrinks by 10%% when one "
                               "does not; a batch holds at most --max-workers requests")
    batching.add_argument("--max-batch", type=int, metavar="N",
                          help="with --slo-ms: the most rows of a batch (default 64)")
    batching.add_argument("--batch-wait-ms", type=float, metavar="MS",
                          help="with --slo-ms: how long a batch's first request waits for others before "
                               "it runs partly full (default 2)")
    batching.add_argument("--cache-entries", type=int, default=0, metavar="N",
                          help="keep the replies of the last N distinct requests (model, fetches and "
                               "input bytes) and answer a repeat from them without running it (default "
                               "0: no cache)")
    add_accel_args(p.add_argument_group(
        "accelerator", "Run the models' supported ops on the server's OpenCL device (a GPU), shared by its "
                       "requests; with --ray each replica opens the device on its own node."))
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds calls in flight get to finish on shutdown (default 5)")
    p.add_argument("--metrics-port", type=non_negative, metavar="PORT",
                   help="export Prometheus metrics (requests, latencies, bytes, batches, memory) over "
                        "HTTP at /metrics on this port (0 picks one; the log says which); needs "
                        "pip install 'edgeflow[metrics]'")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics exporter listens on (default 127.0.0.1)")
    p.add_argument("--logdir", metavar="DIR",
                   help="write the same measurements (requests, latencies, bytes, batch sizes, training "
                        "steps applied) as TensorBoard event files into DIR (tensorboard --logdir DIR); "
                        "needs pip install 'edgeflow[tensorboard]'")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text (default) or one JSON object per line; each line about a "
                        "request carries its request id")
    p.set_defaults(fn=cmd_serve)


def cmd_serve(args):
    try:
        from ..cloud.serve_command import serve
    except ImportError as e:
        raise EdgeflowError(f"edgeflow serve needs the 'cloud' extra: pip install 'edgeflow[cloud]' ({e})")
    serve(args)
