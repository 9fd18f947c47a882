"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss nodes (edgeflow/ops/loss.py)."""
from edgeflow.graph.math_ops import apply

from . import handler


def _loss(ctx, node):
    inputs = [ctx.input(node, i) for i in range(3) if ctx.has(node, i)]
    ignore = node.attr("ignore_index")
    attrs = {"reduction": node.attr("reduction", "mean"), "ignore_index": () if ignore is None else (ignore,)}
    return inputs, attrs


@handler("NegativeLogLikelihoodLoss", op="nll_loss")
def _nll_loss(ctx, node):
    inputs, attrs = _loss(ctx, node)
    return apply("nll_loss", inputs, attrs, name=node.outputs[0])


@handler("SoftmaxCrossEntropyLoss", op="softmax_cross_entropy_loss")
def _softmax_cross_entropy_loss(ctx, node):
    """The loss, and log_prob for the optional second output."""
    inputs, attrs = _loss(ctx, node)
    return list(apply("softmax_cross_entropy_loss", inputs, attrs, name=node.outputs[0]))
