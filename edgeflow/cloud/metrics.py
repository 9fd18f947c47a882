"""What a server counts: requests, latencies, batches, queues, bytes, training steps and
replica memory.

`Metrics` is the interface every part of the server reports to; the base class records
nothing (NO_METRICS), so code reports unconditionally. `PrometheusMetrics` (with the
`prometheus_client` package) exports them for `edgeflow serve --metrics-port P`;
`tensorboard.TensorBoardMetrics` writes them as TensorBoard events (`--logdir D`);
`Combined` reports to several.
"""


class Metrics:
    """Receives the server's measurements; this base records nothing."""

    def request(self, model, method, status, seconds, bytes_in=0, bytes_out=0):
        """One finished call: `status` is the gRPC status code's name ("OK", ...)."""

    def batch(self, model, size):
        """A batch of `size` requests ran on `model`."""

    def queue(self, model, depth):
        """`depth` requests wait for `model`'s next batch."""

    def step(self, model):
        """A training step was applied to `model`."""

    def cache(self, model, hit):
        """The prediction cache answered (`hit`) or not."""

    def replica_memory(self, replica, nbytes):
        """Replica `replica` (a name) holds `nbytes` of resident memory."""


NO_METRICS = Metrics()


class Combined(Metrics):
    """Reports each measurement to every one of `parts` (Prometheus and TensorBoard both)."""

    def __init__(self, *parts):
        self.parts = parts

    def request(self, *args, **kwargs):
        for m in self.parts:
            m.request(*args, **kwargs)

    def batch(self, model, size):
        for m in self.parts:
            m.batch(model, size)

    def queue(self, model, depth):
        for m in self.parts:
            m.queue(model, depth)

    def step(self, model):
        for m in self.parts:
            m.step(model)

    def cache(self, model, hit):
        for m in self.parts:
            m.cache(model, hit)

    def replica_memory(self, replica, nbytes):
        for m in self.parts:
            m.replica_memory(replica, nbytes)


# Request latencies from 1 ms (a ping on loopback) to 10 s (a large model on a busy server).
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
BATCH_BUCKETS = tuple(2 ** k for k in range(9))  # 1, 2, 4, ..., 256


class PrometheusMetrics(Metrics):
    """Keeps the measurements as Prometheus metrics (names `edgeflow_...`, plus the
    process's own `process_...`: its resident memory, CPU time, open files) in a registry of
    its own, so that servers sharing a process do not share counts. `serve_http(port)`
    exports them at /metrics; `text()` is what a scrape gets."""

    def __init__(self):
        try:
            import prometheus_client as prom
        except ImportError:
            from ..errors import EdgeflowError
            raise EdgeflowError("metrics need the prometheus_client package: pip install "
                                "'edgeflow[metrics]'") from None
        self._prom = prom
        self.registry = registry = prom.CollectorRegistry()
        prom.ProcessCollector(registry=registry)
        self._requests = prom.Counter("edgeflow_requests", "Calls answered, by final gRPC status",
                                      ["model", "method", "status"], registry=registry)
        self._latency = prom.Histogram("edgeflow_request_seconds", "Wall time of a call",
                                       ["model", "method"], buckets=LATENCY_BUCKETS, registry=registry)
        self._batch = prom.Histogram("edgeflow_batch_size", "Requests run as one batch", ["model"],
                                     buckets=BATCH_BUCKETS, registry=registry)
        self._queue = prom.Gauge("edgeflow_queue_depth", "Requests waiting for the model's next batch",
                                 ["model"], registry=registry)
        self._bytes_in = prom.Counter("edgeflow_received_bytes", "Tensor bytes received (as sent: "
                                      "encoded, if compressed)", ["model"], registry=registry)
        self._bytes_out = prom.Counter("edgeflow_sent_bytes", "Tensor bytes sent (encoded, if compressed)",
                                       ["model"], registry=registry)
        self._steps = prom.Counter("edgeflow_training_steps", "Training steps applied", ["model"],
                                   registry=registry)
        self._cache = prom.Counter("edgeflow_cache_lookups", "Prediction cache lookups (result: hit "
                                   "or miss)", ["model", "result"], registry=registry)
        self._replica_memory = prom.Gauge("edgeflow_replica_resident_memory_bytes",
                                          "Resident memory of a model replica", ["replica"], registry=registry)
        self._http = None  # (server, thread) of the exporter, while it runs

    def request(self, model, method, status, seconds, bytes_in=0, bytes_out=0):
        self._requests.labels(model, method, status).inc()
        self._latency.labels(model, method).observe(seconds)
        if bytes_in:
            self._bytes_in.labels(model).inc(bytes_in)
        if bytes_out:
            self._bytes_out.labels(model).inc(bytes_out)

    def batch(self, model, size):
        self._batch.labels(model).observe(size)

    def queue(self, model, depth):
        self._queue.labels(model).set(depth)

    def step(self, model):
        self._steps.labels(model).inc()

    def cache(self, model, hit):
        self._cache.labels(model, "hit" if hit else "miss").inc()

    def replica_memory(self, replica, nbytes):
        self._replica_memory.labels(replica).set(nbytes)

    def text(self):
        """The exposition text a scrape of /metrics gets."""
        return self._prom.generate_latest(self.registry).decode()

    def serve_http(self, port=0, host="127.0.0.1"):
        """Export the metrics over HTTP (any path; Prometheus asks for /metrics) on
        `host`:`port` (0 picks a free port) until `close()`; the port listened on."""
        if self._http is not None:
            raise RuntimeError("the metrics exporter is already running")
        self._http = self._prom.start_http_server(port, host, registry=self.registry)
        return self._http[0].server_port

    def close(self):
        """Stop the HTTP exporter, if it runs."""
        if self._http is not None:
            server, thread = self._http
            self._http = None
            server.shutdown()
            server.server_close()
            thread.join()
