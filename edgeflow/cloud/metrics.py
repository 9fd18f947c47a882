"""What a server counts: requests, latencies, batches, queues, bytes, training steps and
replica memory.

`Metrics` is the interface every part of the server reports to; the base class records
nothing (NO_METRICS), so code reports unconditionally. `PrometheusMetrics` (with the
`prometheus_client` package) exports them for `edgeflow serve --metrics-port P`.
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
