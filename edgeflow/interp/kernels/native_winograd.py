"""The input transforms of F(4x4, 3x3) and F(2x2, 3x3) Winograd convolutions (winograd.py)
and F(4x4)'s output transform as LLVM IR: V = B^T d B for each 6x6 (4x4) tile d of x, and
out = act(A^T P A + bias) for each tile's products P, eight tiles of a tile row at a time,
one vector a tile element (F(2x2)'s input transform alone, at ResNet-18's batch-1 layers of
14x14 and 7x7: 368 -> 71 and 395 -> 96 us, its sums exact as the loop's).

jit.py's winograd_input_loop gathers each tile's 36 elements into runs one float at a
time (x's rows are read at stride 4, the tiles overlap by two columns), then sums the runs:
the gather took half its time (ResNet-18's 64-channel layer at 56x56: 323 of 637 us) and
small planes paid a loop per tile row (512 channels at 7x7: 5.5 ns a float of V). Here a
tile row's 8 tiles come from five vector loads of each of x's six rows (masked where the
tiles reach past x's edges: its zero padding), split into the stride-4 columns by shuffles,
and the transforms are the 1-D transform's twelve adds and multiply-adds (B^T's zeros and
ones skipped), along the rows and then the columns, before 36 vector stores into V. The
output transform loads the 36 products of 8 tiles, transforms them alike (A^T's ten
operations), adds the bias, clips (relu, relu6), and interleaves each output row's 8 x 4
floats by shuffles into whole-vector stores.

The functions are compiled into native_gemm's module (native_gemm.available() says whether
they run); winograd.py binds them where numba's loops would run those transforms.
"""
import numpy as np

from .native_ir import TILES, Emitter  # TILES: tiles a vector, AVX2's 8 floats

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


def transform2(b, d):
    """o = B^T d for four vectors d (F(2x2, 3x3)'s B^T, winograd._F2[0])."""
    return [b.fsub(d[0], d[2]), b.fadd(d[1], d[2]), b.fsub(d[2], d[1]), b.fsub(d[1], d[3])]


def emit(module, ir, name, m=4):
    """The function `name`(fields) of one int64 (the address of FIELDS int64s): V (a^2, C,
    N * TH * TW) at position (n, i, j) of channel c in C0:C1 = B^T d B, d the a x a tile
    (a = m + 2; F(m x m, 3x3), m 4 or 2) of x (N, C, H, W) at row m i - TOP, column m j -
    LEFT (zeros outside x); PLANE: V's floats from one of the a^2 positions to the next."""
    a = m + 2
    loads = 5 if m == 4 else 3  # vectors of a group's floats of a row: 34 or 18 of them
    e = Emitter(module, ir, name, FIELDS)
    b, c, loop, shuffle, block = e.b, e.c, e.loop, e.shuffle, e.block
    vptr = e.vptr
    x, v, n_, c_, h_, w_, th, tw, top, left, c0, c1, plane, pad, pad_cols = e.fields
    pad_rows = b.add(b.mul(th, c(m)), c(2))

    def one_d(d):
        return transform(b, e.fma, e.const, d) if m == 4 else transform2(b, d)

    tiles = b.mul(n_, b.mul(th, tw))  # V's floats from one channel to the next

    def copy_plane(n, ch):
        """Channel ch of image n into the plane buffer, at row TOP and column LEFT of its
        zeros (rows and columns past the tiles' reach left out)."""
        base = b.add(x, b.mul(b.mul(b.add(b.mul(n, c_), ch), b.mul(h_, w_)), c(4)))
        rows, width = e.min(h_, b.sub(pad_rows, top)), e.min(w_, b.sub(pad_cols, left))
        target = b.add(pad, b.mul(b.add(b.mul(top, pad_cols), left), c(4)))
        e.copy_rows(base, target, rows, width, w_, pad_cols)

    def split_row(i, r, j0):
        """Elements (r, 0..a - 1) of tiles (i, j0..j0 + 7), a vector each: the plane buffer's
        row m i + r from column m j0, its floats split into the stride-m columns."""
        base = b.add(pad, b.mul(b.add(b.mul(b.add(b.mul(i, c(m)), c(r)), pad_cols), b.mul(j0, c(m))), c(4)))
        vectors = [e.vector_at(b.add(base, c(4 * TILES * h))) for h in range(loads)]
        if m == 2:
            even = shuffle(vectors[0], vectors[1], list(range(0, 16, 2)))
            odd = shuffle(vectors[0], vectors[1], list(range(1, 16, 2)))
            return [even, odd, shuffle(even, vectors[2], [1, 2, 3, 4, 5, 6, 7, 8]),
                    shuffle(odd, vectors[2], [1, 2, 3, 4, 5, 6, 7, 9])]
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
        return [d0, d1, d2, d3, d4, d5]

    def tile_row(n, ch, i, j0, rows_per=1):
        """Tiles (n, i, j0..j0 + 7) of channel ch (lanes past TW computed, not stored); with
        rows_per 2 or 4 (TW 4 or 2: j0 0), tile rows i..i + rows_per - 1, TW tiles of each,
        so that the vector's 8 lanes are 8 tiles (rows past TH read row TH - 1: lanes of
        tiles this call writes later, or not at all)."""
        rows = []
        for r in range(a):
            if rows_per == 1:
                elements = split_row(i, r, j0)
            else:
                last_row = b.sub(th, c(1))
                members = [split_row(e.min(b.add(i, c(q)), last_row), r, c(0)) for q in range(rows_per)]
                if rows_per == 2:  # 4 tiles of each
                    elements = [shuffle(members[0][k], members[1][k], [0, 1, 2, 3, 8, 9, 10, 11]) for k in range(a)]
                else:  # 2 tiles of each
                    elements = [shuffle(shuffle(members[0][k], members[1][k], [0, 1, 8, 9, 2, 3, 10, 11]),
                                        shuffle(members[2][k], members[3][k], [0, 1, 8, 9, 2, 3, 10, 11]),
                                        [0, 1, 2, 3, 8, 9, 10, 11]) for k in range(a)]
            rows.append(one_d(elements))  # d B, a row of each tile
        at = b.add(b.add(b.mul(ch, tiles), b.mul(n, b.mul(th, tw))), b.add(b.mul(i, tw), j0))
        outputs = []
        for s in range(a):
            column = one_d([rows[r][s] for r in range(a)])  # B^T (d B)
            outputs += [(k * a + s, column[k]) for k in range(a)]
        targets = [(b.add(v, b.mul(b.add(b.mul(c(position), plane), at), c(4))), value) for position, value in outputs]
        whole, part, done = block("whole"), block("part"), block("stored")
        # Whole vectors wherever they end inside channel c1 - 1's tiles: lanes past TW land on
        # tiles this call writes later (channels, then images, then tile rows in turn: 128
        # channels at 28x28, batch 8, 4.0 -> 1.0 ms)
        b.cbranch(b.icmp_signed("<=", b.add(at, c(TILES)), b.mul(c1, tiles)), whole, part)
        b.position_at_end(whole)
        for target, value in targets:
            b.store(value, b.inttoptr(target, vptr)).align = 4
        b.branch(done)
        b.position_at_end(part)  # the last tiles
        count = e.min(b.sub(tw, j0) if rows_per == 1 else c(TILES), b.sub(b.mul(c1, tiles), at))
        e.pieces(count, targets)
        b.branch(done)
        b.position_at_end(done)

    # Groups of 8 tiles from the row's start; where TW >= 8, the last group ends at its end
    # (overlapping the one before: the same values stored twice), so that every store is whole.
    last = b.select(b.icmp_signed(">=", tw, c(TILES)), b.sub(tw, c(TILES)), c(0))

    def group(n, ch, i, j):
        tile_row(n, ch, i, e.min(j, last))

    def channel(n, ch):
        copy_plane(n, ch)
        # Planes of 4 or 2 tile columns (ResNet's 14x14 and 7x7): 2 or 4 tile rows a vector,
        # not half or a quarter of one (alone, batch 1: 256 channels at 14x14 209 -> 128-157 us,
        # 512 at 7x7 235 -> 191-194; batch 8 1.8 -> 1.4 ms and 2.0 -> 1.4)
        four, two, other = block("four"), block("two"), block("other")
        done = block("channel_done")
        test_two = block("test_two")
        b.cbranch(b.icmp_signed("==", tw, c(4)), four, test_two)
        b.position_at_end(test_two)
        b.cbranch(b.icmp_signed("==", tw, c(2)), two, other)
        for start, rows_per in ((four, 2), (two, 4)):
            b.position_at_end(start)
            loop(c(0), th, c(rows_per), lambda i, rows_per=rows_per: tile_row(n, ch, i, c(0), rows_per))
            b.branch(done)
        b.position_at_end(other)
        loop(c(0), th, c(1), lambda i: loop(c(0), tw, c(TILES), lambda j: group(n, ch, i, j)))
        b.branch(done)
        b.position_at_end(done)
    # A channel's images in turn: their tiles lie side by side in each of V's 36 rows (images
    # outermost, a batch of 8 wrote each row's lines in pieces a channel apart: 128 channels
    # at 28x28 4.4 ms against 1.3 so)
    loop(c0, c1, c(1), lambda ch: loop(c(0), n_, c(1), lambda n: channel(n, ch)))
    b.ret(c(0))


def output_transform(b, fma, const, d):
    """o = A^T d for six vectors d (F(4x4, 3x3)'s A^T, winograd._F4[2]): ten operations."""
    sum12, diff12 = b.fadd(d[1], d[2]), b.fsub(d[1], d[2])
    sum34, diff34 = b.fadd(d[3], d[4]), b.fsub(d[3], d[4])
    return [b.fadd(b.fadd(d[0], sum12), sum34), b.call(fma, [const(2.0), diff34, diff12]),
            b.call(fma, [const(4.0), sum34, sum12]), b.fadd(b.call(fma, [const(8.0), diff34, diff12]), d[5])]


# Tile columns below which the output transform is left to jit.py's loop: its 8 tiles a
# vector run half empty or worse (ResNet-18's layers, batch 1, against the loop: 64 channels
# at 56x56 462 -> 200 us, 128 at 28x28 (7 tile columns) 297 -> 112, 256 at 14x14 (4) 226 ->
# 217, 512 at 7x7 (2) 146 -> 237).
OUTPUT_MIN_TILE_COLS = 6
# Products (floats) past which it is left to the loop too: read from memory, 36 rows at a
# time, they take as long either way (ResNet-18 at batch 8: 64 channels at 56x56 3.4 against
# 3.6 ms, 128 at 28x28 1.5 against 1.5; the model 250 against 240 ms, within this machine's
# spread).
OUTPUT_MAX_PRODUCTS = 1 << 20
# Operands of the output transform's call (RES: a residual's address, or 0 for none).
(P, BIAS, OUT, ON, OM, OH, OW, OTH, OTW, M0, M1, OPLANE, ACT, RES) = range(14)
OUTPUT_FIELDS = 14


def emit_output(module, ir, name):
    """The function `name`(fields): out (N, M, OH, OW)[:, M0:M1] = act(A^T P A + bias
    [+ res]) of each tile's products P (p: (36, M, N * OTH * OTW), OPLANE floats from one of
    the 36 positions to the next), tile (n, i, j) at out's row 4 i, column 4 j (cropped at
    its edge); res (RES, where not 0) a residual of out's layout, added to the biased values
    (rounded: the bits of the conv and an add after it), its floats read where the row's
    are stored (a branch of its own); ACT 0 none, 1 relu, 2 relu6 (selects that keep NaN), after
    the residual."""
    e = Emitter(module, ir, name, OUTPUT_FIELDS)
    b, c, const, loop, when, shuffle, block = e.b, e.c, e.const, e.loop, e.when, e.shuffle, e.block
    f32, v8, vptr, i64x8 = e.f32, e.v8, e.vptr, e.i64x8
    p, bias, out, n_, m_, oh, ow, th, tw, m0, m1, plane, act, res = e.fields
    zero = const(0.0)
    tiles = b.mul(n_, b.mul(th, tw))  # p's floats from one output channel to the next
    lanes = ir.Constant(i64x8, list(range(TILES)))
    end = b.mul(m_, tiles)  # p's tiles in a position's row (reads past it masked)
    relu, relu6 = b.icmp_signed("==", act, c(1)), b.icmp_signed("==", act, c(2))
    low = b.select(b.or_(relu, relu6), const(0.0), const(float("-inf")))
    high = b.select(relu6, const(6.0), const(float("inf")))
    adding = b.icmp_signed("!=", res, c(0))

    def products(at):
        """The 36 positions' vectors of tiles at..at + 7 (plain loads, masked at p's end)."""
        plain, masked, joined = block("plain"), block("masked"), block("loaded")
        b.cbranch(b.icmp_signed("<=", b.add(at, c(TILES)), end), plain, masked)
        values = []
        for where in (plain, masked):
            b.position_at_end(where)
            loaded = []
            keep = None if where is plain else b.icmp_signed("<", b.add(e.splat(at, i64x8), lanes), e.splat(end, i64x8))
            for k in range(36):
                address = b.add(p, b.mul(b.add(b.mul(c(k), plane), at), c(4)))
                loaded.append(e.vector_at(address) if where is plain else b.call(
                    e.masked_load, [b.inttoptr(address, vptr), ir.Constant(e.i32, 4), keep, zero]))
            values.append((b.block, loaded))
            b.branch(joined)
        b.position_at_end(joined)
        merged = []
        for k in range(36):
            phi = b.phi(v8)
            for where, loaded in values:
                phi.add_incoming(loaded[k], where)
            merged.append(phi)
        return merged

    def tile_row(mo, n, i, j0):
        """Output rows 4 i .. 4 i + 3 (those inside OH) of tiles (n, i, j0..j0 + 7)."""
        at = b.add(b.add(b.mul(mo, tiles), b.mul(n, b.mul(th, tw))), b.add(b.mul(i, tw), j0))
        loaded = products(at)
        columns = [output_transform(b, e.fma, const, [loaded[k * 6 + s] for s in range(6)])
                   for k in range(6)]  # (A^T P)... along each row k of P: 4 columns
        shift = e.splat(e.load(b.inttoptr(b.add(bias, b.mul(mo, c(4))), f32.as_pointer()), f32), v8)
        y = [output_transform(b, e.fma, const, [columns[k][col] for k in range(6)]) for col in range(4)]  # y[col][r]
        width = e.min(b.sub(ow, b.mul(j0, c(4))), c(4 * TILES))  # the row's floats here
        whole = b.udiv(width, c(TILES))
        for r in range(4):
            row = b.add(b.mul(i, c(4)), c(r))

            def store_row(r=r, row=row):
                values = [b.fadd(y[col][r], shift) for col in range(4)]  # clipped once interleaved (and added to)
                first = shuffle(values[0], values[1], [0, 8, 1, 9, 2, 10, 3, 11])  # tiles 0-3: columns 0, 1
                second = shuffle(values[2], values[3], [0, 8, 1, 9, 2, 10, 3, 11])  # columns 2, 3
                third = shuffle(values[0], values[1], [4, 12, 5, 13, 6, 14, 7, 15])  # tiles 4-7
                fourth = shuffle(values[2], values[3], [4, 12, 5, 13, 6, 14, 7, 15])
                runs = [shuffle(low, high, order) for low, high in ((first, second), (third, fourth))
                        for order in ([0, 1, 8, 9, 2, 3, 10, 11], [4, 5, 12, 13, 6, 7, 14, 15])]
                target = b.add(out, b.mul(b.add(b.mul(b.add(b.mul(n, m_), mo), b.mul(oh, ow)),
                                                b.add(b.mul(row, ow), b.mul(j0, c(4)))), c(4)))

                def clipped(value):
                    value = b.select(b.fcmp_ordered("<", value, low), low, value)
                    return b.select(b.fcmp_ordered(">", value, high), high, value)

                def store(runs, residual=None):  # residual: its floats' address, added before the clip
                    def added(value, at, count=None):
                        if residual is None:
                            return clipped(value)
                        address = b.add(residual, b.mul(at, c(4)))
                        addend = e.vector_at(address) if count is None else b.call(e.masked_load, [
                            b.inttoptr(address, vptr), ir.Constant(e.i32, 4),
                            b.icmp_signed("<", lanes, e.splat(count, i64x8)), zero])
                        return clipped(b.fadd(value, addend))
                    for q in range(4):
                        when(b.icmp_signed("<", c(q), whole), lambda q=q: setattr(b.store(
                            added(runs[q], c(TILES * q)), b.inttoptr(b.add(target, c(4 * TILES * q)), vptr)),
                            "align", 4))
                    rest = b.urem(width, c(TILES))
                    last = runs[3]
                    for q in (2, 1, 0):
                        last = b.select(b.icmp_signed("==", whole, c(q)), runs[q], last)
                    at = b.mul(whole, c(TILES))
                    when(b.icmp_signed("!=", rest, c(0)),
                         lambda: e.pieces(rest, [(b.add(target, b.mul(at, c(4))), added(last, at, rest))]))

                # Two branches: the residual's floats read where the row's are stored (whole
                # vectors by plain loads: masked ones, even reading nothing, cost a 64-channel
                # 56x56 plane's transform 130-190 -> 240-260 us at every row)
                yes, no, done = block("residual"), block("plain"), block("stored")
                b.cbranch(adding, yes, no)
                b.position_at_end(yes)
                store(runs, b.add(res, b.sub(target, out)))
                b.branch(done)
                b.position_at_end(no)
                store(runs)
                b.branch(done)
                b.position_at_end(done)
            when(b.icmp_signed("<", row, oh), store_row)

    last = b.select(b.icmp_signed(">=", tw, c(TILES)), b.sub(tw, c(TILES)), c(0))

    def group(mo, n, i, j):
        tile_row(mo, n, i, e.min(j, last))
    loop(m0, m1, c(1), lambda mo: loop(c(0), n_, c(1), lambda n: loop(
        c(0), th, c(1), lambda i: loop(c(0), tw, c(TILES), lambda j: group(mo, n, i, j)))))
    b.ret(c(0))


def bind_output(p, bias, out, tile_rows, tile_cols, activation, m0, m1, residual=None):
    """A step writing out (N, M, OH, OW)[:, m0:m1] = act(A^T P A + bias [+ residual]) of the
    products p (36, M, N * tile_rows * tile_cols) (F(4x4, 3x3)), activation "", "relu" or
    "relu6", residual (or None) of out's shape; or None where native_gemm does not run or
    the operands do not qualify (float32, contiguous, OUTPUT_MIN_TILE_COLS tile columns or
    more, OUTPUT_MAX_PRODUCTS at most)."""
    from . import native_gemm
    codes = {"": 0, "relu": 1, "relu6": 2}
    if activation not in codes or tile_cols < OUTPUT_MIN_TILE_COLS or p.size > OUTPUT_MAX_PRODUCTS \
            or not native_gemm.available() or out.ndim != 4 \
            or any(a.dtype != np.float32 or not a.flags.c_contiguous
                   for a in (p, out) + (() if residual is None else (residual,))) \
            or p.shape != (36, out.shape[1], out.shape[0] * tile_rows * tile_cols) \
            or (residual is not None and residual.shape != out.shape):
        return None
    b = np.zeros(out.shape[1], np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    fields = np.zeros(OUTPUT_FIELDS, np.int64)
    fields[[P, BIAS, OUT, ON, OM, OH, OW, OTH, OTW, M0, M1, OPLANE, ACT, RES]] = [
        p.ctypes.data, b.ctypes.data, out.ctypes.data, *out.shape, tile_rows, tile_cols, m0, m1, p[0].size,
        codes[activation], 0 if residual is None else residual.ctypes.data]
    return native_gemm.step("winograd_output", fields, None, (p, b, out, residual))


def bind_input(x, v, begin, tile_rows, tile_cols, c0, c1, m=4):
    """A step writing V (a^2, C, N * tile_rows * tile_cols) = B^T d B of x (N, C, H, W)'s
    a x a tiles for channels c0:c1 (F(m x m, 3x3), m 4 or 2, a = m + 2; `begin` x's top and
    left padding), or None where native_gemm does not run or the operands do not qualify
    (float32, contiguous)."""
    from . import native_gemm
    n, c = x.shape[:2]
    if not native_gemm.available() or x.dtype != np.float32 or v.dtype != np.float32 or x.ndim != 4 \
            or not (x.flags.c_contiguous and v.flags.c_contiguous) \
            or m not in (2, 4) or v.shape != ((m + 2) ** 2, c, n * tile_rows * tile_cols):
        return None
    # a group's 40 (F4) or 24 (F2) floats from column m j0, the last group's too
    columns = max(m * tile_cols + TILES, (5 if m == 4 else 3) * TILES)
    plane = np.zeros((m * tile_rows + 2) * columns + TILES, np.float32)  # its zeros stay: written once here
    fields = np.zeros(FIELDS, np.int64)
    fields[[X, V, N, C, H, W, TH, TW, TOP, LEFT, C0, C1, PLANE, PAD, PAD_COLS]] = [
        x.ctypes.data, v.ctypes.data, n, c, *x.shape[2:], tile_rows, tile_cols, *begin[:2], c0, c1, v[0].size,
        plane.ctypes.data, columns]
    return native_gemm.step("winograd_input" if m == 4 else "winograd2_input", fields, None, (x, v, plane))
