"""Losses over class scores (edgeflow/ops/loss.py)."""
from . import exporter

LOSSES = {"nll_loss": "NegativeLogLikelihoodLoss", "softmax_cross_entropy_loss": "SoftmaxCrossEntropyLoss"}


@exporter(LOSSES)
def loss(g, op):
    attrs = {"reduction": op.attrs["reduction"]}
    if op.attrs["ignore_index"]:
        attrs["ignore_index"] = op.attrs["ignore_index"][0]
    g.node(LOSSES[op.opcode], op.inputs, op.outputs, **attrs)
