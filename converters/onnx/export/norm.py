"""Batch and layer normalization (edgeflow/ops/norm.py)."""
SAME = {"batch_norm": "BatchNormalization", "layer_norm": "LayerNormalization"}
