"""OpenCL kernels of edgeflow/ops/conv.py (conv.cl): 2-D conv (1-D lifted to H = 1) by a
direct register-tiled kernel, a depthwise one, and a local-memory tiled GEMM for 1x1
stride-1 convs on devices with on-chip local memory; bias and the fused activation
applied on the way out. On CPU devices (gemm.cpu_path) non-depthwise convs instead run
as gemm.cl's register-blocked GEMM: 1x1 stride-1 unpadded ones straight on the input,
others after window.cl's im2col fills a columns buffer allocated once per conv at make
time; depthwise convs run window.cl's row kernel. window.cl's kernels are built per
geometry (every size a -D constant: PoCL vectorizes only straight-line work-item code,
and divides by run-time values in tens of cycles), launched over exact ranges whose
work-groups `fixed_range` sizes for the device's compute units.

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
# The CPU path's depthwise kernel keeps a padded input row in private memory: rows longer
# than this (floats) take the run-time-geometry kernel.
MAX_FIXED_ROW = 1024


def launcher(rt, kernel, total, *args, group=None, cap=128):
    """A step running `kernel(*args)` over `total` work-items, rounded up to a multiple of
    the work-group size (kernels return past `total`)."""
    if total == 0:
        return lambda: None
    group = group or min(rt.max_group(kernel), cap)
    kernel.set_args(*args)
    size = (-(-total // group) * group,)
    return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, (group,))


# The CPU path's work-groups: about this many work-items each, and at least GROUPS_PER_UNIT
# groups per compute unit where the work allows (PoCL runs a work-group as one loop on one
# thread: tiny groups cost their scheduling, too few leave threads idle).
CPU_GROUP_ITEMS = 128
GROUPS_PER_UNIT = 4


def fixed_range(rt, dims):
    """(global, local) sizes over `dims` exactly (the window.cl kernels' ranges): each local
    size divides its dimension, so no work-item falls outside; their product is at most
    CPU_GROUP_ITEMS, and less where that leaves under GROUPS_PER_UNIT groups per compute
    unit."""
    dims = tuple(max(int(d), 1) for d in dims)
    total = int(np.prod(dims))
    units = max(rt.device.max_compute_units, 1)
    budget = max(1, min(CPU_GROUP_ITEMS, rt.device.max_work_group_size, total // (GROUPS_PER_UNIT * units)))
    local = []
    for d, cap in zip(dims, rt.device.max_work_item_sizes):
        size = max(k for k in range(1, min(d, budget, cap) + 1) if d % k == 0)
        local.append(size)
        budget //= size
    return dims, tuple(local)


def fixed_step(rt, kernel, dims, *args):
    """A step running window.cl's `kernel(*args)` over `dims` (fixed_range's sizes)."""
    size, group = fixed_range(rt, dims)
    kernel.set_args(*args)
    return lambda: rt.cl.enqueue_nd_range_kernel(rt.queue, kernel, size, group)


FIXED_KINDS = {"im2col_fixed": 1, "depthwise_fixed": 2, "max_pool_fixed": 3, "avg_pool_fixed": 4}


def fixed_kernel(rt, name, **geometry):
    """window.cl's kernel `name`, built for one geometry (G* defines; see its header)."""
    defines = {k: int(v) for k, v in geometry.items()}
    return rt.kernel(rt.program("window", KIND=FIXED_KINDS[name], **defines), name)


def constant_ints(rt, values):
    import pyopencl.array as cla
    return cla.to_device(rt.queue, np.array(values, np.int32))


def gradient_step(rt, name, out, geometry, *buffers, extra=()):
    """A step running backprop.cl's kernel `name` over every element of `out`: its args are
    `buffers` (device arrays), the geometry table (ints), the element count, `extra`."""
    geo = constant_ints(rt, geometry)
    total = int(out.size)
    step = launcher(rt, rt.kernel(rt.program("backprop", INDEX="int"), name), total,
                    *(b.data for b in buffers), geo.data, np.int32(total), *(np.int32(e) for e in extra))
    return lambda keep=geo: step()  # the table lives as long as the step


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
    taps, pixels = kh * kw, oh * ow
    if gemm.cpu_path(rt) and not (group == c and group > 1) and (pointwise or n * c * taps * pixels <= MAX_COLUMNS):
        fixed = dict(GC=c, GH=h, GW=wd, GOH=oh, GOW=ow, GKH=kh, GKW=kw, GSH=sh, GSW=sw, GDH=dh, GDW=dw,
                     GPH=ph, GPW=pw)
        return _conv_gemm(rt, fixed, x, w, bias, out, n, c, m, group, taps, pixels, pointwise,
                          ACTIVATIONS[attrs["activation"]])
    depthwise = group == c and group > 1
    if depthwise and gemm.cpu_path(rt) and (ow - 1) * sw + (kw - 1) * dw + 1 <= MAX_FIXED_ROW:
        kernel = fixed_kernel(rt, "depthwise_fixed", GC=c, GH=h, GW=wd, GM=m, GOH=oh, GOW=ow, GKH=kh, GKW=kw,
                              GSH=sh, GSW=sw, GDH=dh, GDW=dw, GPH=ph, GPW=pw,
                              ACT=ACTIVATIONS[attrs["activation"]], HAS_BIAS=bias is not None)
        rows = n * m * oh
        return fixed_step(rt, kernel, (rows,), x.data, w.data, bias_data,
                          out.data, np.int32(rows))
    geo = constant_ints(rt, (c, h, wd, m, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, group))
    wtiles = -(-ow // px)
    if depthwise:
        kernel = rt.kernel(program, "conv_depthwise")
        total = n * m * oh * wtiles
    else:
        kernel = rt.kernel(program, "conv_direct")
        total = n * group * -(-(m // group) // co) * oh * wtiles
    step = launcher(rt, kernel, total, x.data, w.data, bias_data, out.data, geo.data, np.int32(total), *tail)
    return lambda keep=geo: step()


def _conv_gemm(rt, fixed, x, w, bias, out, n, c, m, group, taps, pixels, pointwise, act):
    """The CPU path: per image and group, out = w @ cols (cols = x when pointwise), cols
    filled by window.cl's im2col_fixed (`fixed`: its geometry)."""
    cpg, mpg = c // group, m // group
    depth = cpg * taps  # the GEMM's K
    steps = []
    if pointwise:
        cols = x
    else:
        cols = rt.empty((n * c * taps * pixels,), np.float32)  # reused by every run
        kernel = fixed_kernel(rt, "im2col_fixed", **fixed)
        steps.append(fixed_step(rt, kernel, (fixed["GOW"], fixed["GOH"], n * c * taps), x.data, cols.data))
    batch = np.arange(n * group)
    g = batch % group
    table = np.stack([g * mpg * depth, batch * depth * pixels, g * mpg], 1)
    steps.append(gemm.blocked_matmul(rt, w.data, cols.data, out.data, mpg, pixels, depth, table,
                                     bias=None if bias is None else bias.data, act=act))

    if len(steps) == 1:
        return steps[0]
    first, second = steps

    def run(keep=cols):
        first()
        second()
    return run


def _conv_grad_unsupported(attrs, ins, outs):
    if outs[0].ndim != 4:
        return "1-D and 3-D convolution gradients (only 2-D runs on OpenCL)"
    if any(a.dtype != np.float32 for a in list(ins[:2]) + list(outs)):
        return "non-float32 gradients"
    return too_large(ins, outs)


def _conv_grad_geometry(attrs, x_shape, w_shape, dy_shape):
    """backprop.cl's geometry table of the forward conv x (*) w -> dy."""
    _, _, h, wd = x_shape
    m, _, kh, kw = w_shape
    strides, dilations, _ = window_params("conv", attrs, 2)
    _, begin, _ = window_geometry("conv", (h, wd), (kh, kw), attrs)
    return (x_shape[1], h, wd, m, dy_shape[2], dy_shape[3], kh, kw, *strides, *dilations, *begin, attrs["group"])


@cl_kernel("conv_input_grad", unsupported=_conv_grad_unsupported)
def _conv_input_grad(rt, ins, outs, attrs):
    dy, w, dx = ins[0], ins[1], outs[0]
    return gradient_step(rt, "conv_input_grad", dx, _conv_grad_geometry(attrs, dx.shape, w.shape, dy.shape),
                         dy, w, dx)


@cl_kernel("conv_filter_grad", unsupported=_conv_grad_unsupported)
def _conv_filter_grad(rt, ins, outs, attrs):
    x, dy, dw = ins[0], ins[1], outs[0]
    return gradient_step(rt, "conv_filter_grad", dw, _conv_grad_geometry(attrs, x.shape, dw.shape, dy.shape),
                         x, dy, dw, extra=(x.shape[0],))
