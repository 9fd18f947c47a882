"""The server's measurements as TensorBoard event files: `edgeflow serve --logdir DIR`.

`TensorBoardMetrics` is a metrics.Metrics (the interface PrometheusMetrics implements
too; metrics.Combined gives both). Each event is one scalar, numbered per tag (step n:
the n-th event of that tag), so that TensorBoard's step axis counts events and its wall
time axis shows them over time:

    requests/<model>/<method>/seconds   each call's wall time
    requests/<model>/<method>/failed    calls with a status other than OK so far, at each
    bytes/<model>/received, bytes/<model>/sent   tensor bytes so far, at each call moving some
    batch_size/<model>                  each batch's size, in requests
    queue_depth/<model>                 each report of the requests waiting for a batch
    training_steps/<model>              training steps applied so far, at each
    cache_hit_rate/<model>              hits / lookups so far, at each lookup
    replica_memory_bytes/<replica>      each report of a replica's resident memory

Calls that name no model (Ping, ListModels, or refused before naming one) go under
"server".
"""
import threading
from collections import Counter

from ..tensorboard import open_writer
from .metrics import Metrics

NO_MODEL = "server"


class TensorBoardMetrics(Metrics):
    """Writes the server's measurements into TensorBoard event files in `logdir` (or
    through `writer`, a tensorboardX SummaryWriter); safe to call from any thread."""

    def __init__(self, logdir=None, writer=None, flush_secs=10):
        self.writer = writer if writer is not None else open_writer(logdir, flush_secs)
        self._lock = threading.Lock()
        self._counts = Counter()  # tag -> events written
        self._totals = Counter()  # tag -> running total

    def _scalar(self, tag, value):
        with self._lock:
            self._counts[tag] += 1
            self.writer.add_scalar(tag, value, self._counts[tag])

    def _add(self, tag, amount):
        """Add `amount` to `tag`'s running total and log the total."""
        with self._lock:
            self._counts[tag] += 1
            self._totals[tag] += amount
            self.writer.add_scalar(tag, self._totals[tag], self._counts[tag])

    def request(self, model, method, status, seconds, bytes_in=0, bytes_out=0):
        prefix = f"requests/{model or NO_MODEL}/{method}"
        self._scalar(f"{prefix}/seconds", seconds)
        if status != "OK":
            self._add(f"{prefix}/failed", 1)
        if bytes_in:
            self._add(f"bytes/{model or NO_MODEL}/received", bytes_in)
        if bytes_out:
            self._add(f"bytes/{model or NO_MODEL}/sent", bytes_out)

    def batch(self, model, size):
        self._scalar(f"batch_size/{model}", size)

    def queue(self, model, depth):
        self._scalar(f"queue_depth/{model}", depth)

    def step(self, model):
        self._add(f"training_steps/{model}", 1)

    def cache(self, model, hit):
        tag = f"cache_hit_rate/{model}"
        with self._lock:
            self._counts[tag] += 1
            self._totals[tag] += bool(hit)
            self.writer.add_scalar(tag, self._totals[tag] / self._counts[tag], self._counts[tag])

    def replica_memory(self, replica, nbytes):
        self._scalar(f"replica_memory_bytes/{replica}", nbytes)

    def flush(self):
        self.writer.flush()

    def close(self):
        """Write what is buffered and close the event file."""
        self.writer.close()
