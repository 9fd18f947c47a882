"""Intra-op threads: kernels that split their work run the pieces on the interpreter's workers.

`Interpreter(num_threads=N)` with N > 1 gives its plans `Workers(N)`: N - 1 threads plus
the caller's. numpy releases the GIL in BLAS calls and in ufunc loops, so pieces of one
op (rows of a matmul, columns of a convolution's product) run on several cores at once,
each piece on one BLAS thread (the interpreter caps BLAS at one thread while it runs:
BLAS threads of its own would compete with the workers, and on busy cores they spin).

A kernel factory asks `current()` for the workers while a plan binds it, and splits its
work then, once: a kernel of a plan made without workers runs as before. Pieces that are
all matrix products (`Workers.split`) go to native_threads.py's workers where numba and
scipy are installed: there no lock or GIL is handed over, which on this project's 2-core VM
cost more than a 100 us piece.
"""
import contextlib
import contextvars
import functools
import os
import threading
import weakref

import numpy as np

_CURRENT = contextvars.ContextVar("edgeflow_workers", default=None)
# Arithmetic operations below which an op is not split: handing a piece to a worker and
# waiting for it costs some 10-25 us (Workers' locks). Measured at 2 threads, interleaved,
# on this 2-core machine: MobileNetV2 at batch 1 20.2 ms at 2**18, 21.5 at 2**20, 25.9 at
# 2**24 (27.0 on one thread), at batch 8 125 / 127 / 153 ms (213); ResNet-18 and the
# BERT-like encoder the same at all three.
MIN_FLOPS = 1 << 18
# Columns below which a piece of a matrix product is not worth a thread: narrower blocks
# run far below BLAS's speed.
MIN_COLUMNS = 64
# Output rows from which a matrix product splits by rows rather than by columns. Each worker
# packs the whole operand on the other side of its cut, and two workers writing the halves
# of the same rows ran slow at some shapes. Measured on the native workers (2 threads, time
# against one): rows won from 160 rows up (192x32 @ 32x784 0.63 against 1.06 by columns,
# 1280x320 @ 320x49 0.50 against 0.66), columns up to 128 (24x144 @ 144x3136 0.59 against
# 1.21, BERT's 128x256 @ 256x1024 0.55 against 0.65), both alike at 144.
ROWS_FIRST = 144


def available_cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Slot:
    """One worker thread's hand-off: `go` is released to start `task`, `done` when it ends
    (a lock each: the cheapest wake-up Python has, some 9 us a round trip against 55 us
    for a ThreadPoolExecutor's queue and future, measured on this project's 2-core machine)."""

    def __init__(self):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.task = self.error = None
        self.stop = False


def _serve(slot):
    while True:
        slot.go.acquire()
        if slot.stop:
            return
        try:
            slot.task()
        except BaseException as e:  # handed to the caller, which re-raises it
            slot.error = e
        finally:
            slot.task = None
            slot.done.release()


def _stop(slots, native=None):
    for slot in slots:
        slot.stop = True
        slot.go.release()
    if native is not None:
        native.close()


def _each(tasks):
    for task in tasks:
        task()


class Workers:
    """`n` threads of intra-op work: `run(tasks)` runs callables, some on the caller's thread;
    `split(tasks)` makes a step of them.

    n - 1 daemon threads wait on their own locks; they end when the Workers are closed or
    collected. With `native` (numba and scipy import, EDGEFLOW_NATIVE_THREADS is not "0"),
    n - 1 more are native_threads.py's: they spin for work a while and run matrix products
    without the GIL (Python's callables stay on the lock workers: measured on MobileNetV2
    at 2 threads, handing them to the native workers was 5% slower). A second caller while
    a `run` is under way (two threads sharing one interpreter) runs its tasks on its own
    thread."""

    def __init__(self, n, native=True):
        self.n = int(n)
        self._busy = threading.Lock()
        self.native = None
        if native and self.n > 1 and os.environ.get("EDGEFLOW_NATIVE_THREADS", "1") != "0":
            from . import native_threads
            if native_threads.available():
                self.native = native_threads.Pool(self.n - 1)
        self._slots = [_Slot() for _ in range(self.n - 1)]
        for slot in self._slots:
            threading.Thread(target=_serve, args=(slot,), name="edgeflow-worker", daemon=True).start()
        self._stop = weakref.finalize(self, _stop, self._slots, self.native)

    def split(self, tasks):
        """A step running `tasks` (callables) on the workers: on the native ones where every
        task is a float32 matrix product BLAS takes as is (native_threads.gemms), task k on
        worker k % n; else through `run`."""
        if self.native is not None and 1 < len(tasks):
            from . import native_threads
            rows = [native_threads.gemms(task) for task in tasks]
            if None not in rows:
                table, spans = [], []
                for k in range(self.n):
                    first = len(table)
                    for found in rows[k::self.n]:
                        table += found
                    spans.append((first, len(table)))
                if 0 < len(table) <= native_threads.CAPACITY:
                    return functools.partial(self._run_native, np.array(table, np.int64), spans, tasks)
        return functools.partial(self.run, tasks)

    def _run_native(self, table, spans, tasks):
        if not self._busy.acquire(blocking=False):
            _each(tasks)  # another thread's run is under way
            return
        try:
            self.native.run(table, spans)
        finally:
            self._busy.release()

    def run(self, tasks):
        """Run every callable of `tasks`, the first on this thread; re-raise the first error."""
        if not self._slots or len(tasks) < 2 or not self._busy.acquire(blocking=False):
            _each(tasks)
            return
        try:
            groups = [tasks[k::self.n] for k in range(self.n)]
            started = []
            for slot, group in zip(self._slots, groups[1:]):
                if group:
                    slot.task = group[0] if len(group) == 1 else functools.partial(_each, group)
                    slot.go.release()
                    started.append(slot)
            error = None
            try:
                _each(groups[0])
            except BaseException as e:
                error = e
            for slot in started:
                slot.done.acquire()
                error, slot.error = error or slot.error, None
            if error is not None:
                raise error
        finally:
            self._busy.release()

    def close(self):
        self._stop()


def current():
    """The workers of the plan being bound or run, or None (one thread)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(workers):
    """Make `workers` current (kernels bound or subgraphs planned inside split for them)."""
    token = _CURRENT.set(workers)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def pieces(length, parts, minimum=1):
    """At most `parts` (start, stop) ranges covering range(length), each at least `minimum`
    long (fewer ranges when `length` is short)."""
    parts = max(1, min(parts, length // max(minimum, 1)))
    edges = [length * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


# Elements below which an elementwise op is not split (a piece must outweigh a thread hop).
MIN_ELEMENTS = 1 << 18


def elementwise(fn, ins, out, *args):
    """A step computing `fn(*ins, *args, out=piece of out)` piece by piece on the current
    workers (split along the first axis of `out` long enough; inputs that broadcast along
    it are passed whole), or None: one thread, or too few elements."""
    workers = current()
    if workers is None or out.size < MIN_ELEMENTS:
        return None
    axis = next((k for k, d in enumerate(out.shape) if d >= workers.n), None)
    if axis is None:
        return None

    def part(a, b):
        def cut(x):
            x = np.asarray(x)
            k = axis - (out.ndim - x.ndim)  # x's axis under out's, numpy's alignment from the right
            if k < 0 or x.shape[k] == 1:
                return x
            return x[(slice(None),) * k + (slice(a, b),)]
        return functools.partial(fn, *map(cut, ins), *args, out=cut(out))
    parts = [part(a, b) for a, b in pieces(out.shape[axis], workers.n)]
    return (lambda: workers.run(parts)) if len(parts) > 1 else None
