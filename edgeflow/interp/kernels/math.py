"""Kernels of edgeflow/ops/math.py."""
from functools import partial

import numpy as np

from ... import dtypes
from .. import threads
from . import jit, kernel
from .fused import with_activation


def _ufunc(fn):
    """The kernel of an elementwise op that numpy ufunc `fn` computes."""
    def make(ins, outs, attrs):
        return jit.bind_binary(fn, ins, outs[0]) or threads.elementwise(fn, ins, outs[0]) \
            or partial(fn, *ins, out=outs[0])
    return make


for _name, _fn in (("sub", np.subtract), ("mul", np.multiply),
                   ("maximum", np.maximum), ("minimum", np.minimum),
                   ("neg", np.negative), ("abs", np.absolute), ("exp", np.exp), ("log", np.log),
                   ("sqrt", np.sqrt), ("tanh", np.tanh), ("equal", np.equal), ("less", np.less),
                   ("greater", np.greater), ("less_equal", np.less_equal),
                   ("greater_equal", np.greater_equal), ("sin", np.sin), ("cos", np.cos), ("tan", np.tan),
                   ("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan), ("sinh", np.sinh),
                   ("cosh", np.cosh), ("asinh", np.arcsinh), ("acosh", np.arccosh), ("atanh", np.arctanh),
                   ("floor", np.floor), ("ceil", np.ceil), ("round", np.rint), ("sign", np.sign),
                   ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                   ("logical_xor", np.logical_xor), ("logical_not", np.logical_not), ("is_nan", np.isnan),
                   ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                   ("bitwise_xor", np.bitwise_xor), ("bitwise_not", np.invert)):
    kernel(_name)(_ufunc(_fn))


def _cube(x, out):
    np.multiply(x, x, out=out)
    np.multiply(out, x, out=out)


# Constant exponents that run as products, as onnxruntime's Pow runs them (x * x, x * x * x):
# numpy's power calls powf for each element, some 30 ns: GPT-2's tanh GELU cubes its
# (batch, sequence, 3072) activations in every layer, at 1024 tokens 3.1M elements, ~95 ms.
_PRODUCTS = {2.0: np.square, 3.0: _cube}


@kernel("pow")
def _pow(ins, outs, attrs):
    a, b = ins
    out = outs[0]
    product = _PRODUCTS.get(float(b.reshape(-1)[0])) if b.size == 1 and not b.flags.writeable else None
    if product is None or a.dtype.kind != "f" or out.shape != a.shape or out.dtype != a.dtype \
            or np.shares_memory(a, out):
        return _ufunc(np.power)(ins, outs, attrs)
    return threads.elementwise(product, [a], out) or partial(product, a, out=out)


@kernel("is_inf")
def _is_inf(ins, outs, attrs):
    x, y = ins[0], outs[0]
    tests = [t for t, on in ((np.isposinf, attrs["detect_positive"]), (np.isneginf, attrs["detect_negative"])) if on]

    def run():
        y[...] = False
        for test in tests:
            np.logical_or(y, test(x), out=y)
    return run


@kernel("mod")
def _mod(ins, outs, attrs):
    return partial(np.fmod if attrs["fmod"] else np.mod, *ins, out=outs[0])


@kernel("bit_shift")
def _bit_shift(ins, outs, attrs):
    y, left = outs[0], attrs["left"]
    bits, unsigned = np.iinfo(y.dtype).bits, np.dtype(f"u{y.dtype.itemsize}")

    def run():
        a, b = (np.ascontiguousarray(v) for v in np.broadcast_arrays(*ins))
        valid = (b >= 0) & (b < bits)
        shift = np.where(valid, b, 0).astype(unsigned)
        if left:
            shifted, beyond = np.left_shift(a.view(unsigned), shift).view(y.dtype), 0
        else:
            shifted, beyond = np.right_shift(a, shift.astype(a.dtype)), np.where(a < 0, -1, 0)
        np.copyto(y, np.where(valid, shifted, beyond), casting="unsafe")
    return run


def _truncating_divide(a, b, out):
    # Integer division rounds toward zero (C, ONNX), not toward -inf as numpy's // does.
    np.floor_divide(a, b, out=out)
    out += (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))


@kernel("add")
def _add(ins, outs, attrs):
    """With an activation, jit.py's one pass (add_activation_loop) unless the workers split
    the add (jit.bind_binary's pieces, or numpy's add in pieces; then the activation's pass)."""
    split = jit.bind_binary(np.add, ins, outs[0]) or threads.elementwise(np.add, ins, outs[0])
    fused = None if split else jit.bind_add_activation(*ins, outs[0], attrs["activation"])
    return fused or with_activation(split or partial(np.add, *ins, out=outs[0]), attrs["activation"], outs[0])


@kernel("div")
def _div(ins, outs, attrs):
    if outs[0].dtype in dtypes.FLOATS:
        return partial(np.true_divide, *ins, outs[0])
    return partial(_truncating_divide, *ins, outs[0])


def _sigmoid(x, out):
    # 1 / (1 + exp(-x)); exp overflow gives inf and then exactly 0, which is right.
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


@kernel("sigmoid")
def _sigmoid_kernel(ins, outs, attrs):
    return jit.bind_activation("sigmoid", ins[0], outs[0], attrs) or partial(_sigmoid, ins[0], outs[0])


def _where(cond, x, y, out):
    np.copyto(out, y)
    np.copyto(out, x, where=cond)


@kernel("where", bfloat16="bits")
def _where_kernel(ins, outs, attrs):
    return jit.bind_where(*ins, outs[0]) or partial(_where, *ins, outs[0])


@kernel("cast", bfloat16="as_is")
def _cast(ins, outs, attrs):
    x, y = ins[0], outs[0]
    if y.dtype == dtypes.bfloat16 != x.dtype:
        return partial(dtypes.narrow, x, y)
    if x.dtype == dtypes.bfloat16 != y.dtype:
        return lambda: np.copyto(y, dtypes.widen(x), casting="unsafe")
    return partial(np.copyto, y, x, casting="unsafe")


def _bitcast(x, out):
    np.copyto(out, x.view(out.dtype))  # same width: the view has x's shape


@kernel("bitcast", bfloat16="as_is")
def _bitcast_kernel(ins, outs, attrs):
    return partial(_bitcast, ins[0], outs[0])


def _det(x, out):
    # numpy's LU routines take float32 and float64: float16 goes through float32.
    np.copyto(out, np.linalg.det(x.astype(np.float32) if x.dtype == np.float16 else x), casting="unsafe")


@kernel("det")
def _det_kernel(ins, outs, attrs):
    return partial(_det, ins[0], outs[0])


@kernel("matmul")
def _matmul(ins, outs, attrs):
    a, b = ins
    if attrs["transpose_a"] and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"] and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    out = result = outs[0]
    fused = matmul_epilogue(ins, out, attrs, activation=attrs["activation"])
    if fused is not None:
        return fused
    if b.ndim == 2 and a.ndim > 2 and a.size and out.size:
        # One product of stacked rows: numpy would run one per leading index ((128, 1, 256)
        # @ (256, 768) as 128 vector products, 2.5x slower).
        rows, flat = _view(a, (-1, a.shape[-1])), _view(out, (-1, out.shape[-1]))
        if rows is not None and flat is not None:
            a, out = rows, flat
    return with_activation(split_matmul(a, b, out) or partial(np.matmul, a, b, out=out), attrs["activation"], result)


# Panels of 4 rows a worker from which matmul_epilogue's product splits its rows, not its
# columns: every worker then reads all the packed weights (in cache: each weight serves 32
# rows or more) but only its own rows of a, and writes whole rows of out. 2 workers, alone:
# an LSTM's input projections, 512 x 128 @ 128 x 1024 1.06-1.57 -> 0.92-0.96 ms (one thread
# 1.90) and 512 x 256 @ 256 x 1024 2.08-3.15 -> 1.80-1.86 (3.67); against onnxruntime,
# alternating processes, the BERT-like encoder at batch 8 0.98x and 1.01x -> 0.89x and
# 0.88x, at batch 1 0.91-0.99x -> 0.88-0.95x, lstm2 at batch 8 1.23x (three runs) ->
# 1.12-1.24x, at batch 1 0.73-0.79x -> 0.69-0.73x. Fewer rows keep the columns apart: each
# worker then reads half the weights, which a few rows use too little to be worth reading
# twice.
ROWS_APART_PANELS = 8


def matmul_epilogue(ins, out, attrs, bias=None, residual=None, activation=""):
    """A step writing act(a @ w + bias [+ residual]) to `out` for a matmul by constant float32
    weights w (K, N) (transpose_b: w.T), in the product's own pass (native_gemm.bind_rows:
    w packed once in strips of columns, a's rows read in place; over the plan's workers,
    rows apart where each gets ROWS_APART_PANELS panels or more, else columns apart in whole
    strips where there are enough, else rows), or None where it does
    not run: numba not loaded (a plan keeping its first run short, as conv_epilogue), w or
    the bias variables (packed once here), a transposed, shapes native_gemm leaves to BLAS
    (native_gemm.suits_rows), or rows that are not one matrix's. bias: N values along the
    last axis; residual: out's shape; activation one of native_gemm.ACTIVATIONS."""
    from . import native_gemm
    a, w = ins
    if not jit.loaded() or attrs["transpose_a"] or w.ndim != 2 or a.ndim < 2 or w.flags.writeable \
            or activation not in native_gemm.ACTIVATIONS or a.dtype != np.float32 or w.dtype != np.float32 \
            or out.dtype != np.float32:
        return None
    if bias is not None and (bias.flags.writeable or bias.dtype != np.float32 or bias.size != out.shape[-1]):
        return None
    k, n = (w.shape[::-1] if attrs["transpose_b"] else w.shape)
    rows, flat = _view(a, (-1, k)), _view(out, (-1, n))
    res = None if residual is None else _view(residual, (-1, n))
    if rows is None or flat is None or (residual is not None and (res is None or residual.shape != out.shape)):
        return None
    workers = threads.current()
    split = workers is not None and 2 * rows.shape[0] * k * n >= threads.MIN_FLOPS
    if not native_gemm.suits_rows(rows.shape[0], k, n) or not native_gemm.available():
        return None
    if np.may_share_memory(flat, rows):
        return None  # the plan placed the chain's output over a, which the pass still reads
    vector = None if bias is None else bias.reshape(-1)
    everything = slice(None)

    def product(lines, columns):
        first, last = columns.indices(n)[:2]
        packed = native_gemm.pack_columns_constant(w, vector, first, last, attrs["transpose_b"])
        return native_gemm.bind_rows(packed, rows[None, lines], flat[None, lines, columns], activation,
                                     None if res is None else res[None, lines, columns])
    strips, panels = -(-n // native_gemm.NR), -(-rows.shape[0] // native_gemm.MR)
    if not split:
        parts = [product(everything, everything)]
    elif panels < ROWS_APART_PANELS * workers.n and strips >= 2 * workers.n:
        # columns apart, in whole strips: each worker packs and reads its own
        parts = [product(everything, slice(i * native_gemm.NR, min(j * native_gemm.NR, n)))
                 for i, j in threads.pieces(strips, workers.n)]
    else:  # rows apart, whole panels
        parts = [product(slice(i * native_gemm.MR, min(j * native_gemm.MR, rows.shape[0])), everything)
                 for i, j in threads.pieces(panels, workers.n)]
    if None in parts:
        return None
    return parts[0] if len(parts) == 1 else workers.split(parts)


def _view(a, shape):
    """a reshaped to `shape` as a view of its memory, or None where that would copy."""
    r = a.reshape(shape)
    return r if np.shares_memory(r, a) else None


def _stacked_axis(batch, n):
    """The first of a stacked product's leading axes that splits evenly enough over n
    workers (a multiple of n, or 4n or more), or None. BERT's attention scores, 4 heads of
    128x64 @ 64x128, 2 threads: 129 us whole, 102-110 by heads, 112-119 by rows, 141-179 by
    columns."""
    return next((k for k, d in enumerate(batch) if d >= n and (d % n == 0 or d >= 4 * n)), None)


def _along(x, axis, i, j):
    """x[i:j] along `axis` (negative: from the right, numpy's broadcasting alignment), or x
    whole where it has no such axis or broadcasts along it."""
    if x.ndim < -axis or x.shape[axis] == 1:
        return x
    return x[(Ellipsis, slice(i, j)) + (slice(None),) * (-axis - 1)]


def split_matmul(a, b, out):
    """A step computing a @ b into `out` in pieces on the plan's workers (a stack of
    products by whole matrices where it splits evenly: `_stacked_axis`; else rows of the
    product where it has threads.ROWS_FIRST or too few columns, else its columns), or None:
    one thread, or too little work."""
    workers = threads.current()
    flops = 2 * out.size * a.shape[-1]
    if workers is None or a.ndim < 2 or b.ndim < 2 or flops < threads.MIN_FLOPS:
        return None
    rows, columns = out.shape[-2], out.shape[-1]
    native = workers.native is not None and a.dtype == b.dtype == out.dtype == np.float32  # sgemv's rows
    if 1 in (rows, columns) and flops < (threads.NATIVE_VECTOR_MIN_FLOPS if native else threads.VECTOR_MIN_FLOPS):
        return None
    wide = columns >= threads.MIN_COLUMNS * workers.n
    stacked = _stacked_axis(out.shape[:-2], workers.n)
    if stacked is not None:  # whole matrices a worker: no operand read by both, no narrow blocks
        parts = [partial(np.matmul, *(_along(x, stacked - out.ndim, i, j) for x in (a, b)),
                         out=_along(out, stacked - out.ndim, i, j))
                 for i, j in threads.pieces(out.shape[stacked], workers.n)]
    elif rows >= 4 * workers.n and (rows >= threads.ROWS_FIRST or not wide):
        parts = [partial(np.matmul, a[..., i:j, :], b, out=out[..., i:j, :])
                 for i, j in threads.pieces(rows, workers.n)]
    elif wide:
        parts = [partial(np.matmul, a, b[..., :, i:j], out=out[..., :, i:j])
                 for i, j in threads.pieces(columns, workers.n, threads.MIN_COLUMNS)]
    else:
        return None
    return workers.split(parts)
