"""LLVM IR helpers of the compiled kernels (native_gemm's module: native_gemm.py,
native_winograd.py, native_depthwise.py): `Emitter`, a function of one int64 argument
being built, with its loops, branches, vector loads and partial stores, and the fused
activations as IR on vectors of 8 floats (`swish`, `hard_swish`, `activate`), the same
sums as jit.py's loops compute them."""
import numpy as np

from . import jit

TILES = 8  # floats a vector: AVX2's 8
# The activations `activate` computes, by their codes (jit.ACTIVATION_CODES'): the kernels'
# ACT operand.
ACTIVATIONS = {"": 0, "relu": 1, "relu6": 2, "swish": 3, "hard_swish": 4}


def swish(b, ir, fma, fabs, v):
    """v sigmoid(v) of the vector v (8 floats), as jit.py's _swishf: e = exp(-|v|)
    (jit._exp_nonpositive's steps, multiply-adds fused), then (1 or e) / (1 + e); NaN kept."""
    v8, i32x8 = v.type, ir.VectorType(ir.IntType(32), TILES)

    def const(value):
        return ir.Constant(v8, [float(np.float32(value))] * TILES)
    k = jit.EXP_CONSTANTS
    zero = const(0.0)
    t = b.fsub(zero, b.call(fabs, [v]))
    lo = const(k["lo"])
    u = b.select(b.fcmp_ordered(">", t, lo), t, lo)
    magic = const(k["magic"])
    n = b.fsub(b.call(fma, [u, const(k["log2e"]), magic]), magic)
    minus_n = b.fsub(zero, n)
    r = b.call(fma, [minus_n, const(k["ln2_lo"]), b.call(fma, [minus_n, const(k["ln2_hi"]), u])])
    poly = const(k["poly"][-1])
    for coefficient in reversed(k["poly"][:-1]):
        poly = b.call(fma, [poly, r, const(coefficient)])
    poly = b.fadd(b.call(fma, [poly, b.fmul(r, r), r]), const(1.0))
    bits = b.shl(b.add(b.fptosi(n, i32x8), ir.Constant(i32x8, [127 + 64] * TILES)), ir.Constant(i32x8, [23] * TILES))
    e = b.fmul(b.fmul(poly, b.bitcast(bits, v8)), const(2.0 ** -64))
    e = b.select(b.fcmp_ordered(">", t, lo), e, zero)
    one = const(1.0)
    return b.fmul(v, b.fdiv(b.select(b.fcmp_ordered(">=", v, zero), one, e), b.fadd(one, e)))


def hard_swish(b, ir, v):
    """v max(0, min(1, (v + 3) / 6)) of the vector v, NaN kept."""
    v8 = v.type
    zero, one = ir.Constant(v8, [0.0] * TILES), ir.Constant(v8, [1.0] * TILES)
    s = b.fdiv(b.fadd(v, ir.Constant(v8, [3.0] * TILES)), ir.Constant(v8, [6.0] * TILES))
    s = b.select(b.fcmp_ordered("<", s, zero), zero, s)
    return b.fmul(v, b.select(b.fcmp_ordered(">", s, one), one, s))


def activate(b, ir, fma, fabs, block, code, values, relu, relu6):
    """jit.ACTIVATION_CODES' activation `code` (an i64: 0 none, 1 relu, 2 relu6, 3 swish, 4
    hard_swish) of each vector of `values`: relu and relu6 as selects that keep NaN (numpy's
    maximum and clip do; `relu`, `relu6`: i1 values saying which), swish and hard_swish in
    blocks of their own (`block(label)` makes one), joined by phi nodes."""
    i64 = ir.IntType(64)
    v8 = values[0].type
    zero, six = ir.Constant(v8, [0.0] * TILES), ir.Constant(v8, [6.0] * TILES)
    simple, smooth, is_hard, join = block("simple"), block("swish"), block("hard_swish"), block("activated")
    hard_test = block("hard_test")
    b.cbranch(b.icmp_signed("<", code, ir.Constant(i64, 3)), simple, hard_test)
    b.position_at_end(hard_test)
    b.cbranch(b.icmp_signed("==", code, ir.Constant(i64, 4)), is_hard, smooth)
    outcomes = []
    for start, compute in ((simple, None), (is_hard, lambda v: hard_swish(b, ir, v)),
                           (smooth, lambda v: swish(b, ir, fma, fabs, v))):
        b.position_at_end(start)
        if compute is None:
            out = []
            for v in values:
                clipped = b.select(b.fcmp_ordered("<", v, zero), zero, v)
                v = b.select(relu, clipped, v)
                out.append(b.select(relu6, b.select(b.fcmp_ordered(">", clipped, six), six, clipped), v))
        else:
            out = [compute(v) for v in values]
        outcomes.append((b.block, out))
        b.branch(join)
    b.position_at_end(join)
    merged = []
    for h in range(len(values)):
        phi = b.phi(v8)
        for where, out in outcomes:
            phi.add_incoming(out[h], where)
        merged.append(phi)
    return merged


class Emitter:
    """A function `name` of one int64 (the address of `count` int64 operands, `fields`)
    being emitted into `module`, and the IR helpers the kernels' loops use."""

    def __init__(self, module, ir, name, count):
        self.ir = ir
        self.f32, self.i64, self.i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
        self.v8, self.i64x8 = ir.VectorType(self.f32, TILES), ir.VectorType(self.i64, TILES)
        self.vptr = self.v8.as_pointer()
        self.opaque = getattr(self.f32.as_pointer(), "is_opaque", False)
        v8 = self.v8
        self.fma = module.globals.get("llvm.fma.v8f32") or ir.Function(
            module, ir.FunctionType(v8, [v8, v8, v8]), name="llvm.fma.v8f32")
        suffix = "p0" if self.opaque else "p0v8f32"
        self.masked_load = module.globals.get("llvm.masked.load.v8f32." + suffix) or ir.Function(
            module, ir.FunctionType(v8, [self.vptr, self.i32, ir.VectorType(ir.IntType(1), TILES), v8]),
            name="llvm.masked.load.v8f32." + suffix)
        self.fabs = module.globals.get("llvm.fabs.v8f32") or ir.Function(
            module, ir.FunctionType(v8, [v8]), name="llvm.fabs.v8f32")
        self.fn = ir.Function(module, ir.FunctionType(self.i64, [self.i64]), name=name)
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.fields = [self.load(self.b.inttoptr(self.b.add(self.fn.args[0], self.c(8 * k)), self.i64.as_pointer()),
                                 self.i64) for k in range(count)]

    def c(self, value):
        return self.ir.Constant(self.i64, value)

    def const(self, value):
        return self.ir.Constant(self.v8, [float(value)] * TILES)

    def load(self, pointer, kind, align=None):
        value = self.b.load(pointer, typ=kind) if self.opaque else self.b.load(pointer)
        if align:
            value.align = align
        return value

    def vector_at(self, address):
        """The 8 floats at `address` (an i64)."""
        return self.load(self.b.inttoptr(address, self.vptr), self.v8, 4)

    def shuffle(self, u, w, order):
        return self.b.shuffle_vector(u, w, self.ir.Constant(self.ir.VectorType(self.i32, len(order)), order))

    def splat(self, value, kind):
        vector = self.b.insert_element(self.ir.Constant(kind, self.ir.Undefined), value, self.ir.Constant(self.i32, 0))
        return self.shuffle(vector, self.ir.Constant(kind, self.ir.Undefined), [0] * TILES)

    def block(self, label):
        return self.fn.append_basic_block(label)

    def loop(self, first, last, step, body, carried=()):
        """for k in range(first, last, step): body(k) (its counter a phi node); with
        `carried` (values: a tile's sums), body(k, values) returns their next values, and the
        loop returns the values it ends with."""
        b = self.b
        before, test, inside, after = b.block, self.block("test"), self.block("body"), self.block("after")
        b.branch(test)
        b.position_at_end(test)
        k = b.phi(self.i64)
        k.add_incoming(first, before)
        values = []
        for value in carried:
            phi = b.phi(value.type)
            phi.add_incoming(value, before)
            values.append(phi)
        b.cbranch(b.icmp_signed("<", k, last), inside, after)
        b.position_at_end(inside)
        new = body(k, values) if carried else body(k)
        k.add_incoming(b.add(k, step), b.block)
        for phi, value in zip(values, new if carried else ()):
            phi.add_incoming(value, b.block)
        b.branch(test)
        b.position_at_end(after)
        return values

    def when(self, condition, body):
        yes, after = self.block("then"), self.block("done")
        self.b.cbranch(condition, yes, after)
        self.b.position_at_end(yes)
        body()
        self.b.branch(after)
        self.b.position_at_end(after)

    def min(self, u, w):
        return self.b.select(self.b.icmp_signed("<", u, w), u, w)

    def pieces(self, count, stores):
        """The first `count` (< 8) floats of each (address, vector) of `stores` stored at its
        address: 4, 2 and 1 of them as count's bits say (whole stores: AMD's masked stores are
        microcoded, ~12 cycles each)."""
        b, c = self.b, self.c
        four, two = b.and_(count, c(4)), b.and_(count, c(2))
        has_four = b.icmp_signed("!=", four, c(0))
        v4, v2 = self.ir.VectorType(self.f32, 4), self.ir.VectorType(self.f32, 2)

        def store(width, offset, take):
            for address, value in stores:
                kind = {4: v4, 2: v2, 1: self.f32}[width]
                pointer = b.inttoptr(b.add(address, b.mul(offset, c(4))), kind.as_pointer())
                b.store(take(value), pointer).align = 4
        self.when(has_four, lambda: store(4, c(0), lambda value: self.shuffle(value, value, [0, 1, 2, 3])))
        self.when(b.icmp_signed("!=", two, c(0)), lambda: store(2, four, lambda value: b.select(
            has_four, self.shuffle(value, value, [4, 5]), self.shuffle(value, value, [0, 1]))))
        self.when(b.icmp_signed("!=", b.and_(count, c(1)), c(0)), lambda: store(
            1, b.add(four, two), lambda value: b.extract_element(value, b.trunc(b.add(four, two), self.i32))))

    def store_some(self, target, value, whole, count):
        """The vector `value` stored at address `target` whole where `whole` (an i1), else
        its first `count` (< 8) floats (`pieces`)."""
        b = self.b
        yes, part, done = self.block("whole"), self.block("part"), self.block("stored")
        b.cbranch(whole, yes, part)
        b.position_at_end(yes)
        b.store(value, b.inttoptr(target, self.vptr)).align = 4
        b.branch(done)
        b.position_at_end(part)
        self.pieces(count, [(target, value)])
        b.branch(done)
        b.position_at_end(done)

    def activate(self, code, values, relu, relu6):
        """`activate` of `values` for the activation `code` (an i64)."""
        return activate(self.b, self.ir, self.fma, self.fabs, self.block, code, values, relu, relu6)

    def copy_rows(self, source, target, rows, width, source_row, target_row):
        """`rows` rows of `width` floats from address `source` (rows `source_row` floats
        apart) to `target` (`target_row` apart): vectors of 8 floats, a row's last 8 ending at
        its end (overlapping the vector before); one float at a time where width < 8."""
        b, c, loop, block = self.b, self.c, self.loop, self.block
        last = b.sub(width, c(TILES))

        def row(y):
            start = b.add(source, b.mul(b.mul(y, source_row), c(4)))
            end = b.add(target, b.mul(b.mul(y, target_row), c(4)))

            def move(u):
                value = self.vector_at(b.add(start, b.mul(u, c(4))))
                b.store(value, b.inttoptr(b.add(end, b.mul(u, c(4))), self.vptr)).align = 4

            def one(u):
                pointer = self.f32.as_pointer()
                b.store(self.load(b.inttoptr(b.add(start, b.mul(u, c(4))), pointer), self.f32),
                        b.inttoptr(b.add(end, b.mul(u, c(4))), pointer))
            wide, narrow, done = block("wide"), block("narrow"), block("copied")
            b.cbranch(b.icmp_signed(">=", width, c(TILES)), wide, narrow)
            b.position_at_end(wide)
            loop(c(0), last, c(TILES), move)
            move(last)
            b.branch(done)
            b.position_at_end(narrow)
            loop(c(0), width, c(1), one)
            b.branch(done)
            b.position_at_end(done)
        loop(c(0), rows, c(1), row)

    def copy_phases(self, source, phases, stride, rows, width, top, left, qw):
        """x's plane at address `source` (`rows` rows of `width` floats, `rows` no more than
        the padded rows below `top` hold) into the padded rows at address `phases`, from row
        `top` and column `left`: each padded row QW floats, or at stride 2 its even columns
        then its odd ones, QW floats each (x's even columns in phase LEFT % 2 from LEFT // 2
        on, its odd ones in the other from (LEFT + 1) // 2 on). At stride 2, 16 floats of x a
        step split by two shuffles into 8 even and 8 odd, a row's last (fewer) by masked loads
        (zeros past x: its right padding). The zeros around x are left as they are."""
        ir, b, c, when = self.ir, self.b, self.c, self.when

        def address(base, index):
            return b.add(base, b.mul(index, c(4)))

        if stride == 1:
            self.copy_rows(source, address(phases, b.add(b.mul(top, qw), left)), rows,
                           self.min(width, b.sub(qw, left)), width, qw)
            return
        line_floats = b.mul(qw, c(2))
        odd_left = b.icmp_signed("!=", b.and_(left, c(1)), c(0))
        even_at = b.add(b.select(odd_left, qw, c(0)), b.udiv(left, c(2)))
        odd_at = b.add(b.select(odd_left, c(0), qw), b.udiv(b.add(left, c(1)), c(2)))
        whole = b.sub(width, b.urem(width, c(16)))
        rest = self.splat(b.sub(width, whole), self.i64x8)
        keep = [b.icmp_signed("<", ir.Constant(self.i64x8, list(range(h * TILES, h * TILES + TILES))), rest)
                for h in (0, 1)]

        def row(y):
            start = address(source, b.mul(y, width))
            line = address(phases, b.mul(b.add(y, top), line_floats))
            evens, odds = address(line, even_at), address(line, odd_at)

            def split(m0, v0, v1):
                half = b.udiv(m0, c(2))
                b.store(self.shuffle(v0, v1, list(range(0, 16, 2))), b.inttoptr(address(evens, half), self.vptr)).align = 4
                b.store(self.shuffle(v0, v1, list(range(1, 16, 2))), b.inttoptr(address(odds, half), self.vptr)).align = 4
            self.loop(c(0), whole, c(16), lambda m0: split(
                m0, self.vector_at(address(start, m0)), self.vector_at(address(start, b.add(m0, c(TILES))))))
            when(b.icmp_signed("<", whole, width), lambda: split(whole, *(
                b.call(self.masked_load, [b.inttoptr(address(start, b.add(whole, c(TILES * h))), self.vptr),
                                          ir.Constant(self.i32, 4), keep[h], self.const(0.0)]) for h in (0, 1))))
        self.loop(c(0), rows, c(1), row)
