"""Relu, softmax and its kin, LRN (edgeflow/ops/nn.py)."""
SAME = {"relu": "Relu", "softmax": "Softmax", "log_softmax": "LogSoftmax", "hardmax": "Hardmax", "lrn": "LRN"}
