"""`edgeflow serve`: the command's flags checked and turned into a Server (server.py), its
backend (this process, batching, the prediction cache, Ray) and a parameter service, run
until SIGTERM or SIGINT."""
import ctypes
import logging
import os
import pathlib
import signal
import threading

from ..errors import EdgeflowError
from . import logs
from .budget import DEFAULT_WAIT_S
from .identity import Tokens
from .metrics import Combined, PrometheusMetrics
from .server import DEFAULT_MAX_DEVICES, Server

_log = logging.getLogger("edgeflow.cloud")


def _read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise EdgeflowError(f"{what}: cannot read {path!r} ({e.strerror})") from None


def _trainable(path):
    from ..format import metadata, reader
    try:
        model = reader.load(path)
        return metadata.role(model) != "device" and any(s.key == "train" for s in model.signatures)
    except EdgeflowError:
        return False  # load_models logs and skips it


def _mib(mb):
    return None if mb is None else int(mb * (1 << 20))


def _batching(args):
    """(Server's `batching`, `cache_entries`) from --slo-ms, --max-batch, --batch-wait-ms and
    --cache-entries, checked."""
    slo, most, wait = (getattr(args, name, None) for name in ("slo_ms", "max_batch", "batch_wait_ms"))
    entries = getattr(args, "cache_entries", 0) or 0
    for flag, value in (("--slo-ms", slo), ("--max-batch", most), ("--batch-wait-ms", wait)):
        if value is not None and not value > 0:
            raise EdgeflowError(f"expected {flag} > 0, got {value}")
    if not entries >= 0:
        raise EdgeflowError(f"expected --cache-entries >= 0 (0: no cache), got {entries}")
    if slo is None:
        given = [flag for flag, value in (("--max-batch", most), ("--batch-wait-ms", wait)) if value is not None]
        if given:
            raise EdgeflowError(f"{' and '.join(given)}: only with --slo-ms, which turns batching on")
        return None, entries
    return dict(slo_ms=slo, max_batch=most or 64, max_wait_ms=2.0 if wait is None else wait), entries


def _return_freed_memory():
    """Have glibc's malloc map every block of 1 MiB or more on its own, so that freeing it
    returns it to the system (by default the threshold grows to 32 MiB as blocks are freed,
    and freed heap memory stays in the process: RSS would keep what a past request used),
    and keep two heaps, not eight per core."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX: worker threads share heaps, not one each to keep freed memory in
    except (OSError, AttributeError):
        pass  # not glibc: its allocator decides


def _aggregate(args):
    """Devices per sync step or FedAvg round: --aggregate, or --replicas without --ray (its
    meaning before the Ray replicas came)."""
    aggregate = getattr(args, "aggregate", None)
    if aggregate is None and not getattr(args, "ray", None):
        aggregate = getattr(args, "replicas", None)
    return aggregate or 1


def _accel(args):
    """(accel, device, precision) that --accel, --device and --precision ask for, or None
    (numpy kernels)."""
    accel = getattr(args, "accel", None) or "none"
    if accel == "none":
        return None
    return accel, getattr(args, "device", None), getattr(args, "precision", "fp32")


def _ray_backend(args, state_dir, checkpoint_every, max_devices, threads):
    """The RayBackend `--ray` asks for, or None."""
    if not getattr(args, "ray", None):
        if getattr(args, "autoscale", None):
            raise EdgeflowError("--autoscale needs --ray")
        return None
    try:
        from .replicas import RayBackend
        import ray  # noqa: F401  (the extra's presence, said in one line)
    except ImportError as e:
        raise EdgeflowError(f"--ray needs the 'ray' extra: pip install 'edgeflow[ray]' ({e})") from None
    autoscale = None
    if args.autoscale:
        try:
            low, high = (int(v) for v in args.autoscale.split(":"))
        except ValueError:
            raise EdgeflowError(f"--autoscale: expected MIN:MAX, two integers, got {args.autoscale!r}") from None
        if not 0 <= low <= high or high < 1:
            raise EdgeflowError(f"--autoscale: expected 0 <= MIN <= MAX and MAX >= 1, got {args.autoscale!r}")
        autoscale = low, high
    if args.autoscale and args.replicas:
        raise EdgeflowError("give --replicas or --autoscale, not both")
    if not args.replica_cpus > 0:
        raise EdgeflowError(f"--replica-cpus: expected a number > 0, got {args.replica_cpus}")
    return RayBackend(None if args.ray == "local" else args.ray, replicas=args.replicas or 1, autoscale=autoscale,
                      replica_cpus=args.replica_cpus, threads=threads or 1, state_dir=state_dir,
                      checkpoint_every=checkpoint_every, max_devices=max_devices,
                      target_ongoing=args.target_ongoing, accel=_accel(args))


def serve(args):
    """`edgeflow serve`: host the models in args.model_dir until SIGTERM or SIGINT."""
    logs.install(getattr(args, "log_format", "text"), (getattr(args, "log_level", None) or "info").upper())
    token = None
    if args.token_file:
        text = _read_file(args.token_file, "--token-file").decode("utf-8", "replace")
        token = Tokens.parse(text, f"--token-file {args.token_file!r}")  # one shared token, or per device
    if not args.max_request_mb > 0 or not args.grace >= 0:
        raise EdgeflowError(f"expected --max-request-mb > 0 and --grace >= 0, got {args.max_request_mb} "
                            f"and {args.grace}")
    budget_mb, model_mb = getattr(args, "memory_budget_mb", None), getattr(args, "model_memory_mb", None)
    wait_s = getattr(args, "memory_wait", DEFAULT_WAIT_S)
    if any(v is not None and not v > 0 for v in (budget_mb, model_mb)) or not wait_s >= 0:
        raise EdgeflowError(f"expected --memory-budget-mb and --model-memory-mb > 0 and --memory-wait >= 0, "
                            f"got {budget_mb}, {model_mb} and {wait_s}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise EdgeflowError("--tls-cert and --tls-key go together")
    tls = (_read_file(args.tls_cert, "--tls-cert"), _read_file(args.tls_key, "--tls-key")) \
        if args.tls_cert else None
    client_ca = getattr(args, "tls_client_ca", None)
    if client_ca and not tls:
        raise EdgeflowError("--tls-client-ca needs --tls-cert and --tls-key")
    client_ca = _read_file(client_ca, "--tls-client-ca") if client_ca else None
    processes = getattr(args, "processes", None) or 1
    if processes > 1:  # the flags above checked once here; each process reads them again
        from .processes import serve_processes
        trainable = [p.name for p in sorted(pathlib.Path(args.model_dir).glob("*.efl")) if _trainable(p)]
        return serve_processes(args, processes, trainable)
    metrics = PrometheusMetrics() if getattr(args, "metrics_port", None) is not None else None
    board = _tensorboard(getattr(args, "logdir", None))
    ray_backend = _ray_backend(args, args.state_dir, args.checkpoint_every,
                               getattr(args, "max_devices", None) or DEFAULT_MAX_DEVICES,
                               getattr(args, "threads", None))
    ps_shards = getattr(args, "ps_shards", None)
    if ps_shards and not (ray_backend and getattr(args, "parameter_server", None)):
        raise EdgeflowError("--ps-shards needs --ray and --parameter-server")
    parameter_server = None
    if getattr(args, "parameter_server", None):
        from .ps.service import ParameterService
        trainable = {p.stem: str(p) for p in sorted(pathlib.Path(args.model_dir).glob("*.efl"))
                     if _trainable(p)}
        if not trainable:
            raise EdgeflowError(f"--parameter-server: no trainable package (a 'train' signature) in "
                                f"{args.model_dir}")
        if ray_backend is not None:  # the shards are Ray actors: connect before they are made
            ray_backend.connect()
        parameter_server = ParameterService(
            trainable, mode=args.parameter_server, replicas=_aggregate(args),
            checkpoint_dir=os.path.join(args.state_dir, "ps") if args.state_dir else None,
            checkpoint_every=args.checkpoint_every, max_devices=getattr(args, "max_devices", None) or 4096,
            ray_shards=(ps_shards or 1) if ray_backend is not None else None)
        _log.info("parameter server (%s, %d devices per step) for %s%s", args.parameter_server, _aggregate(args),
                  sorted(trainable), f", on {ps_shards or 1} Ray shard(s) each" if ray_backend is not None else "")
    batching, cache_entries = _batching(args)
    delegates = []
    accel = _accel(args)
    if accel and ray_backend is None:  # one delegate, opened now: no device fails the start
        from ..accel import delegates_for
        delegates = delegates_for(*accel)
        if delegates:
            _log.info("models run on OpenCL device %r (%s)", delegates[0].device_name, delegates[0].precision)
        else:
            _log.info("--accel auto: no OpenCL device found, models run on numpy kernels")
    server = Server(args.model_dir, host=args.host, port=args.port, token=token, tls=tls,
                    max_workers=args.max_workers, max_request_bytes=int(args.max_request_mb * (1 << 20)),
                    state_dir=args.state_dir, checkpoint_every=args.checkpoint_every,
                    parameter_server=parameter_server, threads=getattr(args, "threads", None),
                    tls_client_ca=client_ca, max_devices=getattr(args, "max_devices", None) or DEFAULT_MAX_DEVICES,
                    memory_budget_bytes=_mib(budget_mb), model_memory_bytes=_mib(model_mb),
                    memory_wait_s=wait_s, batching=batching, cache_entries=cache_entries,
                    metrics=Combined(metrics, board) if metrics and board else metrics or board,
                    ray=ray_backend, delegates=delegates, reuse_port=getattr(args, "reuse_port", False))
    _return_freed_memory()
    if batching:
        _log.info("adaptive batching on: batches within %g ms, at most %d rows, waiting up to %g ms",
                  batching["slo_ms"], batching["max_batch"], batching["max_wait_ms"])
    if cache_entries:
        _log.info("prediction cache on: the replies of the last %d distinct requests", cache_entries)
    _log.info("memory budget %d MiB (%s per model)", server.budget.limit >> 20,
              f"{server.budget.model_limit >> 20} MiB" if model_mb else "all of it")
    for model in server.models.all():
        default = len(server.models.versions(model.id)) > 1 and server.models[model.id] is model
        _log.info("model %r: sha256 %s%s, %d bytes, from %s", model.id, model.sha256,
                  " (the default version)" if default else "", model.file_bytes, model.source)
    if metrics is not None:
        _export(metrics, getattr(args, "metrics_host", "127.0.0.1"), args.metrics_port)
    server.start()
    label = getattr(args, "process_label", None)  # one of --processes N (processes.py announces the port)
    _log.info("%s %d models on %s%s%s%s", f"process {label}: listening with" if label else "serving",
              len(server.models), server.address, " with TLS" if tls else "",
              ", client certificates required" if client_ca else "",
              "" if token is None else ", per-device tokens required" if token.per_device else ", token required")
    if getattr(args, "on_serving", None):
        args.on_serving(server)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        pass
    _log.info("stopping: calls in flight get %.0f s to finish", args.grace)
    server.stop(args.grace)
    if metrics is not None:
        metrics.close()
    if board is not None:
        board.close()


def _tensorboard(logdir):
    """The TensorBoardMetrics `--logdir` asks for (logged where), or None."""
    if not logdir:
        return None
    from .tensorboard import TensorBoardMetrics
    board = TensorBoardMetrics(logdir)
    _log.info("TensorBoard events in %s (tensorboard --logdir %s)", logdir, logdir)
    return board


def _export(metrics, host, port):
    """Serve `metrics` over HTTP on `host`:`port` and log where."""
    try:
        port = metrics.serve_http(port, host)
    except OSError as e:
        raise EdgeflowError(f"--metrics-port: cannot listen on {host}:{port} ({e.strerror})") from None
    _log.info("metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)
