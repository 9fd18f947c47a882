"""Einsum (edgeflow/ops/einsum.py)."""
SAME = {"einsum": "Einsum"}
