"""Losses over class scores, as ONNX's NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Scores are (N, C, d1, ..., dk), the classes along axis 1; labels are class ids shaped
(N, d1, ..., dk); `weight` (C,) weighs each class. A label in `ignore_index` (ONNX's
attribute, when given) adds 0 and weighs nothing. `reduction` is "none" (the loss per
label), "sum", or "mean": the sum divided by the summed weights of the labels counted.
"""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient

REDUCTIONS = ("none", "sum", "mean")
_ATTRS = {"reduction": Attr(AttrKind.STRING, "mean"), "ignore_index": Attr(AttrKind.INTS, ())}


def _merged(op, a, b, what):
    """Dims `a` and `b` that must agree, None where both are unknown."""
    if a is not None and b is not None and a != b:
        raise GraphError(f"{op}: {what} differ: {a} and {b}")
    return a if a is not None else b


def loss_shape(op, scores, labels, weight, reduction):
    """The loss's shape: labels' for reduction "none", else a scalar."""
    if reduction not in REDUCTIONS:
        raise GraphError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if scores.rank < 2 or labels.rank != scores.rank - 1:
        raise GraphError(f"{op}: scores must be (N, C, d1, ..., dk) and labels (N, d1, ..., dk), got "
                         f"scores {scores.shape} and labels {labels.shape}")
    dims = tuple(_merged(op, s, t, f"scores {scores.shape} and labels {labels.shape}")
                 for s, t in zip(scores.shape[:1] + scores.shape[2:], labels.shape))
    if weight is not None:
        if weight.rank != 1:
            raise GraphError(f"{op}: weight must be (C,), got {weight.shape}")
        _merged(op, weight.shape[0], scores.shape[1], "the classes of weight and scores")
    return dims if reduction == "none" else ()


@define("nll_loss", attrs=_ATTRS, types=Types("scores: T, labels: index, weight: T? -> T", T=dtypes.FLOATS))
def _nll_loss(inputs, attrs):
    """-scores[n, labels[n, d...], d...] * weight[label] per label, reduced (ONNX's
    NegativeLogLikelihoodLoss)."""
    scores, labels, weight = (inputs + [None])[:3]
    return [TensorSpec(loss_shape("nll_loss", scores, labels, weight, attrs["reduction"]), scores.dtype)]


@define("softmax_cross_entropy_loss", attrs=_ATTRS,
        types=Types("scores: T, labels: index, weight: T? -> loss: T, log_prob: T", T=dtypes.FLOATS))
def _softmax_cross_entropy_loss(inputs, attrs):
    """nll_loss of log_prob = log_softmax(scores) along the classes, and log_prob (ONNX's
    SoftmaxCrossEntropyLoss)."""
    scores, labels, weight = (inputs + [None])[:3]
    shape = loss_shape("softmax_cross_entropy_loss", scores, labels, weight, attrs["reduction"])
    return [TensorSpec(shape, scores.dtype), TensorSpec(scores.shape, scores.dtype)]


@define("nll_loss_grad", attrs=_ATTRS,
        types=Types("dloss: T, like: any, labels: index, weight: T? -> T", T=dtypes.FLOATS))
def _nll_loss_grad(inputs, attrs):
    """The gradient of nll_loss w.r.t. scores shaped like `like`: -dloss * weight[label]
    at each label's class (divided by the summed weights for "mean"), 0 elsewhere."""
    dloss, like, labels, weight = (inputs + [None])[:4]
    shape = loss_shape("nll_loss_grad", like, labels, weight, attrs["reduction"])
    if dloss.rank != len(shape):
        raise GraphError(f"nll_loss_grad: dloss must be shaped like the loss {shape}, got {dloss.shape}")
    return [TensorSpec(like.shape, dloss.dtype)]


# -- gradients -----------------------------------------------------------------------------
# Labels are ids (no gradient); the class weights get none either: they are constants in
# every loss ONNX exporters write.

def _scores_grad(g, op, dloss, like):
    return g("nll_loss_grad", dloss, like, *op.inputs[1:], **op.attrs)


@gradient("nll_loss")
def _nll_loss_grad_rule(g, op, grads):
    return [_scores_grad(g, op, grads[0], op.inputs[0]), None] + [None] * (len(op.inputs) - 2)


@gradient("softmax_cross_entropy_loss")
def _softmax_cross_entropy_loss_grad(g, op, grads):
    """Through nll_loss to log_prob, plus log_prob's own gradient, then through log_softmax:
    d - softmax * sum(d) along the classes."""
    dloss, dlog_prob = grads
    log_prob = op.outputs[1]
    parts = ([] if dloss is None else [_scores_grad(g, op, dloss, log_prob)]) + \
        ([] if dlog_prob is None else [dlog_prob])
    if not parts:
        return [None] * len(op.inputs)
    d = parts[0] if len(parts) == 1 else g("add", *parts)
    total = g("reduce_sum", d, axes=(1,), keepdims=True)
    return [g("sub", d, g("mul", g("exp", log_prob), total)), None] + [None] * (len(op.inputs) - 2)
