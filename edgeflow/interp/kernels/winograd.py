"""Winograd convolution F(2x2,3x3) and F(4x4,3x3): the `conv` kernel's path for 3x3,
stride-1, dilation-1, ungrouped 2-D convolutions (any padding), float32 and float64.

A helper of conv.py's kernel (it registers none). An output tile of m x m (m = 2 or 4)
is computed from an input tile d of a x a (a = m + 2) as A^T [(G g G^T) * (B^T d B)] A,
with a^2 multiplies per channel pair instead of 9 m^2. Done over whole arrays:

- weights: U = G g G^T, (a^2, M, C), once when w is a constant (read-only array), by a
  background thread from prepare time on (the conv's first run waits for it), else at each
  run (a variable being trained);
- input: x copied into a zero-padded buffer (scratch: its padding rewritten each run),
  the overlapping tiles gathered by one copy from a strided view into D (a^2, C, N*tiles),
  and transformed by one product V = (B^T kron B^T) D;
- the a^2 products U[k] (M, C) @ V[k] (C, N*tiles): one batched np.matmul;
- output: Y = A^T m A as two products (A^T over the tile rows, then over its columns with
  the columns last, so that each output row is one run of Y), scattered with the bias added
  into the output (up to four strided copies: whole tiles and the cropped last row/column).

The transforms are products, not elementwise passes: measured, BLAS does the input's 36x36
(F4) Kronecker product and the output's two small ones faster than numpy does the adds.
Every array is allocated at prepare time (all but U in the plan's workspace, shared with
its other steps); each run only calls numpy with out= arrays. With
intra-op workers (interp/threads.py) each of the four phases (input transform, products,
output transform by tile rows, then by tile columns with the scatter) is split over them;
where numba's loops run the transforms, the products and the output transform are one
phase split by output channels, each worker transforming the products it made (one
meeting of the workers fewer, and no products read from another core's cache); the input
transforms and F(4x4)'s output transform then run as native_winograd.py's compiled
functions where native_gemm runs (x86-64 with AVX2 and FMA; the output's on planes of 6
tile columns or more).

Which path a conv takes (`choose`, when its kernel binds): EDGEFLOW_CONV_ALGO=direct,
winograd2 or winograd4 forces one where it applies (tests, benchmarks); unset or "auto",
`rule` picks by shape, as measured on ResNet-18's layers with benchmarks/bench_winograd.py.

Error (float32, measured with benchmarks/bench_winograd.py --error against a float64
direct conv with bias and relu, He-initialised weights, standard normal inputs, ResNet-18's
layers C = M = 64..512, batch 1 and 8): the max abs error over the max abs output is
3.6e-7 to 4.9e-7 for the direct path, 3.0e-7 to 6.7e-7 for F(2x2,3x3) and 6.2e-6 to 1.0e-5
for F(4x4,3x3) (its transforms have entries up to 8 and down to 1/24; onnxruntime's:
1.7e-7 to 3.7e-7), weights transformed in float32. tests/interp/test_winograd.py bounds both by 1e-4.
"""
import concurrent.futures
import os
import threading
from functools import lru_cache, partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...errors import EdgeflowError
from .. import threads
from ..arena import outside, scratch, zeroed
from . import jit, native_gemm, native_winograd, per_constant
from .fused import with_activation

ENV = "EDGEFLOW_CONV_ALGO"
ALGOS = ("direct", "winograd2", "winograd4")

# Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (2015): B^T, G, A^T.
_F2 = ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
       [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]],
       [[1, 1, 1, 0], [0, 1, -1, -1]])
_F4 = ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
       [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
       [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]])
TRANSFORMS = {2: tuple(np.array(t, np.float64) for t in _F2), 4: tuple(np.array(t, np.float64) for t in _F4)}


@lru_cache(maxsize=None)
def kron(m, which, dtype):
    """TRANSFORMS[m][which] kron itself in `dtype`, made once (read-only): which = 0 for
    the input's B^T kron B^T (a^2, a^2), 1 for the weights' G kron G (a^2, 9)."""
    t = TRANSFORMS[m][which]
    k = np.kron(t, t).astype(dtype)
    k.setflags(write=False)
    return k


def applies(x, w, group, strides, dilations):
    """Whether a Winograd path computes this conv: 2-D, 3x3, stride 1, dilation 1, one group,
    float32/float64, w contiguous (its transform reads it as a (M*C, 9) view)."""
    return (x.ndim == 4 and w.shape[2:] == (3, 3) and group == 1 and set(strides) == {1}
            and set(dilations) == {1} and x.dtype in (np.float32, np.float64) and w.dtype == x.dtype
            and w.flags.c_contiguous)


def rule(x_shape, w_shape, out_shape):
    """The path measured fastest for this shape (benchmarks/bench_winograd.py, numpy's
    OpenBLAS on 1 thread): F(4x4) once there are 32 of its tiles (ResNet-18's 56, 28 and 14
    layers at batch 8, 56 and 28 at batch 1); else F(2x2) if there are 16 of its tiles
    (ResNet-18's 14 and 7 layers at batch 1); else direct. F(2x2) took work enough that the
    product dominates too (C * M * tiles >= 2^20) until stop 55, when the direct path ran
    DenseNet-121's 128 -> 32 convs at batch 1 at 14x14 in 581 us against F(2x2)'s 137 (its
    24 layers there: 14.0 ms against onnxruntime's 4.9), at 7x7 203 against 68; alone, one
    thread, F(2x2) won 1.3-5.5x over 21 shapes of 32-512 input and 32-256 output channels at
    14x14 and 7x7, lost at 7x7 with 32 -> 128 (78 us against 61). Below 16 channels, or 24 input channels, the transforms
    cost more than the multiplies they save (SqueezeNet's expand convs, 16 -> 64 at 55x55:
    direct 2.38 ms against F(4x4)'s 2.63 at batch 1, 15.7 against 21.9 at batch 8; 16 -> 32
    at 28x28 0.34 against 0.38; at 24 input channels each won some, at 32 F(4x4) most); with
    few tiles the product is as long to read as the weights, which Winograd makes 16/9 (F2)
    or 4 (F4) times larger."""
    n, c = x_shape[:2]
    m = w_shape[0]
    oh, ow = out_shape
    if min(c, m) < 16 or c < 24:
        return "direct"
    if n * -(-oh // 4) * -(-ow // 4) >= 32:
        return "winograd4"
    if n * -(-oh // 2) * -(-ow // 2) >= 16:
        return "winograd2"
    return "direct"


# Tiles below which a filter gradient's products (inner dimension: the tiles) run too far
# below BLAS's speed for Winograd to pay (`filter_grad_rule`).
GRAD_TILES = 192


def filter_grad_rule(x_shape, w_shape, out_shape):
    """The path measured fastest for a filter gradient (benchmarks/bench_winograd.py's
    layers, batch 1 and 8, one thread): F(4x4) where it has GRAD_TILES tiles or more
    (ResNet-18's 56 and 28 layers at batch 8: 50 -> 39 and 38 -> 26 ms), else F(2x2) where
    it has (its 14 layer at batch 8: 31 -> 22 ms; the 28 layer at batch 1), else direct
    (the 7 layer: 29 ms direct, 31 F(2x2), 35 F(4x4))."""
    n, c = x_shape[:2]
    oh, ow = out_shape
    if min(c, w_shape[0]) < 16:
        return "direct"
    for m, algo in ((4, "winograd4"), (2, "winograd2")):
        if n * -(-oh // m) * -(-ow // m) >= GRAD_TILES:
            return algo
    return "direct"


def variable_rule(x_shape, w_shape, out_shape):
    """`rule`, for weights transformed on every run (a variable's, in a train step; an input
    gradient run as a conv, conv.py): below 64 tiles of F(2x2) the direct path (ResNet-18's
    14 and 7 layers' input gradients at batch 1: F(2x2) 5.7 and 15.9 ms, direct 4.6 and
    6.8), else the forward's pick (the 7 layer's at batch 8: direct 62 ms, F(4x4) 33)."""
    n = x_shape[0]
    oh, ow = out_shape
    if n * -(-oh // 2) * -(-ow // 2) < 64:
        return "direct"
    return rule(x_shape, w_shape, out_shape)


def choose(x, w, group, strides, dilations, out_shape, rule_=None):
    """"direct", "winograd2" or "winograd4" for this conv: EDGEFLOW_CONV_ALGO where set and
    a Winograd path applies, else `rule_(x's shape, w's shape, out_shape)` (`rule`: a conv's)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced and forced != "auto" and forced not in ALGOS:
        raise EdgeflowError(f"{ENV} must be one of {ALGOS + ('auto',)}, got {forced!r}")
    if not applies(x, w, group, strides, dilations):
        return "direct"
    if forced in ALGOS:
        return forced
    return (rule_ or rule)(x.shape, w.shape, out_shape)


def _parts(workers, multiply_adds):
    """How many pieces a weight transform of so many multiply-adds is split in: the
    workers' count where they are worth waking (threads.MIN_FLOPS), else 1."""
    return workers.n if workers is not None and 2 * multiply_adds >= threads.MIN_FLOPS else 1


def _run(steps, workers):
    """Run a weight transform's steps now: several through the workers' lock threads (one
    numpy product each), not split()'s native table, whose rows (one sgemm a channel) cost
    more to build in Python than the products (ResNet-18 at 2 threads: 126 ms of
    transforms, 36 at 1)."""
    if len(steps) > 1:
        workers.run(steps)
    else:
        steps[0]()


_TRANSFORMED = {}  # (id(w), m) -> (U, its future) of a constant w, while w lives
_BACKGROUND = {}  # process id -> the thread making constants' U (an executor of one worker)
_QUEUED = {}  # process id -> its _Made not done yet, in the order they were submitted
_QUEUE_LOCK = threading.RLock()  # re-entered by a done callback run at once (a future done already)


def pending_weights(w, m):
    """(U, future) for a model's constant w (read-only: it does not change between runs): U's
    buffer now, its values made by one background thread (in the order convs bind: a plan's
    first layers first), the future done once they are (its result() re-raises what making
    them raised). Made once however many plans bind w (an interpreter's plan for each set of
    input shapes; a plan made again once numba has loaded, jit.deferred), kept while w lives
    (kernels.per_constant). ResNet-18's are 72 MB and take 30-90 ms to make here: a first
    plan made them all before its first run, which now starts while they are made (each conv
    waits for its own: `waiting`; meanwhile it makes those the thread has not started)."""
    def make():
        pid = os.getpid()  # a forked child has its own (the parent's thread is not in it)
        if pid not in _BACKGROUND:
            _BACKGROUND[pid] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edgeflow-weights")
        mm, c = w.shape[:2]
        u = weights_buffer(zeroed(mm * (m + 2) ** 2 * c * w.dtype.itemsize).view(w.dtype).reshape(mm, -1, c))
        steps = _weight_steps(w, u, m, 1)
        with _QUEUE_LOCK:
            made = _Made(_BACKGROUND[pid].submit(_run, steps, None), steps, pid)
            if not made.future.done():
                _QUEUED.setdefault(pid, []).append(made)
        return u, made
    return per_constant(_TRANSFORMED, (id(w), m), (w,), make)


class _Made:
    """pending_weights' future. result() waits for the background thread, making meanwhile,
    on the caller's thread, the U the thread has not started: its own, else those queued
    after it, in turn, while its own is being made (a first run that catches up with the
    thread, ResNet-18's on a busy machine: conv 23's U being made, 26's and 27's waiting,
    each 5-37 ms; the run waited 46-142 ms in 2 of 10 fresh processes). In a child forked
    before the thread was done (it is not in the child), it makes U on the caller's thread."""

    def __init__(self, future, steps, pid):
        self.future, self.steps, self.pid = future, steps, pid
        # Once made, the steps (which hold w: the cache that holds this must not keep w alive) go.
        future.add_done_callback(self._made)

    def _made(self, future):
        self.steps = None
        with _QUEUE_LOCK:
            queued = _QUEUED.get(self.pid, ())
            if self in queued:
                queued.remove(self)

    def _make_here(self, steps):
        """Make U on this thread from `steps` (the background thread's work, taken from it)."""
        done = concurrent.futures.Future()
        try:
            _run(steps, None)  # the same values the background thread writes
        except Exception as e:
            done.set_exception(e)
        else:
            done.set_result(None)
        self.future = done
        self._made(done)

    def _take(self):
        """Make U here if the background thread has not started it; whether this did."""
        steps = self.steps
        if steps is None or not self.future.cancel():
            return False
        self._make_here(steps)
        return True

    def _next(self):
        """The _Made queued right after this one, or None."""
        with _QUEUE_LOCK:
            queued = _QUEUED.get(self.pid, [])
            k = queued.index(self) + 1 if self in queued else len(queued)
            return queued[k] if k < len(queued) else None

    def result(self):
        if not self.future.done():
            if os.getpid() != self.pid:  # a forked child: the thread is not in it
                steps, self.pid = self.steps, os.getpid()
                self._make_here(steps)
            elif not self._take():  # being made: meanwhile those queued after it, in turn
                after = self._next()
                while not self.future.done() and after is not None and after._take():
                    after = self._next()
        return self.future.result()


def waiting(step, pending):
    """`step`, waiting first for the futures `pending` (pending_weights') on its first run."""
    if not pending:
        return step
    left = list(pending)

    def run():
        while left:
            left[-1].result()
            left.pop()
        step()
    return run


_PACKED = {}  # (id(w), m) -> packed_weights(w, m), while w lives
# Tiles (the products' columns) from which a conv's products stay BLAS's: alone, against
# OpenBLAS's sgemm on one thread, native_gemm's took 4.0 -> 3.3 ms for ResNet-18's F(2x2)
# products of 512 channels at 7x7 (batch 1: 16 tiles), 2.3 -> 1.9 for 256 at 14x14 (49), the
# same for F(4x4)'s 64 at 56x56 (196: 0.80 against 0.79); at batch 8 10.5 -> 7.7 ms for 512
# at 7x7 (32), 8.4 -> 7.6 for 256 at 14x14 (128), 6.6 -> 6.3 for 128 at 28x28 (392), but
# 8.6 -> 10.0 for 64 at 56x56 (1,568 tiles). ResNet-18 at batch 1, alternating processes:
# 34.8 -> 32.1 ms at 1 thread, 25.2 -> 24.3 at 2.
NATIVE_TILES = 1024


def packed_weights(w, m):
    """native_gemm.pack(U[k]) for each of the a^2 positions k: a constant w's U as
    native_gemm's product takes it, made once however many plans bind it, whatever their
    threads (a worker's output channels from a multiple of 8 on are a view: `_rows`).

    Made in place, U itself never made: w's kernels are laid in the packs' order, (panel,
    input channel, row of the panel) a kernel, then one product by G kron G writes every
    position's pack, a row of (a^2, panels * C * MR). ResNet-18's four 3x3 shapes at batch
    1, alone on one thread: 64 channels 2.0 -> 0.6 ms, 128 5.4 -> 2.6, 256 7.5 -> 4.5, 512
    24 -> 20 (most of the rest: the first writes of the packs' 16.8 MB fresh memory)."""
    def make():
        mm, c = w.shape[:2]
        mr = native_gemm.MR
        panels = -(-mm // native_gemm.VEC) * (native_gemm.VEC // mr)  # an even count, as pack's
        kernels = np.zeros((panels, c, mr, 9), np.float32)
        full = mm // mr
        kernels[:full] = np.asarray(w[:full * mr]).reshape(full, mr, c, 9).transpose(0, 2, 1, 3)
        if full * mr < mm:
            kernels[full, :, :mm - full * mr] = np.asarray(w[full * mr:]).reshape(-1, c, 9).transpose(1, 0, 2)
        kg = kron(m, 1, np.float32)
        size = panels * c * mr
        stride = -(-size // 16) * 16  # each position's pack on a 64-byte boundary
        packs = native_gemm.aligned(kg.shape[0] * stride).reshape(kg.shape[0], stride)
        columns = kernels.reshape(size, 9).T
        steps = [partial(np.matmul, kg, columns[:, lo:hi], out=packs[:, lo:hi])
                 for lo, hi in threads.pieces(size, _parts(threads.current(), kg.shape[0] * 9 * size))]
        _run(steps, threads.current())
        bias = native_gemm.aligned(panels * mr)
        return [(packs[k, :size], bias) for k in range(kg.shape[0])]
    return per_constant(_PACKED, (id(w), m), (w,), make)


def _rows(packed, lo, k):
    """native_gemm.pack's (panels, bias) of a (M, k) matrix from row lo on (a multiple of
    native_gemm.MR): views."""
    panels, bias = packed
    return panels[lo * k:], bias[lo:]


def weights_buffer(memory):
    """U's (a^2, M, C) view of `memory` (M, a^2, C): each U[k] an (M, C) matrix whose rows
    are a^2 * C apart, as BLAS takes it. Laid out so, the transform is a product for each
    output channel, G kron G (a^2, 9) by its C kernels (9, C), read from w in place: 1.5-2.3x
    faster than one product over all M * C kernels, whose (9, M * C) view of w strides across
    memory (ResNet-18's 512-channel F(2x2) layer: 7.1 -> 4.7 ms), the products that use U
    as fast."""
    return memory.transpose(1, 0, 2)


def _input_loop(x, v, m, begin, tile_rows, tile_cols, c0, c1):
    """A step writing the input's transform V (a^2, C, tiles) for channels c0:c1 where numba
    is loaded: native_winograd's where native_gemm runs (ResNet-18's layers, F(4x4) 1.4-3.5x
    faster: its 64 channels at 56x56 724 -> 275 us; F(2x2) 4-5x: 512 at 7x7 395 -> 96), else
    jit.py's loop; or None (numpy's steps then)."""
    if jit.loaded():
        step = native_winograd.bind_input(x, v, begin, tile_rows, tile_cols, c0, c1, m)
        if step is not None:
            return step
    return jit.bind_winograd_input(x, v, m, begin, tile_rows, tile_cols, c0, c1)


def _output_loop(products, bias, out, m, tile_rows, tile_cols, activation, m0, m1, residual=None):
    """A step writing out's channels m0:m1 from the products where numba is loaded:
    native_winograd's for F(4x4) where native_gemm runs and it takes the plane (wide enough,
    the activation none, relu or relu6), else jit.py's loop; or None (numpy's steps). With a
    residual to add, native_winograd's or None: added in jit.py's loop too (its branch in the
    tile loops, or outside them), it left that loop 1.3-1.8x slower without one on F(2x2)'s
    7x7 and 14x14 planes, more than the add it spared."""
    step = None
    if m == 4 and jit.loaded():
        step = native_winograd.bind_output(products, bias, out, tile_rows, tile_cols, activation or "", m0, m1,
                                           residual)
    if step is not None or residual is not None:
        return step
    return jit.bind_winograd_output(products, bias, out, m, tile_rows, tile_cols, activation, m0, m1)


def _loops_or(bind, make, length, n_parts):
    """The steps of a phase over range(length) split in `n_parts`: bind(lo, hi) for each
    piece (jit.py's loops, None where numba is not loaded) where every piece binds, else
    make(lo, hi) (numpy's)."""
    pieces = threads.pieces(length, n_parts)
    loops = [bind(lo, hi) for lo, hi in pieces]
    return loops if None not in loops else [make(lo, hi) for lo, hi in pieces]


def _weight_steps(w, u, m, n_parts):
    """Steps writing U = G g G^T of w (M, C, 3, 3) into u (`weights_buffer`'s view, (a^2, M,
    C)), its output channels split in `n_parts`: one product each with G kron G, in w's dtype
    (float64 would double a first run's cost for an error far below the transforms' own)."""
    mm, c = w.shape[:2]
    kg = kron(m, 1, w.dtype)
    kernels = np.asarray(w).reshape(mm, c, 9).transpose(0, 2, 1)  # (M, 9, C)
    memory = u.transpose(1, 0, 2)
    assert memory.flags.c_contiguous, "U is weights_buffer's view"
    return [partial(np.matmul, kg, kernels[lo:hi], out=memory[lo:hi]) for lo, hi in threads.pieces(mm, n_parts)]


def _tiled(out, row0, rows, height, col0, cols, width, m):
    """out[:, :, row0:, col0:] viewed as (N, M, rows, height, cols, width): `rows` tiles of
    `height` <= m rows, m apart, and `cols` tiles of `width` <= m columns."""
    s = out.strides
    return as_strided(out[:, :, row0:, col0:], out.shape[:2] + (rows, height, cols, width),
                      (s[0], s[1], m * s[2], s[2], m * s[3], s[3]), writeable=True)


def conv(x, w, bias, begin, out, algo, activation="", residual=None):
    """Step computing out = activation(conv(x, w) + bias [+ residual]) with F(m x m, 3x3), m
    = 2 for "winograd2", 4 for "winograd4"; `begin` the (top, left) padding (the end padding
    follows from out's shape). Where numba is loaded (jit.loaded), the tiles' transforms run
    as jit.py's loops (the input's, and the output's with the bias and the activation).
    With a residual (out's shape, apart from out: a ResNet block's add, which then reads the
    conv's output from no buffer), None where native_winograd's output transform does not
    take it (F(2x2), narrow planes: `_output_loop`)."""
    if residual is not None and (residual.shape != out.shape or np.may_share_memory(residual, out)):
        return None
    m = {"winograd2": 2, "winograd4": 4}[algo]
    at = TRANSFORMS[m][2]
    a = m + 2
    n, c, h, wd = x.shape
    mm, (oh, ow) = w.shape[0], out.shape[2:]
    th, tw = -(-oh // m), -(-ow // m)
    tiles = n * th * tw
    dt = x.dtype
    pt, pl = begin
    # Scratch (arena.scratch), written whole on each run: x, and zeros around it.
    padded = scratch((n, c, th * m + 2, tw * m + 2), dt)
    box = (slice(None), slice(None), slice(pt, pt + h), slice(pl, pl + wd))
    inner = padded[box]
    s = padded.strides
    windows = as_strided(padded, (a, a, c, n, th, tw), (s[2], s[3], s[1], s[0], m * s[2], m * s[3]))
    # Two scratch buffers, each used several times: D, the products, Y; V, Z.
    first = scratch(a * a * max(c, mm) * tiles, dt)
    second = scratch(max(a * a * c, m * a * mm) * tiles, dt)
    d = first[:a * a * c * tiles].reshape(a, a, c, n, th, tw)
    products = first[:a * a * mm * tiles].reshape(a * a, mm, tiles)
    y = first[:m * m * mm * tiles].reshape(m, mm, n, th, tw, m)  # (r, M, N, t, s, c)
    v = second[:a * a * c * tiles].reshape(a * a, c, tiles)
    z = second[:m * a * mm * tiles].reshape(m, a, mm * tiles)
    kb = kron(m, 0, dt)
    d2, v2 = d.reshape(a * a, -1), v.reshape(a * a, -1)
    p2, z2, y3 = products.reshape(a, -1), z.reshape(m, -1), y.reshape(m, mm * tiles, m)
    zt = z.transpose(0, 2, 1)
    at_rows, at_cols = at.astype(dt), np.ascontiguousarray(at.T, dt)
    workers = threads.current()
    # A constant w's products run on native_gemm's tile where it runs, over U packed for it
    # (packed_weights; U itself then never made), for fewer than NATIVE_TILES tiles.
    native = not w.flags.writeable and dt == np.float32 and tiles < NATIVE_TILES and jit.loaded() \
        and native_gemm.available() and native_gemm.suits(mm, c, tiles)
    if w.flags.writeable:  # a variable (a train step's): transformed at each run, into scratch
        u, made = weights_buffer(scratch((mm, a * a, c), dt)), None
        n_parts = workers.n if workers is not None and 2 * a * a * 9 * mm * c >= threads.MIN_FLOPS else 1
        weights = _weight_steps(w, u, m, n_parts)  # the output channels apart
    else:
        u, made = (None, None) if native else pending_weights(w, m)
        weights = None
    pending = [] if made is None else [made]
    # Scatter: y (r, M, N, t, s, c) -> out[N, M, t*m + r, s*m + c], in whole tiles and the
    # cropped last tile row / column; each output row is read from one run of y.
    ys = y.transpose(2, 1, 3, 0, 4, 5)  # (N, M, th, m, tw, m)
    column = None if bias is None else bias.reshape(1, mm, 1, 1, 1, 1)
    fh, rh = divmod(oh, m)
    fw, rw = divmod(ow, m)
    scatters = []
    for t0, nt, nr in ((0, fh, m), (fh, 1 if rh else 0, rh)):
        for s0, ns, nc in ((0, fw, m), (fw, 1 if rw else 0, rw)):
            if nt and ns and nr and nc:
                dst = _tiled(out, t0 * m, nt, nr, s0 * m, ns, nc, m)
                scatters.append((dst, ys[:, :, t0:t0 + nt, :nr, s0:s0 + ns, :nc]))

    # Four phases (numpy's) or three (numba's loops, then two when split), each split over
    # the plan's workers (see interp/threads.py) when the product is worth it: input
    # channels (copy, gather, transform), the a^2 products, the tile rows of the output
    # transform, output channels (its columns, the scatter).
    split = workers is not None and 2 * a * a * mm * c * tiles >= threads.MIN_FLOPS

    def load(c0, c1):
        cols = slice(c0 * tiles, c1 * tiles)
        return _transformed_tiles([(inner[:, c0:c1], x[:, c0:c1]), (d[:, :, c0:c1], windows[:, :, c0:c1])],
                                  outside(padded[:, c0:c1], box), kb, d2[:, cols], v2[:, cols])

    def product(k0, k1):
        return partial(np.matmul, u[k0:k1], v[k0:k1], out=products[k0:k1])

    def rows(j0, j1):  # A^T over the tile rows, for tile columns j0:j1 of the products
        cols = slice(j0 * mm * tiles, j1 * mm * tiles)
        return partial(np.matmul, at_rows, p2[:, cols], out=z2[:, cols])

    def finish(m0, m1):  # A^T over the tile columns, and the scatter, for output channels m0:m1
        part = slice(m0 * tiles, m1 * tiles)
        pieces = [(dst[:, m0:m1], src[:, m0:m1]) for dst, src in scatters]
        bias_part = None if column is None else column[:, m0:m1]

        def run():
            np.matmul(zt[:, part], at_cols, out=y3[:, part])
            for dst, src in pieces:
                if bias_part is None:
                    np.copyto(dst, src)
                else:
                    np.add(src, bias_part, out=dst)
        return run

    n_parts = workers.n if split else 1
    phases = ([weights] if weights is not None else []) \
        + [_loops_or(partial(_input_loop, x, v, m, begin, th, tw), load, c, n_parts)]
    if native:  # whole vectors of 8 output channels a worker (its packed rows a view)
        spans = [(8 * lo, min(8 * hi, mm)) for lo, hi in threads.pieces(-(-mm // 8), n_parts)]
    else:
        spans = threads.pieces(mm, n_parts)
    outputs = [_output_loop(products, bias, out, m, th, tw, activation, lo, hi, residual)
               for lo, hi in spans]  # with the bias, the residual and the activation
    if residual is not None and None in outputs:
        return None
    if None not in outputs and native:
        # Each worker's output channels: a product a position on the tile, then its output transform.
        packs = packed_weights(w, m)
        # U, where a plan made before numba loaded made it, goes with that plan (72 MB of
        # ResNet-18's, kept while the model lived): a later plan without the packs makes it again.
        _TRANSFORMED.pop((id(w), m), None)
        steps = [native_gemm.bind_chain([_rows(packed, lo, c) for packed in packs], v[:, None],
                                        products[:, lo:hi, None].transpose(0, 2, 1, 3)) for lo, hi in spans]
        if None not in steps:
            return _phases(phases + [[threads.chain(*worker, output) for worker, output in zip(steps, outputs)]],
                           workers)
    if u is None:  # native_gemm declined after all: BLAS's products over U
        u, made = pending_weights(w, m)
        pending.append(made)
    if None not in outputs:
        if n_parts == 1:
            return waiting(_phases(phases + [[product(0, a * a)], outputs], workers), pending)
        # Output channels apart: each worker's products go to its own output transform, on
        # its own core (no meeting between them, no products read from the other core's cache).
        parts = [threads.chain(partial(np.matmul, u[:, lo:hi], v, out=products[:, lo:hi]), output)
                 for (lo, hi), output in zip(spans, outputs)]
        return waiting(_phases(phases + [parts], workers), pending)
    phases.append([product(lo, hi) for lo, hi in threads.pieces(a * a, n_parts)])
    phases += [[make(lo, hi) for lo, hi in threads.pieces(length, n_parts)]
               for make, length in ((rows, a), (finish, mm))]
    return waiting(with_activation(_phases(phases, workers), activation, out), pending)


def _transformed_tiles(copies, borders, transform, tiles, out):
    """A step transforming a piece of a conv's tiles: `borders` of the padded copy zeroed,
    the `copies` made (the padded copy, then the tiles gathered from its strided view), then
    out = transform @ tiles (a Kronecker product of the transform with itself)."""
    def run():
        for border in borders:
            border.fill(0)
        for dst, src in copies:
            np.copyto(dst, src)
        np.matmul(transform, tiles, out=out)
    return run


def _phases(phases, workers):
    """A step running each phase (a list of steps) in turn, its steps on the workers where
    several (the products on the native ones: Workers.split)."""
    return threads.chain(*(workers.split(phase) if len(phase) > 1 else phase[0] for phase in phases))


def filter_grad(x, dy, begin, dw, algo):
    """Step computing dw (M, C, 3, 3), the gradient of conv(x, w) (3x3, stride 1, `begin`
    its top and left padding) for the output's gradient dy, with the transforms of F(m x m,
    3x3) run backwards: the forward's output is A^T [U * V] A per tile, so dU = sum over
    tiles of (A dy A^T) * V, products of (M, tiles) by (tiles, C) for each of the a^2
    positions, and dw = G^T dU G. As in `conv`: V (x's tiles, B^T d B) by one product with
    B^T kron B^T, dy's tiles (zero past its edge, which V's padding meets) by one with
    (A^T kron A^T)^T, dw by one with G kron G. The phases split over the plan's workers:
    x's channels, dy's channels, the a^2 products."""
    m = {"winograd2": 2, "winograd4": 4}[algo]
    a = m + 2
    n, c, h, wd = x.shape
    mm, (oh, ow) = dy.shape[1], dy.shape[2:]
    th, tw = -(-oh // m), -(-ow // m)
    tiles = n * th * tw
    dt = x.dtype
    pt, pl = begin
    # Scratch, rewritten every run; x's phase (padded, d) done before dy's (e, z) begins,
    # so that e shares padded's memory and z d's.
    rows, cols = th * m + 2, tw * m + 2
    first = scratch(max(n * c * rows * cols, m * m * mm * tiles), dt)
    second = scratch(a * a * max(c, mm) * tiles, dt)
    padded = first[:n * c * rows * cols].reshape(n, c, rows, cols)  # x and zeros around it
    box = (slice(None), slice(None), slice(pt, pt + h), slice(pl, pl + wd))
    inner = padded[box]
    s = padded.strides
    windows = as_strided(padded, (a, a, c, n, th, tw), (s[2], s[3], s[1], s[0], m * s[2], m * s[3]))
    d = second[:a * a * c * tiles].reshape(a, a, c, n, th, tw)
    v = scratch((a * a, c, tiles), dt)
    grid = scratch((n, mm, th * m, tw * m), dt)  # dy and zeros past its edge
    gbox = (slice(None), slice(None), slice(0, oh), slice(0, ow))
    g = grid.strides
    dy_tiles = as_strided(grid, (m, m, mm, n, th, tw), (g[2], g[3], g[1], g[0], m * g[2], m * g[3]))
    e = first[:m * m * mm * tiles].reshape(m, m, mm, n, th, tw)
    z = second[:a * a * mm * tiles].reshape(a * a, mm, tiles)
    du = scratch((a * a, mm, c), dt)
    kb, kg = kron(m, 0, dt), kron(m, 1, dt)
    at = TRANSFORMS[m][2]
    ka = np.ascontiguousarray(np.kron(at, at).T, dt)  # (a^2, m^2): A kron A
    d2, v2, e2, z2 = d.reshape(a * a, -1), v.reshape(a * a, -1), e.reshape(m * m, -1), z.reshape(a * a, -1)
    vt = v.transpose(0, 2, 1)  # (a^2, tiles, C)
    workers = threads.current()
    split = workers is not None and 2 * a * a * mm * c * tiles >= threads.MIN_FLOPS

    def load(c0, c1):  # x's tiles of channels c0:c1, transformed
        cols = slice(c0 * tiles, c1 * tiles)
        return _transformed_tiles([(inner[:, c0:c1], x[:, c0:c1]), (d[:, :, c0:c1], windows[:, :, c0:c1])],
                                  outside(padded[:, c0:c1], box), kb, d2[:, cols], v2[:, cols])

    def gradient(m0, m1):  # dy's tiles of channels m0:m1, transformed
        cols = slice(m0 * tiles, m1 * tiles)
        return _transformed_tiles([(grid[:, m0:m1][gbox], dy[:, m0:m1]), (e[:, :, m0:m1], dy_tiles[:, :, m0:m1])],
                                  outside(grid[:, m0:m1], gbox), ka, e2[:, cols], z2[:, cols])

    def product(k0, k1):
        return partial(np.matmul, z[k0:k1], vt[k0:k1], out=du[k0:k1])

    finish = partial(np.matmul, du.reshape(a * a, -1).T, kg, out=dw.reshape(mm * c, 9))
    n_parts = workers.n if split else 1
    phases = [_loops_or(partial(_input_loop, x, v, m, begin, th, tw), load, c, n_parts),
              _loops_or(partial(jit.bind_winograd_gradient, dy, z, m, th, tw), gradient, mm, n_parts),
              [product(lo, hi) for lo, hi in threads.pieces(a * a, n_parts)], [finish]]
    return _phases(phases, workers)
