"""OpenCL kernels of edgeflow/ops/math.py: binary and unary elementwise math (elementwise.cl),
comparisons (compare.cl), matmul (gemm.cl), where and cast (nn.cl)."""
import numpy as np

from . import cl_kernel, elementwise, gemm, tensor_dtype
from .elementwise import ACTIVATIONS, broadcast_strides
from .layout import ALIGNED, geometry, merge_dims, per_element, sizes_supported, word_of, words_supported

BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
UNARY = ("neg", "abs", "exp", "log", "sqrt", "sigmoid", "tanh")


def _binary(name):
    def make(rt, ins, outs, attrs):
        return elementwise.binary(rt, name, ins, outs[0], attrs.get("activation", ""))
    return make


def _unary(name):
    def make(rt, ins, outs, attrs):
        return elementwise.unary(rt, name, ins[0], outs[0])
    return make


for _name in BINARY:
    cl_kernel(_name, unsupported=elementwise.rank_supported)(_binary(_name))
for _name in UNARY:
    cl_kernel(_name)(_unary(_name))


# -- comparisons: float32, int32 or bool operands, a bool (uchar) result; gradient graphs
# feed these to `where`.

COMPARISONS = {"equal": 0, "less": 1, "greater": 2, "less_equal": 3, "greater_equal": 4}
TYPES = {np.dtype(np.float32): "float", np.dtype(np.int32): "int", np.dtype(np.bool_): "uchar"}


def _operands(dtype):
    """compare.cl's defines for operands held as `dtype` on the device (floats may be half-stored)."""
    return {"FLOAT": 1} if dtype.kind == "f" else {"FLOAT": 0, "T": TYPES[dtype]}


def _compare_unsupported(attrs, ins, outs):
    if ins[0].dtype not in TYPES:
        return f"dtype {ins[0].dtype} (comparisons take float32, int32 or bool)"
    return None if len(outs[0].shape) <= 8 else "rank above 8"


def _compare(name):
    def make(rt, ins, outs, attrs):
        import pyopencl.array as cla
        a, b = ins
        out = outs[0]
        shape = out.shape or (1,)
        n = int(out.size)
        tables = [cla.to_device(rt.queue, t) for t in (np.array(shape, np.int32), broadcast_strides(a.shape, shape),
                                                       broadcast_strides(b.shape, shape))]
        program = rt.program("compare", OP=COMPARISONS[name], **_operands(a.dtype))
        kernel = rt.kernel(program, "compare")
        group = min(rt.max_group(kernel), 256)
        kernel.set_args(a.data, b.data, out.data, np.int32(n), np.int32(len(shape)), *(t.data for t in tables))
        size = (-(-n // group) * group,)
        return lambda keep=tables: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))
    return make


for _name in COMPARISONS:
    cl_kernel(_name, unsupported=_compare_unsupported, int_inputs=True)(_compare(_name))


# -- matmul

def _matmul_unsupported(attrs, ins, outs):
    if any(a.ndim == 0 for a in ins):
        return "scalar operand"
    return sizes_supported(list(ins) + list(outs))


@cl_kernel("matmul", unsupported=_matmul_unsupported)
def _matmul(rt, ins, outs, attrs):
    a, b = ins
    out = outs[0]
    ta = bool(attrs["transpose_a"]) and a.ndim >= 2
    tb = bool(attrs["transpose_b"]) and b.ndim >= 2
    sa = a.shape if a.ndim >= 2 else (1,) + a.shape
    sb = b.shape if b.ndim >= 2 else b.shape + (1,)
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    batch_shape = np.broadcast_shapes(sa[:-2], sb[:-2])
    table = gemm.batch_offsets(sa[:-2], sb[:-2], batch_shape, m * k, k * n)
    batches = len(table)
    if 0 in (m, n, batches):
        return lambda: None
    act = ACTIVATIONS[attrs.get("activation", "")]
    if gemm.cpu_path(rt):
        table = np.concatenate([table, np.zeros((batches, 1), np.int32)], 1)
        return gemm.blocked_matmul(rt, a.data, b.data, out.data, m, n, k, table, ta, tb, act=act)
    import pyopencl.array as cla
    offsets = cla.to_device(rt.queue, table)
    kernel, tile, per_item = gemm.matmul_kernel(rt)
    side = tile // per_item
    kernel.set_args(a.data, b.data, out.data, np.int32(m), np.int32(n), np.int32(k), offsets.data,
                    np.int32(ta), np.int32(tb), np.int32(act))
    grid = (-(-n // tile) * side, -(-m // tile) * side, batches)

    def run(keep=offsets):  # the step owns the offsets buffer
        rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, grid, (side, side, 1))
    return run


# -- where and cast

def _where_unsupported(attrs, ins, outs):
    return words_supported(attrs, ins[1:], outs)


@cl_kernel("where", unsupported=_where_unsupported, int_inputs=True)
def _where(rt, ins, outs, attrs):
    out = outs[0]
    shape = out.shape or (1,)
    strides = [list(broadcast_strides(a.shape, shape)) for a in ins]
    dims, merged = merge_dims(list(shape), *strides)
    geo = geometry(rt, dims, *merged)
    n = int(out.size)
    return per_element(rt, "where_select", n, *(a.data for a in ins), out.data, np.int32(n),
                       np.int32(len(dims)), geo.data, keep=geo, word=word_of(out))


CASTS = {(np.dtype(np.float32), np.dtype(np.int32)): "cast_to_int",
         (np.dtype(np.int32), np.dtype(np.float32)): "cast_to_float",
         (np.dtype(np.bool_), np.dtype(np.float32)): "bool_to_float"}


def _cast_unsupported(attrs, ins, outs):
    pair = (ins[0].dtype, outs[0].dtype)
    if pair not in CASTS and not (pair[0] == pair[1] and pair[0] in ALIGNED):
        return f"cast {pair[0]} -> {pair[1]} (float32 <-> int32 and bool -> float32 only)"
    return None


@cl_kernel("cast", unsupported=_cast_unsupported, int_inputs=True)
def _cast(rt, ins, outs, attrs):
    x, out = ins[0], outs[0]
    n = int(out.size)
    if x.dtype == out.dtype:
        return per_element(rt, "copy_block", n, x.data, out.data, np.int32(1), np.int32(n), np.int32(n),
                           np.int32(0), word=word_of(x))
    return per_element(rt, CASTS[(tensor_dtype(x), tensor_dtype(out))], n, x.data, out.data, np.int32(n))
