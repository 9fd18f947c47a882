"""Loops compiled by numba, for kernels numpy can only run as several passes.

numpy makes one pass over memory per ufunc: a depthwise conv one multiply-add pass per
tap, a conv's bias and fused activation two more over its output, a layer norm seven over
its input, an exact GELU five. Each loop here makes one pass, keeping what it reuses (a
channel's accumulator, a row of a layer norm) in cache. Softmax stays numpy's: numba's
scalar exp made it 1.3x slower than numpy's SIMD one (benchmarks/bench_jit.py).

numba is optional (the `jit` extra): it is imported on the first bind, never by `import
edgeflow.interp`, and each `bind_*` returns None where numba is absent, disabled
(EDGEFLOW_JIT=0 when the kernel binds) or the operands are not ones its loop takes; the
kernel then runs its numpy path. The loops are plain Python at module level, compiled by
`numba.njit(cache=True)` (no fastmath: the float arithmetic as written) for the argument
types of each bind, at prepare time; later processes load the machine code from numba's
on-disk cache.
"""
import math
import os
import time

import numpy as np

# Fused activation codes of the loops (edgeflow.ops.registry.ACTIVATIONS).
ACTIVATION_CODES = {"": 0, None: 0, "relu": 1, "relu6": 2}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_numba = []
_compiled = {}
# Seconds spent in the first bind of each loop in this process (a compile, or a load from
# numba's cache), and in importing numba ("import numba"): the prepare-time cost of the JIT.
BIND_SECONDS = {}


def loaded():
    """Whether numba is loaded already (a kernel that gains much from it bound first).
    Loops that gain little (a conv's bias and activation, add + activation: 0.7-0.9x of
    numpy's time) run only then: loading numba costs some 0.5 s of a model's first run,
    more than they save in many runs."""
    return bool(_numba) and _numba[0] is not None and available()


def available():
    """Whether JIT loops are used: numba imports and EDGEFLOW_JIT is not "0"."""
    if os.environ.get("EDGEFLOW_JIT", "1") == "0":
        return False
    if not _numba:
        try:
            start = time.perf_counter()
            import numba
            BIND_SECONDS["import numba"] = time.perf_counter() - start
            _numba.append(numba)
        except ImportError:
            _numba.append(None)
    return _numba[0] is not None


def compiled(loop, *args):
    """`loop` compiled (or loaded from numba's cache) for the types of `args`: a callable."""
    numba = _numba[0]
    start = time.perf_counter()
    dispatcher = _compiled.get(loop.__name__)
    if dispatcher is None:
        # nogil: pieces of one op may run on several of the plan's workers at once.
        dispatcher = _compiled[loop.__name__] = numba.njit(cache=True, nogil=True)(loop)
    dispatcher.compile(tuple(numba.typeof(a) for a in args))
    BIND_SECONDS.setdefault(loop.__name__, time.perf_counter() - start)
    return dispatcher


def _takes(*arrays):
    """Floating arrays of one dtype the loops handle (float32, float64)."""
    return all(a.dtype == arrays[0].dtype for a in arrays) and arrays[0].dtype in FLOATS


def _bound(loop, *args):
    """A zero-argument step running the compiled `loop` on `args`."""
    fn = compiled(loop, *args)
    return lambda: fn(*args)


def _rows(a, length):
    """a as a C-contiguous (rows, length) view, or None where that would copy."""
    if not a.flags.c_contiguous:
        return None
    return a.reshape(-1, length)


# -- depthwise convolution ------------------------------------------------------------------

def depthwise_loop(x, w, b, out, sh, sw, top, left, phases, tap_phase, tap_start, acc, act):
    """out (N, C, OH, OW) = act(depthwise conv of x (N, C, H, W) by w (C, taps) + b), one
    channel at a time, in the layout of conv.py's tap runs: the channel is copied into its
    zero-bordered stride phases (`phases`, (sh * sw, QH * QW)), each tap then adds one long
    unit-stride run of its phase, from `tap_start[t]`, into the wide accumulator `acc`
    (OH * QW), and the OW first columns of each wide row go to out with the activation."""
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = out.shape[2], out.shape[3]
    taps = w.shape[1]
    length = acc.shape[0]
    qw = length // oh_
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    for n in range(n_):
        for c in range(c_):
            for i in range(h_):
                src = x[n, c, i]
                row = ((i + top) // sh) * qw
                phase = ((i + top) % sh) * sw
                for px in range(sw):  # input columns first, first + sw, ... land in phase column px
                    first = (px - left) % sw
                    count = (w_ - first + sw - 1) // sw
                    start = row + (first + left) // sw
                    dst = phases[phase + px, start:start + count]
                    if sw == 1:
                        for j in range(count):
                            dst[j] = src[j]
                    else:
                        part = src[first:]
                        for j in range(count):
                            dst[j] = part[j * sw]
            bias = b[c]
            for t in range(taps):
                tap = w[c, t]
                run = phases[tap_phase[t], tap_start[t]:tap_start[t] + length]
                if t == 0:
                    for k in range(length):
                        acc[k] = bias + tap * run[k]
                else:
                    for k in range(length):
                        acc[k] += tap * run[k]
            for i in range(oh_):
                dst = out[n, c, i]
                wide = acc[i * qw:i * qw + ow_]
                if act == 0:
                    for j in range(ow_):
                        dst[j] = wide[j]
                elif act == 1:
                    for j in range(ow_):
                        v = wide[j]
                        dst[j] = zero if v < zero else v
                else:
                    for j in range(ow_):
                        v = wide[j]
                        v = zero if v < zero else v
                        dst[j] = six if v > six else v


def depthwise_layout(x_shape, kernel_shape, strides, dilations, begin, out_shape, dtype):
    """(phases, tap_phase, tap_start, acc) of depthwise_loop: tap (kh, kw) reads phase
    (kh * dh % sh, kw * dw % sw) from row kh * dh // sh, column kw * dw // sw; a phase holds
    every tap's reach and all of x, and one more row for the runs that spill past it."""
    (h, w), (kh_, kw_), (sh, sw), (dh, dw), (top, left), (oh, ow) = \
        x_shape, kernel_shape, strides, dilations, begin, out_shape
    qh = max(oh + (kh_ - 1) * dh // sh, -(-(top + h) // sh)) + 1
    qw = max(ow + (kw_ - 1) * dw // sw, -(-(left + w) // sw))
    taps = [(kh * dh, kw * dw) for kh in range(kh_) for kw in range(kw_)]
    tap_phase = np.array([(a % sh) * sw + b % sw for a, b in taps], np.int64)
    tap_start = np.array([(a // sh) * qw + b // sw for a, b in taps], np.int64)
    return np.zeros((sh * sw, qh * qw), dtype), tap_phase, tap_start, np.empty(oh * qw, dtype)


def bind_depthwise(x, w, bias, out, strides, dilations, begin, activation):
    """A step for a 2-D depthwise conv (group == C == M, one weight per channel and tap),
    or None."""
    if not available() or x.ndim != 4 or w.shape[:2] != (x.shape[1], 1) or out.shape[1] != x.shape[1]:
        return None
    b = np.zeros(x.shape[1], x.dtype) if bias is None else bias
    if not _takes(x, w, b, out) or not all(a.flags.c_contiguous for a in (x, w, b, out)) or not out.size:
        return None
    layout = depthwise_layout(x.shape[2:], w.shape[2:], strides, dilations, begin, out.shape[2:], x.dtype)
    return _bound(depthwise_loop, x, w.reshape(w.shape[0], -1), b, out, *map(int, (*strides, *begin[:2])),
                  *layout, ACTIVATION_CODES[activation])


# -- bias, residual and activation in one pass ----------------------------------------------

def bias_activation_loop(acc, b, out, act):
    """out (N, M, P, Q) = act(acc[:, :, :P, :Q] + b[m]); acc may be out itself. The
    activations are selects that keep NaN, as numpy's maximum and clip do."""
    n_, m_, p_, q_ = out.shape
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    for n in range(n_):
        for m in range(m_):
            bias = b[m]
            for p in range(p_):
                src = acc[n, m, p]
                dst = out[n, m, p]
                if act == 0:
                    for q in range(q_):
                        dst[q] = src[q] + bias
                elif act == 1:
                    for q in range(q_):
                        v = src[q] + bias
                        dst[q] = zero if v < zero else v
                else:
                    for q in range(q_):
                        v = src[q] + bias
                        v = zero if v < zero else v
                        dst[q] = six if v > six else v


def bias_activation_inplace_loop(out, b, act):
    """bias_activation_loop with acc being out: one array, so that LLVM vectorizes the
    loop (its overlap check between two arrays fails, and falls back to scalar code,
    when they are the same)."""
    n_, m_, p_, q_ = out.shape
    zero = out.dtype.type(0)
    six = out.dtype.type(6)
    for n in range(n_):
        for m in range(m_):
            bias = b[m]
            for p in range(p_):
                row = out[n, m, p]
                if act == 0:
                    for q in range(q_):
                        row[q] += bias
                elif act == 1:
                    for q in range(q_):
                        v = row[q] + bias
                        row[q] = zero if v < zero else v
                else:
                    for q in range(q_):
                        v = row[q] + bias
                        v = zero if v < zero else v
                        row[q] = six if v > six else v


def bind_bias_activation(acc, bias, out, activation):
    """A step writing act(acc + bias per channel) to out (N, M, ...), acc being out or a
    wider array holding it in its leading corner (a conv's result), or None."""
    if not loaded() or out.ndim not in (3, 4) or (bias is None and not activation):
        return None
    b = np.zeros(out.shape[1], out.dtype) if bias is None else bias
    if not _takes(acc, b, out):
        return None
    inplace, code = acc is out, ACTIVATION_CODES[activation]
    if not inplace and np.shares_memory(acc, out):
        return None
    if out.ndim == 3:
        acc, out = acc[..., None], out[..., None]
    if inplace:
        return _bound(bias_activation_inplace_loop, out, b, code)
    return _bound(bias_activation_loop, acc, b, out, code)


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
        else:
            for k in range(k_):
                v = ar[k] + br[k]
                v = zero if v < zero else v
                dst[k] = six if v > six else v


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
    if a2 is None or b2 is None or out2 is None:
        return None
    return _bound(add_activation_loop, a2, b2, out2, ACTIVATION_CODES[activation])


# -- recurrences: every time step of one direction in one call -----------------------------
# A step of an LSTM or GRU is one small matrix product and a few gate functions over the
# hidden state: numpy runs some 15 calls per step, each costing more than its work. These
# loops run the whole sequence, the products through numba's BLAS binding (np.dot), the
# gate functions in float64 (a sigmoid as 1 / (1 + exp(-v)): exp overflowing to inf gives
# 0, not NaN).

def lstm_loop(xw, r, h, c, g, y, backward):
    """ONNX LSTM with its default gate functions (sigmoid, tanh, tanh), no peepholes:
    per step t (in reverse when `backward`), g = h @ r + xw[t] (gates i, o, f, c),
    c = f * c + i * tanh(g_c), h = o * tanh(c), y[t] = h."""
    seq, batch = xw.shape[0], xw.shape[1]
    n = h.shape[1]
    for s in range(seq):
        t = seq - 1 - s if backward else s
        np.dot(h, r, g)
        x = xw[t]
        for b in range(batch):
            gb, xb, hb, cb, yb = g[b], x[b], h[b], c[b], y[t, b]
            for k in range(n):
                i = 1.0 / (1.0 + math.exp(-(gb[k] + xb[k])))
                o = 1.0 / (1.0 + math.exp(-(gb[n + k] + xb[n + k])))
                f = 1.0 / (1.0 + math.exp(-(gb[2 * n + k] + xb[2 * n + k])))
                cell = math.tanh(gb[3 * n + k] + xb[3 * n + k])
                ck = f * cb[k] + i * cell
                cb[k] = ck
                hk = o * math.tanh(ck)
                hb[k] = hk
                yb[k] = hk


def gru_loop(xw, r_zr, r_h, rbh, h, zr, hh, rh, y, backward, linear_before_reset):
    """ONNX GRU with its default gate functions (sigmoid, tanh): per step, z and r from
    h @ r_zr + xw[t][:2n]; the candidate from (h @ r_h + rbh) * r (linear_before_reset)
    or (r * h) @ r_h, plus xw[t][2n:]; h = (1 - z) * candidate + z * h; y[t] = h."""
    seq, batch = xw.shape[0], xw.shape[1]
    n = h.shape[1]
    for s in range(seq):
        t = seq - 1 - s if backward else s
        x = xw[t]
        np.dot(h, r_zr, zr)
        for b in range(batch):
            for k in range(2 * n):
                zr[b, k] = 1.0 / (1.0 + math.exp(-(zr[b, k] + x[b, k])))
        if linear_before_reset:
            np.dot(h, r_h, hh)
            for b in range(batch):
                for k in range(n):
                    hh[b, k] = (hh[b, k] + rbh[k]) * zr[b, n + k]
        else:
            for b in range(batch):
                for k in range(n):
                    rh[b, k] = zr[b, n + k] * h[b, k]
            np.dot(rh, r_h, hh)
        for b in range(batch):
            for k in range(n):
                cand = math.tanh(hh[b, k] + x[b, 2 * n + k])
                z = zr[b, k]
                hk = (1 - z) * cand + z * h[b, k]
                h[b, k] = hk
                y[t, b, k] = hk


def bind_recurrence(kind, *args):
    """lstm_loop or gru_loop (`kind`) compiled for `args` as the kernel will pass them
    (their types; the arrays may change between runs), or None: numba absent or
    disabled, or operands its loops do not take (float32 and float64 only)."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    if not available() or not _takes(*arrays):
        return None
    return compiled(lstm_loop if kind == "lstm" else gru_loop, *args)


# -- along the last axis, one row at a time -------------------------------------------------

def layer_norm_loop(x, scale, bias, out, eps):
    """Each row of out (R, K): (x - mean) / sqrt(var + eps) * scale + bias, the statistics
    accumulated in float64 over the row (two passes over it, in cache)."""
    r_, k_ = x.shape
    for r in range(r_):
        xr = x[r]
        dst = out[r]
        total = 0.0
        for k in range(k_):
            total += xr[k]
        mean = total / k_
        sq = 0.0
        for k in range(k_):
            d = xr[k] - mean
            sq += d * d
        inv = 1.0 / math.sqrt(sq / k_ + eps)
        for k in range(k_):
            dst[k] = (xr[k] - mean) * inv * scale[k] + bias[k]


def bind_layer_norm(x, scale, bias, out, axis, eps):
    """A step for layer_norm over axes [axis, rank) with scale and bias of the normalized
    shape (read at each run: they may be variables), or None."""
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
    return _bound(layer_norm_loop, x2, s1[0], b1[0], out2, float(eps))


def gelu_loop(x, out, tanh):
    """out = gelu(x) elementwise, in float64: x / 2 * erfc(-x / sqrt 2), or with
    approximate='tanh' x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3))."""
    for i in range(x.shape[0]):
        v = float(x[i])
        if tanh:
            out[i] = v / (1.0 + math.exp(-1.5957691216057308 * (v + 0.044715 * v * v * v)))
        else:
            out[i] = v / 2 * math.erfc(-v / 1.4142135623730951)  # erfc(-x / sqrt 2): no cancellation


def bind_gelu(x, out, approximate):
    """A step for gelu on a contiguous float array, or None."""
    if not available() or not _takes(x, out) or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    return _bound(gelu_loop, x.reshape(-1), out.reshape(-1), approximate == "tanh")
