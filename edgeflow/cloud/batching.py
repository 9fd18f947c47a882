"""Adaptive batching in front of a backend, after Clipper (Crankshaw et al., NSDI'17).

What is batched: Run requests for one model version with the same fetches, wire encoding,
and feeds of the same names, dtypes and shapes past axis 0, where the package declares
every feed and every fetch with a dynamic axis 0 (-1, the batch) and every feed of the
request has the same number of rows b >= 1. Such requests from many devices are
concatenated along axis 0, run as one `inner.run`, and each gets its own rows of every
output. A key whose batched outputs do not have one row per input row (declared shapes
that did not say so) is run one request at a time from then on, that batch's requests
included. Training rounds and requests that are not batchable go straight to `inner`.
Batching assumes that a row's outputs depend on its own row alone (an inference graph
over examples): a graph that mixes rows and keeps the batch axis (x - mean(x, axis=0))
would be answered with other devices' rows mixed in, and is not detected: do not batch it.

Batch size (AIMD, Clipper's rule): one controller per key holds the largest batch, in
rows, that runs at once. A batch that was full (its rows reached the size) and ran within
the SLO adds `step` rows (additive increase, up to `max_batch`); one over the SLO
multiplies the size by `backoff` (0.9: Clipper's 10%; at least one less, never under 1).
The SLO bounds a batch's run time on `inner`, not a request's time on the server.

The wait: a batch runs once its requests hold the controller's size in rows (the request
that reaches it may take it past, by its rows less one), or `max_wait_ms` after its first
request arrived, whichever comes first. Rows, not requests: the run time grows with the
rows, and a device may send several.

Queueing: leader/follower, no thread of its own. The gRPC worker thread of the first
request of a key's queue leads: it waits (on a condition, the wait above) for more, takes
the batch, hands leading on to the oldest request left, runs the batch and gives each
follower its rows (or its error) through the follower's Event. At most `concurrency`
batches of a key run at once (default: one per core, as Clipper runs one batch per
replica): the next leader waits for a free slot while requests gather behind it, so the
load sets the batch size and the run time the controller sees is a batch's own on its
core. Unbounded, 32 devices on two cores ran 32 one-row batches at once, each over the
SLO, and the size never grew; one at a time, a batch ran on one core (the interpreter's
intra-op threads gave MobileNetV2 nothing) and the other idled: half the throughput. The
server's worker threads are the only threads: a batch holds at most --max-workers
requests (raise it with batching).

Buckets: a batch of n rows runs padded to the next power of two (at most `max_batch`)
with copies of its last row, whose outputs are dropped, as TF Serving pads to its allowed
batch sizes: every new input shape costs the interpreter a plan (MobileNetV2 at 224: 90 to
130 ms, more than a batch's run), and AIMD's sizes would make up to `max_batch` of them
per interpreter; buckets make log2(max_batch) + 1. The padding costs at most the rows it
adds.

Memory: the batch has a Reservation of its own (waiting as long as its leader's would),
holding the concatenated feeds and what `inner` reserves for the run; each request is
charged its copy of its rows of the outputs before the batch's is given back (the
requests' own feeds stay reserved by the server, as unbatched).

Errors: an exception of a batched run is raised in every request of the batch (a copy
in each thread, of the same type and message), except InvalidInputError and GraphError
(INVALID_ARGUMENT: what a device's values can cause), which re-run the batch's requests
one at a time, so that one device's bad rows fail its own request alone; if every one of
them succeeds alone, the key is not batchable and runs unbatched from then on.

Exactness: a request's rows of a batched run equal its unbatched run up to float
rounding, not always bit for bit: numpy and OpenBLAS take shape-dependent paths (a one-row
matmul is a GEMV, which sums in another order than a GEMM). Measured on this machine
(float32, OpenBLAS, 4 x 32 random inputs, batches of 2 to 32 rows against one row at a
time, with 1 BLAS thread and with 2): MobileNetV2 (tests/data/onnx, 64x64) agrees bit for
bit up to its classifier's matmul (23 convolutions, the residual adds, the pooling mean);
its logits differ by at most 6.0e-8 absolute, 2.5e-5 relative to the logit (those near
zero), 2.7e-7 relative to the row's largest. The MLP of tests/data/onnx: at most 1.2e-7
absolute, 6.2e-5 relative, 5.2e-7 relative to the row's largest. Convolution, pooling,
softmax and elementwise ops gave identical bits at every batch size.
"""
import copy
import math
import os
import threading
import time

import numpy as np

from ..errors import EdgeflowError, GraphError, InvalidInputError
from .budget import Reservation
from .metrics import NO_METRICS
from .wire import encode_copies

_MAX_KEYS = 4096  # batch keys remembered (their controllers); idle ones are forgotten beyond


def bucket(rows, max_batch):
    """The rows a batch of `rows` runs with: the next power of two, at most `max_batch` (and
    never fewer than `rows`)."""
    return max(rows, min(1 << max(rows - 1, 0).bit_length(), max_batch))


class AIMD:
    """Clipper's batch-size controller: `size`, the largest batch (in rows) to run, grows by
    `step` after a full batch within `slo_s` and shrinks by `backoff` after one over it.
    Not thread-safe: its Batching calls it under its lock."""

    def __init__(self, slo_s, max_batch=64, step=1, backoff=0.9, start=1):
        if not slo_s > 0 or not max_batch >= 1 or not step >= 1 or not 0 < backoff < 1 or not start >= 1:
            raise EdgeflowError(f"AIMD: expected slo_s > 0, max_batch >= 1, step >= 1, 0 < backoff < 1 and "
                                f"start >= 1, got {slo_s}, {max_batch}, {step}, {backoff} and {start}")
        self.slo_s, self.max_batch, self.step, self.backoff = slo_s, int(max_batch), int(step), backoff
        self.size = min(int(start), self.max_batch)

    def observe(self, batch_size, latency_s):
        """A batch of `batch_size` rows ran in `latency_s`; the new size."""
        if latency_s > self.slo_s:
            self.size = max(1, min(self.size - 1, math.floor(self.size * self.backoff)))
        elif batch_size >= self.size:
            self.size = min(self.max_batch, self.size + self.step)
        return self.size


class _Request:
    """One request waiting in a key's queue: its feeds and rows, and, once its batch ran,
    its outputs or error (or the turn to lead)."""

    def __init__(self, feeds, rows, reservation):
        self.feeds, self.rows, self.reservation = feeds, rows, reservation
        self.arrived = time.monotonic()
        self.ready = threading.Event()
        self.lead = False
        self.outputs = self.error = None

    def answer(self):
        if self.error is None:
            return self.outputs
        try:  # each thread raises its own copy: raising one object in many threads mixes their tracebacks
            error = copy.copy(self.error)
        except Exception:
            error = self.error
        raise error.with_traceback(self.error.__traceback__)


class _Queue:
    """The requests of one key waiting for their batch, and the key's controller."""

    def __init__(self, lock, controller):
        self.pending, self.rows, self.leading = [], 0, False
        self.running = 0  # batches of the key running now
        self.filled = threading.Condition(lock)
        self.controller = controller


class Batching:
    """Runs batchable requests of many threads for one model as batches on `inner` (a
    backend: backends.Local, ...). `slo_ms`: the run time a batch should stay within;
    `max_batch`: the most rows; `max_wait_ms`: how long a batch's first request waits for
    others; `start`: the first batch size; `concurrency`: batches of one key running at
    once (default: the cores this process may use). Reports to `metrics` each batch's requests and the requests waiting per model."""

    def __init__(self, inner, slo_ms, max_batch=64, max_wait_ms=2.0, metrics=NO_METRICS, start=1, concurrency=None):
        concurrency = concurrency or len(os.sched_getaffinity(0))
        if not max_wait_ms >= 0 or not concurrency >= 1:
            raise EdgeflowError(f"Batching: expected max_wait_ms >= 0 and concurrency >= 1, got {max_wait_ms} "
                                f"and {concurrency}")
        self.inner, self.metrics, self.concurrency = inner, metrics, concurrency
        self.slo_s, self.max_batch, self.max_wait_s, self.start = slo_ms / 1000, max_batch, max_wait_ms / 1000, start
        AIMD(self.slo_s, max_batch, start=start)  # the arguments, checked now
        self._lock = threading.Lock()
        self._queues = {}  # key -> _Queue
        self._unbatchable = set()  # keys whose outputs turned out not to be batch-major
        self._depth = {}  # model id -> requests waiting

    def run(self, model, fetches, feeds, reservation, encoding=""):
        key, rows = self._key(model, fetches, feeds, encoding)
        if key is None:
            return self.inner.run(model, fetches, feeds, reservation, encoding)
        request = _Request(feeds, rows, reservation)
        queue, lead = self._enqueue(key, model.id, request)
        if not lead:
            request.ready.wait()
            lead = request.lead
        if lead:
            batch = self._gather(queue, model.id, request)
            self._run(key, queue, model, fetches, encoding, batch)
        return request.answer()

    def round(self, model, device_id, step, feeds, fetches):
        return self.inner.round(model, device_id, step, feeds, fetches)

    def close(self):
        self.inner.close()

    def _key(self, model, fetches, feeds, encoding):
        """(the key requests batch under, the request's rows), or (None, None) if it is not
        batchable."""
        rows = {a.shape[0] if a.ndim else 0 for a in feeds.values()}
        if len(rows) != 1 or not min(rows) >= 1:
            return None, None
        for name in [*feeds, *fetches]:
            shape = model.declared_shape(name)
            if not shape or shape[0] != -1:
                return None, None
        key = (model.id, model.sha256, tuple(fetches), encoding,
               tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items())))
        return (None, None) if key in self._unbatchable else (key, rows.pop())

    def _enqueue(self, key, model_id, request):
        """(the key's queue, whether `request` leads its batch)."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                if len(self._queues) >= _MAX_KEYS:  # shapes past axis 0 vary: forget the idle keys
                    self._queues = {k: q for k, q in self._queues.items() if q.leading}
                    self._unbatchable.clear()
                queue = self._queues[key] = _Queue(self._lock, AIMD(self.slo_s, self.max_batch, start=self.start))
            queue.pending.append(request)
            queue.rows += request.rows
            lead, queue.leading = not queue.leading, True
            if queue.rows >= queue.controller.size:
                queue.filled.notify()
            self._count(model_id, 1)
        return queue, lead

    def _gather(self, queue, model_id, leader):
        """The batch `leader` (the oldest waiting) runs, once it is full or the wait is over;
        the oldest request left leads the next."""
        deadline = leader.arrived + self.max_wait_s
        with self._lock:
            while queue.running >= self.concurrency:  # requests gather meanwhile: the next batch is fuller
                queue.filled.wait()
            while queue.rows < queue.controller.size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                queue.filled.wait(left)
            batch, rows = [], 0
            while queue.pending and rows < queue.controller.size:
                batch.append(queue.pending.pop(0))
                rows += batch[-1].rows
            queue.rows -= rows
            queue.running += 1
            if queue.pending:
                queue.pending[0].lead = True
                queue.pending[0].ready.set()
            else:
                queue.leading = False
            self._count(model_id, -len(batch))
        return batch

    def _count(self, model_id, change):
        depth = self._depth[model_id] = self._depth.get(model_id, 0) + change
        self.metrics.queue(model_id, depth)

    def _run(self, key, queue, model, fetches, encoding, batch):
        """Run `batch` on inner; every request of it gets its outputs or an error."""
        self.metrics.batch(model.id, len(batch))
        try:
            start = time.perf_counter()
            if len(batch) == 1:
                batch[0].outputs = self.inner.run(model, fetches, batch[0].feeds, batch[0].reservation, encoding)
            elif not self._batched(model, fetches, encoding, batch):
                self._alone(model, fetches, encoding, batch)
                self._unbatchable.add(key)
            seconds = time.perf_counter() - start
            with self._lock:
                queue.controller.observe(sum(r.rows for r in batch), seconds)
        except (InvalidInputError, GraphError) as e:  # a device's values, or the batch itself?
            if len(batch) == 1:
                batch[0].error = e
            elif self._alone(model, fetches, encoding, batch):
                self._unbatchable.add(key)  # each ran alone: the batch was what failed
        except BaseException as e:
            for r in batch:
                r.error = e
        finally:
            with self._lock:
                queue.running -= 1
                queue.filled.notify()  # the leader waits for a free slot, or a size reached already
            for r in batch[1:]:
                r.ready.set()

    def _batched(self, model, fetches, encoding, batch):
        """Run `batch` as one; False (nothing set) if an output has not one row per input row."""
        rows = [r.rows for r in batch]
        padded = bucket(sum(rows), self.max_batch)
        with Reservation(model.budget, model.id, getattr(batch[0].reservation, "wait_s", None)) as held:
            feeds = {}
            for name in batch[0].feeds:
                parts = [r.feeds[name] for r in batch]
                parts.append(np.repeat(parts[-1][-1:], padded - sum(rows), axis=0))  # a real row's values
                held.add(sum(p.nbytes for p in parts), f"model {model.id!r}: a batch of {len(batch)} "
                                                       f"requests' feed {name!r}")
                feeds[name] = np.concatenate(parts)
            outputs = self.inner.run(model, fetches, feeds, held, encoding)
            held.give(sum(a.nbytes for a in feeds.values()))
            feeds = None  # copied into the plan: what they held is free
            if any(np.ndim(a) < 1 or len(a) != padded for a in outputs.values()):
                return False
            bounds = np.cumsum([0, *rows])
            for r, lo, hi in zip(batch, bounds, bounds[1:]):
                r.outputs = {n: a[lo:hi].copy() for n, a in outputs.items()}
                if r.reservation is not None:
                    r.reservation.force(sum(a.nbytes for a in r.outputs.values()) * encode_copies(encoding))
        return True

    def _alone(self, model, fetches, encoding, batch):
        """Run each request of `batch` on its own; whether every one succeeded."""
        ok = True
        for r in batch:
            try:
                r.outputs = self.inner.run(model, fetches, r.feeds, r.reservation, encoding)
            except Exception as e:
                r.error, ok = e, False
        return ok
