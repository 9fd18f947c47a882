"""Model replicas and training state on Ray: `edgeflow serve --model-dir D --ray [ADDRESS]`.

The gRPC front end stays what it is (tokens, TLS, identities, checks, statuses: server.py);
`RayBackend` is where its checked requests run:

- Each hosted version of a model that does not train is a Ray Serve application
  (`app_name`: the sanitised id and 16 hex digits of the package's SHA-256) with one
  deployment of `ModelReplica`s: `replicas` of them, or autoscaled between bounds on
  the requests each has ongoing (Serve's queue-length policy). Ray places them across
  the cluster's nodes by the CPUs each asks for (`replica_cpus`). A replica loads the
  package from its bytes (passed with the deployment, so nodes need no shared disk) and
  batches the requests it has in flight (batching.Batching) when the front end batches.
- A trainable package's state (its variables, optimizer slots and exactly-once table:
  steps.StepHost) lives in one detached, named Ray actor (`Trainer`) that Ray restarts
  when it dies; it resumes from its checkpoint in `state_dir` (which every node must
  reach: a shared disk on a real cluster). Every request for a trainable model goes to it,
  so inference sees the trained variables.

Front ends are interchangeable: the first to attach deploys the applications and creates
the actors, later ones (on any node: `edgeflow serve --ray ADDRESS`) find them by name.
A request whose replica dies is retried (inference runs nothing twice that matters) up
to `retries` times, then answered UNAVAILABLE (backends.Unavailable), never with another
request's answer; a training round whose actor dies is answered UNAVAILABLE, and the
device retries it (steps.py: a retried round is applied once; a round the restarted
actor lost makes the device run its step again).
"""
import asyncio
import logging
import os
import threading

from ..errors import EdgeflowError
from .backends import Local, Unavailable
from .budget import Reservation
from .metrics import NO_METRICS, Metrics
from .steps import state_name

NAMESPACE = "edgeflow"
# ray.exceptions that say the replica or its node is gone or did not answer in time (not
# every Ray version has all of them).
_LOST = ("RayActorError", "WorkerCrashedError", "ObjectLostError", "GetTimeoutError", "NodeDiedError")
_log = logging.getLogger("edgeflow.cloud")


def app_name(model):
    """The Serve application (and trainer actor) name of a hosted model version."""
    return f"ef-{state_name(model.id, 40)}-{model.sha256[:16]}"


def connect(address=None, init_options=None):
    """Connect this process to Ray in NAMESPACE, unless it is: to the cluster at `address`,
    or to a local instance started here (None: always a new one, never a cluster that
    `ray start` left on this machine, which Ray's own default would join). True when this
    call started one."""
    import ray
    if ray.is_initialized():
        return False
    ray.init("local" if address is None else address,
             **{"namespace": NAMESPACE, "log_to_driver": False, "include_dashboard": False, **(init_options or {})})
    return address is None


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _catching(errors, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (reported by the thread that waits)
        errors.append(e)


def _hosted(package, model_id, delegates=()):
    from .models import load_models
    hosted = load_models(models={model_id: package}, delegates=delegates)
    return hosted, hosted[model_id]


class _Batches(Metrics):
    """What a replica's batching reports, kept until the next answer carries it to the front
    end's metrics."""

    def __init__(self):
        self.sizes, self.depth, self._lock = [], 0, threading.Lock()

    def batch(self, model, size):
        with self._lock:
            self.sizes.append(size)

    def queue(self, model, depth):
        self.depth = depth

    def take(self):
        """(the batch sizes since the last take, the queue depth now)."""
        with self._lock:
            sizes, self.sizes = self.sizes, []
        return sizes, self.depth


class ModelReplica:
    """One replica of a model version (a Serve deployment's class): runs requests on the
    model's interpreters in a thread pool, batched when `batching` is given, with the
    delegates `accel` = (accel, device, precision) names (accel.delegates_for), made here,
    on the replica's node."""

    def __init__(self, package, model_id, batching=None, threads=1, concurrency=8, accel=None):
        from concurrent.futures import ThreadPoolExecutor
        from ray import serve
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(threads)  # BLAS: `threads` per request, not every core each
        except ImportError:
            pass
        delegates = ()
        if accel:
            from ..accel import delegates_for
            delegates = delegates_for(*accel)
        hosted, self.model = _hosted(package, model_id, delegates)
        self.backend = Local(hosted)
        self.stats = _Batches()
        if batching:
            from .batching import Batching
            self.backend = Batching(self.backend, metrics=self.stats, **batching)
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="edgeflow-replica")
        self.name = serve.get_replica_context().replica_id.to_full_id_str()

    async def run(self, fetches, feeds, encoding=""):
        """({name: array} of `fetches`, this replica's name, its resident bytes, the sizes
        of the batches it ran since its last answer and the requests waiting now)."""
        outputs = await asyncio.get_running_loop().run_in_executor(
            self.pool, lambda: self.backend.run(self.model, fetches, feeds, Reservation(None, self.model.id),
                                                encoding))
        return outputs, self.name, _rss_bytes(), *self.stats.take()

    def info(self):
        import ray
        return {"replica": self.name, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


class Trainer:
    """A trainable model version's one copy of its variables (a Ray actor): split-training
    rounds and the requests that read the trained variables."""

    def __init__(self, package, model_id, state_dir=None, checkpoint_every=1, max_devices=256):
        hosted, self.model = _hosted(package, model_id)
        self.local = Local(hosted, state_dir, checkpoint_every, max_devices)
        self.model.step_host(state_dir, checkpoint_every, max_devices=max_devices)  # resumes from state_dir

    def run(self, fetches, feeds, encoding=""):
        return self.model.run(fetches, feeds, Reservation(None, self.model.id), encoding), _rss_bytes()

    def round(self, device_id, step, feeds, fetches):
        return self.local.round(self.model, device_id, step, feeds, fetches), _rss_bytes()

    def checkpoint(self):
        self.local.close()

    def info(self):
        return {"pid": os.getpid(), "updates": self.model.steps.updates}


class RayBackend:
    """Runs a server's requests on a Ray cluster (see the module's docstring).

    `address`: a running cluster's ('auto', 'host:port' or 'ray://...'); None starts a local
    Ray instance in this process (shut down by close()). `replicas`: Serve replicas per
    model, or `autoscale=(min, max)` on `target_ongoing` requests per replica.
    `replica_cpus`: the CPUs Ray reserves for each (its BLAS and interpreters use
    `threads`). `state_dir`, `checkpoint_every`, `max_devices`: the trainer actors' (see
    steps.StepHost). `max_ongoing`: requests a replica takes at once (it batches them); the
    rest wait in the front end's Serve router, which backs off and retries (at 16, 32
    devices on MobileNetV2 got 13 requests/s, at 64 35/s). `timeout_s`: how long a
    request waits for its replica;
    `deploy_timeout_s`: for a model's replicas to start (EdgeflowError past it: the cluster
    cannot place them). `accel`: (accel, device, precision) of the delegates each replica
    runs its models with (accel.delegates_for; None: numpy kernels); trainer actors run
    on the CPU.
    """

    def __init__(self, address=None, replicas=1, autoscale=None, replica_cpus=1.0, threads=1,
                 state_dir=None, checkpoint_every=1, max_devices=256, timeout_s=60.0, retries=2,
                 target_ongoing=4, max_ongoing=64, init_options=None, deploy_timeout_s=120.0, accel=None):
        if replicas < 1 or (autoscale and not 0 <= autoscale[0] <= autoscale[1] >= 1):
            raise EdgeflowError(f"expected replicas >= 1 and autoscale bounds 0 <= min <= max (max >= 1), got "
                                f"{replicas} and {autoscale}")
        self.address, self.replicas, self.autoscale = address, replicas, autoscale
        self.replica_cpus, self.threads, self.target_ongoing, self.max_ongoing = \
            replica_cpus, threads, target_ongoing, max_ongoing
        self.state_dir = os.path.abspath(state_dir) if state_dir else None
        self.checkpoint_every, self.max_devices = checkpoint_every, max_devices
        self.timeout_s, self.retries, self.deploy_timeout_s = timeout_s, retries, deploy_timeout_s
        self.init_options = init_options or {}
        self.accel = tuple(accel) if accel and accel[0] != "none" else None
        self.metrics = NO_METRICS
        self._handles, self._trainers = {}, {}  # by (id, sha256)
        self._started_ray = False
        self._lock = threading.Lock()

    # -- attaching ------------------------------------------------------------------------
    def connect(self):
        """Connect this process to Ray (see connect); attach does, and whoever needs Ray
        before it (the parameter server's shards)."""
        self._started_ray = connect(self.address, self.init_options) or self._started_ray

    def attach(self, models, metrics=NO_METRICS, batching=None):
        """Connect to Ray, then deploy (or find) a Serve application per model version that
        does not train and a trainer actor per one that does."""
        import ray
        from ray import serve
        self.metrics = metrics
        self.connect()
        serve.start(proxy_location="Disabled")  # no HTTP proxy: the gRPC front end is ours
        running = set(serve.status().applications)
        for model in models.all():
            key = model.id, model.sha256
            package = bytes(model.package)
            if model.trainable:
                if self.state_dir is None:
                    _log.warning("model %r trains on Ray without --state-dir: a restarted trainer actor "
                                 "starts from the package's variables", model.id)
                actor = ray.remote(Trainer).options(
                    name=app_name(model), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                    max_restarts=-1, num_cpus=0)
                self._trainers[key] = actor.remote(package, model.id, self.state_dir, self.checkpoint_every,
                                                   self.max_devices)
                continue
            name = app_name(model)
            if name not in running:
                self._deploy(name, package, model.id, batching)
                _log.info("model %r (sha256 %s...): deployed as Ray Serve application %r", model.id,
                          model.sha256[:16], name)
            else:
                _log.info("model %r (sha256 %s...): Ray Serve application %r is running: using it", model.id,
                          model.sha256[:16], name)
            self._handles[key] = serve.get_deployment_handle("model", app_name=name)

    def _deploy(self, name, package, model_id, batching):
        import ray
        from ray import serve
        scale = dict(num_replicas=self.replicas) if not self.autoscale else dict(autoscaling_config={
            "min_replicas": self.autoscale[0], "max_replicas": self.autoscale[1],
            "target_ongoing_requests": self.target_ongoing})
        deployment = serve.deployment(ModelReplica, name="model", max_ongoing_requests=self.max_ongoing,
                                      ray_actor_options={"num_cpus": self.replica_cpus}, **scale)
        if batching:  # a batch per CPU the replica has, not per core of its node
            batching = {**batching, "concurrency": max(1, round(self.replica_cpus))}
        app = deployment.bind(package, model_id, batching, self.threads, self.max_ongoing, self.accel)
        # serve.run waits for every replica to start, forever if the cluster cannot place them.
        failed = []
        waiter = threading.Thread(target=lambda: _catching(failed, serve.run, app, name=name, route_prefix=None),
                                  daemon=True)
        waiter.start()
        waiter.join(self.deploy_timeout_s)
        if failed:
            raise EdgeflowError(f"model {model_id!r}: deploying its replicas failed: {failed[0]}")
        if waiter.is_alive():
            status = serve.status().applications.get(name)
            raise EdgeflowError(
                f"model {model_id!r}: its {self.autoscale[0] if self.autoscale else self.replicas} replicas of "
                f"{self.replica_cpus:g} CPUs each did not start within {self.deploy_timeout_s:g} s (Serve says: "
                f"{getattr(status, 'message', '') or getattr(status, 'status', 'nothing')}); the cluster has "
                f"{ray.cluster_resources().get('CPU', 0):g} CPUs: lower --replica-cpus or --replicas")

    # -- requests -------------------------------------------------------------------------
    def run(self, model, fetches, feeds, reservation, encoding=""):
        key = model.id, model.sha256
        if key in self._trainers:
            outputs, rss = self._call(lambda: self._get(self._trainers[key].run.remote(fetches, feeds, encoding)),
                                      model, self.retries)
            self.metrics.replica_memory(app_name(model), rss)
            return outputs
        handle = self._handles[key]
        outputs, replica, rss, batches, depth = self._call(
            lambda: handle.run.remote(fetches, feeds, encoding).result(timeout_s=self.timeout_s), model,
            self.retries)
        self.metrics.replica_memory(replica, rss)
        for size in batches:
            self.metrics.batch(model.id, size)
        self.metrics.queue(model.id, depth)
        return outputs

    def round(self, model, device_id, step, feeds, fetches):
        trainer = self._trainers.get((model.id, model.sha256))
        if trainer is None:
            raise EdgeflowError(f"model {model.id!r} has no trainer actor")
        outputs, rss = self._call(lambda: self._get(trainer.round.remote(device_id, step, feeds, fetches)), model, 0)
        if step.final:
            self.metrics.step(model.id)
        self.metrics.replica_memory(app_name(model), rss)
        return outputs

    def _get(self, ref):
        import ray
        return ray.get(ref, timeout=self.timeout_s)

    def _call(self, call, model, retries):
        """call(), its task's own error raised as itself; a dead or unreachable replica
        retried `retries` times, then Unavailable."""
        import ray.exceptions as rx
        from ray.serve import exceptions as sx
        lost = tuple(getattr(rx, name) for name in _LOST if hasattr(rx, name)) + (
            sx.BackPressureError, sx.DeploymentUnavailableError, sx.RequestCancelledError, TimeoutError)
        for attempt in range(retries + 1):
            try:
                return call()
            except rx.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, Exception):
                    raise cause from None
                raise EdgeflowError(f"model {model.id!r}: the replica failed: {e}") from None
            except lost as e:
                error = e
                _log.info("model %r: replica unavailable (%s), attempt %d of %d", model.id, type(e).__name__,
                          attempt + 1, retries + 1)
        raise Unavailable(f"model {model.id!r}: no replica answered ({type(error).__name__}: "
                          f"{str(error).splitlines()[0][:200] if str(error) else ''}); try again")

    def checkpoint(self):
        """Have every trainer actor checkpoint its state."""
        import ray
        ray.get([t.checkpoint.remote() for t in self._trainers.values()], timeout=self.timeout_s)

    def close(self):
        """Detach: the applications and actors stay for other front ends, checkpointed,
        unless this backend started Ray itself (then all of it stops)."""
        import ray
        if not ray.is_initialized():
            return
        try:
            self.checkpoint()
        except Exception as e:  # a dead actor: its last checkpoint stands
            _log.warning("checkpointing the trainer actors failed: %s", e)
        if self._started_ray:
            from ray import serve
            serve.shutdown()
            ray.shutdown()
