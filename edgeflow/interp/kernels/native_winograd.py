"""The input transform of F(4x4, 3x3) Winograd convolutions (winograd.py) as LLVM IR:
V = B^T d B for each 6x6 tile d of x, eight tiles of a tile row at a time, one vector a
tile element.

jit.py's winograd_input_loop gathers each tile's 36 elements into runs one float at a
time (x's rows are read at stride 4, the tiles overlap by two columns), then sums the runs:
the gather took half its time (ResNet-18's 64-channel layer at 56x56: 323 of 637 us) and
small planes paid a loop per tile row (512 channels at 7x7: 5.5 ns a float of V). Here a
tile row's 8 tiles come from five vector loads of each of x's six rows (masked where the
tiles reach past x's edges: its zero padding), split into the stride-4 columns by shuffles,
and the transforms are the 1-D transform's twelve adds and multiply-adds (B^T's zeros and
ones skipped), along the rows and then the columns, before 36 vector stores into V.

The function is compiled into native_gemm's module (native_gemm.available() says whether
it runs); winograd.py binds it where numba's loops would run the F(4x4) input transform.
"""
import numpy as np

TILES = 8  # tiles a vector: AVX2's 8 floats
# Operands of one call (the int64 array the compiled function reads).
X, V, N, C, H, W, TH, TW, TOP, LEFT, C0, C1, PLANE, PAD, PAD_COLS = range(15)
FIELDS = 15


def transform(b, fma, const, d):
    """o = B^T d for six vectors d (F(4x4, 3x3)'s B^T, winograd._F4[0]): twelve operations."""
    four, five, two = const(4.0), const(-5.0), const(2.0)
    minus4, minus2 = const(-4.0), const(-2.0)
    a = b.call(fma, [minus4, d[2], d[4]])  # d4 - 4 d2
    q = b.call(fma, [minus4, d[1], d[3]])  # d3 - 4 d1
    e = b.fsub(d[4], d[2])
    f = b.fsub(d[3], d[1])
    return [b.call(fma, [five, d[2], b.call(fma, [four, d[0], d[4]])]),  # 4 d0 - 5 d2 + d4
            b.fadd(a, q), b.fsub(a, q),
            b.call(fma, [two, f, e]), b.call(fma, [minus2, f, e]),
            b.call(fma, [five, d[3], b.call(fma, [four, d[1], d[5]])])]  # 4 d1 - 5 d3 + d5


def emit(module, ir, name):
    """The function `name`(fields) of one int64 (the address of FIELDS int64s): V (36, C,
    N * TH * TW) at position (n, i, j) of channel c in C0:C1 = B^T d B, d the 6x6 tile of
    x (N, C, H, W) at row 4 i - TOP, column 4 j - LEFT (zeros outside x); PLANE: V's
    floats from one of the 36 positions to the next."""
    f32, i64, i32, i1 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(1)
    v8, m8, i64x8 = ir.VectorType(f32, TILES), ir.VectorType(i1, TILES), ir.VectorType(i64, TILES)
    vptr = v8.as_pointer()
    opaque = getattr(f32.as_pointer(), "is_opaque", False)
    suffix = "p0" if opaque else "p0v8f32"
    fma = module.globals.get("llvm.fma.v8f32") or ir.Function(module, ir.FunctionType(v8, [v8, v8, v8]),
                                                                name="llvm.fma.v8f32")
    masked_load = module.globals.get("llvm.masked.load.v8f32." + suffix) or ir.Function(
        module, ir.FunctionType(v8, [vptr, i32, m8, v8]), name="llvm.masked.load.v8f32." + suffix)
    masked_store = module.globals.get("llvm.masked.store.v8f32." + suffix) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [v8, vptr, i32, m8]), name="llvm.masked.store.v8f32." + suffix)
    fn = ir.Function(module, ir.FunctionType(i64, [i64]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v):
        return ir.Constant(i64, v)

    def const(value):
        return ir.Constant(v8, [float(value)] * TILES)

    def load(pointer, kind):
        return b.load(pointer, typ=kind) if opaque else b.load(pointer)

    field = [load(b.inttoptr(b.add(fn.args[0], c(8 * k)), i64.as_pointer()), i64) for k in range(FIELDS)]
    x, v, n_, c_, h_, w_, th, tw, top, left, c0, c1, plane, pad, pad_cols = field
    pad_rows = b.add(b.mul(th, c(4)), c(2))
    zero = const(0.0)
    lanes = ir.Constant(i64x8, list(range(TILES)))

    def splat(value):
        vector = b.insert_element(ir.Constant(i64x8, ir.Undefined), value, ir.Constant(i32, 0))
        return b.shuffle_vector(vector, ir.Constant(i64x8, ir.Undefined), ir.Constant(ir.VectorType(i32, TILES),
                                                                                      [0] * TILES))

    def loop(first, last, step, body):
        before, test, inside, after = b.block, fn.append_basic_block("test"), fn.append_basic_block("body"), \
            fn.append_basic_block("after")
        b.branch(test)
        b.position_at_end(test)
        k = b.phi(i64)
        k.add_incoming(first, before)
        b.cbranch(b.icmp_signed("<", k, last), inside, after)
        b.position_at_end(inside)
        body(k)
        k.add_incoming(b.add(k, step), b.block)
        b.branch(test)
        b.position_at_end(after)

    def shuffle(p, q, order):
        return b.shuffle_vector(p, q, ir.Constant(ir.VectorType(i32, TILES), order))

    tiles = b.mul(n_, b.mul(th, tw))  # V's floats from one channel to the next

    def copy_plane(n, ch):
        """Channel ch of image n into the plane buffer, at row TOP and column LEFT of its
        zeros (rows and columns past the tiles' reach left out)."""
        base = b.add(x, b.mul(b.mul(b.add(b.mul(n, c_), ch), b.mul(h_, w_)), c(4)))
        rows = b.select(b.icmp_signed("<", h_, b.sub(pad_rows, top)), h_, b.sub(pad_rows, top))
        width = b.select(b.icmp_signed("<", w_, b.sub(pad_cols, left)), w_, b.sub(pad_cols, left))
        last = b.sub(width, c(TILES))  # a row's last 8 columns (its others in whole vectors before)

        def row(y):
            source = b.add(base, b.mul(b.mul(y, w_), c(4)))
            target = b.add(pad, b.mul(b.add(b.mul(b.add(y, top), pad_cols), left), c(4)))

            def move(u):
                value = load(b.inttoptr(b.add(source, b.mul(u, c(4))), vptr), v8)
                value.align = 4
                b.store(value, b.inttoptr(b.add(target, b.mul(u, c(4))), vptr)).align = 4

            def wide():
                loop(c(0), last, c(TILES), move)
                move(last)

            def narrow():  # fewer than 8 columns: one at a time
                def one(u):
                    b.store(load(b.inttoptr(b.add(source, b.mul(u, c(4))), f32.as_pointer()), f32),
                            b.inttoptr(b.add(target, b.mul(u, c(4))), f32.as_pointer()))
                loop(c(0), width, c(1), one)
            wide_block, narrow_block, done = fn.append_basic_block("wide"), fn.append_basic_block("narrow"), \
                fn.append_basic_block("copied")
            b.cbranch(b.icmp_signed(">=", width, c(TILES)), wide_block, narrow_block)
            b.position_at_end(wide_block)
            wide()
            b.branch(done)
            b.position_at_end(narrow_block)
            narrow()
            b.branch(done)
            b.position_at_end(done)
        loop(c(0), rows, c(1), row)

    def tile_row(n, ch, i, j0):
        """Tiles (n, i, j0..j0 + 7) of channel ch (lanes past TW computed, not stored)."""
        rows = []
        for r in range(6):  # the plane buffer's columns 4 j0 .. 4 j0 + 33 (the 8 tiles'), 8 at a time
            base = b.add(pad, b.mul(b.add(b.mul(b.add(b.mul(i, c(4)), c(r)), pad_cols), b.mul(j0, c(4))), c(4)))
            vectors = []
            for h in range(5):
                value = load(b.inttoptr(b.add(base, c(4 * TILES * h)), vptr), v8)
                value.align = 4
                vectors.append(value)
            low01 = shuffle(vectors[0], vectors[1], [0, 4, 8, 12, 1, 5, 9, 13])  # columns 4t, 4t + 1 of tiles 0-3
            low23 = shuffle(vectors[0], vectors[1], [2, 6, 10, 14, 3, 7, 11, 15])
            high01 = shuffle(vectors[2], vectors[3], [0, 4, 8, 12, 1, 5, 9, 13])  # of tiles 4-7
            high23 = shuffle(vectors[2], vectors[3], [2, 6, 10, 14, 3, 7, 11, 15])
            d0 = shuffle(low01, high01, [0, 1, 2, 3, 8, 9, 10, 11])
            d1 = shuffle(low01, high01, [4, 5, 6, 7, 12, 13, 14, 15])
            d2 = shuffle(low23, high23, [0, 1, 2, 3, 8, 9, 10, 11])
            d3 = shuffle(low23, high23, [4, 5, 6, 7, 12, 13, 14, 15])
            d4 = shuffle(d0, vectors[4], [1, 2, 3, 4, 5, 6, 7, 8])  # column 4t + 4: the next tile's first
            d5 = shuffle(d1, vectors[4], [1, 2, 3, 4, 5, 6, 7, 9])
            rows.append(transform(b, fma, const, [d0, d1, d2, d3, d4, d5]))  # d B, a row of each tile
        at = b.add(b.add(b.mul(ch, tiles), b.mul(n, b.mul(th, tw))), b.add(b.mul(i, tw), j0))
        outputs = []
        for s in range(6):
            column = transform(b, fma, const, [rows[r][s] for r in range(6)])  # B^T (d B)
            outputs += [(k * 6 + s, column[k]) for k in range(6)]
        whole, part, done = fn.append_basic_block("whole"), fn.append_basic_block("part"), \
            fn.append_basic_block("stored")
        # Whole vectors (AMD's masked stores are microcoded: ~12 cycles each) wherever they end
        # inside channel c1 - 1's tiles: lanes past TW land on tiles this call writes later
        # (channels, then images, then tile rows in turn: 128 channels at 28x28, batch 8,
        # 4.0 -> 1.0 ms)
        b.cbranch(b.icmp_signed("<=", b.add(at, c(TILES)), b.mul(c1, tiles)), whole, part)
        b.position_at_end(whole)
        for position, value in outputs:
            b.store(value, b.inttoptr(b.add(v, b.mul(b.add(b.mul(c(position), plane), at), c(4))), vptr)).align = 4
        b.branch(done)
        b.position_at_end(part)  # the last tiles (TW < 8): 4, 2 and 1 of them as count's bits say
        count = b.sub(tw, j0)
        four, two = b.and_(count, c(4)), b.and_(count, c(2))
        v4, v2 = ir.VectorType(f32, 4), ir.VectorType(f32, 2)

        def pieces(bit, width, first, take):
            def store():
                for position, value in outputs:
                    target = b.add(b.add(v, b.mul(b.add(b.mul(c(position), plane), at), c(4))), b.mul(first, c(4)))
                    b.store(take(value), b.inttoptr(target, {4: v4, 2: v2, 1: f32}[width].as_pointer())).align = 4
            when(b.icmp_signed("!=", bit, c(0)), store)
        pieces(four, 4, c(0), lambda value: b.shuffle_vector(value, value, ir.Constant(ir.VectorType(i32, 4), [0, 1, 2, 3])))
        pieces(two, 2, four, lambda value: b.select(
            b.icmp_signed("!=", four, c(0)),
            b.shuffle_vector(value, value, ir.Constant(ir.VectorType(i32, 2), [4, 5])),
            b.shuffle_vector(value, value, ir.Constant(ir.VectorType(i32, 2), [0, 1]))))
        pieces(b.and_(count, c(1)), 1, b.add(four, two),
               lambda value: b.extract_element(value, b.trunc(b.add(four, two), i32)))
        b.branch(done)
        b.position_at_end(done)

    def when(condition, body):
        yes, after = fn.append_basic_block("then"), fn.append_basic_block("done")
        b.cbranch(condition, yes, after)
        b.position_at_end(yes)
        body()
        b.branch(after)
        b.position_at_end(after)

    def splat_bit(bit):
        vector = b.insert_element(ir.Constant(m8, ir.Undefined), bit, ir.Constant(i32, 0))
        return b.shuffle_vector(vector, ir.Constant(m8, ir.Undefined), ir.Constant(ir.VectorType(i32, TILES),
                                                                               [0] * TILES))

    # Groups of 8 tiles from the row's start; where TW >= 8, the last group ends at its end
    # (overlapping the one before: the same values stored twice), so that every store is whole.
    last = b.select(b.icmp_signed(">=", tw, c(TILES)), b.sub(tw, c(TILES)), c(0))

    def group(n, ch, i, j):
        tile_row(n, ch, i, b.select(b.icmp_signed("<", j, last), j, last))
    def channel(n, ch):
        copy_plane(n, ch)
        loop(c(0), th, c(1), lambda i: loop(c(0), tw, c(TILES), lambda j: group(n, ch, i, j)))
    # A channel's images in turn: their tiles lie side by side in each of V's 36 rows (images
    # outermost, a batch of 8 wrote each row's lines in pieces a channel apart: 128 channels
    # at 28x28 4.4 ms against 1.3 so)
    loop(c0, c1, c(1), lambda ch: loop(c(0), n_, c(1), lambda n: channel(n, ch)))
    b.ret(c(0))


def bind_input(x, v, begin, tile_rows, tile_cols, c0, c1):
    """A step writing V (36, C, N * tile_rows * tile_cols) = B^T d B of x (N, C, H, W)'s
    6x6 tiles for channels c0:c1 (F(4x4, 3x3); `begin` x's top and left padding), or None
    where native_gemm does not run or the operands do not qualify (float32, contiguous)."""
    from . import native_gemm
    n, c = x.shape[:2]
    if not native_gemm.available() or x.dtype != np.float32 or v.dtype != np.float32 or x.ndim != 4 \
            or not (x.flags.c_contiguous and v.flags.c_contiguous) \
            or v.shape != (36, c, n * tile_rows * tile_cols):
        return None
    columns = max(4 * tile_cols + TILES, 5 * TILES)  # a group's 40 floats from column 4 j0, the last's too
    plane = np.zeros((4 * tile_rows + 2) * columns + TILES, np.float32)  # its zeros stay: written once here
    fields = np.zeros(FIELDS, np.int64)
    fields[[X, V, N, C, H, W, TH, TW, TOP, LEFT, C0, C1, PLANE, PAD, PAD_COLS]] = [
        x.ctypes.data, v.ctypes.data, n, c, *x.shape[2:], tile_rows, tile_cols, *begin[:2], c0, c1, v[0].size,
        plane.ctypes.data, columns]
    return native_gemm.step("winograd_input", fields, None, (x, v, plane))
