"""Loops compiled by numba, for kernels numpy can only run as several passes.

numpy makes one pass over memory per ufunc: a depthwise conv one multiply-add pass per
tap, a conv's bias and fused activation two more over its output, a layer norm seven over
its input, an exact GELU five. Each loop here makes one pass, keeping what it reuses (a
channel's accumulator, a row of a layer norm) in cache. Softmax stays numpy's: numba's
scalar exp made it 1.3x slower than numpy's SIMD one (benchmarks/bench_jit.py). The float32
activations (sigmoid, swish, hard_sigmoid, hard_swish, gelu) run on `_exp_nonpositive`, an exp
written in arithmetic LLVM vectorizes (faster than numpy's), one pass each where numpy needs 3-5.

numba is optional (the `jit` extra): it is imported on the first bind, never by `import
edgeflow.interp`, and each `bind_*` returns None where numba is absent, disabled
(EDGEFLOW_JIT=0 when the kernel binds, or a plan made under `using(False)`: an
Interpreter's jit=False) or the operands are not ones its loop takes; the kernel then runs
its numpy path. By default a plan wants numba where a kernel that gains much from its
loop asks for it (available()) or the plan does PLAN_FLOPS or more arithmetic operations a
run; the other kernels take theirs only where it is loaded already. Importing it and
readying its first loop cost 0.8-1.7 s, which no first run waits for: a plan made before
numba is loaded binds without it, and one that wants it is provisional, made again with
the loops once numba has loaded in the background (`deferred`, `warm`, `ready`).
Interpreter(jit=True) imports it up front, so that every kernel binds its loop; jit=False
never. The loops are plain
Python at module level, compiled by `numba.njit(cache=True)` (no fastmath: the float
arithmetic as written, but for the activation loops' fused multiply-adds, _FASTMATH) for
the argument types of each bind, at prepare time; later processes load the machine code from numba's on-disk cache.
"""
import contextvars
import math
import os
import threading
import time

import numpy as np

from .. import threads
from ..arena import scratch
from ..scoped import scoped

# Fused activation codes of the loops (edgeflow.ops.registry.ACTIVATIONS).
ACTIVATION_CODES = {"": 0, None: 0, "relu": 1, "relu6": 2, "swish": 3, "hard_swish": 4}
# The codes computed on _exp_nonpositive and float32 constants: float32 loops only (float64 runs numpy's).
FLOAT32_ACTIVATIONS = 3
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_numba = []
_compiled = {}
_ENTRIES = {}  # (loop name, entry, the arguments' kinds) -> what `compiled` returns for them
# Seconds spent in the first bind of each loop in this process (a compile, or a load from
# numba's cache), and in importing numba ("import numba"): the prepare-time cost of the JIT.
BIND_SECONDS = {}


# The JIT mode of the plan being made (an Interpreter's `jit`): None, the default policy;
# True, numba imported up front; False, numpy's kernels only.
_MODE = contextvars.ContextVar("edgeflow_jit", default=None)
# While a plan binds provisionally (`deferred`): the list where available() notes that a
# kernel asked for numba.
_DEFERRED = contextvars.ContextVar("edgeflow_jit_deferred", default=None)
_WARM = []  # the thread loading numba in the background (`warm`), once a process
_IMPORT_LOCK, _START_LOCK = threading.Lock(), threading.Lock()  # numba's import; starting that thread


# Arithmetic operations a run from which a plan made in the default mode imports numba, so
# that every kernel binds its loop: a run of so many takes 20 ms or more here (60-110
# GFLOP/s a core), the loops of small gains save 10-35% of a conv net's run, and numba's
# import (0.7-1.0 s, once a process) is repaid within some 20-100 runs. ResNet-18 (3.6
# GFLOP at batch 1), the one real-size model whose own kernels would leave numba out:
# 59.8 -> 38.8 ms a run at batch 1 on one thread (onnxruntime 48.2 and 41.7 beside them),
# 424 -> 276 at batch 8, its first run 0.3 -> 1.0 s. Smaller plans keep the first run
# short (numba stays out unless a kernel that gains much brings it in).
PLAN_FLOPS = 2e9


def using(mode):
    """Bind kernels inside under JIT `mode` (None, True or False; see _MODE)."""
    return scoped(_MODE, mode)


def deferring():
    """Whether a plan made now binds provisionally (`deferred`): the default mode, numba
    neither loaded nor known to be absent, EDGEFLOW_JIT not "0"."""
    return _MODE.get() is None and not _numba and os.environ.get("EDGEFLOW_JIT", "1") != "0"


def deferred(bind, flops):
    """(bind(), wanted): a plan's kernels bound by `bind` without numba. The plan wants it
    where a kernel asked for it (available(), False meanwhile) or flops(), the plan's
    arithmetic operations a run by op, sum to PLAN_FLOPS or more: it is then provisional.
    Its first run does not wait for numba (importing it and readying its compiler took
    0.8-1.7 s of ResNet-18's first run, 1.3-1.8 s in all, against 0.15-0.35 s without);
    after it, numba loads in the background (`warm`), and the plan's cache makes it again
    once `ready()`, with the loops."""
    asked = []
    token = _DEFERRED.set(asked)
    try:
        result = bind()
    finally:
        _DEFERRED.reset(token)
    return result, bool(asked) or sum(flops().values()) >= PLAN_FLOPS


def warm():
    """Start loading numba in a background thread (once a process; the interpreter does
    after a provisional plan's run): importing it, readying its compiler with one loop
    from its cache, and native_gemm's product. Until it ends, runs share the interpreter's
    lock with it (some 1-2 s of runs slower on this 2-core VM)."""
    if _WARM:
        return
    with _START_LOCK:
        if not _WARM:
            _WARM.append(threading.Thread(target=_warm_up, name="edgeflow-jit-load", daemon=True))
            _WARM[0].start()


def _warm_up():
    if available():  # this thread's context: the default mode, nothing deferred
        out = np.zeros((1, 8, 4), np.float32)
        bind_bias_activation(out, np.zeros(8, np.float32), out, "relu")  # numba's compiler readied
        from . import native_gemm
        native_gemm.available()


def ready():
    """Whether numba's state is settled (loaded, or known absent) and no load is under way:
    a provisional plan is then made again."""
    return bool(_numba) and not (_WARM and _WARM[0].is_alive())


def wait(timeout=None):
    """Wait for the background load (`warm`) to end, if one was started: a benchmark's timed
    runs then measure the loops. Returns ready()."""
    if _WARM:
        _WARM[0].join(timeout)
    return ready()


def loaded():
    """Whether numba is loaded already (a kernel that gains much from it bound first).
    Loops that gain little, or little in a whole model (a conv's bias and activation, add +
    activation: 0.7-0.9x of numpy's time; max pooling, resizing) run only then: loading
    numba costs some 0.5 s of a model's first run, more than they save in many runs."""
    return bool(_numba) and _numba[0] is not None and available()


def available():
    """Whether JIT loops are used: numba imports, EDGEFLOW_JIT is not "0" and the plan being
    made is not under using(False)."""
    if os.environ.get("EDGEFLOW_JIT", "1") == "0" or _MODE.get() is False:
        return False
    if not _numba:
        asked = _DEFERRED.get()
        if asked is not None:  # a provisional plan binding: numba loads in the background
            asked.append(True)
            return False
        with _IMPORT_LOCK:  # held while numba imports (some 0.3 s): a second caller waits for it
            if not _numba:
                try:
                    start = time.perf_counter()
                    import numba
                    BIND_SECONDS["import numba"] = time.perf_counter() - start
                    _numba.append(numba)
                except ImportError:
                    _numba.append(None)
    return _numba[0] is not None


def compiled(loop, *args, entry=False):
    """`loop` compiled (or loaded from numba's cache) for the types of `args`: its dispatcher,
    which checks the types of each call's arguments (bind_recurrence's kernel passes other
    arrays on each run); with `entry`, the machine code's entry point for arguments of exactly
    these kinds, which skips that check (2.3 -> 1.6 us a call of prelu_loop on 512 elements):
    for steps whose arguments are fixed when they bind. Found by the arguments' kinds
    (`_kind`) after the first bind: numba's own typing of them took 150-190 us a bind, 9-21 ms
    of a MediaPipe model's first run."""
    key = (loop.__name__, entry, *map(_kind, args))
    found = _ENTRIES.get(key)
    if found is not None:
        return found
    numba = _numba[0]
    start = time.perf_counter()
    dispatcher = _compiled.get(loop.__name__)
    if dispatcher is None:
        _compile_scalars(numba)
        # nogil: pieces of one op may run on several of the plan's workers at once. The
        # numpy error model: a float division by zero gives inf or NaN as in numpy (numba's
        # default raises, and its check keeps LLVM from vectorizing a loop that divides).
        dispatcher = _compiled[loop.__name__] = numba.njit(
            cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH.get(loop.__name__, False))(loop)
    point = dispatcher.compile(tuple(numba.typeof(a) for a in args))
    BIND_SECONDS.setdefault(loop.__name__, time.perf_counter() - start)
    found = _ENTRIES[key] = point if entry else dispatcher
    return found


def _kind(a):
    """What numba's type of `a` follows from, found without numba (a few hundred ns): an
    array's dtype, dimensions, layout and whether it is read-only (numba's typeof reads no
    more); a scalar's class (and, for a Python int, whether it fits int64); numba's type for
    anything else."""
    if isinstance(a, np.ndarray):
        f = a.flags
        return a.dtype, a.ndim, "C" if f.c_contiguous else "F" if f.f_contiguous else "A", f.writeable
    if type(a) is int:
        return int, -(1 << 63) <= a < 1 << 63
    if isinstance(a, (np.generic, float, bool)):
        return type(a)
    return _numba[0].typeof(a)


def _compile_scalars(numba):
    """Replace the functions of SCALARS, which the loops call, by their numba dispatchers
    (once): numba resolves a loop's globals when it compiles it. The scalar functions are
    inlined by numba ("always"): left to LLVM, which weighs their size, a tanh stayed a call
    per element, and its loops scalar (17 ns an element against 1.7 inlined). Inlined, a
    function takes its caller's floating-point flags: _matmul_nt is inlined only into
    _matmul_nt_entry, compiled with the reassociation its sums vectorize by."""
    names = globals()
    if not hasattr(names["_fetch_add"], "_defn"):
        (names["_fetch_add"], names["_load_acquire"], names["_call0"], names["_call1"], names["_call_matmul_nt"],
         names["_pointer_f32"], names["_pointer_u64"], names["_pointer_u8"], names["_pointer_i64"]) = _intrinsics(numba)
        names["_carray"] = numba.carray
    for name in SCALARS:
        if not hasattr(names[name], "py_func"):
            names[name] = numba.njit(cache=True, nogil=True, error_model="numpy", inline="always",
                                     fastmath=_FASTMATH.get(name, {"contract"}))(names[name])


def _intrinsics(numba):
    """_fetch_add, _load_acquire, _call0, _call1 and _call_matmul_nt as numba intrinsics: an
    atomic add (sequentially consistent) and an acquiring load of an int64 array's element; a
    call of the function of no arguments at an address (none at 0); a call of the function
    of one int64 at an address; a call of the C function MATMUL_NT_SYMBOL on three float32
    matrices; then _pointer_f32, _pointer_u64, _pointer_u8
    and _pointer_i64: an int64 address as a pointer to that type (the native entries')."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    def element(context, builder, signature, args):
        kind = signature.args[0]
        array = context.make_array(kind)(context, builder, args[0])
        return cgutils.get_item_pointer(context, builder, kind, array, [args[1]])

    @intrinsic
    def fetch_add(typingctx, sync, index):
        def codegen(context, builder, signature, args):
            one = context.get_constant(types.int64, 1)
            return builder.atomic_rmw("add", element(context, builder, signature, args), one, "seq_cst")
        return types.int64(sync, index), codegen

    @intrinsic
    def load_acquire(typingctx, sync, index):
        def codegen(context, builder, signature, args):
            return builder.load_atomic(element(context, builder, signature, args), "acquire", 8)
        return types.int64(sync, index), codegen

    @intrinsic
    def call0(typingctx, address):
        def codegen(context, builder, signature, args):
            address = args[0]
            with builder.if_then(builder.icmp_signed("!=", address, address.type(0))):
                function = ir.FunctionType(ir.IntType(32), [])
                builder.call(builder.inttoptr(address, function.as_pointer()), [])
            return context.get_dummy_value()
        return types.none(address), codegen

    @intrinsic
    def call1(typingctx, address, argument):
        def codegen(context, builder, signature, args):
            function = ir.FunctionType(ir.VoidType(), [ir.IntType(64)])
            builder.call(builder.inttoptr(args[0], function.as_pointer()), [args[1]])
            return context.get_dummy_value()
        return types.none(address, argument), codegen

    @intrinsic
    def call_matmul_nt(typingctx, a, w, out):
        if not all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 2 for t in (a, w, out)):
            return None

        def codegen(context, builder, signature, args):
            floats, i64 = ir.FloatType().as_pointer(), ir.IntType(64)
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [floats, floats, floats, i64, i64, i64]), MATMUL_NT_SYMBOL)
            a_, w_, out_ = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args, args))
            (b, k), (n, _) = (cgutils.unpack_tuple(builder, x.shape) for x in (a_, w_))
            builder.call(function, [a_.data, w_.data, out_.data, b, k, n])
            return context.get_dummy_value()
        return types.none(a, w, out), codegen

    def pointer(dtype):
        @intrinsic
        def to_pointer(typingctx, address):
            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
            return types.CPointer(dtype)(address), codegen
        return to_pointer

    pointers = tuple(pointer(t) for t in (types.float32, types.uint64, types.uint8, types.int64))
    return (fetch_add, load_acquire, call0, call1, call_matmul_nt) + pointers


def _takes(*arrays):
    """Floating arrays of one dtype the loops handle (float32, float64)."""
    return all(a.dtype == arrays[0].dtype for a in arrays) and arrays[0].dtype in FLOATS


def _act_code(activation, dtype):
    """The loops' code of a fused `activation` on arrays of `dtype`, or None where they do not
    compute it (swish and hard_swish but in float32)."""
    code = ACTIVATION_CODES[activation]
    return None if code >= FLOAT32_ACTIVATIONS and dtype != np.float32 else code


def _bound(loop, *args):
    """A zero-argument step running the compiled `loop` on `args` (its entry point); where
    the loop has a native entry (_NATIVE_ENTRIES) that takes these arguments, the step's
    `native_call` (address, argument) runs it from native code too: native_threads' workers
    take it as they take a product (Workers.split), with no lock or GIL handed over."""
    fn = compiled(loop, *args, entry=True)

    def step():
        fn(*args)
    workers = threads.current()
    fields = _native_fields(_NATIVE_ENTRIES[loop.__name__], args) \
        if loop.__name__ in _NATIVE_ENTRIES and workers is not None and workers.native is not None else None
    if fields is not None:
        address = _native_entry(loop)
        if address:
            step.native_call = (address, fields.ctypes.data)
            step.keep = (fields, args)
    return step


# -- the loops as native functions of one argument ------------------------------------------
#
# native_threads' workers spin for work a while and call compiled functions by address, with
# no lock, futex or GIL on the way; a Python thread's piece waits for its vCPU to wake (on
# this project's 2-core VM MobileNetV2's depthwise convs at batch 1 took some 85 us more
# each at 2 threads than at 1). An entry below is a C function (numba.cfunc) of one int64:
# the address of `fields`, the loop's arguments in order, an array as its address and
# length (a 2-D one: its address and two lengths), a scalar as itself; the entry views the
# arrays in place (numba.carray) and calls the loop. Float arrays are float32, integer ones
# uint64 (uint8: `masks`).

# A loop's arguments, one letter each: arrays f float32, u uint64, b uint8 (1-D), U uint64
# (2-D); i an integer. gelu, softmax, sigmoid and hard_swish have entries since the native
# split became one native call (native_threads' dispatch, some 5 us): 131,072 floats split
# over 2 threads, native against lock workers, gelu 154 against 186 us, its tanh form 171
# against 220, sigmoid 67 against 92, hard_swish 28 against 46 (one thread: 279, 327, 118,
# 27). Against a lock hand-off of 20 us more they had measured no faster (the BERT-like
# encoder at 2 threads and batch 8 73.1 against 75.8 ms); the BERT-like encoder at 2
# threads, batch 1 moved within this machine's spread (10.94 against 11.08 ms).
_NATIVE_ENTRIES = {
    "depthwise_loop": "ffffuUfufi", "depthwise_same_loop": "ffffubffi", "depthwise_channels_loop": "ffffufffi",
    "winograd_input_loop": "ffffffu", "winograd_output_loop": "ffffffui",
    "gelu_float32_loop": "ffi", "softmax_loop": "ffii", "sigmoid_loop": "ff", "hard_swish_loop": "ff",
    "strided_copy_loop": "ffuu", "layer_norm_loop": "ffffuf", "binary_loop": "fffi", "scalar_loop": "fffii",
    "im2col_loop": "fffu", "patches_loop": "ffu", "max_pool_rows_loop": "ffuf", "max_pool_tiles_loop": "ffu",
    "swish_inplace_loop": "f", "scale_shift_loop": "ffffui"}
_KINDS = {"f": np.float32, "u": np.uint64, "b": np.uint8, "U": np.uint64}

_NATIVE_ADDRESSES = {}
# Set once numba is loaded: numba.carray and the intrinsics viewing an address as a pointer
# (_compile_scalars); each loop's dispatcher, which its entry calls (_native_entry).
_carray = _pointer_f32 = _pointer_u64 = _pointer_u8 = _pointer_i64 = None
_depthwise_loop = _depthwise_same_loop = _depthwise_channels_loop = _winograd_input_loop = \
    _winograd_output_loop = _gelu_float32_loop = _softmax_loop = _sigmoid_loop = _hard_swish_loop = \
    _strided_copy_loop = _layer_norm_loop = _binary_loop = _scalar_loop = _im2col_loop = _patches_loop = \
    _max_pool_rows_loop = _max_pool_tiles_loop = _swish_inplace_loop = _scale_shift_loop = None


def _native_fields(kinds, args):
    """The int64 fields of a native entry's call on `args`, or None where an argument is not
    of its kind in `kinds` (_NATIVE_ENTRIES: a float64 model's arrays, a strided one)."""
    fields = []
    for kind, a in zip(kinds, args, strict=True):
        if kind == "i":
            if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
                return None
            fields.append(int(a))
        elif not isinstance(a, np.ndarray) or a.dtype != _KINDS[kind] or a.ndim != (2 if kind == "U" else 1) \
                or not a.flags.c_contiguous:
            return None
        else:
            fields += [a.ctypes.data, *a.shape]
    return np.array(fields, np.int64)


def _native_entry(loop):
    """The address of `loop`'s native entry (compiled, or loaded from numba's cache, once a
    process), or 0 where the arguments' kinds do not match the entry's."""
    name = loop.__name__
    found = _NATIVE_ADDRESSES.get(name)
    if found is None:
        numba = _numba[0]
        names = globals()
        names["_" + name] = _compiled[name]  # the loop's dispatcher, which the entry calls
        found = _NATIVE_ADDRESSES[name] = numba.cfunc(numba.types.int64(numba.types.int64), cache=True,
                                                      error_model="numpy")(names[name + "_entry"]).address
    return found


def _floats(f, i):
    """The float32 array whose address and length are fields f[i], f[i + 1]."""
    return _carray(_pointer_f32(f[i]), (f[i + 1],))


def _uints(f, i):
    return _carray(_pointer_u64(f[i]), (f[i + 1],))


def _bytes(f, i):
    return _carray(_pointer_u8(f[i]), (f[i + 1],))


def _uints2(f, i):
    """The uint64 2-D array at f[i], its lengths f[i + 1], f[i + 2] (_uints, _bytes: 1-D)."""
    return _carray(_pointer_u64(f[i]), (f[i + 1], f[i + 2]))


def depthwise_loop_entry(address):
    f = _carray(_pointer_i64(address), (20,))
    _depthwise_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _uints(f, 8), _uints2(f, 10),
                    _floats(f, 13), _uints(f, 15), _floats(f, 17), f[19])
    return 0


def depthwise_same_loop_entry(address):
    f = _carray(_pointer_i64(address), (17,))
    _depthwise_same_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _uints(f, 8), _bytes(f, 10),
                         _floats(f, 12), _floats(f, 14), f[16])
    return 0


def depthwise_channels_loop_entry(address):
    f = _carray(_pointer_i64(address), (17,))
    _depthwise_channels_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _uints(f, 8),
                             _floats(f, 10), _floats(f, 12), _floats(f, 14), f[16])
    return 0


def winograd_input_loop_entry(address):
    f = _carray(_pointer_i64(address), (14,))
    _winograd_input_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _floats(f, 8), _floats(f, 10),
                         _uints(f, 12))
    return 0


def gelu_float32_loop_entry(address):
    f = _carray(_pointer_i64(address), (5,))
    _gelu_float32_loop(_floats(f, 0), _floats(f, 2), f[4])
    return 0


def softmax_loop_entry(address):
    f = _carray(_pointer_i64(address), (6,))
    _softmax_loop(_floats(f, 0), _floats(f, 2), _U(f[4]), _U(f[5]))
    return 0


def scale_shift_loop_entry(address):
    f = _carray(_pointer_i64(address), (11,))
    _scale_shift_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _uints(f, 8), f[10])
    return 0


def sigmoid_loop_entry(address):
    f = _carray(_pointer_i64(address), (4,))
    _sigmoid_loop(_floats(f, 0), _floats(f, 2))
    return 0


def hard_swish_loop_entry(address):
    f = _carray(_pointer_i64(address), (4,))
    _hard_swish_loop(_floats(f, 0), _floats(f, 2))
    return 0


def im2col_loop_entry(address):
    f = _carray(_pointer_i64(address), (8,))
    _im2col_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _uints(f, 6))
    return 0


def patches_loop_entry(address):
    f = _carray(_pointer_i64(address), (6,))
    _patches_loop(_floats(f, 0), _floats(f, 2), _uints(f, 4))
    return 0


def max_pool_rows_loop_entry(address):
    f = _carray(_pointer_i64(address), (8,))
    _max_pool_rows_loop(_floats(f, 0), _floats(f, 2), _uints(f, 4), _floats(f, 6))
    return 0


def max_pool_tiles_loop_entry(address):
    f = _carray(_pointer_i64(address), (6,))
    _max_pool_tiles_loop(_floats(f, 0), _floats(f, 2), _uints(f, 4))
    return 0


def swish_inplace_loop_entry(address):
    f = _carray(_pointer_i64(address), (2,))
    _swish_inplace_loop(_floats(f, 0))
    return 0


def binary_loop_entry(address):
    f = _carray(_pointer_i64(address), (7,))
    _binary_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), f[6])
    return 0


def scalar_loop_entry(address):
    f = _carray(_pointer_i64(address), (8,))
    _scalar_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), f[6], f[7])
    return 0


def layer_norm_loop_entry(address):
    f = _carray(_pointer_i64(address), (12,))
    _layer_norm_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _uints(f, 8), _floats(f, 10))
    return 0


def strided_copy_loop_entry(address):
    f = _carray(_pointer_i64(address), (8,))
    _strided_copy_loop(_floats(f, 0), _floats(f, 2), _uints(f, 4), _uints(f, 6))
    return 0


def winograd_output_loop_entry(address):
    f = _carray(_pointer_i64(address), (15,))
    _winograd_output_loop(_floats(f, 0), _floats(f, 2), _floats(f, 4), _floats(f, 6), _floats(f, 8), _floats(f, 10),
                          _uints(f, 12), f[14])
    return 0



def _rows(a, length):
    """a as a C-contiguous (rows, length) view, or None where that would copy."""
    if not a.flags.c_contiguous:
        return None
    return a.reshape(-1, length)


# -- depthwise convolution ------------------------------------------------------------------
#
# Three loops, each one pass over x and out per call, indexing flat arrays with unsigned
# integers: numba checks every signed index for a negative one to wrap, which keeps LLVM from
# vectorizing a loop whose index is an offset plus the loop counter, and a slice per row costs
# ~8 ns. `depthwise_same_loop` runs stride-1 3x3 and 5x5 convs whose output plane is the
# input's (MobileNet's, EfficientNet's and MediaPipe's stride-1 layers) over x in place, a
# channel's inner rows as one long run; `depthwise_loop` runs a channel at a time over the
# long runs of its plane's zero-bordered copy (other wide planes: strides, dilations, other
# pads); `depthwise_channels_loop` runs blocks of DEPTHWISE_BLOCK channels at every output
# position (small planes, whose rows are too short to vectorize: 7x7 in MobileNetV2's last
# layers). native_depthwise.py's compiled kernel runs most float32 3x3 and 5x5 ones before
# these (bind_depthwise). benchmarks/bench_conv.py times them against onnxruntime.

# Planes at least this wide (output columns) run depthwise_loop, narrower ones
# depthwise_channels_loop: the crossover measured on 3x3 and 5x5 layers (at 10-14 columns
# the channel blocks take 0.5-0.7x the plane loop's time, at 16 1.6x, at 27-28 1.5-2.2x).
DEPTHWISE_PLANE_MIN = 16
# Stride-1 "same" convs on planes at least this wide run depthwise_same_loop: against the
# other two, 1.5-3x faster on 3x3 planes of 12-112 and 5x5 ones of 14-28, 1.2x on 5x5 at 12,
# even at 10, slower on 7 (its border rows are most of such a plane).
DEPTHWISE_SAME_MIN = 12
DEPTHWISE_BLOCK = 64  # channels of depthwise_channels_loop's blocks: 8 AVX2 vectors of float32
# Convs of one group and at most this many input channels (stems of RGB images) run
# native_small_conv's compiled kernel where native_gemm runs, else small_conv_loop: up to
# 1.5x faster than im2col and a BLAS product for 3x3 and 5x5 kernels, slower for 7x7
# (ResNet's stem: 49 passes per channel), hence SMALL_CONV_TAPS, past which only the
# compiled kernel takes a stem.
SMALL_CONV_CHANNELS = 4
SMALL_CONV_TAPS = 25
# Elements of each of small_conv_loop's four wide accumulators, about: output rows are summed
# in blocks of about this many (the four fit in L1 beside the taps' runs: 3->32 3x3 at 224
# took 0.92 ms with blocks of 4096, 0.87 with 1024; a plane that barely overflows one block
# stays one block).
SMALL_CONV_BLOCK = 1024
_U = np.uint64


def _load_phases(x, src, phases, base, dims, cols):
    """Copy the (H, W) plane of flat x at `src` into its stride phases at phases[base:], the
    layout of depthwise_layout (dims and cols as depthwise_loop's); the borders are left as
    they are (zeros, written once)."""
    one, zero_i, two = _U(1), _U(0), _U(2)
    h_, w_, sh, sw, top, left, qw, plane = dims[2], dims[3], dims[6], dims[7], dims[8], dims[9], dims[10], dims[11]
    row, phase = (top // sh) * qw, top % sh
    # sw == 2: input column 2m lands in column phase even_phase at even_at + m, 2m + 1 in odd_phase
    half, even_phase, even_at = w_ // two, left % two, left // two
    odd_phase, odd_at = (left + one) % two, (left + one) // two
    for i in range(h_):
        if sw == one:
            d = base + phase * plane + row + left
            for j in range(w_):
                phases[d + j] = x[src + j]
        elif sw == two:  # columns 2m and 2m + 1 in one loop: LLVM loads the pairs as vectors
            da = base + (phase * two + even_phase) * plane + row + even_at
            db = base + (phase * two + odd_phase) * plane + row + odd_at
            for m in range(half):
                a = x[src + two * m]
                b = x[src + two * m + one]
                phases[da + m] = a
                phases[db + m] = b
            if w_ % two:
                phases[da + half] = x[src + w_ - one]
        else:
            for px in range(sw):
                d = base + (phase * sw + px) * plane + row + cols[px, 2]
                s0, count = src + cols[px, 0], cols[px, 1]
                for j in range(count):
                    phases[d + j] = x[s0 + sw * j]
        src += w_
        phase += one
        if phase == sh:
            phase = zero_i
            row += qw


def _add_taps(acc, length, phases, base, tap_off, w, wc, start, keep):
    """acc[:length] = start (or, with `keep`, acc's own values) + the sum over taps t of
    w[wc + t] times the run of `phases` at base + tap_off[t]; nine taps (3x3 kernels) in
    one pass, others five a pass."""
    one = _U(1)
    taps = _U(tap_off.shape[0])
    if taps == _U(9):
        w0, w1, w2, w3, w4 = w[wc], w[wc + one], w[wc + _U(2)], w[wc + _U(3)], w[wc + _U(4)]
        w5, w6, w7, w8 = w[wc + _U(5)], w[wc + _U(6)], w[wc + _U(7)], w[wc + _U(8)]
        o0, o1, o2 = base + tap_off[0], base + tap_off[1], base + tap_off[2]
        o3, o4, o5 = base + tap_off[3], base + tap_off[4], base + tap_off[5]
        o6, o7, o8 = base + tap_off[6], base + tap_off[7], base + tap_off[8]
        if keep:
            for k in range(length):
                acc[k] += (w0 * phases[o0 + k] + w1 * phases[o1 + k] + w2 * phases[o2 + k]
                           + w3 * phases[o3 + k] + w4 * phases[o4 + k] + w5 * phases[o5 + k]
                           + w6 * phases[o6 + k] + w7 * phases[o7 + k] + w8 * phases[o8 + k])
        else:
            for k in range(length):
                acc[k] = (start + w0 * phases[o0 + k] + w1 * phases[o1 + k] + w2 * phases[o2 + k]
                          + w3 * phases[o3 + k] + w4 * phases[o4 + k] + w5 * phases[o5 + k]
                          + w6 * phases[o6 + k] + w7 * phases[o7 + k] + w8 * phases[o8 + k])
        return
    if not keep:
        for k in range(length):
            acc[k] = start
    five = _U(5)
    t = _U(0)
    while t + five <= taps:  # five taps a pass (a row of a 5x5 kernel)
        w0, w1, w2, w3, w4 = w[wc + t], w[wc + t + one], w[wc + t + _U(2)], w[wc + t + _U(3)], w[wc + t + _U(4)]
        o0, o1, o2 = base + tap_off[t], base + tap_off[t + one], base + tap_off[t + _U(2)]
        o3, o4 = base + tap_off[t + _U(3)], base + tap_off[t + _U(4)]
        for k in range(length):
            acc[k] += (w0 * phases[o0 + k] + w1 * phases[o1 + k] + w2 * phases[o2 + k]
                       + w3 * phases[o3 + k] + w4 * phases[o4 + k])
        t += five
    for t in range(t, taps):
        tap, o = w[wc + t], base + tap_off[t]
        for k in range(length):
            acc[k] += tap * phases[o + k]


def _add_taps4(acc, stride, length, phases, base, tap_off, w, wc, wm, b0, b1, b2, b3, keep):
    """_add_taps for four output channels at once: acc[j * stride:][:length] (j = 0..3) =
    bj (or, with `keep`, its own values) + the sum over taps t of w[wc + j * wm + t] times
    the run of `phases` at base + tap_off[t]. Three taps a pass: each run loaded feeds
    twelve products, not three (a stem's output channels share its few input runs)."""
    one, two, three = _U(1), _U(2), _U(3)
    taps = _U(tap_off.shape[0])
    s1, s2, s3 = stride, stride * two, stride * three
    if not keep:
        for k in range(length):
            acc[k] = b0
            acc[s1 + k] = b1
            acc[s2 + k] = b2
            acc[s3 + k] = b3
    t = _U(0)
    while t + three <= taps:
        o0, o1, o2 = base + tap_off[t], base + tap_off[t + one], base + tap_off[t + two]
        q0, q1, q2, q3 = wc + t, wc + wm + t, wc + two * wm + t, wc + three * wm + t
        a0, a1, a2 = w[q0], w[q0 + one], w[q0 + two]
        c0, c1, c2 = w[q1], w[q1 + one], w[q1 + two]
        d0, d1, d2 = w[q2], w[q2 + one], w[q2 + two]
        e0, e1, e2 = w[q3], w[q3 + one], w[q3 + two]
        for k in range(length):
            p0, p1, p2 = phases[o0 + k], phases[o1 + k], phases[o2 + k]
            acc[k] += a0 * p0 + a1 * p1 + a2 * p2
            acc[s1 + k] += c0 * p0 + c1 * p1 + c2 * p2
            acc[s2 + k] += d0 * p0 + d1 * p1 + d2 * p2
            acc[s3 + k] += e0 * p0 + e1 * p1 + e2 * p2
        t += three
    while t < taps:
        o = base + tap_off[t]
        a, c, d, e = w[wc + t], w[wc + wm + t], w[wc + two * wm + t], w[wc + three * wm + t]
        for k in range(length):
            v = phases[o + k]
            acc[k] += a * v
            acc[s1 + k] += c * v
            acc[s2 + k] += d * v
            acc[s3 + k] += e * v
        t += one


def _crop_rows(acc, qw, out, dst, rows, ow, act):
    """out[dst:] gets `rows` rows of OW from acc's rows of QW, through the activation (0
    none, 1 relu, 2 relu6: selects that keep NaN; 3 swish, 4 hard_swish)."""
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    src = _U(0)
    start = dst
    for i in range(rows):
        if act == 1:
            for j in range(ow):
                v = acc[src + j]
                out[dst + j] = zero if v < zero else v
        elif act == 2:
            for j in range(ow):
                v = acc[src + j]
                v = zero if v < zero else v
                out[dst + j] = six if v > six else v
        else:
            for j in range(ow):
                out[dst + j] = acc[src + j]
        src += qw
        dst += ow
    if act >= 3:  # over the rows at once: a row of a small plane is too short to vectorize exp
        _activate_run(out, start, rows * ow, act)


def _activate_run(out, start, n, act):
    """out[start:start + n] = swish (act 3) or hard_swish (4) of itself, in place."""
    if act == 3:
        for j in range(n):
            out[start + j] = _swishf(out[start + j])
    else:
        for j in range(n):
            out[start + j] = _hard_swishf(out[start + j])


def depthwise_loop(x, w, b, out, dims, cols, phases, tap_off, acc, act):
    """out = act(depthwise conv of x by w (C * taps) + b), x (N, C, H, W) and out (N, C, OH,
    OW) flat, one channel at a time: the channel is copied into its zero-bordered stride
    phases (`phases`, sh * sw planes of QH * QW: the layout of conv.py's tap runs), then each
    tap adds one long unit-stride run of its phase, from `tap_off[t]`, into the wide
    accumulator `acc` (OH * QW; 3x3 kernels add all nine taps in one pass), and the OW first
    columns of each wide row go to out with the activation. dims (uint64): N, C, H, W, OH,
    OW, sh, sw, top, left, QW, QH * QW; cols (sw, 3): for each column phase, the first input
    column in it, how many, and where they start in the phase's rows."""
    one, zero_i = _U(1), _U(0)
    n_, c_, h_, w_, oh_, ow_, qw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[10]
    taps = _U(tap_off.shape[0])
    length = oh_ * qw
    c = c_ - one
    for nc in range(n_ * c_):
        c = zero_i if c + one == c_ else c + one
        _load_phases(x, nc * h_ * w_, phases, zero_i, dims, cols)
        _add_taps(acc, length, phases, zero_i, tap_off, w, c * taps, b[c], False)
        _crop_rows(acc, qw, out, nc * oh_ * ow_, oh_, ow_, act)


def small_conv_loop(x, w, b, out, dims, cols, phases, tap_off, acc, act):
    """out (N, M, OH, OW) = act(conv of x (N, C, H, W) by w (M, C * taps) + b), all flat, for
    few input channels (an image's 1-4: a network's stem), where im2col's columns cost more
    than the product: each channel is copied into its stride phases as depthwise_loop's,
    then each output channel sums, channel by channel, the taps' long runs into the wide
    accumulator `acc` (3x3 kernels: nine taps in one pass) and goes to out cropped, with the
    activation. dims as depthwise_loop's, then M; phases: C blocks of depthwise_layout's."""
    one, zero_i = _U(1), _U(0)
    n_, c_, h_, w_, oh_, ow_ = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    qw, m_ = dims[10], dims[12]
    taps = _U(tap_off.shape[0])
    block = _U(phases.shape[0]) // c_
    four = _U(4)
    stride = _U(acc.shape[0]) // four  # acc: four blocks of rows * QW, one per output channel
    rows = max(one, stride // qw)  # output rows per block
    for n in range(n_):
        for c in range(c_):
            _load_phases(x, (n * c_ + c) * h_ * w_, phases, c * block, dims, cols)
        for i0 in range(zero_i, oh_, rows):
            i1 = min(i0 + rows, oh_)
            start, length = i0 * qw, (i1 - i0) * qw
            m = zero_i
            while m + four <= m_:  # four output channels a pass
                for c in range(c_):  # the first channel's taps start from the bias, the others add
                    _add_taps4(acc, stride, length, phases, c * block + start, tap_off, w, (m * c_ + c) * taps,
                               c_ * taps, b[m], b[m + one], b[m + _U(2)], b[m + _U(3)], c != zero_i)
                for j in range(four):
                    _crop_rows(acc[j * stride:], qw, out, ((n * m_ + m + j) * oh_ + i0) * ow_, i1 - i0, ow_, act)
                m += four
            for m in range(m, m_):
                for c in range(c_):
                    _add_taps(acc, length, phases, c * block + start, tap_off, w, (m * c_ + c) * taps, b[m],
                              c != zero_i)
                _crop_rows(acc, qw, out, ((n * m_ + m) * oh_ + i0) * ow_, i1 - i0, ow_, act)


def depthwise_channels_loop(x, w, b, out, dims, xt, wt, acc, act):
    """depthwise_loop's result, a block of K = DEPTHWISE_BLOCK channels at a time: the block
    is copied into `xt` ((H + pads) * (W + pads), K: zero-bordered, channels last) and its
    weights and bias into `wt` (taps + 1, K; zeros past C), then each output position sums
    its taps over the block's K channels in vectors (3x3 kernels in one pass) into `acc`
    (OH * OW, K), whose columns go to out with the activation. dims (uint64): N, C, H, W, OH,
    OW, sh, sw, dh, dw, top, left, KH, KW, the padded width."""
    K, one, zero_i, three = _U(DEPTHWISE_BLOCK), _U(1), _U(0), _U(3)
    n_, c_, h_, w_, oh_, ow_, sh, sw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]
    dh, dw, top, left, kh_, kw_, wp = dims[8], dims[9], dims[10], dims[11], dims[12], dims[13], dims[14]
    taps = kh_ * kw_
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    hw, ohw = h_ * w_, oh_ * ow_
    step_w, step_h = dw * K, dh * wp * K
    bias_row = taps * K
    for n in range(n_):
        for c0 in range(zero_i, c_, K):
            cn = min(K, c_ - c0)
            for cb in range(cn):
                for t in range(taps):
                    wt[t * K + cb] = w[(c0 + cb) * taps + t]
                wt[bias_row + cb] = b[c0 + cb]
            for cb in range(cn, K):  # a last block's spare channels: zeros, results unread
                for t in range(taps + one):
                    wt[t * K + cb] = zero
            src = (n * c_ + c0) * hw
            for i in range(h_):
                d = ((i + top) * wp + left) * K
                for j in range(w_):
                    for cb in range(cn):
                        xt[d + cb] = x[src + cb * hw + j]
                    d += K
                src += w_
            if kh_ == three and kw_ == three:
                k1, k2, k3, k4 = K, K + K, three * K, _U(4) * K
                k5, k6, k7, k8 = _U(5) * K, _U(6) * K, _U(7) * K, _U(8) * K
                for oi in range(oh_):
                    p = oi * ow_ * K
                    q0 = oi * sh * wp * K
                    for oj in range(ow_):
                        q1, q3 = q0 + step_w, q0 + step_h
                        q2, q4, q6 = q1 + step_w, q3 + step_w, q3 + step_h
                        q5, q7 = q4 + step_w, q6 + step_w
                        q8 = q7 + step_w
                        for cb in range(K):
                            acc[p + cb] = (wt[bias_row + cb] + wt[cb] * xt[q0 + cb] + wt[k1 + cb] * xt[q1 + cb]
                                           + wt[k2 + cb] * xt[q2 + cb] + wt[k3 + cb] * xt[q3 + cb]
                                           + wt[k4 + cb] * xt[q4 + cb] + wt[k5 + cb] * xt[q5 + cb]
                                           + wt[k6 + cb] * xt[q6 + cb] + wt[k7 + cb] * xt[q7 + cb]
                                           + wt[k8 + cb] * xt[q8 + cb])
                        p += K
                        q0 += sw * K
            elif kw_ == _U(5):  # a kernel row (five taps) a pass: acc loaded and stored once a row
                for oi in range(oh_):
                    p = oi * ow_ * K
                    for oj in range(ow_):
                        r = (oi * sh * wp + oj * sw) * K
                        for ki in range(kh_):
                            t0 = ki * _U(5) * K
                            t1, t2, t3, t4 = t0 + K, t0 + K + K, t0 + three * K, t0 + _U(4) * K
                            q0 = r
                            q1, q2, q3, q4 = q0 + step_w, q0 + step_w + step_w, q0 + three * step_w, q0 + _U(4) * step_w
                            if ki == zero_i:
                                for cb in range(K):
                                    acc[p + cb] = (wt[bias_row + cb] + wt[t0 + cb] * xt[q0 + cb]
                                                   + wt[t1 + cb] * xt[q1 + cb] + wt[t2 + cb] * xt[q2 + cb]
                                                   + wt[t3 + cb] * xt[q3 + cb] + wt[t4 + cb] * xt[q4 + cb])
                            else:
                                for cb in range(K):
                                    acc[p + cb] += (wt[t0 + cb] * xt[q0 + cb] + wt[t1 + cb] * xt[q1 + cb]
                                                    + wt[t2 + cb] * xt[q2 + cb] + wt[t3 + cb] * xt[q3 + cb]
                                                    + wt[t4 + cb] * xt[q4 + cb])
                            r += step_h
                        p += K
            else:
                for oi in range(oh_):
                    p = oi * ow_ * K
                    for oj in range(ow_):
                        for cb in range(K):
                            acc[p + cb] = wt[bias_row + cb]
                        r = (oi * sh * wp + oj * sw) * K
                        for ki in range(kh_):
                            q, t = r, ki * kw_ * K
                            for kj in range(kw_):
                                for cb in range(K):
                                    acc[p + cb] += wt[t + cb] * xt[q + cb]
                                q += step_w
                                t += K
                            r += step_h
                        p += K
            for cb in range(cn):
                dst = (n * c_ + c0 + cb) * ohw
                for p in range(ohw):
                    v = acc[p * K + cb]
                    if act == 1:
                        v = zero if v < zero else v
                    elif act == 2:
                        v = zero if v < zero else v
                        v = six if v > six else v
                    out[dst + p] = v
                if act >= 3:
                    _activate_run(out, dst, ohw, act)


def _clip_bounds(out, act):
    """(lo, hi) of the clip a loop applies for activation code `act`, in out's type: relu's
    [0, inf], relu6's [0, 6], else [-inf, inf] (no clip: swish and hard_swish run after)."""
    inf = out.dtype.type(np.inf)
    lo = out.dtype.type(0) if act == 1 or act == 2 else -inf
    return lo, (out.dtype.type(6) if act == 2 else inf)


def _column5(w, at):
    """A column of a 5x5 kernel (row-major in w), from its first tap at `at`: w[at + 5r]."""
    five = _U(5)
    return w[at], w[at + five], w[at + _U(10)], w[at + _U(15)], w[at + _U(20)]


def _sum5(x, at, w_, taps):
    """The sum over r < 5 of taps[r] times x[at + r * W]: a 5x5 kernel column's taps."""
    w2 = w_ + w_
    w4 = w2 + w2
    return (taps[0] * x[at] + taps[1] * x[at + w_] + taps[2] * x[at + w2] + taps[3] * x[at + w2 + w_]
            + taps[4] * x[at + w4])


def _same_run(x, s, out, d, length, masks, m, w, wc, bias, k_, w_, hw, lo, hi):
    """out[d + i] (i < length) = clip(bias + the sum over taps (a, c) of w[wc + a * K + c] times
    x[s + i + a * W + c]), a K x K window (3 or 5) read from x's rows of W as one long run:
    the window of an output in column j reads from x's next or previous row where j + c
    falls outside the row, so kernel column c's sum counts only where masks[c * HW + m + i].
    The clip to [lo, hi] is relu's or relu6's, or none (infinite bounds): one loop for all
    three, with no branch in it."""
    zero = out.dtype.type(0)
    one, two = _U(1), _U(2)
    if k_ == _U(3):
        w0, w1, w2, w3, w4 = w[wc], w[wc + one], w[wc + two], w[wc + _U(3)], w[wc + _U(4)]
        w5, w6, w7, w8 = w[wc + _U(5)], w[wc + _U(6)], w[wc + _U(7)], w[wc + _U(8)]
        r1, r2, m2 = s + w_, s + w_ + w_, m + hw + hw
        for k in range(length):
            col0 = w0 * x[s + k] + w3 * x[r1 + k] + w6 * x[r2 + k]
            col1 = w1 * x[s + k + one] + w4 * x[r1 + k + one] + w7 * x[r2 + k + one]
            col2 = w2 * x[s + k + two] + w5 * x[r1 + k + two] + w8 * x[r2 + k + two]
            v = bias + col1 + (col0 if masks[m + k] else zero) + (col2 if masks[m2 + k] else zero)
            v = lo if v < lo else v  # NaN stays NaN, as in relu's and relu6's loops
            out[d + k] = hi if v > hi else v
    else:
        m1, m3, m4 = m + hw, m + _U(3) * hw, m + _U(4) * hw
        k0, k1, k2 = _column5(w, wc), _column5(w, wc + one), _column5(w, wc + two)
        k3, k4 = _column5(w, wc + _U(3)), _column5(w, wc + _U(4))
        for k in range(length):
            col0, col1, col2 = _sum5(x, s + k, w_, k0), _sum5(x, s + k + one, w_, k1), _sum5(x, s + k + two, w_, k2)
            col3, col4 = _sum5(x, s + k + _U(3), w_, k3), _sum5(x, s + k + _U(4), w_, k4)
            v = (bias + col2 + (col0 if masks[m + k] else zero) + (col1 if masks[m1 + k] else zero)
                 + (col3 if masks[m3 + k] else zero) + (col4 if masks[m4 + k] else zero))
            v = lo if v < lo else v  # NaN stays NaN, as in relu's and relu6's loops
            out[d + k] = hi if v > hi else v


def depthwise_same_loop(x, w, b, out, dims, masks, top_band, bottom_band, act):
    """out = act(depthwise conv of x by w (C * K * K) + b) for a K x K kernel (3 or 5),
    stride 1, dilation 1 and P = (K - 1) / 2 zeros on every side (the output plane the
    input's, H x W), x and out (N, C, H, W) flat, a channel at a time with no copy of the
    plane: output rows P + 1 to H - P - 2 are one `_same_run` over x in place (masks: H * W
    per kernel column, 1 where its column falls inside the row); the first and last P + 1
    rows are runs over `top_band` and `bottom_band`, each x's K rows next to them between
    zero rows (P of them) and P zeros at either end. dims (uint64): N, C, H, W, K."""
    one, zero_i = _U(1), _U(0)
    n_, c_, h_, w_, k_ = dims[0], dims[1], dims[2], dims[3], dims[4]
    p = k_ // _U(2)
    hw, taps = h_ * w_, k_ * k_
    band = (p + one) * w_  # outputs of a band
    rows = k_ * w_  # x's elements in a band
    top_at, bottom_at = p + p * w_, p  # where a band's rows of x start
    middle = hw - band - band
    lo, hi = _clip_bounds(out, act)
    c = c_ - one
    for nc in range(n_ * c_):
        c = zero_i if c + one == c_ else c + one
        base, wc, bias = nc * hw, c * taps, b[c]
        for i in range(rows):
            top_band[top_at + i] = x[base + i]
            bottom_band[bottom_at + i] = x[base + hw - rows + i]
        _same_run(top_band, zero_i, out, base, band, masks, zero_i, w, wc, bias, k_, w_, hw, lo, hi)
        _same_run(x, base + band - p * w_ - p, out, base + band, middle, masks, band, w, wc, bias, k_, w_, hw, lo, hi)
        _same_run(bottom_band, zero_i, out, base + hw - band, band, masks, hw - band, w, wc, bias, k_, w_, hw, lo, hi)
        if act >= 3:
            _activate_run(out, base, hw, act)


def depthwise_layout(x_shape, kernel_shape, strides, dilations, begin, out_shape, dtype):
    """(phases, tap_off, acc, cols, QW) of depthwise_loop: tap (kh, kw) reads phase
    (kh * dh % sh, kw * dw % sw) from row kh * dh // sh, column kw * dw // sw; a phase holds
    every tap's reach and all of x, and one more row for the runs that spill past it."""
    (h, w), (kh_, kw_), (sh, sw), (dh, dw), (top, left), (oh, ow) = \
        x_shape, kernel_shape, strides, dilations, begin, out_shape
    qh = max(oh + (kh_ - 1) * dh // sh, -(-(top + h) // sh)) + 1
    qw = max(ow + (kw_ - 1) * dw // sw, -(-(left + w) // sw))
    taps = [(kh * dh, kw * dw) for kh in range(kh_) for kw in range(kw_)]
    tap_off = np.array([((a % sh) * sw + b % sw) * qh * qw + (a // sh) * qw + b // sw for a, b in taps], _U)
    firsts = [(px - left) % sw for px in range(sw)]
    cols = np.array([(f, len(range(f, w, sw)), (f + left) // sw) for f in firsts], _U)
    return np.zeros(sh * sw * qh * qw, dtype), tap_off, np.empty(oh * qw, dtype), cols, qw


def bind_small_conv(x, w, bias, out, strides, dilations, begin, activation, rows=None):
    """A step for a 2-D conv of one group and at most SMALL_CONV_CHANNELS input channels (a
    network's stem), or None: native_small_conv's compiled kernel for the float32 ones it
    suits where native_gemm runs, small_conv_loop for others of at most SMALL_CONV_TAPS taps.
    Past those taps (ResNet's 7x7 stem) only where numba is loaded already (`loaded`): im2col
    and BLAS do well enough without it, and a small plan's first run would wait for it.
    `rows` (first, last): out's rows first:last alone (a worker's band), the compiled kernel's
    only (None elsewhere)."""
    if x.ndim != 4 or w.ndim != 4 or w.shape[1] != x.shape[1] or x.shape[1] > SMALL_CONV_CHANNELS \
            or out.shape[1] != w.shape[0]:
        return None
    from . import native_small_conv
    many = math.prod(w.shape[2:]) > SMALL_CONV_TAPS
    native = out.dtype == np.float32 and native_small_conv.suits(x.shape[1], w.shape[2:], strides, dilations, begin,
                                                                 out.shape[2:], activation)
    if (many and not (native and loaded())) or not available():  # last: it imports numba
        return None
    b = np.zeros(w.shape[0], x.dtype) if bias is None else bias
    act = _act_code(activation, out.dtype)
    if not _takes(x, w, b, out) or not all(a.flags.c_contiguous for a in (x, w, b, out)) or not out.size \
            or act is None:
        return None
    step = native_small_conv.bind(x, w, b, out, strides[0], dilations, begin, activation, rows) if native else None
    if step is not None or many or rows is not None:
        return step
    phases, tap_off, acc, cols, qw = depthwise_layout(x.shape[2:], w.shape[2:], strides, dilations, begin,
                                                      out.shape[2:], x.dtype)
    (n, c, h, wd), (oh, ow) = x.shape, out.shape[2:]
    dims = np.array([n, c, h, wd, oh, ow, *strides, *begin[:2], qw, phases.size // math.prod(strides), w.shape[0]],
                    _U)
    blocks = max(1, round(oh * qw / SMALL_CONV_BLOCK))
    rows = -(-oh // blocks)
    return _bound(small_conv_loop, x.reshape(-1), w.reshape(-1), b, out.reshape(-1), dims, cols,
                  np.zeros(c * phases.size, x.dtype), tap_off, np.empty(4 * rows * qw, x.dtype), act)


def bind_depthwise(x, w, bias, out, strides, dilations, begin, activation):
    """A step for a 2-D depthwise conv (group == C == M, one weight per channel and tap),
    or None: native_depthwise's compiled kernel for the float32 3x3, 5x5 and 7x7 convs it
    suits (stride 2; stride 1 but 3x3 on wide planes) where native_gemm runs (0.47-0.94x these
    loops' time on MobileNetV2's and EfficientNet's layers), depthwise_same_loop for other
    stride-1 "same" ones, depthwise_loop for planes DEPTHWISE_PLANE_MIN columns wide or
    wider, depthwise_channels_loop for narrower ones."""
    if not available() or x.ndim != 4 or w.shape[:2] != (x.shape[1], 1) or out.shape[1] != x.shape[1]:
        return None
    b = np.zeros(x.shape[1], x.dtype) if bias is None else bias
    act = _act_code(activation, out.dtype)
    if not _takes(x, w, b, out) or not all(a.flags.c_contiguous for a in (x, w, b, out)) or not out.size \
            or act is None:
        return None
    from . import native_depthwise
    (n, c, h, wd), (kh, kw), (oh, ow) = x.shape, w.shape[2:], out.shape[2:]
    if out.dtype == np.float32 and native_depthwise.suits(x.shape[2:], (kh, kw), strides, dilations, begin,
                                                          (oh, ow), activation):
        # A swish runs as a pass of its own after the conv: in the kernel's registers it took
        # more (EfficientNet-B0's 96 channels 112 -> 56 at stride 2: 1,170 us fused, 992 so;
        # 144 channels 56 -> 28 5x5 566 and 464; 672 at 14x14 5x5 stride 1 542 and 427).
        swish = activation == "swish"
        step = native_depthwise.bind(x, w, b, out, strides[0], begin, "" if swish else activation)
        if step is not None:
            return threads.chain(step, _bound(swish_inplace_loop, out.reshape(-1))) if swish else step
    flat = (x.reshape(-1), w.reshape(-1), b, out.reshape(-1))
    if tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) and (oh, ow) == (h, wd) and kh == kw \
            and kh in (3, 5) and tuple(begin[:2]) == (kh // 2, kw // 2) and h > kh and wd >= kw \
            and ow >= DEPTHWISE_SAME_MIN:
        p, columns = kh // 2, np.arange(h * wd) % wd
        masks = np.stack([(columns + j - p >= 0) & (columns + j - p < wd) for j in range(kw)]).astype(np.uint8)
        band = np.zeros(2 * p + (kh + p) * wd, x.dtype)
        dims = np.array([n, c, h, wd, kh], _U)
        return _bound(depthwise_same_loop, *flat, dims, masks.reshape(-1), band, band.copy(), act)
    if ow >= DEPTHWISE_PLANE_MIN:
        phases, tap_off, acc, cols, qw = depthwise_layout(x.shape[2:], w.shape[2:], strides, dilations, begin,
                                                          out.shape[2:], x.dtype)
        dims = np.array([n, c, h, wd, oh, ow, *strides, *begin[:2], qw, phases.size // math.prod(strides)], _U)
        return _bound(depthwise_loop, *flat, dims, cols, phases, tap_off, acc, act)
    k = DEPTHWISE_BLOCK
    hp = max(begin[0] + h, (oh - 1) * strides[0] + (kh - 1) * dilations[0] + 1)
    wp = max(begin[1] + wd, (ow - 1) * strides[1] + (kw - 1) * dilations[1] + 1)
    dims = np.array([n, c, h, wd, oh, ow, *strides, *dilations, *begin[:2], kh, kw, wp], _U)
    return _bound(depthwise_channels_loop, *flat, dims, np.zeros(hp * wp * k, x.dtype),
                  np.zeros((kh * kw + 1) * k, x.dtype), np.empty(oh * ow * k, x.dtype), act)


# -- depthwise convolution's gradients ----------------------------------------------------
#
# A train step's depthwise convs backwards, a channel at a time, one tap at a time over rows
# of its plane (L1-sized): the numpy kernels' per-tap products and sums took 14 passes of
# their own over dy, or gathered 9 copies of x (MobileNetV2 at batch 8: 723 of a step's
# 1,334 ms). Each tap (kh, kw) meets the output rows oh whose input row oh * sh + kh * dh -
# top lies inside x, and in each such row the columns whose input column does: `_tap_span`.

def _tap_span(k, stride, dilation, begin, size, out_size):
    """(first output index, count, first input index) of the outputs whose input index
    o * stride + k * dilation - begin lies in [0, size), for tap k."""
    off = k * dilation - begin
    lo = 0 if off >= 0 else (-off + stride - 1) // stride
    hi = (size - 1 - off) // stride + 1 if size - 1 - off >= 0 else 0
    hi = min(hi, out_size)
    if hi <= lo:
        return 0, 0, 0
    return lo, hi - lo, lo * stride + off


def depthwise_filter_grad_loop(x, dy, dw, dims, c0, c1):
    """dw (C, KH * KW) of a depthwise conv, channels c0..c1: each tap's sum over images and
    outputs of dy times the input it met (x (N, C, H, W), dy (N, C, OH, OW), flat)."""
    n_, c_, h_, w_, oh_, ow_, sh, sw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]
    dh, dwl, top, left, kh_, kw_ = dims[8], dims[9], dims[10], dims[11], dims[12], dims[13]
    taps = kh_ * kw_
    for c in range(c0, c1):
        for t in range(taps):
            kh, kw = t // kw_, t % kw_
            r0, rows, ih0 = _tap_span(kh, sh, dh, top, h_, oh_)
            q0, cols, iw0 = _tap_span(kw, sw, dwl, left, w_, ow_)
            total = dw.dtype.type(0)
            for n in range(n_):
                plane = n * c_ + c
                for r in range(rows):
                    d0 = _U((plane * oh_ + r0 + r) * ow_ + q0)
                    x0 = _U((plane * h_ + ih0 + r * sh) * w_ + iw0)
                    acc = dw.dtype.type(0)
                    for j in range(_U(cols)):
                        acc += dy[d0 + j] * x[x0 + j * _U(sw)]
                    total += acc
            dw[c * taps + t] = total


def depthwise_input_grad_loop(dy, w, dx, dims, c0, c1):
    """dx (N, C, H, W) of a depthwise conv, channels c0..c1: zeroed, then each tap's weight
    times dy added where that tap read x (dy (N, C, OH, OW), w (C, KH * KW), flat)."""
    n_, c_, h_, w_, oh_, ow_, sh, sw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]
    dh, dwl, top, left, kh_, kw_ = dims[8], dims[9], dims[10], dims[11], dims[12], dims[13]
    taps = kh_ * kw_
    zero = dx.dtype.type(0)
    for n in range(n_):
        for c in range(c0, c1):
            plane = n * c_ + c
            base = _U(plane * h_ * w_)
            for i in range(_U(h_ * w_)):
                dx[base + i] = zero
            for t in range(taps):
                kh, kw = t // kw_, t % kw_
                r0, rows, ih0 = _tap_span(kh, sh, dh, top, h_, oh_)
                q0, cols, iw0 = _tap_span(kw, sw, dwl, left, w_, ow_)
                wt = w[c * taps + t]
                for r in range(rows):
                    d0 = _U((plane * oh_ + r0 + r) * ow_ + q0)
                    x0 = _U((plane * h_ + ih0 + r * sh) * w_ + iw0)
                    for j in range(_U(cols)):
                        dx[x0 + j * _U(sw)] += wt * dy[d0 + j]


def _depthwise_grad_dims(x_shape, kernel_shape, out_shape, strides, dilations, begin):
    return np.array([*x_shape, *out_shape, *strides, *dilations, *begin[:2], *kernel_shape], np.int64)


def bind_depthwise_grad(which, a, b, out, strides, dilations, begin, c0, c1):
    """A step for channels c0..c1 of a 2-D depthwise conv's gradient (group == C == M), or
    None: which="filter" (a = x, b = dy, out = dw) or "input" (a = dy, b = w, out = dx)."""
    if not available() or out.ndim != 4 or not _takes(a, b, out) \
            or not all(v.flags.c_contiguous for v in (a, b, out)):
        return None
    if which == "filter":
        x_shape, kernel, out_shape, loop = a.shape, out.shape[2:], b.shape[2:], depthwise_filter_grad_loop
    else:
        x_shape, kernel, out_shape, loop = out.shape, b.shape[2:], a.shape[2:], depthwise_input_grad_loop
    dims = _depthwise_grad_dims(x_shape, kernel, out_shape, strides, dilations, begin)
    return _bound(loop, a.reshape(-1), b.reshape(-1), out.reshape(-1), dims, np.int64(c0), np.int64(c1))


# -- RoiAlign ---------------------------------------------------------------------------------

def roi_align_loop(pixels, image, width, ys, yw, yuse, xs, xw, xuse, gh, gw, avg, acc):
    """acc (R, OH, OW, C) = each box's bins (image.py's roi_align, bit for bit its numpy
    steps): pixels (P, C), x channels last; image (R,) the first pixel row of each box's
    image; ys (2, R, OH, GY) the low and high row of each bin's sample slots, yw their
    weights (float64), yuse whether a slot is in use (in the box's grid, inside the image),
    xs, xw, xuse the same of columns (R, OW, GX); gh, gw each box's grid. A bin's row of C
    sums stays in cache while its samples' four corners, each a row of pixels, are weighted
    (in acc's precision, the weights rounded once from float64) and added: numpy's steps
    gathered every slot's corners for all the boxes at once, 16 passes of R * OH * OW * C."""
    rois, oh, ow, c = acc.shape
    gy, gx = ys.shape[3], xs.shape[3]
    low = acc.dtype.type(-np.inf)
    zero = acc.dtype.type(0)
    term = np.empty(c, acc.dtype)
    for r in range(rois):
        base = image[r]
        for ph in range(oh):
            for pw in range(ow):
                a = acc[r, ph, pw]
                for k in range(c):
                    a[k] = zero if avg else low
                for iy in range(gy):
                    for ix in range(gx):
                        use = yuse[r, ph, iy] and xuse[r, pw, ix]
                        if not avg and not (iy < gh[r] and ix < gw[r]):
                            continue
                        on = 1.0 if use else 0.0
                        y0, y1 = ys[0, r, ph, iy], ys[1, r, ph, iy]
                        x0, x1 = xs[0, r, pw, ix], xs[1, r, pw, ix]
                        w00 = acc.dtype.type(yw[0, r, ph, iy] * xw[0, r, pw, ix] * on)
                        w01 = acc.dtype.type(yw[0, r, ph, iy] * xw[1, r, pw, ix] * on)
                        w10 = acc.dtype.type(yw[1, r, ph, iy] * xw[0, r, pw, ix] * on)
                        w11 = acc.dtype.type(yw[1, r, ph, iy] * xw[1, r, pw, ix] * on)
                        p00, p01 = pixels[base + y0 * width + x0], pixels[base + y0 * width + x1]
                        p10, p11 = pixels[base + y1 * width + x0], pixels[base + y1 * width + x1]
                        if avg:  # ((w00 v00 + w01 v01) + w10 v10) + w11 v11, then into the bin's sum
                            for k in range(c):
                                term[k] = w00 * p00[k]
                            for k in range(c):
                                term[k] += w01 * p01[k]
                            for k in range(c):
                                term[k] += w10 * p10[k]
                            for k in range(c):
                                term[k] += w11 * p11[k]
                            for k in range(c):
                                a[k] += term[k]
                        else:  # numpy's maximum (NaN kept: _fold) of the four terms, then into the bin's
                            for k in range(c):
                                a[k] = _fold(a[k], _fold(_fold(w00 * p00[k], w01 * p01[k]),
                                                         _fold(w10 * p10[k], w11 * p11[k])))
                if avg:
                    count = max(gh[r] * gw[r], 1)
                    for k in range(c):
                        a[k] = a[k] / count
                else:
                    for k in range(c):
                        if a[k] == low:
                            a[k] = zero


def roi_align(pixels, image, width, ys, xs, gh, gw, avg, acc):
    """Run roi_align_loop on image.py's arrays (ys, xs: _roi_axis's tuples); False where numba
    is not loaded (numpy's steps then)."""
    if not loaded():
        return False

    def axis(t):  # (low and high indices, their weights, in use) of one axis's samples
        return np.stack(t[:2]).astype(np.int64), np.stack(t[2:4]), np.ascontiguousarray(t[4])
    args = (pixels, np.ascontiguousarray(image, np.int64), np.int64(width), *axis(ys), *axis(xs),
            np.ascontiguousarray(gh, np.int64), np.ascontiguousarray(gw, np.int64), bool(avg), acc)
    compiled(roi_align_loop, *args)(*args)
    return True


# -- NonMaxSuppression ------------------------------------------------------------------------

def nms_group_loop(boxes, order, threshold, limit, kept):
    """ops/select.py's _in_blocks as one greedy pass: the boxes (rows of y1, x1, y2, x2,
    area, float64) in `order`, each kept unless one kept before it overlaps it by IoU above
    `threshold` (as _overlaps: boxes of no area overlap nothing; a NaN corner makes the area
    NaN, so its box overlaps nothing), at most `limit`; their indices written to `kept`, their
    count returned. numpy's blocks run a Python loop a box and two IoU matrices a block:
    Faster R-CNN's 93 groups took 113 ms of its value inference. The models at one thread,
    interleaved with onnxruntime, the same outputs: Faster R-CNN 265 -> 184 ms (onnxruntime
    303), SSDlite 304 -> 164 (436)."""
    m = order.shape[0]
    alive = np.ones(m, np.bool_)
    count = 0
    zero = 0.0
    if limit <= 0:
        return count
    for a in range(m):
        if not alive[a]:
            continue
        i = order[a]
        kept[count] = i
        count += 1
        if count == limit:
            break
        y1, x1, y2, x2, area = boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3], boxes[i, 4]
        if not area > zero:
            continue
        for b in range(a + 1, m):
            if alive[b]:
                j = order[b]
                h = min(y2, boxes[j, 2]) - max(y1, boxes[j, 0])
                w = min(x2, boxes[j, 3]) - max(x1, boxes[j, 1])
                inter = (zero if h < zero else h) * (zero if w < zero else w)
                other = boxes[j, 4]
                if inter > zero and other > zero and inter / (area + other - inter) > threshold:
                    alive[b] = False
    return count


def nms_group(boxes, order, threshold, limit):
    """nms_group_loop's kept indices (a list), or None where numba is not loaded."""
    if not loaded():
        return None
    order = np.ascontiguousarray(order, np.int64)
    kept = np.empty(order.shape[0], np.int64)
    args = (np.ascontiguousarray(boxes, np.float64), order, np.float64(threshold), np.int64(limit), kept)
    count = compiled(nms_group_loop, *args)(*args)
    return kept[:count].tolist()


# -- max pooling -----------------------------------------------------------------------------

def _window_maxima(phases, tap_off, acc, length):
    """acc[:length] = each window's maximum over the taps' runs of the phases (tap t's run
    starts at tap_off[t]), by a select that keeps NaN, as numpy's maximum, and keeps the
    running value on ties (numpy's maximum(-0.0, 0.0) takes the later zero on x86)."""
    o = tap_off[0]
    for k in range(length):
        acc[k] = phases[o + k]
    for t in range(_U(1), _U(tap_off.shape[0])):
        o = tap_off[t]
        for k in range(length):
            a = phases[o + k]
            m = acc[k]
            acc[k] = a if a > m or a != a else m


def max_pool_loop(x, out, dims, cols, phases, tap_off, acc):
    """out (N, C, OH, OW) = the maximum of each window of x (N, C, H, W), both flat, a
    channel at a time over depthwise_loop's layout (phases bordered with -inf): each tap
    folds one long run of its phase into `acc` (_window_maxima)."""
    zero_i = _U(0)
    n_, c_, h_, w_, oh_, ow_, qw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[10]
    length = oh_ * qw
    for nc in range(n_ * c_):
        _load_phases(x, nc * h_ * w_, phases, zero_i, dims, cols)
        _window_maxima(phases, tap_off, acc, length)
        _crop_rows(acc, qw, out, nc * oh_ * ow_, oh_, ow_, 0)


def _fold(m, e):
    """_window_maxima's select: e where it is greater or NaN, else m (ties keep m)."""
    return e if e > m or e != e else m


def max_pool_rows_loop(x, out, dims, v):
    """out (N, C, OH, OW) = the maximum of each window of x (N, C, H, W), both flat, dilation
    1, an output row at a time: its window's rows of x copied into the rows of `v` between
    -inf pads (left of them, then W, then the rest; a pad row reads v's last row, all -inf),
    then each output the fold of its taps in kernel order (_window_maxima's select: NaN kept,
    ties to the earlier tap; bit for bit max_pool_loop), 3x3 windows in one pass held in
    registers, stride 2 by a literal stride, which LLVM loads as vectors. dims (uint64):
    N * C, H, W, OH, OW, kh, kw, sh, sw, top, left, the rows of v's width."""
    one, two, three = _U(1), _U(2), _U(3)
    planes, h_, w_, oh_, ow_, kh, kw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
    sh, sw, top, left, width = dims[7], dims[8], dims[9], dims[10], dims[11]
    pad = kh * width  # v's row of -inf
    low = out.dtype.type(-np.inf)
    for p in range(planes):
        src, d = p * h_ * w_, p * oh_ * ow_
        for r in range(oh_):
            for a in range(kh):
                row = r * sh + a  # x's row + top
                if row >= top and row - top < h_:
                    b, o = src + (row - top) * w_, a * width + left
                    for j in range(w_):
                        v[o + j] = x[b + j]
            r0 = r * sh
            b0 = _U(0) if r0 >= top and r0 - top < h_ else pad
            b1 = width if r0 + one >= top and r0 + one - top < h_ else pad
            b2 = two * width if r0 + two >= top and r0 + two - top < h_ else pad
            if kh == three and kw == three and sw == two:
                for j in range(ow_):
                    q = two * j
                    m = _fold(_fold(v[b0 + q], v[b0 + q + one]), v[b0 + q + two])
                    m = _fold(_fold(_fold(m, v[b1 + q]), v[b1 + q + one]), v[b1 + q + two])
                    out[d + j] = _fold(_fold(_fold(m, v[b2 + q]), v[b2 + q + one]), v[b2 + q + two])
            elif kh == three and kw == three:
                for j in range(ow_):
                    q = sw * j
                    m = _fold(_fold(v[b0 + q], v[b0 + q + one]), v[b0 + q + two])
                    m = _fold(_fold(_fold(m, v[b1 + q]), v[b1 + q + one]), v[b1 + q + two])
                    out[d + j] = _fold(_fold(_fold(m, v[b2 + q]), v[b2 + q + one]), v[b2 + q + two])
            else:
                for j in range(ow_):
                    out[d + j] = low
                for a in range(kh):
                    row = r0 + a
                    base = a * width if row >= top and row - top < h_ else pad
                    for c in range(kw):
                        for j in range(ow_):
                            out[d + j] = _fold(out[d + j], v[base + sw * j + c])
            d += ow_


def max_pool_tiles_loop(x, out, dims):
    """out (N, C, OH, OW) = the maximum of each 2x2 window of x (N, C, H, W), both flat,
    where the windows tile x (stride 2, no padding; MediaPipe's downsamplings): read in
    place, no phases (1.5-3x faster than max_pool_loop there; for 3x3 windows at stride 3
    the phases' vectorized runs were faster). The taps in kernel order through
    _window_maxima's select (NaN kept, ties to the earlier tap), bit for bit
    max_pool_loop. dims (uint64): N * C, H, W, OH, OW."""
    one, two = _U(1), _U(2)
    planes, h_, w_, oh_, ow_ = dims[0], dims[1], dims[2], dims[3], dims[4]
    for p in range(planes):
        src, dst = p * h_ * w_, p * oh_ * ow_
        for r in range(oh_):
            b = src + two * r * w_
            d = dst + r * ow_
            for j in range(ow_):
                m = x[b + two * j]
                a = x[b + two * j + one]
                m = a if a > m or a != a else m
                a = x[b + w_ + two * j]
                m = a if a > m or a != a else m
                a = x[b + w_ + two * j + one]
                out[d + j] = a if a > m or a != a else m


def _unload_phases(phases, base, dx, dst, dims, cols):
    """_load_phases backwards: the (H, W) plane of flat dx at `dst` from its stride phases
    at phases[base:]."""
    one, zero_i = _U(1), _U(0)
    h_, w_, sh, sw, top, qw, plane = dims[2], dims[3], dims[6], dims[7], dims[8], dims[10], dims[11]
    row, phase = (top // sh) * qw, top % sh
    for i in range(h_):
        for px in range(sw):
            d = base + (phase * sw + px) * plane + row + cols[px, 2]
            s0, count = dst + cols[px, 0], cols[px, 1]
            for j in range(count):
                dx[s0 + sw * j] = phases[d + j]
        dst += w_
        phase += one
        if phase == sh:
            phase = zero_i
            row += qw


def max_pool_grad_loop(x, dy, dx, dims, cols, phases, grads, tap_off, peak, left):
    """dx (N, C, H, W) of a 2-D max pool, all flat, a plane at a time over max_pool_loop's
    layout: the windows' maxima (`peak`), then each tap in kernel order takes the gradient
    of the windows it wins that no earlier tap took (`left`, dy in wide rows), adding it
    into `grads` (the phases' layout), which is copied out to dx last. The first maximum
    on ties, as the numpy kernel; a window holding NaN routes nothing; padding never wins."""
    zero_i = _U(0)
    zero = dx.dtype.type(0)
    n_, c_, h_, w_, oh_, ow_, qw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[10]
    taps = _U(tap_off.shape[0])
    length = oh_ * qw
    for nc in range(n_ * c_):
        _load_phases(x, nc * h_ * w_, phases, zero_i, dims, cols)
        _window_maxima(phases, tap_off, peak, length)
        src = nc * oh_ * ow_
        for r in range(oh_):
            for j in range(ow_):
                left[r * qw + j] = dy[src + r * ow_ + j]
            for j in range(ow_, qw):
                left[r * qw + j] = zero
        for k in range(grads.shape[0]):
            grads[k] = zero
        for t in range(taps):
            o = tap_off[t]
            for k in range(length):
                share = left[k] if phases[o + k] == peak[k] else zero
                grads[o + k] += share
                left[k] -= share
        _unload_phases(grads, zero_i, dx, nc * h_ * w_, dims, cols)


def bind_max_pool_grad(x, dy, dx, kernel_shape, strides, dilations, begin):
    """A step for a 2-D max pool's input gradient (max_pool_grad_loop) of floats, or None:
    one pass over x, dy and dx, where the numpy kernel makes five over the windows per tap
    (ResNet-18's pool at batch 8: 84-109 ms of a train step)."""
    if x.ndim != 4 or not _takes(x, dy, dx) or not all(a.flags.c_contiguous for a in (x, dy, dx)) \
            or not dy.size or not available():
        return None
    phases, tap_off, peak, cols, qw = depthwise_layout(x.shape[2:], kernel_shape, strides, dilations, begin,
                                                       dy.shape[2:], x.dtype)
    phases.fill(-np.inf)  # padding never wins
    (n, c, h, wd), (oh, ow) = x.shape, dy.shape[2:]
    dims = np.array([n, c, h, wd, oh, ow, *strides, *begin[:2], qw, phases.size // math.prod(strides)], _U)
    return _bound(max_pool_grad_loop, x.reshape(-1), dy.reshape(-1), dx.reshape(-1), dims, cols, phases,
                  np.zeros_like(phases), tap_off, peak, np.empty_like(peak))


def bind_max_pool(x, out, kernel_shape, strides, dilations, begin, planes=None):
    """A step for a 2-D max pool of floats (max_pool_tiles_loop where 2x2 windows tile x,
    max_pool_rows_loop at dilation 1: ResNet-18's 3x3 stride-2 pool at 112x112 1372 -> 322-364
    us, a 3x3 stride-1 one at 56x56 1039 -> 172; else max_pool_loop), over the (image,
    channel) planes `planes` (a range, a worker's share: the first two loops) or all, or None:
    also where numba is not loaded yet (a pool gains less than loading numba costs a first run: ResNet's one
    pool would load it)."""
    if not loaded() or x.ndim != 4 or not _takes(x, out) or not out.size \
            or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    (n, c, h, wd), (oh, ow) = x.shape, out.shape[2:]
    lo, hi = (0, n * c) if planes is None else planes
    xs, outs = x.reshape(n * c, -1)[lo:hi].reshape(-1), out.reshape(n * c, -1)[lo:hi].reshape(-1)
    if tuple(kernel_shape) == tuple(strides) == (2, 2) and tuple(dilations) == (1, 1) \
            and tuple(begin[:2]) == (0, 0) and 2 * oh <= h and 2 * ow <= wd:  # 2x2 windows tile x
        return _bound(max_pool_tiles_loop, xs, outs, np.array([hi - lo, h, wd, oh, ow], _U))
    if tuple(dilations) == (1, 1):
        kh, kw = kernel_shape
        width = max(begin[1] + wd, (ow - 1) * strides[1] + kw)
        dims = np.array([hi - lo, h, wd, oh, ow, kh, kw, *strides, *begin[:2], width], _U)
        return _bound(max_pool_rows_loop, xs, outs, dims, np.full((kh + 1) * width, -np.inf, x.dtype))
    if planes is not None:
        return None
    phases, tap_off, acc, cols, qw = depthwise_layout(x.shape[2:], kernel_shape, strides, dilations, begin,
                                                      out.shape[2:], x.dtype)
    phases.fill(-np.inf)  # padding never wins
    dims = np.array([n, c, h, wd, oh, ow, *strides, *begin[:2], qw, phases.size // math.prod(strides)], _U)
    return _bound(max_pool_loop, x.reshape(-1), out.reshape(-1), dims, cols, phases, tap_off, acc)


# -- Winograd transforms ----------------------------------------------------------------------
#
# winograd.py's tile transforms in numba, where numpy takes more passes and work: the
# input's V = B^T d B for each a x a tile d of x (numpy: a padded copy of x, a strided
# gather of the tiles and a product with B^T kron B^T, a^4 multiply-adds a tile and
# channel) and the output's Y = A^T P A with the bias and the activation, into the output
# plane (numpy: two products, a scatter, an activation pass). A channel at a time: its
# tiles are gathered into `pbuf` (a^2 runs of its tiles), then each transform is two
# passes of a-term sums (the rows', then the columns'), every sum one run across the
# channel's tiles, written to one place (LLVM vectorizes such a loop; with several outputs
# it cannot rule out their overlap, and stays scalar). The runs go on across a block of
# channels (and all images): one image's tiles of a small plane (7x7) make runs too short
# for the loops' vectors.

WINOGRAD_RUN = 1024  # tiles of a block's runs, about (a whole number of channels)

def _combine2(dst, at, src, o, stride, k, kat, n):
    """dst[at + t] = sum over i < 2 of k[kat + i] * src[o + i * stride + t], for t < n."""
    k0, k1 = k[kat], k[kat + _U(1)]
    o1 = o + stride
    for t in range(n):
        dst[at + t] = k0 * src[o + t] + k1 * src[o1 + t]


def _combine4(dst, at, src, o, stride, k, kat, n):
    """dst[at + t] = sum over i < 4 of k[kat + i] * src[o + i * stride + t], for t < n."""
    one, two = _U(1), _U(2)
    k0, k1, k2, k3 = k[kat], k[kat + one], k[kat + two], k[kat + _U(3)]
    o1, o2 = o + stride, o + stride + stride
    o3 = o2 + stride
    for t in range(n):
        dst[at + t] = k0 * src[o + t] + k1 * src[o1 + t] + k2 * src[o2 + t] + k3 * src[o3 + t]


def _combine6(dst, at, src, o, stride, k, kat, n):
    """dst[at + t] = sum over i < 6 of k[kat + i] * src[o + i * stride + t], for t < n."""
    one, two = _U(1), _U(2)
    k0, k1, k2, k3, k4, k5 = k[kat], k[kat + one], k[kat + two], k[kat + _U(3)], k[kat + _U(4)], k[kat + _U(5)]
    o1, o2 = o + stride, o + stride + stride
    o3, o4 = o2 + stride, o2 + stride + stride
    o5 = o4 + stride
    for t in range(n):
        dst[at + t] = (k0 * src[o + t] + k1 * src[o1 + t] + k2 * src[o2 + t] + k3 * src[o3 + t]
                       + k4 * src[o4 + t] + k5 * src[o5 + t])


def _combine(dst, at, src, o, stride, k, kat, n, a):
    """_combine2, _combine4 or _combine6, for a = 2, 4 or 6 terms."""
    if a == _U(2):
        _combine2(dst, at, src, o, stride, k, kat, n)
    elif a == _U(4):
        _combine4(dst, at, src, o, stride, k, kat, n)
    else:
        _combine6(dst, at, src, o, stride, k, kat, n)


def _gather_tiles(x, xb, h_, w_, top, left, m, k, th, tw, pbuf, blk, run_, row):
    """The k x k tiles (k = m + 2: an input's, overlapping; k = m: dy's) of the (H, W) plane
    of x at xb, tile (i, j) at the plane's row i * m - top and column j * m - left (zeros
    past its edges), into k^2 runs of pbuf (element (r, s) of the tiles in run r * k + s,
    runs run_ apart), from blk on. row: a row of the plane between zeros (left of them
    before it, the tiles' reach past it after), written here but for those zeros."""
    one, zero = _U(1), pbuf.dtype.type(0)
    p2, p3 = _U(2) * run_, _U(3) * run_
    p4 = p2 + p2
    for r in range(k):
        for i in range(th):
            y = i * m + r  # the plane's row + top
            d = r * k * run_ + blk + i * tw
            if top <= y < h_ + top:  # the row into `row`, then its tiles' columns: a tile's k a step
                at = xb + (y - top) * w_
                for c in range(w_):
                    row[left + c] = x[at + c]
                if k == _U(6):
                    for j in range(tw):
                        q = j * m
                        pbuf[d + j], pbuf[d + run_ + j] = row[q], row[q + one]
                        pbuf[d + p2 + j], pbuf[d + p3 + j] = row[q + _U(2)], row[q + _U(3)]
                        pbuf[d + p4 + j], pbuf[d + p4 + run_ + j] = row[q + _U(4)], row[q + _U(5)]
                elif k == _U(4):
                    for j in range(tw):
                        q = j * m
                        pbuf[d + j], pbuf[d + run_ + j] = row[q], row[q + one]
                        pbuf[d + p2 + j], pbuf[d + p3 + j] = row[q + _U(2)], row[q + _U(3)]
                else:
                    for j in range(tw):
                        q = j * m
                        pbuf[d + j], pbuf[d + run_ + j] = row[q], row[q + one]
            else:
                for s in range(k):
                    for j in range(tw):
                        pbuf[d + s * run_ + j] = zero


def _gather_block(x, c0, c1, n_, c_, h_, w_, top, left, m, k, th, tw, pbuf, run_, row):
    """_gather_tiles of channels c0 to c1 of x (N, C, H, W), every image's, into pbuf's
    runs: channel c's image n from ((c - c0) * N + n) * tiles per image on."""
    per = th * tw
    for c in range(c0, c1):
        for n in range(n_):
            _gather_tiles(x, (n * c_ + c) * h_ * w_, h_, w_, top, left, m, k, th, tw, pbuf, ((c - c0) * n_ + n) * per,
                          run_, row)


def winograd_input_loop(x, v, bt, pbuf, tbuf, row, dims):
    """v (a^2, C, tiles) = B^T d B for each a x a tile d of x (N, C, H, W; zeros past its
    edges), a = m + 2, tile (n, i, j) at x's row i * m - top and column j * m - left, for
    channels c0 to c1; bt: B^T (a, a), flat. A block of channels at a time, whose tiles
    run on in v: pbuf, tbuf hold a^2 runs of the block's tiles (d's elements, then d B's:
    element (r, s) of every tile in run r * a + s; pbuf.size / a^2 tiles a run, a whole
    number of channels); row: a row of x between zeros (left of them before it, the tiles'
    reach past it after). dims (uint64): N, C, H, W, tile rows, tile columns, top, left,
    m, c0, c1."""
    n_, c_, h_, w_, th, tw, top, left, m, c0, c1 = (dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
                                                    dims[6], dims[7], dims[8], dims[9], dims[10])
    a = m + _U(2)
    per = th * tw  # an image's tiles
    run_ = _U(pbuf.shape[0]) // (a * a)  # pbuf's stride from one run to the next
    block = run_ // (n_ * per)  # channels a block
    plane = c_ * n_ * per  # v's stride from one of the a^2 positions to the next
    for cs in range(c0, c1, block):
        ce = min(c1, cs + block)
        _gather_block(x, cs, ce, n_, c_, h_, w_, top, left, m, a, th, tw, pbuf, run_, row)
        length = (ce - cs) * n_ * per
        for r in range(a):  # d B: row r of each tile, column s = sum over s' of d[r, s'] B[s', s]
            for s in range(a):
                _combine(tbuf, (r * a + s) * run_, pbuf, r * a * run_, run_, bt, s * a, length, a)
        for k in range(a):  # B^T (d B): element (k, s) = sum over r of B^T[k, r] (d B)[r, s]
            for s in range(a):
                _combine(v, (k * a + s) * plane + cs * n_ * per, tbuf, s * run_, a * run_, bt, k * a, length, a)


def winograd_gradient_loop(dy, z, a_, pbuf, tbuf, row, dims):
    """z (a^2, M, tiles) = A g A^T for each m x m tile g of dy (N, M, OH, OW; zeros past its
    edge), tile (n, i, j) at dy's row i * m and column j * m, for channels m0 to m1: the
    filter gradient's transform of dy (winograd.filter_grad), a block of channels at a time
    as in winograd_input_loop; a_: A (a, m), flat; pbuf: m^2 runs of a block's tiles, tbuf:
    m * a; row: a row of dy with zeros after it. dims (uint64): N, M, OH, OW, tile rows,
    tile columns, m, m0, m1."""
    n_, mm_, oh_, ow_, th, tw, m, m0, m1 = (dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6],
                                            dims[7], dims[8])
    a = m + _U(2)
    per = th * tw
    run_ = _U(pbuf.shape[0]) // (m * m)
    block = run_ // (n_ * per)
    plane = mm_ * n_ * per
    for ms in range(m0, m1, block):
        me = min(m1, ms + block)
        _gather_block(dy, ms, me, n_, mm_, oh_, ow_, _U(0), _U(0), m, m, th, tw, pbuf, run_, row)
        length = (me - ms) * n_ * per
        for r in range(m):  # g A^T: element (r, j) = sum over s of g[r, s] A[j, s]
            for j in range(a):
                _combine(tbuf, (r * a + j) * run_, pbuf, r * m * run_, run_, a_, j * m, length, m)
        for k in range(a):  # A (g A^T): element (k, j) = sum over r of A[k, r] (g A^T)[r, j]
            for j in range(a):
                _combine(z, (k * a + j) * plane + ms * n_ * per, tbuf, j * run_, a * run_, a_, k * m, length, m)


def winograd_output_loop(p, b, at_, zbuf, ybuf, out, dims, act):
    """out (N, M, OH, OW) = act(A^T P A + b) for each tile's a x a products P (p: (a^2, M,
    tiles)), the m x m outputs of tile (n, i, j) at out's row i * m and column j * m (cropped
    at the plane's edge), for output channels m0 to m1, a block of them at a time as in
    winograd_input_loop; at_: A^T (m, a), flat; zbuf, ybuf: runs of a block's tiles (A^T P's
    m * a elements, Y's m * m). The activation: 0 none,
    1 relu, 2 relu6, 3 swish, 4 hard_swish. dims (uint64): N, M, OH, OW, tile rows, tile
    columns, m, m0, m1."""
    n_, mm_, oh_, ow_, th, tw, m, m0, m1 = (dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6],
                                            dims[7], dims[8])
    act = _U(act)
    lo, hi = _clip_bounds(out, act)
    a = m + _U(2)
    per = th * tw
    run_ = _U(ybuf.shape[0]) // (m * m)
    block = run_ // (n_ * per)
    plane = mm_ * n_ * per
    whole = ow_ // m  # tile columns inside out; a last one, if any, is cropped
    for ms in range(m0, m1, block):
        me = min(m1, ms + block)
        length = (me - ms) * n_ * per
        src = ms * n_ * per
        for r in range(m):  # A^T P: element (r, j) = sum over i of A^T[r, i] P[i, j]
            for j in range(a):
                _combine(zbuf, (r * a + j) * run_, p, j * plane + src, a * plane, at_, r * a, length, a)
        for r in range(m):  # (A^T P) A: element (r, s) = sum over j of (A^T P)[r, j] A^T[s, j]
            for s in range(m):
                _combine(ybuf, (r * m + s) * run_, zbuf, r * a * run_, run_, at_, s * a, length, a)
        for mm in range(ms, me):
            bias = b[mm]
            for n in range(n_):
                ob = (n * mm_ + mm) * oh_ * ow_
                blk = ((mm - ms) * n_ + n) * per
                for i in range(th):  # into out's rows, with the bias and the clip: a tile's m columns a step
                    for r in range(min(m, oh_ - i * m)):
                        d = ob + (i * m + r) * ow_
                        q = r * m * run_ + blk + i * tw
                        if m == _U(4):
                            for j in range(whole):
                                y0, y1 = ybuf[q + j] + bias, ybuf[q + run_ + j] + bias
                                y2, y3 = ybuf[q + run_ + run_ + j] + bias, ybuf[q + _U(3) * run_ + j] + bias
                                y0, y1 = lo if y0 < lo else y0, lo if y1 < lo else y1
                                y2, y3 = lo if y2 < lo else y2, lo if y3 < lo else y3
                                e = d + j * m
                                out[e], out[e + _U(1)] = hi if y0 > hi else y0, hi if y1 > hi else y1
                                out[e + _U(2)], out[e + _U(3)] = hi if y2 > hi else y2, hi if y3 > hi else y3
                        else:
                            for j in range(whole):
                                y0, y1 = ybuf[q + j] + bias, ybuf[q + run_ + j] + bias
                                y0, y1 = lo if y0 < lo else y0, lo if y1 < lo else y1
                                e = d + j * m
                                out[e], out[e + _U(1)] = hi if y0 > hi else y0, hi if y1 > hi else y1
                        if whole < tw:
                            for s in range(ow_ - whole * m):
                                v = ybuf[q + s * run_ + whole] + bias
                                v = lo if v < lo else v
                                out[d + whole * m + s] = hi if v > hi else v
                if act >= _U(3):
                    _activate_run(out, ob, oh_ * ow_, act)


def bind_winograd_input(x, v, m, begin, tile_rows, tile_cols, c0, c1):
    """A step for winograd_input_loop over channels c0:c1 of x into v (a^2, C, tiles), or
    None: numba not loaded (see `loaded`), or operands it does not take."""
    if not loaded() or x.ndim != 4 or not _takes(x, v) or not (x.flags.c_contiguous and v.flags.c_contiguous):
        return None
    a, run = m + 2, _winograd_run(x.shape[0] * tile_rows * tile_cols, c1 - c0)
    dims = np.array([*x.shape, tile_rows, tile_cols, *begin[:2], m, c0, c1], _U)
    row = np.zeros(max(tile_cols * m + 2, begin[1] + x.shape[3]), x.dtype)
    return _bound(winograd_input_loop, x.reshape(-1), v.reshape(-1), _transform(m, 0, x.dtype),
                  scratch(a * a * run, x.dtype), scratch(a * a * run, x.dtype), row, dims)


def _transform(m, which, dtype, transposed=False):
    """winograd.TRANSFORMS[m][which] (B^T, G or A^T; transposed, or not) flat, contiguous, in
    `dtype`: the coefficients of the Winograd loops' sums."""
    from .winograd import TRANSFORMS
    t = TRANSFORMS[m][which]
    return np.ascontiguousarray(t.T if transposed else t, dtype).reshape(-1)


def _winograd_run(tiles, channels):
    """Tiles of a run of the Winograd loops' blocks: as many channels' tiles as fit in
    WINOGRAD_RUN (one channel's at least, all `channels` at most)."""
    return tiles * max(1, min(channels, WINOGRAD_RUN // tiles))


def bind_winograd_gradient(dy, z, m, tile_rows, tile_cols, m0, m1):
    """A step for winograd_gradient_loop over channels m0:m1 of dy into z (a^2, M, tiles),
    or None."""
    if not loaded() or dy.ndim != 4 or not _takes(dy, z) or not (dy.flags.c_contiguous and z.flags.c_contiguous):
        return None
    a, run = m + 2, _winograd_run(dy.shape[0] * tile_rows * tile_cols, m1 - m0)
    dims = np.array([*dy.shape, tile_rows, tile_cols, m, m0, m1], _U)
    a_ = _transform(m, 2, dy.dtype, transposed=True)  # A, (a, m)
    return _bound(winograd_gradient_loop, dy.reshape(-1), z.reshape(-1), a_, scratch(m * m * run, dy.dtype),
                  scratch(m * a * run, dy.dtype), np.zeros(tile_cols * m, dy.dtype), dims)


def bind_winograd_output(p, bias, out, m, tile_rows, tile_cols, activation, m0, m1):
    """A step for winograd_output_loop over output channels m0:m1 of the products p (a^2,
    M, tiles) into out, with the bias (or none) and the fused activation, or None."""
    b = np.zeros(out.shape[1], out.dtype) if bias is None else bias
    act = _act_code(activation, out.dtype)
    if not loaded() or out.ndim != 4 or not _takes(p, b, out) or act is None \
            or not all(a.flags.c_contiguous for a in (p, b, out)):
        return None
    a, run = m + 2, _winograd_run(out.shape[0] * tile_rows * tile_cols, m1 - m0)
    dims = np.array([*out.shape, tile_rows, tile_cols, m, m0, m1], _U)
    return _bound(winograd_output_loop, p.reshape(-1), b, _transform(m, 2, out.dtype), scratch(m * a * run, out.dtype),
                  scratch(m * m * run, out.dtype), out.reshape(-1), dims, act)


# -- resizing ---------------------------------------------------------------------------------

def interpolate_loop(src, dst, index, weight, dims):
    """dst (L, S, T) = the sum over taps j of src (L, N, T) at index[j, s] times weight[j, s]
    (both (k, S)), all flat, dims (uint64) L, N, S, T: one axis of a linear or cubic resize,
    summed in numpy's order (each product rounded, then added tap after tap), in one pass
    where numpy gathers, multiplies and adds per tap; along the last axis (T = 1) it
    replaces a gather of single elements."""
    l_, n_, s_, t_ = dims[0], dims[1], dims[2], dims[3]
    taps = _U(index.shape[0])
    if t_ == _U(1):  # the last axis: a row at a time, each output's taps gathered
        i0, w0 = index[0], weight[0]
        if taps == _U(2):
            i1, w1 = index[1], weight[1]
            for lo in range(l_):
                row, d = lo * n_, lo * s_
                for o in range(s_):
                    dst[d + o] = src[row + i0[o]] * w0[o] + src[row + i1[o]] * w1[o]
            return
        for lo in range(l_):
            row, d = lo * n_, lo * s_
            for o in range(s_):
                dst[d + o] = src[row + i0[o]] * w0[o]
            for j in range(_U(1), taps):
                ij, wj = index[j], weight[j]
                for o in range(s_):
                    dst[d + o] = dst[d + o] + src[row + ij[o]] * wj[o]
        return
    for lo in range(l_):
        for o in range(s_):
            d = (lo * s_ + o) * t_
            w = weight[0, o]
            src_at = (lo * n_ + index[0, o]) * t_
            for t in range(t_):
                dst[d + t] = src[src_at + t] * w
            for j in range(_U(1), taps):
                w = weight[j, o]
                src_at = (lo * n_ + index[j, o]) * t_
                for t in range(t_):
                    dst[d + t] = dst[d + t] + src[src_at + t] * w


def bind_interpolate(src, dst, axis, index, weight):
    """A step for interpolate_loop along `axis` (index and weight (S, k), the taps whose
    weights are all zero left out, as numpy's path leaves them), or None: also where numba
    is not loaded yet (as bind_max_pool)."""
    if not loaded() or not _takes(src, dst) or not (src.flags.c_contiguous and dst.flags.c_contiguous) \
            or not dst.size or not index.shape[1]:
        return None
    dims = np.array([math.prod(src.shape[:axis]), src.shape[axis], dst.shape[axis], math.prod(src.shape[axis + 1:])],
                    _U)
    return _bound(interpolate_loop, src.reshape(-1), dst.reshape(-1), np.ascontiguousarray(index.T, _U),
                  np.ascontiguousarray(weight.T, dst.dtype), dims)


# -- a conv's windows that tile its input ----------------------------------------------------

def patches_loop(x, cols, dims):
    """cols (N, C, kh, kw, OH, OW) = x (N, C, H, W)'s windows of kh x kw at stride (kh, kw),
    all flat: im2col's columns of a conv whose windows tile x (conv.py's _patches), one pass
    over x's rows, each read once and dealt to its kw columns (two by literal stride 2, which
    LLVM vectorizes as an interleaved load, where numpy's strided copy took 69 us of
    iris_landmark's 64-channel 2x2 conv at 32x32). dims (uint64): N * C, H, W, kh, kw, OH, OW."""
    planes, h_, w_, kh, kw, oh, ow = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
    two = _U(2)
    per = kh * kw * oh * ow
    for p in range(planes):
        for i in range(kh):
            for r in range(oh):
                src = (p * h_ + r * kh + i) * w_
                dst = p * per + (i * kw * oh + r) * ow
                if kw == two:
                    d1 = dst + oh * ow
                    for t in range(ow):
                        cols[dst + t] = x[src + two * t]
                        cols[d1 + t] = x[src + two * t + _U(1)]
                else:
                    for j in range(kw):
                        d = dst + j * oh * ow
                        for t in range(ow):
                            cols[d + t] = x[src + t * kw + j]


def bind_patches(x, cols, kernel, out_shape, lo, hi):
    """A step for patches_loop over images lo:hi of x (N, C, H, W) into cols (N, C * kh * kw,
    OH * OW), or None: numba not loaded (a copy numpy does in one call gains too little to
    load it), or operands it does not take."""
    if not loaded() or x.ndim != 4 or not _takes(x, cols) or not (x.flags.c_contiguous and cols.flags.c_contiguous):
        return None
    dims = np.array([(hi - lo) * x.shape[1], *x.shape[2:], *kernel, *out_shape], _U)
    return _bound(patches_loop, x[lo:hi].reshape(-1), cols[lo:hi].reshape(-1), dims)


def im2col_loop(x, cols, pad, dims):
    """cols (N, C, kh, kw, R, OW) = x (N, C, H, W)'s windows (strides, dilations, zero
    padding) at output rows r0:r1, cols' R rows being output rows c0:c0 + R (all OH, or a
    block: the rest untouched), all flat: im2col's columns. Each plane's rows that those
    outputs read are first copied into `pad` (rows of WP floats, zeros where they read
    padding), so that each tap's run of outputs is a plain strided copy from it, with no
    bounds to test (against runs cut at x's edges, medians of six alternating processes:
    ResNet-18's stride-2 3x3 convs at batch 1, 64 channels at 56x56 390 -> 267 us, 128 at
    28x28 345 -> 217, 256 at 14x14 349 -> 189; 16 channels 3x3 at 55x55 159 -> 91); stride
    2 by a literal stride, which LLVM loads as vectors. dims (uint64): N * C, H, W, kh, kw,
    sh, sw, dh, dw, top, left, OH, OW, r0, r1, c0, R, WP (at least left + W and the last
    column a window reads, plus one)."""
    planes, h_, w_, kh, kw, sh, sw = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
    dh, dw, top, left, ow, r0, r1 = dims[7], dims[8], dims[9], dims[10], dims[12], dims[13], dims[14]
    c0, rows, wp = dims[15], dims[16], dims[17]  # dims[11], OH, bounds r1 where it was made
    zero = cols.dtype.type(0)
    one, two = _U(1), _U(2)
    if r1 <= r0:
        return
    first = r0 * sh  # the padded plane's first row read, and how many
    count = (r1 - one - r0) * sh + (kh - one) * dh + one
    for p in range(planes):
        for q in range(count):
            row = first + q  # x's row + top
            d = q * wp
            if row < top or row - top >= h_:
                for t in range(wp):
                    pad[d + t] = zero
            else:
                src = (p * h_ + row - top) * w_
                for t in range(left):
                    pad[d + t] = zero
                for t in range(w_):
                    pad[d + left + t] = x[src + t]
                for t in range(left + w_, wp):
                    pad[d + t] = zero
        for i in range(kh):
            for j in range(kw):
                d = (((p * kh + i) * kw + j) * rows + r0 - c0) * ow
                for r in range(r0, r1):
                    s0 = ((r - r0) * sh + i * dh) * wp + j * dw
                    if sw == one:
                        for t in range(ow):
                            cols[d + t] = pad[s0 + t]
                    elif sw == two:
                        for t in range(ow):
                            cols[d + t] = pad[s0 + two * t]
                    else:
                        for t in range(ow):
                            cols[d + t] = pad[s0 + sw * t]
                    d += ow


def bind_im2col(x, cols, kernel, strides, dilations, begin, out_shape, lo, hi, rows=None, compact=False):
    """A step for im2col_loop over images lo:hi of x (N, C, H, W) into cols (N, C * kh * kw,
    OH * OW), output rows `rows` (a range; default all), or into cols (hi - lo, C * kh * kw,
    len(rows) * OW) holding those images and rows alone where `compact`; or None: numba not
    loaded, or operands it does not take."""
    if not loaded() or x.ndim != 4 or not _takes(x, cols) or not (x.flags.c_contiguous and cols.flags.c_contiguous):
        return None
    r0, r1 = (0, out_shape[0]) if rows is None else rows
    c0, c1 = (r0, r1) if compact else (0, out_shape[0])
    if cols.shape[-1] != (c1 - c0) * out_shape[1]:
        raise ValueError(f"columns of {cols.shape[-1]} for output rows {c0}:{c1} of {out_shape[1]}")
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    wp = max(begin[1] + x.shape[3], (out_shape[1] - 1) * sw + (kw - 1) * dw + 1)  # the padded rows' width
    count = max(0, (r1 - 1 - r0) * sh + (kh - 1) * dh + 1)  # the padded rows the outputs read
    dims = np.array([(hi - lo) * x.shape[1], *x.shape[2:], *kernel, *strides, *dilations, *begin[:2], *out_shape,
                     r0, r1, c0, c1 - c0, wp], _U)
    return _bound(im2col_loop, x[lo:hi].reshape(-1), (cols if compact else cols[lo:hi]).reshape(-1),
                  np.zeros(max(1, count * wp), x.dtype), dims)


# -- bias, residual and activation in one pass ----------------------------------------------

def bias_activation_loop(acc, b, out, dims, act):
    """out (N, M, P, Q) = act(acc (N, M, PA, QA)[:, :, :P, :Q] + b[m]), both flat, dims
    (uint64) N * M, P, Q, PA, QA. The activations are selects that keep NaN, as numpy's
    maximum and clip do."""
    one, zero_i = _U(1), _U(0)
    rows, p_, q_, pa, qa = dims[0], dims[1], dims[2], dims[3], dims[4]
    m_ = _U(b.shape[0])
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    m = m_ - one
    for r in range(rows):
        m = zero_i if m + one == m_ else m + one
        bias = b[m]
        for p in range(p_):
            src = (r * pa + p) * qa
            dst = (r * p_ + p) * q_
            if act == 1:
                for q in range(q_):
                    v = acc[src + q] + bias
                    out[dst + q] = zero if v < zero else v
            elif act == 2:
                for q in range(q_):
                    v = acc[src + q] + bias
                    v = zero if v < zero else v
                    out[dst + q] = six if v > six else v
            else:
                for q in range(q_):
                    out[dst + q] = acc[src + q] + bias
        if act >= 3:  # over the plane at once (its rows may be too short to vectorize exp)
            _activate_run(out, r * p_ * q_, p_ * q_, act)


def bias_activation_inplace_loop(out, b, rows, length, act):
    """out (rows, length) flat, row r channel r % len(b): out = act(out + b[channel]) in
    place. Its own loop: with one array LLVM vectorizes it (the overlap check between two
    arrays fails, and falls back to scalar code, when they are the same)."""
    one, zero_i = _U(1), _U(0)
    m_ = _U(b.shape[0])
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    m = m_ - one
    base = zero_i
    for r in range(rows):
        m = zero_i if m + one == m_ else m + one
        bias = b[m]
        if act == 0:
            for k in range(length):
                out[base + k] += bias
        elif act == 1:
            for k in range(length):
                v = out[base + k] + bias
                out[base + k] = zero if v < zero else v
        elif act == 2:
            for k in range(length):
                v = out[base + k] + bias
                v = zero if v < zero else v
                out[base + k] = six if v > six else v
        elif act == 3:
            for k in range(length):
                out[base + k] = _swishf(out[base + k] + bias)
        else:
            for k in range(length):
                out[base + k] = _hard_swishf(out[base + k] + bias)
        base += length


def bind_bias_activation(acc, bias, out, activation):
    """A step writing act(acc + bias per channel) to out (N, M, ...), acc being out or a
    wider array holding it in its leading corner (a conv's result), or None."""
    if not loaded() or out.ndim not in (3, 4) or (bias is None and not activation):
        return None
    b = np.zeros(out.shape[1], out.dtype) if bias is None else bias
    if not _takes(acc, b, out) or not (acc.flags.c_contiguous and out.flags.c_contiguous and b.flags.c_contiguous):
        return None
    inplace, code = acc is out, _act_code(activation, out.dtype)
    if (not inplace and np.shares_memory(acc, out)) or code is None:
        return None
    if out.ndim == 3:
        acc, out = acc[..., None], out[..., None]
    rows = out.shape[0] * out.shape[1]
    if inplace:
        return _bound(bias_activation_inplace_loop, out.reshape(-1), b, _U(rows), _U(out[0, 0].size), code)
    dims = np.array([rows, *out.shape[2:], *acc.shape[2:]], _U)
    return _bound(bias_activation_loop, acc.reshape(-1), b, out.reshape(-1), dims, code)


def scale_shift_loop(x, a, b, out, dims, act):
    """out (R, L) = act(x (R, L) * a[c] + b[c]), both flat, row r's channel c = (C0 + r) %
    len(a), dims (uint64) R, L, C0: an inference batch norm (a = scale / sqrt(var + eps), b =
    bias - mean * a) and the activation after it in one pass, where numpy's two passes and the
    activation's third each read and write the whole tensor. Each product rounded before its
    sum (numpy's multiply, then its add: no fused multiply-add), so the same bits as those."""
    one, zero_i = _U(1), _U(0)
    rows, length, m = dims[0], dims[1], dims[2]
    m_ = _U(a.shape[0])
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    base = zero_i
    for r in range(rows):
        s, t = a[m], b[m]
        if act == 1:
            for k in range(length):
                v = x[base + k] * s + t
                out[base + k] = zero if v < zero else v
        elif act == 2:
            for k in range(length):
                v = x[base + k] * s + t
                v = zero if v < zero else v
                out[base + k] = six if v > six else v
        elif act == 3:
            for k in range(length):
                out[base + k] = _swishf(x[base + k] * s + t)
        elif act == 4:
            for k in range(length):
                out[base + k] = _hard_swishf(x[base + k] * s + t)
        else:
            for k in range(length):
                out[base + k] = x[base + k] * s + t
        base += length
        m = zero_i if m + one == m_ else m + one


def bind_scale_shift(x, a, b, out, activation):
    """A step writing act(x * a + b) to out (N, C, ...), a and b (C,) per channel (kept by
    the caller, which may rewrite them before each run), split over the current workers by
    rows of whole channels where there are many elements; or None (numba not loaded: a
    batch norm's two numpy passes gain too little to load it)."""
    if not loaded() or x.ndim < 2 or x.shape != out.shape or not x.size or a.shape != (x.shape[1],) \
            or b.shape != a.shape or not _takes(x, a, b, out) \
            or not all(v.flags.c_contiguous for v in (x, a, b, out)) or np.shares_memory(x, out):
        return None
    code = _act_code(activation, out.dtype)
    if code is None:
        return None
    c, length = x.shape[1], math.prod(x.shape[2:])
    rows = x.shape[0] * c
    x1, out1 = x.reshape(-1), out.reshape(-1)

    def piece(r0, r1):
        dims = np.array([r1 - r0, length, r0 % c], _U)
        return _bound(scale_shift_loop, x1[r0 * length:r1 * length], a, b, out1[r0 * length:r1 * length], dims, code)
    workers = threads.current()
    if workers is None or x.size < threads.MIN_ELEMENTS or rows < workers.n:
        return piece(0, rows)
    return workers.split([piece(r0, r1) for r0, r1 in threads.pieces(rows, workers.n)])


def add_activation_loop(a, b, out, act):
    """out (R, K) = act(a (R, K) + b), b being (R, K) or (1, K) (one row for all)."""
    r_, k_ = out.shape
    every = b.shape[0] != 1
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    for r in range(r_):
        br = b[r] if every else b[0]
        ar = a[r]
        dst = out[r]
        if act == 1:
            for k in range(k_):
                v = ar[k] + br[k]
                dst[k] = zero if v < zero else v
        elif act == 2:
            for k in range(k_):
                v = ar[k] + br[k]
                v = zero if v < zero else v
                dst[k] = six if v > six else v
        elif act == 3:
            for k in range(k_):
                dst[k] = _swishf(ar[k] + br[k])
        else:
            for k in range(k_):
                dst[k] = _hard_swishf(ar[k] + br[k])


def bind_add_activation(a, b, out, activation):
    """A step writing act(a + b) to out where a and b have out's shape, or one of them is
    a vector along out's last axis; None otherwise (or without an activation: numpy's add
    is one pass already)."""
    if not loaded() or not activation or not _takes(a, b, out) or out.ndim == 0:
        return None
    if a.shape != out.shape:
        a, b = b, a
    k = out.shape[-1] if b.shape != out.shape else out.size
    if a.shape != out.shape or (b.shape != out.shape and b.shape[-1:] != (k,)) or b.size not in (k, out.size):
        return None
    a2, b2, out2 = _rows(a, k), _rows(b, k), _rows(out, k)
    code = _act_code(activation, out.dtype)
    if a2 is None or b2 is None or out2 is None or code is None:
        return None
    return _bound(add_activation_loop, a2, b2, out2, code)


# -- recurrences: every time step of one direction in one call -----------------------------
# A step of an LSTM or GRU is one small matrix product and a few gate functions over the
# hidden state: numpy runs some 15 calls per step, each costing more than its work. These
# loops run the whole sequence, the products by _matmul_nt over the weights as ONNX lays
# them out (numba's BLAS binding, np.dot, took 182 us for a batch-8 LSTM step's 8x256 by
# 256x1024 product, OpenBLAS repacking the weights on every call; _matmul_nt 65 us).


def _matmul_nt(a, w, out):
    """out (B, N) = a (B, K) @ w (N, K)^T, all C-contiguous: dot products along K, 2 rows
    of a by 4 of w at a time so that each loaded element serves 4 (or 2) multiply-adds;
    compiled with reassociation (LLVM vectorizes the sums along K), so sums round in
    another order than BLAS's."""
    b_, k_, n_ = _U(a.shape[0]), _U(a.shape[1]), _U(w.shape[0])
    af, wf, of = a.reshape(-1), w.reshape(-1), out.reshape(-1)
    zero, one, two, three, four = _U(0), _U(1), _U(2), _U(3), _U(4)
    n4, b2 = n_ - n_ % four, b_ - b_ % two
    for j in range(zero, n4, four):
        w0 = j * k_
        w1, w2, w3 = w0 + k_, w0 + two * k_, w0 + three * k_
        for b in range(zero, b2, two):
            a0 = b * k_
            a1 = a0 + k_
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = a.dtype.type(0)
            for k in range(k_):
                p, q = af[a0 + k], af[a1 + k]
                x0, x1, x2, x3 = wf[w0 + k], wf[w1 + k], wf[w2 + k], wf[w3 + k]
                s00 += p * x0
                s01 += p * x1
                s02 += p * x2
                s03 += p * x3
                s10 += q * x0
                s11 += q * x1
                s12 += q * x2
                s13 += q * x3
            o = b * n_ + j
            of[o], of[o + one], of[o + two], of[o + three] = s00, s01, s02, s03
            o += n_
            of[o], of[o + one], of[o + two], of[o + three] = s10, s11, s12, s13
        for b in range(b2, b_):
            a0 = b * k_
            s0 = s1 = s2 = s3 = a.dtype.type(0)
            for k in range(k_):
                p = af[a0 + k]
                s0 += p * wf[w0 + k]
                s1 += p * wf[w1 + k]
                s2 += p * wf[w2 + k]
                s3 += p * wf[w3 + k]
            o = b * n_ + j
            of[o], of[o + one], of[o + two], of[o + three] = s0, s1, s2, s3
    for j in range(n4, n_):
        w0 = j * k_
        for b in range(b_):
            a0 = b * k_
            s = a.dtype.type(0)
            for k in range(k_):
                s += af[a0 + k] * wf[w0 + k]
            of[b * n_ + j] = s


# The recurrences call _matmul_nt's one compiled copy, a C function (numba.cfunc) that
# _matmul_nt_symbol() compiles, or loads from numba's cache, and names to LLVM, each loop a
# call of that name (_call_matmul_nt). A numba function calling another links the callee's
# optimized IR into its own module, where LLVM optimizes it again, and a loop loaded from
# numba's cache before the callee's own library ran that copy: its sums vectorized half as
# wide (16 fused multiply-adds against 28), 20-25% slower (a batch-1 LSTM's 1 x 256 by
# 256 x 1024 product 24-31 us against 20-24; loaded after the callee, the same loop ran the
# callee's own copy). One copy also gives every loop that calls it the same sums: an LSTM
# or GRU shared between threads the bits of one thread's.
MATMUL_NT_SYMBOL = "edgeflow_matmul_nt"
_MATMUL_NT = []  # the C function (numba's cfunc), once registered


def _matmul_nt_entry(a, w, out, b, k, n):
    """_matmul_nt on the float32 matrices at addresses a (b, k), w (n, k) and out (b, n)."""
    _matmul_nt(_carray(a, (b, k)), _carray(w, (n, k)), _carray(out, (b, n)))


def _matmul_nt_symbol():
    """Compile _matmul_nt_entry as a C function (once a process), and name it
    MATMUL_NT_SYMBOL to LLVM, before a loop calling it compiles or loads: the call in the
    loop's machine code resolves to it when the code loads."""
    if not _MATMUL_NT:
        numba = _numba[0]
        from llvmlite import binding
        pointer, size = numba.types.CPointer(numba.types.float32), numba.types.int64
        entry = numba.cfunc(numba.types.void(pointer, pointer, pointer, size, size, size), cache=True,
                            error_model="numpy", fastmath=_FASTMATH["_matmul_nt_entry"])(_matmul_nt_entry)
        binding.add_symbol(MATMUL_NT_SYMBOL, entry.address)
        _MATMUL_NT.append(entry)
    return _MATMUL_NT[0].address


def _call_matmul_nt(a, w, out):
    """_matmul_nt(a, w, out) by its one compiled copy (MATMUL_NT_SYMBOL): an intrinsic once
    numba is loaded, passing each matrix's address and lengths; a, w and out float32, each
    C-contiguous or a range of rows of a C-contiguous matrix (as the loops pass them)."""
    _matmul_nt(a, w, out)


def _call1(address, argument):
    """Call the C function of one int64 at `address` (an intrinsic once numba is loaded)."""
    import ctypes
    ctypes.CFUNCTYPE(None, ctypes.c_int64)(int(address))(int(argument))


def _product(entry, a, w, out):
    """out = a @ w^T: by native_gemm's compiled product where `entry` names one (its
    address, then the address of its operands' fields: rnn.py binds it, w packed in
    strips), else by _call_matmul_nt. native_gemm's tile (4 rows of a by 24 columns)
    took 0.64-0.77x _matmul_nt's time on an LSTM's products from 3 rows of a (8 x 256 by
    256 x 1024 64 against 83 us, 4 rows 33 against 52), 1.13x at 1 row."""
    if entry[0] != 0:
        _call1(entry[0], entry[1])
    else:
        _call_matmul_nt(a, w, out)


def _copy_row(src, dst):
    """dst[:] = src, a loop of its own: a bidirectional recurrence's y[:, d] is strided, and
    a store into it inside the gates' loop kept that loop scalar (the BiGRU's direction at
    batch 8: 5.8 ms, 3.8 with the copy apart)."""
    for k in range(src.shape[0]):
        dst[k] = src[k]


def lstm_loop(xw, r, h, c, g, y, backward, b0, b1, native):
    """ONNX LSTM with its default gate functions (sigmoid, tanh, tanh), no peepholes, in
    float32, for the batch rows b0:b1 (the others are other threads' work): per step t (in
    reverse when `backward`), g = h @ r^T + xw[t] (gates i, o, f, c; r as ONNX's R,
    (4n, n); the product _product's, native[0] its native entry or zeros), c = f * c + i *
    tanh(g_c), h = o * tanh(c), y[t] = h. The gates' sigmoids and tanhs are _sigmoidf and
    _tanh_gate, which LLVM vectorizes (libm's scalar exp and tanh took most of a batch-8 LSTM's
    time; Cephes' tanh, on exp, 2x the gates' time), their multiply-adds fused (_FASTMATH). Whole arrays and a row range, not views of the rows:
    numba types a view of xw's rows as strided, and its loops stay scalar."""
    seq = xw.shape[0]
    n = h.shape[1]
    hr, gr = h[b0:b1], g[b0:b1]
    for s in range(seq):
        t = seq - 1 - s if backward else s
        _product(native[0], hr, r, gr)
        x = xw[t]
        for b in range(b0, b1):
            gb, xb, hb, cb = g[b], x[b], h[b], c[b]
            for k in range(n):
                i = _sigmoidf(gb[k] + xb[k])
                o = _sigmoidf(gb[n + k] + xb[n + k])
                f = _sigmoidf(gb[2 * n + k] + xb[2 * n + k])
                cell = _tanh_gate(gb[3 * n + k] + xb[3 * n + k])
                ck = f * cb[k] + i * cell
                cb[k] = ck
                hb[k] = o * _tanh_gate(ck)
            _copy_row(hb, y[t, b])


def gru_loop(xw, r_zr, r_h, rbh, h, zr, hh, rh, y, backward, linear_before_reset, b0, b1, native):
    """ONNX GRU with its default gate functions (sigmoid, tanh), in float32 (_sigmoidf,
    _tanh_gate), for the batch rows b0:b1, as lstm_loop: per step, z and r from h @ r_zr^T +
    xw[t][:2n]; the candidate from (h @ r_h^T + rbh) * r (linear_before_reset) or
    (r * h) @ r_h^T, plus xw[t][2n:] (r_zr and r_h: the rows of ONNX's R, (2n, n) and
    (n, n)); h = (1 - z) * candidate + z * h; y[t] = h. The products are _product's, the
    gates' and the candidate's by native[0] and native[1]."""
    seq = xw.shape[0]
    n = h.shape[1]
    hr, zrr, hhr, rhr = h[b0:b1], zr[b0:b1], hh[b0:b1], rh[b0:b1]
    for s in range(seq):
        t = seq - 1 - s if backward else s
        x = xw[t]
        _product(native[0], hr, r_zr, zrr)
        for b in range(b0, b1):
            for k in range(2 * n):
                zr[b, k] = _sigmoidf(zr[b, k] + x[b, k])
        if linear_before_reset:
            _product(native[1], hr, r_h, hhr)
        else:
            for b in range(b0, b1):
                for k in range(n):
                    rh[b, k] = zr[b, n + k] * h[b, k]
            _product(native[1], rhr, r_h, hhr)
        for b in range(b0, b1):
            if linear_before_reset:  # the reset applied here, in gru_shared's expression (its contraction)
                for k in range(n):
                    cand = _tanh_gate((hh[b, k] + rbh[k]) * zr[b, n + k] + x[b, 2 * n + k])
                    h[b, k] = cand + zr[b, k] * (h[b, k] - cand)  # (1 - z) cand + z h: one contraction
            else:
                for k in range(n):
                    cand = _tanh_gate(hh[b, k] + x[b, 2 * n + k])
                    h[b, k] = cand + zr[b, k] * (h[b, k] - cand)
            _copy_row(h[b], y[t, b])


# The recurrences on several threads at once (`lstm_shared`, `gru_shared`): a step's
# hidden units in blocks, which the threads claim, each block its gates' rows of R, the
# product and the gate functions of its units for every batch row. A step waits for all its
# blocks before the next begins (it reads all of h). Each thread claims its own share of a
# step's blocks first (so that its rows of R stay in its core's cache from step to step),
# then whatever the others have not: a thread that starts late, or never while another
# runs (a worker's core taken, or the pieces run one after the other), costs no step more
# than the work it leaves to the others.
# `sync` holds, per step, a claim counter per thread's share and a count of blocks done,
# each on a cache line of its own (8 int64s), zero before the pieces start, and last the
# address of sched_yield (`_wait_step`).

# Looks at a step's count of blocks done before a waiting thread yields its core at each.
SHARED_SPINS = 2000


def yield_address():
    """The address of the C library's sched_yield (the shared recurrences' `sync` holds it
    last), or 0 where there is none."""
    from ..native_threads import libc_address
    try:
        return libc_address("sched_yield")
    except (OSError, AttributeError, TypeError):
        return 0


def _call0(address):
    """Call the C function of no arguments at `address` (none where it is 0): an intrinsic
    once numba is loaded."""
    if address:
        import ctypes
        ctypes.CFUNCTYPE(ctypes.c_int)(int(address))()


def _fetch_add(sync, index):
    """sync[index] += 1, returning the value before, in one atomic operation (an intrinsic
    once numba is loaded: `_compile_scalars`)."""
    old = sync[index]
    sync[index] = old + 1
    return old


def _load_acquire(sync, index):
    """sync[index], read afresh each call, and no later read of memory runs before it (an
    intrinsic once numba is loaded)."""
    return sync[index]


def _shared_step(s, backward, hbuf, xw, y, threads):
    """Step s's h to read, h to write, xw[t] and y[t], and where its counters start in sync."""
    t = xw.shape[0] - 1 - s if backward else s
    return hbuf[s % 2], hbuf[(s + 1) % 2], xw[t], y[t], s * (threads + 1) * 8


def _claim_units(sync, base, me, threads, n, units):
    """(first, count): the hidden units of the next block of a step that thread `me` of
    `threads` takes (the step's counters at sync[base:]); count 0 once every block is
    claimed."""
    blocks = (n + units - 1) // units
    for k in range(threads):
        share = (me + k) % threads
        first = share * blocks // threads
        v = _fetch_add(sync, base + share * 8)
        if v < (share + 1) * blocks // threads - first:
            u0 = (first + v) * units
            return u0, min(units, n - u0)
    return 0, 0


def _wait_step(sync, base, threads, n, units):
    """Spin until every block of the step whose counters are at sync[base:] is done; past
    SHARED_SPINS looks, yielding the core at each (sync's last element: the address of
    sched_yield, or 0), so that a thread sharing this core (more threads than cores, a
    core another process holds) gets to finish its block."""
    spins = 0
    while _load_acquire(sync, base + threads * 8) < (n + units - 1) // units:
        spins += 1
        if spins > SHARED_SPINS:
            _call0(sync[sync.shape[0] - 1])


def lstm_shared(xw, r, hbuf, c, gs, y, sync, backward, native, me, threads, units):
    """lstm_loop's sequence, as one of `threads` threads running it at once (`me` this one):
    per step, blocks of `units` hidden units claimed (`_claim_units`), each block's four
    gates from its rows of R (`_product`, by native[me, s % 2, block, gate], into this
    thread's scratch gs[me]), its cells
    and hidden units updated; h read from hbuf[s % 2] and written to hbuf[(s + 1) % 2]
    (every block reads all of h), y[t] its copy. The same arithmetic per element as
    lstm_loop."""
    batch, n = c.shape
    for s in range(xw.shape[0]):
        h, hn, x, yt, base = _shared_step(s, backward, hbuf, xw, y, threads)
        while True:
            u0, w = _claim_units(sync, base, me, threads, n, units)
            if w == 0:
                break
            g = gs[me, :4 * batch * w].reshape(4, batch, w)
            products = native[me, s % 2, u0 // units]
            for q in range(4):
                _product(products[q], h, r[q * n + u0:q * n + u0 + w], g[q])
            # unsigned indices: numba checks a signed one for a negative value on each access,
            # which kept the loop scalar (70 ns an element)
            first, un = _U(u0), _U(n)
            for b in range(batch):
                xb, cb, hb = x[b], c[b], hn[b]
                for k in range(_U(0), _U(w)):
                    u = first + k
                    i = _sigmoidf(g[0, b, k] + xb[u])
                    o = _sigmoidf(g[1, b, k] + xb[un + u])
                    f = _sigmoidf(g[2, b, k] + xb[_U(2) * un + u])
                    cell = _tanh_gate(g[3, b, k] + xb[_U(3) * un + u])
                    ck = f * cb[u] + i * cell
                    cb[u] = ck
                    hb[u] = o * _tanh_gate(ck)
                _copy_row(hb[u0:u0 + w], yt[b, u0:u0 + w])
            _fetch_add(sync, base + threads * 8)
        _wait_step(sync, base, threads, n, units)


def gru_shared(xw, r_zr, r_h, rbh, hbuf, gs, y, sync, backward, native, me, threads, units):
    """gru_loop's sequence with linear_before_reset, shared between `threads` threads as
    lstm_shared's: a block's update and reset gates and candidate from its rows of R, all
    three of its units alone."""
    batch, n = hbuf.shape[1], hbuf.shape[2]
    for s in range(xw.shape[0]):
        h, hn, x, yt, base = _shared_step(s, backward, hbuf, xw, y, threads)
        while True:
            u0, w = _claim_units(sync, base, me, threads, n, units)
            if w == 0:
                break
            g = gs[me, :3 * batch * w].reshape(3, batch, w)
            products = native[me, s % 2, u0 // units]
            _product(products[0], h, r_zr[u0:u0 + w], g[0])
            _product(products[1], h, r_zr[n + u0:n + u0 + w], g[1])
            _product(products[2], h, r_h[u0:u0 + w], g[2])
            first, un = _U(u0), _U(n)  # unsigned indices, as lstm_shared's
            for b in range(batch):
                xb, hb, nb = x[b], h[b], hn[b]
                for k in range(_U(0), _U(w)):
                    u = first + k
                    z = _sigmoidf(g[0, b, k] + xb[u])
                    reset = _sigmoidf(g[1, b, k] + xb[un + u])
                    cand = _tanh_gate((g[2, b, k] + rbh[u]) * reset + xb[_U(2) * un + u])
                    nb[u] = cand + z * (hb[u] - cand)  # as gru_loop's
                _copy_row(nb[u0:u0 + w], yt[b, u0:u0 + w])
            _fetch_add(sync, base + threads * 8)
        _wait_step(sync, base, threads, n, units)


def bind_recurrence(kind, *args):
    """lstm_loop or gru_loop (`kind`) compiled for `args` as the kernel will pass them
    (their types; the arrays may change between runs), or None: numba absent or
    disabled, or operands its loops do not take (float32 only: float64 runs numpy's
    steps, to full precision)."""
    arrays = [a for a in args if isinstance(a, np.ndarray) and a.dtype != np.int64]  # not `sync`
    if not available() or not _takes(*arrays) or arrays[0].dtype != np.float32:
        return None
    _compile_scalars(_numba[0])
    _matmul_nt_symbol()
    return compiled({"lstm": lstm_loop, "gru": gru_loop, "lstm_shared": lstm_shared, "gru_shared": gru_shared}[kind],
                    *args)


# -- along the last axis, one row at a time -------------------------------------------------

def layer_norm_loop(x, scale, bias, out, rows, eps):
    """Each row of out (R, K), flat: (x - mean) / sqrt(var + eps) * scale + bias, the
    statistics accumulated in float64 over the row (two passes over it, in cache; the sums
    reassociated, so that they vectorize); rows (uint64): R, K; eps: one float."""
    r_, k_ = rows[0], rows[1]
    epsilon = float(eps[0])
    for r in range(r_):
        at = r * k_
        total = 0.0
        for k in range(k_):
            total += x[at + k]
        mean = total / k_
        sq = 0.0
        for k in range(k_):
            d = x[at + k] - mean
            sq += d * d
        inv = 1.0 / math.sqrt(sq / k_ + epsilon)
        for k in range(k_):
            out[at + k] = (x[at + k] - mean) * inv * scale[k] + bias[k]


# Softmaxes of at least this many elements load numba (an attention's: a BERT-like
# encoder's 4 x 128 x 128 took 223 us in numpy's five passes, 3.4 ns an element); smaller
# ones (a classifier's last op) take the loop only where numba is loaded already.
SOFTMAX_LOADS = 1 << 14


def softmax_loop(x, out, r_, k_):
    """out (R, K) = each row's exp(x - its max) / the sum of those, all flat, in float32
    (_exp_nonpositive): three passes over a row in cache (the max over eight running maxima, which keeps
    the compares from waiting on each other; the exps and their sum, which LLVM vectorizes;
    the scale), where numpy makes five over the whole array. A row holding NaN, or +inf,
    gives NaN throughout, as numpy's formula does (the max skips a NaN; exp(NaN) then spoils
    the sum)."""
    eight = _U(8)
    k8 = k_ - k_ % eight
    for r in range(r_):
        b = r * k_
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = x[b]
        for k in range(b, b + k8, eight):
            v = x[k]
            m0 = v if v > m0 else m0
            v = x[k + _U(1)]
            m1 = v if v > m1 else m1
            v = x[k + _U(2)]
            m2 = v if v > m2 else m2
            v = x[k + _U(3)]
            m3 = v if v > m3 else m3
            v = x[k + _U(4)]
            m4 = v if v > m4 else m4
            v = x[k + _U(5)]
            m5 = v if v > m5 else m5
            v = x[k + _U(6)]
            m6 = v if v > m6 else m6
            v = x[k + _U(7)]
            m7 = v if v > m7 else m7
        for k in range(b + k8, b + k_):
            v = x[k]
            m0 = v if v > m0 else m0
        m0 = m1 if m1 > m0 else m0
        m2 = m3 if m3 > m2 else m2
        m4 = m5 if m5 > m4 else m4
        m6 = m7 if m7 > m6 else m6
        m0 = m2 if m2 > m0 else m0
        m4 = m6 if m6 > m4 else m4
        m = m4 if m4 > m0 else m0
        total = _ZERO
        for k in range(b, b + k_):
            e = _exp_nonpositive(x[k] - m)
            out[k] = e
            total += e
        inv = _ONE / total
        for k in range(b, b + k_):
            out[k] *= inv


def bind_softmax(x, out, axis):
    """A step for a float32 softmax over x's last axis (C-contiguous), its rows split over
    the current workers where there are many elements; or None (see SOFTMAX_LOADS)."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.ndim == 0 or axis % x.ndim != x.ndim - 1 \
            or not x.size or x.shape != out.shape or not (x.flags.c_contiguous and out.flags.c_contiguous) \
            or not (loaded() or (x.size >= SOFTMAX_LOADS and available())):
        return None
    k = x.shape[-1]
    x1, out1, rows = x.reshape(-1), out.reshape(-1), x.size // k
    workers = threads.current()
    split = workers is not None and x.size * _COSTS["softmax_loop"] >= threads.MIN_ELEMENTS
    pieces = threads.pieces(rows, workers.n) if split else [(0, rows)]
    steps = [_bound(softmax_loop, x1[a * k:b * k], out1[a * k:b * k], _U(b - a), _U(k)) for a, b in pieces]
    return steps[0] if len(steps) == 1 else workers.split(steps)


def bind_layer_norm(x, scale, bias, out, axis, eps):
    """A step for layer_norm over axes [axis, rank) with scale and bias of the normalized
    shape (read at each run: they may be variables), its rows split over the current workers
    where there are many elements (_COSTS); or None."""
    if not available() or x.ndim == 0 or not x.size:
        return None
    normalized = x.shape[axis % x.ndim:]
    k = math.prod(normalized)
    b = np.zeros(k, x.dtype) if bias is None else bias
    if not _takes(x, scale, b, out) or scale.shape != normalized or b.shape not in (normalized, (k,)):
        return None
    x2, out2, s1, b1 = _rows(x, k), _rows(out, k), _rows(scale, k), _rows(b, k)
    if any(a is None for a in (x2, out2, s1, b1)):
        return None
    rows = x.size // k
    epsilon = np.array([eps], x.dtype)  # ONNX's epsilon is a float32: exact in either
    workers = threads.current()
    split = workers is not None and x.size * _COSTS["layer_norm_loop"] >= threads.MIN_ELEMENTS and rows > 1
    pieces = threads.pieces(rows, workers.n) if split else [(0, rows)]
    flat_x, flat_out = x2.reshape(-1), out2.reshape(-1)
    steps = [_bound(layer_norm_loop, flat_x[a * k:bb * k], s1[0], b1[0], flat_out[a * k:bb * k],
                    np.array([bb - a, k], _U), epsilon) for a, bb in pieces]
    return steps[0] if len(steps) == 1 else workers.split(steps)


def gelu_loop(x, out, tanh):
    """out = gelu(x) elementwise, in float64 (float64 x; float32 x runs gelu_float32_loop):
    x / 2 * erfc(-x / sqrt 2), or with approximate='tanh' x * sigmoid(2 * sqrt(2 / pi) *
    (x + 0.044715 x^3))."""
    for i in range(x.shape[0]):
        v = float(x[i])
        if tanh:
            out[i] = v / (1.0 + math.exp(-1.5957691216057308 * (v + 0.044715 * v * v * v)))
        else:
            out[i] = v / 2 * math.erfc(-v / 1.4142135623730951)  # erfc(-x / sqrt 2): no cancellation


def bind_gelu(x, out, approximate):
    """A step for gelu on a contiguous float array (float32 by gelu_float32_loop, float64 by
    gelu_loop), or None."""
    if not available() or not _takes(x, out):
        return None
    loop = gelu_float32_loop if x.dtype == np.float32 else gelu_loop
    return _elementwise(loop, (x,), out, int(approximate == "tanh"))  # an int: the native entry's field


# -- float32 activations on an exp that vectorizes --------------------------------------------
#
# numba's math.exp is a call into libm per element: no SIMD. _exp_nonpositive (x <= 0) and
# _exp_wide (a float64 argument) are exp in float32 arithmetic LLVM vectorizes: n = round(x /
# ln 2) (by adding and subtracting 1.5 * 2^23), r = x - n ln 2 (ln 2 in two parts, Cody and
# Waite's: n * C1 is exact), exp(r) by Cephes' expf polynomial on |r| <= ln 2 / 2, times 2^n
# built from exponent bits (so that the result rounds into subnormals once). Within 1.5 ulp
# of exp (tests/interp/test_jit.py), 0.6-0.8 ns an element against numpy's 1.3.

_f = np.float32
_ZERO, _HALF, _ONE, _THREE, _SIX, _INF = _f(0), _f(0.5), _f(1), _f(3), _f(6), _f(np.inf)
# The recurrences' gates' tanh (_tanh_gate): tanh(x) = x P(x^2) / Q(x^2) on |x| <= 9, +-1 beyond,
# a rational minimax fit made by tools/fit_tanh.py (which prints these coefficients): within
# 3.3e-7 of tanh everywhere in float32.
_G_P = tuple(map(_f, ("1.0", "0.13084009289741516", "0.0031039558816701174", "1.1154304957017303e-05",
                      "-2.022521705669078e-08", "5.277946829584934e-11", "-8.488712120377495e-14")))
_G_Q = tuple(map(_f, ("1.0", "0.4641733765602112", "0.02449517697095871", "0.00025461448240093887")))
_GP0, _GP1, _GP2, _GP3, _GP4, _GP5, _GP6 = _G_P
_GQ0, _GQ1, _GQ2, _GQ3 = _G_Q
_G_CLAMP = _f(9.0)
_LOG2E, _MAGIC = _f(1.4426950408889634), _f(12582912.0)
_LN2_HI, _LN2_LO = _f(0.693359375), _f(-2.12194440e-4)
_EXP_HI, _EXP_LO = _f(88.72284), _f(-104.0)  # exp overflows at and above, is 0 at and below
_EXP_POLY = tuple(map(_f, (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
                           1.3981999507e-3, 1.9875691500e-4)))
_P0, _P1, _P2, _P3, _P4, _P5 = _EXP_POLY
_B127 = np.int32(127)
# _exp_nonpositive's constants, for native_ir.py's swish (LLVM IR of the same steps).
EXP_CONSTANTS = {"lo": _EXP_LO, "log2e": _LOG2E, "magic": _MAGIC, "ln2_hi": _LN2_HI, "ln2_lo": _LN2_LO,
                 "poly": _EXP_POLY}
_LN2_64 = 0.6931471805599453
# Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + E(t)), t = 1 / (1 + z / 2), z >= 0, E a
# polynomial of degree 9, within 1.2e-7 relative everywhere (Press et al., 6.2).
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9 = map(_f, (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
    -0.82215223, 0.17087277))
_SQRT_HALF = _f(0.7071067811865476)


def _expm_poly(r):
    """exp(r) for float32 |r| <= ln 2 / 2 (Cephes' expf)."""
    return ((((((_P5 * r + _P4) * r + _P3) * r + _P2) * r + _P1) * r + _P0) * (r * r) + r) + _ONE


def _times_pow2(p, n):
    """p * 2^n for an integral float n in [-150, 128] (p near 1): two normal factors."""
    k = np.int32(n)
    h = np.int32(k >> 1)
    low = np.int32((h + _B127) << 23).view(np.float32)
    high = np.int32((k - h + _B127) << 23).view(np.float32)
    return p * low * high


_B191, _TWO_M64 = np.int32(127 + 64), _f(2.0 ** -64)


def _exp_nonpositive(x):
    """exp(x) for float32 x <= 0 (sigmoid's exp(-|v|), softmax's exp(x - max)) or NaN (kept):
    no overflow to test (0 below -104), and 2^n as 2^(n + 64), normal for every n down to
    -150, times the constant 2^-64 (rounding once into subnormals, as _times_pow2's second
    factor does): swish's loop 1.14 -> 0.80 ns an element."""
    v = x if x > _EXP_LO else _EXP_LO  # NaN becomes a number here, and is put back below
    n = (v * _LOG2E + _MAGIC) - _MAGIC
    r = (v - n * _LN2_HI) - n * _LN2_LO
    e = _expm_poly(r) * np.int32((np.int32(n) + _B191) << 23).view(np.float32) * _TWO_M64
    e = e if x > _EXP_LO else _ZERO
    return e if x == x else x


def _exp_wide(a):
    """exp(a) in float32 for a float64 a, reduced in float64: accurate where a float32
    argument would not be (-x^2 / 2 of a large x, rounded to float32, is off by |x^2| ulps).
    Only the reduction is in float64: n and the range checks come from a rounded to float32."""
    b = np.float32(a)
    v = b if b > _EXP_LO else _EXP_LO
    v = v if v < _EXP_HI else _EXP_HI
    n = (v * _LOG2E + _MAGIC) - _MAGIC
    e = _times_pow2(_expm_poly(np.float32(a - np.float64(n) * _LN2_64)), n)
    e = e if b < _EXP_HI else _INF
    e = e if b > _EXP_LO else _ZERO
    return e if b == b else b


_HIGH_BITS = np.int32(-4096)  # a float32's sign, exponent and 12 leading significant bits


def _exp_less_half_square(q, v):
    """exp(q - v^2 / 2) in float32 arithmetic, for float32 q (|q| < 2) and v: v^2 / 2 is an
    exact sum (Dekker's split of v into halves of 12 significant bits: their squares and
    product are exact in float32), and the reduction takes n ln 2 from its leading part
    before q and the rest are added, so that the rounding of a float32 square (|v|^2 ulps,
    up to 1e-5 of the result where exp(-100) is still normal) never reaches the result:
    within 4e-7 relative."""
    high = np.int32(np.float32(v).view(np.int32) & _HIGH_BITS).view(np.float32)
    low = v - high
    h = _HALF * high * high  # exact
    m = high * low  # exact
    a = q - h
    c = a if a > _EXP_LO else _EXP_LO
    n = (c * _LOG2E + _MAGIC) - _MAGIC
    r = (((-h - n * _LN2_HI) + q) - m) - (n * _LN2_LO + _HALF * low * low)
    e = _times_pow2(_expm_poly(r), n)
    return e if a > _EXP_LO else _ZERO


def _sigmoidf(v):
    """1 / (1 + exp(-v)) for float32 v, as e / (1 + e), e = exp(v), where v < 0: nothing
    overflows, and tiny results keep their precision."""
    e = _exp_nonpositive(-abs(v))
    return (_ONE if v >= _ZERO else e) / (_ONE + e)


def _tanh_gate(v):
    """tanh(v) for float32 v within 3.3e-7 (absolute and relative: some 6 ulp), in [-1, 1],
    signs of zero and NaN kept: one rational function of v clamped to [-9, 9] (_G_P, _G_Q), no
    exp, no branch. The recurrences' tanh: lstm2's gates at batch 8 took 21.7 us a step with
    Cephes' tanhf (2 ulp; a polynomial below 0.625, on exp above), 10.4-12.2 with this. Their
    sigmoids stay _sigmoidf's: (1 + _tanh_gate(v / 2)) / 2 took the gates to 6.7 us, but is off
    by up to 1.7e-7 near 0 and 1, which a gate passes on to a state that small (ONNX's GRU
    tests, atol 1e-7: outputs of 8.3e-7 came out 1.2e-7 off)."""
    c = _G_CLAMP if v > _G_CLAMP else v  # NaN stays
    c = -_G_CLAMP if c < -_G_CLAMP else c
    z = c * c
    p = (((((_GP6 * z + _GP5) * z + _GP4) * z + _GP3) * z + _GP2) * z + _GP1) * z + _GP0
    q = ((_GQ3 * z + _GQ2) * z + _GQ1) * z + _GQ0
    t = c * p / q
    t = _ONE if t > _ONE else t
    return -_ONE if t < -_ONE else t


def _swishf(v):
    """v sigmoid(v) for float32 v (the fused swish)."""
    return v * _sigmoidf(v)


def _hard_swishf(v):
    """v max(0, min(1, (v + 3) / 6)) for float32 v, NaN kept (the fused hard_swish, as
    hard_swish_loop computes it)."""
    s = (v + _THREE) / _SIX
    s = _ZERO if s < _ZERO else s
    return v * (_ONE if s > _ONE else s)


SCALARS = ("_expm_poly", "_times_pow2", "_exp_nonpositive", "_exp_wide", "_exp_less_half_square", "_sigmoidf",
           "_tanh_gate", "_swishf", "_hard_swishf", "_activate_run", "_load_phases",
           "_unload_phases", "_window_maxima",
           "_add_taps", "_add_taps4", "_crop_rows", "_matmul_nt", "_product", "_copy_row", "_shared_step", "_claim_units",
           "_wait_step", "_floats", "_uints", "_bytes", "_uints2", "_tap_span", "_clip_bounds", "_same_run", "_fold",
           "_column5", "_sum5", "_combine2", "_combine4", "_combine6", "_combine", "_gather_tiles", "_gather_block")
# The activation and depthwise loops and SCALARS may contract a * b + c into one fused multiply-add where the
# machine has one (rounded once, not twice: 20-30% faster, never less accurate here); the other
# loops keep the arithmetic as written.
_FASTMATH = dict.fromkeys(("sigmoid_loop", "swish_loop", "swish_inplace_loop", "hard_sigmoid_loop",
                           "hard_swish_loop", "gelu_float32_loop", "depthwise_loop", "depthwise_channels_loop",
                           "depthwise_same_loop", "small_conv_loop", "winograd_input_loop", "winograd_gradient_loop",
                           "winograd_output_loop"),
                          {"contract"})
_FASTMATH["_matmul_nt_entry"] = _FASTMATH["depthwise_filter_grad_loop"] = {"contract", "reassoc"}  # sums vectorize
_FASTMATH["softmax_loop"] = {"contract", "reassoc"}
# layer_norm_loop's float64 sums vectorize too: a BERT-like encoder's (128, 256) 62 -> 32 us, as accurate (float32
# sums took 9 us, but a row of mean 1000 and deviation 0.01 came out 1e-2 off, against 2e-7).
_FASTMATH["layer_norm_loop"] = {"contract", "reassoc"}
_FASTMATH["depthwise_input_grad_loop"] = {"contract"}
_FASTMATH["bias_activation_inplace_loop"] = _FASTMATH["bias_activation_loop"] = {"contract"}
_FASTMATH.update(dict.fromkeys(("lstm_loop", "gru_loop", "lstm_shared", "gru_shared"), {"contract"}))


def sigmoid_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = _sigmoidf(x[i])


def swish_loop(x, out, alpha):
    """out = x * sigmoid(alpha x)."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v * _sigmoidf(alpha * v)


def swish_inplace_loop(x):
    """x = x * sigmoid(x) in place: one array, which LLVM vectorizes (swish_loop with x as
    its out runs a scalar loop: it cannot tell the two apart, 1.9 ms on 301,056 floats
    against 0.26 out of place). A compiled depthwise conv's swish, after it (bind_depthwise)."""
    for i in range(x.shape[0]):
        x[i] = _swishf(x[i])


def hard_sigmoid_loop(x, out, alpha, beta):
    """out = max(0, min(1, alpha x + beta)), NaN kept (numpy's clip); alpha x + beta in
    float64, rounded once (near 0 it cancels)."""
    for i in range(x.shape[0]):
        v = np.float32(alpha * np.float64(x[i]) + beta)
        v = _ZERO if v < _ZERO else v
        out[i] = _ONE if v > _ONE else v


def hard_swish_loop(x, out):
    """out = x * max(0, min(1, x / 6 + 1 / 2)), as (x + 3) / 6: exact near -3, where x / 6 + 1 / 2
    cancels."""
    for i in range(x.shape[0]):
        out[i] = _hard_swishf(x[i])


def gelu_float32_loop(x, out, tanh):
    """gelu_loop for float32 x: the exact (erf) gelu in float32 arithmetic, exp(E(t) - x^2 / 2)
    by _exp_less_half_square (x^2 / 2 split exactly, so its rounding does not reach the
    result); the tanh approximation's u, a cubic in x, reduced in float64 for _exp_wide. Within
    1e-6 relative of gelu everywhere, its far negative tail (tiny, not 0) included."""
    if tanh:
        for i in range(x.shape[0]):
            v = x[i]
            w = np.float64(v)
            u = 1.5957691216057308 * (w + 0.044715 * w * w * w)  # gelu = x sigmoid(u), as in _sigmoidf
            e = _exp_wide(-abs(u))
            out[i] = v * ((_ONE if u >= 0.0 else e) / (_ONE + e))
        return
    for i in range(x.shape[0]):
        v = x[i]
        t = _ONE / (_ONE + _HALF * _SQRT_HALF * abs(v))  # z = |x| / sqrt 2
        q = _E0 + t * (_E1 + t * (_E2 + t * (_E3 + t * (_E4 + t * (_E5 + t * (_E6 + t * (
            _E7 + t * (_E8 + t * _E9))))))))
        half_tail = _HALF * t * _exp_less_half_square(q, v)  # erfc(|x| / sqrt 2) / 2
        # gelu = x erfc(-x / sqrt 2) / 2; erfc(-z) = 2 - erfc(z)
        out[i] = v * (half_tail if v < _ZERO else _ONE - half_tail)


_ACTIVATION_LOOPS = {"sigmoid": sigmoid_loop, "swish": swish_loop, "hard_sigmoid": hard_sigmoid_loop,
                     "hard_swish": hard_swish_loop}


def bind_activation(name, x, out, attrs):
    """A step for float32 sigmoid, swish, hard_sigmoid or hard_swish (float64 runs numpy's
    formulas, to full precision), or None."""
    if name not in _ACTIVATION_LOOPS or x.dtype != np.float32 or out.dtype != np.float32 or not available():
        return None
    params = {"swish": (np.float32(attrs.get("alpha", 1.0)),),
              "hard_sigmoid": (float(np.float32(attrs.get("alpha", 0.2))), float(np.float32(attrs.get("beta", 0.5))))}
    return _elementwise(_ACTIVATION_LOOPS[name], (x,), out, *params.get(name, ()))


def prelu_loop(x, slope, out, a_, c_, b_):
    """out (A, C, B) = x where x >= 0, else slope[c] * x, all flat: one pass, a select per
    element (along C where B is 1: a slope per last-axis channel)."""
    zero = x.dtype.type(0)
    base = _U(0)
    for a in range(a_):
        if b_ == _U(1):
            for c in range(c_):
                v = x[base + c]
                out[base + c] = v if v >= zero else slope[c] * v
            base += c_
            continue
        for c in range(c_):
            s = slope[c]
            for b in range(b_):
                v = x[base + b]
                out[base + b] = v if v >= zero else s * v
            base += b_


def _channels(x_shape, slope_shape):
    """(A, C, B): x's shape folded so that a slope broadcast to it varies along C alone (a
    scalar slope: C = 1), or None when it varies along axes apart."""
    full = (1,) * (len(x_shape) - len(slope_shape)) + tuple(slope_shape)
    varying = [k for k, d in enumerate(full) if d != 1]
    if not varying:
        return 1, 1, math.prod(x_shape)
    first, last = varying[0], varying[-1]
    if any(full[k] != x_shape[k] for k in range(first, last + 1)):
        return None
    return math.prod(x_shape[:first]), math.prod(x_shape[first:last + 1]), math.prod(x_shape[last + 1:])


def bind_prelu(x, slope, out):
    """A step for prelu of float operands, the slope constant along all but a run of
    adjacent axes (per channel, per element, or one value), split over the current workers
    along images or channels where there are many elements; or None. numpy's form needs a
    select that branches on every sign (see bind_where)."""
    folded = _channels(x.shape, slope.shape)
    if folded is None or not _takes(x, slope, out) or x.shape != out.shape or not out.size \
            or not all(a.flags.c_contiguous for a in (x, slope, out)) or not available():
        return None
    x3, out3, s1 = x.reshape(folded), out.reshape(folded), slope.reshape(-1)
    a_, c_, b_ = folded

    def piece(x_part, s_part, out_part):  # contiguous parts: flat views
        return _bound(prelu_loop, x_part.reshape(-1), s_part, out_part.reshape(-1), *map(_U, x_part.shape))
    workers = threads.current()
    if workers is not None and out.size >= threads.MIN_ELEMENTS:
        if a_ >= workers.n:
            steps = [piece(x3[a:b], s1, out3[a:b]) for a, b in threads.pieces(a_, workers.n)]
        elif a_ == 1 and c_ >= workers.n:
            steps = [piece(x3[:, a:b], s1[a:b], out3[:, a:b]) for a, b in threads.pieces(c_, workers.n)]
        else:
            steps = []
        if len(steps) > 1:
            return lambda: workers.run(steps)
    return piece(x3, s1, out3)


def clip_grad_loop(dy, x, out, low, high):
    """out = dy where low <= x <= high, else 0 (NaN x: dy), one pass."""
    zero = out.dtype.type(0)
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = zero if v < low or v > high else dy[i]


def bind_clip_grad(dy, x, low, high, out):
    """A step for clip_grad of float operands of one shape, split over the current workers
    where there are many elements; or None. numpy's form takes three passes and two masks
    (MobileNetV2's train step at batch 8, 1 thread: its ReLU6 gradients as less, greater
    and two wheres took 177 ms, as this loop 54)."""
    if not _takes(dy, x, out) or not available():
        return None
    return _elementwise(clip_grad_loop, (dy, x), out, low, high)


def relu_grad_loop(dy, x, out):
    """out = dy where x > 0, else 0 (NaN x: 0), one pass."""
    zero = out.dtype.type(0)
    for i in range(x.shape[0]):
        out[i] = dy[i] if x[i] > zero else zero


def bind_relu_grad(dy, x, out):
    """A step for relu_grad of float operands of one shape, split over the current workers
    where there are many elements; or None. numpy's form takes two passes (ResNet-18's train
    step at batch 8, 1 thread: its ReLU gradients as greater and where took 89 ms)."""
    if not _takes(dy, x, out) or not available():
        return None
    return _elementwise(relu_grad_loop, (dy, x), out)


def adam_loop(m, v, grad, var, new_m, new_v, delta, scalars, decays):
    """One Adam step's arithmetic (ops/optim.py's adam_update) in one pass, in the order
    and the rounding of its unfused ops (no contraction). scalars: beta1, 1 - beta1, beta2,
    1 - beta2, epsilon, weight decay, lr, correction1, correction2 (the last three read at
    every run)."""
    b1, ob1, b2, ob2, eps, wd = scalars[0], scalars[1], scalars[2], scalars[3], scalars[4], scalars[5]
    lr, c1, c2 = scalars[6], scalars[7], scalars[8]
    lr_wd = lr * wd
    for i in range(m.shape[0]):
        g = grad[i]
        a = b1 * m[i] + ob1 * g
        b = b2 * v[i] + ob2 * g * g
        d = lr * (a / c1) / (np.sqrt(b / c2) + eps)
        if decays:
            d = d + lr_wd * var[i]
        new_m[i] = a
        new_v[i] = b
        delta[i] = d


def bind_adam(m, v, grad, var, outs, scalars):
    """A step for adam_update of one float dtype and shape (var None without weight decay;
    `scalars` as adam_loop's, which the step's caller refreshes from lr and the
    corrections before each run), split over the current workers where there are many
    elements; or None. Its unfused ops took ~13 passes over each variable's size (a
    ResNet-18 train step's Adam ~170 ms at batch 8)."""
    ins = (m, v, grad, m if var is None else var)  # m stands in for var where the loop reads none
    if not _takes(*ins, *outs, scalars) or not available():
        return None
    return _elementwise(adam_loop, ins, tuple(outs), scalars, var is not None)


def quantize_loop(x, scale, zero, out, a_, c_, b_, lo, hi):
    """out (A, C, B) = saturate(rint(x / scale[c]) + zero[c]) to [lo, hi], all flat: the
    five passes of numpy's form (divide, round, add, clip, cast) in one. `lo`, `hi`: the
    integer grid's ends as float32 (exact)."""
    base = _U(0)
    for a in range(a_):
        for c in range(c_):
            s, z = scale[c], np.float32(zero[c])
            for b in range(b_):
                v = np.rint(x[base + b] / s) + z
                out[base + b] = min(max(v, lo), hi)
            base += b_


def dequantize_loop(q, scale, zero, out, a_, c_, b_):
    """out (A, C, B) = (q - zero[c]) * scale[c], all flat, in float32: q - zero is exact there
    for 8- and 16-bit q, and a float32 product rounds as numpy's float64 one then cast does."""
    base = _U(0)
    for a in range(a_):
        for c in range(c_):
            s, z = scale[c], np.float32(zero[c])
            for b in range(b_):
                out[base + b] = (np.float32(q[base + b]) - z) * s
            base += b_


_GRIDS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


def bind_quantize(x, scale, zero, out):
    """A step for quantize_linear (x float32 -> out of an 8- or 16-bit integer dtype) or
    dequantize_linear (x of such a dtype -> out float32) in one pass, the scale (and the
    zero point, or None) shaped to broadcast along a run of adjacent axes of x (read at
    every run: they may be fed); split over the current workers along the outer axis where
    there are many elements; or None."""
    quantize = out.dtype in _GRIDS
    grid, real = (out, x) if quantize else (x, out)
    folded = _channels(x.shape, scale.shape)
    if folded is None or real.dtype != np.float32 or scale.dtype != np.float32 or grid.dtype not in _GRIDS \
            or (zero is not None and zero.size != scale.size) or x.shape != out.shape or not out.size \
            or not all(a.flags.c_contiguous for a in (x, out, scale)) or not available():
        return None
    s = scale.reshape(-1)
    z = np.zeros(s.size, grid.dtype) if zero is None else np.ascontiguousarray(zero).reshape(-1)
    if zero is not None and not np.shares_memory(z, zero):
        return None  # a copy would not see the zero point fed at the next run
    if quantize:
        info = np.iinfo(out.dtype)
        loop, extra = quantize_loop, (np.float32(info.min), np.float32(info.max))
    else:
        loop, extra = dequantize_loop, ()
    a_ = folded[0]
    x3, out3 = x.reshape(folded), out.reshape(folded)

    def piece(x_part, out_part):  # whole outer rows: contiguous
        return _bound(loop, x_part.reshape(-1), s, z, out_part.reshape(-1), *map(_U, x_part.shape), *extra)
    workers = threads.current()
    if workers is not None and out.size >= threads.MIN_ELEMENTS and a_ >= workers.n:
        steps = [piece(x3[a:b], out3[a:b]) for a, b in threads.pieces(a_, workers.n)]
        return lambda: workers.run(steps)
    return piece(x3, out3)


def where_loop(cond, x, y, out):
    """out = x where cond, else y: a select LLVM vectorizes (numpy branches per element)."""
    for i in range(out.shape[0]):
        out[i] = x[i] if cond[i] else y[i]


# Elements below which numpy's where runs: too few to be worth loading numba for.
WHERE_MIN_ELEMENTS = 1 << 12


def bind_where(cond, x, y, out):
    """A step for where(cond, x, y) of float operands and a bool condition, all of out's
    shape; or None. numpy's where and copyto(where=) branch on every element, and random
    conditions (a PReLU's x < 0) mispredict half of them: 2.2-2.9 ms on 295K floats here,
    where this loop takes some 0.1 ms."""
    if out.size < WHERE_MIN_ELEMENTS or cond.dtype != np.bool_ or not _takes(x, y, out) \
            or not cond.shape == x.shape == y.shape == out.shape or not available():
        return None
    return _elementwise(where_loop, (cond, x, y), out)


# Weights of the loops that cost more an element than a copy-like pass, for where they are
# split (`_elementwise`): a piece must outweigh a thread hop (some 40 us through the lock
# workers, 5 on the native ones for the loops with native entries), which
# threads.MIN_ELEMENTS of a cheap loop do (hard_swish 0.16 ns an element). 131,072 floats
# (BERT's feed-forward at batch 1) alone, then split over 2 lock workers: gelu 229 -> 157 us
# (1.75 ns an element), tanh's 265 -> 180, swish 106 -> 84, sigmoid 100 -> 72, hard_swish
# 21 -> 35. softmax (its rows apart, `bind_softmax`): 1.3 ns an element; BERT's attention at
# batch 1, 4 x 128 x 128, alone: 67 us on one thread, 45 split over 2 (the same bits).
_COSTS = {"gelu_loop": 4, "gelu_float32_loop": 4, "swish_loop": 2, "sigmoid_loop": 2, "softmax_loop": 4,
          "layer_norm_loop": 2}


# -- binary arithmetic on the native workers ---------------------------------------------------
BINARY_CODES = {np.add: 0, np.subtract: 1, np.multiply: 2}


def binary_loop(a, b, out, code):
    """out = a + b, a - b or a * b (code 0, 1, 2), elementwise, flat."""
    if code == 0:
        for i in range(out.shape[0]):
            out[i] = a[i] + b[i]
    elif code == 1:
        for i in range(out.shape[0]):
            out[i] = a[i] - b[i]
    else:
        for i in range(out.shape[0]):
            out[i] = a[i] * b[i]


def scalar_loop(a, out, s, code, first):
    """out = a + s, a - s (s - a where `first`) or a * s (code 0, 1, 2), s's one float."""
    v = s[0]
    if code == 0:
        for i in range(out.shape[0]):
            out[i] = a[i] + v
    elif code == 2:
        for i in range(out.shape[0]):
            out[i] = a[i] * v
    elif first:
        for i in range(out.shape[0]):
            out[i] = v - a[i]
    else:
        for i in range(out.shape[0]):
            out[i] = a[i] - v


def bind_binary(fn, ins, out):
    """A step for a float32 add, subtract or multiply (`fn`, numpy's ufunc) of operands of
    out's shape, or of one such and a single float, in pieces on the native workers (some 5
    us a hand-off; numpy's ufunc in pieces on the lock workers took longer than whole below
    2^19 elements: 262,144 floats added 74 us whole, 97 split); None where there are no
    native workers, too few elements to split (threads.MIN_ELEMENTS), or other operands. The
    same bits as numpy's ufunc."""
    workers = threads.current()
    if fn not in BINARY_CODES or workers is None or workers.native is None or out.size < threads.MIN_ELEMENTS \
            or out.dtype != np.float32 or not out.flags.c_contiguous or len(ins) != 2 or not available():
        return None
    a, b = (np.asarray(x) for x in ins)
    if a.dtype != np.float32 or b.dtype != np.float32:
        return None
    if a.shape == b.shape == out.shape and a.flags.c_contiguous and b.flags.c_contiguous:
        return _elementwise(binary_loop, (a, b), out, BINARY_CODES[fn])
    for x, s, first in ((a, b, False), (b, a, True)):
        if x.shape == out.shape and x.flags.c_contiguous and s.size == 1:
            return _elementwise(scalar_loop, (x,), out, np.ascontiguousarray(s, np.float32).reshape(1),
                                BINARY_CODES[fn], int(first and fn is np.subtract))
    return None


# -- copies of strided views ----------------------------------------------------------------
def strided_copy_loop(x, out, dims, strides):
    """out (flat, C-contiguous, of 4-D shape `dims`) = the elements of flat x at offsets
    i0 s0 + i1 s1 + i2 s2 + i3 s3 (`strides`, in elements), unit-stride runs where s3 is 1."""
    one = _U(1)
    d0, d1, d2, d3 = dims[0], dims[1], dims[2], dims[3]
    s0, s1, s2, s3 = strides[0], strides[1], strides[2], strides[3]
    o = _U(0)
    for a in range(d0):
        for b in range(d1):
            for c in range(d2):
                base = a * s0 + b * s1 + c * s2
                if s3 == one:
                    for d in range(d3):
                        out[o + d] = x[base + d]
                else:
                    for d in range(d3):
                        out[o + d] = x[base + d * s3]
                o += d3


def _collapsed(shape, strides):
    """(dims, strides) of a view's elements, in order, as few axes as hold them: axes of one
    element dropped, an axis merged into the one before where their strides chain."""
    dims, steps = [], []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if dims and steps[-1] == s * n:
            dims[-1], steps[-1] = dims[-1] * n, s
        else:
            dims.append(n)
            steps.append(s)
    return dims or [1], steps or [1]


def bind_copy(src, out):
    """A step writing out = src (float32; out C-contiguous, src a view of another array's
    elements: a transpose's, a layout chain's) by strided_copy_loop, split over the current
    workers by its outermost axis where the copy is big enough (threads.MIN_ELEMENTS), each
    piece with a native entry (the native workers take it with no lock); None where numba is
    not loaded, src has a negative stride or more than 4 axes left once collapsed, or there
    are no workers to split over (numpy's copy takes as long on one thread: the BERT-like
    encoder's attention transposes at batch 8, 53-169 us)."""
    workers = threads.current()
    if workers is None or out.size < threads.MIN_ELEMENTS or not available() or src.dtype != np.float32 \
            or out.dtype != np.float32 or not out.flags.c_contiguous or src.shape != out.shape \
            or any(s < 0 or s % src.itemsize for s in src.strides):
        return None
    dims, steps = _collapsed(src.shape, [s // src.itemsize for s in src.strides])
    if len(dims) > 4:
        return None
    dims, steps = [1] * (4 - len(dims)) + dims, [0] * (4 - len(steps)) + steps
    axis = next(i for i, n in enumerate(dims) if n > 1 or i == 3)
    inner = math.prod(dims[axis + 1:])
    # src's elements as a flat array from its first: as far as its last one
    flat_x = np.lib.stride_tricks.as_strided(src, (1 + sum((n - 1) * s for n, s in zip(dims, steps)),),
                                             (src.itemsize,))
    flat_out = out.reshape(-1)
    parts = []
    for a, b in threads.pieces(dims[axis], workers.n):
        piece = list(dims)
        piece[axis] = b - a
        parts.append(_bound(strided_copy_loop, flat_x[a * steps[axis]:], flat_out[a * inner:b * inner],
                            np.array(piece, _U), np.array(steps, _U)))
    return workers.split(parts) if len(parts) > 1 else parts[0]


def _elementwise(loop, ins, out, *args):
    """A step running loop(*ins, *outs, *args) over the elements of `ins` and `out` (an array,
    or a tuple of them; all C-contiguous, of one shape), in pieces on the current workers
    where they are many (threads.MIN_ELEMENTS, fewer for the costly loops: `_COSTS`); or None."""
    arrays = (*ins, *(out if isinstance(out, tuple) else (out,)))
    size, shape = arrays[-1].size, arrays[-1].shape
    if any(x.shape != shape or not x.flags.c_contiguous for x in arrays) or not size:
        return None
    flat = [x.reshape(-1) for x in arrays]
    workers = threads.current()
    if workers is None or size * _COSTS.get(loop.__name__, 1) < threads.MIN_ELEMENTS or size < 16 * workers.n:
        return _bound(loop, *flat, *args)
    edges = [[a * 16, b * 16] for a, b in threads.pieces(size // 16, workers.n)]  # whole cache lines
    edges[-1][1] = size
    steps = [_bound(loop, *(x[a:b] for x in flat), *args) for a, b in edges]
    return workers.split(steps)  # on the native workers where every piece has a native entry
