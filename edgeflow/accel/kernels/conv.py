"""OpenCL kernels of edgeflow/ops/conv.py (conv.cl): 2-D conv (1-D lifted to H = 1) by a
direct register-tiled kernel, a depthwise one, and a local-memory tiled GEMM for 1x1
stride-1 convs on devices with on-chip local memory; bias and the fused activation
applied on the way out. On CPU devices (gemm.cpu_path) non-depthwise convs instead run
as gemm.cl's register-blocked GEMM: 1x1 stride-1 unpadded ones straight on the input,
others after an im2col kernel fills a columns buffer allocated once per conv at make
time.

`launcher` (a 1-D launch over `total` work-items), `constant_ints` and `too_large` are
shared by the pooling and pad kernels.
"""
import numpy as np

from ...ops.conv import window_geometry, window_params
from . import cl_kernel
from . import gemm
from .elementwise import ACTIVATIONS

TILES = {"CO": 8, "PX": 4, "TILE": 8}  # conv.cl's register and local-memory tiles
# Whether 1x1 convs stage tiles in local memory: None decides by the device, which pays
# off where local memory is on-chip (GPUs); CPU runtimes emulate it in global memory,
# where the direct kernel is faster (PoCL: 2-3x).
LOCAL_TILING = None
# Columns buffers larger than this (floats) run the direct kernel instead of im2col.
MAX_COLUMNS = 2**26


def launcher(rt, kernel, total, *args, group=None, cap=128):
    """A step running `kernel(*args)` over `total` work-items, rounded up to a multiple of
    the work-group size (kernels return past `total`)."""
    if total == 0:
        return lambda: None
    group = group or min(rt.max_group(kernel), cap)
    kernel.set_args(*args)
    size = (-(-total // group) * group,)
    return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))


def constant_ints(rt, values):
    import pyopencl.array as cla
    return cla.to_device(rt.queue, np.array(values, np.int32))


def too_large(ins, outs):
    """Why int32 indices cannot address these arrays, or None."""
    return "more than 2**31 elements" if max(a.size for a in list(ins) + list(outs)) >= 2**31 else None


def _lifted(attrs, x_shape, kernel_shape):
    """(strides, dilations, begin pads, output sizes) as 2-D: a 1-D window gets H = 1."""
    d = len(x_shape) - 2
    strides, dilations, _ = window_params("conv", attrs, d)
    out_shape, begin, _ = window_geometry("conv", x_shape[2:], kernel_shape, attrs)
    lift = (1,) * (2 - d)
    return lift + strides, lift + dilations, (0,) * (2 - d) + begin, lift + out_shape


def _local_tiling(rt):
    if LOCAL_TILING is not None:
        return LOCAL_TILING
    return rt.device.local_mem_type == rt.cl.device_local_mem_type.LOCAL


def _unsupported(attrs, ins, outs):
    if ins[0].ndim not in (3, 4):
        return "3-D convolution (only 1-D and 2-D run on OpenCL)"
    return too_large(ins, outs)


@cl_kernel("conv", unsupported=_unsupported)
def _conv(rt, ins, outs, attrs):
    x, w = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    out, group = outs[0], attrs["group"]
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel_shape = tuple(w.shape[2:])
    (sh, sw), (dh, dw), (ph, pw), (oh, ow) = _lifted(attrs, x.shape, kernel_shape)
    h, wd = ((1,) + x.shape[2:])[-2:]
    kh, kw = ((1,) + kernel_shape)[-2:]
    program = rt.program("conv", **TILES)
    co, px, tile = TILES["CO"], TILES["PX"], TILES["TILE"]
    tail = (np.int32(0 if bias is None else 1), np.int32(ACTIVATIONS[attrs["activation"]]))
    bias_data = (w if bias is None else bias).data
    pointwise = kh == kw == sh == sw == 1 and not (ph or pw) and (oh, ow) == (h, wd)
    if pointwise and _local_tiling(rt):
        kernel = rt.kernel(program, "conv_pointwise")
        if rt.max_group(kernel) >= tile * tile:
            geo = constant_ints(rt, (c, h * wd, m, group))
            blocks = n * group * -(-(m // group) // (tile * co)) * -(-(h * wd) // (tile * px))
            step = launcher(rt, kernel, blocks * tile * tile, x.data, w.data, bias_data, out.data,
                            geo.data, np.int32(0), *tail, group=tile * tile)
            return lambda keep=geo: step()
    geo = constant_ints(rt, (c, h, wd, m, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, group))
    taps, pixels = kh * kw, oh * ow
    if gemm.cpu_path(rt) and not (group == c and group > 1) and (pointwise or n * c * taps * pixels <= MAX_COLUMNS):
        return _conv_gemm(rt, program, geo, x, w, bias, out, n, c, m, group, taps, pixels, pointwise,
                          ACTIVATIONS[attrs["activation"]])
    wtiles = -(-ow // px)
    if group == c and group > 1:
        kernel = rt.kernel(program, "conv_depthwise")
        total = n * m * oh * wtiles
    else:
        kernel = rt.kernel(program, "conv_direct")
        total = n * group * -(-(m // group) // co) * oh * wtiles
    step = launcher(rt, kernel, total, x.data, w.data, bias_data, out.data, geo.data, np.int32(total), *tail)
    return lambda keep=geo: step()


def _conv_gemm(rt, program, geo, x, w, bias, out, n, c, m, group, taps, pixels, pointwise, act):
    """The CPU path: per image and group, out = w @ cols (cols = x when pointwise)."""
    cpg, mpg = c // group, m // group
    depth = cpg * taps  # the GEMM's K
    steps = []
    if pointwise:
        cols = x
    else:
        cols = rt.empty((n * c * taps * pixels,), np.float32)  # reused by every run
        total = cols.size
        steps.append(launcher(rt, rt.kernel(program, "im2col"), total, x.data, cols.data, geo.data,
                              np.int32(total)))
    batch = np.arange(n * group)
    g = batch % group
    table = np.stack([g * mpg * depth, batch * depth * pixels, g * mpg], 1)
    steps.append(gemm.blocked_matmul(rt, w.data, cols.data, out.data, mpg, pixels, depth, table,
                                     bias=None if bias is None else bias.data, act=act))

    def run(keep=(geo, cols)):
        for step in steps:
            step()
    return run
