"""Depthwise convolutions of stride 1 and 2 (3x3, 5x5 and 7x7 kernels, dilation 1) as LLVM IR:
each plane copied inside zeros (its padding; at stride 2 its even and odd columns split
apart by shuffles), then each output row 8 columns a vector, every tap a plain vector load,
the bias and activation applied in registers before a whole store.

jit.py's loops run these a channel at a time over the plane's stride phases, copied one
float at a time (a row of a 28x28 plane is 14 pairs: too short a loop for LLVM to
vectorize), or, on planes narrower than 16 output columns, over blocks of 64 channels laid
channels-last by a gather of one float at a time. MobileNetV2's stride-2 layers took
1.6-3.9x onnxruntime's time in the model at batch 1 (192 channels 28x28 -> 14x14: 152
against 39 us).

Here each plane (image, channel) is copied into PHASES: the padded plane's rows the taps
reach, each as its even columns then its odd ones (16 floats of x a step, split by two
shuffles; a row's last by masked loads), inside zeros written once (the conv's padding).
Output column j's tap t reads column 2j + t of the padded row: phase t % 2, from j + t // 2,
so 8 outputs' tap is one unaligned load. At stride 1 the rows are copied as they are (whole
vectors) and tap t reads from j + t: SAME_3X3_MAX_WIDTH says where that beats jit.py's
depthwise_same_loop, which reads x in place. Each kernel row's taps are a chain of multiply-adds
of its own (K chains, added at the end, with the bias), then the activation (relu, relu6,
swish, hard_swish: native_ir.activate). The last group of a row overlaps the one before
where the row holds 8 or more, so every store is whole; a narrower row (7x7) stores whole
vectors whose last lanes land on the plane's next row (written after), where they would
pass the plane's end 4, 2 and 1 floats.

Planes go in memory order (images outermost: at batch 8, 576 channels 14x14 -> 7x7 took 1.26x
the loops' time a channel's images at a time, 0.56x so). Against the loops, interleaved in
one process, relu6, batch 1 and 8: 96 channels 112x112 -> 56x56 0.70x and 0.84x of their
time, 144 56 -> 28 0.47x and 0.71x (5x5: 0.56x, 0.75x), 192 28 -> 14 0.47x and 0.51x, 576 14 ->
7 0.75x and 0.56x (5x5: 0.77x, 0.72x). Tried first: three vector loads a kernel row and a
group, split by shuffles for every tap (3 a row for 3x3 kernels, 5 for 5x5: shuffles bound
the loop; 0.5-1.0x), and masked loads from x in place, no copy (1.0-1.5x: most groups of
small planes touch an edge). 7x7 kernels (ConvNeXt's, stride 1), their 49 taps' weights kept
where LLVM puts them (more than the 16 registers), against jit.py's loops alone, batch 1: 96
channels at 56x56 0.92x, 192 at 28x28 0.87x, 384 at 14x14 0.45x (0.38x at batch 8), 768 at
7x7 0.61x; convnext_tiny at one thread, both plans in one process: 0.96x (at two, 1.02x:
within this VM's noise).

The functions are compiled into native_gemm's module (native_gemm.available() says whether
they run); jit.bind_depthwise binds them (`bind`) for float32 convs that `suits`.
"""
import numpy as np

from .native_ir import ACTIVATIONS, TILES, Emitter

# Operands of one call (the int64 array the compiled function reads).
X, WT, BIAS, OUT, N, C, H, W, OH, OW, TOP, LEFT, ACT, PHASES, QW = range(15)
FIELDS = 15
KERNELS = (3, 5, 7)  # kernel sizes with a function: depthwise1_3x3, ..., depthwise2_7x7
STRIDES = (1, 2)
# Stride-1 3x3 convs run here on planes at most this wide (output columns); wider ones run
# jit.py's depthwise_same_loop over x in place, with no copy (against it, interleaved, batch
# 1 and 8: 576 channels at 14x14 0.74x and 0.63x, 960 at 7x7 0.93x and 0.97x, 32 at 24x24
# 0.91x and 0.85x, 64 at 20x20 1.0x, 192 at 28x28 1.69x and 1.04x, 32 at 112x112 1.78x and
# 1.52x). 5x5 kernels run here at every width (28x28 0.80-0.89x, 56x56 0.82-0.84x, 112x112
# 0.84-0.97x, 14x14 and 7x7 0.69-0.79x).
SAME_3X3_MAX_WIDTH = 24


def name(k, stride):
    return f"depthwise{stride}_{k}x{k}"


FUNCTIONS = tuple(name(k, s) for s in STRIDES for k in KERNELS)


def emit(module, ir, k, stride):
    """The function depthwiseS_KxK(fields) of one int64 (the address of FIELDS int64s): out (N,
    C, OH, OW) = act(the depthwise conv of x (N, C, H, W) by wt (C, K * K), stride S (1 or 2),
    TOP and LEFT zeros before x's rows and columns (and zeros past them), + bias (C,)); ACT as
    jit.ACTIVATION_CODES. PHASES: a buffer of zeros, S (OH - 1) + K rows of the padded plane
    (at stride 2 each as its even columns then its odd ones), QW floats each (its zeros, the
    padding, stay: each plane is copied inside them)."""
    e = Emitter(module, ir, name(k, stride), FIELDS)
    b, c, loop = e.b, e.c, e.loop
    x, wt, bias, out, n_, c_, h_, w_, oh, ow, top, left, act, phases, qw = e.fields
    f32, v8 = e.f32, e.v8
    fptr = f32.as_pointer()
    relu, relu6 = b.icmp_signed("==", act, c(1)), b.icmp_signed("==", act, c(2))
    # Groups of 8 columns from the row's start; where OW >= 8 the last ends at the row's end.
    last = b.select(b.icmp_signed(">=", ow, c(TILES)), b.sub(ow, c(TILES)), c(0))
    reach = b.add(b.mul(b.sub(oh, c(1)), c(stride)), c(k))  # the padded rows the taps read
    line_floats = b.mul(qw, c(stride))  # a padded row's floats in PHASES
    rows = e.min(h_, b.sub(reach, top))  # x's rows copied

    def address(base, index):
        return b.add(base, b.mul(index, c(4)))

    def scalar(base, index):
        return e.load(b.inttoptr(address(base, index), fptr), f32)

    def plane_of(n, ch):
        """Image n's channel ch."""
        taps = [e.splat(scalar(wt, b.add(b.mul(ch, c(k * k)), c(t))), v8) for t in range(k * k)]
        shift = e.splat(scalar(bias, ch), v8)
        plane = b.add(b.mul(n, c_), ch)
        e.copy_phases(address(x, b.mul(plane, b.mul(h_, w_))), phases, stride, rows, w_, top, left, qw)
        target_plane = address(out, b.mul(plane, b.mul(oh, ow)))

        def group(i, j):
            j0 = e.min(j, last)
            sums = []
            for r in range(k):  # a chain of multiply-adds a kernel row
                line = address(phases, b.mul(b.add(b.mul(i, c(stride)), c(r)), line_floats))
                acc = None
                for t in range(k):  # column 2 j + t: phase t % 2, from j + t // 2 (stride 1: j + t)
                    at = b.add(j0, c(t)) if stride == 1 else b.add(b.mul(c(t % 2), qw), b.add(j0, c(t // 2)))
                    value = e.vector_at(address(line, at))
                    acc = b.fmul(taps[r * k + t], value) if acc is None else b.call(e.fma, [taps[r * k + t], value, acc])
                sums.append(acc)
            total = b.fadd(shift, sums[0])
            for acc in sums[1:]:
                total = b.fadd(total, acc)
            value = e.activate(act, [total], relu, relu6)[0]
            target = address(target_plane, b.add(b.mul(i, ow), j0))
            # Whole where the row holds 8, or where the lanes past it land on the plane's
            # next rows (written after)
            spill_inside = b.icmp_signed("<=", b.add(b.mul(i, ow), c(TILES)), b.mul(oh, ow))
            e.store_some(target, value, b.or_(b.icmp_signed(">=", ow, c(TILES)), spill_inside), ow)
        loop(c(0), oh, c(1), lambda i: loop(c(0), ow, c(TILES), lambda j: group(i, j)))
    loop(c(0), n_, c(1), lambda n: loop(c(0), c_, c(1), lambda ch: plane_of(n, ch)))
    b.ret(c(0))


def suits(x_shape, kernel_shape, strides, dilations, begin, out_shape, activation):
    """Whether `bind` takes a depthwise conv of these: stride 1 or 2 (both ways; stride-1 3x3
    ones on planes up to SAME_3X3_MAX_WIDTH), dilation 1, a 3x3, 5x5 or 7x7 kernel, padding inside
    the kernel's reach, an activation it computes."""
    (kh, kw), (top, left) = kernel_shape, begin[:2]
    return (strides[0] == strides[1] and strides[0] in STRIDES and tuple(dilations) == (1, 1) and kh == kw
            and kh in KERNELS and (strides[0] == 2 or kh > 3 or out_shape[1] <= SAME_3X3_MAX_WIDTH)
            and 0 <= top < kh and 0 <= left < kw and activation in ACTIVATIONS and all(out_shape))


def bind(x, w, bias, out, stride, begin, activation):
    """A step writing out (N, C, OH, OW) = act(depthwise conv of x (N, C, H, W) by w (C, 1, K,
    K), `stride` 1 or 2, `begin` the top and left zeros (those past x's end follow from OH and OW),
    + bias (C,) or zeros), float32 arrays, contiguous; None where native_gemm does not run
    or the operands do not qualify (`suits`, checked by the caller)."""
    from . import native_gemm
    if not native_gemm.available() or x.ndim != 4 or out.ndim != 4 \
            or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, w, out)):
        return None
    (n, ch, h, wd), k, (oh, ow) = x.shape, w.shape[2], out.shape[2:]
    if w.shape != (ch, 1, k, k) or out.shape[:2] != (n, ch):
        return None
    wt = np.ascontiguousarray(w.reshape(ch, k * k))
    b = np.zeros(ch, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(ch)
    # a phase row: the groups' reach (the last from max(OW, 8) - 8, taps to K - 1 floats past
    # it; at stride 2 to (K - 1) / 2 floats past it in either phase), and x's columns after
    # the left zeros (at stride 2 with the last 16's zeros); the rows the taps reach
    if stride == 1:
        qw = max(max(ow, TILES) + k - 1, begin[1] + wd)
    else:
        qw = max(max(ow, TILES) + (k - 1) // 2, (begin[1] + wd) // 2 + TILES + 1)
    phases = np.zeros((max(stride * (oh - 1) + k, begin[0] + 1), stride, qw), np.float32)
    fields = np.zeros(FIELDS, np.int64)
    fields[[X, WT, BIAS, OUT, N, C, H, W, OH, OW, TOP, LEFT, ACT, PHASES, QW]] = [
        x.ctypes.data, wt.ctypes.data, b.ctypes.data, out.ctypes.data, n, ch, h, wd, oh, ow, *begin[:2],
        ACTIVATIONS[activation], phases.ctypes.data, qw]
    return native_gemm.step(name(k, stride), fields, None, (x, wt, b, out, phases))
