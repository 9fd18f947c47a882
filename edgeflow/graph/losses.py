"""`ef.losses`: loss functions taking `(labels, predictions or logits)`, as tf.losses.

`reduction` is "mean" (default: over every element of the unreduced loss, as
tf.losses' default does), "sum", or "none" (the unreduced loss). All of them are built
from differentiable ops, so `ef.gradients` and the optimizers see through them.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .graph import Tensor, constant
from .math_ops import (cast, equal, exp, expand_dims, greater, log, range, reduce_mean,  # noqa: A004
                       reduce_sum, shape, where)
from .nn import log_softmax

__all__ = ["mean_squared_error", "softmax_cross_entropy", "sigmoid_cross_entropy"]

REDUCTIONS = {"mean": reduce_mean, "sum": reduce_sum, "none": lambda x: x}


def _reduce(loss, reduction):
    if reduction not in REDUCTIONS:
        raise GraphError(f"reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}")
    return REDUCTIONS[reduction](loss)


def _labels_like(labels, like):
    """labels as a tensor of like's graph and dtype (a cast when it is a tensor of another)."""
    with like.graph.as_default():
        if not isinstance(labels, Tensor):
            return constant(np.asarray(labels), dtype=like.dtype)
        return labels if labels.dtype == like.dtype else cast(labels, like.dtype)


def mean_squared_error(labels, predictions, reduction="mean"):
    """(predictions - labels)^2, elementwise."""
    labels = _labels_like(labels, predictions)
    diff = predictions - labels
    return _reduce(diff * diff, reduction)


def _one_hot(labels, logits):
    """labels (integer class ids) as one-hot rows of logits' dtype; an id outside
    [0, classes) gives a row of zeros."""
    n = logits.shape[-1]
    with logits.graph.as_default():
        if n is not None:
            classes = constant(np.arange(n, dtype=labels.dtype))
        else:
            classes = cast(range(shape(logits)[-1]), labels.dtype)
        return cast(equal(expand_dims(labels, -1), classes), logits.dtype)


def softmax_cross_entropy(labels, logits, reduction="mean"):
    """-sum(labels * log_softmax(logits)) over the last axis, one value per example.

    `labels` are integer class ids with logits' shape less its last axis (as
    tf.losses.sparse_softmax_cross_entropy takes them), or one-hot rows or probabilities
    with logits' shape. log_softmax keeps it finite for any finite logits.
    """
    if not isinstance(labels, Tensor):
        labels = np.asarray(labels)
        with logits.graph.as_default():
            labels = constant(labels) if labels.dtype.kind in "iu" else constant(labels, dtype=logits.dtype)
    if labels.dtype not in dtypes.FLOATS:
        if labels.rank != logits.rank - 1:
            raise GraphError(f"softmax_cross_entropy: integer labels must have logits' shape "
                             f"less its last axis, got labels {labels.shape} for logits {logits.shape}")
        labels = _one_hot(labels, logits)
    else:
        labels = _labels_like(labels, logits)
    return _reduce(-reduce_sum(labels * log_softmax(logits), axis=-1), reduction)


def sigmoid_cross_entropy(labels, logits, reduction="mean"):
    """-z log(sigmoid(x)) - (1 - z) log(1 - sigmoid(x)) elementwise, for labels z and
    logits x, as max(x, 0) - x z + log(1 + exp(-|x|)), which never overflows.

    max and |.| share one `x > 0` branch (as TensorFlow's does), so the gradient at
    x = 0 is sigmoid(0) - z, not a mix of two one-sided ones.
    """
    z = _labels_like(labels, logits)
    with logits.graph.as_default():
        zero, one = constant(0.0, dtype=logits.dtype), constant(1.0, dtype=logits.dtype)
        positive = greater(logits, zero)
        loss = where(positive, logits, zero) - logits * z + log(one + exp(where(positive, -logits, logits)))
    return _reduce(loss, reduction)
