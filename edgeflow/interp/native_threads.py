"""Intra-op workers in native code: matrix products split over threads without the GIL.

threads.Workers hands a piece of an op to a Python thread through locks. On this project's
2-core VM that costs as much as the piece where a piece takes 50-300 us (a MobileNetV2
pointwise conv at batch 1): the worker sleeps on a futex, and waking it, then handing the
GIL to it and back, are several wake-ups of a halted core. A 192x32 @ 32x784 product took
141 us on one thread and 131 split in two by rows that way (278 by columns); OpenBLAS's
own two threads took 104.

Here each worker is a thread inside a native function (LLVM IR built and compiled with
llvmlite, called through ctypes, which lets go of the GIL): it spins on its slot of a shared array (calling sched_yield, so that it gives way on a shared core)
for a posted list of sgemm calls, runs them through BLAS (numpy's own OpenBLAS where it is
found, else scipy's cython_blas sgemm; called by address), and marks them done; the caller
runs its own share meanwhile and spins until every worker is done. No lock, no GIL, no
futex on the way: the same split by rows
took 86-107 us (0.6-0.8 of one thread's time; 0.5-0.7 for products of 150 us or more). A
worker that finds nothing for SPIN_YIELDS sched_yields goes to sleep on a lock (through
Python); the next post wakes it that way, once.

numba's own thread pools were measured for this first (a prange over two rows, on this
machine): its workqueue layer costs 36 us a region; its OpenMP layer 2.6 us, but needs
the system's libgomp, and GNU OpenMP is not fork-safe; its TBB layer did not
load with PyPI's tbb 2023.

The functions were numba's first; numba's import and the load of its cache cost an
interpreter with threads 0.7-1.2 s when it was made (ResNet-18's first run at 2 threads),
llvmlite's import and this module's compile some 60 ms. numba's own thread pools were
measured too (below).

Available where llvmlite (numba's compiler, the `jit` extra) imports, and numpy's OpenBLAS
is found or scipy (`fast`) imports, on platforms with sched_yield; elsewhere Workers keeps
its lock hand-off.
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

# A row of a posted table: C (M, N) = op(A) (M, K) @ op(B) (K, N), row-major, where op
# transposes an operand whose elements run down its columns (TA, TB: 0 or 1). A row whose
# TA is CALL calls the function at address A with the one argument B instead (a compiled
# kernel's piece: kernels/native_gemm.py's products). A row whose TA is GEMV calls BLAS's
# sgemv (its address in K) as Fortran sees it: y = op(A) x for the column-major M x N
# matrix at A (leading dimension LDA; op transposes it where TB is 1), x at B (LDB floats
# apart), y at C (LDC apart): a product with a one-row or one-column result.
M, N, K, A, LDA, TA, B, LDB, TB, C, LDC = range(11)
WIDTH = 11
CALL, GEMV = 2, 3
IDLE, POSTED, SLEEPING, STOP = 0, 1, 2, 3
# State, done count, first and last row, the table's address: one 64-byte line a worker, so
# that two workers' slots do not share a cache line.
SLOT = 8
STATE, DONE, FIRST, LAST, TABLE = range(5)
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


def available():
    """Whether native workers can run here (llvmlite imports, a BLAS sgemm is found,
    sched_yield exists)."""
    return _build() is not None


@functools.lru_cache(maxsize=None)
def libc_address(name):
    """The address of the C library's function `name` (sched_yield, usleep): an OSError or
    AttributeError where there is none."""
    return ctypes.cast(getattr(ctypes.CDLL(ctypes.util.find_library("c")), name), ctypes.c_void_p).value


def _build():
    if _built:
        return _built[0]
    _built.append(None)
    try:
        from llvmlite import binding, ir  # the jit extra's (numba's compiler)
        sched_yield, usleep = libc_address("sched_yield"), libc_address("usleep")
        blas = _numpy_blas()
        if blas is None:
            from scipy.linalg import cython_blas
            blas = (_capsule_address(cython_blas.__pyx_capi__["sgemm"]),
                    _capsule_address(cython_blas.__pyx_capi__["sgemv"]), np.int32)
    except (ImportError, OSError, AttributeError, TypeError):
        return None
    _built[0] = _compile(binding, ir, *blas, sched_yield, usleep)
    return _built[0]


def _numpy_blas():
    """(sgemm's address, sgemv's, integer type) of numpy's own BLAS, or None: the
    64-bit-integer OpenBLAS that numpy's wheels bundle (its sgemm named scipy_sgemm_64_
    there), found among the loaded libraries by threadpoolctl. Its results are numpy's
    matmul's, bit for bit, and it ran the pointwise convs' products 25% faster than scipy's
    build of OpenBLAS (24x96 @ 96x1568: 122 us against 183); elsewhere scipy's cython_blas
    serves."""
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
        for prefix, suffix in (("scipy_", "_64_"), ("", "_64_"), ("", "64_")):
            gemm, gemv = (getattr(library, f"{prefix}{name}{suffix}", None) for name in ("sgemm", "sgemv"))
            if gemm is not None and gemv is not None:
                return (ctypes.cast(gemm, ctypes.c_void_p).value, ctypes.cast(gemv, ctypes.c_void_p).value,
                        np.int64)
    return None


def _capsule_address(capsule):
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return pointer(capsule, name(capsule))


class _Emitter:
    """An LLVM IR function (llvmlite.ir) whose arguments and result are 64-bit integers
    (addresses too), with the few statements the pool's loops need: variables, loops,
    branches, atomic accesses to int64 array elements and calls through an address."""

    def __init__(self, ir, module, name, params):
        self.ir, self.i64 = ir, ir.IntType(64)
        self.function = ir.Function(module, ir.FunctionType(self.i64, [self.i64] * len(params)), name=name)
        self.args = dict(zip(params, self.function.args))
        self.b = ir.IRBuilder(self.function.append_basic_block("entry"))

    def const(self, value):
        return self.ir.Constant(self.i64, value)

    def variable(self, value):
        """A variable set to `value` here (its slot in the entry block, as LLVM wants: an
        alloca in a loop would take more stack each time round)."""
        with self.b.goto_entry_block():
            slot = self.b.alloca(self.i64)
        self.b.store(value, slot)
        return slot

    def pointer(self, base, index, dtype=None):
        """The address of element `index` of the array at address `base`, as a pointer."""
        dtype = dtype or self.i64
        address = self.b.add(base, self.b.mul(index, self.const(dtype.width // 8)))
        return self.b.inttoptr(address, dtype.as_pointer())

    def _typed(self, pointer):
        """load()'s type argument where pointers are opaque (llvmlite's newer IR layer);
        older llvmlite (0.43) takes none and reads the pointer's own."""
        return {"typ": self.i64} if getattr(pointer.type, "is_opaque", False) else {}

    def load(self, base, index, order=None):
        return self.read(self.pointer(base, index), order)

    def read(self, pointer, order=None):
        if order is None:
            return self.b.load(pointer, **self._typed(pointer))
        return self.b.load_atomic(pointer, order, 8, **self._typed(pointer))

    def store_release(self, base, index, value):
        self.b.store_atomic(value, self.pointer(base, index), "release", 8)

    def swap(self, base, index, expected, new):
        """Compare-and-swap: whether the element held `expected` (it then holds `new`)."""
        pair = self.b.cmpxchg(self.pointer(base, index), expected, new, "acq_rel", "acquire")
        return self.b.extract_value(pair, 1)

    def call(self, address, arguments, result=None):
        result = result or self.ir.IntType(32)
        kind = self.ir.FunctionType(result, [self.i64] * len(arguments))
        return self.b.call(self.b.inttoptr(address, kind.as_pointer()), arguments)

    def block(self, name):
        return self.function.append_basic_block(name)

    def loop_over(self, first, last, body):
        """for i in range(first, last): body(i)."""
        i = self.variable(first)
        test, inside, after = self.block("test"), self.block("body"), self.block("after")
        self.b.branch(test)
        self.b.position_at_end(test)
        value = self.read(i)
        self.b.cbranch(self.b.icmp_signed("<", value, last), inside, after)
        self.b.position_at_end(inside)
        body(value)
        self.b.store(self.b.add(value, self.const(1)), i)
        self.b.branch(test)
        self.b.position_at_end(after)


def _module(ir, integer_bits):
    """The pool's functions in LLVM IR (each described where its Python use is): run_rows,
    serve, rouse, finish, dispatch, stop. BLAS's integers are `integer_bits` wide."""
    module = ir.Module(name="edgeflow_native_threads")
    blas_int = ir.IntType(integer_bits)

    e = _Emitter(ir, module, "run_rows", ("table", "first", "last", "sgemm", "ints", "floats", "chars"))
    a = e.args

    def row(r):
        # Row-major C = op(A) @ op(B) is, column-major, C^T = op(B)^T @ op(A)^T.
        at = e.b.mul(r, e.const(WIDTH))
        field = {f: e.load(a["table"], e.b.add(at, e.const(f))) for f in range(WIDTH)}
        call, product, done = e.block("call"), e.block("product"), e.block("row_done")
        gemv, not_call = e.block("gemv"), e.block("not_call")
        e.b.cbranch(e.b.icmp_signed("==", field[TA], e.const(CALL)), call, not_call)
        e.b.position_at_end(call)
        e.call(field[A], [field[B]], e.i64)
        e.b.branch(done)
        e.b.position_at_end(not_call)
        e.b.cbranch(e.b.icmp_signed("==", field[TA], e.const(GEMV)), gemv, product)
        e.b.position_at_end(gemv)
        for k, f in enumerate((M, N, LDA, LDB, LDC)):
            e.b.store(e.b.trunc(field[f], blas_int) if integer_bits < 64 else field[f],
                      e.pointer(a["ints"], e.const(k), blas_int))
        ints = [e.b.add(a["ints"], e.const(k * integer_bits // 8)) for k in range(5)]
        e.call(field[K], [e.b.add(a["chars"], field[TB]), ints[0], ints[1], a["floats"], field[A], ints[2],
                          field[B], ints[3], e.b.add(a["floats"], e.const(4)), field[C], ints[4]])
        e.b.branch(done)
        e.b.position_at_end(product)
        for k, f in enumerate((N, M, K, LDB, LDA, LDC)):
            e.b.store(e.b.trunc(field[f], blas_int) if integer_bits < 64 else field[f],
                      e.pointer(a["ints"], e.const(k), blas_int))
        dims = [e.b.add(a["ints"], e.const(k * integer_bits // 8)) for k in range(6)]
        e.call(a["sgemm"], [e.b.add(a["chars"], field[TB]), e.b.add(a["chars"], field[TA]), dims[0], dims[1], dims[2],
                            a["floats"], field[B], dims[3], field[A], dims[4], e.b.add(a["floats"], e.const(4)),
                            field[C], dims[5]])
        e.b.branch(done)
        e.b.position_at_end(done)
    e.loop_over(a["first"], a["last"], row)
    e.b.ret(e.const(0))
    run_rows = e.function

    e = _Emitter(ir, module, "serve", ("slots", "k", "sgemm", "ints", "floats", "chars", "sched_yield", "spins"))
    a = e.args
    at = e.b.mul(a["k"], e.const(SLOT))
    state_at, done_at = e.b.add(at, e.const(STATE)), e.b.add(at, e.const(DONE))
    done = e.variable(e.load(a["slots"], done_at, "acquire"))
    idle = e.variable(e.const(0))
    look, posted, other, stop, spin, give_up, yield_, leave = (
        e.block(n) for n in ("look", "posted", "other", "stop", "spin", "give_up", "yield", "leave"))
    e.b.branch(look)
    e.b.position_at_end(look)
    state = e.load(a["slots"], state_at, "acquire")
    e.b.cbranch(e.b.icmp_signed("==", state, e.const(POSTED)), posted, other)
    e.b.position_at_end(posted)
    e.b.call(run_rows, [e.load(a["slots"], e.b.add(at, e.const(TABLE))), e.load(a["slots"], e.b.add(at, e.const(FIRST))),
                        e.load(a["slots"], e.b.add(at, e.const(LAST))), a["sgemm"], a["ints"], a["floats"], a["chars"]])
    count = e.b.add(e.read(done), e.const(1))
    e.b.store(count, done)
    # IDLE before DONE: the caller posts again only after DONE (unless told to stop meanwhile).
    kept = e.swap(a["slots"], state_at, e.const(POSTED), e.const(IDLE))
    e.store_release(a["slots"], done_at, count)
    e.b.store(e.const(0), idle)
    e.b.cbranch(kept, look, leave)
    e.b.position_at_end(other)
    e.b.cbranch(e.b.icmp_signed("==", state, e.const(STOP)), leave, spin)
    e.b.position_at_end(spin)
    idled = e.read(idle)
    e.b.cbranch(e.b.icmp_signed(">=", idled, a["spins"]), give_up, yield_)
    e.b.position_at_end(give_up)
    e.b.cbranch(e.swap(a["slots"], state_at, e.const(IDLE), e.const(SLEEPING)), stop, look)
    e.b.position_at_end(yield_)
    e.b.store(e.b.add(idled, e.const(1)), idle)
    e.call(a["sched_yield"], [])
    e.b.branch(look)
    e.b.position_at_end(stop)
    e.b.ret(e.const(SLEEPING))
    e.b.position_at_end(leave)
    e.b.ret(e.const(STOP))

    e = _Emitter(ir, module, "rouse", ("slots", "workers", "asleep"))
    a = e.args

    def rouse(k):  # a sleeping worker back to looking for work, without any: asleep[k] says which
        state_at = e.b.add(e.b.mul(k, e.const(SLOT)), e.const(STATE))
        woke = e.swap(a["slots"], state_at, e.const(SLEEPING), e.const(IDLE))
        e.b.store(e.b.zext(woke, ir.IntType(8)), e.pointer(a["asleep"], k, ir.IntType(8)))
    e.loop_over(e.const(0), a["workers"], rouse)
    e.b.ret(e.const(0))

    e = _Emitter(ir, module, "finish", ("slots", "workers", "done", "sched_yield", "usleep"))
    a = e.args

    def finish(k):
        done_at = e.b.add(e.b.mul(k, e.const(SLOT)), e.const(DONE))
        want = e.load(a["done"], k)
        spins = e.variable(e.const(0))
        look, wait, after = e.block("look"), e.block("wait"), e.block("after")
        e.b.branch(look)
        e.b.position_at_end(look)
        e.b.cbranch(e.b.icmp_signed("<", e.load(a["slots"], done_at, "acquire"), want), wait, after)
        e.b.position_at_end(wait)
        count = e.b.add(e.read(spins), e.const(1))
        e.b.store(count, spins)
        with e.b.if_else(e.b.icmp_signed(">=", count, e.const(64 + WAIT_YIELDS))) as (sleep, other):
            with sleep:
                e.call(a["usleep"], [e.const(WAIT_SLEEP_US)])
            with other:
                with e.b.if_then(e.b.icmp_signed(">=", count, e.const(64))):
                    e.call(a["sched_yield"], [])
        e.b.branch(look)
        e.b.position_at_end(after)
    e.loop_over(e.const(0), a["workers"], finish)
    e.b.ret(e.const(0))
    finish = e.function

    e = _Emitter(ir, module, "dispatch", ("slots", "workers", "table", "spans", "posted", "asleep", "sgemm", "ints",
                                          "floats", "chars", "sched_yield", "usleep"))
    a = e.args
    slept = e.variable(e.const(0))

    def hand(k):  # worker k's rows and the table posted (the swap releases the stores before it)
        at = e.b.mul(k, e.const(SLOT))
        for field, value in ((FIRST, e.load(a["spans"], e.b.add(e.b.mul(k, e.const(2)), e.const(2)))),
                             (LAST, e.load(a["spans"], e.b.add(e.b.mul(k, e.const(2)), e.const(3)))),
                             (TABLE, a["table"])):
            e.b.store(value, e.pointer(a["slots"], e.b.add(at, e.const(field))))
        count = e.pointer(a["posted"], k)
        e.b.store(e.b.add(e.read(count), e.const(1)), count)
        woke = e.swap(a["slots"], e.b.add(at, e.const(STATE)), e.const(IDLE), e.const(POSTED))
        e.b.store(e.b.zext(e.b.not_(woke), ir.IntType(8)), e.pointer(a["asleep"], k, ir.IntType(8)))
        with e.b.if_then(e.b.not_(woke)):
            e.store_release(a["slots"], e.b.add(at, e.const(STATE)), e.const(POSTED))
            e.b.store(e.const(1), slept)
    e.loop_over(e.const(0), a["workers"], hand)
    asleep, awake = e.block("asleep"), e.block("awake")
    e.b.cbranch(e.b.icmp_signed("!=", e.read(slept), e.const(0)), asleep, awake)
    e.b.position_at_end(asleep)
    e.b.ret(e.const(1))  # the caller wakes the sleepers first, then runs its rows and waits
    e.b.position_at_end(awake)
    e.b.call(run_rows, [a["table"], e.load(a["spans"], e.const(0)), e.load(a["spans"], e.const(1)), a["sgemm"],
                        a["ints"], a["floats"], a["chars"]])
    e.b.call(finish, [a["slots"], a["workers"], a["posted"], a["sched_yield"], a["usleep"]])
    e.b.ret(e.const(0))

    e = _Emitter(ir, module, "stop", ("slots", "k"))
    a = e.args
    state_at = e.b.add(e.b.mul(a["k"], e.const(SLOT)), e.const(STATE))
    look, stopped = e.block("look"), e.block("stopped")
    e.b.branch(look)
    e.b.position_at_end(look)
    state = e.load(a["slots"], state_at, "acquire")
    e.b.cbranch(e.swap(a["slots"], state_at, state, e.const(STOP)), stopped, look)
    e.b.position_at_end(stopped)
    e.b.ret(e.b.zext(e.b.icmp_signed("==", state, e.const(SLEEPING)), e.i64))
    return module


def _compile(llvm, ir, sgemm, sgemv, integer, sched_yield, usleep):
    """The pool's functions compiled with llvmlite (numba's LLVM binding, without numba: 50 ms
    against numba's 0.7-1.2 s to import and load its cache), as a namespace of ctypes
    functions taking addresses and integers; `sgemm` takes its dimensions as numpy integer
    type `integer` (np.int32 or np.int64). ctypes lets go of the GIL for each call.
    `llvm` and `ir`: llvmlite's modules."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(str(_module(ir, np.dtype(integer).itemsize * 8)))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine(opt=2))
    engine.finalize_object()
    native = SimpleNamespace(engine=engine, sgemm=sgemm, sgemv=sgemv, integer=integer, sched_yield=sched_yield,
                             usleep=usleep)
    for name, arity in (("run_rows", 7), ("serve", 8), ("rouse", 3), ("finish", 5), ("dispatch", 12), ("stop", 2)):
        kind = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_int64] * arity)
        setattr(native, name, kind(engine.get_function_address(name)))
    return native


def _blas_args(integer):
    """A thread's sgemm scratch: 6 dimensions (of numpy integer type `integer`), alpha = 1 and
    beta = 0, 'N' and 'T'."""
    return np.zeros(8, integer), np.array([1, 0], np.float32), np.frombuffer(b"NT", np.uint8).copy()


def _addresses(*arrays):
    return tuple(a.ctypes.data for a in arrays)


class Pool:
    """`n` native worker threads: `run(table, spans)` runs products on them."""

    def __init__(self, n):
        self.native = _build()
        self.n = n
        self.slots = np.zeros(n * SLOT, np.int64)
        self.posted = np.zeros(n, np.int64)
        self.asleep = np.zeros(n, np.bool_)
        self.wakes = [threading.Lock() for _ in range(n)]
        self.mine = _blas_args(self.native.integer)
        # The native functions take addresses: these arrays live as long as the pool.
        self._slots, self._posted, self._asleep = _addresses(self.slots, self.posted, self.asleep)
        self._mine = (self.native.sgemm, *_addresses(*self.mine))
        self.pid = os.getpid()  # a forked child has none of these threads
        self.closed = False
        for k, wake in enumerate(self.wakes):
            wake.acquire()
            threading.Thread(target=_work, args=(self, k), name="edgeflow-native-worker", daemon=True).start()

    def prepare(self, table, spans):
        """(table, spans) as `run_prepared` takes them: int64 arrays (the rows; each span's
        first and last row, the caller's first) and their addresses, made once a step."""
        table = np.ascontiguousarray(table, np.int64)
        flat = np.array([x for span in spans for x in span], np.int64)
        return table, flat, table.ctypes.data, flat.ctypes.data, len(spans) - 1

    def run(self, table, spans):
        """Run `table`'s rows: spans[0] (first, last) on this thread, spans[1 + k] on worker k."""
        self.run_prepared(self.prepare(table, spans))

    def run_prepared(self, prepared):
        """`run` of `prepare`'s arrays: one native call posts the workers' rows, runs this
        thread's and waits for theirs (a split of two small products took 20.8 us where the
        table's copy, the posts and the wait were Python's, 4.8 so); where a worker was
        asleep, it returns first, and the rest follows once its lock is released."""
        table, spans, table_at, spans_at, workers = prepared
        if self.closed or os.getpid() != self.pid:  # no workers to post to
            self.native.run_rows(table_at, 0, len(table), *self._mine)
            return
        if self.native.dispatch(self._slots, workers, table_at, spans_at, self._posted, self._asleep, *self._mine,
                                self.native.sched_yield, self.native.usleep):
            for k in np.flatnonzero(self.asleep[:workers]):
                self.wakes[k].release()
            try:
                self.native.run_rows(table_at, spans[0], spans[1], *self._mine)
            finally:
                self.native.finish(self._slots, workers, self._posted, self.native.sched_yield, self.native.usleep)

    def run_here(self, table):
        """Run `table`'s rows (an int64 array of WIDTH columns) on this thread alone."""
        table = np.ascontiguousarray(table, np.int64)
        self.native.run_rows(table.ctypes.data, 0, len(table), *self._mine)

    def wake(self):
        """Bring the sleeping workers back to spinning (for SPIN_YIELDS sched_yields), with no
        work yet: a run calls it as it starts, so that its first split finds them awake
        rather than paying their wake-up then (BERT's first product at 2 threads, batch 1,
        its workers asleep since the last run: 0.9 ms alone, 1.1-1.2 split)."""
        if self.closed or os.getpid() != self.pid:
            return
        asleep = np.zeros(self.n, np.bool_)  # this call's own: a run on another thread writes self.asleep
        self.native.rouse(self._slots, self.n, asleep.ctypes.data)
        for k in np.flatnonzero(asleep):
            self.wakes[k].release()

    def close(self):
        self.closed = True
        for k, wake in enumerate(self.wakes):
            if self.native.stop(self._slots, k):
                wake.release()


def _work(pool, k):
    """Worker k's thread: native.serve until it stops, sleeping on its lock when it returns
    SLEEPING."""
    native, wake = pool.native, pool.wakes[k]
    scratch = _blas_args(native.integer)  # kept alive while it serves
    arguments = (pool._slots, k, native.sgemm, *_addresses(*scratch), native.sched_yield)
    while native.serve(*arguments, SPIN_YIELDS) != STOP:
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


def _gemv(a, b, c):
    """The GEMV row computing c = a @ b, c (1, N) or (M, 1), or None where an operand's
    layout is not BLAS's (a vector's elements a positive whole number of floats apart)."""
    column = c.shape[0] > 1
    matrix, vector = (a, b[:, 0]) if column else (b, a[0])
    y = c[:, 0] if column else c[0]
    found = _operand(matrix)
    if found is None or any(v.strides[0] <= 0 or v.strides[0] % 4 for v in (vector, y) if v.size > 1):
        return None
    native = _build()
    if native is None:
        return None
    address, ld, transposed = found
    # Row-major (R, S) with ld is, column-major, (S, R): op(A) x transposes it back where
    # the product wants (R, S) @ x (a column's), and keeps it where it wants x @ (R, S).
    rows, cols = matrix.shape
    if transposed:  # column-major (R, S) as stored
        m, n, trans = rows, cols, 0 if column else 1
    else:
        m, n, trans = cols, rows, 1 if column else 0
    return (m, n, native.sgemv, address, max(ld, m), GEMV, vector.ctypes.data,
            max(1, vector.strides[0] // 4), trans, y.ctypes.data, max(1, y.strides[0] // 4))


def gemms(part):
    """The table rows computing `part`, a functools.partial(np.matmul, a, b, out=c) of
    float32 operands (a and b broadcast over c's leading axes; sgemv's rows where c is one
    row or column), or None where it is not such a product or an operand is not in a
    layout BLAS reads (the part then runs as is). A part with a `native_call` attribute, (address, argument) of a compiled
    function taking one int64, is one CALL row; a threads.chain of such parts, their rows
    in turn."""
    call = getattr(part, "native_call", None)
    if call is not None:
        return [(0, 0, 0, call[0], 0, CALL, call[1], 0, 0, 0, 0)]
    chained = getattr(part, "chained", None)
    if chained is not None:
        rows = [gemms(step) for step in chained]
        return None if None in rows else [row for found in rows for row in found]
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
    vector = 1 in c.shape[-2:]  # sgemv's: sgemm ran 1x1024 @ 1024x1000 in 590 us, numpy's sgemv 86
    batch = c.shape[:-2]
    try:
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
    except ValueError:
        return None
    rows = []
    for index in np.ndindex(batch):
        if vector:
            row = _gemv(a[index], b[index], c[index])
            if row is None:
                return None
            rows.append(row)
            continue
        out = _operand(c[index])
        left, right = _operand(a[index]), _operand(b[index])
        if out is None or (out[2] and c.shape[-2] > 1 and c.shape[-1] > 1) or left is None or right is None:
            return None
        rows.append((c.shape[-2], c.shape[-1], a.shape[-1], *left, *right, out[0], out[1]))
    return rows
