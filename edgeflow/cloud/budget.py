"""The memory a server's models may hold: one budget for the server, one per model.

What counts against it: each model's interpreters (their variables, folded constants and
the buffers their cached plans' kernels keep) for as long as they are cached, and each
request while it is served (its feed tensors as they arrive, its plan's arena and scratch,
its outputs until they are streamed). A request reserves before it allocates; one that
does not fit waits (up to `wait_s`, or its deadline) for others to give memory back, and
one that can never fit, or still does not when the wait ends, is refused with OverBudget
(RESOURCE_EXHAUSTED on the wire), saying what it needed and the budgets.
"""
import ctypes
import os
import threading
import time

from ..errors import EdgeflowError

DEFAULT_FRACTION = 0.5  # of the machine's (or the container's) memory
DEFAULT_WAIT_S = 10.0
RELIEVE_EVERY_S = 0.05  # the most often a full budget calls its on_pressure


class OverBudget(EdgeflowError):
    """A request needs more memory than the server's budget leaves it."""


def default_bytes(fraction=DEFAULT_FRACTION):
    """`fraction` of the memory this process may use: the machine's, or its cgroup's limit
    if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return int(total * fraction)


class MemoryBudget:
    """Bytes in use, by model, under a global limit `limit` and a per-model limit
    `model_limit` (default: the global one). Thread-safe. `on_pressure()`, if given, is
    called (at most every RELIEVE_EVERY_S, outside the budget's lock) while requests wait
    for memory: see heap_trimmer."""

    def __init__(self, limit, model_limit=None, wait_s=DEFAULT_WAIT_S, on_pressure=None):
        if not limit > 0 or (model_limit is not None and not model_limit > 0):
            raise EdgeflowError(f"expected memory budgets > 0 bytes, got {limit} and {model_limit}")
        self.limit, self.model_limit = int(limit), int(model_limit or limit)
        self.wait_s = wait_s
        self.used, self.by_model, self.peak = 0, {}, 0
        self._changed = threading.Condition()
        self.on_pressure = on_pressure
        self._relieving, self._relieved_at = threading.Lock(), -RELIEVE_EVERY_S

    def _fits(self, model, nbytes):
        return self.used + nbytes <= self.limit and self.by_model.get(model, 0) + nbytes <= self.model_limit

    def _add(self, model, nbytes):
        self.used += nbytes
        self.by_model[model] = self.by_model.get(model, 0) + nbytes
        self.peak = max(self.peak, self.used)

    def take(self, model, nbytes, what, wait_s=None, held=0):
        """Reserve `nbytes` for `model`, waiting up to `wait_s` (default self.wait_s) for
        them to be free; OverBudget if they never can be (with the `held` bytes the caller
        has already), or are not by then."""
        if nbytes <= 0:
            return
        if nbytes + held > min(self.limit, self.model_limit):
            raise OverBudget(f"{what} needs {nbytes} bytes of memory{f' besides the {held} it holds' if held else ''}"
                             f", more than the server's budget ({self._limits()})")
        deadline = time.monotonic() + (self.wait_s if wait_s is None else wait_s)
        with self._changed:
            if self._fits(model, nbytes):
                self._add(model, nbytes)
                return
        while True:  # waiting: relieve the pressure (every RELIEVE_EVERY_S at most) between waits
            self._relieve()
            with self._changed:
                if not self._fits(model, nbytes):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise OverBudget(f"{what} needs {nbytes} bytes of memory; {self.used} of the server's "
                                         f"budget are in use ({self.by_model.get(model, 0)} by model "
                                         f"{model!r}; {self._limits()}): try again later")
                    self._changed.wait(min(left, RELIEVE_EVERY_S))
                if self._fits(model, nbytes):
                    self._add(model, nbytes)
                    return

    def _relieve(self):
        """Call on_pressure, unless another thread is, or did less than RELIEVE_EVERY_S ago."""
        if self.on_pressure is None or not self._relieving.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self._relieved_at >= RELIEVE_EVERY_S:
                self.on_pressure()
                self._relieved_at = time.monotonic()
        finally:
            self._relieving.release()

    def try_take(self, model, nbytes):
        """Reserve `nbytes` for `model` if they are free now; whether it did."""
        with self._changed:
            if nbytes > 0 and not self._fits(model, nbytes):
                return False
            self._add(model, nbytes)
            return True

    def force(self, model, nbytes):
        """Count `nbytes` that `model` holds already, fitting or not."""
        with self._changed:
            self._add(model, nbytes)

    def give(self, model, nbytes):
        """Return `nbytes` reserved for `model`."""
        if nbytes == 0:
            return
        with self._changed:
            self._add(model, -nbytes)
            self._changed.notify_all()

    def _limits(self):
        return f"budget {self.limit} bytes, {self.model_limit} per model"


def heap_trimmer():
    """A function that gives the heap's free pages back to the system (glibc's
    malloc_trim), or None where the C library has none. Memory that requests freed stays
    in the process's heap, scattered between live blocks, until trimmed: with the budget
    full again, the server's RSS was the budget plus up to 50 MiB of such pages (small
    requests at a high rate, 32 clients). A budget trims when a request has to wait."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class Reservation:
    """The bytes one request holds; `close()` gives them all back."""

    def __init__(self, budget, model, wait_s=None):
        self.budget, self.model, self.wait_s = budget, model, wait_s
        self.nbytes = 0
        self.feed_bytes = 0  # of which the request's feeds'

    def add(self, nbytes, what):
        if self.budget is not None:
            self.budget.take(self.model, nbytes, what, self.wait_s, self.nbytes)
        self.nbytes += max(nbytes, 0)

    def force(self, nbytes):
        """Count `nbytes` the request holds already (fitting or not)."""
        if self.budget is not None:
            self.budget.force(self.model, nbytes)
        self.nbytes += max(nbytes, 0)

    def give(self, nbytes):
        """Give back `nbytes` of what this request holds."""
        nbytes = min(nbytes, self.nbytes)
        if self.budget is not None:
            self.budget.give(self.model, nbytes)
        self.nbytes -= nbytes

    def close(self):
        if self.budget is not None:
            self.budget.give(self.model, self.nbytes)
        self.nbytes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
