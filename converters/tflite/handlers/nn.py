"""ReLU, softmax and local response normalization (edgeflow/ops/nn.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from ..context import NCHW
from . import handler


@handler("RELU", op="relu")
def _relu(ctx, op):
    i = op.inputs[0]
    perm = ctx.perm(i)
    ctx.set(op.outputs[0], apply("relu", [ctx.get(i, perm)], name=f"{op.name}/relu"), perm)


@handler({"SOFTMAX": "softmax", "LOG_SOFTMAX": "log_softmax"})
def _softmax(ctx, op):
    """softmax(beta * x) over TFLite's last axis, wherever the layout put it."""
    i = op.inputs[0]
    perm = ctx.perm(i) or tuple(range(ctx.rank(i)))
    x = ctx.get(i, perm)
    beta = float(op.option("beta", 1.0)) if op.opcode == "SOFTMAX" else 1.0
    if beta != 1.0:
        x = apply("mul", [x, np.asarray(beta, x.dtype)], name=f"{op.name}/beta")
    axis = perm.index(len(perm) - 1)
    kind = "softmax" if op.opcode == "SOFTMAX" else "log_softmax"
    ctx.set(op.outputs[0], apply(kind, [x], {"axis": axis}, name=f"{op.name}/{kind}"), perm)


@handler("LOCAL_RESPONSE_NORMALIZATION", op="lrn")
def _lrn(ctx, op):
    """TFLite's LRN: x / (bias + alpha * sum of squares over 2r+1 channels) ** beta; ONNX's
    (edgeflow's) divides alpha by the window size."""
    radius = int(op.option("radius", 5))
    size = 2 * radius + 1
    x = ctx.get(op.inputs[0], NCHW)
    attrs = {"size": size, "alpha": float(op.option("alpha", 1.0)) * size, "beta": float(op.option("beta", 0.5)),
             "bias": float(op.option("bias", 1.0))}
    ctx.set(op.outputs[0], apply("lrn", [x], attrs, name=f"{op.name}/lrn"), NCHW)
