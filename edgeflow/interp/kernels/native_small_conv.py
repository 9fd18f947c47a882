"""Convs of few input channels (a network's stem: an image's 1-4 channels) as LLVM IR, direct:
no im2col columns, every tap's inputs read from a padded copy of the image in registers.

An image's channels are copied into PHASES once (native_ir's copy_phases: the padded rows,
at stride 2 each as its even columns then its odd ones, inside zeros written once), then
each output row is made in tiles of MR output channels by NV vectors of 8 columns (12 sums in
registers, AVX2's 16 leave room for the 3 rows of inputs and a weight): per tap (channel,
kernel row, kernel column) three unaligned vector loads of the padded row the tap reads (at
stride 2 from its phase, so 8 outputs' inputs lie side by side), each output channel's
weight broadcast, twelve fused multiply-adds. The taps run as one loop over a table of their
offsets in PHASES (TAPOFF: channel, row, phase and column folded together, dilation too),
the weights packed once a panel of MR channels a tap. The sums start from the bias; the
activation (relu, relu6, swish, hard_swish: native_ir.activate) is applied before the
store. A row's last columns run in a tile of as few vectors as hold them, the last stored
in pieces where the row ends inside it.

jit.py's small_conv_loop sums its taps into accumulators in memory, four channels and three
taps a pass; for 7x7 kernels im2col gathers the columns (147 a pixel) and native_gemm
multiplies them. Measured on this project's 2-core AMD EPYC (Zen 3), the stem's step alone,
interleaved, against those (224x224, batch 1 and 8): ResNet-18's 7x7 64 channels 4.99 ->
4.06 ms and 39.0 -> 30.7 (im2col's), MobileNetV2's 3x3 stride 2 to 32 with relu6 0.67 ->
0.51 and 4.79 -> 3.33, EfficientNet-B0's with swish 1.05 -> 0.70 and 10.6 -> 7.3,
mobilenet_v3_small's 16 with hard_swish 0.40 -> 0.27 and 3.74 -> 2.75 (the loop's); the
models' runs in one process, both plans: ResNet-18 0.95-0.98x of the time at batch 1, 0.87x
(1 thread) and 0.91x (2) at batch 8, mobilenet_v3_small 0.90-0.96x, MobileNetV2 and
EfficientNet-B0 0.95-1.0x. The 7x7 stem's tile loop runs 6.4 cycles a tap of 12 multiply-adds
(its ideal 6); the 3x3 stems' 27 taps leave more to the copy and the epilogues.

A grouped conv is the same work a group at a time (conv.py's _grouped: RegNet's 8 channels a
group, ResNeXt's 4 to 32): the kernel loops over N * GROUPS images of C / GROUPS channels
each (x's and out's channels of a group lie together), an image's group taking that group's
panels of weights and bias.

Compiled into native_gemm's module (native_gemm.available() says whether it runs);
jit.bind_small_conv binds it (`bind`) for the float32 convs that `suits`.
"""
import numpy as np

from .native_ir import ACTIVATIONS, TILES, Emitter

# Operands of one call (the int64 array the compiled function reads).
(X, WP, BIAS, OUT, N, C, H, W, M, OH, OW, TOP, LEFT, ACT, PHASES, QW, QH, TAPS, TAPOFF, XPLANE,
 OPLANE, GROUPS) = range(22)
FIELDS = 22
MR, NV = 4, 3  # a tile's output channels and vectors of 8 output columns
MAX_CHANNELS = 4  # input channels of a conv of one group
# A group's input channels up to which a grouped conv runs here (conv.py's _grouped) rather
# than as im2col's columns and a product per group (numpy's batched matmul). 3x3 convs at
# batch 1, one thread, the step alone, time against that path: 4 channels a group (ResNeXt's
# first stage, 128 at 56x56 in 32 groups) 0.12x, 8 (RegNet's) 0.16-0.25x, 16 0.46-0.51x, 32
# 0.70-0.78x, 48 0.79x, 64 1.07x, 128 1.14x (AlexNet's two groups: BLAS's long products win).
GROUP_CHANNELS = 48
STRIDES = (1, 2)


def name(stride):
    return f"small_conv{stride}"


FUNCTIONS = tuple(name(s) for s in STRIDES)


def emit(module, ir, stride):
    """The function small_convS(fields) of one int64 (the address of FIELDS int64s): out (N,
    M, OH, OW) = act(the conv of x (N, C, H, W) by the packed weights WP (GROUPS * ceil(M /
    MR) panels, TAPS, MR: zeros past M; image n takes group n % GROUPS's), stride S both
    ways, TOP and LEFT zeros before x's rows and columns (zeros past them), + BIAS (padded as
    WP's channels)); ACT as jit.ACTIVATION_CODES. x's and out's planes lie XPLANE and OPLANE floats apart (a band of
    rows of larger planes). PHASES: a buffer of zeros, C blocks of QH padded rows of S * QW
    floats; TAPOFF: TAPS int64s, each tap's offset in PHASES from an output's first input."""
    e = Emitter(module, ir, name(stride), FIELDS)
    b, c, loop, when = e.b, e.c, e.loop, e.when
    x, wp, bias, out, n_, c_, h_, w_, m_, oh, ow, top, left, act, phases, qw, qh, taps, tapoff, xplane, oplane, \
        groups = e.fields
    f32, v8, vptr, i64 = e.f32, e.v8, e.vptr, e.i64
    relu, relu6 = b.icmp_signed("==", act, c(1)), b.icmp_signed("==", act, c(2))
    line = b.mul(qw, c(stride))  # a padded row's floats
    chan = b.mul(qh, line)  # a channel's
    rows = e.min(h_, b.sub(qh, top))  # x's rows the taps reach
    panels = b.udiv(b.add(m_, c(MR - 1)), c(MR))
    full = b.mul(b.udiv(ow, c(NV * TILES)), c(NV * TILES))  # columns in whole tiles
    rest = b.sub(ow, full)

    def address(base, index):
        return b.add(base, b.mul(index, c(4)))

    def scalar(base, index, kind=f32):
        at = b.add(base, b.mul(index, c(8 if kind is i64 else 4)))
        return e.load(b.inttoptr(at, kind.as_pointer()), kind)

    def image(n):  # an image's group: its C channels of x, its M of out, its panels of weights
        for_channels = b.mul(n, c_)
        loop(c(0), c_, c(1), lambda ch: e.copy_phases(
            address(x, b.mul(b.add(for_channels, ch), xplane)), address(phases, b.mul(ch, chan)),
            stride, rows, w_, top, left, qw))
        first = b.mul(b.urem(n, groups), panels)  # the group's first panel
        loop(c(0), oh, c(1), lambda i: loop(c(0), panels, c(1), lambda p: panel(n, i, p, b.add(first, p))))

    def panel(n, i, p, packed):  # packed: the panel's index among every group's
        inputs = address(phases, b.mul(b.mul(i, c(stride)), line))  # the output row's first input
        weights = address(wp, b.mul(packed, b.mul(taps, c(MR))))
        shifts = [e.splat(scalar(bias, b.add(b.mul(packed, c(MR)), c(r))), v8) for r in range(MR)]
        channels = [b.add(b.mul(p, c(MR)), c(r)) for r in range(MR)]
        targets = [address(out, b.add(b.mul(b.add(b.mul(n, m_), ch), oplane), b.mul(i, ow))) for ch in channels]

        def tile(j, nv, tail):
            def tap(t, sums):
                start = address(inputs, b.add(scalar(tapoff, t, i64), j))
                values = [e.vector_at(address(start, c(TILES * v))) for v in range(nv)]
                at = address(weights, b.mul(t, c(MR)))
                for r in range(MR):
                    weight = e.splat(scalar(at, c(r)), v8)
                    for v in range(nv):
                        sums[r * nv + v] = b.call(e.fma, [weight, values[v], sums[r * nv + v]])
                return sums
            sums = loop(c(0), taps, c(1), lambda t, s: tap(t, list(s)),
                        carried=[shifts[r] for r in range(MR) for v in range(nv)])
            sums = e.activate(act, sums, relu, relu6)
            for r in range(MR):
                def store(r=r):
                    for v in range(nv):
                        target = address(targets[r], b.add(j, c(TILES * v)))
                        value = sums[r * nv + v]
                        if not tail or v < nv - 1:
                            b.store(value, b.inttoptr(target, vptr)).align = 4
                            continue
                        left_over = b.sub(ow, b.add(j, c(TILES * v)))  # 1 to 8 columns
                        e.store_some(target, value, b.icmp_signed(">=", left_over, c(TILES)), left_over)
                when(b.icmp_signed("<", channels[r], m_), store)

        loop(c(0), full, c(NV * TILES), lambda j: tile(j, NV, False))
        for nv in range(NV, 0, -1):  # the row's last columns: as few vectors as hold them
            more = b.icmp_signed(">", rest, c(TILES * (nv - 1)))
            fits = b.icmp_signed("<=", rest, c(TILES * nv))
            when(b.and_(more, fits), lambda nv=nv: tile(full, nv, True))

    loop(c(0), n_, c(1), image)
    b.ret(c(0))


def suits(channels, kernel_shape, strides, dilations, begin, out_shape, activation, most=MAX_CHANNELS):
    """Whether `bind` takes a conv with these: 1 to `most` input channels (a group's), the
    same stride both ways (1 or 2), zeros before x within the kernel's reach, an activation
    it computes."""
    (kh, kw), (top, left) = kernel_shape, begin[:2]
    (dh, dw) = dilations
    return (1 <= channels <= most and strides[0] == strides[1] and strides[0] in STRIDES
            and 0 <= top < (kh - 1) * dh + 1 and 0 <= left < (kw - 1) * dw + 1 and activation in ACTIVATIONS
            and all(out_shape))


def pack(w, bias, into=None, groups=1):
    """(weights, bias): w (M, C, KH, KW) as panels of MR output channels, a tap's MR weights
    together (ceil(M / MR), C * KH * KW, MR), zeros past M; the bias (or zeros) padded alike;
    with `groups`, each group's M / groups channels so, one group's panels after another's.
    Written into `into` (such a pair) where given."""
    m = w.shape[0] // groups
    panels = -(-m // MR)
    taps = int(np.prod(w.shape[1:]))
    weights, b = into or (np.empty((groups * panels, taps, MR), np.float32), np.zeros(groups * panels * MR, np.float32))
    flat = w.reshape(groups, m, taps)
    if m % MR:  # a group's last panel: zeros past its channels
        flat = np.concatenate([flat, np.zeros((groups, panels * MR - m, taps), w.dtype)], axis=1)
    weights.reshape(groups, panels, taps, MR)[:] = flat.reshape(groups, panels, MR, taps).transpose(0, 1, 3, 2)
    if bias is not None:
        b.reshape(groups, panels * MR)[:, :m] = bias.reshape(groups, m)
    return weights, b


def bind(x, w, bias, out, stride, dilations, begin, activation, rows=None, groups=1):
    """A step writing out (N, M, OH, OW) = act(conv of x (N, C, H, W) by w (M, C / groups,
    KH, KW) in `groups` groups, `stride` 1 or 2 both ways, `dilations`, `begin` the top and
    left zeros (those past x's end follow from OH and OW), + bias (M,) or zeros), float32
    arrays, contiguous; with `rows` (first, last), only out's rows first:last, from the
    rows of x they reach (a worker's band: each copies and sums its own); None where
    native_gemm does not run or the operands do not qualify (`suits`, checked by the
    caller). The kernel runs an image's group as an image of C / groups channels (x's and
    out's channels of a group lie together), with that group's panels of weights."""
    from . import native_gemm
    if not native_gemm.available() or x.ndim != 4 or out.ndim != 4 or w.ndim != 4 \
            or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, w, out)):
        return None
    (n, ch, h, wd), (m, _, kh, kw), (oh, ow) = x.shape, w.shape, out.shape[2:]
    (dh, dw), s = dilations, stride
    if groups < 1 or ch % groups or m % groups or w.shape[1] != ch // groups or out.shape[:2] != (n, m):
        return None
    first, last = rows or (0, oh)
    if not 0 <= first < last <= oh:
        return None
    # The band's rows read padded rows from s * first: x's from there, or zeros above x
    top, start = max(begin[0] - s * first, 0), max(s * first - begin[0], 0)
    weights, b = pack(w, bias, groups=groups)
    ch, m = ch // groups, m // groups  # the kernel's: a group's
    # A padded row holds the columns the tiles read (whole vectors: the last tile's lanes past
    # OW read zeros or the next phase) and x's columns after the left zeros (at stride 2 with
    # the last 16's zeros); the rows, those the taps reach (x's rows past them not copied).
    reach = (kw - 1) * dw // s
    qw = max(-(-ow // TILES) * TILES + reach, begin[1] + wd if s == 1 else (begin[1] + wd) // 2 + TILES + 1)
    qh = max(s * (last - first - 1) + (kh - 1) * dh + 1, top + 1)
    phases = np.zeros((ch, qh, s, qw), np.float32)
    tapoff = np.array([(c * qh + a * dh) * s * qw + (t * dw) % s * qw + (t * dw) // s
                       for c in range(ch) for a in range(kh) for t in range(kw)], np.int64)
    fields = np.zeros(FIELDS, np.int64)
    fields[[X, WP, BIAS, OUT, N, C, H, W, M, OH, OW, TOP, LEFT, ACT, PHASES, QW, QH, TAPS, TAPOFF, XPLANE,
            OPLANE, GROUPS]] = [
        x.ctypes.data + 4 * start * wd, weights.ctypes.data, b.ctypes.data, out.ctypes.data + 4 * first * ow,
        n * groups, ch, max(h - start, 0), wd, m, last - first, ow, top, begin[1], ACTIVATIONS[activation],
        phases.ctypes.data, qw, qh, len(tapoff), tapoff.ctypes.data, h * wd, oh * ow, groups]
    step = native_gemm.step(name(stride), fields, None, (x, weights, b, out, phases, tapoff))
    if not w.flags.writeable and (bias is None or not bias.flags.writeable):
        return step  # a model's constants: packed once

    def repacked():  # variables (a model being trained): packed again before each run
        pack(w, bias, (weights, b), groups)
        step()
    return repacked
