"""Intra-op threads: kernels that split their work run the pieces on the interpreter's workers.

`Interpreter(num_threads=N)` with N > 1 gives its plans `Workers(N)`: N - 1 threads plus
the caller's. numpy releases the GIL in BLAS calls and in ufunc loops, so pieces of one
op (rows of a matmul, columns of a convolution's product) run on several cores at once,
each piece on one BLAS thread (the interpreter caps BLAS at one thread while it runs:
BLAS threads of its own would compete with the workers, and on busy cores they spin).

A kernel factory asks `current()` for the workers while a plan binds it, and splits its
work then, once: a kernel of a plan made without workers runs as before. Pieces that are
all matrix products (`Workers.split`) go to native_threads.py's workers where llvmlite is
installed (the `jit` extra; with numpy's OpenBLAS or scipy's BLAS): there no lock or GIL is handed over,
which on this project's 2-core VM cost more than a 100 us piece.

An interpreter times its runs with the workers and on its own thread alone (`Workers.running`),
and keeps to the faster (`Adaptive`): a piece handed to a core that another tenant holds
(a VM's stolen time, a phone's little core or its throttling) can make a split run slower
than one thread.
"""
import contextvars
import functools
import os
import threading
import weakref
from time import perf_counter

import numpy as np

from .scoped import scoped

_CURRENT = contextvars.ContextVar("edgeflow_workers", default=None)
# Arithmetic operations below which an op is not split: handing a piece to a worker and
# waiting for it costs some 5 us (native workers) to 10-25 (Workers' locks), and a piece of
# a small product runs below the whole's speed (a 1x1 conv of 128 -> 64 channels at 8x8, 1
# MFLOP: 19 us whole, 28 as its two halves in turn). Plans bound at 2**18, 2**20 and 2**21,
# all runs split, interleaved with a one-thread plan in one process (time against it): MediaPipe's
# iris_landmark 0.92-0.96 / 0.87-0.92 / 0.88-0.91, hand_recrop 1.02-1.35 / 0.99-1.21 /
# 0.97-1.11, face_landmark 0.97 / 0.93 / 0.94; mobilenet_v3_small at batch 1 0.77 / 0.74 / 0.81-0.83,
# at 8 0.72 / 0.71; EfficientNet-B0 0.60-0.66 / 0.60-0.63 / 0.59-0.64; ResNet-18 0.59-0.71 /
# 0.56-0.68 / 0.56-0.68; MobileNetV2 0.63 / 0.61 / 0.61; the BERT-like encoder 0.64 / 0.59 /
# 0.59, at batch 8 0.70 / 0.68; lstm2 0.61-0.67 / 0.59-0.64; the BiGRU 0.56-0.74 / 0.55-0.77.
# (Earlier, with the lock workers alone: MobileNetV2 at batch 1 20.2 ms at 2**18, 21.5 at
# 2**20, 25.9 at 2**24.)
MIN_FLOPS = 1 << 20
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
# Arithmetic operations below which a product of one row or one column (numpy's sgemv; the
# native workers take sgemm's rows only) is not split: its pieces go to the lock workers,
# whose hand-off cost 150-300 us on this 2-core VM. Whole against split, 2 threads: 1x512 @
# 512x1000 (a classifier at batch 1) 34-50 us against 190-320, 1x1024 @ 1024x1000 75 against
# 370, 1x2048 @ 2048x2048 690 against 520-1,170, 1x4096 @ 4096x4096 3.0-3.4 ms against 2.1-2.4.
VECTOR_MIN_FLOPS = 1 << 25
# The same, on the native workers (sgemv's rows, native_threads.gemms; a hand-off of some 5
# us): split in two against whole, alone, weights in cache: 1x1280 @ 1280x1000 (MobileNetV2's
# classifier) 103-110 -> 71-86 us, 1x1024 @ 1024x1000 79-88 -> 59, but 1x512 @ 512x1000 39
# -> 44 and 1x576 @ 576x1024 45-52 -> 40-51. mobilenet_v3_small at 2 threads, batch 1
# (two such layers), alternating processes: 3.76 -> 2.83 ms.
NATIVE_VECTOR_MIN_FLOPS = 1 << 20


# Adaptive: the first TRIALS calls of each variant alternate (the threaded first, so that a
# single call runs it); after that the faster so far runs, and the other is timed again once
# every EXPLORE calls, the gap doubling (to EXPLORE_MAX) each time it loses again.
TRIALS = 2
EXPLORE = 16
EXPLORE_MAX = 1024
# The weight of each new time in the chosen variant's moving average.
SMOOTHING = 0.125


def available_cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Slot:
    """One worker thread's hand-off: `go` is released to start `task`, `done` when it ends
    (a lock each: the cheapest wake-up Python has, some 9 us a round trip against 55 us
    for a ThreadPoolExecutor's queue and future, measured on this project's 2-core machine
    once; 60-105 us since, where the VM halts an idle vCPU at once (cpuidle haltpoll with
    guest_halt_poll_ns=0), so that each wake-up waits for the host: an empty split of two
    took 93-215 us)."""

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


class Adaptive:
    """Two ways of doing the same thing, `threaded` and `serial` (an interpreter's run with
    its workers, and on its thread alone: the same pieces, so the same bits); each call runs
    the one that has been faster, and times it.

    The first 2 * TRIALS calls alternate, threaded first; each variant's time is then its
    fastest. Afterwards the chosen variant's time is a moving average of its calls (weight
    SMOOTHING), and the other is tried once every `gap` calls (EXPLORE, doubled up to
    EXPLORE_MAX each time it is still the slower), its time that call's: the choice follows a
    core that becomes busy or free again, at the cost of one run in `gap`. On this project's
    2-core VM, while the second core was being taken back by the host, mobilenet_v3_small
    took 2.3x its 1-thread time at 2 threads: a 16x16 @ 16x3136 pointwise conv waited 393 us
    for its worker against 54 us alone."""

    __slots__ = ("variants", "seconds", "pick", "calls", "gap", "explore")

    def __init__(self, threaded, serial):
        self.variants = (threaded, serial)
        self.seconds = [float("inf"), float("inf")]
        self.pick = 0  # the variant in use: 0 threaded, 1 serial
        self.calls = 0
        self.gap = EXPLORE
        self.explore = -1  # the call that times the other variant next (set when the trials end)

    def threaded_next(self):
        """Whether the next call runs `threaded` (a run wakes its workers only then)."""
        return self._which(self.calls) == 0

    def _which(self, calls):
        pick = self.pick
        return calls & 1 if calls < 2 * TRIALS else (1 - pick if calls == self.explore else pick)

    def __call__(self):
        calls = self.calls
        self.calls = calls + 1
        pick = self.pick
        which = self._which(calls)
        start = perf_counter()
        self.variants[which]()
        took = perf_counter() - start
        seconds = self.seconds
        if calls < 2 * TRIALS:
            seconds[which] = min(seconds[which], took)
        elif which == pick:
            seconds[which] += (took - seconds[which]) * SMOOTHING
        else:
            seconds[which] = took
        if calls < 2 * TRIALS - 1:
            return
        best = 0 if seconds[0] <= seconds[1] else 1
        if calls == self.explore:  # the other variant was timed: try it again soon if it won
            self.gap = EXPLORE if best != pick else min(2 * self.gap, EXPLORE_MAX)
        if calls == self.explore or calls == 2 * TRIALS - 1:
            self.explore = calls + self.gap
        self.pick = best


class Workers:
    """`n` threads of intra-op work: `run(tasks)` runs callables, some on the caller's thread;
    `split(tasks)` makes a step of them.

    n - 1 daemon threads wait on their own locks; they end when the Workers are closed or
    collected. With `native` (native_threads.available(), EDGEFLOW_NATIVE_THREADS is not "0"),
    n - 1 more are native_threads.py's: they spin for work a while and run matrix products
    without the GIL (Python's callables stay on the lock workers: measured on MobileNetV2
    at 2 threads, handing them to the native workers was 5% slower). A second caller while
    a `run` is under way (two threads sharing one interpreter) runs its tasks on its own
    thread."""

    def __init__(self, n, native=True, adaptive=None):
        self.n = int(n)
        # Whether an interpreter's runs choose between the workers and its thread alone by
        # timing them (Adaptive); EDGEFLOW_ADAPTIVE_THREADS=0 (or adaptive=False) always splits.
        self.adaptive = os.environ.get("EDGEFLOW_ADAPTIVE_THREADS", "1") != "0" if adaptive is None else adaptive
        self.alone = False  # set while a whole run goes on the caller's thread alone (`running`)
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
        worker k % n; else through `run`. While `alone`, all on the caller's thread."""
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
                if table:
                    return functools.partial(self._run_native, self.native.prepare(table, spans), tasks)
        return functools.partial(self.run, tasks)

    def wake(self):
        """Wake the native workers that went to sleep since the last run (native_threads.Pool.wake)."""
        if self.native is not None:
            self.native.wake()

    def _run_native(self, prepared, tasks):
        if not self._busy.acquire(blocking=False):
            _each(tasks)  # another thread's run is under way
            return
        try:
            if self.alone:  # the same BLAS calls on this thread: the same bits
                self.native.run_here(prepared[0])
            else:
                self.native.run_prepared(prepared)
        finally:
            self._busy.release()

    def running(self, run, alone):
        """run(), every split of it on the caller's thread alone if `alone` (the same pieces
        in turn, so the same bits)."""
        self.alone = alone
        try:
            run()
        finally:
            self.alone = False

    def run(self, tasks):
        """Run every callable of `tasks`, the first on this thread; re-raise the first error."""
        if not self._slots or len(tasks) < 2 or self.alone or not self._busy.acquire(blocking=False):
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


def using(workers):
    """Make `workers` current (kernels bound or subgraphs planned inside split for them)."""
    return scoped(_CURRENT, workers)


def chain(*steps):
    """One step running `steps` in turn. Workers.split posts it to a native worker as the
    rows of its steps, in order, where each is a product or has a native_call (a piece
    whose stages stay on one core: what one writes, the next reads from that core's cache)."""
    def run():
        for step in steps:
            step()
    run.chained = steps
    return run


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
