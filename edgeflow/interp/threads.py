"""Intra-op threads: kernels that split their work run the pieces on the interpreter's workers.

`Interpreter(num_threads=N)` with N > 1 gives its plans `Workers(N)`: N - 1 threads plus
the caller's. numpy releases the GIL in BLAS calls and in ufunc loops, so pieces of one
op (rows of a matmul, columns of a convolution's product) run on several cores at once,
each piece on one BLAS thread (the interpreter caps BLAS at one thread while it runs:
BLAS threads of its own would compete with the workers, and on busy cores they spin).

A kernel factory asks `current()` for the workers while a plan binds it, and splits its
work then, once: a kernel of a plan made without workers runs as before.
"""
import contextlib
import contextvars
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_CURRENT = contextvars.ContextVar("edgeflow_workers", default=None)
# Arithmetic operations below which an op is not split: handing a piece to a thread and
# waiting for it costs some 10-30 us (measured on ResNet-18 and MobileNetV2 at 2 threads:
# 2**24 beat 2**21 and 2**26).
MIN_FLOPS = 1 << 24
# Columns below which a piece of a matrix product is not worth a thread: narrower blocks
# run far below BLAS's speed.
MIN_COLUMNS = 64


def available_cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Workers:
    """`n` threads of intra-op work: `run(tasks)` runs callables, one on the caller's thread."""

    def __init__(self, n):
        self.n = int(n)
        self._pool = ThreadPoolExecutor(self.n - 1, thread_name_prefix="edgeflow") if self.n > 1 else None

    def run(self, tasks):
        """Run every callable of `tasks`, the first on this thread; re-raise the first error."""
        if self._pool is None or len(tasks) < 2:
            for task in tasks:
                task()
            return
        futures = [self._pool.submit(task) for task in tasks[1:]]
        try:
            tasks[0]()
        finally:
            for f in futures:
                f.result()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)


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
