"""A register-tiled float32 product with its epilogue fused: out = f(w @ x + bias [+ residual]).

A 1x1 conv is w (M, K) @ x (K, P) per image, and a conv net follows most of them with
passes numpy cannot fold into BLAS's sgemm: the bias and activation (a pass over the
output), a residual add and a PReLU (two ops, a pass each). Here one loop nest does the
product and applies all of it to each tile of the result while it is in registers:

- w is packed once, when the step binds, into panels of MR rows (k-major, zero rows past
  M), the bias padded alike;
- for each strip of NR columns of x, the strip is copied into a contiguous K x NR buffer
  (x's rows lie P floats apart: at P = 1024 the 4 KiB stride put a strip's rows in one
  set of the L1 cache, which cost 1.3x), each row times its image's factor for that row
  where the step has factors (a squeeze-excitation's multiply before a 1x1 conv: that
  pass over x saved; else 1), then every panel runs over it: MR x NR
  accumulators (3 x 8-float vectors a row, 12 registers of AVX2's 16) taking a fused
  multiply-add of a broadcast weight and a row of the strip per k; past MAX_BLOCK rows of
  x, in blocks of rows, each tile's partial sums stored and added to by the next block;
- the tile's epilogue adds the residual, applies relu/relu6, then the PReLU slope of
  its row, and stores (masked stores for the last strip's columns).

A dense layer, a (M, K) @ w (K, N) + bias, runs the same tile the other way round
(`bind_rows`): w, constant, packed once in strips of NR columns, a's rows broadcast from
where they lie, the bias a column's, added after the sums.

The loop nest is LLVM IR built with llvmlite (numba's compiler, the `jit` extra) and
compiled for the host's CPU by MCJIT (some 2 s, once a machine: its machine code is cached
beside the module under a key of its sources, and later processes load it in some 50 ms
without building the IR), called through ctypes with its operands in one int64 array
(ctypes lets go of the GIL). The same module holds native_winograd.py's Winograd
transforms, native_depthwise.py's depthwise convs and native_small_conv.py's stems (their IR
there, built with native_ir.py's helpers; `step` binds any of its functions). Measured on this project's
2-core AMD EPYC (Zen 3), interleaved in one process, against numpy's OpenBLAS
sgemm and numpy's passes for the bias and relu6: 0.6-0.95x of their time on
MobileNetV2's and iris_landmark's pointwise shapes (144x24 @ 24x3136 0.61x, 32x64 @
64x1024 0.73x, 64x384 @ 384x196 0.93x, 96x576 @ 576x196 in two blocks 0.97x); the
product alone 0.84-0.94x of sgemm's. Left to BLAS (`suits`): fewer than 16 columns where
the weights are many (1.5x at 4 columns of a 512x512 product; 0.75-0.9x of 64x128's at
4-12), and depths past MAX_DEPTH (2,304: ResNet-18's deepest columns). Tile shapes tried:
6x16 (12 accumulators; M = 32 wastes a third of a panel) and 8x8 (9 loads per 8
multiply-adds) were 1.0-1.3x slower than 4x24. The last columns run in a strip of as many
vectors as hold them (60 columns: 24 + 24 + 16, not 24 + 24 + 24), or where one or two are
left (a 7x7 map's 49), one at a time, vectors of 8 rows each (COLUMN_TAIL).

Used where the host has AVX2 and FMA (x86-64; the IR's vectors are generic, but the tile
is sized for AVX2's registers) and llvmlite imports; `available()` says so, and callers
keep their BLAS path elsewhere.
"""
import contextlib
import ctypes
import functools
import hashlib
import os

import numpy as np

from ..arena import zeroed
from . import jit, native_depthwise, native_ir, native_small_conv, native_winograd, per_constant

MR, NR = 4, 24  # a panel's rows, a strip's columns (3 vectors of 8 floats)
VEC = 8
NV = NR // VEC
# Operands of one call, in the int64 array the compiled function reads.
(W, X, BIAS, OUT, RES, SLOPE, STRIP, M, K, P, LDX, LDO, LDR, ACT, IMAGES, SX, SO, SR, KC, LDA, SCALE,
 SSC, SB, PF) = range(24)
FIELDS = 24
ACTIVATIONS = native_ir.ACTIVATIONS
# Shapes left to BLAS: fewer columns than MIN_COLUMNS (a strip mostly empty) unless the
# weights are few (at most NARROW_WEIGHTS: 64x128 @ 128x4 with bias and relu 0.88x of
# numpy's time, 256x256 @ 256x4 1.10x, 512x512 1.52x), fewer than 4 columns, or deeper
# than MAX_DEPTH: with the strips packed a block at a time and TAIL_GROUP, deep products
# alone against BLAS's sgemm and its bias pass: 960x160 @ 160x49 194 against 199 us,
# 1152x320 @ 320x49 507 against 524, 2304x512 @ 512x49 2,186 against 2,305, 1152x256 @
# 256x196 1,726 against 1,771 (at 768, before those, 960 deep took 1.14x BLAS's time).
MIN_COLUMNS = 16
NARROW_WEIGHTS = 1 << 15
MAX_DEPTH = 2304
# Rows of x a packed strip holds at most (512 x 24 floats: 48 KiB); a deeper product runs in
# blocks of rows of equal depth, each adding to the partial sums the last one stored. Blocks
# cost: 384 rows in two blocks took 1.1-1.2x the time of one.
MAX_BLOCK = 512
# Steps of a tile's k loop an iteration (constant offsets from one counter; the rest one at
# a time): one a step spent 6 integer ops (four row pointers, the strip's, the counter) and
# a branch on 12 multiply-adds. Interleaved with onnxruntime's MatMul, one thread, alternating
# processes: 1024 x 256 @ 256 x 1024 1.07-1.09x -> 0.94-0.96x its time, 1024 x 1024 @ 1024 x
# 256 1.01-1.13x -> 0.84-0.91x, 64 x 256 @ 256 x 96 (in cache) 50-56 -> 40-45 us; 2 and 8
# steps within noise of 4. The same sums in the same order: the same bits.
K_UNROLL = 4
# Floats of x's packed strips at most (32 KiB, this host's L1): as many strips as fit are
# packed at once, then each panel of w runs over all of them, so that a panel's rows of
# out are written in runs of that many columns. A strip at a time, each tile wrote 4 rows
# of 24 columns and a strip's panels touched all M rows of out, whose rows lie P floats
# apart: alone, 16 -> 96 at 112x112 (MobileNetV2's and EfficientNet's first expansion)
# took 1,384 us, 896 so; at batch 8 9.5 -> 5.5 ms; 32 -> 16 there 350 -> 283 us, 24 -> 144
# at 56x56 529 -> 425 (16 Ki floats did no better, projections of 96-576 rows the same).
STRIP_BLOCK = 8192
# Panels of w a tile runs where a strip's last columns fit one vector (49 = 24 + 24 + 1: a 7x7
# map; 196 = 8 x 24 + 4): one panel gave 4 accumulators, whose multiply-adds wait on each
# other (4 cycles each), 3 give 12. Alone (alternating processes, medians): 576 -> 160 at 7x7
# 133 -> 117 us, 160 -> 960 212 -> 194, the latter at batch 8 1,838 -> 1,656; 576 -> 96 at 14x14
# 295 -> 267, 96 -> 576 263 -> 242.
TAIL_GROUP = 3
# The conv product's last columns, where at most this many are left (49 = 24 + 24 + 1: a 7x7
# map), run one at a time: vectors of VEC rows (two panels' k-slices) take a multiply-add a k
# with x's broadcast float, COLUMN_GROUP vectors a pass (the same sums in the same order: the
# same bits). A strip of one vector used 1 of its 8 lanes there: 7x7 products took 1.2x the
# time of 48 columns'. Alone, interleaved: 960 -> 160 at 7x7 193 -> 175 us, 160 -> 960 193 ->
# 172, 1152 -> 192 301 -> 278, 192 -> 1152 370 -> 314; with 2 columns left 2-3% faster, with 4
# 5-10% slower (4 groups of vectors a pass as fast as 8, 12 within noise).
COLUMN_TAIL = 2
COLUMN_GROUP = 8
# Floats ahead in each of x's rows that the strips' packing prefetches (two cache lines a
# row a strip): x's rows are apart by a plane, too many streams for the hardware's
# prefetchers where K is small. Alone, interleaved in one process against none, batch 8,
# relu6: 32 -> 16 at 112x112 0.84-0.85x, 96 -> 24 at 56x56 0.89-0.90x, 144 -> 24 0.93-0.94x
# (MobileNetV2's narrowing convs), 576 -> 96 at 14x14 0.97x, 16 -> 96 and 24 -> 144 and batch
# 1 0.96-1.04x; 240 floats ahead gained less, 720 and 1,024 less still.
PACK_PREFETCH = 480
# The tiles prefetch x's next strips too, spread over their steps: tile t of a block (panel,
# then strip) prefetches line t of each row k of the next block's strips, one a step of its
# k loop, while the product computes (the packing's own prefetches come in a burst the
# product then waits on, memory idle meanwhile). Interleaved in one process against none,
# relu6, batch 8, x cold: 32 -> 16 at 112x112 0.86-0.91x, 96 -> 24 at 56x56 0.89-0.91x, 144
# -> 24 0.92-0.98x, 192 -> 32 at 28x28 0.94-0.96x, wider and deeper ones 0.96-1.02x; at batch
# 1 144 -> 24 0.89-0.91x. Prefetching into L2 alone (locality 1, 2) did no better. In the
# models (one process, both builds): MobileNetV2 at batch 8 0.98x, EfficientNet-B0 0.96x,
# ResNet-18 0.99x. Only where x holds TILE_PREFETCH_MIN_FLOATS or more (else the tiles' loop
# without the prefetches): ResNet-18's Winograd products at batch 1 (V's 6-13K floats a
# position, in cache) took 1.01-1.03x the time with them.
TILE_PREFETCH_MIN_FLOATS = 1 << 16
# bind_rows: rows of a packed strip of w run at a time (a deeper product in blocks of equal
# depth, partial sums stored and added to). Measured interleaved against numpy's sgemm plus
# its bias pass, at 128 x 1024 @ 1024 x 256: one block of 1024 rows 0.90x of their time, 512
# 0.94x, 256 0.99x, 128 1.05x.
ROWS_BLOCK = 1024
# bind_rows takes rows of any length (suits_rows): at one thread a cap of 512 KiB of a kept
# longer products on BLAS's sgemm and a pass of its own for the bias, once measured 1-14%
# faster there; on this host now, interleaved, bind_rows with its bias took 0.77x of their
# time at 1024 x 256 @ 256 x 1024, 0.90x at 1024 x 1024 @ 1024 x 256, 0.96x at 1024 x 256 @
# 256 x 768 (BERT's layers at batch 8; a's rows in blocks of 64-256 no faster), and the
# BERT-like encoder at batch 8 on one thread ran 107.3 -> 101.8 ms without the cap
# (alternating processes): its bias and residual adds had been 6 ms of passes of their own.

_built = []


def available():
    """Whether the compiled product runs here: llvmlite imports and the host CPU has AVX2
    and FMA. Compiles it on the first call (once a process)."""
    if not _built:
        try:
            import llvmlite.binding as llvm
            import llvmlite.ir as ir
        except ImportError:
            _built.append(None)
            return False
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        features = llvm.get_host_cpu_features()
        if not (features.get("avx2") and features.get("fma")):
            _built.append(None)
            return False
        _built.append(_compile(llvm, ir))
    return _built[0] is not None


def suits(m, k, p):
    """Whether a product of these dimensions runs here rather than through BLAS."""
    return (p >= MIN_COLUMNS or (p >= 4 and m * k <= NARROW_WEIGHTS)) and 1 <= k <= MAX_DEPTH and m >= 1


def suits_rows(m, k, n):
    """Whether bind_rows's product of (M, K) rows by (K, N) weights runs here rather than
    through BLAS: as suits, rows for columns."""
    return (m >= MIN_COLUMNS or (m >= 4 and k * n <= NARROW_WEIGHTS)) and k >= 1 and n >= 1


def _module(ir):
    module = ir.Module(name="edgeflow_native_gemm")
    f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
    v8, m8, v4 = ir.VectorType(f32, VEC), ir.VectorType(ir.IntType(1), VEC), ir.VectorType(f32, MR)
    opaque = getattr(f32.as_pointer(), "is_opaque", False)
    suffix = "p0" if opaque else "p0v8f32"
    vptr = v8.as_pointer()
    fma = ir.Function(module, ir.FunctionType(v8, [v8, v8, v8]), name="llvm.fma.v8f32")
    masked_load = ir.Function(module, ir.FunctionType(v8, [vptr, i32, m8, v8]), name="llvm.masked.load.v8f32." + suffix)
    masked_store = ir.Function(module, ir.FunctionType(ir.VoidType(), [v8, vptr, i32, m8]),
                               name="llvm.masked.store.v8f32." + suffix)
    fabs = ir.Function(module, ir.FunctionType(v8, [v8]), name="llvm.fabs.v8f32")
    i8p = ir.IntType(8).as_pointer()
    prefetch = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                           name="llvm.prefetch." + ("p0" if opaque else "p0i8"))

    def emit(name, dense):
        fn = ir.Function(module, ir.FunctionType(i64, [i64]), name=name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))

        def c(v):
            return ir.Constant(i64, v)

        def load(pointer, kind, align=None):
            value = b.load(pointer, typ=kind) if opaque else b.load(pointer)
            if align:
                value.align = align
            return value

        def at(base, index, kind=f32):  # the address of float `index` of the array at address `base`
            return b.inttoptr(b.add(base, b.mul(index, c(4))), kind.as_pointer())

        args = fn.args[0]
        field = [load(b.inttoptr(b.add(args, c(8 * i)), i64.as_pointer()), i64) for i in range(FIELDS)]
        zero = ir.Constant(v8, [0.0] * VEC)
        i32x8 = ir.VectorType(i32, VEC)
        lanes = [ir.Constant(ir.VectorType(i64, VEC), list(range(VEC * h, VEC * h + VEC))) for h in range(NV)]
        broadcast = ir.Constant(ir.VectorType(i32, VEC), [0] * VEC)

        def splat(value, kind=v8):
            return b.shuffle_vector(b.insert_element(ir.Constant(kind, ir.Undefined), value, ir.Constant(i32, 0)),
                                    ir.Constant(kind, ir.Undefined), broadcast)

        def block(name):
            return fn.append_basic_block(name)

        def loop(first, last, step, body, carried=()):
            """for i in range(first, last, step): body(i) (its counter a phi node); with
            `carried` (values: a tile's sums), body(i, values) returns their next values, and
            the loop returns the values it ends with."""
            before, test, inside, after = b.block, block("test"), block("body"), block("after")
            b.branch(test)
            b.position_at_end(test)
            i = b.phi(i64)
            i.add_incoming(first, before)
            values = []
            for value in carried:
                phi = b.phi(value.type)
                phi.add_incoming(value, before)
                values.append(phi)
            b.cbranch(b.icmp_signed("<", i, last), inside, after)
            b.position_at_end(inside)
            new = body(i, values) if carried else body(i)
            i.add_incoming(b.add(i, step), b.block)
            for phi, value in zip(values, new if carried else ()):
                phi.add_incoming(value, b.block)
            b.branch(test)
            b.position_at_end(after)
            return values

        def unrolled(first, last, times, body, carried):
            """loop's range(first, last) with carried values, `times` steps an iteration (k, k +
            1, ...: constant offsets from one counter) while that many are left, then one."""
            def several(k, values):
                for u in range(times):
                    values = body(b.add(k, c(u)), values)
                return values
            whole = b.sub(last, b.srem(b.sub(last, first), c(times)))
            return loop(whole, last, c(1), body, loop(first, whole, c(times), several, carried))

        def when(condition, body):
            yes, done = block("then"), block("done")
            b.cbranch(condition, yes, done)
            b.position_at_end(yes)
            body()
            b.branch(done)
            b.position_at_end(done)

        def activate(values, relu, relu6):
            """ACTIVATIONS[...] of each vector (native_ir.activate: relu and relu6 as selects
            that keep NaN, swish and hard_swish in blocks of their own)."""
            return native_ir.activate(b, ir, fma, fabs, block, field[ACT], values, relu, relu6)

        m_, k_, p_ = field[M], field[K], field[P]
        panels = b.udiv(b.add(m_, c(MR - 1)), c(MR))

        def masks(p0, nv):
            width = splat(b.sub(p_, p0), ir.VectorType(i64, VEC))
            return [b.icmp_signed("<", lane, width) for lane in lanes[:nv]]

        def pack(x, scale, strip, p0, masked, k0, k1, nv):
            """Rows k0:k1 of x, columns p0:p0 + nv * VEC, into the strip buffer (zeros past P),
            each row times its float of `scale` (an address: K floats)."""
            keep = masks(p0, nv) if masked else [None] * nv

            def row(k):
                times = splat(load(at(scale, k), f32))
                for off in (0, 16):  # two lines of this row PACK_PREFETCH floats on (read, keep in cache)
                    ahead = b.add(b.add(b.mul(k, field[LDX]), p0), c(PACK_PREFETCH + off))
                    b.call(prefetch, [b.bitcast(at(x, ahead, f32), i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                                      ir.Constant(i32, 1)])
                for h in range(nv):
                    source = at(x, b.add(b.add(b.mul(k, field[LDX]), p0), c(VEC * h)), v8)
                    value = b.call(masked_load, [source, ir.Constant(i32, 4), keep[h], zero]) if masked \
                        else load(source, v8, 4)
                    b.store(b.fmul(value, times), at(strip, b.add(b.mul(b.sub(k, k0), c(NR)), c(VEC * h)), v8)).align = 32
            loop(k0, k1, c(1), row)

        def row_vectors(base, ld, rows, p0, keep, masked):
            """The len(keep) vectors from column p0 of each of `rows` of the array at `base`
            (rows ld floats apart), masked loads where `masked`."""
            loaded = []
            for row in rows:
                for h, lanes_kept in enumerate(keep):
                    source = at(base, b.add(b.add(b.mul(row, ld), p0), c(VEC * h)), v8)
                    loaded.append(b.call(masked_load, [source, ir.Constant(i32, 4), lanes_kept, zero]) if masked
                                  else load(source, v8, 4))
            return loaded

        def merged(first, first_end, second, second_end):
            """Phi nodes taking `first` from block first_end and `second` from second_end."""
            phis = []
            for one, other in zip(first, second):
                phi = b.phi(v8)
                phi.add_incoming(one, first_end)
                phi.add_incoming(other, second_end)
                phis.append(phi)
            return phis

        def tile(a, strip, out, res, panel, p0, masked, k0, k1, nv, group=1, ahead=None):
            """Rows panel*MR.. of the product (`group` panels: MR * group rows) over the packed
            strip's first nv vectors of columns (x's rows k0:k1), added to the bias (k0 = 0) or
            to what earlier blocks of rows stored; then the epilogue (k1 = K) or a plain store.
            Dense: rows of a (rows past M read row M - 1), the bias a column's. `ahead`: (the
            address of line 0 of the next strips' row 0 in x, the line this tile prefetches of
            each row k, or none where it is past their lines)."""
            R = MR * group
            first = b.mul(panel, c(MR))
            # rows past M read row M - 1 (their sums are never stored)
            clamped = [b.select(b.icmp_signed("<", b.add(first, c(r)), m_), b.add(first, c(r)), b.sub(m_, c(1)))
                       for r in range(R)]
            keep = masks(p0, nv) if masked else [None] * nv
            if dense:
                rows_at = [b.add(a, b.mul(b.mul(row, field[LDA]), c(4))) for row in clamped]
            else:
                weights = [b.add(a, b.mul(b.mul(b.add(panel, c(g)), k_), c(MR * 4))) for g in range(group)]
            from_bias, from_out = block("from_bias"), block("from_out")
            b.cbranch(b.icmp_signed("==", k0, c(0)), from_bias, from_out)
            b.position_at_end(from_bias)
            if dense:  # sums from 0, the bias added as they are stored (numpy's matmul, then its add)
                biased = [zero] * (nv * R)
            else:
                biased = [splat(load(at(field[BIAS], b.add(first, c(r))), f32)) for r in range(R)]
                biased = [v for v in biased for _ in range(nv)]
            bias_end = b.block
            before = block("k_start")
            b.branch(before)
            b.position_at_end(from_out)
            stored = row_vectors(out, field[LDO], clamped, p0, keep, masked)
            out_end = b.block
            b.branch(before)
            b.position_at_end(before)
            start = merged(biased, bias_end, stored, out_end)

            def step_of(prefetching):
                return lambda k, acc: step(k, acc, prefetching)

            def step(k, acc, prefetching):  # a multiply-add of each sum: a broadcast weight of its row, x's strip row k
                if prefetching:  # a line of x's next strips
                    b.call(prefetch, [b.inttoptr(b.add(ahead[0], b.mul(b.mul(k, field[LDX]), c(4))), i8p),
                                      ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
                xs = [load(at(strip, b.add(b.mul(b.sub(k, k0), c(NR)), c(VEC * h)), v8), v8, 32) for h in range(nv)]
                if not dense:
                    row_weights = [b.add(w, b.mul(k, c(MR * 4))) for w in weights]
                new = []
                for r in range(R):
                    weight_at = b.add(rows_at[r], b.mul(k, c(4))) if dense \
                        else b.add(row_weights[r // MR], c(4 * (r % MR)))
                    weight = splat(load(b.inttoptr(weight_at, f32.as_pointer()), f32))
                    new += [b.call(fma, [weight, xs[h], acc[nv * r + h]]) for h in range(nv)]
                return new
            if ahead is None:
                acc = unrolled(k0, k1, K_UNROLL, step_of(False), start)
            else:  # the loop twice: prefetching where this tile has a line to take, else not
                with_lines, without, k_done = block("prefetching"), block("not_prefetching"), block("k_done")
                b.cbranch(ahead[1], with_lines, without)
                ends = []
                for where, prefetching in ((with_lines, True), (without, False)):
                    b.position_at_end(where)
                    ends.append((unrolled(k0, k1, K_UNROLL, step_of(prefetching), start), b.block))
                    b.branch(k_done)
                b.position_at_end(k_done)
                acc = merged(ends[0][0], ends[0][1], ends[1][0], ends[1][1])
            rows = b.sub(m_, first)
            partial_sums, epilogue, tile_done = block("partial"), block("epilogue"), block("tile_done")
            b.cbranch(b.icmp_signed("<", k1, k_), partial_sums, epilogue)
            b.position_at_end(partial_sums)
            for r in range(R):
                def store_sums(r=r):
                    m = b.add(first, c(r))
                    for h in range(nv):
                        target = at(out, b.add(b.add(b.mul(m, field[LDO]), p0), c(VEC * h)), v8)
                        if masked:
                            b.call(masked_store, [acc[nv * r + h], target, ir.Constant(i32, 4), keep[h]])
                        else:
                            b.store(acc[nv * r + h], target).align = 4
                when(b.icmp_signed("<", c(r), rows), store_sums)
            b.branch(tile_done)
            b.position_at_end(epilogue)
            # The whole tile at once, in straight-line code (rows past M read row M - 1, and
            # only the rows inside M are stored): its 4 x nv vectors' activations are
            # independent chains the core overlaps. Row by row, each row's three swish chains
            # sat in a block of their own: EfficientNet-B0's 16 -> 96 expansion at 112x112 with
            # its swish took 2.9-3.3 ms alone, 2.4-2.5 so (the product without it 1.4-1.5);
            # the model at batch 1 25.0 -> 22.5 ms.
            act = field[ACT]
            relu, relu6 = b.icmp_signed("==", act, c(1)), b.icmp_signed("==", act, c(2))
            has_res = b.icmp_signed("!=", res, c(0))
            has_slope = b.icmp_signed("!=", field[SLOPE], c(0))
            has_bias = b.icmp_signed("!=", field[BIAS], c(0))
            bias_at = b.select(has_bias, field[BIAS], field[X])  # an address that may be read either way
            values = list(acc)
            if dense:  # the strip's columns of the bias (zeros past P), where there is one
                column_bias = [b.select(has_bias, load(at(bias_at, b.add(p0, c(VEC * h)), v8), v8, 4), zero)
                               for h in range(nv)]
                values = [b.fadd(v, column_bias[i % nv]) for i, v in enumerate(values)]
            # The residual, read where there is one (a branch: its address may be 0).
            with_res_block, join = block("res"), block("res_done")
            came_from = b.block
            b.cbranch(has_res, with_res_block, join)
            b.position_at_end(with_res_block)
            added = [b.fadd(v, extra) for v, extra in
                     zip(values, row_vectors(res, field[LDR], clamped, p0, keep, masked))]
            res_end = b.block
            b.branch(join)
            b.position_at_end(join)
            activated = activate(merged(values, came_from, added, res_end), relu, relu6)
            if not dense:  # each row's PReLU slope
                slope_at = b.select(has_slope, field[SLOPE], field[BIAS])
                slopes = [splat(b.select(has_slope, load(at(slope_at, clamped[r]), f32), ir.Constant(f32, 1.0)))
                          for r in range(R)]
                activated = [b.select(b.fcmp_ordered("<", v, zero), b.fmul(v, slopes[i // nv]), v)
                             for i, v in enumerate(activated)]
            for r in range(R):
                def store_row(r=r):
                    m = b.add(first, c(r))
                    for h in range(nv):
                        target = at(out, b.add(b.add(b.mul(m, field[LDO]), p0), c(VEC * h)), v8)
                        if masked:
                            b.call(masked_store, [activated[nv * r + h], target, ir.Constant(i32, 4), keep[h]])
                        else:
                            b.store(activated[nv * r + h], target).align = 4
                when(b.icmp_signed("<", c(r), rows), store_row)
            b.branch(tile_done)
            b.position_at_end(tile_done)

        full = b.sub(p_, b.srem(p_, c(NR)))

        def image(n):
            x = b.add(field[W if dense else X], b.mul(n, b.mul(field[SX], c(4))))
            scale = b.add(field[SCALE], b.mul(n, b.mul(field[SSC], c(4))))
            out = b.add(field[OUT], b.mul(n, b.mul(field[SO], c(4))))
            res = b.select(b.icmp_signed("!=", field[RES], c(0)),
                           b.add(field[RES], b.mul(n, b.mul(field[SR], c(4)))), c(0))

            def smaller(u, v):
                return b.select(b.icmp_signed("<", u, v), u, v)

            def columns(p0, masked, nv=NV):  # dense: w's packed strip at column p0 over every panel of a's rows
                def rows_block(k0):  # the packed strip's rows k0:k1 (each strip K x NR floats)
                    k1 = smaller(b.add(k0, field[KC]), k_)
                    strip = b.add(field[X], b.mul(b.add(b.mul(p0, k_), b.mul(k0, c(NR))), c(4)))
                    loop(c(0), panels, c(1), lambda panel: tile(x, strip, out, res, panel, p0, masked, k0, k1, nv))
                loop(c(0), k_, field[KC], rows_block)

            def strips(q0, q1, masked=False, nv=NV):
                """x's strips from column q0 to q1 packed (x's rows k0:k0 + KC at a time), then each
                panel of w over all of them; where a strip is one vector, TAIL_GROUP panels a tile."""
                def strip_at(p0):
                    return b.add(field[STRIP], b.mul(b.mul(b.udiv(b.sub(p0, q0), c(NR)), field[KC]), c(NR * 4)))

                def rows_block(k0):
                    k1 = smaller(b.add(k0, field[KC]), k_)
                    loop(q0, q1, c(NR), lambda p0: pack(x, scale, strip_at(p0), p0, masked, k0, k1, nv))

                    lines = b.udiv(b.add(b.sub(q1, q0), c(15)), c(16))  # of a row of the next strips

                    def ahead(panel, p0):
                        """Tile (panel, strip)'s line of x's next strips (the next SB, as far as
                        these): the tiles in turn take the lines in turn, a row k a step."""
                        line = b.add(b.mul(panel, b.udiv(b.sub(q1, q0), c(NR))), b.udiv(b.sub(p0, q0), c(NR)))
                        return b.add(x, b.mul(b.add(q1, b.mul(line, c(16))), c(4))), b.and_(
                            b.icmp_signed("<", line, lines), b.icmp_signed("!=", field[PF], c(0)))

                    def panels_over(first, last, group):
                        loop(first, last, c(group), lambda panel: loop(
                            q0, q1, c(NR), lambda p0: tile(field[W], strip_at(p0), out, res, panel, p0, masked, k0, k1,
                                                           nv, group, ahead(panel, p0) if not masked and nv == NV
                                                           else None)))
                    if nv > 1:
                        panels_over(c(0), panels, 1)
                    else:
                        whole = b.sub(panels, b.urem(panels, c(TAIL_GROUP)))
                        panels_over(c(0), whole, TAIL_GROUP)
                        panels_over(whole, panels, 1)
                loop(c(0), k_, field[KC], rows_block)

            if dense:
                loop(c(0), full, c(NR), lambda p0: columns(p0, False))
            else:  # SB strips at a time
                loop(c(0), full, b.mul(field[SB], c(NR)),
                     lambda q0: strips(q0, smaller(b.add(q0, b.mul(field[SB], c(NR))), full)))
            # The last columns (fewer than NR) in a strip of as few vectors as hold them: 49
            # columns (a 7x7 map) as 24 + 24 + 8, not 24 + 24 + 24.
            rest = b.sub(p_, full)
            if not dense:  # a few last columns one at a time, each a product of vectors of rows
                few = b.icmp_signed("<=", rest, c(COLUMN_TAIL))
                when(few, lambda: loop(full, p_, c(1), lambda q: column(q, x, scale, out, res)))
                rest = b.select(few, c(0), rest)
            for nv in range(1, NV + 1):
                when(b.and_(b.icmp_signed(">", rest, c(VEC * (nv - 1))), b.icmp_signed("<=", rest, c(VEC * nv))),
                     lambda nv=nv: columns(full, True, nv) if dense else strips(full, b.add(full, c(NR)), True, nv))

        def column(q, x, scale, out, res):
            """Column q of the product: vectors of VEC rows (two panels' k-slices), COLUMN_GROUP
            of them a pass over x's column, then the epilogue: the sums of the tile's columns
            (from the bias, one multiply-add a k in order), with none of a strip's lanes idle."""
            eights = b.udiv(b.add(m_, c(VEC - 1)), c(VEC))
            whole = b.sub(eights, b.urem(eights, c(COLUMN_GROUP)))
            loop(c(0), whole, c(COLUMN_GROUP), lambda g: column_rows(q, g, COLUMN_GROUP, x, scale, out, res))
            loop(whole, eights, c(1), lambda g: column_rows(q, g, 1, x, scale, out, res))

        def column_rows(q, g, count, x, scale, out, res):
            firsts = [b.mul(b.add(g, c(j)), c(VEC)) for j in range(count)]
            start = [load(at(field[BIAS], first, v8), v8, 4) for first in firsts]  # pack pads it to VEC rows

            def step(k, acc):  # x's float at row k (times its factor) into each vector of rows
                xk = splat(b.fmul(load(at(x, b.add(b.mul(k, field[LDX]), q)), f32), load(at(scale, k), f32)))
                new = []
                for j, first in enumerate(firsts):
                    halves = [load(at(field[W], b.mul(b.add(b.mul(b.add(b.udiv(first, c(MR)), c(h)), k_), k), c(MR)),
                                      v4), v4, 4) for h in (0, 1)]
                    weights = b.shuffle_vector(halves[0], halves[1], ir.Constant(i32x8, list(range(VEC))))
                    new.append(b.call(fma, [weights, xk, acc[j]]))
                return new
            acc = loop(c(0), k_, c(1), step, start)
            last = b.sub(m_, c(1))
            rows = [[b.select(b.icmp_signed("<", b.add(first, c(i)), m_), b.add(first, c(i)), last) for i in range(VEC)]
                    for first in firsts]  # rows past M read row M - 1 (never stored)

            def gather(base, ld, column, j):  # the floats at rows[j] of base's rows (ld floats apart), column
                value = ir.Constant(v8, ir.Undefined)
                for i, row in enumerate(rows[j]):
                    value = b.insert_element(value, load(at(base, b.add(b.mul(row, ld), column)), f32),
                                             ir.Constant(i32, i))
                return value
            has_res, has_slope = b.icmp_signed("!=", res, c(0)), b.icmp_signed("!=", field[SLOPE], c(0))
            with_res_block, join = block("c_res"), block("c_res_done")
            came_from = b.block
            b.cbranch(has_res, with_res_block, join)
            b.position_at_end(with_res_block)
            added = [b.fadd(v, gather(res, field[LDR], q, j)) for j, v in enumerate(acc)]
            res_end = b.block
            b.branch(join)
            b.position_at_end(join)
            act = field[ACT]
            activated = activate(merged(acc, came_from, added, res_end), b.icmp_signed("==", act, c(1)),
                                 b.icmp_signed("==", act, c(2)))
            slope_at = b.select(has_slope, field[SLOPE], field[BIAS])  # an address that may be read either way
            for j, v in enumerate(activated):
                slopes = b.select(has_slope, gather(slope_at, c(1), c(0), j), ir.Constant(v8, [1.0] * VEC))
                v = b.select(b.fcmp_ordered("<", v, zero), b.fmul(v, slopes), v)
                for i in range(VEC):
                    row = b.add(firsts[j], c(i))
                    when(b.icmp_signed("<", row, m_), lambda i=i, v=v, row=row: b.store(
                        b.extract_element(v, ir.Constant(i32, i)), at(out, b.add(b.mul(row, field[LDO]), q))))

        loop(c(0), field[IMAGES], c(1), image)
        b.ret(c(0))

    emit("gemm", False)
    emit("gemm_rows", True)
    native_winograd.emit(module, ir, "winograd_input")
    native_winograd.emit(module, ir, "winograd2_input", m=2)
    native_winograd.emit_output(module, ir, "winograd_output")
    for stride in native_depthwise.STRIDES:
        for k in native_depthwise.KERNELS:
            native_depthwise.emit(module, ir, k, stride)
    for stride in native_small_conv.STRIDES:
        native_small_conv.emit(module, ir, stride)
    return module


FUNCTIONS = ("gemm", "gemm_rows", "winograd_input", "winograd2_input", "winograd_output", *native_depthwise.FUNCTIONS,
             *native_small_conv.FUNCTIONS)


def _source_key(llvm):
    """What the module's machine code follows from, without building its IR: this file's,
    native_ir.py's, native_winograd.py's, native_depthwise.py's and native_small_conv.py's
    source, their constants' values (tests and benchmarks may set them before the module
    compiles), jit.py's exp constants, the CPU and its features, llvmlite's version; None
    where a source file cannot be read."""
    import llvmlite
    parts = [llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), llvmlite.__version__,
             repr(sorted(jit.EXP_CONSTANTS.items()))]
    for module in (globals(), vars(native_ir), vars(native_winograd), vars(native_depthwise), vars(native_small_conv)):
        try:
            with open(module["__file__"], "rb") as f:
                parts.append(f.read().decode("utf-8", "replace"))
        except OSError:
            return None
        parts.append(repr(sorted((k, v) for k, v in module.items() if k.isupper() and isinstance(v, int))))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _compile(llvm, ir):
    """The module compiled for this host's CPU: machine code from the cache file of its
    source key where there is one (loaded as an object file: a few ms, where building the
    IR to key the cache by took some 800 ms), else compiled (some 300-400 ms more) and the
    cache file written (atomically; skipped where the folder is read-only), as numba caches
    its loops."""
    from ...atomic import write_bytes
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
    key = _source_key(llvm)
    path = os.path.join(os.path.dirname(__file__), "__pycache__", f"native_gemm.{key}.o") if key else None
    found = None
    code = None
    if path is not None:
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                code = f.read()
    # The file is its code's digest, then the code: LLVM takes a damaged object file down
    # with the process, so only an intact one is loaded (else it is compiled again).
    if code is not None and hashlib.sha256(code[32:]).digest() == code[:32]:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        engine.code = code[32:]  # the object file reads these bytes in place: kept as long as the engine
        engine.add_object_file(llvm.ObjectFileRef.from_data(engine.code))
        found = _functions(engine)
    if found is None:
        module = llvm.parse_assembly(str(_module(ir)))
        module.verify()
        engine = llvm.create_mcjit_compiler(module, machine)

        def compiled(_, code):
            if path is not None:
                with contextlib.suppress(OSError):  # a read-only install: compiled again next time
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    write_bytes(path, hashlib.sha256(code).digest() + code)
        engine.set_object_cache(compiled, lambda _: None)
        found = _functions(engine)
    return found


def _functions(engine):
    """(engine, {name: (a ctypes function, its address)}) of the module's FUNCTIONS, once
    the engine's code is finalized; None where one is missing (a cache file of other code)."""
    engine.finalize_object()
    addresses = {name: engine.get_function_address(name) for name in FUNCTIONS}
    if not all(addresses.values()):
        return None
    kind = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
    return engine, {name: (kind(address), address) for name, address in addresses.items()}


def aligned(n):
    """A zeroed float32 array of n elements starting on a 64-byte boundary (arena.zeroed's)."""
    raw = zeroed(4 * (n + 16)).view(np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + n]


def pack(w, bias=None):
    """(panels, bias): w (M, K) as panels of MR rows, each k-major (MR floats a k), rows
    past M zero, an even count of them (a column's vectors of VEC rows read two); the bias
    (or zeros) padded to the panels' rows."""
    m, k = w.shape
    count = -(-m // VEC) * (VEC // MR)
    panels = aligned(count * MR * k)
    laid = panels.reshape(count, k, MR)  # rows past M stay zero
    full = m // MR
    laid[:full] = w[:full * MR].reshape(full, MR, k).transpose(0, 2, 1)
    if full * MR < m:
        laid[full, :, :m - full * MR] = w[full * MR:].T
    b = aligned(count * MR)
    if bias is not None:
        b[:m] = bias
    return panels, b


_PACKED = {}  # pack_constant's and pack_columns_constant's packs, while their constants live


def pack_constant(w, bias, first, last):
    """pack(w (M, ...) rows first:last as (rows, K), bias alike) for a model's constant w and
    bias, made once however many plans bind them (kernels.per_constant)."""
    return per_constant(_PACKED, (id(w), id(bias), first, last), (w,) if bias is None else (w, bias),
                        lambda: pack(w[first:last].reshape(last - first, -1),
                                     None if bias is None else bias[first:last]))


def pack_columns(w, bias=None):
    """(strips, bias): w (K, N) as strips of NR columns, each K x NR (k-major: a row of NR
    floats a k), columns past N zero; the bias (or None) padded to the strips' columns."""
    k, n = w.shape
    count = -(-n // NR)
    padded = np.zeros((k, count * NR), np.float32)
    padded[:, :n] = w
    strips = aligned(padded.size)
    strips[:] = padded.reshape(k, count, NR).transpose(1, 0, 2).reshape(-1)
    if bias is None:
        return strips, None
    b = aligned(count * NR)
    b[:n] = bias
    return strips, b


def pack_columns_constant(w, bias, first, last, transposed=False):
    """pack_columns(w[:, first:last], bias[first:last]) for a model's constant w (K, N) (w.T
    where `transposed`) and bias, made once however many plans bind them (kernels.per_constant)."""
    return per_constant(_PACKED, ("columns", id(w), id(bias), first, last, transposed),
                        (w,) if bias is None else (w, bias),
                        lambda: pack_columns((w.T if transposed else w)[:, first:last],
                                             None if bias is None else bias[first:last]))


def bind_rows(packed, a, out, activation="", residual=None):
    """A step writing f(a @ w + bias [+ residual]) to out: a (N, M, K) and out, residual
    (N, M, P) float32 arrays whose last axis is contiguous (rows may be apart), their
    images apart by any stride; `packed` is pack_columns(w, bias), w (K, P), the bias one a
    column. The sums start from 0 and the bias, then the residual, are added as they are
    stored: the bits of this product followed by numpy's adds (a model split between the
    matmul and its adds gives the whole model's values). Each strip of w's packed columns
    (up to ROWS_BLOCK rows of it) runs against every MR rows of a, read in place. None
    where available() is False or the operands do not qualify."""
    if not available() or activation not in ACTIVATIONS:
        return None
    if not _takes(out, residual, a):
        return None
    n, m, k = a.shape
    p = out.shape[2]
    if out.shape != (n, m, p) or (residual is not None and residual.shape != out.shape) or not (m and k and p):
        return None
    if np.shares_memory(a, out):
        return None
    strips, bias = packed
    count = -(-p // NR)
    if strips.size != count * NR * k or (bias is not None and bias.size != count * NR):
        raise ValueError(f"packed columns of {strips.size} floats do not fit a ({k}, {p}) product")
    blocks = -(-k // ROWS_BLOCK)
    fields = np.zeros(FIELDS, np.int64)
    fields[[W, X, OUT]] = [a.ctypes.data, strips.ctypes.data, out.ctypes.data]
    if bias is not None:
        fields[BIAS] = bias.ctypes.data
    fields[[M, K, P, LDA, LDO, ACT, IMAGES, SX, SO, KC]] = [m, k, p, a.strides[1] // 4, out.strides[1] // 4,
                                                            ACTIVATIONS[activation], n, a.strides[0] // 4,
                                                            out.strides[0] // 4, -(-k // blocks)]
    return step("gemm_rows", fields, residual, (strips, bias, a, out))


def bind(packed, x, out, activation="", residual=None, slope=None, scale=None):
    """A step writing f(w @ (x scale) + bias [+ residual]) to out: x (N, K, P) and out,
    residual (N, M, P) float32 arrays whose last axis is contiguous (rows may be apart: ld),
    their images apart by any stride; `packed` is pack(w, bias); activation one of
    ACTIVATIONS, then `slope` (M,) a PReLU's per-row slope; `scale` (N, K) float32, its rows
    contiguous, an image's factor for each row of x (a squeeze-excitation's multiply, whose
    rounded products the strips pack: the bits of numpy's x * scale, then this product), or
    None. None where available() is False or the operands do not qualify (the caller keeps
    its own path)."""
    if not available() or activation not in ACTIVATIONS:
        return None
    if not _takes(out, residual, x):
        return None
    n, k, p = x.shape
    m = out.shape[1]
    if out.shape != (n, m, p) or (residual is not None and residual.shape != out.shape):
        return None
    panels, bias = packed
    if bias.size < -(-m // MR) * MR or panels.size != bias.size * k:
        raise ValueError(f"packed weights of {panels.size} floats do not fit a ({m}, {k}) product")
    blocks = -(-k // MAX_BLOCK)
    kc = -(-k // blocks)  # rows of x a strip holds: blocks of equal depth, none past MAX_BLOCK
    sb = max(1, STRIP_BLOCK // (kc * NR))  # strips packed at once
    strip = aligned(kc * NR * sb)
    if slope is not None:
        slope = np.ascontiguousarray(np.broadcast_to(np.asarray(slope, np.float32).reshape(-1), (m,)))
    if scale is None:
        scale = np.ones((1, k), np.float32)  # times 1: x's bits
        scale_stride = 0
    elif scale.dtype != np.float32 or scale.shape[-1] != k or scale.ndim != 2 or scale.shape[0] not in (1, n) \
            or scale.strides[1] != 4 or scale.strides[0] % 4:
        return None
    else:
        scale_stride = scale.strides[0] // 4 if scale.shape[0] == n else 0
    fields = np.zeros(FIELDS, np.int64)
    fields[[W, X, BIAS, OUT, STRIP]] = [panels.ctypes.data, x.ctypes.data, bias.ctypes.data, out.ctypes.data,
                                        strip.ctypes.data]
    fields[[M, K, P, LDX, LDO, ACT, IMAGES, SX, SO, KC]] = [m, k, p, x.strides[1] // 4, out.strides[1] // 4,
                                                            ACTIVATIONS[activation], n, x.strides[0] // 4,
                                                            out.strides[0] // 4, kc]
    if slope is not None:
        fields[SLOPE] = slope.ctypes.data
    fields[[SCALE, SSC, SB, PF]] = [scale.ctypes.data, scale_stride, sb, n * k * p >= TILE_PREFETCH_MIN_FLOATS]
    return step("gemm", fields, residual, (panels, bias, strip, slope, scale, x, out))


def bind_chain(packs, xs, outs):
    """Steps [bind(packs[i], xs[i], outs[i]) for each i], for products that run one after
    another, never at once (a worker's chain: one Winograd position each): bound once, the
    others a copy of its fields with their own weights, x and out, sharing its strip (a
    bind costs some 60 us in Python; ResNet-18's 2-thread plan binds 708). The products
    must match the first's shapes, strides and packed size; None where the first does not
    bind."""
    first = bind(packs[0], xs[0], outs[0])
    if first is None:
        return None
    fields = first.keep[0]
    steps = [first]
    for (panels, bias), x, out in zip(packs[1:], xs[1:], outs[1:]):
        if (x.shape, x.strides, out.shape, out.strides, panels.size, bias.size) != (
                xs[0].shape, xs[0].strides, outs[0].shape, outs[0].strides, packs[0][0].size, packs[0][1].size) \
                or x.dtype != np.float32 or out.dtype != np.float32:
            raise ValueError("bind_chain: every product must match the first's shapes and strides")
        mine = fields.copy()
        mine[[W, X, BIAS, OUT]] = [panels.ctypes.data, x.ctypes.data, bias.ctypes.data, out.ctypes.data]
        steps.append(step("gemm", mine, None, (panels, bias, x, out, first.keep)))
    return steps


def _takes(out, residual, *inputs):
    """Whether bind's and bind_rows's operands qualify: float32, three axes, the last
    contiguous, strides of whole floats; a residual, read in the pass that writes out, may
    alias it only as the very same elements."""
    arrays = [*inputs, out] + ([residual] if residual is not None else [])
    if any(v.dtype != np.float32 or v.ndim != 3 or v.strides[2] != 4 or any(st % 4 for st in v.strides)
           for v in arrays):
        return False
    return residual is None or not np.shares_memory(residual, out) or (
        residual.ctypes.data == out.ctypes.data and residual.strides == out.strides)


def step(name, fields, residual, keep):
    """The step calling compiled function `name` of the module on `fields` (a product's
    residual set here, or None), keeping `keep` (the arrays it reads and writes) alive as
    long as itself."""
    if residual is not None:
        fields[[RES, LDR, SR]] = [residual.ctypes.data, residual.strides[1] // 4, residual.strides[0] // 4]
    function, address = _built[0][1][name]
    step = functools.partial(function, fields.ctypes.data)
    step.keep = (fields, residual, *keep)
    step.native_call = (address, fields.ctypes.data)  # for the native workers (native_threads.gemms)
    return step
