"""OpenCL kernels of edgeflow/ops/pool.py (pool.cl): max and average pooling, 1-D and 2-D.
On CPU devices (gemm.cpu_path) window.cl's kernels, built for each geometry, run instead."""
import numpy as np

from ...ops.conv import window_geometry, window_params
from . import cl_kernel
from . import gemm
from .conv import constant_ints, fixed_kernel, fixed_step, gradient_step, launcher, too_large


def _dilated_average(attrs):
    return "count_include_pad" in attrs and any(d != 1 for d in attrs["dilations"])


def _unsupported(attrs, ins, outs):
    if ins[0].ndim not in (3, 4):
        return "3-D pooling (only 1-D and 2-D run on OpenCL)"
    if _dilated_average(attrs):
        return "average pooling with dilations"
    return too_large(ins, outs)


def _geometry(op, attrs, x_shape):
    """H, W, OH, OW, KH, KW, strides, dilations, pads begin, pads end: 1-D gets H = 1."""
    d = len(x_shape) - 2
    strides, dilations, _ = window_params(op, attrs, d)
    out_shape, begin, end = window_geometry(op, x_shape[2:], attrs["kernel_shape"], attrs, attrs["ceil_mode"])
    lift, zero = (1,) * (2 - d), (0,) * (2 - d)
    return (lift + tuple(x_shape[2:]) + lift + tuple(out_shape) + lift + tuple(attrs["kernel_shape"])
            + lift + strides + lift + dilations + zero + begin + zero + end)


def _pool(name, *extra):
    def make(rt, ins, outs, attrs):
        x, out = ins[0], outs[0]
        geometry = _geometry(name, attrs, x.shape)
        if gemm.cpu_path(rt):
            h, w, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, eh, ew = geometry
            kernel = fixed_kernel(rt, f"{name}_fixed", GH=h, GW=w, GOH=oh, GOW=ow, GKH=kh, GKW=kw, GSH=sh, GSW=sw,
                                  GDH=dh, GDW=dw, GPH=ph, GPW=pw, GEH=eh, GEW=ew,
                                  COUNT_PAD=attrs.get("count_include_pad", 0))
            planes = int(np.prod(x.shape[:2]))
            return fixed_step(rt, kernel, (ow, oh, planes), x.data, out.data)
        geo = constant_ints(rt, geometry)
        total = int(out.size)
        kernel = rt.kernel(rt.program("pool"), name)
        step = launcher(rt, kernel, total, x.data, out.data, geo.data, np.int32(total),
                        *(np.int32(attrs[k]) for k in extra))
        return lambda keep=geo: step()
    return make


cl_kernel("max_pool", unsupported=_unsupported)(_pool("max_pool"))
cl_kernel("avg_pool", unsupported=_unsupported)(_pool("avg_pool", "count_include_pad"))


def _pool_unsupported(attrs, ins, outs):
    if ins[0].ndim != 4:
        return "1-D and 3-D pooling gradients (only 2-D runs on OpenCL)"
    if _dilated_average(attrs):
        return "average pooling with dilations"
    return too_large(ins, outs)


@cl_kernel("max_pool_grad", unsupported=_pool_unsupported)
def _max_pool_grad(rt, ins, outs, attrs):
    x, dy, dx = ins[0], ins[1], outs[0]
    return gradient_step(rt, "max_pool_grad", dx, _geometry("max_pool", attrs, x.shape), x, dy, dx)


@cl_kernel("avg_pool_grad", unsupported=_pool_unsupported)
def _avg_pool_grad(rt, ins, outs, attrs):
    dy, like, dx = ins[0], ins[1], outs[0]
    return gradient_step(rt, "avg_pool_grad", dx, _geometry("avg_pool", attrs, like.shape), dy, dx,
                         extra=(attrs["count_include_pad"],))
