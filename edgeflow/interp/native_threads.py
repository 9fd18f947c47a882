"""Intra-op workers in native code: matrix products split over threads without the GIL.

threads.Workers hands a piece of an op to a Python thread through locks. On this project's
2-core VM that costs as much as the piece where a piece takes 50-300 us (a MobileNetV2
pointwise conv at batch 1): the worker sleeps on a futex, and waking it, then handing the
GIL to it and back, are several wake-ups of a halted core. A 192x32 @ 32x784 product took
141 us on one thread and 131 split in two by rows that way (278 by columns); OpenBLAS's
own two threads took 104.

Here each worker is a thread inside a numba function compiled without the GIL: it spins
on its slot of a shared array (calling sched_yield, so that it gives way on a shared core)
for a posted list of sgemm calls, runs them through BLAS (numpy's own OpenBLAS where it is
found, else scipy's cython_blas sgemm; called by address), and marks them done; the caller
runs its own share meanwhile and spins until every worker is done. No lock, no GIL, no futex on the way: the same split by rows
took 86-107 us (0.6-0.8 of one thread's time; 0.5-0.7 for products of 150 us or more). A
worker that finds nothing for SPIN_YIELDS sched_yields goes to sleep on a lock (through
Python); the next post wakes it that way, once.

numba's own thread pools were measured for this first (a prange over two rows, on this
machine): its workqueue layer costs 36 us a region; its OpenMP layer 2.6 us, but needs
the system's libgomp, and GNU OpenMP is not fork-safe; its TBB layer did not
load with PyPI's tbb 2023.

Available where numba (the `jit` extra) imports, and numpy's OpenBLAS is found or scipy
(`fast`) imports, on platforms with sched_yield; elsewhere Workers keeps its lock hand-off.
Only float32 products of 2-D BLAS layouts are posted (`gemms` says which pieces qualify):
anything else runs as before.
"""
import ctypes
import ctypes.util
import functools
import os
import threading
from types import SimpleNamespace

import numpy as np

from .kernels import jit

# A row of a posted table: C (M, N) = op(A) (M, K) @ op(B) (K, N), row-major, where op
# transposes an operand whose elements run down its columns.
M, N, K, A, LDA, TA, B, LDB, TB, C, LDC = range(11)
WIDTH = 11
CAPACITY = 4096  # rows of the shared table (a split needing more runs through Python)
IDLE, POSTED, SLEEPING, STOP = 0, 1, 2, 3
# State, done count, first and last row: one 64-byte line a worker, so that two workers'
# slots do not share a cache line.
SLOT = 8
STATE, DONE, FIRST, LAST = range(4)
# sched_yield calls a worker makes looking for work before it sleeps (~0.3-1 us each here:
# a few hundred us, enough to bridge the ops of a run that are not split).
SPIN_YIELDS = 1000
# sched_yield calls the caller makes waiting for a worker before it sleeps WAIT_SLEEP_US
# between looks: a spinning caller kept a worker that shared its core with another busy
# thread (OpenBLAS's, which spin some 0.1 s after a product) from running for milliseconds
# (a 1x512 @ 512x1000 product split in two: 87 us on one thread, 3.8 ms).
WAIT_YIELDS = 200
WAIT_SLEEP_US = 20

_built = []
# numba intrinsics, set by _compile (the loops below name them, for numba to compile).
_load_acquire = _store_release = _swap = _call = None


def available():
    """Whether native workers can run here (numba and scipy import, sched_yield exists)."""
    return _build() is not None


def _build():
    if _built:
        return _built[0]
    _built.append(None)
    if not jit.available():
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        sched_yield, usleep = (ctypes.cast(f, ctypes.c_void_p).value for f in (libc.sched_yield, libc.usleep))
        sgemm = _numpy_sgemm()
        if sgemm is None:
            from scipy.linalg import cython_blas
            sgemm = _capsule_address(cython_blas.__pyx_capi__["sgemm"]), np.int32
    except (ImportError, OSError, AttributeError, TypeError):
        return None
    _built[0] = _compile(jit._numba[0], *sgemm, sched_yield, usleep)
    return _built[0]


def _numpy_sgemm():
    """(address, integer type) of numpy's own BLAS sgemm, or None: the 64-bit-integer OpenBLAS
    that numpy's wheels bundle (its sgemm named scipy_sgemm_64_ there), found among the loaded
    libraries by threadpoolctl. Its results are numpy's matmul's, bit for bit, and it ran the
    pointwise convs' products 25% faster than scipy's build of OpenBLAS (24x96 @ 96x1568: 122
    us against 183); elsewhere scipy's cython_blas sgemm serves."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    for info in threadpool_info():
        path = info.get("filepath") or ""
        if info.get("internal_api") != "openblas" \
                or os.path.relpath(path, root).split(os.sep)[0] not in ("numpy", "numpy.libs"):
            continue
        library = ctypes.CDLL(path)
        for name in ("scipy_sgemm_64_", "sgemm_64_", "sgemm64_"):
            function = getattr(library, name, None)
            if function is not None:
                return ctypes.cast(function, ctypes.c_void_p).value, np.int64
    return None


def _capsule_address(capsule):
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return pointer(capsule, name(capsule))


def _intrinsics(types, cgutils, intrinsic):
    """Atomic loads, stores and compare-and-swap on int64 array elements, and calls through
    a function's address (an argument, not a constant: numba caches what it compiles only
    without addresses baked in)."""
    def pointer(context, builder, array_type, array, index):
        return cgutils.get_item_pointer(context, builder, array_type,
                                        context.make_array(array_type)(context, builder, array), [index])

    @intrinsic
    def load_acquire(typingctx, array, index):
        def codegen(context, builder, signature, args):
            return builder.load_atomic(pointer(context, builder, signature.args[0], *args), "acquire", 8)
        return array.dtype(array, index), codegen

    @intrinsic
    def store_release(typingctx, array, index, value):
        def codegen(context, builder, signature, args):
            dtype = signature.args[0].dtype
            builder.store_atomic(context.cast(builder, args[2], signature.args[2], dtype),
                                 pointer(context, builder, signature.args[0], args[0], args[1]), "release", 8)
            return context.get_dummy_value()
        return types.void(array, index, value), codegen

    @intrinsic
    def swap(typingctx, array, index, expected, new):
        def codegen(context, builder, signature, args):
            dtype = signature.args[0].dtype
            pair = builder.cmpxchg(pointer(context, builder, signature.args[0], args[0], args[1]),
                                   context.cast(builder, args[2], signature.args[2], dtype),
                                   context.cast(builder, args[3], signature.args[3], dtype), "acq_rel", "acquire")
            return builder.extract_value(pair, 1)
        return types.boolean(array, index, expected, new), codegen

    @intrinsic
    def call(typingctx, address, arguments):
        """The function at `address` called with a tuple of integers (pointers), for its int result."""
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            word = ir.IntType(64)
            values = cgutils.unpack_tuple(builder, args[1], len(signature.args[1]))
            function = builder.inttoptr(args[0], ir.FunctionType(ir.IntType(32), [word] * len(values)).as_pointer())
            return builder.call(function, values)
        return types.int32(address, arguments), codegen
    return load_acquire, store_release, swap, call


def _run_rows(table, first, last, sgemm, ints, floats, chars):
    # Row-major C = op(A) @ op(B) is, column-major, C^T = op(B)^T @ op(A)^T.
    for r in range(first, last):
        ints[0] = table[r, N]
        ints[1] = table[r, M]
        ints[2] = table[r, K]
        ints[3] = table[r, LDB]
        ints[4] = table[r, LDA]
        ints[5] = table[r, LDC]
        at, one, trans = np.int64(ints.ctypes.data), np.int64(floats.ctypes.data), np.int64(chars.ctypes.data)
        w = np.int64(ints.itemsize)  # BLAS's integers: 4 or 8 bytes
        _call(sgemm, (trans + table[r, TB], trans + table[r, TA], at, at + w, at + 2 * w, one, table[r, B],
                      at + 3 * w, table[r, A], at + 4 * w, one + 4, table[r, C], at + 5 * w))


def _serve(slots, k, table, sgemm, ints, floats, chars, sched_yield, spins):
    """Worker k's loop: run the rows posted to it; return SLEEPING after `spins` idle
    sched_yields (its state set so), or STOP."""
    at = k * SLOT
    done = _load_acquire(slots, at + DONE)
    idle = 0
    while True:
        state = _load_acquire(slots, at + STATE)
        if state == POSTED:
            _run_rows(table, slots[at + FIRST], slots[at + LAST], sgemm, ints, floats, chars)
            done += 1
            # IDLE before DONE: the caller posts again only after DONE (unless told to stop meanwhile).
            stopped = not _swap(slots, at + STATE, POSTED, IDLE)
            _store_release(slots, at + DONE, done)
            if stopped:
                return STOP
            idle = 0
        elif state == STOP:
            return STOP
        elif idle >= spins:
            if _swap(slots, at + STATE, IDLE, SLEEPING):
                return SLEEPING
        else:
            idle += 1
            _call(sched_yield, ())


def _post(slots, workers, asleep):
    """Mark workers 0..workers-1 posted (their rows set before); asleep[k]: whether worker k
    was asleep (to be woken)."""
    for k in range(workers):
        at = k * SLOT
        asleep[k] = not _swap(slots, at + STATE, IDLE, POSTED)
        if asleep[k]:
            _store_release(slots, at + STATE, POSTED)


def _finish(slots, workers, done, sched_yield, usleep):
    """Wait until workers 0..workers-1 have done their post number done[k]: spinning, then
    sched_yield between looks, then (after WAIT_YIELDS) sleeping WAIT_SLEEP_US between looks,
    which frees this core for the worker where another thread holds the other one."""
    for k in range(workers):
        spins = 0
        while _load_acquire(slots, k * SLOT + DONE) < done[k]:
            spins += 1
            if spins >= 64 + WAIT_YIELDS:
                _call(usleep, (WAIT_SLEEP_US,))
            elif spins >= 64:
                _call(sched_yield, ())


def _stop(slots, k):
    """Tell worker k to stop: whether it was asleep."""
    at = k * SLOT
    while True:
        state = _load_acquire(slots, at + STATE)
        if _swap(slots, at + STATE, state, STOP):
            return state == SLEEPING


def _compile(numba, sgemm, integer, sched_yield, usleep):
    """The pool's functions compiled (or loaded from numba's cache), as a namespace; `sgemm`
    takes its dimensions as numpy integer type `integer` (np.int32 or np.int64)."""
    from numba import types
    from numba.core import cgutils
    from numba.core.extending import intrinsic
    global _load_acquire, _store_release, _swap, _call, _run_rows
    _load_acquire, _store_release, _swap, _call = _intrinsics(types, cgutils, intrinsic)
    njit = functools.partial(numba.njit, nogil=True, cache=True)
    _run_rows = njit(_run_rows)

    # Each function's machine code for the one signature it is called with: its entry point
    # skips the dispatcher's typing of the arguments on each call (several us for serve's nine).
    i64, flags = types.int64, types.Array(types.boolean, 1, "C")
    slots, table = types.Array(i64, 1, "C"), types.Array(i64, 2, "C")
    blas = (types.Array(numba.from_dtype(np.dtype(integer)), 1, "C"), types.Array(types.float32, 1, "C"),
            types.Array(types.uint8, 1, "C"))
    signatures = {_run_rows: (table, i64, i64, i64) + blas, _serve: (slots, i64, table, i64) + blas + (i64, i64),
                  _post: (slots, i64, flags), _finish: (slots, i64, slots, i64, i64),
                  _stop: (slots, i64)}

    native = SimpleNamespace(sgemm=sgemm, integer=integer, sched_yield=sched_yield, usleep=usleep)
    for f, signature in signatures.items():
        dispatcher = f if f is _run_rows else njit(f)
        setattr(native, f.__name__.lstrip("_"), dispatcher.compile(signature))
    return native


def _blas_args(integer):
    """A thread's sgemm scratch: 6 dimensions (of numpy integer type `integer`), alpha = 1 and
    beta = 0, 'N' and 'T'."""
    return np.zeros(8, integer), np.array([1, 0], np.float32), np.frombuffer(b"NT", np.uint8).copy()


class Pool:
    """`n` native worker threads: `run(table, spans)` runs products on them."""

    def __init__(self, n):
        self.native = _build()
        self.n = n
        self.slots = np.zeros(n * SLOT, np.int64)
        self.table = np.zeros((CAPACITY, WIDTH), np.int64)
        self.posted = np.zeros(n, np.int64)
        self.asleep = np.zeros(n, np.bool_)
        self.wakes = [threading.Lock() for _ in range(n)]
        self.mine = _blas_args(self.native.integer)
        self.pid = os.getpid()  # a forked child has none of these threads
        self.closed = False
        for k, wake in enumerate(self.wakes):
            wake.acquire()
            threading.Thread(target=_work, args=(self, k), name="edgeflow-native-worker", daemon=True).start()

    def run(self, table, spans):
        """Run `table`'s rows: spans[0] (first, last) on this thread, spans[1 + k] on worker k."""
        self.table[:len(table)] = table
        if self.closed or os.getpid() != self.pid:  # no workers to post to
            self.native.run_rows(self.table, 0, len(table), self.native.sgemm, *self.mine)
            return
        for k, (first, last) in enumerate(spans[1:]):
            self.slots[k * SLOT + FIRST] = first
            self.slots[k * SLOT + LAST] = last
        self._post(len(spans) - 1)
        try:
            self.native.run_rows(self.table, spans[0][0], spans[0][1], self.native.sgemm, *self.mine)
        finally:
            self.native.finish(self.slots, len(spans) - 1, self.posted, self.native.sched_yield, self.native.usleep)

    def run_here(self, table):
        """Run `table`'s rows on this thread alone."""
        self.native.run_rows(table, 0, len(table), self.native.sgemm, *self.mine)

    def _post(self, workers):
        self.posted[:workers] += 1
        self.native.post(self.slots, workers, self.asleep)
        for k in np.flatnonzero(self.asleep[:workers]):
            self.wakes[k].release()

    def close(self):
        self.closed = True
        for k, wake in enumerate(self.wakes):
            if self.native.stop(self.slots, k):
                wake.release()


def _work(pool, k):
    """Worker k's thread: native.serve until it stops, sleeping on its lock when it returns
    SLEEPING."""
    native, slots, wake = pool.native, pool.slots, pool.wakes[k]
    ints, floats, chars = _blas_args(native.integer)
    while native.serve(slots, k, pool.table, native.sgemm, ints, floats, chars, native.sched_yield,
                       SPIN_YIELDS) != STOP:
        wake.acquire()  # the next post releases it


def _operand(x):
    """(address, leading dimension, transposed) of a 2-D float32 array as BLAS reads it, or None."""
    rows, cols = x.shape
    step = x.itemsize
    s0, s1 = x.strides
    if (cols == 1 or s1 == step) and (rows == 1 or (s0 % step == 0 and s0 // step >= max(1, cols))):
        return x.ctypes.data, (s0 // step if rows > 1 else max(1, cols)), 0
    if (rows == 1 or s0 == step) and (cols == 1 or (s1 % step == 0 and s1 // step >= max(1, rows))):
        return x.ctypes.data, (s1 // step if cols > 1 else max(1, rows)), 1
    return None


def gemms(part):
    """The table rows computing `part`, a functools.partial(np.matmul, a, b, out=c) of
    float32 operands (a and b broadcast over c's leading axes), or None where it is not such
    a product, an operand is not in a layout BLAS reads, or c is a vector (the part then
    runs as is)."""
    if not (isinstance(part, functools.partial) and part.func is np.matmul and len(part.args) == 2
            and set(part.keywords) == {"out"}):
        return None
    a, b = part.args
    c = part.keywords["out"]
    if not all(isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 2 and x.size for x in (a, b, c)):
        return None
    if c.shape[-2:] != (a.shape[-2], b.shape[-1]) or a.shape[-1] != b.shape[-2] or a.shape[-1] == 0 \
            or np.may_share_memory(c, a) or np.may_share_memory(c, b) or not c.flags.writeable:
        return None
    if 1 in c.shape[-2:]:  # a matrix-vector product: sgemm runs it 5-10x slower than numpy's
        return None        # sgemv (1x1024 @ 1024x1000: 590 us against 86)
    batch = c.shape[:-2]
    try:
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
    except ValueError:
        return None
    rows = []
    for index in np.ndindex(batch):
        out = _operand(c[index])
        left, right = _operand(a[index]), _operand(b[index])
        if out is None or (out[2] and c.shape[-2] > 1 and c.shape[-1] > 1) or left is None or right is None:
            return None
        rows.append((c.shape[-2], c.shape[-1], a.shape[-1], *left, *right, out[0], out[1]))
    return rows
