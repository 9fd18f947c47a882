"""`edgeflow serve --processes N`: N server processes behind one port.

One Python process serves a few hundred requests a second however many cores it has:
each request's Python work (gRPC's handler, the checks, the interpreter's loop over its
ops, the OpenCL kernel launches) holds the interpreter lock, and with many requests in
flight their threads queue for it. Measured on a 16-core machine, one process served
MobileNetV2 to 32 devices at 101 requests/s on 10 cores (11 ms a run alone), and on the
GPU at 218/s where one batch of 32 runs in 10 ms.

So the server runs as N processes, as gRPC's own multiprocessing example does: each a
whole server (its models, batching, cache, metrics exporter), all binding the same port
with SO_REUSEPORT, and the kernel spreads incoming connections over them (a device's
channel stays with the process that accepted it). This parent reserves the port first
(so that port 0 picks one port for all), starts the processes, announces the address
once all of them listen, replaces one that dies, and stops them all on SIGTERM/SIGINT.

State that must live in one place cannot be split over processes: split training's
variables and the parameter server's. Those need `--ray ADDRESS`, where the state lives in
Ray actors that every front end shares.
"""
import copy
import logging
import multiprocessing
import queue
import signal
import threading
import time

from ..errors import EdgeflowError

_log = logging.getLogger("edgeflow.cloud")

# A process that dies this soon after its start, twice in a row, stops the server: it
# would die again (a bad flag, a port taken), not serve.
EARLY_DEATH_S = 10.0


def reserve_port(host, port):
    """A socket bound to (host, port) with SO_REUSEPORT, not listening, so that the server
    processes bind the same port beside it (port 0: the one it picked); EdgeflowError if
    the address cannot be bound."""
    from .server import bind_socket
    return bind_socket(host, port, reuse_port=True)


def check(args, trainable):
    """EdgeflowError where --processes cannot serve these flags: state kept in one process
    (`trainable`: the trainable packages' names) without a Ray cluster to keep it."""
    ray = getattr(args, "ray", None)
    if ray == "local":
        raise EdgeflowError("--processes with --ray: give the cluster's ADDRESS (`ray start --head`), which every "
                            "process joins; without one each process would start a Ray instance of its own")
    if ray:  # the state lives in the cluster's actors, shared by every process
        return
    if getattr(args, "parameter_server", None):
        raise EdgeflowError("--parameter-server keeps the variables in one process: use --processes 1, or "
                            "--ray ADDRESS (shards in Ray actors)")
    if trainable:
        raise EdgeflowError(f"{', '.join(trainable)}: split training keeps a model's variables in one process: "
                            "use --processes 1, --ray ADDRESS (trainer actors every process shares), or a "
                            "model directory without trainable packages")


def _child(args, index, ready):
    from .serve_command import serve
    args.on_serving = lambda server: ready.put((index, len(server.models)))
    serve(args)


def serve_processes(args, count, trainable):
    """Serve `args` (edgeflow serve's) in `count` processes on one port until SIGTERM or
    SIGINT, replacing a process that dies."""
    check(args, trainable)
    reserved = reserve_port(args.host, args.port)
    port = reserved.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")  # no gRPC state carried over from this process
    ready = ctx.Queue()

    def start(index):
        child = copy.copy(args)
        child.processes, child.port, child.reuse_port = 1, port, True
        if not args.threads:  # BLAS threads: the cores shared by every process's requests
            from ..interp.threads import available_cores
            child.threads = max(1, available_cores() // (args.max_workers * count))
        child.process_label = f"{index + 1}/{count}"
        if not getattr(args, "memory_budget_mb", None):  # half the machine's memory, shared
            from .budget import default_bytes
            child.memory_budget_mb = default_bytes() / count / (1 << 20)
        if args.metrics_port:  # each its own exporter: P, P+1, ...
            child.metrics_port = args.metrics_port + index
        proc = ctx.Process(target=_child, args=(child, index, ready), name=f"edgeflow-serve-{index + 1}")
        proc.start()
        return proc, time.monotonic()

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    procs = [start(k) for k in range(count)]
    early = [0] * count
    try:
        models = _wait_ready(ready, procs, stopping)
        if models is None:
            return
        host = f"[{args.host}]" if ":" in args.host else args.host
        _log.info("serving %d models on %s:%d in %d processes (SO_REUSEPORT: connections spread over them)",
                  models, host, port, count)
        while not stopping.wait(0.5):
            for k, (proc, started) in enumerate(procs):
                if proc.is_alive():
                    continue
                early[k] = early[k] + 1 if time.monotonic() - started < EARLY_DEATH_S else 0
                if early[k] >= 2:
                    raise EdgeflowError(f"server process {k + 1} exited with code {proc.exitcode} twice within "
                                        f"{EARLY_DEATH_S:g} s of its start (see its log above)")
                _log.warning("server process %d (pid %d) exited with code %s: starting another", k + 1, proc.pid,
                             proc.exitcode)
                procs[k] = start(k)
    finally:
        _stop([p for p, _ in procs], args.grace)
        reserved.close()


def _wait_ready(ready, procs, stopping):
    """The model count once every process listens; None if stopped first; EdgeflowError if
    one exits before."""
    waiting = set(range(len(procs)))
    models = 0
    while waiting:
        if stopping.is_set():
            return None
        try:
            index, models = ready.get(timeout=0.5)
            waiting.discard(index)
        except queue.Empty:
            dead = [k for k in waiting if not procs[k][0].is_alive()]
            if dead:
                raise EdgeflowError(f"server process {dead[0] + 1} exited with code {procs[dead[0]][0].exitcode} "
                                    "before it listened (see its log above)") from None
    return models


def _stop(procs, grace):
    for proc in procs:
        if proc.is_alive():
            proc.terminate()  # SIGTERM: the process stops as `edgeflow serve` does, calls get `grace`
    deadline = time.monotonic() + grace + 30
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
