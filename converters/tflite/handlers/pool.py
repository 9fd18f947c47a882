"""Pooling (edgeflow/ops/pool.py): TFLite's NHWC pools as edgeflow's NCHW ones."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import NCHW, unsupported
from . import fused, handler, padding


def _whole(ctx, op):
    """Whether the window covers the whole image and gives one pixel (a global pool)."""
    shape = ctx.tensor_shape(op.inputs[0])
    out = op.output_tensor().shape
    return (len(shape) == 4 and None not in shape[1:3] and tuple(out[1:3]) == (1, 1)
            and op.option("filter_height", 1) >= shape[1] and op.option("filter_width", 1) >= shape[2])


def _global(ctx, op, kind):
    """A pool whose window covers the image is a reduction over H and W (pooling would make
    a tap per pixel)."""
    x = ctx.get(op.inputs[0], NCHW)
    return fused(op, apply(kind, [x], {"axes": (2, 3), "keepdims": True}, name=f"{op.name}/{kind}"))


def _pool(ctx, op, kind, attrs=None):
    if kind in ("max_pool", "avg_pool") and _whole(ctx, op):
        return _global(ctx, op, "reduce_max" if kind == "max_pool" else "reduce_mean")
    x = ctx.get(op.inputs[0], NCHW)
    attrs = {"kernel_shape": (op.option("filter_height", 1), op.option("filter_width", 1)),
             "strides": (op.option("stride_h", 1), op.option("stride_w", 1)), "auto_pad": padding(op),
             **(attrs or {})}
    y = fused(op, apply(kind, [x], attrs, name=f"{op.name}/{kind}"))
    return y


@handler("MAX_POOL_2D", op="max_pool")
def _max_pool(ctx, op):
    ctx.set(op.outputs[0], _pool(ctx, op, "max_pool"), NCHW, exact=ctx.same_grid(op.inputs[0], op.outputs[0]))


@handler("AVERAGE_POOL_2D", op="avg_pool")
def _average_pool(ctx, op):
    """The mean of each window's pixels inside the image (padding does not count)."""
    ctx.set(op.outputs[0], _pool(ctx, op, "avg_pool", {"count_include_pad": False}), NCHW)


@handler("L2_POOL_2D", op="lp_pool")
def _l2_pool(ctx, op):
    """TFLite's L2 pool is the root of the window's MEAN square; lp_pool's of the sum."""
    if padding(op) != "VALID":
        raise unsupported(op, "L2_POOL_2D with SAME padding (edge windows average fewer pixels)")
    y = _pool(ctx, op, "lp_pool", {"p": 2})
    window = op.option("filter_height", 1) * op.option("filter_width", 1)
    y = apply("mul", [y, np.asarray(1 / np.sqrt(window), y.dtype)], name=f"{op.name}/mean")
    ctx.set(op.outputs[0], y, NCHW)
